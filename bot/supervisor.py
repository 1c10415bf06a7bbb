"""A tiny supervisor so that no engine process outlives the bot.

vLLM runs its engine core (and, with tensor parallelism, one worker per GPU) in child processes.
When the bot exits normally they are shut down with it, but when the bot process is killed
(SIGKILL, the OOM killer, a segfault in a native library) nothing would stop them, and they keep
holding the GPU's memory, so the restarted bot cannot start its engine. ``opsbot run`` on the vLLM
backend therefore runs the bot as a child of this supervisor, which:

- is a Linux "child subreaper" (``PR_SET_CHILD_SUBREAPER``), so the bot's orphans are reparented
  to it rather than to init, and it can find and stop them;
- forwards SIGTERM / SIGINT / SIGHUP to the bot (graceful shutdown stays the bot's job);
- when the bot has exited, for whatever reason, stops every process left under it: SIGTERM, then
  SIGKILL after ``grace_s``;
- exits with the bot's exit status (a signal death becomes 128 + signal number, as shells do).

The supervisor imports nothing heavy and does no other work, so it is never the process the OOM
killer picks.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

SUPERVISED_ENV = "OPSBOT_SUPERVISED"
"""Set in the bot's environment by the supervisor (so the bot does not supervise itself again)."""
_PR_SET_CHILD_SUBREAPER = 36
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _become_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux: orphans go to init; the process group still works
        return False


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (read from /proc; empty where /proc does not exist)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if not proc.is_dir():
        return set()
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    frontier = [root]
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in found:
                found.add(child)
                frontier.append(child)
    return found


def _reap() -> None:
    """Collect every exited child (the bot's orphans are ours once we are their subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _stop_leftovers(grace_s: float) -> int:
    """SIGTERM, then after ``grace_s`` SIGKILL, every process still under this supervisor."""
    left = descendants(os.getpid())
    if not left:
        return 0
    logger.warning("the bot exited with %d process(es) still running under it: stopping them", len(left))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            _reap()
            left = descendants(os.getpid())
            if not left:
                return 0
            time.sleep(0.1)
    return len(left)


def supervise(command: Sequence[str], *, grace_s: float = 10.0) -> int:
    """Run ``command`` (the bot) as a supervised child; return its exit status (see the module doc)."""
    _become_subreaper()
    env = {**os.environ, SUPERVISED_ENV: "1"}
    child = subprocess.Popen(list(command), env=env)  # stdin / stdout / stderr are inherited

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        while True:
            try:
                status = child.wait()
                break
            except InterruptedError:  # a forwarded signal interrupted the wait
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    left = _stop_leftovers(grace_s)
    if left:
        logger.error("%d process(es) under the bot could not be stopped", left)
    return 128 - status if status < 0 else status
