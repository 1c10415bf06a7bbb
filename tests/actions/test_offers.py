"""Fixes offered after an answer, end to end on the real wire: fake Slack, the real pipeline and
store, the ``openai`` engine against the fake vLLM server (its tool parser calls ``propose_action``,
its answer ends with a ``kubectl`` command), the fake Kubernetes API with the write identity.

The model proposes; opsbot offers cards (dry run only); nothing is applied until a person clicks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fakes.actions_world import NS, actions_settings, applied, cluster, service
from fakes.mattermost_server import FakeMattermost
from fakes.openai_server import FakeOpenAIServer
from fakes.slack_harness import answers, slack_settings
from fakes.slack_server import FakeMessage, FakeSlack

from bot.actions.service import ActionService
from bot.adapters.mattermost import MattermostAdapter
from bot.adapters.slack import SlackAdapter
from bot.app import submit_to
from bot.config import (
    ChannelScopeSettings,
    InvestigateSettings,
    KubernetesSettings,
    LaneBudget,
    MattermostSettings,
    ScopeSettings,
    Settings,
    StoreSettings,
)
from bot.context.gatherer import ContextGatherer
from bot.eval.kube_api import KubernetesSnapshotServer
from bot.investigate import Investigator
from bot.pipeline import Pipeline
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder
from bot.store import Store
from bot.tools.registry import ToolRegistry
from inference.config import EngineConfig
from inference.engine import ChatMessage, Lane
from inference.openai_engine import OpenAIEngine
from inference.scenarios import ScenarioRegistry

pytestmark = pytest.mark.timeout(120)

MODEL = "tiny-chat"
APPROVER = "U0APPROVER"
ANSWER = (
    "The api Deployment's revision 2 (app:2.0) fails its readiness probe [1].\n\n"
    "Roll it back: `kubectl rollout undo deployment/api -n shop`, then watch it with "
    "`kubectl rollout status deployment/api -n shop`. "
    "Do not `kubectl rollout restart deployment/web -n shop`."
)
RESTART = {
    "action": "rollout_restart",
    "params": {"kind": "deployment", "namespace": NS, "name": "api"},
    "why": "pods of revision 2 never became ready <!channel>",
    "steps": [0, 1],
}


@pytest.fixture
async def kube() -> AsyncIterator[KubernetesSnapshotServer]:
    async with cluster() as srv:
        yield srv


@pytest.fixture
def model_server(tiny_model: Path) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(tiny_model, served_model_name=MODEL, max_model_len=4096, answer=ANSWER) as srv:
        yield srv


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'opsbot.db'}", StoreSettings())
    yield opened
    await opened.close(flush_timeout_s=5)


@dataclass
class World:
    """A pipeline with actions on (and the loop, if asked), before any adapter is attached."""

    chat: Pipeline
    service: ActionService
    engine: OpenAIEngine
    gatherer: ContextGatherer

    async def close(self) -> None:
        await self.gatherer.close()
        await self.service.close()
        await self.engine.shutdown(drain_timeout_s=5)


async def world(
    kube: KubernetesSnapshotServer,
    model_server: FakeOpenAIServer,
    store: Store,
    tmp: Path,
    channel: str,
    *,
    policies: list[dict[str, Any]],
    loop: bool,
    **actions: Any,
) -> World:
    """The pipeline of these tests: ``channel`` reads namespace shop of the actions cluster."""
    settings = Settings(
        kubernetes=KubernetesSettings(
            enabled=True, kubeconfig=kube.write_kubeconfig(tmp / "kubeconfig", context="c"), namespaces=[NS]
        ),
        scope=ScopeSettings(channels=[ChannelScopeSettings(match=[channel], namespaces=[NS])]),
    )
    engine = OpenAIEngine(
        EngineConfig(
            backend="openai",
            base_url=model_server.url,
            model=MODEL,
            max_model_len=4096,
            server_prompt="messages",
        )
    )
    await engine.start([ChatMessage("system", DEFAULT_SYSTEM_PROMPT)])
    gatherer = ContextGatherer.from_settings(settings)
    investigate = InvestigateSettings(
        enabled=True, lanes={Lane.NORMAL: LaneBudget(max_steps=1, max_tool_tokens=400, wall_s=60)}
    )
    svc = service(actions_settings(kube, tmp, policies=policies, **actions), store, {})
    chat = Pipeline(
        engine=engine,
        store=store,
        prompts=PromptBuilder(
            engine.tokenizer,
            system_prompt=DEFAULT_SYSTEM_PROMPT,
            max_model_len=4096,
            context_share=0.3,
            history_share=0.1,
        ),
        scenarios=ScenarioRegistry({"root_cause": {"max_tokens": 64}, "chat": {"max_tokens": 64}}),
        context=gatherer,
        investigator=Investigator(ToolRegistry(gatherer), investigate) if loop else None,
        actions=svc,
    )
    return World(chat, svc, engine, gatherer)


async def ask(
    slack: FakeSlack,
    kube: KubernetesSnapshotServer,
    model_server: FakeOpenAIServer,
    store: Store,
    tmp: Path,
    *,
    policies: list[dict[str, Any]],
    loop: bool,
    **actions: Any,
) -> tuple[FakeMessage, ActionService]:
    """One mention in C1 on Slack answered by a pipeline with actions on; the answer and the service."""
    made = await world(kube, model_server, store, tmp, "C1", policies=policies, loop=loop, **actions)
    adapter = SlackAdapter(slack_settings(slack), store)
    made.service.attach({"slack": adapter})
    adapter.actions = made.service
    await adapter.start(submit_to(made.chat, adapter))
    try:
        event = slack.user_message(
            "C1", "U0ASKER", f"<@{slack.bot_user_id}> why is deployment api in shop failing?"
        )
        for e in slack.mention_events(event):
            await slack.deliver_event(e)
        await slack.wait_for(
            lambda: len(answers(slack, "C1")) == 1 and made.chat.in_flight == 0, timeout_s=60
        )
        await made.chat.drain(10)
    finally:
        await adapter.stop()
        await adapter.close()
        await made.close()
    (answer,) = answers(slack, "C1")
    return answer, made.service


def cards(slack: FakeSlack) -> list[str]:
    """The text of every proposal card in C1, oldest first."""
    return [
        b["text"]["text"]
        for m in slack.bot_messages("C1")
        for b in (m.blocks or [])[:1]
        if b["type"] == "section" and b["text"]["text"].startswith("*Proposed action:*")
    ]


async def test_the_models_proposal_and_the_answers_command_become_cards_and_nothing_is_applied(
    kube: KubernetesSnapshotServer, model_server: FakeOpenAIServer, store: Store, tmp_path: Path
) -> None:
    model_server.tool_call = ("propose_action", json.dumps(RESTART))
    async with FakeSlack() as slack:
        answer, svc = await ask(
            slack,
            kube,
            model_server,
            store,
            tmp_path,
            policies=[{"match": ["C1"], "approvers": [APPROVER]}],
            loop=True,
        )
        shown = cards(slack)
        card_threads = {
            m.thread_ts for m in slack.bot_messages("C1") if m.blocks and "Proposed action" in str(m.blocks)
        }
    # the tool was offered with its closed per-kind schema
    offered = [r for r in model_server.log if isinstance(r.body, dict) and r.body.get("tools")]
    assert offered and "propose_action" in [t["function"]["name"] for t in offered[0].body["tools"]]
    assert len(shown) == 2, shown
    first, second = shown
    # 1. the investigation's proposal: the model's line (its mention defused) and the step it cites
    assert first.startswith("*Proposed action:* Rollout restart deployment/api -n shop")
    assert "opsbot's investigation: pods of revision 2 never became ready <\u200b!channel>" in first
    assert "[0] the context gathered before the first step" in first
    assert "[1]" not in first  # step 1 is the proposal itself: no evidence
    # 2. the answer's first command that is a catalog action on a target the evidence names
    assert second.startswith("*Proposed action:* Roll back deployment/api -n shop to the previous revision")
    assert "suggested in opsbot's answer: `kubectl rollout undo deployment/api -n shop`" in second
    # `rollout status` is no action; deployment/web is named nowhere in the evidence: no card
    assert all("web" not in c for c in shown)
    assert card_threads == {answer.thread_ts or answer.ts}  # in the answer's thread
    # dry runs only: nothing applied without a person's click; both proposals audited
    assert applied(kube) == []
    assert any(w.dry_run for w in kube.writes)
    records = await svc.audit.proposals(since=None, limit=10)
    assert sorted(r.proposed_by for r in records) == ["answer", "investigation"]
    assert all(r.state == "proposed" for r in records)


async def test_where_nobody_may_approve_no_tool_is_offered_and_no_card_is_made(
    kube: KubernetesSnapshotServer, model_server: FakeOpenAIServer, store: Store, tmp_path: Path
) -> None:
    async with FakeSlack() as slack:
        await ask(slack, kube, model_server, store, tmp_path, policies=[], loop=True)
        assert cards(slack) == []
    for received in model_server.log:
        assert "propose_action" not in json.dumps(received.body)
    assert kube.writes == []


async def test_commands_are_not_offered_when_turned_off_and_at_most_max_offers_cards(
    kube: KubernetesSnapshotServer, model_server: FakeOpenAIServer, store: Store, tmp_path: Path
) -> None:
    policy = [{"match": ["C1"], "approvers": ["asker"]}]
    async with FakeSlack() as slack:
        await ask(
            slack, kube, model_server, store, tmp_path, policies=policy, loop=False, offer_from_answers=False
        )
        assert cards(slack) == []
    model_server.tool_call = ("propose_action", json.dumps(RESTART))
    async with FakeSlack() as slack:
        await ask(slack, kube, model_server, store, tmp_path, policies=policy, loop=True, max_offers=1)
        (only,) = cards(slack)
        assert only.startswith(
            "*Proposed action:* Rollout restart deployment/api -n shop"
        )  # the model's first


async def test_on_mattermost_the_answers_command_is_a_card_in_its_thread_for_a_channel_matched_by_name(
    kube: KubernetesSnapshotServer, model_server: FakeOpenAIServer, store: Store, tmp_path: Path
) -> None:
    async with FakeMattermost() as mm:
        alice, approver = mm.add_user("alice"), mm.add_user("approver")
        channel = mm.add_channel("incidents", [alice, approver, mm.bot_user_id])
        policy = {"match": ["#incidents"], "platform": "mattermost", "approvers": [approver]}
        made = await world(kube, model_server, store, tmp_path, channel, policies=[policy], loop=False)
        settings = MattermostSettings(
            enabled=True, public_url="http://opsbot.example", **mm.settings_kwargs()
        )
        adapter = MattermostAdapter(settings, store)
        made.service.attach({"mattermost": adapter})
        adapter.actions = made.service
        await adapter.start(submit_to(made.chat, adapter))
        try:
            post = await mm.user_posts(alice, channel, "@opsbot why is deployment api in shop failing?")
            cards = lambda: [  # noqa: E731
                a["text"]
                for p in mm.bot_posts(channel)
                for a in p.get("props", {}).get("attachments", [])
                if "Proposed action:" in a.get("text", "")
            ]
            await mm.wait_for(lambda: made.chat.in_flight == 0 and bool(cards()), timeout=60)
            await made.chat.drain(10)
            card_posts = [p for p in mm.bot_posts(channel) if p.get("props", {}).get("attachments")]
        finally:
            await adapter.stop()
            await adapter.close()
            await made.close()
    (card,) = cards()
    assert card.startswith("*Proposed action:* Roll back deployment/api -n shop to the previous revision")
    assert "suggested in opsbot's answer: `kubectl rollout undo deployment/api -n shop`" in card
    assert {p["root_id"] for p in card_posts} == {post["id"]}  # in the question's thread
    buttons = card_posts[0]["props"]["attachments"][0]["actions"]
    assert [b["name"] for b in buttons] == ["Approve", "Reject"]
    assert applied(kube) == []
