"""The GPU engine: vLLM's ``AsyncLLM`` in the bot's own process.

vLLM is imported here only, and only inside methods, so the CPU install never needs it.

What this adds on top of ``AsyncLLM``:

- **Startup that explains itself.** Model folder, ``config.json``, tokenizer, CUDA, free GPU
  memory, quantization and architecture are checked before vLLM starts; vLLM's own failures are
  translated afterwards. Every failure is an :class:`EngineStartupError` naming cause and fix.
  Progress is logged while vLLM loads and compiles, and the duration at the end.
- **Token ids in, deltas out.** Prompts are rendered by :class:`HFChatTokenizer` (the same ids the
  bot counts for its budget) and sent as ``TokensPrompt``; output is ``RequestOutputKind.DELTA``.
- **A warm prefix cache.** ``start(warmup_messages)`` runs the shared system prompt once, so every
  later request finds its KV blocks cached (``cached_tokens`` in each result shows it).
- **Failure semantics.** A consumer that goes away (``aclose``, cancellation, the admission
  layer's request deadline) aborts the request in vLLM; a per-request error fails only that
  request; a dead engine flips
  :meth:`health`, fails every waiting request with :class:`EngineDeadError`, then restarts
  in-process or calls ``on_fatal`` (default: exit the process with :data:`EXIT_ENGINE_DEAD`).
- **Stats** from a custom ``StatLoggerBase`` (KV-cache usage, running / waiting, prefix-cache hit
  rate, preemptions); with ``log_stats`` vLLM's own ``vllm:*`` Prometheus metrics are registered in
  the default registry as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import tempfile
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from inference.config import EngineConfig
from inference.engine import (
    ChatMessage,
    ChatTokenizer,
    Engine,
    EngineDeadError,
    EngineGenerateError,
    EngineHealth,
    EngineStartupError,
    EngineStats,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    RequestAbortedError,
    SamplingSettings,
    TextDelta,
    drain_running,
)
from inference.quant import QuantizationError, QuantizationInfo, check_gpu_support, resolve_quantization
from inference.tokenization import HFChatTokenizer

if TYPE_CHECKING:  # vLLM is imported lazily at run time; these names only type the calls
    from vllm import SamplingParams
    from vllm.v1.engine.async_llm import AsyncLLM

logger = logging.getLogger(__name__)

EXIT_ENGINE_DEAD = 70
"""Process exit status when the engine died and no restart is left (EX_SOFTWARE)."""

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_GIB = 1024**3


_VLLM_LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"opsbot": {"format": "%(asctime)s %(levelname)-7s %(name)s: %(message)s"}},
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "formatter": "opsbot", "stream": "ext://sys.stderr"}
    },
    "loggers": {"vllm": {"handlers": ["stderr"], "level": "INFO", "propagate": False}},
}


def structured_outputs(s: SamplingSettings) -> Any:
    """vLLM's constraint for ``s.json_schema`` (its ``StructuredOutputsParams``: xgrammar or guidance
    as the engine's ``structured_outputs_config`` picks), or ``None`` for free text."""
    if s.json_schema is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams(json=json.loads(s.json_schema))


