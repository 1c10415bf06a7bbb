"""The pipeline with the thread as context, a catch-up and a postmortem draft, on the real CPU
engine: a terminal adapter whose thread-reading and file-upload methods answer from a list (the
adapter's side, on the fake Slack and Mattermost servers, is tested in tests/slack and
tests/mattermost)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fakes.recording_engine import RecordingEngine

from bot.adapters.console import ConsoleAdapter
from bot.app import submit_to
from bot.config import ThreadSettings
from bot.errors import PlatformRejected
from bot.pipeline import Pipeline
from bot.types import IncomingMessage, MessageKind, ThreadPost, ThreadRead
from inference.engine import GenerationEvent, GenerationRequest, GenerationResult

T0 = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)


class ThreadConsole(ConsoleAdapter):
    """The terminal adapter with a thread to read back and a place files go."""

    def __init__(self, posts: list[ThreadPost], **kw: Any) -> None:
        super().__init__(**kw)
        self.posts = posts
        self.reads: list[tuple[str, str, int]] = []
        self.uploads: list[dict[str, Any]] = []
        self.read_delay_s = 0.0
        self.upload_error: Exception | None = None

    async def read_thread(
        self, channel: str, thread_id: str, *, limit: int, page_size: int = 200
    ) -> ThreadRead | None:
        self.reads.append((channel, thread_id, limit))
        if self.read_delay_s:
            await asyncio.sleep(self.read_delay_s)
        return ThreadRead(list(self.posts))

    async def thread_from_link(self, text: str, channel: str) -> str | None:
        return "linked-thread" if "https://chat.example.com/t/" in text else None

    async def upload_file(
        self, channel: str, thread_id: str, *, filename: str, content: bytes, title: str, comment: str
    ) -> str:
        if self.upload_error is not None:
            raise self.upload_error
        self.uploads.append(
            {
                "channel": channel,
                "thread": thread_id,
                "filename": filename,
                "content": content,
                "title": title,
            }
        )
        return "F1"


def _posts() -> list[ThreadPost]:
    def at(minute: int, user: str, text: str, **kw: Any) -> ThreadPost:
        return ThreadPost(f"p{minute}", user, text, T0 + timedelta(minutes=minute), user_name=user, **kw)

    return [
        at(0, "alice", "checkout returns 503s since 13:55"),
        at(2, "opsbot", "The database pool looks exhausted.", from_self=True),
        at(3, "dana", "I rolled back payments-api at 14:02"),
        at(4, "ci", "build 4411 green", is_bot=True, bot_names=("ci",)),
    ]


@pytest.fixture
async def thread_parts(
    parts: Any,
) -> AsyncIterator[tuple[Pipeline, ThreadConsole, RecordingEngine, io.StringIO]]:
    engine = RecordingEngine(parts.engine)
    pipeline = Pipeline(
        engine=engine,
        store=parts.store,
        prompts=parts.pipeline.prompts,
        scenarios=parts.pipeline.scenarios,
        model_name="tiny",
        thread=ThreadSettings(timeout_s=0.5),
    )
    out = io.StringIO()
    adapter = ThreadConsole(_posts(), stdin=io.StringIO(""), stdout=out)
    await adapter.start(submit_to(pipeline, adapter))
    yield pipeline, adapter, engine, out


def _last_turn(engine: RecordingEngine) -> str:
    messages = engine.requests[-1].messages
    assert messages is not None
    return messages[-1].content


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "1000")


async def test_a_follow_up_sees_what_dana_wrote_since_the_last_answer(thread_parts) -> None:
    pipeline, adapter, engine, out = thread_parts
    await adapter._submit(adapter.to_message("given what Dana found, is the DB the cause?"))  # type: ignore[misc]
    assert adapter.reads == [("terminal", adapter.session, 500)]
    turn = _last_turn(engine)
    assert "[2026-11-29 14:03 UTC] dana: I rolled back payments-api at 14:02" in turn
    assert "build 4411" not in turn  # another bot's message: the bot policy
    # After a restart nothing is stored: opsbot's own earlier answer comes from the thread too.
    assert "opsbot: The database pool looks exhausted." in turn
    footer = out.getvalue().strip().splitlines()[-1]
    assert "sources: Thread" in footer


async def test_a_thread_that_cannot_be_read_in_time_is_noted_and_the_answer_goes_on(thread_parts) -> None:
    pipeline, adapter, engine, out = thread_parts
    adapter.read_delay_s = 5.0
    await adapter._submit(adapter.to_message("is the DB the cause?"))  # type: ignore[misc]
    footer = out.getvalue().strip().splitlines()[-1]
    assert "failed: Thread (failed: reading the thread took longer than 0.5 s)" in footer
    assert "tokens" in footer  # answered all the same
    assert "dana" not in _last_turn(engine)


async def test_summarize_in_a_thread_is_a_catch_up_of_the_whole_thread(thread_parts) -> None:
    pipeline, adapter, engine, out = thread_parts
    await adapter._submit(adapter.to_message("first question"))  # type: ignore[misc]
    await adapter._submit(adapter.to_message("summarize"))  # type: ignore[misc]
    request = engine.requests[-1]
    assert request.scenario == "thread_summary" and request.lane.value == "background"  # a follow-up
    assert request.messages is not None and len(request.messages) == 2  # no stored turns
    turn = request.messages[-1].content
    assert turn.startswith("Task: write a catch-up of this incident thread")
    assert "Thread transcript (oldest first)" in turn and "opsbot: The database pool" in turn


async def test_rca_summary_without_a_thread_explains_how_and_with_a_link_reads_that_thread(
    thread_parts,
) -> None:
    pipeline, adapter, engine, out = thread_parts
    plain = IncomingMessage(
        "console", "e1", "terminal", "bob", "summary", MessageKind.COMMAND, message_id="c1"
    )
    await pipeline.handle(plain, adapter)
    assert "A thread summary needs a thread" in out.getvalue() and engine.requests == []
    linked = IncomingMessage(
        "console", "e2", "terminal", "bob", "summary https://chat.example.com/t/123", MessageKind.COMMAND
    )
    await pipeline.handle(linked, adapter)
    assert adapter.reads[-1] == ("terminal", "linked-thread", 500)
    assert engine.requests[-1].scenario == "thread_summary" and engine.requests[-1].lane.value == "urgent"


async def test_a_postmortem_is_uploaded_as_a_markdown_file_with_a_short_message(thread_parts, parts) -> None:
    pipeline, adapter, engine, out = thread_parts
    await adapter._submit(adapter.to_message("/rca postmortem"))  # type: ignore[misc]
    request = engine.requests[-1]
    assert request.scenario == "postmortem" and request.lane.value == "normal"
    assert "## Timeline" in _last_turn(engine)
    (upload,) = adapter.uploads
    assert upload["thread"] == adapter.session
    assert upload["filename"].startswith("postmortem-") and upload["filename"].endswith(".md")
    assert upload["content"].decode()  # the draft itself
    printed = out.getvalue()
    assert "Postmortem draft attached: `postmortem-" in printed and " KB, " in printed
    # The stored turn is the draft (follow-ups can refer to it), not the note about the file.
    history = await parts.store.thread_history("console", "terminal", adapter.session)
    # The file's body is the draft with its trailing whitespace cut (a random model may end in spaces).
    assert history[-1].content.rstrip() == upload["content"].decode().rstrip()


class _NulEngine(RecordingEngine):
    """The real engine, its answer with a NUL in the middle (a random model emits such bytes)."""

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        async for event in super().generate(request):
            if isinstance(event, GenerationResult):
                event = dataclasses.replace(event, text=event.text[:20] + "\x00" + event.text[20:])
            yield event


async def test_a_postmortem_with_a_nul_in_the_answer_is_the_same_text_in_the_file_and_the_turn(
    parts: Any,
) -> None:
    pipeline = Pipeline(
        engine=_NulEngine(parts.engine),
        store=parts.store,
        prompts=parts.pipeline.prompts,
        scenarios=parts.pipeline.scenarios,
        model_name="tiny",
        thread=ThreadSettings(timeout_s=0.5),
    )
    adapter = ThreadConsole(_posts(), stdin=io.StringIO(""), stdout=io.StringIO())
    await adapter.start(submit_to(pipeline, adapter))
    await adapter._submit(adapter.to_message("/rca postmortem"))  # type: ignore[misc]
    (upload,) = adapter.uploads
    content = upload["content"].decode()
    assert "\x00" not in content and "\ufffd" in content  # PostgreSQL text refuses NUL
    history = await parts.store.thread_history("console", "terminal", adapter.session)
    assert history[-1].content == content.rstrip("\n")


async def test_a_refused_upload_puts_the_draft_inline_with_the_reason(thread_parts) -> None:
    pipeline, adapter, engine, out = thread_parts
    adapter.upload_error = PlatformRejected("files.completeUploadExternal: not_allowed_token_type")
    await adapter._submit(adapter.to_message("/rca postmortem"))  # type: ignore[misc]
    printed = out.getvalue()
    assert "could not be attached as a file (files.completeUploadExternal: not_allowed_token_type)" in printed
