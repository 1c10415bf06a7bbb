"""The chat thread as context: which messages are taken (since opsbot's last answer, earlier ones,
the whole thread), how they are labelled, redacted, budgeted and placed in the prompt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from bot.context.base import ContextBundle
from bot.context.thread import thread_context
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
from bot.store import ThreadMessage
from bot.types import ThreadPost, ThreadRead

T0 = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)


def post(minute: int, user: str, text: str, **kw: object) -> ThreadPost:
    return ThreadPost(
        message_id=f"m{minute}",
        user=user,
        user_name=kw.pop("name", user),
        text=text,  # type: ignore[arg-type]
        posted_at=T0 + timedelta(minutes=minute),
        **kw,  # type: ignore[arg-type]
    )


def incident() -> ThreadRead:
    return ThreadRead(
        [
            post(0, "U1", "payments-api returns 503s since 13:55", name="alice"),
            post(1, "UB", "what is wrong with payments-api?", name="bob"),
            post(2, "UBOT", "Most likely the database connection pool is exhausted.", from_self=True),
            post(3, "UD", "I rolled back payments-api at 14:02", name="dana"),
            post(
                4,
                "UD",
                "creds for the replica: DB_PASSWORD=hunter2secretpw, logs at /var/log/pg",
                name="dana",
            ),
            post(
                5,
                "UCI",
                "deploy #4411 finished",
                name="ci",
                is_bot=True,
                bot_ids=("B0CI",),
                bot_names=("ci",),
            ),
            post(6, "UB", "given what Dana found, is the DB the cause?", name="bob"),
        ]
    )


STORED = [
    ThreadMessage("user", "what is wrong with payments-api?", "UB", T0, "r1"),
    ThreadMessage("assistant", "Most likely the database connection pool is exhausted.", None, T0, "r1"),
]


def test_messages_since_the_last_answer_come_first_labelled_with_author_and_time_and_redacted():
    found = thread_context(incident(), answering="m6", stored=STORED)
    since, earlier = found.sections
    assert "alice: payments-api returns 503s" in earlier.body
    assert "what is wrong with payments-api?" not in earlier.body  # a stored question: not repeated
    assert since.title == "Messages since opsbot's last answer (oldest first)" and since.priority == 1
    lines = since.body.splitlines()
    assert lines[0] == "[2026-11-29 14:03 UTC] dana: I rolled back payments-api at 14:02"
    assert "hunter2secretpw" not in since.body and "[REDACTED]" in since.body
    assert "given what Dana found" not in since.body  # the question being answered is the question
    assert "deploy #4411" not in since.body  # another bot: the bot policy drops it
    assert found.note.detail == (
        "3 messages read; 2 since opsbot's last answer; 1 bot message ignored (bot policy)"
    )


def test_earlier_messages_are_kept_apart_and_an_allowed_bot_is_kept():
    stored = [ThreadMessage("user", "something else entirely", "UB", T0, "r1")]
    found = thread_context(incident(), answering="m6", stored=stored, keep_bot=lambda p: "ci" in p.bot_names)
    since, earlier = found.sections
    assert "[2026-11-29 14:05 UTC] ci (bot): deploy #4411 finished" in since.body
    assert earlier.title == "Earlier messages (oldest first)" and earlier.priority == 45
    assert earlier.body.splitlines()[0].endswith("alice: payments-api returns 503s since 13:55")


def test_after_a_restart_with_no_stored_turns_opsbots_own_answers_come_from_the_thread():
    found = thread_context(incident(), answering="m6", stored=[])
    earlier = next(s for s in found.sections if s.title.startswith("Earlier"))
    assert "opsbot: Most likely the database connection pool is exhausted." in earlier.body
    assert "bob: what is wrong with payments-api?" in earlier.body


def test_a_catch_up_reads_the_whole_thread_in_order():
    found = thread_context(incident(), answering=None, stored=STORED, whole=True)
    (transcript,) = found.sections
    lines = transcript.body.splitlines()
    assert [line.split("] ", 1)[1].split(":")[0] for line in lines] == [
        "alice",
        "bob",
        "opsbot",
        "dana",
        "dana",
        "bob",
    ]
    assert found.note.detail.startswith("5 messages read (whole thread)")


def test_long_messages_are_cut_and_line_breaks_marked():
    read = ThreadRead([post(0, "U1", "line one\nline two " + "x" * 500, name="alice")], skipped=40)
    found = thread_context(read, answering=None, max_chars=100)
    body = found.sections[0].body
    assert "line one ⏎ line two" in body and "[... 418 more characters]" in body
    assert "40 older messages not read (thread.max_messages)" in found.note.detail


@pytest.fixture
def builder(tiny_model):
    from inference.tokenization import HFChatTokenizer

    return PromptBuilder(
        HFChatTokenizer(str(tiny_model)),
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=2048,
        context_share=0.3,
        history_share=0.2,
    )


def test_the_thread_is_fenced_after_the_stored_turns_so_the_cached_prefix_is_unchanged(builder):
    found = thread_context(incident(), answering="m6", stored=STORED)
    bundle = ContextBundle(sections=found.sections, notes=[found.note], elapsed_ms=0)
    question = "given what Dana found, is the DB the cause?"
    with_thread = builder.build(
        scenario="root_cause", question=question, asker="bob", history=STORED, context=bundle, max_tokens=128
    )
    without = builder.build(
        scenario="root_cause", question=question, asker="bob", history=STORED, max_tokens=128
    )
    # Everything before the last user turn (system prompt + stored turns) is the same tokens.
    prefix = builder.tokenizer.render(with_thread.messages[:-1], add_generation_prompt=False)
    assert with_thread.token_ids[: len(prefix)] == without.token_ids[: len(prefix)] == prefix
    turn = with_thread.messages[-1].content
    assert "What people wrote in this chat thread, with author and time (untrusted chat text):" in turn
    start = turn.index('label="chat thread: Messages since opsbot')
    assert "dana: I rolled back payments-api at 14:02" in turn[start : turn.index("<<<END DATA", start)]


def test_a_thread_longer_than_the_budget_keeps_the_newest_and_notes_what_was_left_out(builder):
    posts = [
        post(i, "U1", f"step {i}: checked replica lag, still at {i * 10} seconds", name="alice")
        for i in range(300)
    ]
    found = thread_context(ThreadRead(posts), answering=None, stored=[])
    bundle = ContextBundle(sections=found.sections, notes=[found.note], elapsed_ms=0)
    plan = builder.build(scenario="chat", question="what now?", asker="bob", context=bundle, max_tokens=128)
    assert len(plan.token_ids) <= 2048 - 128
    (kept,) = plan.sections
    assert kept.body.splitlines()[-1].endswith("step 299: checked replica lag, still at 2990 seconds")
    (note,) = plan.left_out
    dropped = int(note.split()[0])
    assert note == f"{dropped} older thread messages" and 0 < dropped < 300


def test_a_catch_up_gets_the_stored_turns_budget_for_the_thread(builder):
    posts = [
        post(i, "U1", f"note {i} about the failover of the primary database", name="alice")
        for i in range(300)
    ]
    found = thread_context(ThreadRead(posts), answering=None, whole=True)
    bundle = ContextBundle(sections=found.sections, notes=[found.note], elapsed_ms=0)
    chat = builder.build(
        scenario="chat", question="summary", asker="bob", history=STORED, context=bundle, max_tokens=128
    )
    summary = builder.build(
        scenario="thread_summary",
        question="summary",
        asker="bob",
        history=STORED,
        context=bundle,
        max_tokens=128,
    )
    assert len(summary.messages) == 2  # system + one user turn: no stored turns
    assert len(summary.sections[0].body.splitlines()) > len(chat.sections[0].body.splitlines())


def test_opsbots_own_placeholder_and_answers_still_being_written_are_not_thread_content():
    read = incident()
    read.posts.append(post(7, "UBOT", "_thinking…_", from_self=True))
    read.posts.append(post(8, "UBOT", "half an answer to someone else", from_self=True))
    mention = thread_context(read, answering="m6", stored=[])
    text = "\n".join(s.body for s in mention.sections)
    assert "_thinking" not in text and "half an answer" not in text
    assert "opsbot: Most likely the database connection pool" in text
    command = thread_context(read, answering=None, whole=True, exclude={"m7"})
    text = "\n".join(s.body for s in command.sections)
    assert "_thinking" not in text and "half an answer" in text
