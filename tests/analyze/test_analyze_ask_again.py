"""An analyze item whose summary only copies its prompt back is asked again (up to
``bot.answer_clean.ASK_AGAIN`` times), with another seed and the phrases it copied as bad words (the
engines never complete them). The text of the first draw that is a summary is kept; an item that
keeps copying counts as failed, as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from bot.analyze.records import Group
from bot.analyze.runner import EngineExecutor
from bot.analyze.work import WorkItem
from bot.answer_clean import ASK_AGAIN
from inference.engine import GenerationEvent, GenerationRequest, GenerationResult, SamplingSettings

PROMPT = (
    "Alerts of one group (untrusted data):\n10:40:22 [firing] pod=payments-api-7d9f severity=critical "
    "HighErrorRate 5xx ratio 12 % for 10 minutes on payments-api\nTask: summarise the group."
)
ECHO = "10:40:22 [firing] pod=payments-api-7d9f severity=critical HighErrorRate 5xx ratio 12 % for 10 minutes"
SUMMARY = "payments-api returns 5xx on 12 % of requests since 10:40; check its recent deploy."


class ScriptedEngine:
    """Answers each request with the next text of ``texts`` (the last one again when they run out)."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)
        self.requests: list[GenerationRequest] = []

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        self.requests.append(request)
        text = self.texts[min(len(self.requests), len(self.texts)) - 1]
        yield GenerationResult(request.request_id, text, "stop", 40, 0, 20, 0.0, 5.0, 1.0, 30.0)


def run(engine: ScriptedEngine) -> list[tuple[str, str]]:
    item = WorkItem(
        id="g1",
        group=Group("k1", "alert", "HighErrorRate", {}),
        scenario="alert_summary",
        token_ids=[1, 2, 3],
        prompt=PROMPT,
        task="Task: summarise the group.",
    )
    kept: list[tuple[str, str]] = []

    async def done(item: WorkItem, result: GenerationResult | None, error: str | None, status: str) -> None:
        kept.append((status, result.text if result else ""))

    executor = EngineExecutor(engine, 1, lambda item: f"batch-{item.id}")  # type: ignore[arg-type]
    asyncio.run(executor.run([item], SamplingSettings(max_tokens=32, seed=7), done, asyncio.Event()))
    return kept


def test_an_echoed_summary_is_asked_again_without_what_it_copied_and_the_new_text_kept() -> None:
    engine = ScriptedEngine(ECHO, SUMMARY)
    assert run(engine) == [("ok", SUMMARY)]
    first, again = engine.requests
    assert again.request_id == "batch-g1-again1" != first.request_id
    assert (first.sampling.seed, again.sampling.seed) == (7, 8)
    assert first.sampling.bad_words == ()
    assert again.sampling.bad_words == ("10:40:22 [firing] pod=payments-api-7d9f",)


def test_an_item_that_keeps_copying_is_kept_as_it_is_once_asked_again_as_often_as_allowed() -> None:
    engine = ScriptedEngine(ECHO)
    assert run(engine) == [("ok", ECHO)]  # the runner's verdict (echo_verdict) marks it failed
    assert len(engine.requests) == 1 + ASK_AGAIN


def test_a_summary_of_its_own_is_asked_once() -> None:
    engine = ScriptedEngine(SUMMARY, ECHO)
    assert run(engine) == [("ok", SUMMARY)]
    assert len(engine.requests) == 1
