"""Request building and stream reading shared by the engine tests (contract and per-engine)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable

from inference.engine import (
    ChatMessage,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    Lane,
    SamplingSettings,
    TextDelta,
)

QUESTION = [
    ChatMessage("system", "You are opsbot."),
    ChatMessage("user", "Why is checkout-api crashlooping?"),
]


def make_request(
    request_id: str,
    *,
    lane: Lane = Lane.NORMAL,
    messages: list[ChatMessage] | None = None,
    **sampling: object,
) -> GenerationRequest:
    settings = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 12, "seed": 7, "ignore_eos": True}
    settings.update(sampling)
    return GenerationRequest(
        request_id=request_id,
        scenario="chat",
        lane=lane,
        sampling=SamplingSettings(**settings),  # type: ignore[arg-type]
        messages=messages or QUESTION,
    )


async def collect(stream: AsyncIterator[GenerationEvent]) -> tuple[list[str], GenerationResult]:
    deltas: list[str] = []
    async for event in stream:
        if isinstance(event, TextDelta):
            deltas.append(event.text)
        else:
            return deltas, event
    raise AssertionError("the stream ended without a GenerationResult")


async def wait_until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.005)
