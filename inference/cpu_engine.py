"""The CPU engine: a transformers causal LM on torch, decoded token by token in worker threads.

Each request runs its own decode loop (prefill, then one forward per token over a KV cache) in a
worker thread; ``max_concurrency`` workers run at once, so several requests progress together
and none blocks the event loop or another request. Requests waiting for a worker are picked by
lane (urgent first), then in arrival order. Deltas cross from the worker to the event loop with
``loop.call_soon_threadsafe`` into the request's ``asyncio.Queue``.

A failure of the model itself (an exception from a forward pass: a kernel error, out of memory, a
corrupted cache) kills the engine, not just one request: every request in flight fails at once
with :class:`EngineDeadError`, :meth:`health` turns not ready, and the engine reloads the model
(``engine.on_dead = "restart"``, up to ``engine.max_restarts`` times) or calls ``on_fatal`` (the bot
exits non-zero). :meth:`declare_dead` does the same for a watchdog that found the engine hung.
Refusals of one request's input (an empty or too long prompt) stay that request's
:class:`EngineGenerateError`.

There is no batching and no prefix cache: this engine is for development, CI and small models;
production throughput comes from the vLLM engine behind the same interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import inspect
import itertools
import json
import logging
import random
import re
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.bad_words import BadWordSequences
from inference.config import EngineConfig
from inference.context import run_in_request
from inference.engine import (
    ChatMessage,
    Engine,
    EngineDeadError,
    EngineGenerateError,
    EngineHealth,
    EngineStartupError,
    EngineStats,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    Lane,
    RequestAbortedError,
    SamplingSettings,
    TextDelta,
    drain_running,
)
from inference.gguf import find_gguf, is_gguf_ref
from inference.tokenization import HFChatTokenizer

logger = logging.getLogger(__name__)

WORKER_JOIN_S = 30.0
"""Shutdown waits this long for a restart's loading to end, and as long for the worker threads still
computing stopped requests (a torch forward pass over a long prompt cannot be stopped midway),
before it gives up freeing the model."""
_DTYPES = ("auto", "float32", "bfloat16", "float16")
_LAYER_NAME = re.compile(r"(^|\.)(layers|h|blocks)\.\d+$")
"""A transformers model's decoder layers by module name (``model.layers.3``, ``transformer.h.3``)."""
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


# Items a worker posts to a request's queue besides TextDelta / GenerationResult.
@dataclass(frozen=True, slots=True)
class _Failure:
    error: BaseException