def route_vllm_logging() -> None:
    """Keep vLLM's log lines off stdout (where ``opsbot chat`` prints the answer).

    vLLM's default logging config writes to stdout. Unless the user configured vLLM's logging
    themselves, point ``VLLM_LOGGING_CONFIG_PATH`` at a config that writes to stderr: the engine
    core's child processes read it at import. In this process :func:`adopt_vllm_logger` then hands
    the ``vllm`` logger to opsbot's own handler (redaction, request ids, JSON).
    """
    if "VLLM_LOGGING_CONFIG_PATH" in os.environ or os.environ.get("VLLM_CONFIGURE_LOGGING") == "0":
        return
    fd, path = tempfile.mkstemp(prefix="opsbot-vllm-logging-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(_VLLM_LOGGING, out)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = path


def adopt_vllm_logger() -> None:
    """In this process, send the ``vllm`` logger's lines through the root (opsbot's) handler."""
    vllm_logger = logging.getLogger("vllm")
    if logging.getLogger().handlers:  # opsbot configured logging (bot.logs.setup_logging)
        for handler in list(vllm_logger.handlers):
            vllm_logger.removeHandler(handler)
        vllm_logger.propagate = True


async def warm_incident_shapes(
    llm: AsyncLLM, system_ids: list[int], config: EngineConfig, vocab_size: int
) -> float:
    """Run one synthetic incident through ``llm`` before the first real one: a full batch of answers
    decoding while new prompts prefill in chunks beside them, then a few short urgent ones; returns
    the seconds it took. The benchmark warms raw vLLM with this same function.

    Why: the first mixed prefill + decode steps at full batch after a start pay one-off costs
    (kernel selection and JIT, graph and allocator warm-up) that the system-prompt warm-up never
    reaches; on the H200 they made the first urgent-under-load episode after a start several times
    slower than later ones. Prompts are random token ids behind the shared system prompt (as real
    prompts are), so the prefix-cache path runs too.
    """
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    t0 = time.perf_counter()
    low = min(100, vocab_size // 2)  # skip the special tokens at the start of most vocabularies
    rng = random.Random(config.seed)
    room = max(16, config.max_model_len - len(system_ids) - 64)

    def prompt(n: int) -> Any:
        user = [rng.randrange(low, vocab_size) for _ in range(min(n, room))]
        return TokensPrompt(prompt_token_ids=system_ids + user)

    def params(n: int, sampled: bool) -> SamplingParams:
        # Both sampling paths, mixed in one batch as real traffic mixes them: greedy (batch
        # analysis, evals) and temperature + top-p + repetition penalty (every chat scenario). vLLM
        # JIT-compiles its top-k/top-p Triton kernel the first time a large batch needs it: on the
        # H200 that stalled every request in flight for 1-3 s when urgent questions met a greedy
        # batch after a greedy-only warm-up (bench/results/batch_bench-2026-12-01-h200.md).
        sampling: dict[str, Any] = {"temperature": 0.0}
        if sampled:
            sampling = {"temperature": 0.3, "top_p": 0.95, "repetition_penalty": 1.05}
        return SamplingParams(max_tokens=n, ignore_eos=True, output_kind=RequestOutputKind.DELTA, **sampling)

    by_priority = config.scheduling_policy == "priority"

    async def one(tag: str, n_prompt: int, n_out: int, priority: int, sampled: bool) -> None:
        rid = f"opsbot-warmup-{tag}-{uuid.uuid4().hex[:6]}"
        async for _ in llm.generate(
            prompt(n_prompt), params(n_out, sampled), rid, priority=priority if by_priority else 0
        ):
            pass

    busy = max(1, config.max_num_seqs - 8)
    background = [asyncio.create_task(one(f"bg{i}", 256, 48, 10, i % 2 == 0)) for i in range(busy)]
    await asyncio.sleep(0.05)  # let the batch start decoding, then prefill beside it
    await asyncio.gather(
        *(one(f"long{i}", 2048, 8, 5, True) for i in range(2)),
        *(one(f"urgent{i}", 96, 16, 0, i % 2 == 0) for i in range(8)),
    )
    await asyncio.gather(*background)
    elapsed = time.perf_counter() - t0
    logger.info(
        "vLLM engine: incident-shaped warm-up (%d decoding + 10 prefilling) done in %.0f ms",
        busy,
        elapsed * 1e3,
    )
    return elapsed


def is_local_model(model: str) -> bool:
    """Whether ``model`` names a folder (existing, or written like a path) rather than a hub id."""
    return Path(model).expanduser().exists() or model.startswith(("/", ".", "~"))


def engine_args_kwargs(config: EngineConfig, quantization: str | None = None) -> dict[str, Any]:
    """``AsyncEngineArgs`` keyword arguments for ``config`` (the benchmark builds raw vLLM from it too)."""
    model = config.require_model()
    # Absolute: vLLM's compile-cache key includes the path as written.
    model = str(Path(model).expanduser().resolve()) if is_local_model(model) else model
    kwargs: dict[str, Any] = {
        "model": model,
        "tokenizer": config.tokenizer,
        "revision": config.revision,
        "trust_remote_code": config.trust_remote_code,
        "dtype": config.dtype,
        "quantization": quantization,
        "kv_cache_dtype": config.kv_cache_dtype,
        "load_format": config.load_format,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "max_model_len": config.max_model_len,
        "max_num_seqs": config.max_num_seqs,
        "block_size": config.block_size,
        "enable_prefix_caching": config.enable_prefix_caching,
        "tensor_parallel_size": config.tensor_parallel_size,
        "enforce_eager": config.enforce_eager,
        "seed": config.seed,
        "scheduling_policy": config.scheduling_policy,
        "disable_log_stats": not config.log_stats,
        "stream_interval": config.stream_interval,
    }
    if config.max_num_batched_tokens is not None:
        kwargs["max_num_batched_tokens"] = config.max_num_batched_tokens
    if config.compilation_level is not None:
        kwargs["compilation_config"] = {"mode": config.compilation_level}
    outputs = structured_outputs_config()
    if outputs is not None:
        kwargs["structured_outputs_config"] = outputs
    kwargs.update(config.extra_engine_args)
    return kwargs


def structured_outputs_config() -> Any:
    """vLLM's ``StructuredOutputsConfig`` for opsbot's constrained outputs (tool calls, root-cause
    blocks): xgrammar with no whitespace between JSON tokens. vLLM's default lets JSON have any
    whitespace, and on the H100 (2026-12-06, dummy 8B) every decision and block was spaces until its
    token budget cut it: the schema's token ceiling (``inference.structured``) holds only when each
    token writes a character of the JSON. vLLM 0.26 reads this per engine, not per request, and only
    for an explicit backend. ``None`` where vLLM is not installed (nothing uses the arguments then)."""
    try:
        from vllm.config import StructuredOutputsConfig
    except ImportError:
        return None
    return StructuredOutputsConfig(backend="xgrammar", disable_any_whitespace=True)


def sampling_params(
    s: SamplingSettings, prompt_len: int, max_model_len: int, *, stream: bool
) -> SamplingParams:
    """vLLM's sampling parameters for ``s`` (the one place they are built, online and offline):
    the answer's token limit shrinks to the room the context window leaves after the prompt.
    ``stream`` asks for deltas as they decode (the online engine); otherwise the finished output
    only (the offline batch). Raises :class:`EngineGenerateError` when the prompt leaves no room."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    room = max_model_len - prompt_len
    if room <= 0:
        raise EngineGenerateError(
            f"the prompt is {prompt_len} tokens and the context window is {max_model_len}; "
            "shorten the question or the context"
        )
    return SamplingParams(
        temperature=s.temperature,
        top_p=s.top_p,
        max_tokens=min(s.max_tokens, room),
        repetition_penalty=s.repetition_penalty,
        seed=s.seed,
        stop=list(s.stop) or None,
        bad_words=list(s.bad_words) or None,
        ignore_eos=s.ignore_eos,
        output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        structured_outputs=structured_outputs(s),
    )


class _StatsSink:
    """Figures the stat logger receives from vLLM's output loop (same event loop as the bot)."""

    def __init__(self) -> None:
        self.running = 0
        self.waiting = 0
        self.kv_cache_usage: float | None = None
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.preemptions = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.running = int(scheduler_stats.num_running_reqs)
            self.waiting = int(scheduler_stats.num_waiting_reqs)
            self.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
            prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
            if prefix is not None and not getattr(prefix, "reset", False):
                self.prefix_queries += int(prefix.queries)
                self.prefix_hits += int(prefix.hits)
        if iteration_stats is not None:
            self.preemptions += int(getattr(iteration_stats, "num_preempted_reqs", 0))

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else None


def _stat_logger_factory(sink: _StatsSink) -> Any:
    """A ``StatLoggerBase`` subclass feeding ``sink`` (vLLM calls it as ``factory(vllm_config, idx)``)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class OpsbotStatLogger(StatLoggerBase):  # type: ignore[misc]
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            sink.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            return None

    return OpsbotStatLogger


class _Heartbeat:
    """Logs every ``every_s`` while a long step runs; a thread, so a blocked loop cannot stop it."""

    def __init__(self, what: str, every_s: float = 15.0) -> None:
        self._what = what
        self._every_s = every_s
        self._stop = threading.Event()
        self._start = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="opsbot-engine-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            logger.info("%s: %.0f s so far", self._what, time.perf_counter() - self._start)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


def _startup_error(exc: BaseException, config: EngineConfig) -> EngineStartupError:
    """Translate what vLLM raised while starting into cause + fix."""
    text = f"{type(exc).__name__}: {exc}"
    low = text.lower()
    if any(
        key in low
        for key in (
            "out of memory",
            "outofmemory",
            "no available memory for the cache blocks",
            "kv cache is needed",
            "free memory on device",
            "larger than the available kv cache",
        )
    ):
        return EngineStartupError(
            f"not enough GPU memory for {config.model} ({text}). Fix: lower engine.max_model_len or "
            "engine.max_num_seqs, raise engine.gpu_memory_utilization, use a quantized model "
            "(engine.quantization=fp8), or free the GPU (nvidia-smi shows who holds it)"
        )
    if "architecture" in low and ("not supported" in low or "are not supported" in low):
        return EngineStartupError(
            f"vLLM does not support this model's architecture ({text}). Fix: use a model whose "
            "config.json 'architectures' vLLM lists, or engine.backend=cpu"
        )
    if "quantiz" in low:
        return EngineStartupError(
            f"vLLM cannot load the model with quantization {config.quantization or 'as detected'} "
            f"({text}). Fix: unset engine.quantization so the checkpoint's format is used, or use a "
            "checkpoint in a format this GPU supports"
        )
    if "engine core initialization failed" in low:
        return EngineStartupError(
            f"the vLLM engine process failed while starting ({text}). The lines logged above by "
            "EngineCore name the root cause (often GPU memory, a CUDA error or an unsupported "
            "model). Fix: correct that cause; engine.enforce_eager=true rules out compilation issues"
        )
    return EngineStartupError(f"vLLM could not start {config.model}: {text}")


class VllmEngine(Engine):
    """:class:`Engine` on vLLM's ``AsyncLLM`` (see the module doc)."""

    backend = "vllm"

    def __init__(
        self,
        config: EngineConfig,
        *,
        on_dead: Callable[[str], None] | None = None,
        on_fatal: Callable[[str], None] | None = None,
        start_in_thread: bool = True,
    ) -> None:
        """``on_dead(reason)`` is called whenever the engine dies (before any restart);
        ``on_fatal(reason)`` when no restart is left or ``config.on_dead`` is ``exit``: the bot
        should shut down and exit non-zero. Without ``on_fatal`` the process exits with
        :data:`EXIT_ENGINE_DEAD`. ``start_in_thread`` builds ``AsyncLLM`` (tens of seconds) in a
        worker thread so the event loop keeps serving health checks and chat acks meanwhile."""
        self.config = config
        self.model = config.require_model()
        route_vllm_logging()
        self._on_dead_hook = on_dead
        self._on_fatal = on_fatal
        self._start_in_thread = start_in_thread
        self._llm: AsyncLLM | None = None
        self._tokenizer: HFChatTokenizer | None = None
        self._state: Literal["new", "starting", "ready", "dead", "restarting", "stopping", "stopped"] = "new"
        self._reason = "not started"
        self._sink = _StatsSink()
        self._active: dict[str, float] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._restarts = 0
        self._watchdog: asyncio.Task[None] | None = None
        self._restart_task: asyncio.Task[None] | None = None
        self._warmup: tuple[ChatMessage, ...] = ()
        self.quantization: QuantizationInfo | None = None
        self.startup_s: float | None = None
        """Seconds the last start took (checks + vLLM + warm-up)."""
        self.warmup_prompt_tokens = 0
        """Tokens of the warm-up prompt (the shared system prompt) placed in the prefix cache."""
        self._quant_arg: str | None = None

    # --- startup -------------------------------------------------------------------------------

    def _precheck(self) -> str | None:
        """Everything that can be checked before vLLM starts; returns the quantization to pass."""
        cfg = self.config
        if is_local_model(self.model):
            folder = Path(self.model).expanduser()
            if not folder.is_dir():
                raise EngineStartupError(
                    f"model folder {folder} does not exist. Fix: set engine.model to a folder with "
                    "config.json, the weights and the tokenizer (or a Hugging Face id)"
                )
            config_file = folder / "config.json"
            if not config_file.is_file():
                raise EngineStartupError(
                    f"{folder} has no config.json. Fix: copy the checkpoint's config.json into it, or "
                    "point engine.model at the folder that has it"
                )
            try:
                model_config = json.loads(config_file.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise EngineStartupError(f"{config_file} is not valid JSON ({exc}). Fix: repair it") from exc
            tok_folder = Path(cfg.tokenizer).expanduser() if cfg.tokenizer else folder
            if tok_folder.is_dir() and not any((tok_folder / f).is_file() for f in _TOKENIZER_FILES):
                raise EngineStartupError(
                    f"no tokenizer in {tok_folder} (none of {', '.join(_TOKENIZER_FILES)}). Fix: copy the "
                    "tokenizer files next to config.json, or set engine.tokenizer"
                )
        else:
            model_config = {}
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - the vllm extra brings torch
            raise EngineStartupError(
                f"torch is not installed ({exc}). Fix: pip install 'opsbot[vllm]'"
            ) from exc
        if not torch.cuda.is_available():
            raise EngineStartupError(
                "no CUDA GPU is visible to this process (torch.cuda.is_available() is False). Fix: run "
                "on a machine with an NVIDIA GPU and driver (check nvidia-smi and CUDA_VISIBLE_DEVICES), "
                "or set engine.backend=cpu"
            )
        if torch.cuda.device_count() < cfg.tensor_parallel_size:
            raise EngineStartupError(
                f"engine.tensor_parallel_size is {cfg.tensor_parallel_size} but only "
                f"{torch.cuda.device_count()} GPU(s) are visible. Fix: lower tensor_parallel_size"
            )
        try:
            info = resolve_quantization(self.model, cfg.quantization)
        except QuantizationError as exc:
            raise EngineStartupError(str(exc)) from exc
        self.quantization = info
        logger.info("quantization: %s", info.describe())
        gpus = self._gpu_facts(cfg.tensor_parallel_size)
        if gpus:
            capability = min(g["capability"] for g in gpus)
            problem = check_gpu_support(info, capability)
            if problem:
                raise EngineStartupError(problem)
            for g in gpus:
                want = cfg.gpu_memory_utilization * g["total"]
                if g["free"] < want:
                    fits = max(0.05, g["free"] / g["total"] - 0.02)
                    raise EngineStartupError(
                        f"GPU {g['index']} has {g['free'] / _GIB:.1f} GiB free "
                        f"of {g['total'] / _GIB:.1f} GiB; "
                        f"engine.gpu_memory_utilization={cfg.gpu_memory_utilization} needs "
                        f"{want / _GIB:.1f} GiB. Fix: stop what else uses the GPU (nvidia-smi), or set "
                        f"engine.gpu_memory_utilization to {fits:.2f} or less"
                    )
            weights = _estimate_weight_bytes(model_config, info)
            budget = cfg.gpu_memory_utilization * sum(g["total"] for g in gpus)
            if weights is not None and weights > 0.95 * budget:
                raise EngineStartupError(
                    f"the weights of {self.model} need about {weights / _GIB:.1f} GiB, more than the "
                    f"{budget / _GIB:.1f} GiB vLLM may use. Fix: use a quantized model (engine.quantization"
                    "=fp8, or an AWQ/GPTQ checkpoint), raise engine.tensor_parallel_size, or raise "
                    "engine.gpu_memory_utilization"
                )
        archs = model_config.get("architectures") or []
        if archs and not cfg.trust_remote_code:
            from vllm import ModelRegistry

            supported = set(ModelRegistry.get_supported_archs())
            if not any(a in supported for a in archs):
                raise EngineStartupError(
                    f"vLLM does not support the architecture {', '.join(archs)} of {self.model}. Fix: use a "
                    "model vLLM supports (docs.vllm.ai 'Supported Models'), set engine.trust_remote_code "
                    "if the checkpoint ships its own vLLM-compatible code, or engine.backend=cpu"
                )
        if info.online or info.source == "unknown":
            return info.method
        return cfg.quantization  # None lets vLLM read the checkpoint's own metadata

    @staticmethod
    def _gpu_facts(count: int) -> list[dict[str, Any]]:
        """Free / total memory and capability per GPU via NVML (creates no CUDA context here)."""
        try:
            from vllm.utils.import_utils import import_pynvml

            nvml = import_pynvml()
            nvml.nvmlInit()
        except Exception as exc:  # NVML missing: vLLM will check memory itself
            logger.warning("cannot query the GPU through NVML (%s); skipping the memory pre-check", exc)
            return []
        try:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            indexes = [int(x) for x in visible.split(",")[:count]] if visible else list(range(count))
            facts = []
            for index in indexes:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
                facts.append(
                    {
                        "index": index,
                        "free": int(mem.free),
                        "total": int(mem.total),
                        "capability": (major, minor),
                    }
                )
            return facts
        except Exception as exc:  # e.g. UUIDs in CUDA_VISIBLE_DEVICES
            logger.warning("GPU pre-check skipped (%s)", exc)
            return []
        finally:
            with contextlib.suppress(Exception):
                nvml.nvmlShutdown()

    def _build_llm(self, quantization: str | None) -> AsyncLLM:
        # The pre-checks touched CUDA in this process; a forked engine core could not use it.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(**engine_args_kwargs(self.config, quantization))
        adopt_vllm_logger()
        return AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(self._sink)])

    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        """Check, start vLLM, warm the prefix cache; :class:`EngineStartupError` on failure."""
        if self._state not in ("new", "stopped"):
            raise EngineStartupError(f"the engine is already {self._state}")
        if warmup_messages:
            self._warmup = tuple(warmup_messages)
        self._state = "starting"
        self._reason = "starting"
        t0 = time.perf_counter()
        logger.info("vLLM engine: checking %s", self.model)
        try:
            quantization = await asyncio.to_thread(self._precheck)
            self._quant_arg = quantization
            self._tokenizer = await asyncio.to_thread(
                HFChatTokenizer,
                self.config.tokenizer or str(Path(self.model).expanduser()),
                trust_remote_code=self.config.trust_remote_code,
            )
            await self._start_llm()
        except BaseException:
            self._state = "stopped"
            self._reason = "start failed"
            raise
        self.startup_s = time.perf_counter() - t0
        self._watchdog = asyncio.create_task(self._watch(), name="vllm-engine-watchdog")
        logger.info(
            "vLLM engine ready in %.1f s (model %s, %s, %d warm-up prompt tokens cached)",
            self.startup_s,
            self.model,
            self.quantization.describe() if self.quantization else "quantization unknown",
            self.warmup_prompt_tokens,
        )

    async def _start_llm(self) -> None:
        """Build ``AsyncLLM`` and warm up; leaves the engine ready."""
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        t0 = time.perf_counter()
        logger.info(
            "vLLM engine: starting (weights, torch.compile, CUDA graphs, KV-cache sizing; first start "
            "on a machine compiles for minutes, later ones hit the compile cache)"
        )
        try:
            with _Heartbeat("vLLM engine still starting"):
                if self._start_in_thread:
                    self._llm = await asyncio.to_thread(self._build_llm, self._quant_arg)
                else:
                    self._llm = self._build_llm(self._quant_arg)
        except EngineStartupError:
            raise
        except Exception as exc:
            raise _startup_error(exc, self.config) from exc
        logger.info("vLLM engine: AsyncLLM up in %.1f s; warming up", time.perf_counter() - t0)
        t1 = time.perf_counter()
        assert self._tokenizer is not None
        if self._warmup:
            ids = self._tokenizer.render(self._warmup, add_generation_prompt=False)
        else:
            ids = self._tokenizer.render([ChatMessage("user", "ping")])
        self.warmup_prompt_tokens = len(ids) if self._warmup else 0
        params = SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.DELTA)
        llm = self._llm
        assert llm is not None
        try:
            async for _ in llm.generate(TokensPrompt(prompt_token_ids=ids), params, "opsbot-warmup"):
                pass
        except Exception as exc:
            self._state = "stopped"
            with contextlib.suppress(Exception):
                await asyncio.to_thread(llm.shutdown)
            raise _startup_error(exc, self.config) from exc
        logger.info(
            "vLLM engine: warm-up done in %.0f ms (%d prompt tokens)",
            (time.perf_counter() - t1) * 1e3,
            len(ids),
        )
        if self.config.incident_warmup:
            await self._warm_incident_shapes(llm, ids)
        self._state = "ready"
        self._reason = ""

    async def _warm_incident_shapes(self, llm: AsyncLLM, system_ids: list[int]) -> None:
        assert self._tokenizer is not None
        await warm_incident_shapes(llm, system_ids, self.config, vocab_size=len(self._tokenizer.hf))

    # --- requests ------------------------------------------------------------------------------

    def _check_ready(self) -> AsyncLLM:
        if self._state == "ready" and self._llm is not None:
            return self._llm
        if self._state in ("dead", "restarting"):
            raise EngineDeadError(f"the model engine is down ({self._reason}); try again in a minute")
        if self._state in ("stopping", "stopped"):
            raise RequestAbortedError("the model engine is shutting down")
        raise EngineGenerateError(f"the model engine is not ready ({self._state})")

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Stream ``request`` (see :meth:`Engine.generate`). The first delta may be empty: it marks the
        first token (admission control uses it to end the request's prefill phase)."""
        from vllm import TokensPrompt
        from vllm.v1.engine.exceptions import EngineDeadError as VllmDeadError
        from vllm.v1.engine.exceptions import EngineGenerateError as VllmGenerateError

        t0 = time.perf_counter()
        llm = self._check_ready()
        assert self._tokenizer is not None
        rid = request.request_id
        if request.prompt_token_ids is not None:
            ids = [int(i) for i in request.prompt_token_ids]
        else:
            assert request.messages is not None
            ids = self._tokenizer.render(request.messages)
        params = sampling_params(request.sampling, len(ids), self.config.max_model_len, stream=True)
        priority = request.lane.vllm_priority if self.config.scheduling_policy == "priority" else 0
        prompt = TokensPrompt(prompt_token_ids=ids)
        self._active[rid] = t0
        self._idle.clear()
        t_submit = time.perf_counter()
        stream = llm.generate(prompt, params, rid, priority=priority)
        pieces: list[str] = []
        first: float | None = None
        n_out = 0
        cached = 0
        finish: str | None = None
        metrics: Any = None
        finished = False
        try:
            async for out in stream:
                if out.num_cached_tokens is not None:
                    cached = int(out.num_cached_tokens)
                if out.metrics is not None:
                    metrics = out.metrics
                completion = out.outputs[0] if out.outputs else None
                if completion is not None:
                    new_tokens = len(completion.token_ids)
                    n_out += new_tokens
                    if completion.finish_reason is not None:
                        finish = str(completion.finish_reason)
                    is_first = first is None and new_tokens > 0
                    if is_first:
                        first = time.perf_counter()
                    if completion.text or is_first:
                        pieces.append(completion.text)
                        yield TextDelta(completion.text)
                if out.finished:
                    finished = True
                    break
        except Exception as exc:
            if isinstance(exc, VllmDeadError):
                self._engine_died(f"{type(exc).__name__}: {exc}")
                raise EngineDeadError(
                    f"the model engine stopped while answering ({self._reason}); try again in a minute"
                ) from exc
            if isinstance(exc, VllmGenerateError | ValueError):
                cause = exc.__cause__ or exc
                logger.warning("the request failed in vLLM: %s: %s", type(cause).__name__, cause)
                raise EngineGenerateError(f"the model engine could not answer: {cause}") from exc
            raise
        finally:
            if not finished:
                # Consumer gone, deadline or error: closing vLLM's generator aborts the request there.
                with contextlib.suppress(Exception):
                    await stream.aclose()
            self._active.pop(rid, None)
            if not self._active:
                self._idle.set()
        if finish == "abort":
            raise RequestAbortedError(f"request {rid} was aborted")
        if not finished:
            raise EngineGenerateError(f"request {rid} ended without a final output")
        t_end = time.perf_counter()
        yield self._result(
            rid,
            "".join(pieces),
            finish or "stop",
            len(ids),
            cached,
            n_out,
            t0,
            t_submit,
            first,
            t_end,
            metrics,
        )

    @staticmethod
    def _result(
        rid: str,
        text: str,
        finish: str,
        prompt_tokens: int,
        cached: int,
        n_out: int,
        t0: float,
        t_submit: float,
        first: float | None,
        t_end: float,
        metrics: Any,
    ) -> GenerationResult:
        # TTFT / e2e are what the caller saw; queue and TPOT come from the engine core's own
        # timestamps when stats are on (they exclude IPC and detokenizing), else from our clock.
        queue_ms = (t_submit - t0) * 1e3
        tpot_ms = (t_end - first) * 1e3 / (n_out - 1) if first is not None and n_out > 1 else None
        if metrics is not None:
            queued, scheduled = float(metrics.queued_ts), float(metrics.scheduled_ts)
            if queued > 0 and scheduled >= queued:
                queue_ms += (scheduled - queued) * 1e3
            first_ts, last_ts = float(metrics.first_token_ts), float(metrics.last_token_ts)
            if n_out > 1 and last_ts > first_ts > 0:
                tpot_ms = (last_ts - first_ts) * 1e3 / (n_out - 1)
        return GenerationResult(
            request_id=rid,
            text=text,
            finish_reason=finish,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            output_tokens=n_out,
            queue_ms=queue_ms,
            ttft_ms=None if first is None else (first - t0) * 1e3,
            tpot_ms=tpot_ms,
            e2e_ms=(t_end - t0) * 1e3,
        )

    async def abort(self, request_id: str) -> None:
        """Abort ``request_id`` in vLLM; its stream ends with :class:`RequestAbortedError`."""
        if self._llm is not None and request_id in self._active:
            await self._llm.abort(request_id)

    # --- health, death and restart -------------------------------------------------------------

    def health(self) -> EngineHealth:
        """Ready only while the engine runs and takes requests."""
        if self._state == "ready":
            return EngineHealth(True)
        return EngineHealth(False, self._reason or self._state)

    async def _watch(self) -> None:
        """Notice a dead engine core even when no request is running."""
        while self._state not in ("stopping", "stopped"):
            await asyncio.sleep(0.5)
            llm = self._llm
            if self._state == "ready" and llm is not None and llm.errored:
                self._engine_died("the vLLM engine core process stopped")

    def declare_dead(self, reason: str) -> bool:
        """A watchdog found the engine hung: handled as a dead engine core (restart or give up)."""
        self._engine_died(reason)
        return True

    def _engine_died(self, reason: str) -> None:
        if self._state != "ready":
            return
        self._state = "dead"
        self._reason = f"vLLM engine died: {reason}"
        logger.error("%s; %d request(s) in flight fail", self._reason, len(self._active))
        if self._on_dead_hook is not None:
            try:
                self._on_dead_hook(self._reason)
            except Exception:
                logger.exception("on_dead callback failed")
        if self.config.on_dead == "restart" and self._restarts < self.config.max_restarts:
            self._restart_task = asyncio.create_task(self._restart(), name="vllm-engine-restart")
        else:
            why = "engine.on_dead is exit" if self.config.on_dead == "exit" else "no restart left"
            self._give_up(f"{self._reason} ({why})")

    async def _restart(self) -> None:
        self._restarts += 1
        self._state = "restarting"
        self._reason = f"restarting the vLLM engine (restart {self._restarts} of {self.config.max_restarts})"
        logger.warning("%s", self._reason)
        old, self._llm = self._llm, None
        t0 = time.perf_counter()
        if old is not None:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(old.shutdown)
        try:
            await self._start_llm()
        except Exception as exc:
            self._state = "dead"
            self._give_up(f"restart failed: {exc}")
            return
        logger.warning("vLLM engine restarted in %.1f s", time.perf_counter() - t0)

    def _give_up(self, reason: str) -> None:
        logger.critical("vLLM engine is gone: %s", reason)
        if self._on_fatal is not None:
            self._on_fatal(reason)
            return
        logging.shutdown()
        os._exit(EXIT_ENGINE_DEAD)

    # --- stats and shutdown --------------------------------------------------------------------

    def stats(self) -> EngineStats:
        """KV-cache usage, running / waiting, prefix-cache hit rate and preemptions from vLLM."""
        sink = self._sink
        return EngineStats(
            backend=self.backend,
            model=self.model,
            running=sink.running,
            waiting=sink.waiting,
            kv_cache_usage=sink.kv_cache_usage,
            prefix_cache_hit_rate=sink.prefix_cache_hit_rate,
            preemptions=sink.preemptions,
            quantization=self.quantization.describe() if self.quantization else None,
        )

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse new requests, let running ones finish up to ``drain_timeout_s``, abort the rest, stop."""
        if self._state in ("stopped", "new"):
            self._state = "stopped"
            return
        self._state = "stopping"
        self._reason = "shutting down"
        left = await drain_running("vLLM engine", lambda: len(self._active), self._idle.wait, drain_timeout_s)
        llm = self._llm
        if left and llm is not None:
            with contextlib.suppress(Exception):
                await llm.abort(list(self._active))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._idle.wait(), 5.0)
        for task in (self._watchdog, self._restart_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if llm is not None:
            await asyncio.to_thread(llm.shutdown)
        self._llm = None
        self._state = "stopped"
        self._reason = "stopped"
        logger.info("vLLM engine stopped")

    @property
    def tokenizer(self) -> ChatTokenizer:
        """The chat tokenizer requests are rendered with (available after :meth:`start`)."""
        if self._tokenizer is None:
            raise EngineGenerateError("the engine has not been started")
        return self._tokenizer


def _estimate_weight_bytes(model_config: Mapping[str, Any], info: QuantizationInfo) -> float | None:
    """Rough weight size of a decoder-only transformer from config.json (``None`` if it cannot tell)."""
    try:
        h = int(model_config["hidden_size"])
        layers = int(model_config["num_hidden_layers"])
        inter = int(model_config["intermediate_size"])
        vocab = int(model_config["vocab_size"])
        heads = int(model_config["num_attention_heads"])
        kv_heads = int(model_config.get("num_key_value_heads", heads))
    except (KeyError, TypeError, ValueError):
        return None
    if model_config.get("num_local_experts") or model_config.get("n_routed_experts"):
        return None  # mixture of experts: the dense formula would mislead
    head_dim = int(model_config.get("head_dim") or h // heads)
    attention = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2
    per_layer = attention + 3 * h * inter
    embeddings = vocab * h * (1 if model_config.get("tie_word_embeddings") else 2)
    bits = info.bits if info.method is not None and info.bits else 16
    # Embeddings stay in 16 bits under weight quantization.
    return float(layers * per_layer * bits / 8 + embeddings * 2)
