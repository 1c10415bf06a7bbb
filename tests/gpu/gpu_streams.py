"""Helpers shared by the GPU test modules: build a chat request, drain a generation stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

from inference.engine import (
    ChatMessage,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    Lane,
    SamplingSettings,
    TextDelta,
)


def chat_request(
    rid: str, system: ChatMessage, question: str, *, lane: Lane = Lane.NORMAL, max_tokens: int = 32
) -> GenerationRequest:
    """A greedy, fixed-length (``ignore_eos``) chat request behind the shared system prompt."""
    return GenerationRequest(
        request_id=rid,
        scenario="chat",
        lane=lane,
        sampling=SamplingSettings(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        messages=[system, ChatMessage("user", question)],
    )


async def collect(stream: AsyncIterator[GenerationEvent]) -> tuple[list[TextDelta], GenerationResult]:
    """Every delta of ``stream`` and its final result."""
    deltas: list[TextDelta] = []
    async for event in stream:
        if isinstance(event, TextDelta):
            deltas.append(event)
        else:
            return deltas, event
    raise AssertionError("stream ended without a result")
