"""Approval-gated actions on Slack, through the real wire: ``/rca propose`` as a signed slash
command, the card as Block Kit, Approve / Reject as signed ``block_actions`` interactions; the
changes land on the fake Kubernetes API through opsbot's separate write credentials."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes.actions_world import NS, actions_settings, applied, cluster, service
from fakes.click_fuzz import attempts
from fakes.slack_harness import BotFactory, SlackBot
from fakes.slack_server import FakeMessage, FakeSlack
from sqlalchemy import text

from bot.actions.catalog import ActionSpec
from bot.actions.service import ActionService, ThreadRef
from bot.eval.kube_api import KubernetesSnapshotServer

pytestmark = pytest.mark.timeout(120)

APPROVER = "U0APPROVER"
ASKER = "U0ASKER"


@pytest.fixture
async def kube() -> AsyncIterator[KubernetesSnapshotServer]:
    async with cluster() as srv:
        yield srv


_SERVICES: list[ActionService] = []


@pytest.fixture(autouse=True)
async def _close_services() -> AsyncIterator[None]:
    yield
    while _SERVICES:
        await _SERVICES.pop().close()


def _to(slack: FakeSlack, user: str) -> list[str]:
    """The ephemeral texts ``user`` was sent."""
    return [e["text"] for e in slack.ephemerals if e["user"] == user]


async def _bot(
    make_bot: BotFactory, kube: KubernetesSnapshotServer, tmp_path: Path, **overrides: Any
) -> tuple[SlackBot, ActionService]:
    bot = await make_bot(mode="http")
    values: dict[str, Any] = {"policies": [{"match": ["C1"], "approvers": [APPROVER, "asker"]}]}
    values.update(overrides)
    svc = service(actions_settings(kube, tmp_path, **values), bot.store, {"slack": bot.adapter})
    _SERVICES.append(svc)
    bot.pipeline.actions = svc
    bot.adapter.actions = svc
    return bot, svc


def _cards(slack: FakeSlack, channel: str = "C1") -> list[FakeMessage]:
    """Every proposal card posted in ``channel`` (decided ones too), oldest first."""
    return [
        m
        for m in slack.bot_messages(channel)
        if any(
            b["type"] == "section" and b["text"]["text"].startswith("*Proposed action:*")
            for b in m.blocks or []
        )
    ]


def _buttons(card: FakeMessage) -> dict[str, str]:
    block = next(b for b in card.blocks or [] if b["type"] == "actions")
    return {e["action_id"]: e["value"] for e in block["elements"]}


async def _click(
    slack: FakeSlack,
    bot: SlackBot,
    card: FakeMessage,
    user: str,
    action_id: str,
    value: str,
    channel: str | None = None,
    transport: str = "signed",
) -> int:
    payload = slack.block_action(card, user, action_id, value)
    if channel is not None:
        payload["channel"]["id"] = payload["container"]["channel_id"] = channel
    if transport == "signed":
        return (await slack.post_to_app(bot.events_url, "interactive", payload)).status
    if transport == "bad_secret":
        return (
            await slack.post_to_app(bot.events_url, "interactive", payload, secret="not-the-secret")
        ).status
    if transport == "stale":
        return (
            await slack.post_to_app(bot.events_url, "interactive", payload, timestamp=1_700_000_000)
        ).status
    import json
    import urllib.parse

    import aiohttp

    body = urllib.parse.urlencode({"payload": json.dumps(payload)})
    headers = {"Content-Type": "application/x-www-form-urlencoded"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(bot.events_url, data=body, headers=headers) as resp,
    ):
        return resp.status


async def test_a_proposal_is_a_card_with_the_dry_run_and_only_an_approver_can_apply_it(
    slack: FakeSlack, make_bot: BotFactory, kube: KubernetesSnapshotServer, tmp_path: Path
) -> None:
    bot, svc = await _bot(make_bot, kube, tmp_path)
    post = await slack.post_to_app(
        bot.events_url,
        "command",
        slack.slash_command("C1", ASKER, "propose scale deployment/api -n shop --replicas 5"),
    )
    assert post.status == 200
    await slack.wait_for(lambda: len(_cards(slack)) == 1)
    card = _cards(slack)[0]
    shown = " ".join(b["text"]["text"] for b in card.blocks or [] if b["type"] == "section")
    assert "Scale deployment/api -n shop to 5 replicas" in shown and "replicas 3 -> 5" in shown
    assert "Risk:" in shown and "Dry run" in shown
    assert applied(kube) == [] and kube.deployments[0]["spec"]["replicas"] == 3
    buttons = _buttons(card)

    # someone who is neither an approver nor the asker: refused, told so, nothing applied
    assert (
        await _click(
            slack, bot, card, "U0STRANGER", "opsbot_action_approve", buttons["opsbot_action_approve"]
        )
        == 200
    )
    await slack.wait_for(lambda: len(_to(slack, "U0STRANGER")) == 1)
    assert "may not decide" in _to(slack, "U0STRANGER")[0]
    assert applied(kube) == []

    # the approver: applied once, the card loses its buttons, the outcome is posted in the thread
    assert (
        await _click(slack, bot, card, APPROVER, "opsbot_action_approve", buttons["opsbot_action_approve"])
        == 200
    )
    await slack.wait_for(lambda: len(_to(slack, APPROVER)) == 1)
    assert "Applied" in _to(slack, APPROVER)[0]
    assert applied(kube) == [f"PATCH /apis/apps/v1/namespaces/{NS}/deployments/api/scale"]
    assert kube.deployments[0]["spec"]["replicas"] == 5
    updated = slack.find("C1", card.ts)
    assert updated is not None and not any(b["type"] == "actions" for b in updated.blocks or [])
    await svc.drain(10)
    outcome = [m for m in slack.bot_messages("C1") if m.thread_ts == card.ts and "updated" in m.text]
    assert outcome and ":white_check_mark:" in outcome[0].text
    # ... and the inverse (back to 3) is proposed as a new card, waiting for its own approval
    await slack.wait_for(lambda: len(_cards(slack)) == 2)
    assert kube.deployments[0]["spec"]["replicas"] == 5

    # a second click (double click, or Slack retrying): refused, still applied once
    assert (
        await _click(slack, bot, card, APPROVER, "opsbot_action_approve", buttons["opsbot_action_approve"])
        == 200
    )
    await slack.wait_for(lambda: len(_to(slack, APPROVER)) == 2)
    assert "already applied" in _to(slack, APPROVER)[1]
    assert len(applied(kube)) == 1
    async with bot.store.engine.connect() as conn:
        events = (await conn.execute(text("SELECT event, user FROM opsbot_action_events ORDER BY id"))).all()
    assert [e for e, _ in events][:5] == ["proposed", "refused", "approved", "applied", "verified"]
    assert ("refused", "U0STRANGER") in events and ("approved", APPROVER) in events


async def test_the_asker_may_reject_and_a_rejected_card_can_no_longer_be_approved(
    slack: FakeSlack, make_bot: BotFactory, kube: KubernetesSnapshotServer, tmp_path: Path
) -> None:
    bot, svc = await _bot(make_bot, kube, tmp_path, policies=[{"match": ["C1"], "approvers": [APPROVER]}])
    spec = ActionSpec("cordon", {"kind": "node", "name": "worker-1"})
    proposal = await svc.propose(
        spec, ["node worker-1 reports DiskPressure"], ThreadRef("slack", "C1", None, ASKER)
    )
    assert proposal.refused is None
    card = _cards(slack)[0]
    buttons = _buttons(card)
    await _click(slack, bot, card, ASKER, "opsbot_action_reject", buttons["opsbot_action_reject"])
    await slack.wait_for(lambda: len(_to(slack, ASKER)) == 1)
    assert "Rejected" in _to(slack, ASKER)[0]
    await _click(slack, bot, card, APPROVER, "opsbot_action_approve", buttons["opsbot_action_approve"])
    await slack.wait_for(lambda: len(_to(slack, APPROVER)) == 1)
    assert "already rejected" in _to(slack, APPROVER)[0]
    assert applied(kube) == []


async def test_a_channel_without_a_policy_gets_cards_nobody_may_approve(
    slack: FakeSlack, make_bot: BotFactory, kube: KubernetesSnapshotServer, tmp_path: Path
) -> None:
    bot, svc = await _bot(make_bot, kube, tmp_path)
    spec = ActionSpec("delete_pod", {"kind": "pod", "namespace": NS, "name": "api-bbb222-1"})
    await svc.propose(spec, ["pod api-bbb222-1 CrashLoopBackOff"], ThreadRef("slack", "C9", "1.1", ASKER))
    card = _cards(slack, "C9")[0]
    await _click(slack, bot, card, ASKER, "opsbot_action_approve", _buttons(card)["opsbot_action_approve"])
    await slack.wait_for(lambda: len(_to(slack, ASKER)) == 1)
    assert "nobody" in _to(slack, ASKER)[0]
    assert applied(kube) == []


async def test_a_proposal_outside_the_channels_namespaces_or_the_catalog_is_refused_before_any_card(
    slack: FakeSlack, make_bot: BotFactory, kube: KubernetesSnapshotServer, tmp_path: Path
) -> None:
    policy = {"match": ["C1"], "approvers": [APPROVER], "namespaces": ["payments"]}
    bot, _ = await _bot(make_bot, kube, tmp_path, policies=[policy])
    for words in (
        "propose restart deployment/api -n shop",
        "propose cordon node/worker-1",
        "propose reboot node/x",
    ):
        post = await slack.post_to_app(bot.events_url, "command", slack.slash_command("C1", ASKER, words))
        assert post.status == 200
    await slack.wait_for(
        lambda: (
            len(slack.ephemerals)
            + sum(
                1
                for p in slack.app_posts
                if "outside" in p.body or "not allowed" in p.body or "say which" in p.body
            )
            >= 3
        )
    )
    assert _cards(slack) == [] and kube.writes == []


async def test_fuzzed_clicks_forged_tampered_replayed_expired_or_unsigned_are_all_refused(
    slack: FakeSlack, make_bot: BotFactory, kube: KubernetesSnapshotServer, tmp_path: Path
) -> None:
    bot, svc = await _bot(make_bot, kube, tmp_path)
    live, done, other = await fuzz_targets(svc, slack, bot, kube, tmp_path)
    tried = attempts(
        live_approve=live["opsbot_action_approve"],
        live_reject=live["opsbot_action_reject"],
        other_id=other,
        applied_approve=done,
        expired_approve=await expired_value(svc, slack, tmp_path, kube),
        approver=APPROVER,
        channel="C1",
        other_channel="C2",
        unsigned_transports=("bad_secret", "stale", "no_headers"),
        count=120,
    )
    writes_before = len(applied(kube))
    card = _cards(slack)[0]
    refused_before = await refusals(svc)
    signed = 0
    for attempt in tried:
        status = await _click(
            slack,
            bot,
            card,
            attempt.user or "U0",
            "opsbot_action_approve",
            attempt.value,
            attempt.channel,
            attempt.transport,
        )
        if attempt.transport == "signed":
            assert status == 200
            signed += 1
        else:
            assert status == 401
    # every signed attempt reached opsbot and was refused (the audit trail says why); none applied
    await until(lambda: refusals(svc), refused_before + signed)
    assert len(applied(kube)) == writes_before
    assert all("Applied" not in text for text in _to(slack, APPROVER)[1:])


async def refusals(svc: ActionService) -> int:
    """Refused clicks in the audit trail."""
    return sum(1 for e in await svc.audit.events() if e.event == "refused")


async def until(count: Any, want: int, timeout_s: float = 30.0) -> None:
    """Poll ``await count()`` until it reaches ``want``."""
    import asyncio
    import time

    deadline = time.monotonic() + timeout_s
    while (got := await count()) < want:
        assert time.monotonic() < deadline, f"{got} < {want}"
        await asyncio.sleep(0.05)


async def fuzz_targets(
    svc: ActionService, slack: FakeSlack, bot: SlackBot, kube: KubernetesSnapshotServer, tmp_path: Path
) -> tuple[dict[str, str], str, str]:
    """A live proposal's buttons, an applied proposal's approve value, a third proposal's id."""
    where = ThreadRef("slack", "C1", None, ASKER)
    live = await svc.propose(ActionSpec("cordon", {"kind": "node", "name": "worker-1"}), ["disk"], where)
    done = await svc.propose(
        ActionSpec("scale", {"kind": "deployment", "namespace": NS, "name": "api", "replicas": 4}),
        ["load"],
        where,
    )
    other = await svc.propose(
        ActionSpec("rollout_restart", {"kind": "deployment", "namespace": NS, "name": "api"}),
        ["stuck"],
        where,
    )
    assert live.card_id and done.card_id and other.record
    done_card = slack.find("C1", done.card_id)
    assert done_card is not None
    value = _buttons(done_card)["opsbot_action_approve"]
    await _click(slack, bot, done_card, APPROVER, "opsbot_action_approve", value)
    await slack.wait_for(lambda: any("Applied" in e["text"] for e in slack.ephemerals))
    live_card = slack.find("C1", live.card_id)
    assert live_card is not None
    return _buttons(live_card), value, other.record.id


