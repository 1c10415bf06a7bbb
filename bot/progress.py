"""The answer watchdog: an answer in flight that makes no progress for ``answer.stall_s`` is failed.

Progress is a platform call of the answer that completed (whatever the server answered: the
transports call :func:`note_progress` after every try) or an event from the engine. Time spent
waiting for the engine does not count (:func:`waiting_for_engine`): the engine's own watchdog and
request deadline bound it, and a long admission queue under load is not a stall. Everything else
counts: a rate-budget wait that never ends, a reply that waits on a call that never returns, a
note or reaction that hangs. The watchdog cancels the answer's task and :class:`AnswerWatch` turns
that cancel into :class:`~bot.errors.AnswerStalled`, which the pipeline fails visibly like any
other failure (a note in the thread where one can be posted, the failed reaction, the request row,
the claim released), so an answer is never lost in silence.

The watch reaches the transports through a context variable: tasks an answer starts (its reply's
edits) copy it, so their calls count for the answer; other work (housekeeping, other answers)
does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterator
from types import TracebackType

from bot.errors import AnswerStalled

_CURRENT: contextvars.ContextVar[AnswerWatch | None] = contextvars.ContextVar(
    "opsbot_answer_watch", default=None
)


def note_progress() -> None:
    """A platform call of the current answer completed (a no-op outside an answer)."""
    watch = _CURRENT.get()
    if watch is not None:
        watch.touch()


@contextlib.contextmanager
def waiting_for_engine() -> Iterator[None]:
    """The current answer waits for its engine's next event: the watchdog does not count this time;
    the event that ends the wait is progress."""
    watch = _CURRENT.get()
    if watch is None:
        yield
        return
    watch.paused += 1
    try:
        yield
    finally:
        watch.paused -= 1
        watch.touch()


class AnswerWatch:
    """``async with AnswerWatch(stall_s):`` around one answer's work; raises
    :class:`~bot.errors.AnswerStalled` out of the block when nothing moved for ``stall_s`` seconds
    (``None``: never). One timer per answer, re-armed only when it fires: a touch is one store."""

    def __init__(self, stall_s: float | None) -> None:
        self.stall_s = stall_s
        self.paused = 0
        """Waits for the engine in progress (see :func:`waiting_for_engine`)."""
        self.stalled = False
        """The watchdog fired."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last = 0.0
        self._task: asyncio.Task[object] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._token: contextvars.Token[AnswerWatch | None] | None = None

    def touch(self) -> None:
        """Progress now."""
        if self._loop is not None:
            self._last = self._loop.time()

    async def __aenter__(self) -> AnswerWatch:
        self._token = _CURRENT.set(self)
        if self.stall_s is not None:
            self._loop = asyncio.get_running_loop()
            self._task = asyncio.current_task()
            self._last = self._loop.time()
            self._timer = self._loop.call_at(self._last + self.stall_s, self._check)
        return self

    def _check(self) -> None:
        assert self._loop is not None and self.stall_s is not None
        now = self._loop.time()
        if self.paused:  # the engine's own watchdog owns this time
            self._last = now
        if now - self._last < self.stall_s:
            self._timer = self._loop.call_at(self._last + self.stall_s, self._check)
            return
        self._timer = None
        self.stalled = True
        if self._task is not None:
            self._task.cancel()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None
        # Our own cancel (and nobody else's, e.g. a shutdown's) becomes the stall.
        ours = self.stalled and exc_type is asyncio.CancelledError and self._task is not None
        if ours and self._task is not None and self._task.uncancel() == 0:
            raise AnswerStalled(
                f"no progress for {self.stall_s:g} s (no engine token, no platform call completed; "
                "answer.stall_s)"
            ) from None
