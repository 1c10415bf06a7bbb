"""Alertmanager: the webhook receiver (``POST /alertmanager``) and the alert payload as context.

Payload (webhook version 4)::

    {"version": "4", "groupKey": "{}:{alertname=\\"X\\"}", "truncatedAlerts": 0,
     "status": "firing" | "resolved", "receiver": "opsbot",
     "groupLabels": {...}, "commonLabels": {...}, "commonAnnotations": {...}, "externalURL": "...",
     "alerts": [{"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL",
                 "fingerprint"}, ...]}

Per alert group (``groupKey``): the first notification posts a short header into every configured
target channel, stores the thread (:class:`~bot.store.records.AlertThread`) and has the pipeline
answer an ``alert_summary`` in that thread. Later notifications of the group go into the same
thread: new firing alerts get a new analysis, alerts that went away a short note, and a resolved
group a short "resolved" note (never a new analysis). The webhook answers 200 at once; the work runs
in a task.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from aiohttp import web

from bot.config import Settings
from bot.context.base import ContextSection
from bot.context.redact import redact
from bot.store.records import AlertThread
from bot.types import IncomingMessage, MessageKind

logger = logging.getLogger(__name__)

ALERT_SUMMARY = "alert_summary"
SOURCE = "Alertmanager"
_MAX_ALERTS_IN_TEXT = 20


class AlertThreadStore(Protocol):
    """The part of :class:`bot.store.Store` the receiver uses."""

    async def get_alert_thread(self, group_key: str) -> AlertThread | None:
        """The stored thread of ``group_key`` or ``None``."""

    async def save_alert_thread(self, thread: AlertThread) -> None:
        """Insert or update a thread."""


class ChannelPoster(Protocol):
    """The part of :class:`bot.adapters.base.ChatAdapter` the receiver uses."""

    platform: str

    async def post_to_channel(self, channel: str, text: str, thread_id: str | None = None) -> str:
        """Post a message; returns its id."""


PipelineHandle = Callable[[IncomingMessage, Any], Awaitable[None]]
"""``pipeline.handle``: answers a message through an adapter."""


class PayloadError(ValueError):
    """The webhook body is not an Alertmanager notification."""


def parse_payload(body: bytes) -> dict[str, Any]:
    """The notification in ``body``; :class:`PayloadError` says what is wrong."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise PayloadError("body must be a JSON object (an Alertmanager webhook notification)")
    missing = [key for key in ("groupKey", "status", "alerts") if key not in payload]
    if missing:
        raise PayloadError(f"not an Alertmanager notification: missing {', '.join(missing)}")
    if not isinstance(payload["alerts"], list) or not all(isinstance(a, dict) for a in payload["alerts"]):
        raise PayloadError("'alerts' must be a list of objects")
    if payload["status"] not in ("firing", "resolved"):
        raise PayloadError(f"'status' must be 'firing' or 'resolved', got {payload['status']!r}")
    if not isinstance(payload["groupKey"], str) or not payload["groupKey"]:
        raise PayloadError("'groupKey' must be a non-empty string")
    return payload


