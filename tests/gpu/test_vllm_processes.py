"""vLLM's engine-core (and, with tensor parallelism, worker) processes never outlive ``opsbot run``:
not after SIGTERM (graceful shutdown), not after SIGKILL of the bot (a crash)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (from /proc, no psutil needed)."""
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent and int(entry.name) not in found:
                found.add(int(entry.name))
                frontier.append(int(entry.name))
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def _start(tiny_model: Path, tmp_path: Path) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update(
        {
            "PYTHONPATH": os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
            "OPSBOT_DATA_DIR": str(tmp_path),
            "OPSBOT_HTTP__PORT": "0",
            "OPSBOT_ENGINE__BACKEND": "vllm",
            "OPSBOT_ENGINE__MODEL": str(tiny_model),
            "OPSBOT_ENGINE__GPU_MEMORY_UTILIZATION": "0.2",
            "OPSBOT_ENGINE__MAX_MODEL_LEN": "1024",
            "OPSBOT_ENGINE__ENFORCE_EAGER": "true",
            "OPSBOT_ENGINE__INCIDENT_WARMUP": "false",
        }
    )
    return subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "run"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait_ready(proc: subprocess.Popen[str], timeout_s: float = 300) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if "serving HTTP only" in line or "HTTP server listening" in line:
            return lines
    raise AssertionError("opsbot run did not come up:\n" + "".join(lines[-40:]))


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_no_vllm_process_outlives_the_bot(how: str, tiny_model: Path, tmp_path: Path) -> None:
    proc = _start(tiny_model, tmp_path)
    try:
        _wait_ready(proc)
        children = _children(proc.pid)
        assert children, "vLLM started no engine-core process?"
        proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        proc.wait(timeout=120)
        deadline = time.monotonic() + 30
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _alive(children) == set(), f"left running after {how}: {sorted(_alive(children))}"
        if how == "sigterm":
            assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _alive(_children(proc.pid)):
            os.kill(pid, signal.SIGKILL)
