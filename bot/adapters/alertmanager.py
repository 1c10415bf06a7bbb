"""The Alertmanager webhook receiver (``POST /alertmanager``): an inbound adapter, one chat thread
per alert group.

Per alert group (``groupKey``): the first notification posts a short header into every configured
target channel, stores the thread (:class:`~bot.store.records.AlertThread`) and hands an
``alert_summary`` message to the pipeline, which answers it in that thread. Later notifications of
the group go into the same thread: new firing alerts get a new analysis, alerts that went away a
short note, and a resolved group a short "resolved" note (never a new analysis). The webhook answers
200 at once; the work runs in a task the pipeline owns (so shutdown drains it with everything else),
and a receiver that is stopping answers 503, so Alertmanager retries on another replica.

The group's state (its thread, its status, the fingerprints firing at its last notification) lives
in the database, not in this process: replicas receiving the same webhook open one thread between
them (the store's claim on the group, :meth:`~bot.store.Store.open_alert_thread`), change its state
by compare-and-set (so one of them posts a resolve note), and a resolve after a restart or on
another replica lands as a short note in the same thread. The analysis itself is claimed by the
notification's event id like any chat event.

**Alert storms.** A target channel gives ``alertmanager.storm_threshold`` new groups within
``storm_window_s`` a thread each; beyond that, new groups join one storm thread
(":rotating_light: N alert groups firing"): each posts a one-line summary there and its thread is
that storm thread (so its resolve lands there too), and once no group joined for
``storm_settle_s`` one analysis covers every group that joined, instead of a queue of threads
and analyses arriving a minute late. (The storm is this replica's view: two replicas sharing a
storm may each open a storm thread; each group still lands in exactly one.)
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections import deque
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field, replace
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

    async def open_alert_thread(self, thread: AlertThread) -> AlertThread | None:
        """Claim the group: ``None`` when this call created its row, else the row there is."""

    async def update_alert_thread(self, thread: AlertThread, *, expect: AlertThread | None = None) -> bool:
        """Write the thread's state (only if still ``expect``'s, when given); True when written."""

    @property
    def claim_lease_s(self) -> float:
        """Seconds after which a group left ``opening`` is taken over."""


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


def group_line(payload: Mapping[str, Any]) -> str:
    """One line summarising a group in a storm thread: name, severity, where, how many, summary."""
    common = payload.get("commonLabels") or {}
    name = common.get("alertname") or (payload.get("groupLabels") or {}).get("alertname") or "Alert group"
    where = " ".join(f"{k}={common[k]}" for k in ("namespace", "service", "deployment", "pod") if k in common)
    severity = common.get("severity")
    text = f"• *{name}*" + (f" ({severity})" if severity else "") + f" [{len(firing(payload))} firing]"
    if where:
        text += f" {where}"
    summary = (payload.get("commonAnnotations") or {}).get("summary")
    if summary:
        text += f": {summary}"
    return redact(text, where="alert")


@dataclass
class _Storm:
    """A storm thread in one target channel and the groups waiting for its next analysis."""

    thread_id: str
    joined: int = 0
    last_join: float = 0.0
    waiting: list[dict[str, Any]] = field(default_factory=list)
    analyses: int = 0
    settle: asyncio.Future[None] | None = None


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
        self._new_groups: dict[tuple[str, str], deque[float]] = {}
        """When each target channel last opened group threads (within the storm window)."""
        self._storms: dict[tuple[str, str], _Storm] = {}
        self._storm_locks: dict[tuple[str, str], asyncio.Lock] = {}
        self.coalesced = 0
        """Groups that joined a storm thread instead of opening their own."""

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
        status: str = payload["status"]
        now_firing = sorted({fingerprint(a) for a in firing(payload)})
        if status == "resolved":
            thread = await self._opened(await self.store.get_alert_thread(key))
            if thread is None:
                logger.info(
                    "resolved alert group %s has no thread; nothing to do", redact(group_key, where="log")
                )
                return None
            resolved = replace(thread, status="resolved", firing=[])
            # Compare-and-set: of two replicas given the same resolve, one posts the note.
            if thread.status != "resolved" and await self.store.update_alert_thread(resolved, expect=thread):
                await adapter.post_to_channel(thread.channel, self._resolved_text(payload), thread.thread_id)
            return None
        opening = AlertThread(key, adapter.platform, channel, "", "opening", now_firing)
        found = await self.store.open_alert_thread(opening)
        if found is None:  # this replica opened the group: post its header
            storm = await self._storm_for(adapter, channel)
            if storm is not None:
                await self._join_storm(storm, payload, opening, adapter, channel)
                return None
            thread_id = await adapter.post_to_channel(channel, header(payload))
            thread = replace(opening, thread_id=thread_id, status="firing")
            await self.store.update_alert_thread(thread)
        else:
            opened = await self._opened(found)
            if opened is None:
                logger.warning(
                    "alert group %s: another replica is still opening its thread; skipped",
                    redact(group_key, where="log"),
                )
                return None
            thread = opened
            before = set(thread.firing) if thread.firing is not None else None
            if before is not None and thread.status == "firing" and set(now_firing) <= before:
                gone = before - set(now_firing)
                now = replace(thread, firing=now_firing)
                if gone and await self.store.update_alert_thread(now, expect=thread):
                    text = (
                        f":white_check_mark: {len(gone)} alert(s) of this group resolved; "
                        f"{len(now_firing)} still firing."
                    )
                    await adapter.post_to_channel(thread.channel, text, thread.thread_id)
                return None
            thread = replace(thread, status="firing", firing=now_firing)
            await self.store.update_alert_thread(thread)
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

    # -- alert storms ----------------------------------------------------------------------
    async def _storm_for(self, adapter: ChannelPoster, channel: str) -> _Storm | None:
        """The storm thread a new group in ``channel`` joins, opened now if this group is one too many
        for the window; ``None``: the group gets a thread of its own (counted)."""
        threshold = self.settings.alertmanager.storm_threshold
        if threshold is None:
            return None
        window = self.settings.alertmanager.storm_window_s
        where = (adapter.platform, channel)
        async with self._storm_locks.setdefault(where, asyncio.Lock()):
            now = time.monotonic()
            storm = self._storms.get(where)
            if storm is not None and now - storm.last_join < window:
                return storm
            opened = self._new_groups.setdefault(where, deque())
            while opened and now - opened[0] >= window:
                opened.popleft()
            if len(opened) < threshold:
                opened.append(now)
                return None
            text = (
                f":rotating_light: Alert storm: more than {threshold} alert groups firing in this channel "
                f"within {window:g} s. Further groups are summarised in this thread, one line each, "
                "with one analysis for all of them."
            )
            storm = _Storm(thread_id=await adapter.post_to_channel(channel, text), last_join=now)
            self._storms[where] = storm
            logger.warning(
                "alert storm in %s:%s: more than %d new groups in %g s; coalescing into thread %s",
                adapter.platform,
                channel,
                threshold,
                window,
                storm.thread_id,
            )
            return storm

    async def _join_storm(
        self,
        storm: _Storm,
        payload: dict[str, Any],
        opening: AlertThread,
        adapter: ChannelPoster,
        channel: str,
    ) -> None:
        """Post the group's line in the storm thread, make that its thread, queue it for the analysis."""
        await adapter.post_to_channel(channel, group_line(payload), storm.thread_id)
        await self.store.update_alert_thread(replace(opening, thread_id=storm.thread_id, status="firing"))
        storm.joined += 1
        storm.last_join = time.monotonic()
        storm.waiting.append(payload)
        self.coalesced += 1
        if storm.settle is None or storm.settle.done():
            storm.settle = self.pipeline.track(
                self._analyse_storm(storm, adapter, channel), f"alert-storm-{storm.thread_id[:20]}"
            )

    async def _analyse_storm(self, storm: _Storm, adapter: ChannelPoster, channel: str) -> None:
        """Once no group joined for ``storm_settle_s``: one analysis of every group that joined."""
        settle = self.settings.alertmanager.storm_settle_s
        while (wait := storm.last_join + settle - time.monotonic()) > 0:
            await asyncio.sleep(wait)
        groups, storm.waiting = storm.waiting, []
        if not groups:
            return
        storm.analyses += 1
        text = f"{len(groups)} alert groups firing in this channel at once:\n\n" + "\n\n".join(
            describe(p) for p in groups
        )
        message = IncomingMessage(
            platform=adapter.platform,
            event_id=f"alert-storm:{channel}:{storm.thread_id}:{storm.analyses}",
            channel=channel,
            user="alertmanager",
            user_name="Alertmanager",
            text=text,
            kind=MessageKind.ALERT,
            thread_id=storm.thread_id,
            scenario=ALERT_SUMMARY,
            extra={"alert": groups[0], "storm_groups": len(groups)},
        )
        await self.pipeline.submit(message, adapter)

    async def _opened(self, thread: AlertThread | None) -> AlertThread | None:
        """``thread`` once its header is posted: a group another replica is opening is waited for
        (up to ``store.claim_lease_s``; ``None`` if it is still opening then)."""
        if thread is None or thread.status != "opening":
            return thread
        deadline = time.monotonic() + self.store.claim_lease_s
        while time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            found = await self.store.get_alert_thread(thread.group_key)
            if found is None or found.status != "opening":
                return found
        return None

    @staticmethod
    def _resolved_text(payload: Mapping[str, Any]) -> str:
        common = payload.get("commonLabels") or {}
        name = common.get("alertname") or "Alert group"
        ends = [a.get("endsAt") for a in payload.get("alerts", []) if a.get("endsAt")]
        when = f" at {max(ends)}" if ends else ""
        return redact(f":white_check_mark: Resolved: {name}{when}. No new analysis.", where="alert")