def firing(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The alerts of ``payload`` that are firing."""
    return [a for a in payload.get("alerts", []) if a.get("status") == "firing"]


def fingerprint(alert: Mapping[str, Any]) -> str:
    """Alertmanager's fingerprint, or a stable hash of the labels when it is missing (version < 4)."""
    value = alert.get("fingerprint")
    if isinstance(value, str) and value:
        return value
    labels = json.dumps(alert.get("labels", {}), sort_keys=True)
    return hashlib.sha256(labels.encode()).hexdigest()[:16]


def notification_digest(payload: Mapping[str, Any]) -> str:
    """Hash of the firing fingerprints and the status: equal for repeats of one notification."""
    prints = sorted(fingerprint(a) for a in firing(payload))
    return hashlib.sha256(json.dumps([payload.get("status"), prints]).encode()).hexdigest()[:16]


def _alert_line(alert: Mapping[str, Any], common: Mapping[str, Any]) -> str:
    labels = {k: v for k, v in (alert.get("labels") or {}).items() if common.get(k) != v or k == "alertname"}
    name = labels.pop("alertname", (alert.get("labels") or {}).get("alertname", "?"))
    annotations = alert.get("annotations") or {}
    summary = annotations.get("summary") or annotations.get("description") or annotations.get("message") or ""
    label_text = " ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    since = alert.get("startsAt", "?")
    return f"[{alert.get('status', '?')}] {name} {label_text} since {since}" + (
        f": {summary}" if summary else ""
    )


def describe(payload: Mapping[str, Any]) -> str:
    """A plain-text description of a notification (the question opsbot answers for it)."""
    alerts = payload.get("alerts", [])
    common = payload.get("commonLabels") or {}
    name = common.get("alertname") or (payload.get("groupLabels") or {}).get("alertname") or "alerts"
    lines = [
        f"Alertmanager notification: {len(firing(payload))} firing, "
        f"{len(alerts) - len(firing(payload))} resolved alert(s) in group {name} "
        f"(status {payload.get('status')}).",
    ]
    if common:
        lines.append("Common labels: " + " ".join(f"{k}={v}" for k, v in sorted(common.items())))
    common_annotations = payload.get("commonAnnotations") or {}
    for key in ("summary", "description", "runbook_url"):
        if common_annotations.get(key):
            lines.append(f"{key}: {common_annotations[key]}")
    for alert in alerts[:_MAX_ALERTS_IN_TEXT]:
        lines.append("- " + _alert_line(alert, common))
    if len(alerts) > _MAX_ALERTS_IN_TEXT:
        lines.append(f"- ... and {len(alerts) - _MAX_ALERTS_IN_TEXT} more")
    if payload.get("truncatedAlerts"):
        lines.append(f"({payload['truncatedAlerts']} further alerts were truncated by Alertmanager)")
    lines.append("Summarise what is happening, the likely cause and the first checks to run.")
    return redact("\n".join(lines), where="alert")


def alert_section(payload: Mapping[str, Any]) -> ContextSection | None:
    """The alerts of a notification as a context section (most relevant of all: priority 0)."""
    alerts = payload.get("alerts")
    if not isinstance(alerts, list) or not alerts:
        return None
    common = payload.get("commonLabels") or {}
    lines = []
    for alert in alerts:
        if not isinstance(alert, Mapping):
            continue
        lines.append(_alert_line(alert, common))
        annotations = alert.get("annotations") or {}
        for key, value in sorted(annotations.items()):
            if key not in ("summary",):
                lines.append(f"    {key}: {value}")
    name = common.get("alertname") or "alert group"
    return ContextSection(
        source=SOURCE,
        title=f"Alert {name}: {len(firing(payload))} firing of {len(alerts)} (common labels "
        + " ".join(f"{k}={v}" for k, v in sorted(common.items()))
        + ")",
        body="\n".join(lines),
        priority=0,
        unit="more alert lines",
        drop_from="end",
    )


def header(payload: Mapping[str, Any]) -> str:
    """The short first message of an alert thread."""
    common = payload.get("commonLabels") or {}
    name = common.get("alertname") or (payload.get("groupLabels") or {}).get("alertname") or "Alert group"
    where = " ".join(
        f"{k}={common[k]}" for k in ("namespace", "service", "deployment", "pod", "node") if k in common
    )
    severity = common.get("severity")
    count = len(firing(payload))
    text = f":rotating_light: [FIRING:{count}] {name}" + (f" ({severity})" if severity else "")
    if where:
        text += f" {where}"
    summary = (payload.get("commonAnnotations") or {}).get("summary")
    if summary:
        text += f"\n{summary}"
    text += "\nopsbot is looking into it; the summary follows in this thread."
    return redact(text, where="alert")


class AlertmanagerReceiver:
    """``POST /alertmanager``: one chat thread per alert group."""

    def __init__(
        self,
        settings: Settings,
        store: AlertThreadStore,
        pipeline_handle: PipelineHandle,
        adapters_by_platform: Mapping[str, ChannelPoster],
    ) -> None:
        self.settings = settings
        self.store = store
        self.pipeline_handle = pipeline_handle
        self.adapters = dict(adapters_by_platform)
        self.targets = self._targets(settings.alertmanager.targets)
        self._tasks: set[asyncio.Task[None]] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        # Fingerprints firing at the last notification of each group (this process only): tells a
        # re-fire with new alerts (new analysis) from a partial resolve (short note).
        self._firing: dict[str, set[str]] = {}

    @staticmethod
    def _targets(targets: list[str]) -> list[tuple[str, str]]:
        parsed = []
        for target in targets:
            platform, _, channel = target.partition(":")
            if not platform or not channel:
                raise ValueError(
                    f"alertmanager.targets: {target!r} is not 'platform:channel' (e.g. 'slack:C123')"
                )
            parsed.append((platform, channel))
        return parsed

    def http_routes(self) -> list[web.RouteDef]:
        """The webhook route, for the HTTP app."""
        return [web.post("/alertmanager", self.handle_webhook)]

    async def handle_webhook(self, request: web.Request) -> web.Response:
        """Check the token, parse, answer 200 at once and process in the background."""
        token = self.settings.alertmanager.bearer_token
        if token is not None:
            given = request.headers.get("Authorization", "")
            expected = f"Bearer {token.get_secret_value()}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        try:
            payload = parse_payload(await request.read())
        except PayloadError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        task = asyncio.create_task(self.process(payload), name=f"alert-{payload['groupKey'][:40]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return web.json_response({"status": "accepted", "alerts": len(payload["alerts"])})

    async def process(self, payload: dict[str, Any]) -> None:
        """Handle one notification (serialised per group, so a group never gets two threads)."""
        group_key: str = payload["groupKey"]
        lock = self._locks.setdefault(group_key, asyncio.Lock())
        try:
            async with lock:
                answers: list[tuple[IncomingMessage, ChannelPoster]] = []
                for index, (platform, channel) in enumerate(self.targets):
                    adapter = self.adapters.get(platform)
                    if adapter is None:
                        logger.warning(
                            "alertmanager target %s:%s: no %s adapter is running", platform, channel, platform
                        )
                        continue
                    message = await self._for_target(payload, index, adapter, channel)
                    if message is not None:
                        answers.append((message, adapter))
                self._firing[group_key] = {fingerprint(a) for a in firing(payload)}
                # The analyses of all targets run together; the group's next notification waits for
                # them, so a resolve note never lands above the summary it resolves.
                outcomes = await asyncio.gather(
                    *(self.pipeline_handle(message, adapter) for message, adapter in answers),
                    return_exceptions=True,
                )
                for outcome in outcomes:
                    if isinstance(outcome, Exception):
                        logger.error(
                            "alert summary for group %s failed: %s", redact(group_key, where="log"), outcome
                        )
        except Exception:
            logger.exception("alert group %s could not be handled", redact(group_key, where="log"))
        finally:
            if not lock.locked() and self._locks.get(group_key) is lock:
                del self._locks[group_key]

    def thread_key(self, group_key: str, index: int) -> str:
        """Store key of a group's thread in the ``index``-th target (the first target: the group key)."""
        if index == 0:
            return group_key
        platform, channel = self.targets[index]
        return f"{group_key}#{platform}:{channel}"

    async def _for_target(
        self, payload: dict[str, Any], index: int, adapter: ChannelPoster, channel: str
    ) -> IncomingMessage | None:
        """Post what this notification needs in one target; the message to analyse, if any."""
        group_key: str = payload["groupKey"]
        key = self.thread_key(group_key, index)
        thread = await self.store.get_alert_thread(key)
        status: str = payload["status"]
        if status == "resolved":
            if thread is None:
                logger.info(
                    "resolved alert group %s has no thread; nothing to do", redact(group_key, where="log")
                )
                return None
            if thread.status != "resolved":
                await adapter.post_to_channel(thread.channel, self._resolved_text(payload), thread.thread_id)
                thread.status = "resolved"
                await self.store.save_alert_thread(thread)
            return None
        now_firing = {fingerprint(a) for a in firing(payload)}
        if thread is None:
            thread_id = await adapter.post_to_channel(channel, header(payload))
            thread = AlertThread(
                group_key=key,
                platform=adapter.platform,
                channel=channel,
                thread_id=thread_id,
                status="firing",
            )
            await self.store.save_alert_thread(thread)
        else:
            before = self._firing.get(group_key)
            if before is not None and thread.status == "firing" and now_firing <= before:
                gone = before - now_firing
                if gone:
                    text = (
                        f":white_check_mark: {len(gone)} alert(s) of this group resolved; "
                        f"{len(now_firing)} still firing."
                    )
                    await adapter.post_to_channel(thread.channel, text, thread.thread_id)
                return None
            if thread.status != "firing":
                thread.status = "firing"
                await self.store.save_alert_thread(thread)
        event_id = f"alert:{group_key}:{notification_digest(payload)}"
        if index:
            event_id += f"@{channel}"
        return IncomingMessage(
            platform=adapter.platform,
            event_id=event_id,
            channel=thread.channel,
            user="alertmanager",
            user_name="Alertmanager",
            text=describe(payload),
            kind=MessageKind.ALERT,
            thread_id=thread.thread_id,
            scenario=ALERT_SUMMARY,
            extra={"alert": payload},
        )

    @staticmethod
    def _resolved_text(payload: Mapping[str, Any]) -> str:
        common = payload.get("commonLabels") or {}
        name = common.get("alertname") or "Alert group"
        ends = [a.get("endsAt") for a in payload.get("alerts", []) if a.get("endsAt")]
        when = f" at {max(ends)}" if ends else ""
        return redact(f":white_check_mark: Resolved: {name}{when}. No new analysis.", where="alert")

    async def drain(self, timeout_s: float = 10.0) -> None:
        """Wait for notifications being processed (shutdown); cancel what is left after ``timeout_s``."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
