"""Clean answers: fence markers are stop sequences on every request, and whatever markup still gets
through is removed from what is shown, stored and replayed; an answer that only repeats its prompt
is told apart from one of its own.

The pipeline tests run the whole flow on the ``openai`` backend against the fake vLLM server, whose
"model" is told to answer with fence markup (as SmolLM2 does): the server honours ``stop`` as vLLM
does, so the request's stop list is what keeps the marker out.
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fakes.openai_server import FakeOpenAIServer, Fault

from bot.adapters.console import ConsoleAdapter
from bot.answer_clean import (
    ASK_AGAIN,
    ECHO,
    EMPTY,
    STOP_SEQUENCES,
    EchoGuard,
    ask_again,
    clean_answer,
    clean_partial,
    copied_phrases,
    echo_verdict,
    with_fence_stops,
    without_echo,
)
from bot.app import submit_to
from bot.config import Settings, StoreSettings
from bot.engine_factory import build_engine
from bot.pipeline import Pipeline
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder, fence
from bot.store import Store
from inference.engine import ChatMessage, SamplingSettings, WrappedEngine
from inference.scenarios import ScenarioRegistry

MODEL = "tiny-chat"
ECHOING = (
    "checkout-api is OOMKilled: exit code 137 at its 512Mi limit.\n"
    '<<<END DATA id=4f2a9c1e>>>>>\n<<<DATA id=4f2a9c1e label="chat message">>>\nwhy?'
)
"""What SmolLM2 answered in the issue: a real start, then the prompt's fence markup copied."""
MISSPELT = "checkout-api is OOMKilled.\n<<END DATA id=4f2a9c1e>> exit code 137"
"""Markup no stop string matches (two brackets): the cleaning removes it."""
CLOSING_FIRST = "<<<END DATA id=4f2a9c1e>>\n\nThe pod checkout-api-7d9f4 was OOMKilled (exit code 137)."
"""How SmolLM2 on llama.cpp starts most answers: the closing marker, then the answer itself."""
TASK_FIRST = (
    "Task: find the most likely root cause of the problem below.\n"
    "The pod checkout-api-7d9f4 was OOMKilled (exit code 137)."
)
ONLY_DATA = '<<<DATA id=4f2a9c1e label="Kubernetes: pods">>>\ncheckout-api-7d9f4 Running'
"""An answer that opens a data fence at once: the stop leaves nothing."""


def test_fence_markers_and_their_debris_are_removed_and_the_rest_is_kept() -> None:
    assert clean_answer(ECHOING) == "checkout-api is OOMKilled: exit code 137 at its 512Mi limit.\n\nwhy?"
    assert clean_answer(MISSPELT) == "checkout-api is OOMKilled.\n exit code 137"
    assert clean_answer("<<<END DATA id=4f2a9c1e>>>>>") == ""
    assert clean_answer(fence("chat message", "hello", "abcd1234")) == "hello"
    # Idempotent, and ordinary text (a here-string, a shift operator) is left alone.
    once = clean_answer(ECHOING)
    assert clean_answer(once) == once
    command = 'run `grep -c x <<< "$line"` and `echo $((a << 2))`'
    assert clean_answer(command) == command
    heredoc = "cat <<DATA > /tmp/x\nkey: value\nDATA\ncat <<END\nEND"
    assert clean_answer(heredoc) == heredoc


def test_the_stop_list_gains_the_fence_markers_and_keeps_configured_stops() -> None:
    sampling = with_fence_stops(SamplingSettings(stop=("\n\nUser:",)))
    assert sampling.stop[0] == "\n\nUser:" and set(STOP_SEQUENCES) <= set(sampling.stop)
    assert set(STOP_SEQUENCES) <= set(sampling.bad_words)  # the answer may not open with one either
    assert with_fence_stops(sampling) is sampling  # nothing added twice


def test_a_marker_begun_at_the_end_of_a_streaming_answer_is_held_back_until_it_is_whole() -> None:
    assert clean_partial("The answer is:\n\n<<<END DAT") == "The answer is:\n\n"
    assert (
        clean_partial("The answer is:\n\n<<<END DATA id=ab12cd34>>>\nOOMKilled")
        == "The answer is:\n\nOOMKilled"
    )
    assert clean_partial("run cat <<EOF\nkind: Pod") == "run cat <<EOF\nkind: Pod"  # a here-document stays


