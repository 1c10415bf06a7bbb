"""``opsbot analyze`` as a real process on the CPU engine: Ctrl-C keeps what is done, a killed run
resumes and skips finished items, every item has one request row (scenario batch, lane background)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GROUPS = 16
pytestmark = pytest.mark.slow  # two real runs of the command each (model load, 16 generations)


@pytest.fixture
def shift(tmp_path: Path) -> Path:
    """JSONL of alerts: 16 alertnames, each firing on two or three pods (16 groups), one bad line."""
    lines = []
    for index in range(GROUPS):
        for pod in range(2 + index % 2):
            lines.append(
                json.dumps(
                    {
                        "labels": {
                            "alertname": f"Alert{index:02d}",
                            "namespace": "payments",
                            "pod": f"api-7d9f8b6c4-{'bcdfg'[pod]}x2x9",
                            "severity": "warning",
                        },
                        "annotations": {"summary": f"alert {index} fires on pod {pod}"},
                        "startsAt": f"2026-11-30T{8 + index % 8:02d}:{pod * 10:02d}:00Z",
                        "status": "firing",
                    }
                )
            )
    lines.insert(3, '{"labels": {"alertname": "Broken"')  # cut short: reported, skipped
    path = tmp_path / "shift.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def command(shift: Path, out: Path, tiny_model: Path, data: Path) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "NO_COLOR": "1",
            "OPSBOT_DATA_DIR": str(data),
            "OPSBOT_ENGINE__BACKEND": "cpu",
            "OPSBOT_ENGINE__MODEL": str(tiny_model),
            "OPSBOT_ENGINE__MAX_MODEL_LEN": "2048",
            "OPSBOT_ENGINE__CPU_MAX_CONCURRENCY": "1",
        }
    )
    args = [sys.executable, "-m", "bot.cli", "analyze", str(shift), "--out", str(out), "--max-tokens", "24"]
    return args, env


def result_ids(out: Path) -> list[str]:
    path = out / "results.jsonl"
    if not path.exists():
        return []
    ids = []
    for line in path.read_text().splitlines():
        try:
            ids.append(json.loads(line)["id"])
        except ValueError:
            continue
    return ids


def start_and_wait_for_results(args: list[str], env: dict[str, str], out: Path, at_least: int, cwd: Path):
    log = cwd / f"run-{time.monotonic_ns()}.log"
    with log.open("w") as handle:  # the child writes on; this process needs no handle of its own
        proc = subprocess.Popen(args, env=env, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while len(result_ids(out)) < at_least:
        if proc.poll() is not None:
            raise AssertionError(f"analyze ended early ({proc.returncode}): {log.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("no results appeared in time")
        time.sleep(0.05)
    return proc, log


def rows(data: Path) -> list[tuple[str, str, str, str]]:
    with sqlite3.connect(data / "opsbot.db") as db:
        return db.execute("select request_id, scenario, lane, status from opsbot_requests").fetchall()


def test_ctrl_c_keeps_finished_items_and_a_rerun_finishes_only_the_rest(
    shift: Path, tmp_path: Path, tiny_model: Path
) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    args, env = command(shift, out, tiny_model, data)
    proc, log = start_and_wait_for_results(args, env, out, at_least=2, cwd=tmp_path)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130, log.read_text()
    text = log.read_text()
    assert "shift.jsonl line 4: not JSON" in text  # the bad line, with its number
    assert "interrupted:" in text and "run the same command again" in text
    done_before = result_ids(out)
    assert 2 <= len(done_before) < GROUPS
    report = json.loads((out / "report.json").read_text())
    assert report["totals"]["summarised"] == len(done_before) and report["run"]["interrupted"] is True
    interrupted_rows = rows(data)
    assert {r[0] for r in interrupted_rows if r[3] == "ok"} == {
        json.loads(line)["request_id"] for line in (out / "results.jsonl").read_text().splitlines()
    }

    again = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr
    assert f"{len(done_before)} already done" in again.stdout
    ids = result_ids(out)
    assert len(ids) == len(set(ids)) == GROUPS and ids[: len(done_before)] == done_before
    final = rows(data)
    assert len(final) == GROUPS  # one row per item: the aborted one was replaced by its finished run
    assert {(scenario, lane, status) for _, scenario, lane, status in final} == {
        ("batch", "background", "ok")
    }
    report = json.loads((out / "report.json").read_text())
    assert report["totals"]["summarised"] == GROUPS and report["grouping"]["groups"] == GROUPS
    assert report["input"]["bad_lines"] == 1


def test_a_killed_run_resumes_and_a_line_cut_short_by_the_kill_runs_again(
    shift: Path, tmp_path: Path, tiny_model: Path
) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    args, env = command(shift, out, tiny_model, data)
    proc, _ = start_and_wait_for_results(args, env, out, at_least=3, cwd=tmp_path)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    kept = result_ids(out)
    assert 3 <= len(kept) < GROUPS
    # As if the kill had landed mid-write: the last finished item's line is cut in half.
    lines = (out / "results.jsonl").read_text().splitlines()
    cut = lines[-1][: len(lines[-1]) // 2]
    (out / "results.jsonl").write_text("\n".join([*lines[:-1], cut]))

    again = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stderr
    assert f"{len(kept) - 1} already done" in again.stdout
    assert f"results.jsonl line {len(lines)}: unreadable result" in again.stderr
    ids = result_ids(out)
    assert sorted(set(ids)) == sorted(ids) and len(ids) == GROUPS
    assert (out / "results.jsonl").read_text().splitlines()[len(lines) - 1] == cut  # kept, never glued onto
    final = rows(data)
    assert len(final) == GROUPS and all(r[1:] == ("batch", "background", "ok") for r in final)
