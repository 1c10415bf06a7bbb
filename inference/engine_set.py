"""Several named engines in one process, one per scenario where configured, behind one ``Engine``.

The source material advises an engine per kind of work: alert summaries on a small INT4 engine,
root-cause analysis on an FP8 or bf16 one, sharing a GPU by memory fraction. An :class:`EngineSet`
holds those engines by name (each already behind its own admission controller, so one engine's
queue never holds up another's) and a scenario -> engine table:

- :meth:`EngineSet.engine_for` answers which engine serves a scenario (the pipeline asks it, and
  names the engine in the request row);
- as an :class:`~inference.engine.Engine` itself it starts every member (one after another: vLLM
  measures the GPU memory left when it starts, so two engines must not profile at once), routes
  ``generate`` by the request's scenario, is ready only when every member is, reports their stats
  together and shuts them all down.

A set of one engine behaves exactly as that engine. This module knows nothing of ``bot.config``:
it takes engines and a table, whoever built them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence

from inference.engine import (
    ChatMessage,
    ChatTokenizer,
    Engine,
    EngineError,
    EngineHealth,
    EngineStats,
    GenerationEvent,
    GenerationRequest,
)

logger = logging.getLogger(__name__)

DEFAULT_ENGINE = "default"
"""The engine that answers every scenario the table does not name."""


class UnknownEngineError(EngineError, ValueError):
    """A scenario routed to an engine name the set does not hold."""


class EngineSet(Engine):
    """Named engines and the scenario -> engine table (see the module doc)."""

    backend = "set"

    def __init__(
        self,
        engines: Mapping[str, Engine],
        routes: Mapping[str, str] | None = None,
        *,
        default: str = DEFAULT_ENGINE,
    ) -> None:
        if default not in engines:
            raise UnknownEngineError(
                f"the default engine {default!r} is not in the set (engines: {', '.join(engines) or 'none'})"
            )
        for scenario, name in (routes or {}).items():
            if name not in engines:
                raise UnknownEngineError(
                    f"scenario {scenario!r} is routed to engine {name!r}, which is not in the set "
                    f"(engines: {', '.join(engines)})"
                )
        # The default first: it starts first and is the set's tokenizer and main stats.
        self._engines = {default: engines[default], **{n: e for n, e in engines.items() if n != default}}
        self._routes = dict(routes or {})
        self.default = default
        self._where: dict[str, str] = {}  # request id -> engine name, while it runs (for abort)
        if len(self._engines) == 1:
            self.backend = engines[default].backend

    @classmethod
    def single(cls, engine: Engine, name: str = DEFAULT_ENGINE) -> EngineSet:
        """A set of just ``engine`` (every scenario goes to it)."""
        return cls({name: engine}, default=name)

    # -- the table ------------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """Every engine name, the default first."""
        return list(self._engines)

    @property
    def routes(self) -> dict[str, str]:
        """The scenarios routed to a named engine (every other scenario goes to the default)."""
        return dict(self._routes)

    def name_for(self, scenario: str) -> str:
        """The name of the engine that answers ``scenario``."""
        return self._routes.get(scenario, self.default)

    def engine_for(self, scenario: str) -> tuple[str, Engine]:
        """The name and the engine that answer ``scenario``."""
        name = self.name_for(scenario)
        return name, self._engines[name]

    def get(self, name: str) -> Engine:
        """The engine called ``name``; :class:`UnknownEngineError` if there is none."""
        try:
            return self._engines[name]
        except KeyError:
            raise UnknownEngineError(f"no engine {name!r} (engines: {', '.join(self._engines)})") from None

    def items(self) -> list[tuple[str, Engine]]:
        """Every (name, engine), the default first."""
        return list(self._engines.items())

    def scenarios_of(self, name: str) -> list[str]:
        """The scenarios routed to engine ``name`` by the table (the default also takes the rest)."""
        return sorted(s for s, n in self._routes.items() if n == name)

    # -- Engine ---------------------------------------------------------------------------------
    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        """Start every engine, the default first, one after another; if one fails, the ones already
        started are shut down again and the error goes on (naming the engine)."""
        started: list[Engine] = []
        for name, engine in self._engines.items():
            if len(self._engines) > 1:
                logger.info("starting engine %s (%s)", name, engine.backend)
            try:
                await engine.start(warmup_messages)
            except BaseException as exc:
                for other in reversed(started):
                    try:
                        await other.shutdown(drain_timeout_s=0)
                    except Exception:
                        logger.warning("shutting down an engine after a failed start failed", exc_info=True)
                if len(self._engines) > 1 and isinstance(exc, Exception):
                    exc.add_note(f"while starting engine {name!r}")
                raise
            started.append(engine)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Stream ``request`` from the engine of its scenario."""
        name, engine = self.engine_for(request.scenario)
        self._where[request.request_id] = name
        try:
            async for event in engine.generate(request):
                yield event
        finally:
            self._where.pop(request.request_id, None)

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id`` in the engine running it (every engine, if it is not known here)."""
        name = self._where.get(request_id)
        targets = [self._engines[name]] if name is not None else list(self._engines.values())
        for engine in targets:
            await engine.abort(request_id)

    def health(self) -> EngineHealth:
        """Ready only when every engine is; the reason names each engine that is not."""
        if len(self._engines) == 1:
            return self._engines[self.default].health()
        down = [(name, engine.health()) for name, engine in self._engines.items()]
        reasons = [f"engine {name}: {h.reason or 'not ready'}" for name, h in down if not h.ready]
        return EngineHealth(ready=not reasons, reason="; ".join(reasons))

    def health_by_engine(self) -> dict[str, EngineHealth]:
        """Each engine's own health."""
        return {name: engine.health() for name, engine in self._engines.items()}

    def stats_by_engine(self) -> dict[str, EngineStats]:
        """Each engine's own stats."""
        return {name: engine.stats() for name, engine in self._engines.items()}

    def stats(self) -> EngineStats:
        """All engines together: counts summed, KV-cache use the fullest engine's (the one closest
        to preempting), prefix-cache hit rate the mean of those that report one. One engine: its own."""
        every = self.stats_by_engine()
        if len(every) == 1:
            return every[self.default]
        main = every[self.default]
        kv = [s.kv_cache_usage for s in every.values() if s.kv_cache_usage is not None]
        hit = [s.prefix_cache_hit_rate for s in every.values() if s.prefix_cache_hit_rate is not None]
        pre = [s.preemptions for s in every.values() if s.preemptions is not None]

        def lanes(attr: str) -> dict[str, int]:
            total: dict[str, int] = {}
            for s in every.values():
                for lane, n in getattr(s, attr).items():
                    total[lane] = total.get(lane, 0) + n
            return total

        return EngineStats(
            backend="+".join(dict.fromkeys(s.backend for s in every.values())),
            model=", ".join(f"{name}: {s.model}" for name, s in every.items()),
            running=sum(s.running for s in every.values()),
            waiting=sum(s.waiting for s in every.values()),
            waiting_by_lane=lanes("waiting_by_lane"),
            running_by_lane=lanes("running_by_lane"),
            kv_cache_usage=max(kv) if kv else None,
            prefix_cache_hit_rate=sum(hit) / len(hit) if hit else None,
            preemptions=sum(pre) if pre else None,
            quantization=main.quantization,
        )

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Shut every engine down together (each drains up to ``drain_timeout_s``); one failing
        never keeps the others running."""
        results = await asyncio.gather(
            *(engine.shutdown(drain_timeout_s=drain_timeout_s) for engine in self._engines.values()),
            return_exceptions=True,
        )
        for name, result in zip(self._engines, results, strict=True):
            if isinstance(result, BaseException):
                logger.error("engine %s: shutdown failed: %s", name, result, exc_info=result)

    @property
    def tokenizer(self) -> ChatTokenizer:
        """The default engine's tokenizer (each engine's own: ``get(name).tokenizer``)."""
        return self._engines[self.default].tokenizer
