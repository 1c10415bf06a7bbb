"""The end-to-end bench's statistics (issue 40): P99 by nearest rank, every episode its own row
beside the pool, the worst episode as the headline, CPU over the requests a pattern's window holds."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from e2e_bench import pct, summarize, with_episodes, worst_episodes  # noqa: E402


def test_p99_of_a_burst_of_64_is_its_slowest_request() -> None:
    values = [float(v) for v in range(1, 65)]
    assert pct(values, 99) == 64.0
    # 128 pooled requests: rank ceil(126.72) = 127, the second slowest
    assert pct([float(v) for v in range(1, 129)], 99) == 127.0
    assert pct([float(v) for v in range(1, 201)], 99) == 198.0  # rank 198 exactly, not 199
    assert pct([3.0, 1.0, 4.0, 2.0], 50) == 2.0  # a measured value, never an interpolation
    assert pct([], 99) is None


def _req(seq: int, pattern: str, episode: int, kind: str, first: float, answers: int = 1) -> dict[str, Any]:
    return {"seq": seq, "pattern": pattern, "episode": episode, "kind": kind, "first_token_ms": first,
            "answers": answers, "rows": 1, "status": "ok", "submit_ms": 1.0}  # fmt: skip


def _step(pattern: str, episode: int, requests: int, window: int, cpu_ns: int) -> dict[str, Any]:
    return {"pattern": pattern, "episode": episode, "requests": requests, "requests_in_window": window,
            "wall_s": 2.0, "opsbot_cpu_ns": cpu_ns, "opsbot_cpu_s": 0.0, "bench_cpu_s": 0.1,
            "loadavg": [1.0, 1.0, 1.0]}  # fmt: skip


def _run() -> dict[str, Any]:
    reqs = [_req(i, "burst64", 1, "mention", 100.0 + i) for i in range(1, 5)]  # episode 1: worst 104
    reqs += [_req(4 + i, "burst64", 2, "mention", 300.0 + i) for i in range(1, 5)]  # episode 2: worst 304
    reqs += [_req(20 + i, "incident-seed", 1, "mention", 50.0) for i in range(4)]
    reqs += [_req(30 + i, "incident", 1, "followup", 900.0) for i in range(4)]
    reqs += [_req(40, "incident", 1, "rca", 90.0, answers=2)]  # a duplicated answer
    steps = [
        _step("burst64", 1, 4, 4, 8_000_000),  # 2 ms per request
        _step("burst64", 2, 4, 4, 16_000_000),  # 4 ms per request
        # 4 seeds + 4 follow-ups + 1 urgent in the window: 9 requests, not the incident's own 5
        _step("incident", 1, 5, 9, 27_000_000),
    ]
    return {"platform": "slack-socket", "patterns": steps, "requests": reqs, "idle_cpu_fraction": 0.0}


def test_each_episode_is_a_row_and_the_pool_is_another() -> None:
    rows = {(r["pattern"], r["episode"], r["kind"]): r for r in summarize(_run())}
    assert rows[("burst64", 1, "all")]["first_token_ms"]["p99"] == 104.0
    assert rows[("burst64", 2, "all")]["first_token_ms"]["p99"] == 304.0
    pooled = rows[("burst64", "pooled", "all")]
    assert pooled["n"] == 8 and pooled["episodes"] == 2 and pooled["first_token_ms"]["p99"] == 304.0
    assert ("incident", "pooled", "all") not in rows  # one episode: no second row of the same requests
    assert (
        rows[("incident", 1, "rca")]["duplicated"] == 1
        and rows[("incident", 1, "followup")]["duplicated"] == 0
    )


def test_cpu_is_pooled_over_every_episode_and_divided_by_the_requests_in_the_window() -> None:
    rows = {(r["pattern"], r["episode"], r["kind"]): r for r in summarize(_run())}
    assert rows[("burst64", 1, "all")]["opsbot_cpu_ms_per_request"] == 2.0
    assert rows[("burst64", 2, "all")]["opsbot_cpu_ms_per_request"] == 4.0
    assert rows[("burst64", "pooled", "all")]["opsbot_cpu_ms_per_request"] == 3.0  # not the last episode's 4
    assert rows[("incident", 1, "all")]["opsbot_cpu_ms_per_request"] == 3.0  # 27 ms / 9, not / 5
    assert rows[("incident", 1, "all")]["requests_in_window"] == 9


def test_the_headline_is_the_worst_episode_not_the_pool() -> None:
    worst = {(w["pattern"], w["kind"]): w for w in worst_episodes(summarize(_run()))}
    burst = worst[("burst64", "all")]
    assert burst["episode"] == 2 and burst["p99"] == 304.0 and burst["episodes"] == 2
    # a pool of 128 would sit below its worst burst; with 8 requests nearest rank keeps them equal
    assert burst["pooled_p99"] == 304.0


def test_results_before_issue_40_are_cut_into_their_episodes_in_sending_order() -> None:
    run = _run()
    for r in run["requests"]:
        del r["episode"]
    for s in run["patterns"]:
        del s["episode"], s["requests_in_window"]
    eps = {r["seq"]: r["episode"] for r in with_episodes(run)}
    assert [eps[s] for s in range(1, 9)] == [1, 1, 1, 1, 2, 2, 2, 2]
    rows = {(r["pattern"], r["episode"], r["kind"]): r for r in summarize(run)}
    # the incident's window is counted from its requests and its seeds: 4 + 4 + 1
    assert rows[("incident", 1, "all")]["requests_in_window"] == 9


def test_cpu_is_read_in_nanoseconds_from_another_process_until_it_exits() -> None:
    import subprocess
    import time

    from e2e_bench import BotProcess

    # the child burns 50 ms of its own CPU, says so, then waits: a 10 ms tick could not tell 50 from 59
    code = "import sys, time\nwhile time.process_time() < 0.05: pass\nprint(flush=True)\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout is not None and child.stdout.readline() == b"\n"
        ns = BotProcess.cpu_ns(child.pid)
        assert ns is not None and 50_000_000 <= ns < 5_000_000_000
        assert ns % 10_000_000 != 0  # not a multiple of a clock tick
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()
    deadline = time.monotonic() + 5
    while BotProcess.cpu_ns(child.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert BotProcess.cpu_ns(child.pid) is None  # reaped: no reading, never a stale one
