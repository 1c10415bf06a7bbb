"""vLLM's engine-core (and, with tensor parallelism, worker) processes never outlive ``opsbot run``:
not after SIGTERM (graceful shutdown), not after SIGKILL of the bot (a crash).

``opsbot run`` on vLLM is a small supervisor (bot/supervisor.py) with the bot as its child; a crash
is the bot process dying (SIGKILL, the OOM killer), which the supervisor outlives by design."""

from __future__ import annotations

import contextlib
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


def _parent(pid: int) -> int | None:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


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
    seen: set[int] = set()
    try:
        _wait_ready(proc)
        children = _children(proc.pid)
        seen.update(children)
        assert len(children) >= 2, "no bot and engine-core process under the supervisor?"
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        else:
            bots = [pid for pid in children if _parent(pid) == proc.pid]
            assert len(bots) == 1, f"expected one bot process under the supervisor, found {bots}"
            os.kill(bots[0], signal.SIGKILL)
        proc.wait(timeout=120)
        deadline = time.monotonic() + 30
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _alive(children) == set(), f"left running after {how}: {sorted(_alive(children))}"
        assert proc.returncode == (0 if how == "sigterm" else 128 + signal.SIGKILL)
    finally:
        # Whatever failed above, leave no engine holding GPU memory for the tests that follow:
        # once the supervisor is gone, its orphans no longer show under its pid.
        seen.update(_children(proc.pid))
        if proc.poll() is None:
            proc.kill()
        for pid in _alive(seen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
