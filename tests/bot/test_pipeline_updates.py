"""Partial text reaches the reply (redacted, each time) only when the reply can send it."""

from __future__ import annotations

import time
from typing import Any

from fakes.paced_engine import PacedEngine

from bot.adapters.base import ChatAdapter, MessageSink, ReplyStream
from bot.pipeline import Pipeline
from bot.types import FinalAnswer, IncomingMessage, MessageKind


class CountingReply(ReplyStream):
    """Records each partial text handed over; says its next edit is ``next_edit_s`` away."""

    def __init__(self, next_edit_s: float) -> None:
        self.next_edit_s = next_edit_s
        self.updates: list[str] = []
        self.final: FinalAnswer | None = None

    def seconds_to_next_edit(self) -> float:
        return self.next_edit_s

    async def update(self, text: str) -> None:
        self.updates.append(text)
        if text.strip() and self.first_visible_at is None:
            self.first_visible_at = time.perf_counter()

    async def finish(self, answer: FinalAnswer) -> None:
        self.final = answer

    @property
    def thread_id(self) -> str:
        return "t1"


class OneReplyAdapter(ChatAdapter):
    platform = "test"

    def __init__(self, reply: CountingReply) -> None:
        self.reply = reply

    async def start(self, submit: MessageSink) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def open_reply(self, message: IncomingMessage) -> ReplyStream:
        return self.reply

    async def send_notice(self, message: IncomingMessage, text: str, *, ephemeral: bool = False) -> None:
        pass


async def _answer(parts: Any, next_edit_s: float, n: int) -> CountingReply:
    pipeline = Pipeline(
        engine=PacedEngine(parts.engine, 0.08),  # 12 tokens over ~1 s: several 0.2 s update slots
        store=parts.store,
        prompts=parts.pipeline.prompts,
        scenarios=parts.pipeline.scenarios,
        model_name="tiny",
    )
    reply = CountingReply(next_edit_s)
    message = IncomingMessage(
        platform="test",
        event_id=f"e{n}",
        channel="c1",
        user="u1",
        text="which pods are crashlooping?",
        kind=MessageKind.DIRECT,
        message_id=f"m{n}",
    )
    await pipeline.handle(message, OneReplyAdapter(reply))
    assert reply.final is not None and reply.final.error is None
    return reply


async def test_partial_text_is_handed_over_only_when_the_reply_would_send_it(parts: Any) -> None:
    ready = await _answer(parts, 0.0, 1)  # a reply that sends at once gets the 0.2 s cadence
    waiting = await _answer(parts, 10.0, 2)  # a reply 10 s from its next edit gets the first words only
    first_words = [u for u in waiting.updates if u.strip()]
    assert len(first_words) == 1
    assert len(ready.updates) > len(waiting.updates)