async def expired_value(
    svc: ActionService, slack: FakeSlack, tmp_path: Path, kube: KubernetesSnapshotServer
) -> str:
    """The approve value of a proposal whose time ran out (made by a service with a short expiry)."""
    short = ActionService(svc.settings.model_copy(update={"expiry_s": 0.05}), svc.audit.store)
    short.attach(svc.adapters)
    made = await short.propose(
        ActionSpec("uncordon", {"kind": "node", "name": "worker-1"}),
        ["x"],
        ThreadRef("slack", "C1", None, ASKER),
    )
    _SERVICES.append(short)
    assert made.card_id is not None
    card = slack.find("C1", made.card_id)
    assert card is not None
    import asyncio

    await asyncio.sleep(0.1)
    return _buttons(card)["opsbot_action_approve"]


async def test_a_mention_in_an_incident_thread_proposes_into_that_thread_and_is_counted(
    slack: FakeSlack, make_bot: BotFactory, kube: KubernetesSnapshotServer, tmp_path: Path
) -> None:
    from prometheus_client import REGISTRY

    def counted(event: str) -> float:
        return (
            REGISTRY.get_sample_value("opsbot_action_events_total", {"platform": "slack", "event": event})
            or 0.0
        )

    bot, _ = await _bot(make_bot, kube, tmp_path)
    before = counted("proposed")
    root = slack.user_message("C1", ASKER, "checkout is failing")
    event = slack.user_message(
        "C1", ASKER, f"<@{slack.bot_user_id}> propose cordon node/worker-1", thread_ts=root["ts"]
    )
    for e in slack.mention_events(event):
        assert (await slack.post_to_app(bot.events_url, "event", slack.event_callback(e))).status == 200
    await slack.wait_for(lambda: len(_cards(slack)) == 1)
    assert _cards(slack)[0].thread_ts == root["ts"]
    assert counted("proposed") == before + 1
    assert applied(kube) == []


