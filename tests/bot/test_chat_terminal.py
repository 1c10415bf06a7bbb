"""``opsbot chat`` on a real terminal (a pseudo-terminal): the Up key recalls the last session's
line through readline, instead of typing ``^[[A`` into the question; the history is kept."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UP = b"\x1b[A"


def read_until(fd: int, needle: bytes, deadline: float) -> bytes:
    seen = b""
    while needle not in seen:
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"no {needle!r} on the terminal; it showed {seen[-400:]!r}")
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
    return seen


@pytest.mark.skipif(sys.platform == "win32", reason="no pseudo-terminals")
def test_up_recalls_the_last_sessions_line_and_history_is_kept(tmp_path: Path, tiny_model: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "chat_history").write_text("/quit\n")  # what an earlier session typed last
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "OPSBOT_DATA_DIR": str(data),
            "OPSBOT_ENGINE__MODEL": str(tiny_model),
            "NO_COLOR": "1",
            "TERM": "xterm",
        }
    )
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "chat"],
        stdin=child,
        stdout=child,
        stderr=child,
        env=env,
        cwd=tmp_path,
    )
    os.close(child)
    try:
        shown = read_until(main, b"opsbot> ", time.monotonic() + 180)
        assert b"model: tiny" in shown or b"random weights" in shown  # the banner came first
        os.write(main, UP + b"\r")
        # readline put "/quit" back on the line: the session ends at once, no answer is generated.
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    assert (data / "chat_history").read_text().splitlines()[-1] == "/quit"
