"""bench/e2e_bench.py on the synthetic engine: a small burst through the real ``opsbot run`` on the
fake Slack (HTTP events and slash commands) and the fake Mattermost, and its accounting: every
request answered once, joined with its own request row and engine submit, stages in order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from e2e_bench import STAGES, sweep_verdict  # noqa: E402

ORDER = ("sign_of_life_ms", "placeholder_ms", "first_token_ms", "final_ms")


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, str(REPO / "bench" / "e2e_bench.py"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=110,
    )


@pytest.mark.slow
def test_a_burst_is_accounted_for_request_by_request(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "e2e.json"
    done = run(
        [
            "--engine", "synthetic", "--model", str(tiny_model),
            "--platforms", "slack-http,mattermost", "--patterns", "burst8",
            "--channels", "3", "--rca-share", "0.25", "--answer-tokens", "12", "--rca-tokens", "12",
            "--tokens-per-s", "200", "--idle-s", "0.5", "--pause-s", "0", "--pattern-timeout-s", "40",
            "--workdir", str(tmp_path), "--out", str(out),
        ],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "burst8: [####################] 8/8 answered" in done.stderr  # the progress bar
    report = json.loads(out.read_text())
    assert {"date", "command", "commit", "cpu", "cores", "versions"} <= report["meta"].keys()
    for run_ in report["runs"]:
        reqs = run_["requests"]
        assert len(reqs) == 8 and len({r["seq"] for r in reqs}) == 8
        assert sorted(r["kind"] for r in reqs) == ["mention"] * 6 + ["rca"] * 2
        assert len({r["request_id"] for r in reqs}) == 8  # each joined with a row of its own
        for r in reqs:
            assert r["answers"] == 1 and r["rows"] == 1 and r["status"] == "ok", r
            times = [r[k] for k in ORDER]
            assert all(t is not None for t in times), r
            assert times == sorted(times), r  # sign of life <= placeholder <= first token <= final
            assert 0 <= r["submit_ms"] <= r["first_token_ms"], r  # the engine saw it before any text
            assert r["lane"] == ("urgent" if r["kind"] == "rca" else "normal")
            assert r["row_ttft_ms"] is not None and r["output_tokens"] == 12
            if run_["platform"] == "slack-http" or r["kind"] == "rca":
                assert r["ack_ms"] is not None and r["ack_ms"] <= r["final_ms"]
        assert sum(run_["platform_calls"].values()) > 0
    summary = {(row["platform"], row["kind"]): row for row in report["summary"]}
    assert summary[("slack-http", "all")]["lost"] == 0 and summary[("mattermost", "all")]["duplicated"] == 0
    assert summary[("slack-http", "all")]["opsbot_cpu_ms_per_request"] > 0
    md = out.with_suffix(".md").read_text()
    assert "| slack-http | burst8 | 1 | all | 8 | 0 | 0 |" in md
    assert report["meta"]["commit"] != "unknown"  # provenance: the code the numbers are of
    for run_ in report["runs"]:
        (step,) = run_["patterns"]
        # CPU from the kernel's ns clocks of every bot process, divided by the requests in the window
        assert step["requests_in_window"] == 8 and step["opsbot_cpu_ns"] > 0
        assert step["opsbot_cpu_ns"] == sum(step["opsbot_cpu_ns_by_pid"].values())
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"
    # --render redraws the same report from the JSON alone
    out.with_suffix(".md").unlink()
    again = run(["--render", str(out)], tmp_path)
    assert again.returncode == 0, again.stderr
    assert out.with_suffix(".md").read_text() == md


def test_the_sweep_keeps_the_highest_rate_without_loss_or_late_submits() -> None:
    def row(rate: int, lost: int, p99: float | None) -> dict[str, object]:
        return {"platform": "slack-socket", "pattern": f"sweep{rate}", "episode": 1, "episodes": 1,
                "kind": "all", "n": 10, "lost": lost, "duplicated": 0,
                "submit_ms": {"p50": 1.0, "p99": p99, "n": 10}}  # fmt: skip

    verdict = sweep_verdict([row(25, 0, 3.0), row(50, 0, 9.0), row(100, 0, 400.0), row(150, 2, 2.0)], 100.0)
    assert verdict["slack-socket"]["sustained_per_s"] == 50
    assert verdict["slack-socket"]["rates"]["100"]["ok"] is False
    assert verdict["slack-socket"]["rates"]["150"]["ok"] is False
    assert STAGES[0] == "ack" and STAGES[-1] == "final"


@pytest.mark.slow
def test_the_urgent_rca_goes_out_once_every_follow_up_streams(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "incident.json"
    done = run(
        [
            "--engine", "synthetic", "--model", str(tiny_model), "--platforms", "slack-socket",
            "--patterns", "incident", "--channels", "4", "--answer-tokens", "48", "--rca-tokens", "8",
            "--tokens-per-s", "40", "--idle-s", "0.2", "--pause-s", "0", "--pattern-timeout-s", "60",
            "--workdir", str(tmp_path), "--out", str(out),
        ],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (run_,) = json.loads(out.read_text())["runs"]
    reqs = [r for r in run_["requests"] if r["pattern"] == "incident"]
    follow = [r for r in reqs if r["kind"] == "followup"]
    urgent = [r for r in reqs if r["kind"] == "rca"]
    assert len(follow) == 56 and len(urgent) == 8
    # on the one clock: every follow-up's first answer text reached the fake before any urgent left
    last_first_text = max(r["sent_s"] + r["first_token_ms"] / 1000 for r in follow)
    assert last_first_text <= min(r["sent_s"] for r in urgent)
    (step,) = [s for s in run_["patterns"] if s["pattern"] == "incident"]
    assert (
        step["followups"] == 56
        and step["followups_streaming_at_urgent"] + step["followups_finished_at_urgent"] == 56
    )
    assert step["requests_in_window"] == 120  # seeds, follow-ups and urgent: the CPU's divisor