@dataclass(eq=False)
class _Request:
    """One request's shared state between its stream (event loop) and its worker thread."""

    request: GenerationRequest
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[TextDelta | GenerationResult | _Failure]
    created: float
    cancel: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    started: float | None = None
    running: bool = False
    finished: bool = False
    kv_tokens: int = 0
    """Positions in the request's KV cache (prompt + generated so far), for ``kv_cache_usage``."""
    failure: EngineGenerateError | EngineDeadError | None = None
    """Set on the event loop by an abort: the stream raises it instead of any queued text."""

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def abort(self, reason: str) -> None:
        """Ask the worker to stop at the next token (thread-safe)."""
        if not self.cancel.is_set():
            self.cancel_reason = reason
            self.cancel.set()

    def post(self, item: TextDelta | GenerationResult | _Failure) -> bool:
        """Hand ``item`` to the event loop (from the worker); False when the loop is gone."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop was closed under us: nobody is listening any more
            self.abort("event loop closed")
            return False
        return True


class CpuEngine(Engine):
    """:class:`~inference.engine.Engine` on transformers + torch (CPU), one worker thread per request."""

    backend = "cpu"
    _label = "CPU engine"
    """How log lines and health reasons name this engine (subclasses share the request machinery)."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        on_dead: Callable[[str], None] | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        """``config`` is the one engine configuration; this engine reads ``model``, ``tokenizer``,
        ``revision``, ``trust_remote_code``, ``dtype``, ``cpu_threads``, ``cpu_max_concurrency``,
        ``seed``, ``max_model_len`` (capped at the model's ``max_position_embeddings``), ``on_dead``
        and ``max_restarts``. ``on_dead(reason)`` is called whenever the engine dies (before any
        restart); ``on_fatal(reason)`` when it will not be restarted (the caller shuts down)."""
        if config.cpu_max_concurrency < 1:
            raise ValueError("cpu_max_concurrency must be at least 1")
        if config.dtype not in _DTYPES:
            raise ValueError(f"dtype {config.dtype!r} is not one of {', '.join(_DTYPES)}")
        self.config = config
        self.model = config.require_model()
        self._model: Any = None
        self._tokenizer: HFChatTokenizer | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._context_len = 0
        self._cache_kwarg = "past_key_values"
        self._forward_extra: dict[str, Any] = {}
        # Fast tokenizers raise "Already borrowed" when two threads encode at once.
        self._render_lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._retired: list[ThreadPoolExecutor] = []
        """Worker pools a restart replaced (their aborted requests may still be computing)."""
        self._computing_at = 0.0
        """``time.monotonic()`` of the latest decoder layer started (:meth:`computing_at`)."""
        self._state = "new"  # new | loading | ready | failed | dead | restarting | stopping | stopped
        self._failure = ""
        self._on_dead = on_dead
        self._on_fatal = on_fatal
        self._restarts = 0
        self._restart_task: asyncio.Task[None] | None = None
        self._warmup: Sequence[ChatMessage] = ()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._waiting: list[tuple[int, int, _Request]] = []  # heap: (lane rank, arrival, request)
        self._arrivals = itertools.count()
        self._seeds = random.Random(config.seed)
        self._idle_waiter: tuple[asyncio.AbstractEventLoop, asyncio.Future[None]] | None = None

    # --- life cycle ------------------------------------------------------------------------------

    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        """Load tokenizer and model in a thread (the event loop keeps running), then warm up.

        There is no prefix cache on CPU, so ``warmup_messages`` only prove that the chat template
        renders them and warm the kernels with one forward pass over them.
        """
        if self._state != "new":
            raise EngineStartupError(f"the {self._label} cannot start twice (it is {self._state})")
        self._state = "loading"
        self._warmup = tuple(warmup_messages)
        self._loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            await asyncio.to_thread(self._load, warmup_messages)
        except EngineStartupError as exc:
            self._state, self._failure = "failed", str(exc)
            raise
        except Exception as exc:
            self._state, self._failure = "failed", f"{type(exc).__name__}: {exc}"
            raise EngineStartupError(f"loading {self.model!r} failed: {type(exc).__name__}: {exc}") from exc
        if self._state != "loading":  # shutdown() was called while the model loaded
            self._model = None
            raise EngineStartupError(f"the {self._label} was shut down while it was starting")
        self._executor = ThreadPoolExecutor(
            self.config.cpu_max_concurrency, thread_name_prefix=f"opsbot-{self.backend}"
        )
        self._state = "ready"
        logger.info("%s ready: %s in %.1f s", self._label, self._describe(), time.perf_counter() - started)

    def _describe(self) -> str:
        """The loaded model and settings, for the ready log line."""
        return (
            f"model={self.model} dtype={self._model.dtype} threads={self.config.cpu_threads or 'default'} "
            f"workers={self.config.cpu_max_concurrency} context={self._context_len}"
        )

    def _load(self, warmup_messages: Sequence[ChatMessage]) -> None:
        import torch

        cfg = self.config
        if cfg.cpu_threads is not None:
            torch.set_num_threads(cfg.cpu_threads)
        # A GGUF model (file, or folder holding one) loads through transformers' gguf_file= path:
        # weights are dequantized to ``dtype``, config and tokenizer come from the file's metadata.
        gguf = find_gguf(self.model, cfg.gguf_file) if is_gguf_ref(self.model, cfg.gguf_file) else None
        gguf_file = gguf.name if gguf is not None else None
        model_dir = gguf.parent if gguf is not None else _local_dir(self.model, "engine.model")
        tok_dir = _local_dir(cfg.tokenizer, "engine.tokenizer") if cfg.tokenizer else model_dir
        tok_gguf = None if cfg.tokenizer else gguf_file
        if gguf is None and model_dir is not None and not (model_dir / "config.json").is_file():
            raise EngineStartupError(
                f"{model_dir} has no config.json, so it is not a transformers model folder. Fix: point "
                "engine.model at the folder that holds config.json and the weights, or build the "
                "offline test model with `opsbot make-test-model DIR --size tiny`"
            )
        if (
            tok_gguf is None
            and tok_dir is not None
            and not any((tok_dir / name).is_file() for name in _TOKENIZER_FILES)
        ):
            raise EngineStartupError(
                f"{tok_dir} holds no tokenizer ({' / '.join(_TOKENIZER_FILES)}). Fix: copy the model's "
                "tokenizer files there, or set engine.tokenizer to the folder or id that has them"
            )
        model_ref = str(model_dir) if model_dir is not None else self.model
        tok_ref = str(tok_dir) if tok_dir is not None else (cfg.tokenizer or self.model)
        logger.info("CPU engine loading config and tokenizer of %s", model_ref)
        hf_config = _load_config(model_ref, cfg, gguf_file)
        try:
            self._tokenizer = HFChatTokenizer(
                tok_ref, trust_remote_code=cfg.trust_remote_code, gguf_file=tok_gguf
            )
        except ValueError as exc:
            raise EngineStartupError(
                f"cannot load the tokenizer of {tok_ref!r}: {_sentence(exc)}. Fix: the folder needs a "
                "tokenizer.json (fast tokenizer), or install the package the error names"
            ) from exc
        logger.info("CPU engine loading weights of %s (dtype %s)", model_ref, cfg.dtype)
        self._model = _load_model(model_ref, hf_config, cfg, gguf_file)
        self._watch_layers(self._model)
        vocab = int(getattr(self._model.config, "vocab_size", 0) or 0)
        if vocab and len(self._tokenizer.hf) > vocab:
            raise EngineStartupError(
                f"the tokenizer has {len(self._tokenizer.hf)} tokens but the model only {vocab}. Fix: use "
                "the tokenizer that belongs to this model (engine.tokenizer)"
            )
        self._eos_ids = frozenset(self._collect_eos_ids())
        # transformers 5.2x renamed forward's ``past_key_values`` to ``cache`` (the old name warns);
        # models with their own code may still take the old one.
        params = inspect.signature(self._model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        # Only the last position's logits are needed: saves a prompt x vocab tensor per prefill.
        self._forward_extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        positions = int(getattr(self._model.config, "max_position_embeddings", 0) or 0)
        limits = [n for n in (cfg.max_model_len, positions) if n]
        self._context_len = min(limits) if limits else 4096
        # Warm-up: the first forward pays one-off allocation and kernel selection costs.
        warmup = [self._tokenizer.hf.bos_token_id or 0]
        if warmup_messages:
            try:
                warmup = self._tokenizer.render(warmup_messages)[: self._context_len]
            except Exception as exc:
                raise EngineStartupError(
                    f"the chat template of {tok_ref!r} cannot render the warm-up prompt: {exc}. Fix: use "
                    "a model whose chat template accepts system and user messages"
                ) from exc
        with torch.inference_mode():
            self._model(input_ids=torch.tensor([warmup]), use_cache=False)

    def _watch_layers(self, model: Any) -> None:
        """Stamp :meth:`computing_at` as each decoder layer starts (a forward pre-hook; transformers
        names them ``...layers.N``, ``h.N`` or ``blocks.N``), or as each forward starts when none is
        found: a long prompt's one forward pass shows the watchdog it is computing, layer by layer."""

        def stamp(_module: Any, _args: Any) -> None:
            self._computing_at = time.monotonic()

        layers = [m for name, m in model.named_modules() if _LAYER_NAME.search(name)]
        for module in layers or [model]:
            module.register_forward_pre_hook(stamp)

    def computing_at(self) -> float | None:
        """When a decoder layer last started computing (see :meth:`_watch_layers`)."""
        return self._computing_at or None

    def _collect_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        assert self._tokenizer is not None
        candidates: list[Any] = [self._tokenizer.eos_token_id, self._model.config.eos_token_id]
        generation_config = getattr(self._model, "generation_config", None)
        if generation_config is not None:
            candidates.append(generation_config.eos_token_id)
        for value in candidates:
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, list | tuple):
                ids.update(int(v) for v in value)
        return ids

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse new requests, let running and waiting ones finish until the deadline, abort the rest."""
        if self._state in ("stopping", "stopped"):
            return
        was = self._state
        self._state = "stopping"
        if self._restart_task is not None:
            # A restart's loading thread cannot be cancelled: let it see "stopping" and end (llama.cpp
            # stops between slots), so no model it loads is left half-made or still being built.
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(self._restart_task), WORKER_JOIN_S)
            self._restart_task.cancel()
        loop = asyncio.get_running_loop()
        idle: asyncio.Future[None] = loop.create_future()
        with self._lock:
            in_flight = len(self._requests)
            if in_flight:
                self._idle_waiter = (loop, idle)
        try:
            await drain_running(self._label, lambda: len(self._requests), lambda: idle, drain_timeout_s)
        finally:
            self._idle_waiter = None
        for req in list(self._requests.values()):
            self._abort_request(req, "the engine shut down")
        if await self._join_workers():
            self._release()
        else:
            # Freeing a model (a llama.cpp context) under a thread still computing in it crashes the
            # process: leave it to the process's exit.
            logger.error(
                "%s: a worker thread is still in the model %.0f s after its request was stopped (hung); "
                "the model is not freed",
                self._label,
                WORKER_JOIN_S,
            )
        self._state = "stopped"
        logger.info("%s stopped (was %s)", self._label, was)

    async def _join_workers(self) -> bool:
        """Wait up to :data:`WORKER_JOIN_S` for every worker thread to end: the current pool's and
        those a restart retired, whose aborted requests may still be computing (an aborted loop stops
        at its next token, llama.cpp at its next graph node). False: one still runs."""
        pools = [pool for pool in (*self._retired, self._executor) if pool is not None]
        self._executor, self._retired = None, []

        def join() -> None:
            for pool in pools:
                pool.shutdown(wait=True, cancel_futures=True)

        try:
            await asyncio.wait_for(asyncio.to_thread(join), WORKER_JOIN_S)
        except TimeoutError:
            return False
        return True

    def _release(self) -> None:
        """Drop the model once no worker runs any more."""
        self._model = None

    def health(self) -> EngineHealth:
        """Ready only between a successful ``start`` and ``shutdown``."""
        reasons = {
            "new": f"the {self._label} is not started",
            "loading": f"loading model {self.model}",
            "failed": f"the {self._label} failed to start: {self._failure}",
            "stopping": f"the {self._label} is shutting down",
            "stopped": f"the {self._label} is shut down",
            "dead": f"the {self._label} died: {self._failure}",
            "restarting": f"the {self._label} is restarting after: {self._failure}",
        }
        if self._state == "ready":
            return EngineHealth(ready=True)
        return EngineHealth(ready=False, reason=reasons[self._state])

    def stats(self) -> EngineStats:
        """Running and waiting requests, in total and by lane, and KV-cache use: positions held by
        running requests over what the workers can hold (``cpu_max_concurrency`` x context window)."""
        running: dict[str, int] = {}
        waiting: dict[str, int] = {}
        kv_tokens = 0
        with self._lock:
            for req in self._requests.values():
                if req.finished:
                    continue
                bucket = running if req.running else waiting
                bucket[req.request.lane.value] = bucket.get(req.request.lane.value, 0) + 1
                if req.running:
                    kv_tokens += req.kv_tokens
        capacity = self.config.cpu_max_concurrency * self._context_len
        return EngineStats(
            backend=self.backend,
            model=self.model,
            running=sum(running.values()),
            waiting=sum(waiting.values()),
            running_by_lane=running,
            waiting_by_lane=waiting,
            kv_cache_usage=min(1.0, kv_tokens / capacity) if capacity else None,
        )

    @property
    def tokenizer(self) -> HFChatTokenizer:
        """The model's tokenizer (available once ``start`` has returned)."""
        if self._tokenizer is None:
            raise EngineDeadError(f"the {self._label} has no tokenizer yet: call start() first")
        return self._tokenizer

    # --- death and restart -----------------------------------------------------------------------

    def declare_dead(self, reason: str) -> bool:
        """The engine is dead (a model failure, or a watchdog found it hung): fail every request in
        flight now with :class:`EngineDeadError`, then restart or give up as configured. Runs on the
        event loop; a second call while dead or restarting does nothing."""
        if self._state != "ready":
            return True
        self._state, self._failure = "dead", reason
        with self._lock:
            doomed = list(self._requests.values())
        logger.error("%s died: %s; %d request(s) in flight fail", self._label, reason, len(doomed))
        for req in doomed:
            req.abort("the engine died")
            if not req.finished and req.failure is None:
                failure = EngineDeadError(f"the model engine stopped while answering ({reason})")
                req.failure = failure
                req.queue.put_nowait(_Failure(failure))
            self._forget(req)
        with self._lock:
            self._waiting.clear()
        if self._on_dead is not None:
            try:
                self._on_dead(reason)
            except Exception:
                logger.exception("on_dead callback failed")
        if self.config.on_dead == "restart" and self._restarts < self.config.max_restarts:
            self._restart_task = asyncio.get_running_loop().create_task(
                self._restart(), name="cpu-engine-restart"
            )
        else:
            why = "engine.on_dead is exit" if self.config.on_dead == "exit" else "no restart left"
            self._give_up(f"{reason} ({why})")
        return True

    def _died_in_worker(self, reason: str) -> None:
        """A worker thread met a model failure: declare the engine dead on the event loop."""
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody to tell
                loop.call_soon_threadsafe(self.declare_dead, reason)

    async def _restart(self) -> None:
        self._restarts += 1
        self._state = "restarting"
        logger.warning(
            "%s restarting (restart %d of %d)", self._label, self._restarts, self.config.max_restarts
        )
        started = time.perf_counter()
        old, self._executor = self._executor, None
        if old is not None:
            # A hung worker cannot be joined; its request is aborted and it ends when it can, holding
            # the old model (not freed under it); shutdown() waits for it like for the current ones.
            old.shutdown(wait=False, cancel_futures=True)
            self._retired.append(old)
        try:
            await asyncio.to_thread(self._load, self._warmup)
        except Exception as exc:
            if self._state != "restarting":  # shut down meanwhile: the load stopped early, no failure
                return
            self._state = "dead"
            self._give_up(f"restart failed: {type(exc).__name__}: {exc}")
            return
        if self._state != "restarting":  # shut down meanwhile
            return
        self._executor = ThreadPoolExecutor(self.config.cpu_max_concurrency, thread_name_prefix="opsbot-cpu")
        self._state = "ready"
        logger.warning("%s restarted in %.1f s", self._label, time.perf_counter() - started)

    def _give_up(self, reason: str) -> None:
        logger.critical("%s is gone: %s", self._label, reason)
        if self._on_fatal is not None:
            self._on_fatal(reason)

    # --- requests --------------------------------------------------------------------------------

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Stream ``request``: text deltas, then one :class:`GenerationResult`.

        Work starts on the first ``__anext__``; ``aclose()``, dropping the iterator or cancelling
        the task that iterates it aborts the request.
        """
        return _Stream(self, request, time.perf_counter())

    async def abort(self, request_id: str) -> None:
        """Stop ``request_id`` at its next token; its stream raises :class:`RequestAbortedError`."""
        req = self._requests.get(request_id)
        if req is not None:
            self._abort_request(req, "aborted")

    def _abort_request(self, req: _Request, reason: str) -> None:
        # Runs on the event loop: the stream learns at once, the worker at its next token.
        req.abort(reason)
        if not req.finished and req.failure is None:
            req.failure = RequestAbortedError(f"request {req.request_id} {reason}")
            req.queue.put_nowait(_Failure(req.failure))  # wakes a reader waiting for text
        self._forget(req)

    def _submit(self, request: GenerationRequest, created: float) -> _Request:
        if self._state != "ready":
            if self._state in ("stopping", "stopped"):
                raise RequestAbortedError(f"request {request.request_id}: the engine is shutting down")
            if self._state in ("dead", "restarting"):
                raise EngineDeadError(
                    f"the model engine is down ({self.health().reason}); try again in a minute"
                )
            raise EngineDeadError(self.health().reason)
        loop = asyncio.get_running_loop()
        req = _Request(request=request, loop=loop, queue=asyncio.Queue(), created=created)
        with self._lock:
            if request.request_id in self._requests:
                raise EngineGenerateError(f"request id {request.request_id!r} is already running")
            self._requests[request.request_id] = req
            heapq.heappush(self._waiting, (_lane_rank(request.lane), next(self._arrivals), req))
        assert self._executor is not None
        # Each submission runs whichever waiting request ranks first, not necessarily this one.
        future = self._executor.submit(self._work_next)
        future.add_done_callback(_log_worker_crash)
        return req

    def _forget(self, req: _Request) -> None:
        """Drop ``req`` from the books (any thread); wakes a draining shutdown when none are left."""
        with self._lock:
            req.finished = True
            if self._requests.get(req.request_id) is req:
                del self._requests[req.request_id]
            waiter = self._idle_waiter if not self._requests else None
        if waiter is not None:
            loop, idle = waiter

            def wake() -> None:
                if not idle.done():
                    idle.set_result(None)

            with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
                loop.call_soon_threadsafe(wake)

    # --- worker thread ---------------------------------------------------------------------------

    def _work_next(self) -> None:
        with self._lock:
            if not self._waiting:
                return
            _, _, req = heapq.heappop(self._waiting)
            req.running = True
        # A worker thread starts outside any request: carry this request's id onto its log lines.
        run_in_request(req.request_id, lambda: self._work_on(req))

    def _work_on(self, req: _Request) -> None:
        try:
            if req.cancel.is_set():
                logger.info(
                    "%s request %s dropped before it ran: %s", self._label, req.request_id, req.cancel_reason
                )
                return
            req.started = time.perf_counter()
            self._decode(req)
        except EngineGenerateError as exc:
            logger.warning("%s request %s refused: %s", self._label, req.request_id, exc)
            req.post(_Failure(exc))
        except Exception as exc:
            # The model itself failed: the engine's state is unknown, so it is dead for everyone.
            logger.exception("%s request %s failed in the model", self._label, req.request_id)
            reason = f"{type(exc).__name__}: {exc}"
            req.post(_Failure(EngineDeadError(f"the model engine stopped while answering ({reason})")))
            self._died_in_worker(reason)
        finally:
            self._forget(req)

    def _decode(self, req: _Request) -> None:
        import torch

        assert self._tokenizer is not None and req.started is not None
        model, tok, request = self._model, self._tokenizer, req.request
        sampling = request.sampling
        if sampling.json_schema is not None:
            # No grammar sampler here: a schema would be a promise this engine cannot keep.
            raise EngineGenerateError(
                "constrained decoding (an output schema, tool calls) needs engine.backend = "
                "'llamacpp', 'vllm' or 'openai'; the transformers CPU engine decodes free text only"
            )
        if request.prompt_token_ids is not None:
            prompt = [int(t) for t in request.prompt_token_ids]
        else:
            assert request.messages is not None
            with self._render_lock:
                prompt = tok.render(request.messages)
        if not prompt:
            raise EngineGenerateError("the prompt is empty")
        if len(prompt) >= self._context_len:
            raise EngineGenerateError(
                f"the prompt has {len(prompt)} tokens but the context window is {self._context_len}"
            )
        budget = max(0, min(sampling.max_tokens, self._context_len - len(prompt)))
        logger.debug(
            "CPU engine request %s: %d prompt tokens, up to %d new, waited %.1f ms for a worker",
            req.request_id,
            len(prompt),
            budget,
            (req.started - req.created) * 1e3,
        )
        seed = sampling.seed if sampling.seed is not None else self._next_seed()
        generator = torch.Generator().manual_seed(seed)
        detok = _IncrementalDetokenizer(tok.hf, sampling.stop)
        output: list[int] = []
        first: float | None = None
        last = req.started
        finish_reason = "length"
        cache_kw, extra = self._cache_kwarg, self._forward_extra
        penalise = sampling.repetition_penalty != 1.0
        bad = BadWordSequences(sampling.bad_words, lambda text: tok.hf.encode(text, add_special_tokens=False))
        with torch.inference_mode():
            seen = torch.tensor(prompt, dtype=torch.long)
            out = model(input_ids=seen.unsqueeze(0), use_cache=True, **extra)
            while len(output) < budget:
                logits = out.logits[0, -1]
                banned = bad.banned(output) if bad else None
                if banned:
                    logits = logits.clone()
                    logits[banned] = -float("inf")
                token = _sample(logits, seen, sampling, generator)
                last = time.perf_counter()
                if first is None:
                    first = last
                output.append(token)
                req.kv_tokens = len(prompt) + len(output)
                if token in self._eos_ids and not sampling.ignore_eos:
                    finish_reason = "stop"
                    break
                delta, stopped = detok.push(token)
                if delta and not req.post(TextDelta(delta)):
                    return
                if stopped:
                    finish_reason = "stop"
                    break
                if req.cancel.is_set():
                    logger.info(
                        "CPU engine request %s stopped after %d tokens: %s",
                        req.request_id,
                        len(output),
                        req.cancel_reason,
                    )
                    return
                if len(output) >= budget:
                    break
                if penalise:
                    seen = torch.cat((seen, torch.tensor([token])))
                cache = out["cache"] if "cache" in out else out["past_key_values"]
                out = model(input_ids=torch.tensor([[token]]), use_cache=True, **{cache_kw: cache}, **extra)
        tail = detok.flush()
        if tail and not req.post(TextDelta(tail)):
            return
        if req.cancel.is_set():
            return
        n = len(output)
        req.post(
            GenerationResult(
                request_id=request.request_id,
                text=detok.text,
                finish_reason=finish_reason,
                prompt_tokens=len(prompt),
                cached_tokens=0,
                output_tokens=n,
                queue_ms=(req.started - req.created) * 1e3,
                ttft_ms=(first - req.created) * 1e3 if first is not None else None,
                tpot_ms=(last - first) * 1e3 / (n - 1) if first is not None and n > 1 else None,
                e2e_ms=(last - req.created) * 1e3,
            )
        )

    def _next_seed(self) -> int:
        with self._lock:
            return self._seeds.getrandbits(63)


class _Stream(AsyncIterator[GenerationEvent]):
    """The async iterator ``CpuEngine.generate`` returns; closing it early aborts the request."""

    def __init__(self, engine: CpuEngine, request: GenerationRequest, created: float) -> None:
        self._engine = engine
        self._request = request
        self._created = created
        self._req: _Request | None = None
        self._closed = False

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> GenerationEvent:
        if self._closed:
            raise StopAsyncIteration
        if self._req is None:
            try:
                self._req = self._engine._submit(self._request, self._created)
            except BaseException:
                self._closed = True
                raise
        try:
            item = await self._req.queue.get()
        except BaseException:  # cancelled (or the loop is going away): nobody reads the rest
            await self.aclose()
            raise
        if isinstance(item, TextDelta) and self._req.failure is None:
            return item
        if self._req.failure is not None and not isinstance(item, GenerationResult):
            # Aborted: text generated before the abort is dropped, the reader learns at once.
            self._closed = True
            raise self._req.failure
        self._closed = True
        if isinstance(item, _Failure):
            raise item.error
        return item

    async def aclose(self) -> None:
        """Abort the request unless it already finished."""
        if self._closed:
            return
        self._closed = True
        if self._req is not None:
            self._engine._abort_request(self._req, "closed by its reader")

    def __del__(self) -> None:
        # Dropped without aclose (e.g. ``break`` out of ``async for``): stop the worker anyway.
        req = getattr(self, "_req", None)
        if req is not None and not getattr(self, "_closed", True):
            req.abort("dropped by its reader")


class _IncrementalDetokenizer:
    """Turns token ids into text deltas without splitting multi-byte characters, and finds stops.

    Decodes a short window (the last emitted token(s) plus the new ones) and emits only what the
    new tokens added, holding back text that ends in an incomplete UTF-8 sequence (U+FFFD) and
    the last few characters that could still become a stop string.
    """

    def __init__(self, hf_tokenizer: Any, stop: Sequence[str]) -> None:
        self._tok = hf_tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._stop = tuple(s for s in stop if s)
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._pending = ""  # decoded but not yet emitted (may hide the start of a stop string)
        self.text = ""  # everything emitted: the final answer equals the concatenated deltas
        self._stopped = False

    def seen(self) -> str:
        """Everything decoded so far, emitted or still held back (it may begin a stop string)."""
        return self.text + self._pending

    def _decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))

    def push(self, token: int) -> tuple[str, bool]:
        """Add ``token``; returns (text safe to emit now, whether a stop string was reached)."""
        self._ids.append(token)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return "", False
        self._pending += full[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        return self._release()

    def _release(self) -> tuple[str, bool]:
        at = self._first_stop(self._pending)
        if at >= 0:
            delta, self._pending, self._stopped = self._pending[:at], "", True
            return self._emit(delta), True
        keep = self._hold
        cut = len(self._pending) - keep if keep else len(self._pending)
        delta = self._pending[: max(cut, 0)]
        self._pending = self._pending[len(delta) :]
        return self._emit(delta), False

    def _emit(self, delta: str) -> str:
        self.text += delta
        return delta

    def flush(self) -> str:
        """Whatever is still held back (also an incomplete character, as U+FFFD)."""
        if self._stopped:
            return ""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        rest = self._pending + full[len(prefix) :]
        self._pending = ""
        self._prefix_offset = self._read_offset = len(self._ids)
        at = self._first_stop(rest)
        return self._emit(rest[:at] if at >= 0 else rest)

    def _first_stop(self, text: str) -> int:
        found = [at for at in (text.find(stop) for stop in self._stop) if at >= 0]
        return min(found, default=-1)


def _sample(logits: Any, seen: Any, sampling: SamplingSettings, generator: Any) -> int:
    """Next token id from the last position's logits (repetition penalty, temperature, top-p)."""
    import torch

    logits = logits.float()
    if sampling.repetition_penalty != 1.0:
        # HF / vLLM convention: shrink positive and grow negative scores of tokens already seen.
        ids = torch.unique(seen)
        scores = logits[ids]
        penalty = sampling.repetition_penalty
        logits[ids] = torch.where(scores > 0, scores / penalty, scores * penalty)
    if sampling.temperature < 1e-5:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if 0.0 < sampling.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > sampling.top_p
        sorted_probs[outside] = 0.0
        token = order[torch.multinomial(sorted_probs, 1, generator=generator)]
        return int(token)
    return int(torch.multinomial(probs, 1, generator=generator))