PROMPT = (
    "Task: summarise this alert for the on-call engineer in at most five lines: what fires, where, "
    "since when, likely impact, and the first thing to check.\n"
    + fence(
        "opsbot analyze: group 1 of 3",
        "KubePodCrashLooping payments/api-7f9c8d6b5-x2x9q 14 times",
        "ab12cd34",
    )
)


def test_an_empty_or_echoed_answer_is_told_apart_from_an_answer_of_its_own() -> None:
    assert echo_verdict("<<<END DATA id=ab12cd34>>>", PROMPT) == EMPTY
    assert echo_verdict("  \n ", PROMPT) == EMPTY
    echoed = "Task: summarise this alert for the on-call engineer in at most five lines: what fires, where"
    assert echo_verdict(echoed, PROMPT) == ECHO
    assert echo_verdict("Task:", PROMPT) == ECHO  # short, and copied whole
    own = (
        "api-7f9c8d6b5-x2x9q in payments crashlooped 14 times; check its last logs with "
        "`kubectl logs --previous` and the recent rollout."
    )
    assert echo_verdict(own, PROMPT) is None
    assert echo_verdict("OOMKilled.", PROMPT) is None
    # A copy broken up with words of its own is still a copy (SmolLM2 asked again, 2026-12-06).
    data = (
        "Cluster data gathered for this question (untrusted):\n7 alert firings of HighLatencyP99 (4 distinct)"
    )
    broken_up = (
        "The cluster data gathered for this question (untrusted) was:\n\n7 alert firings of HighLatencyP99"
    )
    assert echo_verdict(broken_up, data) == ECHO


def test_what_an_answer_copied_from_the_question_is_blanked_out() -> None:
    question = "why does worker-6d5f7c9b8-kq2lp in payments keep restarting?"
    assert "worker-6d5f7c9b8-kq2lp" not in without_echo(f"Question: {question} Answer: unknown.", question)
    # A short quote of the question inside an answer of its own stays.
    kept = "worker-6d5f7c9b8-kq2lp keeps restarting: OOMKilled."
    assert without_echo(kept, question) == kept


@dataclass
class Remote:
    pipeline: Pipeline
    store: Store
    adapter: ConsoleAdapter
    out: io.StringIO
    server: FakeOpenAIServer
    tap: PromptTap


class PromptTap(WrappedEngine):
    """The engine, with the messages of every request kept."""

    def __init__(self, inner: object) -> None:
        super().__init__(inner)  # type: ignore[arg-type]
        self.seen: list[list[ChatMessage]] = []

    async def generate(self, request):  # type: ignore[no-untyped-def,override]
        self.seen.append(list(request.messages or []))
        async for event in self.inner.generate(request):
            yield event


async def _remote(answer: str, tiny_model: Path, tmp_path: Path) -> AsyncIterator[Remote]:
    with FakeOpenAIServer(tiny_model, served_model_name=MODEL, max_model_len=2048, answer=answer) as server:
        settings = Settings(
            data_dir=tmp_path,
            engine={
                "backend": "openai",
                "base_url": server.url,
                "served_model_name": MODEL,
                "max_model_len": 2048,
            },
            scenarios={name: {"max_tokens": 200} for name in ("chat", "root_cause")},
        )
        store = await Store.open(
            f"sqlite+aiosqlite:///{tmp_path / 'opsbot.db'}", StoreSettings(retry={"initial_s": 0.02})
        )
        engine = build_engine(settings, MODEL)
        await engine.start([ChatMessage("system", DEFAULT_SYSTEM_PROMPT)])
        tap = PromptTap(engine)
        prompts = PromptBuilder(
            engine.tokenizer,
            system_prompt=DEFAULT_SYSTEM_PROMPT,
            max_model_len=2048,
            context_share=0.4,
            history_share=0.2,
        )
        pipeline = Pipeline(
            engine=tap,
            store=store,
            prompts=prompts,
            scenarios=ScenarioRegistry(settings.scenarios),
            model_name=MODEL,
        )
        out = io.StringIO()
        adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=out)
        await adapter.start(submit_to(pipeline, adapter))
        try:
            yield Remote(pipeline, store, adapter, out, server, tap)
        finally:
            await engine.shutdown(5)
            await store.close()


