"""Offline batch generation on vLLM's ``LLM`` (static batching): a whole set of prompts at once.

``opsbot analyze`` without a running bot hands every item of a batch analysis to vLLM's offline
engine in one go: all requests are queued up front and the scheduler keeps as many of them running
as the batch width (``max_num_seqs``) and the KV cache allow, at full GPU throughput and with no
interactivity (no priorities, no streaming, no admission lanes: nobody else is waiting).

This is the loop ``LLM.generate`` runs inside (requests added to ``llm.llm_engine``, then
``step()`` until none is left). Driving it here hands each result over the moment it finishes, so
the caller appends it to its results file as it comes, and a Ctrl-C (or a kill) loses only the
requests still running, never the finished ones.

vLLM is imported here only inside methods, as in :mod:`inference.vllm_engine` (whose argument
mapping, logging routing and startup-error translation this reuses), so the CPU install never
needs it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.config import EngineConfig
from inference.engine import (
    EngineDeadError,
    EngineGenerateError,
    EngineStartupError,
    GenerationRequest,
    GenerationResult,
)
from inference.quant import QuantizationError, resolve_quantization
from inference.tokenization import HFChatTokenizer
from inference.vllm_engine import (
    _startup_error,
    adopt_vllm_logger,
    engine_args_kwargs,
    is_local_model,
    route_vllm_logging,
    sampling_params,
)

if TYPE_CHECKING:  # vLLM is imported lazily at run time
    from vllm import LLM

logger = logging.getLogger(__name__)

BatchCallback = Callable[[str, GenerationResult | None, str | None], None]
"""``on_done(request_id, result, error)``: exactly one of ``result`` / ``error`` is set."""


@dataclass(slots=True)
class OfflineRunStats:
    """What one :meth:`OfflineBatchEngine.run` did."""

    submitted: int
    """Requests the engine took (the others failed before it could take them)."""
    finished: int
    failed: int
    aborted: int
    """Requests still running when ``stop`` was set (their results were never produced)."""
    wall_s: float


class OfflineBatchEngine:
    """vLLM's offline ``LLM`` over whole sets of requests (see the module doc).

    Blocking by design (the offline engine is synchronous): call :meth:`start` and :meth:`run` from a
    worker thread when an event loop must keep running (``asyncio.to_thread``).
    """

    backend = "vllm-offline"

    def __init__(self, config: EngineConfig, *, max_num_seqs: int | None = None) -> None:
        """``config`` is the one engine configuration; ``max_num_seqs`` overrides its batch width
        (an offline batch has no urgent work to keep slots for, so it is usually wider)."""
        self.config = config
        self.model = config.require_model()
        self.max_num_seqs = max_num_seqs or config.max_num_seqs
        route_vllm_logging()
        self._llm: LLM | None = None
        self._tokenizer: HFChatTokenizer | None = None
        self.startup_s: float | None = None

    @property
    def tokenizer(self) -> HFChatTokenizer:
        """The model's chat tokenizer (loaded on first use, before vLLM starts, so a caller can plan
        and count tokens without a GPU)."""
        if self._tokenizer is None:
            self._tokenizer = HFChatTokenizer(
                self.config.tokenizer or str(Path(self.model).expanduser()),
                trust_remote_code=self.config.trust_remote_code,
            )
        return self._tokenizer

    def start(self, warmup_ids: Sequence[int] = ()) -> None:
        """Build the offline engine (minutes on a fresh machine: weights, compile, CUDA graphs) and run
        ``warmup_ids`` (the shared system prompt) once, so the batch finds it in the prefix cache
        instead of every request of the first step computing it. :class:`EngineStartupError` names
        cause and fix."""
        if self._llm is not None:
            return
        t0 = time.perf_counter()
        if is_local_model(self.model) and not Path(self.model).expanduser().is_dir():
            raise EngineStartupError(
                f"model folder {self.model} does not exist. Fix: set engine.model to a folder with "
                "config.json, the weights and the tokenizer (or a Hugging Face id)"
            )
        try:
            info = resolve_quantization(self.model, self.config.quantization)
        except QuantizationError as exc:
            raise EngineStartupError(str(exc)) from exc
        quantization = info.method if info.online or info.source == "unknown" else self.config.quantization
        kwargs: dict[str, Any] = engine_args_kwargs(self.config, quantization)
        kwargs["max_num_seqs"] = self.max_num_seqs
        # Priorities order a waiting queue against urgent work; a batch alone has none to order.
        kwargs["scheduling_policy"] = "fcfs"
        # An engine core forked after CUDA was touched in this process cannot use it.
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        logger.info(
            "vLLM offline engine: starting %s (batch width %d, %s)",
            self.model,
            self.max_num_seqs,
            info.describe(),
        )
        try:
            from vllm import LLM

            adopt_vllm_logger()
            model = kwargs.pop("model")
            self._llm = LLM(model, **kwargs)
        except EngineStartupError:
            raise
        except Exception as exc:
            raise _startup_error(exc, self.config) from exc
        if warmup_ids:
            self._warm(list(warmup_ids))
        self.startup_s = time.perf_counter() - t0
        logger.info(
            "vLLM offline engine ready in %.1f s (KV cache %s tokens)",
            self.startup_s,
            self.kv_capacity_tokens or "unknown",
        )

    def _warm(self, ids: list[int]) -> None:
        from vllm import SamplingParams, TokensPrompt

        llm = self._require()
        params = SamplingParams(max_tokens=1, temperature=0.0)
        llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)

    def _require(self) -> LLM:
        if self._llm is None:
            raise EngineGenerateError("the offline engine has not been started")
        return self._llm

    @property
    def kv_capacity_tokens(self) -> int | None:
        """KV-cache capacity in tokens, as the engine core sized it (``None`` before :meth:`start`)."""
        if self._llm is None:
            return None
        try:
            blocks = self._llm.llm_engine.vllm_config.cache_config.num_gpu_blocks
        except AttributeError:
            return None
        return int(blocks) * self.config.block_size if blocks else None

    def batch_width(self, tokens_per_request: float) -> int:
        """How many requests of ``tokens_per_request`` (prompt + answer) run at once: the batch width,
        or fewer where the KV cache holds fewer."""
        kv = self.kv_capacity_tokens
        if kv is None or tokens_per_request <= 0:
            return self.max_num_seqs
        return max(1, min(self.max_num_seqs, int(kv // tokens_per_request)))

    def run(
        self, requests: Sequence[GenerationRequest], on_done: BatchCallback, stop: threading.Event
    ) -> OfflineRunStats:
        """Queue every request, then step the engine until all are done or ``stop`` is set; each
        result goes to ``on_done`` as soon as its request finishes (from this thread). A request that
        cannot run (prompt too long) fails alone; :class:`EngineDeadError` if the engine core dies
        (unless ``stop`` was set: a Ctrl-C in a terminal reaches the engine core process too)."""
        from vllm import TokensPrompt

        engine = self._require().llm_engine
        t0 = time.perf_counter()
        added: dict[str, tuple[float, int]] = {}
        failed = finished = 0
        for request in requests:
            if stop.is_set():
                break
            if request.prompt_token_ids is None:
                raise ValueError("the offline engine takes rendered prompts (prompt_token_ids)")
            ids = [int(i) for i in request.prompt_token_ids]
            try:
                params = sampling_params(request.sampling, len(ids), self.config.max_model_len, stream=False)
                engine.add_request(request.request_id, TokensPrompt(prompt_token_ids=ids), params)
            except (EngineGenerateError, ValueError) as exc:
                failed += 1
                on_done(request.request_id, None, f"the model engine could not take it: {exc}")
                continue
            added[request.request_id] = (time.perf_counter(), len(ids))
        logger.info("vLLM offline engine: %d requests queued at once", len(added))
        pending = set(added)
        try:
            while pending and engine.has_unfinished_requests():
                if stop.is_set():
                    engine.abort_request(sorted(pending))
                    for rid in sorted(pending):  # started, never finished: the caller records them
                        on_done(rid, None, "stopped before it finished")
                    break
                for out in engine.step():
                    if not out.finished or out.request_id not in pending:
                        continue
                    pending.discard(out.request_id)
                    t_added, prompt_len = added[out.request_id]
                    completion = out.outputs[0] if out.outputs else None
                    if completion is None or completion.finish_reason == "abort":
                        failed += 1
                        on_done(out.request_id, None, "aborted in the engine")
                        continue
                    finished += 1
                    on_done(out.request_id, _result(out, completion, prompt_len, t_added), None)
        except Exception as exc:
            # A Ctrl-C in a terminal reaches the engine core too, which may die before ``stop`` is set.
            if not stop.wait(timeout=1.0):
                raise EngineDeadError(
                    f"the vLLM offline engine stopped: {type(exc).__name__}: {exc}"
                ) from exc
            logger.info("vLLM offline engine stopped with the interrupt (%s)", type(exc).__name__)
            for rid in sorted(pending):
                on_done(rid, None, "stopped before it finished")
        return OfflineRunStats(
            submitted=len(added),
            finished=finished,
            failed=failed,
            aborted=len(pending),
            wall_s=time.perf_counter() - t0,
        )

    def shutdown(self) -> None:
        """Stop the engine core process and free the GPU."""
        llm, self._llm = self._llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception as exc:  # shutting down after a dead engine core: nothing left to free
            logger.info("vLLM offline engine shutdown: %s", exc)
        logger.info("vLLM offline engine stopped")


def _result(out: Any, completion: Any, prompt_len: int, t_added: float) -> GenerationResult:
    """One finished request as a :class:`GenerationResult`; times count from when it was queued (all
    of a batch at once, so TTFT includes the wait for a batch slot: that is static batching)."""
    t_end = time.perf_counter()
    n_out = len(completion.token_ids)
    queue_ms = 0.0
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    metrics = out.metrics
    if metrics is not None:  # only with stats logging on (engine.log_stats)
        queued, scheduled = float(metrics.queued_ts), float(metrics.scheduled_ts)
        if queued > 0 and scheduled >= queued:
            queue_ms = (scheduled - queued) * 1e3
        if float(metrics.first_token_latency) > 0:
            ttft_ms = float(metrics.first_token_latency) * 1e3
        first_ts, last_ts = float(metrics.first_token_ts), float(metrics.last_token_ts)
        if n_out > 1 and last_ts > first_ts > 0:
            tpot_ms = (last_ts - first_ts) * 1e3 / (n_out - 1)
    return GenerationResult(
        request_id=str(out.request_id),
        text=str(completion.text),
        finish_reason=str(completion.finish_reason or "stop"),
        prompt_tokens=prompt_len,
        cached_tokens=int(out.num_cached_tokens or 0),
        output_tokens=n_out,
        queue_ms=queue_ms,
        ttft_ms=ttft_ms,
        tpot_ms=tpot_ms,
        e2e_ms=(t_end - t_added) * 1e3,
    )
