"""``opsbot analyze`` refuses bad arguments and unreadable inputs in one clear line, before any
engine starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def analyze(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update({"PYTHONPATH": str(REPO), "NO_COLOR": "1", "OPSBOT_DATA_DIR": str(tmp_path / "data")})
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "analyze", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_input_is_one_line_naming_it(tmp_path: Path) -> None:
    proc = analyze(["nowhere.json", "--out", "out"], tmp_path)
    assert proc.returncode == 1
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line == "opsbot: error: nowhere.json: no such file or folder"
    assert not (tmp_path / "out").exists()


def test_a_bad_time_or_scenario_is_a_usage_error(tmp_path: Path) -> None:
    proc = analyze(["in.json", "--out", "out", "--since", "last tuesday"], tmp_path)
    assert proc.returncode == 2 and "neither an ISO 8601 time" in proc.stderr
    proc = analyze(["in.json", "--out", "out", "--scenario", "poetry"], tmp_path)
    assert proc.returncode == 2 and "invalid choice: 'poetry'" in proc.stderr


def test_an_input_with_only_bad_lines_lists_them_with_their_numbers_and_stops(tmp_path: Path) -> None:
    (tmp_path / "alerts.jsonl").write_text('{"labels": {}}\nnot json\n{"hello": 1}\n')
    proc = analyze(["alerts.jsonl", "--out", "out"], tmp_path)
    assert proc.returncode == 1
    assert "alerts.jsonl line 1: an alert needs labels.alertname" in proc.stderr
    assert "alerts.jsonl line 2: not JSON" in proc.stderr
    assert "alerts.jsonl line 3: not an alert" in proc.stderr
    assert "no records could be read from alerts.jsonl" in proc.stderr