def _answering(answer: str, name: str) -> Any:
    """A fixture ``name``: the bot on the fake vLLM server, whose model answers every request ``answer``."""

    async def remote(tiny_model: Path, tmp_path: Path) -> AsyncIterator[Remote]:
        async for made in _remote(answer, tiny_model, tmp_path):
            yield made

    return pytest.fixture(remote, name=name)


echoing = _answering(ECHOING, "echoing")
closing_first = _answering(CLOSING_FIRST, "closing_first")
task_first = _answering(TASK_FIRST, "task_first")
only_data = _answering(ONLY_DATA, "only_data")
misspelling = _answering(MISSPELT, "misspelling")


async def test_the_fence_marker_is_a_stop_sequence_of_the_request_and_never_shown_or_stored(
    echoing: Remote,
) -> None:
    message = echoing.adapter.to_message("why is checkout-api crashlooping?")
    await echoing.adapter._submit(message)  # type: ignore[misc]
    (received,) = echoing.server.requests_for(message.request_id)
    assert set(STOP_SEQUENCES) <= set(received.body["stop"])
    shown = echoing.out.getvalue()
    assert "checkout-api is OOMKilled: exit code 137 at its 512Mi limit." in shown
    assert "<<<" not in shown and "DATA id=" not in shown
    history = await echoing.store.thread_history("console", "terminal", echoing.adapter.session)
    assert [t.content for t in history if t.role == "assistant"] == [
        "checkout-api is OOMKilled: exit code 137 at its 512Mi limit."
    ]


async def test_markup_no_stop_catches_is_cleaned_and_the_follow_up_never_replays_it(
    misspelling: Remote,
) -> None:
    adapter = misspelling.adapter
    await adapter._submit(adapter.to_message("why is checkout-api crashlooping?"))  # type: ignore[misc]
    # A turn an older opsbot stored with the markup in it, then a follow-up in the same thread.
    await misspelling.store.append_message(
        "console", "terminal", adapter.session, "assistant", "old answer <<<END DATA id=0badf00d>>>>>"
    )
    await adapter._submit(adapter.to_message("and what now?"))  # type: ignore[misc]
    shown = misspelling.out.getvalue()
    assert "<<" not in shown and "id=4f2a9c1e" not in shown and "exit code 137" in shown
    follow_up = misspelling.tap.seen[-1]
    replayed = [m.content for m in follow_up if m.role == "assistant"]
    assert replayed == ["checkout-api is OOMKilled.\n exit code 137", "old answer"]


async def test_an_answer_after_a_leading_closing_marker_is_kept_without_the_marker(
    closing_first: Remote,
) -> None:
    await closing_first.adapter._submit(closing_first.adapter.to_message("why is checkout-api down?"))  # type: ignore[misc]
    shown = closing_first.out.getvalue()
    assert "The pod checkout-api-7d9f4 was OOMKilled (exit code 137)." in shown and "<<<" not in shown


async def test_an_answer_with_nothing_left_says_so_and_stores_no_turn(only_data: Remote) -> None:
    await only_data.adapter._submit(only_data.adapter.to_message("why is checkout-api down?"))  # type: ignore[misc]
    shown = only_data.out.getvalue()
    assert "tiny-chat gave no answer: it only copied its prompt back (markup or instructions)" in shown
    assert "<<<" not in shown and "Running" not in shown
    history = await only_data.store.thread_history("console", "terminal", only_data.adapter.session)
    assert [t.role for t in history] == ["user"]


