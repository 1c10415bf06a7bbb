"""bench/batch_bench.py runs where no GPU is: its plan (--dry-run) and a CPU smoke run of every phase
(offline path, interactive path, urgent questions beside a batch inside the bot) on the tiny model."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from gen_alerts import generate_alerts  # noqa: E402

BENCH = [sys.executable, str(REPO / "bench" / "batch_bench.py"), "--engine", "cpu"]


def run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        BENCH + ["--model-dir", str(REPO / ".pytest_cache" / "opsbot-models"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_generator_makes_a_realistic_shift_of_a_thousand_alerts() -> None:
    alerts = generate_alerts(1000)
    assert len(alerts) == 1000
    starts = sorted(a["startsAt"] for a in alerts)
    assert starts[0] >= "2026-11-30T08:00" and starts[-1] < "2026-11-30T16:00"  # one 8-hour shift
    pods = {a["labels"]["pod"] for a in alerts if "pod" in a["labels"]}
    assert any(re.fullmatch(r"payments-api-[a-z0-9]{9,10}-[a-z0-9]{5}", p) for p in pods)  # replica hashes
    firings = Counter(a["fingerprint"] for a in alerts)
    assert sum(n for n in firings.values() if n > 1) > 250  # alerts that fired again after resolving
    assert {a["labels"]["severity"] for a in alerts} >= {"critical", "warning", "info"}
    assert len({a["labels"]["namespace"] for a in alerts}) >= 5


def test_the_dry_run_builds_the_items_and_what_grouping_saves(tmp_path: Path, tiny_model: Path) -> None:
    proc = run(["--dry-run", "--alerts", "300"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    items = plan["items"]
    assert items["alerts"] == 300 and 5 <= items["groups"] <= 40
    assert items["savings"]["items_saved"] == 300 - items["groups"]
    assert items["prompt_tokens"]["each"]["total"] > 5 * items["prompt_tokens"]["grouped"]["total"]
    assert "each (300 items)" in plan["plan"]["offline"]


def test_a_cpu_smoke_run_measures_both_paths_and_the_urgent_lane_beside_a_batch(
    tmp_path: Path, tiny_model: Path
) -> None:
    out = tmp_path / "bench.json"
    args = [
        "--alerts",
        "16",
        "--max-tokens",
        "4",
        "--urgent",
        "3",
        "--urgent-interval",
        "0.05",
        "--out",
        str(out),
    ]
    proc = run(args, tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    for path in ("offline", "interactive"):
        runs = {r["items"]: r for r in report[path]["runs"]}
        assert set(runs) == {"grouped", "each"}
        assert runs["each"]["n"] == runs["each"]["finished"] == 16
        assert runs["each"]["output_tokens"] == 16 * 4  # fixed-length answers on both paths
        assert runs["each"]["items_per_s"] > 0 and runs["each"]["total_tokens_per_s"] > 0
    bot = report["in_bot"]
    assert bot["urgent_idle"]["n"] == bot["urgent_with_batch"]["n"] == 3
    assert bot["urgent_with_batch"]["lanes"] == ["urgent"] and bot["urgent_with_batch"]["ok"] == 3
    assert bot["batch"]["finished"] == 16 and bot["urgent_p99_ratio_batch_to_idle"] is not None
    table = out.with_suffix(".md").read_text()
    assert "| offline | each | 16 |" in table and "batch in the background lane" in table
