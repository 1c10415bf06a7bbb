"""What the eval's in-process APIs share: serving on a free port of 127.0.0.1, a drawn latency
before each answer, and a stop that cuts short what is still waiting.

:class:`~bot.eval.kube_api.KubernetesSnapshotServer` and
:class:`~bot.eval.prom_api.PrometheusSnapshotServer` build their own routes (:meth:`app`); this
class owns their life cycle, so a case, a test or ``bench/context_bench.py`` starts either the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from dataclasses import dataclass, field
from typing import Self

from aiohttp import web


@dataclass
class LocalApiServer:
    """An aiohttp application served on 127.0.0.1 for as long as an eval case or a test needs it."""

    latency_s: tuple[float, float] = (0.0, 0.0)
    """Every answer waits a uniformly drawn time in this range first (a real API server's round trip,
    for ``bench/context_bench.py``)."""
    url: str = ""
    """The base URL once :meth:`start` has run (or of a server started elsewhere)."""
    _runner: web.AppRunner | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        """The routes this server answers (each API defines its own)."""
        raise NotImplementedError

    async def start(self) -> str:
        """Serve on a free port of 127.0.0.1; returns the base URL."""
        self._stopping = asyncio.Event()  # made on the loop that serves (a case may run on a new loop)
        self._runner = web.AppRunner(self.app())
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        """Stop serving; answers held by a slow route or the latency end at once."""
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        """``async with server:`` serves for the block (:meth:`start`, then :meth:`stop`)."""
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    async def answer_delay(self) -> None:
        """Wait the drawn latency (nothing when ``latency_s`` is zero)."""
        if self.latency_s[1] > 0:
            await asyncio.sleep(random.uniform(*self.latency_s))

    async def hold(self, delay_s: float) -> None:
        """Wait ``delay_s`` (a fault's slow answer), cut short by :meth:`stop` so a slow route never
        holds up a test's teardown."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), delay_s)
