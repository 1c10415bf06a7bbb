"""The whole flow on the CPU engine: stream, store, follow-ups, commands, failures."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.emoji import Emoji

from bot.adapters.console import ConsoleAdapter
from bot.app import submit_to
from bot.pipeline import ENGINE_DEAD_TEXT
from bot.routing import pick_lane, pick_scenario
from bot.store import Store
from bot.types import IncomingMessage, MessageKind
from inference.engine import Lane


async def rows(store: Store) -> list:
    stats = await store.latency_stats(datetime.now(UTC) - timedelta(hours=1))
    return stats


async def wait_for_rows(store: Store, count: int) -> list:
    for _ in range(200):
        found = await rows(store)
        if sum(r.count for r in found) >= count:
            return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {count} request rows, found {await rows(store)}")


async def test_a_question_streams_an_answer_and_records_one_row_with_timings(parts: Any) -> None:
    await parts.adapter._submit(parts.adapter.to_message("which pods are crashlooping?"))  # type: ignore[misc]
    printed = parts.out.getvalue()
    assert "first token" in printed and "ms/token" in printed and "tokens" in printed
    (group,) = await wait_for_rows(parts.store, 1)
    assert group.platform == "console" and group.count == 1 and group.errors == 0
    assert group.ttft_ms.p50 is not None and group.tpot_ms.p50 is not None and group.e2e_ms.p50 is not None


async def test_a_follow_up_sees_the_thread_history(parts: Any) -> None:
    adapter = parts.adapter
    await adapter._submit(adapter.to_message("first question about api-gateway"))  # type: ignore[misc]
    follow = adapter.to_message("and what about the database?")
    assert follow.kind is MessageKind.FOLLOWUP
    await adapter._submit(follow)  # type: ignore[misc]
    for _ in range(100):
        history = await parts.store.thread_history("console", "terminal", adapter.session)
        if len(history) == 4:
            break
        await asyncio.sleep(0.05)
    assert [m.role for m in history] == ["user", "assistant", "user", "assistant"]
    assert history[0].content == "first question about api-gateway"


async def test_the_same_event_delivered_twice_is_answered_once(parts: Any) -> None:
    message = parts.adapter.to_message("hello?")
    twin = IncomingMessage(**{f: getattr(message, f) for f in message.__slots__})  # type: ignore[attr-defined]
    await asyncio.gather(
        parts.pipeline.handle(message, parts.adapter), parts.pipeline.handle(twin, parts.adapter)
    )
    assert parts.out.getvalue().count("first token") == 1


async def test_rca_help_and_status_answer_without_the_engine(parts: Any) -> None:
    await parts.adapter._submit(parts.adapter.to_message("/rca help"))  # type: ignore[misc]
    await parts.adapter._submit(parts.adapter.to_message("/rca status"))  # type: ignore[misc]
    out = parts.out.getvalue()
    assert "/rca <question" in out
    assert "Queue: urgent" in out and "KV cache" in out and "TTFT last hour" in out


async def test_a_dead_engine_is_reported_in_the_thread_and_recorded(parts: Any) -> None:
    await parts.engine.shutdown(1)
    await parts.adapter._submit(parts.adapter.to_message("is anything wrong?"))  # type: ignore[misc]
    out = parts.out.getvalue()
    assert "⚠ Generating the answer failed" in out and ":warning:" not in out  # the terminal shows the emoji
    (group,) = await wait_for_rows(parts.store, 1)
    assert group.errors == 1


async def test_secrets_in_the_question_never_reach_the_store(parts: Any) -> None:
    secret = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    await parts.adapter._submit(parts.adapter.to_message(f"my token is {secret} why 401?"))  # type: ignore[misc]
    for _ in range(100):
        history = await parts.store.thread_history("console", "terminal", parts.adapter.session)
        if history:
            break
        await asyncio.sleep(0.05)
    assert history and all(secret not in m.content for m in history)


def test_scenario_and_lane_follow_the_kind_of_question() -> None:
    def msg(kind: MessageKind, text: str) -> IncomingMessage:
        return IncomingMessage(platform="p", event_id="e", channel="c", user="u", text=text, kind=kind)

    assert pick_scenario(msg(MessageKind.COMMAND, "api is slow")) == "root_cause"
    assert pick_scenario(msg(MessageKind.ALERT, "x")) == "alert_summary"
    assert pick_scenario(msg(MessageKind.MENTION, "please review the rollout of api")) == "change_review"
    assert pick_scenario(msg(MessageKind.MENTION, "hello")) == "chat"
    assert pick_lane(msg(MessageKind.COMMAND, "")) is Lane.URGENT
    assert pick_lane(msg(MessageKind.MENTION, "")) is Lane.NORMAL
    assert pick_lane(msg(MessageKind.FOLLOWUP, "")) is Lane.BACKGROUND


async def test_the_terminal_repl_reads_lines_until_quit(parts: Any) -> None:
    out = io.StringIO()
    adapter = ConsoleAdapter(stdin=io.StringIO("what is failing?\n\n/quit\nnever asked\n"), stdout=out)
    await adapter.start(submit_to(parts.pipeline, adapter))
    await adapter.repl()
    assert out.getvalue().count("first token") == 1
    assert Emoji.replace(ENGINE_DEAD_TEXT) not in out.getvalue()


class RefusingAdapter(ConsoleAdapter):
    """A terminal whose platform refuses every post with the given branch of bot.errors."""

    def __init__(self, error: Exception) -> None:
        super().__init__(stdin=io.StringIO(""), stdout=io.StringIO())
        self.error = error
        self.notices: list[str] = []

    async def open_reply(self, message: IncomingMessage) -> Any:
        raise self.error

    async def send_notice(self, message: IncomingMessage, text: str, *, ephemeral: bool = False) -> None:
        self.notices.append(text)


async def test_each_platform_error_branch_becomes_its_own_request_status(parts: Any) -> None:
    from bot.errors import PlatformRejected, PlatformThrottled, PlatformUnavailable

    for error, _status in (
        (PlatformRejected("chat.postMessage: not_in_channel"), "undelivered"),
        (PlatformThrottled("chat.postMessage: still rate limited after 300 s"), "throttled"),
        (PlatformUnavailable("chat.postMessage: HTTP 503 after 6 retries"), "undelivered"),
    ):
        adapter = RefusingAdapter(error)
        await parts.pipeline.submit(adapter.to_message("why is the api down?"), adapter)
        assert adapter.notices and str(error) in adapter.notices[0]  # the asker learns why
    stats = await wait_for_rows(parts.store, 3)
    by_status: dict[str, int] = {}
    for group in stats:
        for name, count in group.by_status.items():
            by_status[name] = by_status.get(name, 0) + count
    assert by_status == {"undelivered": 2, "throttled": 1}
