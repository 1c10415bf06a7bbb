"""``opsbot run`` with ``workers = N``: one engine host process, N bot worker processes.

The host (the process ``opsbot run`` starts) opens the store (migrations run once, here), loads and
warms the engines with their admission controllers, serves them on a :mod:`inference.bridge` socket
in a private folder, and starts the workers: the same command line again, with ``OPSBOT_WORKER``
(``index/count``) and ``OPSBOT_BRIDGE`` (the socket) in the environment. A worker runs what a
one-process bot runs around its engine: the store, the chat adapters, the pipeline (prompts are
rendered to token ids there), and for worker 1 the HTTP server (Slack HTTP mode, Alertmanager,
batch analysis, ``/healthz``, ``/readyz``, ``/metrics``).

How the chat traffic splits: every worker opens its own Slack Socket Mode connection and Slack
hands each event to one of an app's open connections; every worker's Mattermost websocket sees
every post, and a worker answers only the channels whose CRC-32 of the id, modulo N, is its index
(one channel's thread stays in one process, in order); HTTP deliveries reach worker 1. The store's
event claims stay the guard against a second answer, as between replicas.

Life cycle: a worker that dies is started again (at most ``RESTARTS_PER_MINUTE`` times a minute,
then the host stops: a crash loop is not hidden); SIGTERM to the host stops the workers first (each
drains its answers over the bridge), then the engine. A worker whose host disappears stops (its
answers in flight fail with the engine-dead notice) and, on Linux, gets SIGTERM from the kernel
when the host dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

from bot.config import Settings

logger = logging.getLogger(__name__)

WORKER_ENV = "OPSBOT_WORKER"
"""``index/count`` (index from 0) in a worker's environment."""
BRIDGE_ENV = "OPSBOT_BRIDGE"
"""The engine host's bridge socket, in a worker's environment."""
RESTARTS_PER_MINUTE = 5
"""A worker dying more often than this in a minute stops the host (a crash loop)."""
STOP_GRACE_S = 10.0
"""Seconds a worker gets after its drain deadline before it is killed."""
_PR_SET_PDEATHSIG = 1


def worker_slot() -> tuple[int, int] | None:
    """This process's ``(index, count)`` when it is a worker, else ``None``."""
    value = os.environ.get(WORKER_ENV)
    if not value:
        return None
    index, _, count = value.partition("/")
    return int(index), int(count)


def owns_channel(channel: str, index: int, count: int) -> bool:
    """Whether worker ``index`` of ``count`` answers ``channel`` (a stable hash: every worker and
    every restart agrees without talking)."""
    return zlib.crc32(channel.encode()) % count == index


def worker_settings(settings: Settings, index: int) -> Settings:
    """Worker ``index``'s settings: worker 1 (index 0) keeps the HTTP server and what arrives over
    HTTP (Slack HTTP mode, Alertmanager, batch analysis); the others keep only the connections they
    open themselves."""
    if index == 0:
        return settings
    update: dict[str, object] = {
        "http": settings.http.model_copy(update={"enabled": False}),
        "alertmanager": settings.alertmanager.model_copy(update={"enabled": False}),
        "analyze": settings.analyze.model_copy(update={"enabled": False}),
    }
    if settings.slack.enabled and settings.slack.mode == "http":
        update["slack"] = settings.slack.model_copy(update={"enabled": False})
    return settings.model_copy(update=update)