def _lane_rank(lane: Lane) -> int:
    return lane.vllm_priority


def _log_worker_crash(future: Future[None]) -> None:
    exc = future.exception() if not future.cancelled() else None
    if exc is not None:
        logger.error("CPU engine worker crashed: %r", exc)


def _local_dir(ref: str, key: str) -> Path | None:
    """The folder ``ref`` names, None for a hub id; EngineStartupError for a missing folder."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise EngineStartupError(f"{key} {ref!r} is a file; it must be a model folder or a Hugging Face id")
    # "org/name" may be a hub id; anything else that looks like a path is a missing folder.
    looks_like_path = ref.startswith(("/", ".", "~")) or ref.count("/") > 1 or "\\" in ref
    if looks_like_path:
        raise EngineStartupError(
            f"{key} folder {ref!r} does not exist. Fix: set {key} to a folder with config.json, weights "
            "and tokenizer, or to a Hugging Face id; `opsbot make-test-model DIR --size tiny` builds an "
            "offline test model"
        )
    return None


def _gguf_kwargs(gguf_file: str | None) -> dict[str, str]:
    """``gguf_file=`` for transformers' loaders when the model is a GGUF file (it needs ``gguf``)."""
    if gguf_file is None:
        return {}
    import importlib.util

    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise EngineStartupError(
            f"loading the GGUF file {gguf_file} with transformers needs the package(s) "
            f"{', '.join(missing)}. Fix: pip install 'opsbot[cpu]', or use engine.backend = \"llamacpp\""
        )
    return {"gguf_file": gguf_file}


