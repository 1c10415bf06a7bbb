"""Benchmark fixture: ``opsbot`` started with a synthetic engine, and every engine's submits recorded.

Not a product backend. ``python bench/opsbot_synthetic.py run`` is ``opsbot run`` with two things
registered first (``bot.engine_factory.register_backend``), for ``bench/e2e_bench.py``:

- ``engine.backend = "synthetic"``: :class:`SyntheticEngine`, which answers every request with
  ``max_tokens`` tokens at a fixed rate (no model runs), so what the opsbot process spends is
  opsbot's own cost: adapters, pipeline, prompts, store, the platform calls;
- when ``OPSBOT_BENCH_RECORD`` names a file, every engine (``synthetic``, ``vllm``, ``openai``,
  ``cpu``) is wrapped in :class:`RecordingEngine`, which notes per request the moment the pipeline
  submitted it (``time.monotonic()``, the clock the fake servers of the bench share with this
  process on Linux), its lane and scenario and the prompt token ids, written as JSON lines at
  shutdown: the bench's event -> engine submit, and the prompts raw vLLM replays.

The synthetic engine's knobs live in ``engine.extra_engine_args``: ``tokens_per_s`` (per request,
default 50), ``ttft_ms`` (time to the first token, default 20), ``tick_s`` (text is handed over in
pieces this often, default 0.05, like an engine's stream interval). Its tokenizer is the model
folder's (``engine.model``; unset: the tiny offline test model), so prompts are built as for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from inference.config import EngineConfig  # noqa: E402
from inference.engine import (  # noqa: E402
    ChatMessage,
    ChatTokenizer,
    Engine,
    EngineHealth,
    EngineStats,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    RequestAbortedError,
    TextDelta,
    WrappedEngine,
)

RECORD_ENV = "OPSBOT_BENCH_RECORD"
"""File the submit records go to (JSON lines, written at shutdown); unset: nothing is recorded."""
_WORDS = ("the", "pod", "restarted", "after", "an", "OOM", "kill;", "memory", "limit", "is", "256Mi,")


class SyntheticEngine(Engine):
    """Emits ``max_tokens`` words per request at ``tokens_per_s``, after ``ttft_ms``; never a model."""

    backend = "synthetic"

    def __init__(self, config: EngineConfig) -> None:
        extra = config.extra_engine_args
        self.config = config
        self.tokens_per_s = float(extra.get("tokens_per_s", 50.0))
        self.ttft_s = float(extra.get("ttft_ms", 20.0)) / 1000
        self.tick_s = float(extra.get("tick_s", 0.05))
        self._tokenizer: ChatTokenizer | None = None
        self._running: dict[str, asyncio.Event] = {}
        self._ready = False

    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        from inference.tokenization import HFChatTokenizer

        self._tokenizer = await asyncio.to_thread(HFChatTokenizer, self.config.require_model())
        self._ready = True

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        t0 = time.perf_counter()
        stop = self._running.setdefault(request.request_id, asyncio.Event())
        total = request.sampling.max_tokens
        sent = 0
        first: float | None = None
        parts: list[str] = []
        try:
            await asyncio.sleep(self.ttft_s)
            while sent < total:
                if stop.is_set():
                    raise RequestAbortedError(f"request {request.request_id} aborted")
                # tokens due by now at the set rate (the first one at TTFT)
                due = 1 + int((time.perf_counter() - t0 - self.ttft_s) * self.tokens_per_s)
                n = min(total, max(due, sent + 1)) - sent
                text = "".join(f" {_WORDS[(sent + i) % len(_WORDS)]}" for i in range(n))
                sent += n
                parts.append(text)
                first = first or time.perf_counter()
                yield TextDelta(text)
                if sent < total:
                    await asyncio.sleep(max(self.tick_s, 1 / self.tokens_per_s))
        finally:
            self._running.pop(request.request_id, None)
        done = time.perf_counter()
        assert first is not None
        prompt = len(request.prompt_token_ids or ())
        yield GenerationResult(
            request_id=request.request_id,
            text="".join(parts).strip(),
            finish_reason="length",
            prompt_tokens=prompt,
            cached_tokens=0,
            output_tokens=sent,
            queue_ms=0.0,
            ttft_ms=(first - t0) * 1000,
            tpot_ms=(done - first) * 1000 / max(sent - 1, 1),
            e2e_ms=(done - t0) * 1000,
        )

    async def abort(self, request_id: str) -> None:
        if request_id in self._running:
            self._running[request_id].set()

    def health(self) -> EngineHealth:
        return EngineHealth(self._ready, "" if self._ready else "not started")

    def stats(self) -> EngineStats:
        return EngineStats(backend="synthetic", model=self.config.model or "", running=len(self._running))

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        self._ready = False

    @property
    def tokenizer(self) -> ChatTokenizer:
        if self._tokenizer is None:
            raise RuntimeError("SyntheticEngine.start() was not called")
        return self._tokenizer


class RecordingEngine(WrappedEngine):
    """Wraps an engine; notes each request's submit time, lane, scenario and prompt ids (in memory,
    a list append per request), and writes them to ``path`` as JSON lines at shutdown, and on
    SIGUSR2 (the bench's capacity sweep reads a rate's submits between rates, while the bot runs)."""

    def __init__(self, inner: Engine, path: Path) -> None:
        super().__init__(inner)
        self.path = path
        self._records: list[tuple[str, float, str, str, int, Sequence[int] | None]] = []
        # The handler runs on the main thread between bytecodes, never beside an append.
        with contextlib.suppress(ValueError):  # not the main thread: no mid-run reads
            signal.signal(signal.SIGUSR2, lambda *_: self.write())

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        self._records.append(
            (
                request.request_id,
                time.monotonic(),
                request.lane.value,
                request.scenario,
                request.sampling.max_tokens,
                request.prompt_token_ids,
            )
        )
        return self.inner.generate(request)

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        try:
            await self.inner.shutdown(drain_timeout_s)
        finally:
            self.write()

    def write(self) -> None:
        """Write every record so far (the file is replaced whole: a reader never sees half)."""
        part = self.path.with_suffix(".part")
        with part.open("w") as out:
            for request_id, at, lane, scenario, max_tokens, ids in self._records:
                row: dict[str, Any] = {
                    "request_id": request_id,
                    "submitted": at,
                    "lane": lane,
                    "scenario": scenario,
                    "max_tokens": max_tokens,
                    "prompt_token_ids": list(ids) if ids is not None else None,
                }
                out.write(json.dumps(row) + "\n")
        part.replace(self.path)

    def __getattr__(self, name: str) -> Any:  # engine-specific extras (startup_s, ...)
        return getattr(self.inner, name)


def _builtin(name: str) -> Callable[[EngineConfig, Callable[[str], None] | None], Engine]:
    def build(config: EngineConfig, on_fatal: Callable[[str], None] | None) -> Engine:
        if name == "vllm":
            from bot.engine_factory import _engine_died
            from inference.vllm_engine import VllmEngine

            return VllmEngine(config, on_dead=functools.partial(_engine_died, "default"), on_fatal=on_fatal)
        if name == "openai":
            from inference.openai_engine import OpenAIEngine

            return OpenAIEngine(config)
        from inference.cpu_engine import CpuEngine

        return CpuEngine(config)

    return build


def register() -> None:
    """Register ``synthetic`` and, with ``OPSBOT_BENCH_RECORD`` set, the recording wrappers."""
    from bot.engine_factory import register_backend

    record = os.environ.get(RECORD_ENV)
    factories: dict[str, Callable[[EngineConfig, Callable[[str], None] | None], Engine]] = {
        "synthetic": lambda config, _fatal: SyntheticEngine(config)
    }
    if record:
        factories.update({name: _builtin(name) for name in ("vllm", "openai", "cpu")})
    for name, factory in factories.items():
        register_backend(name, _recorded(factory, Path(record)) if record else factory)


def _recorded(
    factory: Callable[[EngineConfig, Callable[[str], None] | None], Engine], path: Path
) -> Callable[[EngineConfig, Callable[[str], None] | None], Engine]:
    def build(config: EngineConfig, on_fatal: Callable[[str], None] | None) -> Engine:
        return RecordingEngine(factory(config, on_fatal), path)

    return build


PROFILE_ENV = "OPSBOT_BENCH_PROFILE"
"""File a cProfile of the event loop thread is written to at exit, counted from the first SIGUSR1
(the bench sends it once opsbot is up, so start-up is left out); unset: no profiling. A bot worker
(``workers`` > 1) writes ``FILE.worker-I``."""


def main(argv: Sequence[str] | None = None) -> int:
    """``opsbot`` with the bench's backends registered (profiled with ``OPSBOT_BENCH_PROFILE``)."""
    register()
    from bot.cli import main as opsbot_main

    profile_to = os.environ.get(PROFILE_ENV)
    if not profile_to:
        return opsbot_main(argv)
    from bot.workers import WORKER_ENV

    if os.environ.get(WORKER_ENV):  # "I/N": one file per process
        profile_to += ".worker-" + os.environ[WORKER_ENV].split("/")[0]
    import cProfile
    import signal

    profiler = cProfile.Profile(time.thread_time)  # the event loop thread's CPU time
    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
    try:
        return opsbot_main(argv)
    finally:
        profiler.disable()
        profiler.dump_stats(profile_to)


if __name__ == "__main__":  # AsyncLLM spawns its engine core: the entry point needs this guard
    sys.exit(main())
