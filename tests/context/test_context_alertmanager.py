"""Alertmanager receiver: webhook checks, one thread per alert group, resolve notes in that thread,
and the whole path from a real Prometheus through a real Alertmanager.

The chat side is a recording test double (a ChatAdapter that records posts, and a pipeline handle
that records messages); the lead's end-to-end tests drive the real pipeline.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prom_fixtures import ALERT_NAME, TOKEN, start_stack

from bot.adapters.alertmanager import AlertmanagerReceiver
from bot.adapters.base import ChatAdapter, MessageSink, ReplyStream
from bot.config import Settings, StoreSettings
from bot.context.alertmanager import describe, notification_digest
from bot.store import Store
from bot.types import FinalAnswer, IncomingMessage, MessageKind


class RecordingReply(ReplyStream):
    def __init__(self, thread_id: str) -> None:
        self._thread_id = thread_id

    async def update(self, text: str) -> None:
        pass

    async def finish(self, answer: FinalAnswer) -> None:
        pass

    @property
    def thread_id(self) -> str:
        return self._thread_id


class RecordingAdapter(ChatAdapter):
    """Records channel posts; every top-level post starts a new thread id."""

    def __init__(self, platform: str) -> None:
        self.platform = platform
        self.posts: list[tuple[str, str, str | None]] = []
        self.posted = asyncio.Queue[tuple[str, str, str | None]]()

    async def start(self, submit: MessageSink) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def open_reply(self, message: IncomingMessage) -> ReplyStream:
        return RecordingReply(message.thread_id or "new")

    async def send_notice(self, message: IncomingMessage, text: str, *, ephemeral: bool = False) -> None:
        pass

    async def post_to_channel(self, channel: str, text: str, thread_id: str | None = None) -> str:
        self.posts.append((channel, text, thread_id))
        await self.posted.put((channel, text, thread_id))
        return thread_id or f"{self.platform}-thread-{len(self.posts)}"


class Recorder:
    """Pipeline test double: records the messages submitted to it, runs tracked work."""

    def __init__(self) -> None:
        self.messages: list[tuple[IncomingMessage, ChatAdapter]] = []
        self.queue = asyncio.Queue[IncomingMessage]()
        self.tasks: set[asyncio.Task[None]] = set()

    def submit(self, message: IncomingMessage, adapter: ChatAdapter) -> asyncio.Task[None]:
        return self.track(self._record(message, adapter), "recorded")

    async def _record(self, message: IncomingMessage, adapter: ChatAdapter) -> None:
        self.messages.append((message, adapter))
        await self.queue.put(message)

    def track(self, work: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(work, name=name)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def drain(self) -> None:
        """Wait for every tracked task, including tasks the tracked ones submit meanwhile."""
        while self.tasks:
            await asyncio.gather(*self.tasks)


async def _next(queue: asyncio.Queue[Any], timeout: float = 30.0) -> Any:
    return await asyncio.wait_for(queue.get(), timeout)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'opsbot.db'}", StoreSettings())
    yield opened
    await opened.close()


def _payload(
    status: str = "firing", fingerprints: tuple[str, ...] = ("aaa",), group: str = "g1"
) -> dict[str, Any]:
    alerts = [
        {
            "status": status,
            "labels": {"alertname": "KubePodCrashLooping", "namespace": "payments", "pod": f"api-{fp}"},
            "annotations": {"summary": "api is crash-looping", "description": "token=abc123secret in logs"},
            "startsAt": "2026-11-29T19:50:00Z",
            "endsAt": "2026-11-29T20:00:00Z" if status == "resolved" else "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus/graph",
            "fingerprint": fp,
        }
        for fp in fingerprints
    ]
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="KubePodCrashLooping", group="{group}"}}',
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "opsbot",
        "groupLabels": {"alertname": "KubePodCrashLooping"},
        "commonLabels": {"alertname": "KubePodCrashLooping", "namespace": "payments", "severity": "critical"},
        "commonAnnotations": {"summary": "api is crash-looping"},
        "externalURL": "http://alertmanager:9093",
        "alerts": alerts,
    }


def _receiver(store: Store, targets: list[str], token: str | None = "s3cret-token"):
    settings = Settings(alertmanager={"enabled": True, "targets": targets, "bearer_token": token})
    adapters = {"slack": RecordingAdapter("slack"), "mattermost": RecordingAdapter("mattermost")}
    recorder = Recorder()
    receiver = AlertmanagerReceiver(settings, store, recorder, adapters)
    return receiver, adapters, recorder


@pytest.fixture
async def client_for(store: Store):
    clients: list[TestClient[Any, Any]] = []

    async def make(receiver: AlertmanagerReceiver) -> TestClient[Any, Any]:
        app = web.Application()
        app.add_routes(receiver.http_routes())
        client = TestClient(TestServer(app))
        await client.start_server()
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


AUTH = {"Authorization": "Bearer s3cret-token"}


async def test_a_missing_or_wrong_bearer_token_is_refused_with_401(store, client_for):
    receiver, adapters, _ = _receiver(store, ["slack:C1"])
    client = await client_for(receiver)
    assert (await client.post("/alertmanager", json=_payload())).status == 401
    wrong = await client.post("/alertmanager", json=_payload(), headers={"Authorization": "Bearer nope"})
    assert wrong.status == 401
    assert adapters["slack"].posts == []


async def test_bad_json_and_non_alertmanager_bodies_get_400_with_a_clear_message(store, client_for):
    receiver, _, _ = _receiver(store, ["slack:C1"])
    client = await client_for(receiver)
    response = await client.post("/alertmanager", data=b"{not json", headers=AUTH)
    assert response.status == 400
    assert "not valid JSON" in (await response.json())["error"]
    response = await client.post("/alertmanager", json={"hello": 1}, headers=AUTH)
    assert response.status == 400
    assert "missing groupKey, status, alerts" in (await response.json())["error"]


async def test_a_new_group_gets_one_thread_per_target_and_an_alert_summary_request(store, client_for):
    receiver, adapters, recorder = _receiver(store, ["slack:C1", "mattermost:town-square"])
    client = await client_for(receiver)
    payload = _payload()
    response = await client.post("/alertmanager", json=payload, headers=AUTH)
    assert response.status == 200
    first, second = await _next(recorder.queue), await _next(recorder.queue)
    channel, header, thread = adapters["slack"].posts[0]
    assert (channel, thread) == ("C1", None)
    assert header.startswith(":rotating_light: [FIRING:1] KubePodCrashLooping (critical) namespace=payments")
    assert first.kind is MessageKind.ALERT and first.scenario == "alert_summary"
    assert first.thread_id == "slack-thread-1" and first.channel == "C1" and first.platform == "slack"
    assert first.event_id == f"alert:{payload['groupKey']}:{notification_digest(payload)}"
    assert first.extra["alert"] == payload
    assert "abc123secret" not in first.text and "KubePodCrashLooping" in first.text
    assert second.platform == "mattermost" and second.thread_id == "mattermost-thread-1"
    saved = await store.get_alert_thread(payload["groupKey"])
    assert saved is not None and saved.thread_id == "slack-thread-1" and saved.status == "firing"


async def test_repeats_refires_partial_and_full_resolves_stay_in_the_groups_thread(store, client_for):
    receiver, adapters, recorder = _receiver(store, ["slack:C1"])
    slack = adapters["slack"]
    client = await client_for(receiver)

    async def send(payload: dict[str, Any]) -> None:
        assert (await client.post("/alertmanager", json=payload, headers=AUTH)).status == 200
        await recorder.drain()

    await send(_payload(fingerprints=("aaa",)))
    await send(_payload(fingerprints=("aaa",)))  # repeat notification: nothing new to say
    await send(_payload(fingerprints=("aaa", "bbb")))  # re-fire with a new alert: new analysis
    await send(_payload(fingerprints=("bbb",)))  # one alert went away: short note
    await send(_payload("resolved", fingerprints=("aaa", "bbb")))
    await send(_payload("resolved", fingerprints=("aaa", "bbb")))  # resolved twice: one note
    threads = {m.thread_id for m, _ in recorder.messages}
    assert threads == {"slack-thread-1"}
    assert len(recorder.messages) == 2 and len({m.event_id for m, _ in recorder.messages}) == 2
    top_level = [p for p in slack.posts if p[2] is None]
    assert len(top_level) == 1
    notes = [text for _, text, thread in slack.posts if thread == "slack-thread-1"]
    assert notes[0].startswith(":white_check_mark: 1 alert(s) of this group resolved; 1 still firing")
    assert notes[1].startswith(":white_check_mark: Resolved: KubePodCrashLooping")
    assert len(notes) == 2
    assert (await store.get_alert_thread(_payload()["groupKey"])).status == "resolved"


async def test_a_group_that_fires_again_after_resolving_is_analysed_in_the_same_thread(store, client_for):
    receiver, adapters, recorder = _receiver(store, ["slack:C1"], token=None)
    client = await client_for(receiver)
    for payload in (_payload(), _payload("resolved"), _payload()):
        assert (await client.post("/alertmanager", json=payload)).status == 200
        await recorder.drain()
    assert [m.thread_id for m, _ in recorder.messages] == ["slack-thread-1", "slack-thread-1"]
    assert len([p for p in adapters["slack"].posts if p[2] is None]) == 1


def test_the_description_names_every_alert_and_redacts_secrets():
    text = describe(_payload(fingerprints=("aaa", "bbb")))
    assert "2 firing, 0 resolved alert(s) in group KubePodCrashLooping" in text
    assert "pod=api-aaa" in text and "pod=api-bbb" in text
    assert "abc123secret" not in text


async def test_an_alert_from_real_prometheus_through_real_alertmanager_gets_one_thread_and_its_resolve(
    tmp_path: Path, store: Store
):
    stack = start_stack(tmp_path / "stack")
    try:
        settings = Settings(
            alertmanager={"enabled": True, "targets": ["slack:C-ALERTS"], "bearer_token": TOKEN}
        )
        slack = RecordingAdapter("slack")
        recorder = Recorder()
        receiver = AlertmanagerReceiver(settings, store, recorder, {"slack": slack})
        app = web.Application()
        app.add_routes(receiver.http_routes())
        server = TestServer(app, host="127.0.0.1", port=stack.receiver_port)
        await server.start_server()
        try:
            stack.exporter.trigger = 1
            message = await _next(recorder.queue, 60)
            channel, header, thread = await _next(slack.posted, 5)
            assert channel == "C-ALERTS" and thread is None and ALERT_NAME in header
            assert message.thread_id == "slack-thread-1" and message.scenario == "alert_summary"
            alert = message.extra["alert"]
            assert alert["status"] == "firing" and alert["version"] == "4"
            assert alert["commonLabels"]["alertname"] == ALERT_NAME and alert["alerts"][0]["fingerprint"]

            stack.exporter.trigger = 0
            channel, note, thread = await _next(slack.posted, 60)
            assert (channel, thread) == ("C-ALERTS", "slack-thread-1")
            assert note.startswith(":white_check_mark: Resolved: " + ALERT_NAME)
            await recorder.drain()
            assert len(recorder.messages) == 1  # the resolve is a note, not a new analysis
            assert [p for p in slack.posts if p[2] is None] == [(channel, header, None)]
        finally:
            await recorder.drain()
            await server.close()
    except BaseException:
        print(stack.logs())
        raise
    finally:
        stack.stop()


def test_payload_shape_matches_alertmanager_version_4():
    body = json.dumps(_payload()).encode()
    from bot.context.alertmanager import parse_payload

    parsed = parse_payload(body)
    assert set(parsed) >= {
        "receiver",
        "status",
        "alerts",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "groupKey",
        "truncatedAlerts",
        "version",
    }