def _load_config(model_ref: str, cfg: EngineConfig, gguf_file: str | None = None) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            model_ref,
            revision=cfg.revision,
            trust_remote_code=cfg.trust_remote_code,
            **_gguf_kwargs(gguf_file),
        )
    except OSError as exc:
        raise EngineStartupError(
            f"cannot load the config of {model_ref!r}: {_sentence(exc)}. Fix: check the Hugging Face id "
            "(and network or HF_HOME cache), or point engine.model at a local model folder"
        ) from exc
    except (ValueError, KeyError) as exc:
        model_type = _model_type(model_ref)
        raise EngineStartupError(
            f"transformers does not know the model type {model_type!r} of {model_ref!r} ({exc}). Fix: "
            "upgrade transformers, or set engine.trust_remote_code=true if the model ships its own code"
        ) from exc


def _load_model(model_ref: str, hf_config: Any, cfg: EngineConfig, gguf_file: str | None = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    # float32 for "auto": bf16 / fp16 matmuls are slow (or missing) on most CPUs without AMX.
    dtype = torch.float32 if cfg.dtype == "auto" else getattr(torch, cfg.dtype)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_ref,
            config=hf_config,
            revision=cfg.revision,
            trust_remote_code=cfg.trust_remote_code,
            dtype=dtype,
            **_gguf_kwargs(gguf_file),
        )
    except ValueError as exc:
        if "Unrecognized configuration class" not in str(exc):
            raise
        model_type = getattr(hf_config, "model_type", "?")
        architectures = ", ".join(getattr(hf_config, "architectures", None) or [])
        kind = f"{model_type!r} model ({architectures})" if architectures else f"{model_type!r} model"
        raise EngineStartupError(
            f"{model_ref!r} is a {kind}, which is not a causal "
            "(decoder-only) language model transformers can run here. Fix: use a causal LM "
            "(Llama, Mistral, Qwen, Phi, ...) with a chat template"
        ) from exc
    except OSError as exc:
        raise EngineStartupError(
            f"cannot load the weights of {model_ref!r}: {_sentence(exc)}. Fix: the folder needs weights "
            "(*.safetensors or pytorch_model*.bin) next to config.json"
        ) from exc
    model.eval()  # type: ignore[no-untyped-call]
    return model


def _sentence(exc: BaseException) -> str:
    """An upstream error message on one line, without its final full stop (ours follows)."""
    return " ".join(str(exc).split()).rstrip(". ")


def _model_type(model_ref: str) -> str:
    try:
        raw = json.loads((Path(model_ref) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "?"
    return str(raw.get("model_type", "?")) if isinstance(raw, dict) else "?"


__all__ = ["CpuEngine"]
