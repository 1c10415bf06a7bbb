"""Slack Socket Mode over aiohttp: a small pool of websocket connections that stay alive.

slack_sdk's Socket Mode client keeps one connection, checks it every ``ping_interval`` and calls a
socket stale only after four intervals without a pong, then closes it *before* asking for a new
one, retrying at a fixed delay: a half-open socket went unnoticed for 18-25 s, and mentions made
meanwhile waited for Slack's redelivery. Here instead:

- every connection is pinged every ``socket_ping_interval_s`` and must answer within
  ``socket_pong_timeout_s``, whatever else arrives on it (data frames prove nothing about the way
  back), so a dead or half-open socket is known within ``interval + timeout``;
- a suspect connection (no pong, a ``disconnect`` notice from Slack, a close) is replaced by a new
  one (``apps.connections.open``, then the websocket, then ``hello``) *before* it is closed:
  Slack allows up to 10 connections per app and spreads envelopes over them, so nothing that
  still arrives on the old one is dropped;
- reconnects back off with jitter under ``[slack.reconnect]`` (:mod:`bot.retry`), for ever.

Envelopes are handed to ``handle`` (the adapter dispatches them through bolt) in their own task,
and acknowledged on the connection they came on with what ``handle`` returns (``None``: no ack, so
Slack redelivers).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
from slack_sdk.socket_mode.request import SocketModeRequest

from bot.adapters.websocket import CLOSE_TIMEOUT_S, WebSocketLink
from bot.config import SlackSettings
from bot.event_loop import stop_task
from bot.retry import RetriesExhausted, RetryBudget

logger = logging.getLogger(__name__)

Handler = Callable[[SocketModeRequest], Awaitable[dict[str, Any] | None]]


class _Connection(WebSocketLink):
    """One Socket Mode websocket (:class:`WebSocketLink`), numbered for the logs."""

    def __init__(
        self, number: int, ws: aiohttp.ClientWebSocketResponse, on_distrust: Callable[[], None]
    ) -> None:
        super().__init__(ws, on_distrust=on_distrust)
        self.number = number


class SocketModeConnections:
    """The Socket Mode side of the Slack adapter (see the module docstring)."""

    def __init__(
        self,
        settings: SlackSettings,
        *,
        open_url: Callable[[], Awaitable[str]],
        handle: Handler,
    ) -> None:
        self.settings = settings
        self._open_url = open_url
        self._handle = handle
        self._session: aiohttp.ClientSession | None = None
        self._connections: list[_Connection] = []
        self._numbers = itertools.count(1)
        self._supervisor: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self._closed = False
        self.hellos = 0
        """Connections that reached ``hello`` (for tests and logs)."""
        self.replacements = 0
        """Connections replaced because they were suspect (no pong, disconnect notice, closed)."""

    @property
    def live(self) -> int:
        """Connections open and trusted."""
        return sum(1 for c in self._connections if c.hello.is_set() and not c.gone.is_set())

    async def start(self) -> None:
        """Open the first connection (errors such as a wrong app token surface here), then keep
        ``socket_connections`` of them alive in the background."""
        self._session = aiohttp.ClientSession()
        try:
            await self._connect()
        except BaseException:
            await self._session.close()
            self._session = None
            raise
        self._supervisor = asyncio.create_task(self._supervise(), name="slack-socket-mode")

    async def close(self) -> None:
        """Close every connection; envelopes not acknowledged yet are redelivered by Slack."""
        self._closed = True
        self._changed.set()
        await stop_task(self._supervisor)
        await asyncio.gather(*(c.close() for c in self._connections), return_exceptions=True)
        self._connections.clear()
        for task in list(self._handlers):
            task.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- keeping connections ----------------------------------------------------------------------
    async def _supervise(self) -> None:
        budget = RetryBudget(self.settings.reconnect)
        while not self._closed:
            trusted = [c for c in self._connections if not c.gone.is_set()]
            if len(trusted) >= self.settings.socket_connections:
                self._changed.clear()
                await self._changed.wait()
                continue
            suspects = [c for c in self._connections if c.gone.is_set()]
            for c in suspects:
                logger.warning(
                    "slack socket mode connection %d is suspect (%s): opening a replacement first",
                    c.number,
                    c.reason,
                )
            try:
                await self._connect()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                try:
                    delay = budget.after_failure(f"{type(exc).__name__}: {exc}")
                except RetriesExhausted:  # only when reconnect.max_retries is set
                    logger.error("slack socket mode: giving up reconnecting: %s", exc)
                    return
                logger.warning(
                    "slack socket mode connect failed (%s: %s); again in %.2f s (attempt %d)",
                    type(exc).__name__,
                    exc,
                    delay,
                    budget.failures,
                )
                await asyncio.sleep(delay)
                continue
            budget.reset()
            # The replacement is up: only now are the suspect connections given up.
            for c in suspects:
                self.replacements += 1
                self._connections.remove(c)
                await c.close()
                logger.info("slack socket mode connection %d replaced (%s)", c.number, c.reason)

    async def _connect(self) -> _Connection:
        """apps.connections.open, the websocket, then wait for Slack's ``hello``."""
        assert self._session is not None
        url = await self._open_url()
        timeout = self.settings.socket_pong_timeout_s + self.settings.socket_ping_interval_s
        ws = await self._session.ws_connect(
            url, autoping=False, timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_TIMEOUT_S), max_msg_size=0
        )
        conn = _Connection(next(self._numbers), ws, self._changed.set)
        conn.tasks.append(asyncio.create_task(self._read(conn), name=f"slack-socket-{conn.number}-read"))
        try:
            await asyncio.wait_for(conn.hello.wait(), timeout)
        except BaseException:
            await conn.close()
            raise
        pinger = conn.keep_pinging(
            interval_s=self.settings.socket_ping_interval_s,
            pong_timeout_s=self.settings.socket_pong_timeout_s,
        )
        conn.tasks.append(asyncio.create_task(pinger, name=f"slack-socket-{conn.number}-ping"))
        self._connections.append(conn)
        self.hellos += 1
        logger.info("slack socket mode connection %d up (%d open)", conn.number, len(self._connections))
        return conn

    async def _read(self, conn: _Connection) -> None:
        try:
            while True:
                frame = await conn.next_json(platform="slack socket mode")
                if frame is None:
                    return
                kind = frame.get("type")
                if kind == "hello":
                    conn.hello.set()
                elif kind == "disconnect":
                    # refresh_requested / warning: Slack closes this one soon; link_disabled: it is off
                    conn.distrust(f"disconnect: {frame.get('reason', '')}")
                else:
                    request = SocketModeRequest.from_dict(frame)
                    if request is not None:
                        task = asyncio.create_task(self._answer(conn, request), name="slack-envelope")
                        self._handlers.add(task)
                        task.add_done_callback(self._handlers.discard)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            conn.distrust(f"read failed: {type(exc).__name__}: {exc}")

    async def _answer(self, conn: _Connection, request: SocketModeRequest) -> None:
        try:
            ack = await self._handle(request)
        except Exception:
            logger.exception("slack envelope %s could not be handled", request.envelope_id)
            return
        if ack is None:
            return
        try:
            await conn.ws.send_str(json.dumps(ack))
        except Exception as exc:  # the connection went away: Slack redelivers the envelope
            logger.info("slack envelope %s not acknowledged (%s)", request.envelope_id, exc)
