"""Urgent work first on the bot's own event loop, not only in the engine.

The engine's lanes (``inference.admission``) order requests once they reach it. Before that, every
answer shares one event loop: the claim in the store, the sign of life, the thread read back, the
prompt's tokenization, and for answers already streaming, their edits. In an incident 56 thread
follow-ups arriving just before 8 urgent ``/rca`` made the ``/rca`` wait ~0.7 s for their engine
submit (bench/e2e_bench.py, incident pattern), in the same FIFO as the follow-ups' work.

:class:`UrgentFirst` is the loop-level rule, the same one the engine's admission applies to its
lanes (``hold_background_while_urgent_prefills``): while an urgent answer is on its way to its first
visible words (:meth:`UrgentFirst.hold`), background answers (thread follow-ups, batch work) pause at
their next checkpoint (:meth:`UrgentFirst.step_aside`) until no urgent answer is left on that way.
@-mentions and DMs (the normal lane) never pause: someone is waiting on them too, and holding them
back behind the ``/rca`` of a mixed burst tripled their median first-token time on the CPU bench.
A pause is bounded (``max_wait_s`` per checkpoint), so a stream of urgent work slows background
answers without ever stopping them, and I/O already in flight is never held back: only the next
step waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from bot import metrics
from inference.engine import Lane


class UrgentHold:
    """One urgent answer's claim on the loop, from its arrival to its first visible words."""

    def __init__(self, owner: UrgentFirst) -> None:
        self._owner: UrgentFirst | None = owner

    def release(self) -> None:
        """Give the loop back (idempotent: the first visible words, or the answer's end)."""
        owner, self._owner = self._owner, None
        if owner is not None:
            owner._released()


class UrgentFirst:
    """Background answers step aside while urgent ones are being prepared (see the module doc)."""

    def __init__(self, max_wait_s: float = 0.5) -> None:
        self.max_wait_s = max_wait_s
        """The longest one checkpoint holds a background answer back, in seconds (0: off)."""
        self._holds = 0
        self._clear = asyncio.Event()
        self._clear.set()

    @property
    def urgent_in_flight(self) -> int:
        """Urgent answers not yet showing their first words."""
        return self._holds

    def hold(self, lane: Lane) -> UrgentHold | None:
        """For an urgent answer: a hold to :meth:`UrgentHold.release` once its first words are
        visible (or it ends); ``None`` for any other lane."""
        if lane is not Lane.URGENT or self.max_wait_s <= 0:
            return None
        self._holds += 1
        self._clear.clear()
        return UrgentHold(self)

    def _released(self) -> None:
        self._holds -= 1
        if self._holds == 0:
            self._clear.set()

    async def step_aside(self, lane: Lane) -> None:
        """A checkpoint of an answer in ``lane``: a background answer waits (at most
        ``max_wait_s``) while urgent answers are on their way to their first words; any other lane,
        or no urgent answer on its way, returns at once."""
        if lane is not Lane.BACKGROUND or self._clear.is_set():
            return
        started = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._clear.wait(), self.max_wait_s)
        metrics.STEPPED_ASIDE.labels(lane.value).observe(time.perf_counter() - started)