def test_an_opening_copy_of_the_last_user_turn_is_dropped_and_held_back_while_streaming() -> None:
    from bot.investigate import ANSWER_TURN

    copied = (
        "No more tool calls. Now write the answer to the message above from the data:\n"
        "The pod was OOMKilled [1]."
    )
    assert clean_answer(copied, ANSWER_TURN) == "The pod was OOMKilled [1]."
    # while streaming, an opening that so far only repeats the turn shows nothing yet
    assert [clean_partial(copied[:n], ANSWER_TURN) for n in (8, 19, 40)] == ["", "", ""]
    assert clean_partial("No, nothing restarted", ANSWER_TURN) == "No, nothing restarted"
    # five words in common are a coincidence, not an echo; without a task nothing is dropped
    assert clean_answer("No more tool calls. Now the pod is fine.", ANSWER_TURN).startswith("No more tool")
    assert clean_answer(copied).startswith("No more tool calls.")


async def test_an_answer_opening_with_its_task_line_is_shown_and_stored_without_it(
    task_first: Remote,
) -> None:
    await task_first.adapter._submit(task_first.adapter.to_message("why is checkout-api down?"))  # type: ignore[misc]
    shown = task_first.out.getvalue()
    assert "The pod checkout-api-7d9f4 was OOMKilled (exit code 137)." in shown
    assert "Task: find the most likely" not in shown
    history = await task_first.store.thread_history("console", "terminal", task_first.adapter.session)
    assert [t.content for t in history if t.role == "assistant"] == [
        "The pod checkout-api-7d9f4 was OOMKilled (exit code 137)."
    ]


RECORDS_PROMPT = (
    "Task: summarise this alert group.\n"
    "Records (3 of 3, oldest first):\n"
    "- 13:23:31 [firing] pod=orders-worker-5d8f7-x2k9q: container orders-worker was OOMKilled\n"
    "- 13:25:02 [firing] pod=orders-worker-5d8f7-p7w4n: container orders-worker was OOMKilled\n"
    "- 13:31:47 [resolved] pod=orders-worker-5d8f7-x2k9q: container orders-worker was OOMKilled"
)
RECORDS_ECHO = (
    "- 13:23:31 [firing] pod=orders-worker-5d8f7-x2k9q: container orders-worker was OOMKilled\n"
    "- 13:25:02 [firing] pod=orders-worker-5d8f7-p7w4n: container orders-worker was OOMKilled"
)
"""How SmolLM2 echoed the largest analyze groups: their records, line for line."""


def test_the_phrases_an_echo_copied_are_named_line_by_line_and_an_own_answer_names_none() -> None:
    assert copied_phrases(RECORDS_ECHO, RECORDS_PROMPT) == (
        "13:23:31 [firing] pod=orders-worker-5d8f7-x2k9q:",
        "13:25:02 [firing] pod=orders-worker-5d8f7-p7w4n:",
    )
    own = "Two orders-worker pods were OOMKilled between 13:23 and 13:31; raise the memory limit."
    assert copied_phrases(own, RECORDS_PROMPT) == ()
    # A copy inside an answer of its own is named from where the copy begins.
    mixed = "First check memory. " + RECORDS_ECHO.splitlines()[0] + " That is the cause."
    assert copied_phrases(mixed, RECORDS_PROMPT) == ("13:23:31 [firing] pod=orders-worker-5d8f7-x2k9q:",)


def test_asking_again_changes_the_seed_and_adds_what_was_copied_to_the_bad_words() -> None:
    sampling = SamplingSettings(seed=7, bad_words=("<<<DATA",))
    again = ask_again(sampling, RECORDS_ECHO, RECORDS_PROMPT, 1)
    assert again.seed == 8 and again.bad_words[0] == "<<<DATA" and len(again.bad_words) == 3
    assert ask_again(again, RECORDS_ECHO, RECORDS_PROMPT, 2).bad_words == again.bad_words  # no repeats
    assert ask_again(SamplingSettings(), "", RECORDS_PROMPT, 1) == SamplingSettings()  # unseeded, empty


def test_a_streaming_answer_is_held_back_while_it_only_copies_its_prompt() -> None:
    guard = EchoGuard(RECORDS_PROMPT)
    lines = RECORDS_ECHO.splitlines()
    assert guard.holds("") and guard.holds("- 13:23:31 ") and guard.holds(lines[0])
    assert guard.holds("- 13:23:31 [fir")  # a word still growing is not judged yet
    assert guard.holds(RECORDS_ECHO)  # a copy to its end stays held
    own = EchoGuard(RECORDS_PROMPT)
    assert own.holds("- 13:23:31 [firing]")
    assert not own.holds("- 13:23:31 [firing] is when two orders-worker pods began to run out of memory ")
    assert not own.holds(RECORDS_ECHO)  # let go for good: what was shown is not taken back
    assert not EchoGuard("").holds("anything")


