"""Wiring: builds every part from ``Settings`` and runs them until a signal or a dead engine.

Start order: store (migrations) -> engine (model load, system-prompt warm-up) -> pipeline ->
HTTP server -> chat adapters. Shutdown runs the other way, with one deadline: adapters and the
Alertmanager receiver stop taking messages, the pipeline (the one owner of work in flight) drains
every answer up to ``engine.drain_timeout_s``, then adapters close their connections, and the
engine and the store close (the store flushes its buffered rows).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from bot.actions.service import ActionService
from bot.adapters.alertmanager import AlertmanagerReceiver
from bot.adapters.base import ChatAdapter, MessageSink
from bot.analyze.service import AnalyzeService
from bot.claims import ClaimSweeper
from bot.config import Settings
from bot.context.gatherer import ContextGatherer
from bot.engine_factory import build_engine_set
from bot.errors import StartupError
from bot.event_loop import running_loop_name
from bot.http import build_http_app, start_http
from bot.pipeline import Pipeline
from bot.prompts import PromptBuilder, load_system_prompt
from bot.slo import SloGuard
from bot.store import Store
from bot.types import IncomingMessage
from bot.urgency import UrgentFirst
from inference.engine import ChatMessage
from inference.engine_set import EngineSet
from inference.scenarios import ScenarioRegistry

if TYPE_CHECKING:  # the loop pulls in every tool's client; imported only when it is on
    from bot.investigate import Investigator

logger = logging.getLogger(__name__)

EXIT_ENGINE_DEAD = 70
"""Exit status when the engine died for good (EX_SOFTWARE), so a supervisor restarts the pod."""

ProgressFn = Callable[[str], None]


class OpsBot:
    """One running opsbot: its store, engine, pipeline, HTTP server and adapters."""

    def __init__(self, settings: Settings, *, progress: ProgressFn | None = None) -> None:
        self.settings = settings
        self.progress = progress or (lambda line: logger.info("%s", line))
        self.store: Store | None = None
        self.engine: EngineSet | None = None
        self.models: dict[str, str] = {}
        """Each engine's resolved model, by engine name (after ``start_core``)."""
        self.pipeline: Pipeline | None = None
        self.context: ContextGatherer | None = None
        self.slo: SloGuard | None = None
        self.adapters: list[ChatAdapter] = []
        self.http_runner: web.AppRunner | None = None
        self.http_port: int | None = None
        self._http_socket: socket.socket | None = None
        self.alert_receiver: AlertmanagerReceiver | None = None
        self.analyze: AnalyzeService | None = None
        self.sweeper: ClaimSweeper | None = None
        self.actions: ActionService | None = None
        self._stop = asyncio.Event()
        self.exit_code = 0

    async def start_core(
        self,
        engines_built: tuple[EngineSet, dict[str, str]] | None = None,
        *,
        before_engine: Callable[[], Awaitable[None]] | None = None,
    ) -> Pipeline:
        """Store, engine, context and pipeline (what ``opsbot chat`` needs). ``engines_built``: an
        engine set made elsewhere and its models by name (a worker's, over the bridge to the
        engine host) instead of the configured engines. ``before_engine``: checks that need the
        store and must fail before the model loads (``opsbot run``'s port and platform tokens)."""
        s = self.settings
        self.progress(f"event loop: {running_loop_name()}")
        self.progress(f"opening the database {s.masked()['store']['url']} ...")
        self.store = await Store.open(s.store_url, s.store, upgrade=s.store.auto_upgrade)
        if before_engine is not None:
            await before_engine()
        if engines_built is None:
            engines_built = build_engine_set(s, progress=self.progress, on_fatal=self._engine_fatal)
        engines, models = engines_built
        self.engine, self.models = engines, models
        names = engines.names
        t0 = time.perf_counter()
        system_prompt = load_system_prompt(s.prompt.system_prompt, s.prompt.system_prompt_file)
        await engines.start(warmup_messages=[ChatMessage("system", system_prompt)])
        configs = s.engine_configs()
        # One prompt builder per engine: each has its own tokenizer and context window.
        builders = {
            name: PromptBuilder(
                engine.tokenizer,
                system_prompt=system_prompt,
                max_model_len=configs[name].max_model_len,
                context_share=s.prompt.context_share,
                history_share=s.prompt.history_share,
            )
            for name, engine in engines.items()
        }
        self.progress(f"engine{'s' if len(names) > 1 else ''} ready in {time.perf_counter() - t0:.1f} s")
        self.context = ContextGatherer.from_settings(s)
        if s.actions.enabled:
            # Its own credentials and clients; the engine and the context gatherer never see them.
            self.actions = ActionService(s.actions, self.store)
        # The SLO guard tunes one admission controller: the default engine's.
        self.slo = SloGuard.for_engine(s.slo, engines.get(engines.default))
        if self.slo is not None:
            self.slo.start()
        self.pipeline = Pipeline(
            engine=engines,
            store=self.store,
            prompts=builders[engines.default],
            scenarios=ScenarioRegistry(s.sampling_overrides()),
            context=self.context,
            model_name=models[engines.default],
            slo=self.slo,
            thread=s.thread,
            prompts_by_engine=builders,
            model_names=models,
            urgent_first=UrgentFirst(s.admission.urgent_first_wait_s),
            answer=s.answer,
            investigator=self._investigator(),
            actions=self.actions,
        )
        return self.pipeline

    def reserve_http(self) -> None:
        """Bind the HTTP port now, before the model loads: a taken port fails in a second, not after
        minutes of loading (:meth:`start_service` serves on this socket)."""
        h = self.settings.http
        if not h.enabled or self._http_socket is not None:
            return
        try:
            self._http_socket = socket.create_server((h.host, h.port), backlog=128)
        except OSError as exc:
            raise StartupError(
                f"http.port {h.port} on {h.host} cannot be bound: {exc.strerror or exc}. Fix: set http.port "
                "(OPSBOT_HTTP__PORT) to a free port, stop what holds it, or http.enabled = false"
            ) from None

    def _investigator(self) -> Investigator | None:
        """The investigation loop over the gatherer's clients (``None`` when ``[investigate]`` is off;
        imported only then: it pulls in every tool)."""
        if not self.settings.investigate.enabled or self.context is None:
            return None
        from bot.investigate import build_investigator

        return build_investigator(self.settings, self.context)

    async def start_service(self, adapters: list[ChatAdapter]) -> None:
        """HTTP server and chat adapters on top of ``start_core``."""
        assert self.pipeline is not None and self.engine is not None and self.store is not None
        pipeline = self.pipeline
        routes: list[web.RouteDef] = []
        for adapter in adapters:
            routes.extend(adapter.http_routes())
        self.alert_receiver = self._alert_receiver(adapters)
        if self.alert_receiver is not None:
            routes.extend(self.alert_receiver.http_routes())
        if self.settings.analyze.enabled:
            by_platform = {a.platform: a for a in adapters}
            self.analyze = AnalyzeService(
                self.settings, pipeline, self.store, by_platform, model=pipeline.model_name
            )
            routes.extend(self.analyze.http_routes())
        if self.settings.http.enabled:
            app = build_http_app(
                engine=self.engine,
                store=self.store,
                routes=routes,
                max_body_bytes=self.settings.http.max_body_bytes,
            )
            self.http_runner, self.http_port = await start_http(
                app, self.settings.http.host, self.settings.http.port, sock=self._http_socket
            )
            self._http_socket = None  # the server owns it now
        if self.actions is not None:
            for adapter in adapters:
                if hasattr(adapter, "post_card"):
                    adapter.actions = self.actions  # type: ignore[attr-defined]
            self.actions.attach({a.platform: a for a in adapters if hasattr(a, "post_card")})  # type: ignore[misc]
            self.actions.start()
        for adapter in adapters:
            await adapter.start(submit_to(pipeline, adapter))
            self.adapters.append(adapter)
            self.progress(f"{adapter.platform} adapter connected")
        if self.slo is not None:
            self.slo.attach({adapter.platform: adapter for adapter in self.adapters})
        # Answers a dead replica (or this one's previous run) left half-done get their note.
        self.sweeper = ClaimSweeper(self.store, {adapter.platform: adapter for adapter in self.adapters})
        self.sweeper.start()
        # Everything start-up built (model tokenizer, config, SDK clients, torch when loaded) lives
        # until exit: moved out of the collector's generations, so a full collection in the middle
        # of an incident walks only what requests allocate, not every long-lived object (a pause
        # of the event loop; not measured separately here). vLLM freezes its own heap the same way.
        gc.collect()
        gc.freeze()

    def _alert_receiver(self, adapters: list[ChatAdapter]) -> AlertmanagerReceiver | None:
        if not self.settings.alertmanager.enabled:
            return None
        assert self.pipeline is not None and self.store is not None
        by_platform = {a.platform: a for a in adapters}
        return AlertmanagerReceiver(self.settings, self.store, self.pipeline, by_platform)

    def _engine_fatal(self, reason: str) -> None:
        """The engine died for good (no restart left, or ``on_dead=exit``): exit non-zero."""
        logger.error("engine died and will not be restarted (%s): shutting down", reason)
        self.exit_code = EXIT_ENGINE_DEAD
        self._stop.set()

    def request_stop(self) -> None:
        """Begin a graceful shutdown (signal handlers call this)."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGINT / SIGTERM request a graceful stop from now on (idempotent).

        ``opsbot run`` calls this before start-up: a SIGTERM while the engine loads or the
        adapters connect (a deploy rolling on, a supervisor stopping a slow start) must stop the
        bot cleanly once start-up is done, not kill it with its engine processes half made.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.request_stop)

    @property
    def stop_requested(self) -> bool:
        """A stop was asked for (a signal, a fatal engine error); start-up may skip what is left."""
        return self._stop.is_set()

    async def wait(self) -> None:
        """Block until a stop is requested."""
        self.install_signal_handlers()
        await self._stop.wait()

    async def shutdown(self) -> None:
        """Stop taking messages, drain every answer in flight (one deadline), close everything."""
        await self._each_adapter("stop")
        if self.sweeper is not None:
            await self.sweeper.stop()
        if self.alert_receiver is not None:
            self.alert_receiver.stop()
        if self.analyze is not None:
            self.analyze.stop()  # batch analyses stop at once; what they finished is kept
        if self.pipeline is not None:
            await self.pipeline.drain(self.settings.engine.drain_timeout_s)
        if self.actions is not None:
            await self.actions.drain(5.0)  # a verification in flight may still post its outcome
            await self.actions.close()
        await self._each_adapter("close")
        if self.http_runner is not None:
            await self.http_runner.cleanup()
        if self._http_socket is not None:  # reserved, never served (start-up stopped first)
            self._http_socket.close()
        if self.slo is not None:
            await self.slo.stop()
        if self.engine is not None:
            # The pipeline has drained: whatever the engine still runs was cancelled with its answer.
            await self.engine.shutdown(drain_timeout_s=5.0)
        if self.pipeline is not None and self.pipeline.investigator is not None:
            await self.pipeline.investigator.close()
        if self.context is not None:
            await self.context.close()
        if self.store is not None:
            await self.store.close()

    async def _each_adapter(self, step: str) -> None:
        """``stop`` or ``close`` every adapter, last started first; one failing never stops the rest."""
        for adapter in reversed(self.adapters):
            try:
                await getattr(adapter, step)()
            except Exception:
                logger.warning("%s of the %s adapter failed", step, adapter.platform, exc_info=True)


def submit_to(pipeline: Pipeline, adapter: ChatAdapter) -> MessageSink:
    """``pipeline.submit`` bound to ``adapter``: what an adapter hands its accepted messages to."""

    def submit(message: IncomingMessage) -> asyncio.Task[None]:
        return pipeline.submit(message, adapter)

    return submit
