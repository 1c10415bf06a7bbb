"""Progress of a batch run: a live bar with items/s and ETA in a terminal, periodic log lines
elsewhere (CI, ``opsbot run``'s in-bot jobs, a redirected stderr)."""

from __future__ import annotations

import logging
import time
from typing import Protocol

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

logger = logging.getLogger(__name__)


class ProgressSink(Protocol):
    """What a batch run reports its progress to."""

    def start(self, total: int, done: int, label: str) -> None:
        """``total`` items, ``done`` of them already finished by an earlier run."""

    def advance(self, n: int = 1) -> None:
        """``n`` more items finished."""

    def finish(self) -> None:
        """The run ended (done, failed or interrupted)."""


class _ItemsPerSecond(ProgressColumn):
    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("- items/s" if speed is None else f"{speed:.2f} items/s", style="progress.data.speed")


class BarProgress:
    """A rich progress bar: items done / total, items/s, elapsed, ETA."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("items"),
            _ItemsPerSecond(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
            transient=False,
        )
        self._task: TaskID | None = None

    def start(self, total: int, done: int, label: str) -> None:
        self._progress.start()
        self._task = self._progress.add_task(label, total=total, completed=done)

    def advance(self, n: int = 1) -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)

    def finish(self) -> None:
        self._progress.stop()


class LogProgress:
    """A log line every ``every_s`` seconds (and at the end): done / total, items/s, ETA."""

    def __init__(self, every_s: float = 15.0) -> None:
        self.every_s = every_s
        self.total = 0
        self.done = 0
        self._fresh = 0
        self._label = ""
        self._t0 = 0.0
        self._last = 0.0

    def start(self, total: int, done: int, label: str) -> None:
        self.total, self.done, self._label = total, done, label
        self._t0 = self._last = time.monotonic()
        logger.info("%s: %d items, %d already done", label, total, done)

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._fresh += n
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._log(now)

    def _log(self, now: float) -> None:
        elapsed = max(now - self._t0, 1e-9)
        rate = self._fresh / elapsed
        left = self.total - self.done
        eta = f"{left / rate:.0f} s" if rate > 0 else "unknown"
        logger.info("%s: %d/%d items, %.2f items/s, ETA %s", self._label, self.done, self.total, rate, eta)

    def finish(self) -> None:
        self._log(time.monotonic())


def progress_for(console: Console) -> ProgressSink:
    """A bar on a terminal, log lines otherwise."""
    return BarProgress(console) if console.is_terminal else LogProgress()
