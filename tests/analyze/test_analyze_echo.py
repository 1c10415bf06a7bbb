"""``opsbot analyze`` counts an answer that only repeats its prompt as failed, and says so.

The command runs as a user runs it (a subprocess) on the ``openai`` backend against the fake vLLM
server, whose "model" answers every group with the scenario's task line copied back, as SmolLM2
did in issue 39 ("13 of 13 groups summarised", 11 of them the prompt).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes.openai_server import FakeOpenAIServer

from bot.answer_clean import ASK_AGAIN, STOP_SEQUENCES
from bot.prompts import SCENARIO_TASKS
from inference.scenarios import ALERT_SUMMARY

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from gen_alerts import generate_alerts  # noqa: E402

MODEL = "tiny-chat"


@pytest.fixture
def echoing_server(tiny_model: Path) -> Iterator[FakeOpenAIServer]:
    echo = SCENARIO_TASKS[ALERT_SUMMARY] + "\n<<<END DATA id=0123abcd>>>"
    with FakeOpenAIServer(tiny_model, served_model_name=MODEL, max_model_len=2048, answer=echo) as server:
        yield server


def test_echoed_summaries_are_failed_and_the_report_says_how_many(
    echoing_server: FakeOpenAIServer, tmp_path: Path
) -> None:
    (tmp_path / "shift.json").write_text(json.dumps(generate_alerts(60, seed=3)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "NO_COLOR": "1",
            "OPSBOT_DATA_DIR": str(tmp_path / "data"),
            "OPSBOT_ENGINE__BACKEND": "openai",
            "OPSBOT_ENGINE__BASE_URL": echoing_server.url,
            "OPSBOT_ENGINE__SERVED_MODEL_NAME": MODEL,
            "OPSBOT_ENGINE__MAX_MODEL_LEN": "2048",
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "bot.cli", "analyze", "shift.json", "--out", "out", "--max-groups", "4"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    # The terminal holds the progress and the warnings; the request log goes beside the report.
    assert " INFO " not in proc.stderr and " INFO " in (tmp_path / "out" / "analyze.log").read_text()
    assert "0 of" in proc.stdout and "groups summarised, 4 echoed the prompt" in proc.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["totals"]["summarised"] == 0 and report["totals"]["echoed"] == 4
    failed = [g for g in report["groups"] if g["status"] == "failed: echoed the prompt"]
    assert len(failed) == 4 and all(g["summary"] is None for g in failed)
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "groups summarised, 4 echoed the prompt" in markdown
    assert "<<<" not in markdown and "only repeated its prompt" in markdown
    # Every request carried the fence markers as stop sequences; what was kept has none.
    # (Each echoed group was asked once more with another seed before it counted as failed.)
    sent = [r for r in echoing_server.log if (r.request_id or "").startswith("batch-")]
    assert len(sent) == 4 * (1 + ASK_AGAIN) and all(set(STOP_SEQUENCES) <= set(r.body["stop"]) for r in sent)
    assert sum("-again" in (r.request_id or "") for r in sent) == 4 * ASK_AGAIN
    kept = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    assert all("<<<" not in item["text"] and item["failure"] == "echoed the prompt" for item in kept)
