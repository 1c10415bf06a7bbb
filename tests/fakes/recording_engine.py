"""An engine that records what it is asked: the real engine underneath, every request kept, so a
test can read the prompt (``GenerationRequest.messages``) the pipeline built."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from inference.engine import (
    ChatMessage,
    ChatTokenizer,
    Engine,
    EngineHealth,
    EngineStats,
    GenerationEvent,
    GenerationRequest,
)


class RecordingEngine(Engine):
    """The real engine, with every request it was given kept for the test to read."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.requests: list[GenerationRequest] = []

    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        await self.inner.start(warmup_messages)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        self.requests.append(request)
        async for event in self.inner.generate(request):
            yield event

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

    def last_prompt(self) -> str:
        """The last user turn of the last request."""
        messages = self.requests[-1].messages
        assert messages is not None
        return messages[-1].content
