"""Approval-gated actions on Mattermost, through the real wire: ``/rca propose`` as a slash command,
the card as an attachment with interactive actions, clicks forwarded by the (fake) Mattermost
server to ``/mattermost/actions`` with the clicker's ``user_id``; changes land on the fake
Kubernetes API through opsbot's own write credentials."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from fakes.actions_world import NS, actions_settings, applied, cluster, service
from fakes.click_fuzz import attempts
from fakes.mattermost_server import FakeMattermost
from mm_helpers import SLASH_TOKEN, Bot, BotFactory

from bot.actions.catalog import ActionSpec
from bot.actions.service import ActionService, ThreadRef
from bot.eval.kube_api import KubernetesSnapshotServer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def kube() -> AsyncIterator[KubernetesSnapshotServer]:
    async with cluster() as srv:
        yield srv


@pytest.fixture
async def world(
    fake: FakeMattermost, start_bot: BotFactory, kube: KubernetesSnapshotServer, tmp_path: Path
) -> AsyncIterator[tuple[Bot, ActionService, dict[str, str]]]:
    people = {name: fake.add_user(name) for name in ("asker", "approver", "stranger")}
    channel = fake.add_channel("incidents", [*people.values(), fake.bot_user_id])
    other = fake.add_channel("elsewhere", [*people.values(), fake.bot_user_id])
    bot = await start_bot()
    policy = {"match": ["#incidents"], "platform": "mattermost", "approvers": ["@oncall"]}
    settings = actions_settings(kube, tmp_path, policies=[policy], groups={"oncall": [people["approver"]]})
    svc = service(settings, bot.adapter.store, {"mattermost": bot.adapter})
    bot.adapter.actions = svc
    bot.pipeline.actions = svc
    try:
        yield bot, svc, {**people, "channel": channel, "other": other}
    finally:
        await svc.close()


def _cards(fake: FakeMattermost, channel: str) -> list[dict[str, Any]]:
    return [
        p
        for p in fake.bot_posts(channel)
        if any("Proposed action:" in a.get("text", "") for a in p.get("props", {}).get("attachments", []))
    ]


def _values(card: dict[str, Any]) -> dict[str, str]:
    actions = card["props"]["attachments"][0].get("actions", [])
    return {a["name"]: a["integration"]["context"]["value"] for a in actions}


async def _post_action(
    bot: Bot, fake: FakeMattermost, card: dict[str, Any], user: str, channel: str, context: Any
) -> tuple[int, Any]:
    """What the Mattermost server POSTs for a click, sent with any context (a forger's request)."""
    body = {
        "user_id": user,
        "user_name": "x",
        "channel_id": channel,
        "team_id": fake.team_id,
        "post_id": card["id"],
        "trigger_id": "t",
        "type": "",
        "data_source": "",
        "context": context,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(bot.url + "/mattermost/actions", json=body) as resp,
    ):
        return resp.status, await resp.json(content_type=None)


async def test_a_slash_command_proposal_is_approved_by_the_oncall_group_only(
    fake: FakeMattermost, world: tuple[Bot, ActionService, dict[str, str]], kube: KubernetesSnapshotServer
) -> None:
    bot, svc, ids = world
    status, _, _ = await fake.send_slash_command(
        bot.command_url,
        token=SLASH_TOKEN,
        user_id=ids["asker"],
        channel_id=ids["channel"],
        text="propose rollback deployment/api -n shop",
    )
    assert status == 200
    await fake.wait_for(lambda: len(_cards(fake, ids["channel"])) == 1)
    card = _cards(fake, ids["channel"])[0]
    text = card["props"]["attachments"][0]["text"]
    assert "Roll back deployment/api -n shop to the previous revision" in text and "app:1.0" in text
    assert applied(kube) == []
    # the asker is not in the policy (only @oncall is): refused
    status, body = await fake.click_button(card["id"], "Approve", ids["asker"])
    assert status == 200 and "may not decide" in body["ephemeral_text"]
    assert applied(kube) == []
    status, body = await fake.click_button(card["id"], "Approve", ids["approver"])
    assert status == 200 and body["ephemeral_text"].startswith("Applied")
    assert kube.deployments[0]["spec"]["template"]["spec"]["containers"][0]["image"].endswith("app:1.0")
    patched = fake.posts[card["id"]]
    assert "Approved" in patched["props"]["attachments"][0]["text"]
    assert "actions" not in patched["props"]["attachments"][0]
    await svc.drain(10)
    # the outcome in the thread, and the inverse (back to revision 2) proposed as a new card
    await fake.wait_for(lambda: len(_cards(fake, ids["channel"])) == 2)
    assert any("updated" in p["message"] for p in fake.thread(card["id"]))
    assert len(applied(kube)) == 1


async def test_fuzzed_action_requests_are_refused_and_nothing_is_applied(
    fake: FakeMattermost, world: tuple[Bot, ActionService, dict[str, str]], kube: KubernetesSnapshotServer
) -> None:
    bot, svc, ids = world
    where = ThreadRef("mattermost", ids["channel"], None, ids["asker"])
    live = await svc.propose(ActionSpec("cordon", {"kind": "node", "name": "worker-1"}), ["disk"], where)
    done = await svc.propose(
        ActionSpec("scale", {"kind": "deployment", "namespace": NS, "name": "api", "replicas": 4}),
        ["load"],
        where,
    )
    other = await svc.propose(
        ActionSpec("rollout_restart", {"kind": "deployment", "namespace": NS, "name": "api"}), ["x"], where
    )
    short = ActionService(svc.settings.model_copy(update={"expiry_s": 0.05}), svc.audit.store)
    short.attach(svc.adapters)
    late = await short.propose(ActionSpec("uncordon", {"kind": "node", "name": "worker-1"}), ["x"], where)
    await short.close()
    assert live.card_id and done.card_id and other.record and late.card_id
    done_value = _values(fake.posts[done.card_id])["Approve"]
    status, body = await fake.click_button(done.card_id, "Approve", ids["approver"])
    assert body["ephemeral_text"].startswith("Applied")
    await asyncio.sleep(0.1)  # the short-lived proposal expires
    values = _values(fake.posts[live.card_id])
    tried = attempts(
        live_approve=values["Approve"],
        live_reject=values["Reject"],
        other_id=other.record.id,
        applied_approve=done_value,
        expired_approve=_values(fake.posts[late.card_id])["Approve"],
        approver=ids["approver"],
        channel=ids["channel"],
        other_channel=ids["other"],
        unsigned_transports=("no_signature", "no_context"),
        count=120,
    )
    writes = len(applied(kube))
    card = fake.posts[live.card_id]
    for attempt in tried:
        context: Any = {"action": "opsbot_action", "value": attempt.value}
        if attempt.transport == "no_signature":
            context["value"] = attempt.value.rsplit(":", 1)[0]
        elif attempt.transport == "no_context":
            context = {"action": "opsbot_action"}
        status, body = await _post_action(bot, fake, card, attempt.user, attempt.channel, context)
        assert status == 200, body
        assert "Applied" not in body["ephemeral_text"], attempt
    assert len(applied(kube)) == writes
    # every attempt reached opsbot and is in the audit trail as refused, with who tried
    refused = [e for e in await svc.audit.events() if e.event == "refused"]
    assert len(refused) == len(tried)
    assert {e.user for e in refused} == {a.user for a in tried}


async def test_ten_simultaneous_approve_clicks_apply_once(
    fake: FakeMattermost, world: tuple[Bot, ActionService, dict[str, str]], kube: KubernetesSnapshotServer
) -> None:
    bot, svc, ids = world
    where = ThreadRef("mattermost", ids["channel"], None, ids["asker"])
    made = await svc.propose(
        ActionSpec("delete_pod", {"kind": "pod", "namespace": NS, "name": "api-bbb222-2"}), ["x"], where
    )
    assert made.card_id
    answers = await asyncio.gather(
        *(fake.click_button(made.card_id, "Approve", ids["approver"]) for _ in range(10))
    )
    texts = [body["ephemeral_text"] for status, body in answers if status == 200]
    assert len(texts) == 10
    assert sum(t.startswith("Applied") for t in texts) == 1
    assert applied(kube) == [f"DELETE /api/v1/namespaces/{NS}/pods/api-bbb222-2"]