async def test_an_unclicked_proposal_expires_and_its_card_says_so(
    slack: FakeSlack, make_bot: BotFactory, kube: KubernetesSnapshotServer, tmp_path: Path
) -> None:
    bot, _ = await _bot(make_bot, kube, tmp_path, expiry_s=0.2)
    svc = bot.adapter.actions
    assert svc is not None
    svc.start(interval_s=0.05)
    await svc.propose(
        ActionSpec("cordon", {"kind": "node", "name": "worker-1"}),
        ["x"],
        ThreadRef("slack", "C1", None, ASKER),
    )
    card = _cards(slack)[0]

    def expired() -> bool:
        now = slack.find("C1", card.ts)
        blocks = now.blocks or [] if now is not None else []
        return not any(b["type"] == "actions" for b in blocks) and any(
            "Expired" in b["text"]["text"] for b in blocks if b["type"] == "section"
        )

    await slack.wait_for(expired, timeout_s=10)
    record = (await svc.audit.proposals())[0]
    assert record.state == "expired" and applied(kube) == []


async def test_a_click_over_socket_mode_is_decided_the_same_way(
    slack: FakeSlack, make_bot: BotFactory, kube: KubernetesSnapshotServer, tmp_path: Path
) -> None:
    bot = await make_bot()  # Socket Mode: the payload comes over the app-token link, unsigned by design
    policy = {"match": ["C1"], "approvers": [APPROVER]}
    svc = service(actions_settings(kube, tmp_path, policies=[policy]), bot.store, {"slack": bot.adapter})
    _SERVICES.append(svc)
    bot.adapter.actions = svc
    await svc.propose(
        ActionSpec("cordon", {"kind": "node", "name": "worker-1"}),
        ["x"],
        ThreadRef("slack", "C1", None, ASKER),
    )
    card = _cards(slack)[0]
    value = _buttons(card)["opsbot_action_approve"]
    await slack.deliver("interactive", slack.block_action(card, "U0STRANGER", "opsbot_action_approve", value))
    await slack.wait_for(lambda: len(_to(slack, "U0STRANGER")) == 1)
    assert applied(kube) == []
    await slack.deliver("interactive", slack.block_action(card, APPROVER, "opsbot_action_approve", value))
    await slack.wait_for(lambda: len(_to(slack, APPROVER)) == 1)
    assert applied(kube) == ["PATCH /api/v1/nodes/worker-1"]
