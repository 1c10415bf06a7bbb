"""bench/episodes.py: a repeated pattern is split into its episodes in sending order, an
incident's seeds go with the incident episodes, and the raw replay is matched by sequence number."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from episodes import episodes  # noqa: E402


def _request(seq: int, pattern: str, kind: str, first: float) -> dict[str, object]:
    return {"seq": seq, "pattern": pattern, "kind": kind, "first_token_ms": first}


def _run() -> dict[str, object]:
    requests = [_request(1 + i, "burst64", "mention", 100.0 + i) for i in range(4)]  # episode 1
    requests += [_request(5 + i, "burst64", "mention", 300.0 + i) for i in range(4)]  # episode 2
    requests += [_request(9 + i, "incident-seed", "mention", 50.0) for i in range(4)]
    requests += [_request(13, "incident", "rca", 90.0), _request(14, "incident", "followup", 900.0)]
    requests += [_request(15, "incident", "rca", 95.0), _request(16, "incident", "followup", 950.0)]
    patterns = [{"pattern": p} for p in ("burst64", "burst64", "incident", "incident")]
    return {"platform": "slack-socket", "patterns": patterns, "requests": requests}


def test_each_episode_keeps_its_own_requests_in_sending_order() -> None:
    found = {(p, k, i): [r["seq"] for r in reqs] for p, k, i, reqs in episodes(_run())}
    assert found[("burst64", "all", 1)] == [1, 2, 3, 4]
    assert found[("burst64", "all", 2)] == [5, 6, 7, 8]
    assert found[("incident-seed", "all", 1)] == [9, 10] and found[("incident-seed", "all", 2)] == [11, 12]
    assert found[("incident", "rca", 1)] == [13] and found[("incident", "followup", 2)] == [16]


def test_the_table_compares_first_with_first_against_raw(tmp_path: Path) -> None:
    bot = tmp_path / "bot.json.gz"
    bot.write_bytes(gzip.compress(json.dumps({"runs": [_run()]}).encode()))
    raw = tmp_path / "raw.json"
    raw.write_text(json.dumps({"raw": [{"seq": s, "ttft": 50.0 if s <= 4 else 150.0} for s in range(1, 17)]}))
    out = subprocess.run(
        [sys.executable, str(REPO / "bench" / "episodes.py"), str(bot), "--raw", str(raw)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rows = {tuple(c.strip() for c in line.strip("|").split("|")[:3]): line for line in out.splitlines()}
    first, second = rows[("burst64", "all", "1")], rows[("burst64", "all", "2")]
    # Episode 1: P99 of 100..103 over raw 50 -> about 2.06x; episode 2: 303 / 150 -> about 2.02x.
    assert "2.06x" in first and "50 / 50" in first
    assert "2.02x" in second and "150 / 150" in second
