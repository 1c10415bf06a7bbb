"""A log line during ``opsbot analyze`` prints above the progress bar, never glued onto it."""

from __future__ import annotations

import io
import logging
import sys

import pytest
from rich.console import Console

from bot.analyze.progress import BarProgress
from bot.logs import setup_logging

ERASE_LINE = "\r\x1b[2K"


def test_a_log_line_while_the_bar_is_live_goes_above_it(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(sys, "stderr", screen)  # the terminal the bar and the log share
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        setup_logging("INFO")  # logs to stderr, as opsbot analyze does
        bar = BarProgress(Console(stderr=True, force_terminal=True, width=100))
        bar.start(10, 0, "analyze (alert_summary, engine)")
        bar.advance()
        logging.getLogger("bot.analyze.runner").warning("batch item 3 failed: overloaded")
        bar.advance()
        bar.finish()
    finally:
        root.handlers[:], root.level = saved
    shown = screen.getvalue()
    before, line, _ = shown.partition("WARNING bot.analyze.runner: batch item 3 failed: overloaded")
    assert line, shown
    # The bar's line was erased and the log line starts a line of its own (timestamp first); the
    # bar is drawn again below it.
    assert before.rsplit(ERASE_LINE, 1)[1].startswith("20")
    assert "analyze (alert_summary, engine)" in shown.split(line, 1)[1]
