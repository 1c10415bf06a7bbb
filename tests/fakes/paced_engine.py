"""The real CPU engine, its answers replayed at a GPU-like pace: for delivery tests under load.

The tiny model on two CPU cores answers 32 questions four at a time in a few seconds, so answers
would barely stream and never overlap the way an incident burst on a GPU does (every answer
streaming at once for several seconds). :class:`PacedEngine` lets the real engine generate each
answer as fast as it can, then hands its pieces to the pipeline one every ``token_interval_s``,
so N answers stream concurrently; what reaches the chat platform is exactly what the engine made.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence

from inference.engine import (
    ChatMessage,
    ChatTokenizer,
    Engine,
    EngineGenerateError,
    EngineHealth,
    EngineStats,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    TextDelta,
)


class PacedEngine(Engine):
    """Wraps an engine; replays each answer's deltas ``token_interval_s`` apart (nothing else changes)."""

    def __init__(self, inner: Engine, token_interval_s: float = 0.1) -> None:
        self.inner = inner
        self.token_interval_s = token_interval_s

    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        await self.inner.start(warmup_messages)

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

    async def abort(self, request_id: str) -> None:
        await self.inner.abort(request_id)

    def health(self) -> EngineHealth:
        return self.inner.health()

    def stats(self) -> EngineStats:
        return self.inner.stats()

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        await self.inner.shutdown(drain_timeout_s)

    @property
    def tokenizer(self) -> ChatTokenizer:
        return self.inner.tokenizer


class FailingEngine(PacedEngine):
    """The real engine whose every generation fails after a first piece of text (a failed answer)."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        yield TextDelta("Looking at the pods ")
        raise EngineGenerateError("the model ran out of memory")