QUESTION = "why is checkout-api crashlooping since the deploy at 10:40?"
OWN_ANSWER = "checkout-api is OOMKilled: exit code 137 at its 512Mi limit since the 10:40 deploy."


SYSTEM_ECHO = (
    "You are opsbot, an incident assistant for site reliability engineers, answering in a chat thread"
)
"""A first draw that copies the system prompt (what SmolLM2 does with its records, data or task)."""


question_echo = _answering(QUESTION, "question_echo")
system_echo = _answering(SYSTEM_ECHO, "system_echo")


async def test_an_answer_that_only_copies_the_question_is_asked_again_without_the_copy(
    question_echo: Remote,
) -> None:
    """The model's first draw is the question itself; the second draw is asked with another request
    id and the copied phrase as a bad word (``vllm serve`` reads ``bad_words``), and its answer is
    the one shown and stored."""
    adapter = question_echo.adapter
    message = adapter.to_message(QUESTION)
    question_echo.server.fault(f"{message.request_id}-again1", Fault(answer=OWN_ANSWER))
    await adapter._submit(message)  # type: ignore[misc]
    (first,) = question_echo.server.requests_for(message.request_id)
    (again,) = question_echo.server.requests_for(f"{message.request_id}-again1")
    assert "why is checkout-api crashlooping" not in " ".join(first.body.get("bad_words", []))
    assert "why is checkout-api crashlooping" in again.body["bad_words"]
    assert set(STOP_SEQUENCES) <= set(again.body["bad_words"])
    assert OWN_ANSWER in question_echo.out.getvalue()
    history = await question_echo.store.thread_history("console", "terminal", adapter.session)
    assert [t.content for t in history if t.role == "assistant"] == [OWN_ANSWER]
    # The row: the first draw's first token (when words first reached the asker), both draws' tokens.
    rows = await question_echo.store.requests_between(datetime.now(UTC) - timedelta(minutes=5))
    (row,) = [r for r in rows if r.request_id == message.request_id]
    assert row.status == "ok" and row.output_tokens == first.tokens_sent + again.tokens_sent


async def test_an_answer_that_keeps_copying_is_a_failed_answer_once_asked_again_as_often_as_allowed(
    question_echo: Remote,
) -> None:
    adapter = question_echo.adapter
    message = adapter.to_message(QUESTION)
    await adapter._submit(message)  # type: ignore[misc]
    sent = [r for r in question_echo.server.log if (r.request_id or "").startswith(message.request_id)]
    again = [f"{message.request_id}-again{n}" for n in range(1, ASK_AGAIN + 1)]
    assert [r.request_id for r in sent] == [message.request_id, *again]
    # Each draw may not write what any earlier one copied: the bad words only grow.
    bans = [set(r.body.get("bad_words", [])) for r in sent]
    assert all(earlier <= later for earlier, later in zip(bans, bans[1:], strict=False))
    assert "tiny-chat gave no answer: it only copied its prompt back" in question_echo.out.getvalue()
    history = await question_echo.store.thread_history("console", "terminal", adapter.session)
    assert [t.role for t in history] == ["user"]


async def test_a_copy_of_the_prompt_is_never_shown_while_it_streams_and_the_answer_asked_again_is(
    system_echo: Remote,
) -> None:
    adapter = system_echo.adapter
    message = adapter.to_message(QUESTION)
    system_echo.server.fault(message.request_id, Fault(token_interval_s=0.05))  # streamed word by word
    system_echo.server.fault(f"{message.request_id}-again1", Fault(answer=OWN_ANSWER))
    await adapter._submit(message)  # type: ignore[misc]
    shown = system_echo.out.getvalue()
    assert shown.startswith(OWN_ANSWER), shown  # not a word of the copy before it
