"""bench/episodes.py: several runs, every episode; median and worst across runs, the headline the
worst episode of all runs, raw vLLM matched request by request."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))


def _request(seq: int, pattern: str, episode: int, first: float) -> dict[str, Any]:
    return {"seq": seq, "pattern": pattern, "episode": episode, "kind": "mention", "first_token_ms": first,
            "answers": 1, "rows": 1, "status": "ok"}  # fmt: skip


def _result(first_episode: float, second_episode: float, commit: str) -> dict[str, Any]:
    requests = [_request(1 + i, "burst64", 1, first_episode - i) for i in range(4)]
    requests += [_request(5 + i, "burst64", 2, second_episode - i) for i in range(4)]
    run = {"platform": "slack-socket", "patterns": [{"pattern": "burst64"}] * 2, "requests": requests}
    meta = {"date": "2026-12-05", "commit": commit, "host": "h", "cpu": "c", "gpu": "g", "command": "x"}
    return {"meta": meta, "runs": [run]}


def _write(path: Path, data: dict[str, Any]) -> Path:
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    return path


def test_the_headline_is_the_worst_episode_across_runs(tmp_path: Path) -> None:
    # run 1: bursts of P99 200 and 220; run 2: 400 (a bad first burst) and 210
    one = _write(tmp_path / "one.json.gz", _result(200.0, 220.0, "aaa1111"))
    two = _write(tmp_path / "two.json.gz", _result(400.0, 210.0, "bbb2222"))
    raws = []
    for name in ("raw1", "raw2"):  # raw TTFT P99 100 ms on every episode
        raws.append(
            _write(tmp_path / f"{name}.json.gz", {"raw": [{"seq": s, "ttft": 100.0} for s in range(1, 9)]})
        )
    out = tmp_path / "fair"
    subprocess.run(
        [sys.executable, str(REPO / "bench" / "episodes.py"), str(one), str(two),
         "--raw", str(raws[0]), "--raw", str(raws[1]), "--out", str(out)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    report = json.loads(out.with_suffix(".json").read_text())
    (head,) = [h for h in report["headline"] if h["pattern"] == "burst64" and h["kind"] == "all"]
    assert head["worst_p99_ms"] == 400.0 and head["worst_run"] == 2 and head["worst_episode"] == 1
    assert head["worst_ratio"] == 4.0 and head["episodes"] == 4
    # the pool of each run (8 requests: nearest rank = slowest) is 220 and 400: median 310
    assert head["pooled_p99_median_ms"] == 310.0
    across = {(a["episode"], a["kind"]): a for a in report["across_runs"] if a["pattern"] == "burst64"}
    assert across[(1, "all")]["p99_median_ms"] == 300.0 and across[(1, "all")]["p99_worst_ms"] == 400.0
    assert across[(2, "all")]["ratio_worst"] == 2.2
    md = out.with_suffix(".md").read_text()
    assert "aaa1111" in md and "bbb2222" in md  # every input's commit in the header
    assert "| opsbot | slack-socket | burst64 | all | 2 | 4 | **400** (2, 1) | 4.00x |" in md


def test_a_raw_file_for_every_run_or_none(tmp_path: Path) -> None:
    one = _write(tmp_path / "one.json.gz", _result(200.0, 220.0, "a"))
    done = subprocess.run(
        [sys.executable, str(REPO / "bench" / "episodes.py"), str(one), str(one), "--raw", str(one)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "1 --raw for 2 runs" in done.stderr
