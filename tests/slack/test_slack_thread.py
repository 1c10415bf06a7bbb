"""The thread as context on Slack, end to end: the fake Slack's ``conversations.replies`` (cursor
pages), ``users.info``, ``conversations.info`` and ``files.uploadV2``'s three steps, read and
called by the real slack-sdk through the adapter; the pipeline on the CPU engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.kubernetes_server import FakeKubernetes, sample_cluster
from fakes.recording_engine import RecordingEngine
from fakes.slack_harness import BotFactory, answers, request_rows, settled
from fakes.slack_server import FakeSlack, FaultRule

from bot.config import Settings, ThreadSettings
from bot.context.gatherer import ContextGatherer
from bot.store import AlertThread

pytestmark = pytest.mark.timeout(120)


def _incident(slack: FakeSlack) -> dict[str, Any]:
    """A thread: alice reports, opsbot answered once, dana and a CI bot wrote since."""
    slack.add_user("U0ALICE", "alice", display_name="Alice")
    slack.add_user("U0DANA", "dana", display_name="Dana")
    parent = slack.user_message("C1", "U0ALICE", "checkout returns 503s since 13:55")
    ts = parent["ts"]
    slack.user_message("C1", "U0ALICE", "db graphs look odd", thread_ts=ts)
    bot_answer = slack.user_message(
        "C1", slack.bot_user_id, "The database pool looks exhausted.", thread_ts=ts
    )
    slack.find("C1", bot_answer["ts"]).bot_id = slack.bot_id  # type: ignore[union-attr]
    slack.user_message("C1", "U0DANA", "I rolled back payments-api at 14:02", thread_ts=ts)
    slack.bot_message("C1", "build 4411 deployed", thread_ts=ts, bot_id="B0CI", username="ci-bot")
    slack.user_message("C1", "U0DANA", "creds: DB_PASSWORD=hunter2secretpw", thread_ts=ts)
    return parent


async def test_a_follow_up_reads_the_thread_page_by_page_and_sees_what_dana_wrote(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(wrap_engine=RecordingEngine)
    bot.pipeline.thread = ThreadSettings(page_size=2)
    parent = _incident(slack)
    ask = slack.user_message(
        "C1",
        "U0BOB",
        f"<@{slack.bot_user_id}> given what Dana found, is the DB the cause?",
        thread_ts=parent["ts"],
    )
    await slack.deliver_event(slack.mention_events(ask)[0])
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    pages = [c for c in slack.calls if c.method == "conversations.replies"]
    assert len(pages) == 4  # 7 messages, 2 a page
    assert all(c.params["limit"] == "2" for c in pages)  # GET query arguments, as slack-sdk sends them
    assert "cursor" not in pages[0].params and all(c.params["cursor"] for c in pages[1:])
    engine: RecordingEngine = bot.engine  # type: ignore[assignment]
    prompt = engine.last_prompt()
    assert "] Dana: I rolled back payments-api at 14:02" in prompt
    assert "hunter2secretpw" not in prompt and "[REDACTED]" in prompt
    assert "build 4411" not in prompt  # another bot: dropped by the bot policy
    # Nothing is stored for this thread (opsbot "restarted"): its answer comes from Slack.
    assert "opsbot: The database pool looks exhausted." in prompt
    assert "given what Dana found" not in prompt.split("chat thread:")[-1].split("<<<END DATA")[0]
    # One look-up per human author (bots and opsbot need none; U0BOB is unknown and keeps his id).
    assert sorted(c.params["user"] for c in slack.calls if c.method == "users.info") == [
        "U0ALICE",
        "U0BOB",
        "U0DANA",
    ]
    # The next question in the thread asks Slack about nobody again: names are remembered, and so
    # is that U0BOB is unknown (user_not_found).
    again = slack.user_message("C1", "U0BOB", f"<@{slack.bot_user_id}> and now?", thread_ts=parent["ts"])
    await slack.deliver_event(slack.mention_events(again)[0])
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 2)
    await settled(bot)
    assert len([c for c in slack.calls if c.method == "users.info"]) == 3


async def test_rca_summary_with_a_link_to_the_thread_posts_a_catch_up_in_that_thread(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(wrap_engine=RecordingEngine)
    parent = _incident(slack)
    digits = parent["ts"].replace(".", "")
    link = f"<https://fake.slack.com/archives/C1/p{digits}>"
    await slack.deliver("slash_commands", slack.slash_command("C1", "U0BOB", f"summary {link}"))
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    (answer,) = answers(slack, "C1")
    assert answer.thread_ts == parent["ts"]
    engine: RecordingEngine = bot.engine  # type: ignore[assignment]
    assert engine.requests[-1].scenario == "thread_summary" and engine.requests[-1].lane.value == "urgent"
    transcript = engine.last_prompt()

    assert "Thread transcript (oldest first)" in transcript
    assert (
        "Dana: I rolled back payments-api at 14:02" in transcript
        and "opsbot: The database pool" in transcript
    )
    assert "_thinking" not in transcript  # the placeholder of this very answer is not thread content
    # The harness' 1,024-token window cannot hold it all: the oldest lines are cut, and the footer says so.
    footer = next(b for b in answer.blocks or [] if b["type"] == "context")["elements"][0]["text"]
    assert "earlier thread messages" in footer or "Alice: checkout returns 503s" in transcript
    # A link to another channel's thread is not followed: the asker learns how to ask instead.
    await slack.deliver(
        "slash_commands",
        slack.slash_command("C1", "U0BOB", f"summary https://fake.slack.com/archives/C9/p{digits}"),
    )
    await slack.wait_for(lambda: any("needs a thread" in e["text"] for e in slack.ephemerals))


async def test_a_postmortem_is_uploaded_with_files_upload_v2_into_the_thread(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot()
    parent = _incident(slack)
    ask = slack.user_message(
        "C1", "U0BOB", f"<@{slack.bot_user_id}> draft a postmortem", thread_ts=parent["ts"]
    )
    await slack.deliver_event(slack.mention_events(ask)[0])
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    methods = [c.method for c in slack.calls if c.method.startswith("files.")]
    assert methods == ["files.getUploadURLExternal", "files.completeUploadExternal"]
    (file_id,) = slack.uploads
    upload = slack.uploads[file_id]
    assert (
        upload["shared"]
        and upload["filename"].startswith("postmortem-")
        and upload["filename"].endswith(".md")
    )
    assert upload["length"] == len(upload["data"]) > 0
    (shared,) = [m for m in slack.messages["C1"] if m.files]
    assert shared.thread_ts == parent["ts"] and shared.files[0]["id"] == file_id  # type: ignore[index]
    (answer,) = answers(slack, "C1")
    assert "Postmortem draft attached" in answer.text and upload["filename"] in answer.text
    rows = await request_rows(bot.store)
    assert [r[2] for r in rows] == ["ok"]


async def test_a_failing_upload_leaves_the_draft_inline_with_the_reason(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(retry={"initial_s": 0.01, "max_retries": 1})
    slack.rules.append(FaultRule(methods=frozenset({"files.completeUploadExternal"}), server_error=1.0))
    parent = _incident(slack)
    ask = slack.user_message("C1", "U0BOB", f"<@{slack.bot_user_id}> postmortem", thread_ts=parent["ts"])
    await slack.deliver_event(slack.mention_events(ask)[0])
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    (answer,) = answers(slack, "C1")
    assert "could not be attached as a file" in answer.text and "files.completeUploadExternal" in answer.text


async def test_a_scoped_channel_named_by_pattern_shows_its_cluster_and_the_alerts_runbook_in_the_footer(
    slack: FakeSlack, make_bot: BotFactory, tmp_path: Path
) -> None:
    cluster: FakeKubernetes = sample_cluster()
    await cluster.start()
    folder = tmp_path / "runbooks"
    folder.mkdir()
    (folder / "CheckoutDown.md").write_text("# CheckoutDown\n1. look at the payments api pods\n")
    bot = await make_bot()
    gatherer = ContextGatherer.from_settings(
        Settings(
            kubernetes={"enabled": True, "kubeconfig": cluster.write_kubeconfig(tmp_path / "kc")},
            context={"default_cluster": "eu-west"},
            scope={"channels": [{"match": ["#inc-payments-*"], "namespaces": ["payments"]}]},
            runbooks={"enabled": True, "folder": folder},
        )
    )
    bot.pipeline.context = gatherer
    slack.channel_names["C1"] = "inc-payments-db"
    try:
        parent = slack.user_message("C1", "U0ALICE", "CheckoutDown firing")
        await bot.store.save_alert_thread(
            AlertThread('{}:{alertname="CheckoutDown"}', "slack", "C1", parent["ts"], "firing")
        )
        ask = slack.user_message(
            "C1", "U0BOB", f"<@{slack.bot_user_id}> what is broken in web?", thread_ts=parent["ts"]
        )
        await slack.deliver_event(slack.mention_events(ask)[0])
        await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
        await settled(bot)
    finally:
        await gatherer.close()
        await cluster.stop()
    (answer,) = answers(slack, "C1")
    footer = next(b for b in answer.blocks or [] if b["type"] == "context")["elements"][0]["text"]
    assert "scope: cluster eu-west, namespaces payments" in footer
    assert f"runbook: {(folder / 'CheckoutDown.md').resolve()}" in footer
    assert [c.params["channel"] for c in slack.calls if c.method == "conversations.info"] == ["C1"]
    assert not any("/namespaces/web/" in r for r in cluster.requests)


async def test_an_unreadable_thread_is_noted_in_the_footer_and_answered_all_the_same(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(retry={"initial_s": 0.01, "max_retries": 0})
    slack.rules.append(FaultRule(methods=frozenset({"conversations.replies"}), server_error=1.0))
    parent = _incident(slack)
    ask = slack.user_message("C1", "U0BOB", f"<@{slack.bot_user_id}> still broken?", thread_ts=parent["ts"])
    await slack.deliver_event(slack.mention_events(ask)[0])
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    (answer,) = answers(slack, "C1")
    footer = next(b for b in answer.blocks or [] if b["type"] == "context")["elements"][0]["text"]
    assert "Thread (failed: the thread could not be read: " in footer


async def test_a_bot_in_allowed_bots_is_kept_in_the_thread_context(
    slack: FakeSlack, make_bot: BotFactory
) -> None:
    bot = await make_bot(wrap_engine=RecordingEngine, allowed_bots=["ci-bot"])
    parent = _incident(slack)
    ask = slack.user_message(
        "C1", "U0BOB", f"<@{slack.bot_user_id}> did the deploy finish?", thread_ts=parent["ts"]
    )
    await slack.deliver_event(slack.mention_events(ask)[0])
    await slack.wait_for(lambda: len(answers(slack, "C1")) == 1)
    await settled(bot)
    engine: RecordingEngine = bot.engine  # type: ignore[assignment]
    assert "] ci-bot (bot): build 4411 deployed" in engine.last_prompt()
