"""bot/supervisor.py: no process started under the bot outlives it, whatever ends the bot."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bot.supervisor import descendants

# A stand-in for the bot: it starts a long-lived child (as vLLM starts its engine core) that
# ignores SIGTERM, writes both pids, then waits to be told how to end.
BOT = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
    def graceful(*_):
        child.kill(); child.wait(); sys.exit(0)
    signal.signal(signal.SIGTERM, graceful)
    time.sleep(600)
    """
)
SUPERVISE = "import sys; from bot.supervisor import supervise; sys.exit(supervise(sys.argv[1:], grace_s=1.0))"


def _run(tmp_path: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    pids = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    sup = subprocess.Popen([sys.executable, "-c", SUPERVISE, sys.executable, "-c", BOT, str(pids)], env=env)
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text().strip()):
        assert time.monotonic() < deadline, "the bot stand-in did not start"
        time.sleep(0.05)
    bot, child = (int(x) for x in pids.read_text().split())
    return sup, bot, child


def _gone(pid: int, timeout_s: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_a_killed_bot_leaves_no_process_behind_and_its_status_is_passed_on(tmp_path: Path) -> None:
    sup, bot, child = _run(tmp_path)
    assert child in descendants(sup.pid)
    os.kill(bot, signal.SIGKILL)  # a crash: the bot cannot clean up after itself
    assert sup.wait(timeout=30) == 128 + signal.SIGKILL
    assert _gone(child), "the engine stand-in outlived the killed bot"


def test_sigterm_reaches_the_bot_which_shuts_down_gracefully(tmp_path: Path) -> None:
    sup, bot, child = _run(tmp_path)
    sup.send_signal(signal.SIGTERM)
    assert sup.wait(timeout=30) == 0
    assert _gone(bot) and _gone(child)
