"""Client websockets kept under watch: the liveness rule both platforms' event sockets follow.

Slack Socket Mode (:mod:`bot.adapters.slack_socket`) and the Mattermost websocket
(:mod:`bot.adapters.mattermost`) receive events the same way, and lose them the same way: a
half-open socket looks open and delivers nothing. One rule, owned here: every link is pinged on a
fixed interval and must answer within a deadline, whatever else it carries (data frames prove
nothing about the way back); a link that misses its pong, stays silent past its silence limit or
closes is *distrusted*, with the reason, and the adapter replaces it. Reading answers the server's
pings, records pongs and hands over JSON objects only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

logger = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 1.0
"""How long closing waits for the close handshake: a half-open peer never answers it."""
_CLOSED = (
    aiohttp.WSMsgType.CLOSE,
    aiohttp.WSMsgType.CLOSED,
    aiohttp.WSMsgType.CLOSING,
    aiohttp.WSMsgType.ERROR,
)


class WebSocketLink:
    """One client websocket: its tasks, its liveness, and why it is no longer trusted.

    ``on_distrust`` is called once, when the link is first distrusted (the adapter wakes the loop
    that replaces links).
    """

    def __init__(
        self, ws: aiohttp.ClientWebSocketResponse, *, on_distrust: Callable[[], None] | None = None
    ) -> None:
        self.ws = ws
        self.hello = asyncio.Event()
        """Set by the adapter when the server's greeting arrived (the link is usable)."""
        self.gone = asyncio.Event()
        """Set when the link is distrusted; ``reason`` says why."""
        self.reason = ""
        self.opened_at = time.monotonic()
        self.last_frame = self.opened_at
        self.last_pong = self.opened_at
        self.tasks: list[asyncio.Task[None]] = []
        self._pong = asyncio.Event()
        self._on_distrust = on_distrust

    def distrust(self, reason: str) -> None:
        """Mark the link as no longer trusted (the first reason is kept)."""
        if not self.gone.is_set():
            self.reason = reason
            self.gone.set()
            if self._on_distrust is not None:
                self._on_distrust()

    async def next_json(self, *, platform: str, silence_s: float | None = None) -> dict[str, Any] | None:
        """The next JSON object frame; ``None`` once the link closed or stayed silent ``silence_s``.

        Pings are answered and pongs recorded on the way; binary frames, non-object JSON and frames
        that are not JSON (logged) are skipped.
        """
        while True:
            try:
                msg = await self.ws.receive(timeout=silence_s)
            except TimeoutError:
                self.distrust(f"silent for {silence_s:.1f} s")
                return None
            self.last_frame = time.monotonic()
            if msg.type == aiohttp.WSMsgType.PING:
                with contextlib.suppress(Exception):
                    await self.ws.pong(msg.data)
                continue
            if msg.type == aiohttp.WSMsgType.PONG:
                self.last_pong = self.last_frame
                self._pong.set()
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                if msg.type in _CLOSED:
                    self.distrust(f"closed ({msg.type.name})")
                    return None
                continue  # binary frames only prove the socket is alive
            try:
                frame = json.loads(msg.data)
            except ValueError:
                logger.warning("%s websocket sent a frame that is not JSON; ignored", platform)
                continue
            if isinstance(frame, dict):
                return frame

    async def keep_pinging(self, *, interval_s: float, pong_timeout_s: float) -> None:
        """Ping every ``interval_s``; no pong within ``pong_timeout_s`` distrusts the link."""
        while not self.ws.closed and not self.gone.is_set():
            await asyncio.sleep(interval_s)
            self._pong.clear()
            sent = time.monotonic()
            with contextlib.suppress(Exception):
                await self.ws.ping(f"opsbot:{sent:.3f}".encode())
            try:
                await asyncio.wait_for(self._pong.wait(), pong_timeout_s)
            except TimeoutError:
                quiet = time.monotonic() - self.last_pong
                self.distrust(f"silent for {quiet:.1f} s, no pong within {pong_timeout_s:g} s")
                return

    async def close(self) -> None:
        """Stop the link's tasks (not the calling one) and close the socket without waiting long."""
        others = [t for t in self.tasks if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        for task in others:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if not self.ws.closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.ws.close(), CLOSE_TIMEOUT_S)
