"""The real CPU engine, its answers replayed at a GPU-like pace: for delivery tests under load.

The tiny model on two CPU cores answers 32 questions four at a time in a few seconds, so answers
would barely stream and never overlap the way an incident burst on a GPU does (every answer
streaming at once for several seconds). :class:`PacedEngine` lets the real engine generate each
answer as fast as it can, then hands its pieces to the pipeline one every ``token_interval_s``,
so N answers stream concurrently; what reaches the chat platform is exactly what the engine made.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator

from inference.engine import (
    Engine,
    EngineGenerateError,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    TextDelta,
    WrappedEngine,
)


class PacedEngine(WrappedEngine):
    """Wraps an engine; replays each answer's deltas ``token_interval_s`` apart (nothing else changes)."""

    def __init__(self, inner: Engine, token_interval_s: float = 0.1) -> None:
        super().__init__(inner)
        self.token_interval_s = token_interval_s

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        started = time.perf_counter()
        events = [event async for event in self.inner.generate(request)]
        first: float | None = None
        for event in events:
            if isinstance(event, TextDelta):
                await asyncio.sleep(self.token_interval_s)
                first = first or time.perf_counter()
                yield event
            elif isinstance(event, GenerationResult):
                # timings as the pipeline would have seen them from a stream at this pace
                done = time.perf_counter()
                yield dataclasses.replace(
                    event,
                    ttft_ms=((first or done) - started) * 1000,
                    e2e_ms=(done - started) * 1000,
                )


class FailingEngine(PacedEngine):
    """The real engine whose every generation fails after a first piece of text (a failed answer)."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        yield TextDelta("Looking at the pods ")
        raise EngineGenerateError("the model ran out of memory")


class LockstepEngine(PacedEngine):
    """:class:`PacedEngine` whose answers start streaming together, as a GPU engine's batch does: each
    answer waits until ``group`` answers are ready (or ``max_wait_s`` passed), then they all hand
    out their pieces ``token_interval_s`` apart, so their first words reach the pipeline in the
    same event-loop turn (one engine step streams a token for every request in the batch)."""

    def __init__(
        self, inner: Engine, group: int, token_interval_s: float = 0.05, max_wait_s: float = 10.0
    ) -> None:
        super().__init__(inner, token_interval_s)
        self.group = group
        self.max_wait_s = max_wait_s
        self._arrived = 0
        self._gates: dict[int, asyncio.Event] = {}

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        started = time.perf_counter()
        events = [event async for event in self.inner.generate(request)]
        index, self._arrived = self._arrived, self._arrived + 1
        gate = self._gates.setdefault(index // self.group, asyncio.Event())
        if (index + 1) % self.group == 0:
            gate.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(gate.wait(), self.max_wait_s)
        first: float | None = None
        for event in events:
            if isinstance(event, TextDelta):
                first = first or time.perf_counter()
                yield event
                await asyncio.sleep(self.token_interval_s)
            elif isinstance(event, GenerationResult):
                done = time.perf_counter()
                yield dataclasses.replace(
                    event, ttft_ms=((first or done) - started) * 1000, e2e_ms=(done - started) * 1000
                )
