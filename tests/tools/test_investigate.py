"""The investigation loop on the real llama.cpp engine (SmolLM2-135M shipped from PyPI) against the
eval's in-process Kubernetes and Prometheus APIs: every decision is a well-formed call of an offered
tool (grammar-constrained), every step's prompt extends the last (a prefix-cache hit), the budgets
end it, and a planted instruction in a log line changes neither the tools nor the scope."""

from __future__ import annotations

import pytest
from fakes.shop_cluster import PLANTED, SHOP_TOOLS

from bot.config import InvestigateSettings, LaneBudget
from bot.context.gatherer import ContextGatherer
from bot.context.scope import ChannelRef
from bot.investigate import ANSWER_TURN, Investigator
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
from bot.tools.registry import ToolRegistry
from bot.types import StepUpdate
from inference.engine import ChatMessage, Lane, SamplingSettings
from inference.llamacpp_engine import LlamaCppEngine

pytestmark = pytest.mark.timeout(600)

WINDOW = 8192


def investigator(gatherer: ContextGatherer, steps: int, wall_s: float = 300.0) -> Investigator:
    budget = LaneBudget(max_steps=steps, max_tool_tokens=1200, wall_s=wall_s)
    settings = InvestigateSettings(enabled=True, lanes={Lane.NORMAL: budget}, max_output_tokens=200)
    return Investigator(ToolRegistry(gatherer), settings)


async def test_every_step_is_a_well_formed_call_and_its_prompt_extends_the_last(
    engine: LlamaCppEngine, gatherer: ContextGatherer
) -> None:
    question = "why does api-7f9c8d6b5-x2x9q in shop keep restarting?"
    bundle = await gatherer.gather(question, scenario="root_cause", channel=ChannelRef("slack", "C-SHOP"))
    loop = investigator(gatherer, steps=3)
    prompts = PromptBuilder(
        engine.tokenizer,
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=WINDOW,
        context_share=0.45,
        history_share=0.2,
    )
    plan = prompts.build(
        scenario="root_cause",
        question=question,
        asker="sre",
        context=bundle,
        max_tokens=256,
    )
    shown: list[StepUpdate] = []

    async def show(update: StepUpdate) -> None:
        shown.append(update)

    found = await loop.run(
        engine=engine,
        tokenizer=engine.tokenizer,
        request_id="inv-1",
        scenario="root_cause",
        lane=Lane.NORMAL,
        sampling=SamplingSettings(max_tokens=256, seed=7),
        messages=plan.messages,
        window=WINDOW,
        bundle=bundle,
        on_step=show,
    )
    assert found is not None
    assert found.calls, found.stop
    assert all(step.status != "unparsed" for step in found.calls), [s.summary for s in found.calls]
    assert found.stop in ("answer", "steps", "repeated"), found.stop
    # Append-only: each step's cached prompt tokens cover at least 90 % of the previous prompt.
    for before, after in zip(found.calls, found.calls[1:], strict=False):
        assert after.cached_tokens >= 0.9 * before.prompt_tokens, (before, after)
    # The tool catalogue closes the system prompt (one prefix for every investigation with these
    # tools: the cache keeps it); step 0's user turn is the pipeline's, as without the loop.
    assert found.messages[0].role == "system" and "read-only tools" in found.messages[0].content
    assert found.messages[1:2] == plan.messages[1:2]
    # The last turn asks for the answer without tools; the steps were shown pending, then ended.
    assert found.messages[-1].content == ANSWER_TURN
    ran = [s for s in found.calls if s.status not in ("final",)]
    assert [u.state for u in shown if u.state == "pending"] == ["pending"] * len(ran)
    # The tools offered and the scope are what configuration and the channel gave: the planted
    # instruction in the api's log (if a step read it) added no tool and opened no namespace.
    assert found.tools == SHOP_TOOLS
    for step in found.calls:
        if step.arguments and '"data"' in step.arguments:
            assert step.status == "error"
    transcript = "\n".join(m.content for m in found.messages)
    if PLANTED in transcript:  # it came in a tool output: fenced as data
        assert transcript.index("<<<DATA") < transcript.index(PLANTED)


async def test_a_spent_wall_clock_ends_the_calls_and_still_asks_for_the_answer(
    engine: LlamaCppEngine, gatherer: ContextGatherer
) -> None:
    bundle = await gatherer.gather(
        "api in shop?", scenario="root_cause", channel=ChannelRef("slack", "C-SHOP")
    )
    loop = investigator(gatherer, steps=4, wall_s=0.001)
    found = await loop.run(
        engine=engine,
        tokenizer=engine.tokenizer,
        request_id="inv-2",
        scenario="root_cause",
        lane=Lane.NORMAL,
        sampling=SamplingSettings(max_tokens=64),
        messages=[ChatMessage("system", "You are opsbot."), ChatMessage("user", "api in shop?")],
        window=WINDOW,
        bundle=bundle,
    )
    assert found is not None
    assert found.stop == "wall" and not found.calls
    assert found.messages[-1].content == ANSWER_TURN


def test_the_loop_is_off_per_scenario_and_the_urgent_lane_budget_is_small_by_default() -> None:
    settings = InvestigateSettings(enabled=True, scenarios=["root_cause"])
    assert settings.budget("postmortem", Lane.NORMAL) is None
    assert settings.budget("chat", Lane.NORMAL) is None
    urgent, normal = settings.budget("root_cause", Lane.URGENT), settings.budget("root_cause", Lane.NORMAL)
    assert urgent is not None and normal is not None
    assert urgent.max_steps < normal.max_steps and urgent.wall_s < normal.wall_s
    assert InvestigateSettings().budget("root_cause", Lane.NORMAL) is None  # off unless enabled