def check_shareable(tokenizers: dict[str, object]) -> None:
    """Raise ``ValueError`` with the fix when an engine's tokenizer cannot be sent to the workers
    (they render prompts with it)."""
    for name, tokenizer in tokenizers.items():
        try:
            pickle.dumps(tokenizer)
        except Exception as exc:
            raise ValueError(
                f"workers = N needs the engines' tokenizers in the workers, and engine {name!r}'s "
                f"({type(tokenizer).__name__}) cannot be sent there ({type(exc).__name__}: {exc}). "
                "Fix: set workers = 1 for this backend (llama.cpp answers one request at a time "
                "anyway) or use vllm, transformers or openai"
            ) from exc


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class WorkerPool:
    """The host's workers: start, restart on death, stop on shutdown."""

    def __init__(
        self,
        count: int,
        bridge_path: str,
        *,
        command: Sequence[str] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.count = count
        self.bridge_path = bridge_path
        # The command line this process was started with: the same program (a console script,
        # ``python -m bot.cli``, a bench wrapper that registers its own backend) becomes the worker.
        self.command = list(command or sys.orig_argv)
        self.progress = progress or (lambda line: logger.info("%s", line))
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self.failed = asyncio.Event()
        """Set when a worker crash-looped: the host should stop."""
        self._stopping = False
        self._watchers: list[asyncio.Task[None]] = []
        self._deaths: list[float] = []

    async def start(self) -> None:
        """Start every worker and a watcher for each."""
        for index in range(self.count):
            await self._spawn(index)
            self._watchers.append(asyncio.create_task(self._watch(index), name=f"worker-{index + 1}"))

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids."""
        return [p.pid for p in self.processes.values() if p.returncode is None]

    async def _spawn(self, index: int) -> None:
        env = {**os.environ, WORKER_ENV: f"{index}/{self.count}", BRIDGE_ENV: self.bridge_path}
        process = await asyncio.create_subprocess_exec(
            *self.command, env=env, preexec_fn=_die_with_parent if sys.platform == "linux" else None
        )
        self.processes[index] = process
        self.progress(f"worker {index + 1}/{self.count} started (pid {process.pid})")

    async def _watch(self, index: int) -> None:
        while True:
            code = await self.processes[index].wait()
            if self._stopping:
                return
            now = time.monotonic()
            self._deaths = [t for t in self._deaths if now - t < 60.0] + [now]
            if len(self._deaths) > RESTARTS_PER_MINUTE:
                logger.error(
                    "worker %d/%d exited with %s, the %d. death within a minute: stopping",
                    index + 1,
                    self.count,
                    code,
                    len(self._deaths),
                )
                self.failed.set()
                return
            logger.error("worker %d/%d exited with %s: starting it again", index + 1, self.count, code)
            await asyncio.sleep(1.0)
            if self._stopping:
                return
            await self._spawn(index)

    async def stop(self, grace_s: float) -> None:
        """SIGTERM every worker (each drains its answers), SIGKILL what is left after ``grace_s``."""
        self._stopping = True
        for task in self._watchers:
            task.cancel()
        running = [p for p in self.processes.values() if p.returncode is None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        waits = [asyncio.create_task(p.wait()) for p in running]
        if not waits:
            return
        _, late = await asyncio.wait(waits, timeout=grace_s)
        for process in running:
            if process.returncode is None:
                logger.warning("worker pid %d did not stop in %.0f s: killed", process.pid, grace_s)
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
        if late:
            await asyncio.wait(late, timeout=5.0)


async def run_engine_host(settings: Settings, progress: Callable[[str], None]) -> int:
    """``opsbot run`` as the engine host of ``settings.workers`` workers (until a signal, a dead
    engine or a crash-looping worker); its exit status."""
    from bot.app import OpsBot
    from inference.bridge import BridgeServer

    bot = OpsBot(settings, progress=progress)
    bot.install_signal_handlers()
    folder: str | None = None
    server: BridgeServer | None = None
    pool: WorkerPool | None = None
    try:
        await bot.start_core()
        if bot.stop_requested:
            return bot.exit_code
        assert bot.engine is not None
        check_shareable({name: engine.tokenizer for name, engine in bot.engine.items()})
        folder = tempfile.mkdtemp(prefix="opsbot-bridge-")  # 0700: only this user reaches the engine
        server = BridgeServer(bot.engine, bot.models, str(Path(folder) / "engine.sock"))
        await server.start()
        pool = WorkerPool(settings.workers, server.path, progress=progress)
        await pool.start()
        stop = asyncio.create_task(bot.wait())
        crashed = asyncio.create_task(pool.failed.wait())
        await asyncio.wait({stop, crashed}, return_when=asyncio.FIRST_COMPLETED)
        for task in (stop, crashed):
            task.cancel()
        if pool.failed.is_set():
            bot.exit_code = bot.exit_code or 1
        return bot.exit_code
    finally:
        if pool is not None:
            await pool.stop(settings.engine.drain_timeout_s + STOP_GRACE_S)
        if server is not None:
            await server.close()
        await bot.shutdown()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


async def run_worker(settings: Settings, progress: Callable[[str], None]) -> int:
    """``opsbot run`` as one worker: the engine over the bridge, everything else as usual."""
    from bot.adapters.mattermost import MattermostAdapter
    from bot.adapters.registry import build_adapters
    from bot.app import EXIT_ENGINE_DEAD, OpsBot
    from inference.bridge import BridgeClient

    slot = worker_slot()
    assert slot is not None
    index, count = slot
    settings = worker_settings(settings, index)
    client = BridgeClient(os.environ[BRIDGE_ENV])
    await client.connect()
    bot = OpsBot(settings, progress=progress)
    bot.install_signal_handlers()

    def host_lost(reason: str) -> None:
        if not bot.stop_requested:
            logger.error("worker %d/%d: %s: stopping", index + 1, count, reason)
            bot.exit_code = EXIT_ENGINE_DEAD
            bot.request_stop()

    client.on_lost.append(host_lost)
    try:
        await bot.start_core((client.engine_set(), client.models))
        if bot.stop_requested:
            return bot.exit_code
        assert bot.store is not None
        adapters = build_adapters(settings, bot.store)
        for adapter in adapters:
            if isinstance(adapter, MattermostAdapter) and count > 1:
                adapter.channel_filter = lambda channel: owns_channel(channel, index, count)
        await bot.start_service(adapters)
        progress("ready")
        await bot.wait()
    finally:
        await bot.shutdown()
        await client.close()
    return bot.exit_code
