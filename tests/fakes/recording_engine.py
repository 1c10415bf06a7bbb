"""An engine that records what it is asked: the real engine underneath, every request kept, so a
test can read the prompt (``GenerationRequest.messages``) the pipeline built."""

from __future__ import annotations

from collections.abc import AsyncIterator

from inference.engine import (
    Engine,
    GenerationEvent,
    GenerationRequest,
    WrappedEngine,
)


class RecordingEngine(WrappedEngine):
    """The real engine, with every request it was given kept for the test to read."""

    def __init__(self, inner: Engine) -> None:
        super().__init__(inner)
        self.requests: list[GenerationRequest] = []
        self.closed_early: list[str] = []
        """Ids of the requests whose stream the caller closed before the engine finished it."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        self.requests.append(request)
        finished = False
        try:
            async for event in self.inner.generate(request):
                yield event
            finished = True
        finally:
            if not finished:
                self.closed_early.append(request.request_id)

    def last_prompt(self) -> str:
        """The last user turn of the last request."""
        messages = self.requests[-1].messages
        assert messages is not None
        return messages[-1].content
