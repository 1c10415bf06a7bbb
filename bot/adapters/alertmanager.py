"""The Alertmanager webhook receiver (``POST /alertmanager``): an inbound adapter, one chat thread
per alert group.

Per alert group (``groupKey``): the first notification posts a short header into every configured
target channel, stores the thread (:class:`~bot.store.records.AlertThread`) and hands an
``alert_summary`` message to the pipeline, which answers it in that thread. Later notifications of
the group go into the same thread: new firing alerts get a new analysis, alerts that went away a
short note, and a resolved group a short "resolved" note (never a new analysis). The webhook answers
200 at once; the work runs in a task the pipeline owns (so shutdown drains it with everything else),
and a receiver that is stopping answers 503, so Alertmanager retries on another replica.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Coroutine, Mapping
from typing import Any, Protocol

from aiohttp import web

from bot.config import Settings
from bot.context.alertmanager import (
    PayloadError,
    describe,
    fingerprint,
    firing,
    notification_digest,
    parse_payload,
)
from bot.http import accepts
from bot.redact import redact
from bot.store.records import AlertThread
from bot.types import IncomingMessage, MessageKind
from inference.scenarios import ALERT_SUMMARY

logger = logging.getLogger(__name__)


class AlertThreadStore(Protocol):
    """The part of :class:`bot.store.Store` the receiver uses."""

    async def get_alert_thread(self, group_key: str) -> AlertThread | None:
        """The stored thread of ``group_key`` or ``None``."""

    async def save_alert_thread(self, thread: AlertThread) -> None:
        """Insert or update a thread."""


class PipelineEntry(Protocol):
    """The part of :class:`bot.pipeline.Pipeline` the receiver uses: the one owner of work in flight."""

    def submit(self, message: IncomingMessage, adapter: Any) -> asyncio.Future[None]:
        """Answer ``message`` through ``adapter`` in a task the pipeline owns."""

    def track(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Future[None]:
        """Run ``work`` as a task the pipeline owns (shutdown waits for it)."""


class ChannelPoster(Protocol):
    """The part of :class:`bot.adapters.base.ChatAdapter` the receiver uses."""

    platform: str

    async def post_to_channel(self, channel: str, text: str, thread_id: str | None = None) -> str:
        """Post a message; returns its id."""


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
        pipeline: PipelineEntry,
        adapters_by_platform: Mapping[str, ChannelPoster],
    ) -> None:
        self.settings = settings
        self.store = store
        self.pipeline = pipeline
        self.adapters = dict(adapters_by_platform)
        self.targets = self._targets(settings.alertmanager.targets)
        self.accepting = True
        """False once :meth:`stop` ran: new notifications are answered 503 (Alertmanager retries)."""
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

    @accepts("application/json")
    async def handle_webhook(self, request: web.Request) -> web.Response:
        """Check the token, parse, answer 200 at once and process in the background."""
        token = self.settings.alertmanager.bearer_token
        if token is not None:
            given = request.headers.get("Authorization", "")
            expected = f"Bearer {token.get_secret_value()}"
            if not hmac.compare_digest(given.encode(), expected.encode()):
                return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        if not self.accepting:
            return web.json_response({"error": "opsbot is shutting down; retry"}, status=503)
        try:
            payload = parse_payload(await request.read())
        except PayloadError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        self.pipeline.track(self.process(payload), f"alert-{payload['groupKey'][:40]}")
        return web.json_response({"status": "accepted", "alerts": len(payload["alerts"])})

    def stop(self) -> None:
        """Stop taking notifications (shutdown); those being processed are the pipeline's to drain."""
        self.accepting = False

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
                    *(self.pipeline.submit(message, adapter) for message, adapter in answers),
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
