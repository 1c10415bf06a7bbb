"""The llama.cpp engine: a GGUF model in-process through llama-cpp-python, several slots in parallel.

Slots. llama-cpp-python's ``Llama`` drives one sequence per context (its ``generate`` works on
sequence 0 and keeps that sequence's tokens to reuse their KV entries); batching several sequences
in one context would mean the low-level ``llama_batch`` API and our own sampler chain per sequence.
So each of ``engine.cpu_max_concurrency`` slots is its own ``Llama`` (model + context) and runs one
request at a time in a worker thread. The GGUF file is memory-mapped (``use_mmap``), so the
weights sit in the page cache once, however many slots map them; each slot adds only its KV cache
(``max_model_len`` positions) and scratch buffers.

Prompt cache. A slot keeps the tokens it last evaluated and their KV entries; ``Llama.generate``
evaluates only what follows the longest common prefix. ``start`` warms every slot with the shared
system prompt, and a request takes the free slot whose cache shares the longest prefix with its
prompt, so the system prompt is evaluated once per slot, not once per request. ``cached_tokens`` in
the result is what llama.cpp itself did not evaluate: the prompt length minus the prompt tokens its
performance counters (``llama_perf_context``) counted for this request.

The request machinery (lanes ranked urgent first, worker threads off the event loop, aborts,
draining shutdown, health) is the CPU engine's: this class only loads slots and decodes.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.bad_words import BadWordSequences
from inference.config import EngineConfig
from inference.cpu_engine import CpuEngine, _IncrementalDetokenizer, _Request, _sentence
from inference.engine import (
    ChatMessage,
    ChatTokenizer,
    EngineDeadError,
    EngineGenerateError,
    EngineStartupError,
    EngineStats,
    GenerationResult,
    SamplingSettings,
    TextDelta,
)
from inference.gguf import find_gguf

logger = logging.getLogger(__name__)

# llama.cpp's own names for general.file_type (enum llama_ftype), for stats and the ready line.
_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}  # fmt: skip


_MAX_GRAMMARS = 64
"""Converted output schemas kept (one per tool set and scenario in practice)."""


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise EngineStartupError(
            f"engine.backend = 'llamacpp' needs llama-cpp-python ({exc}). Fix: "
            "pip install 'opsbot[llamacpp]' (it compiles llama.cpp: a few minutes; `make` keeps the "
            "built wheel for next time)"
        ) from exc
    _route_native_logs(llama_cpp)
    _keep_standard_streams()
    return llama_cpp


class _StreamsKept:
    """Stands in for llama-cpp-python's ``suppress_stdout_stderr``: changes nothing."""

    def __init__(self, disable: bool = True) -> None:
        del disable

    def __enter__(self) -> _StreamsKept:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None


def _keep_standard_streams() -> None:
    """Stop llama-cpp-python from blacking out the process's output while it loads a model.

    With ``verbose=False`` it points file descriptors 1 and 2 at /dev/null (and swaps ``sys.stdout``
    and ``sys.stderr``) for the whole process while a model or context loads: whatever any other
    thread writes meanwhile is lost. An engine restart loads in the background, so the note "the model
    engine is down" that ``opsbot chat`` printed at that moment, and the log lines of the restart,
    vanished (2026-12-06). llama.cpp's own lines reach Python logging (:func:`_route_native_logs`)
    and ``verbose=False`` keeps llama-cpp-python's own prints off, so there is nothing to hide."""
    from llama_cpp import _internals
    from llama_cpp import llama as high_level

    for module in (high_level, _internals):
        if getattr(module, "suppress_stdout_stderr", None) is not None:
            module.suppress_stdout_stderr = _StreamsKept  # type: ignore[attr-defined]


_NATIVE_LOGGER = logging.getLogger("llama_cpp.native")
_native_log_callback: Any = None
"""The ctypes callback llama.cpp holds (kept here: freed, llama.cpp would call into freed memory)."""


def _route_native_logs(llama_cpp: Any) -> None:
    """llama.cpp's own log lines into Python logging (``llama_cpp.native``), once per process.

    llama-cpp-python prints every llama.cpp line at or above its logger's level straight to stderr,
    past Python logging, so one could land on the chat screen or through a progress bar (seen once:
    ``decode: removing memory module entries ...`` in ``opsbot chat --demo``). Here its errors become
    INFO lines and the rest DEBUG: they reach the log file, and the engine reports its failures
    itself, as exceptions the user sees."""
    global _native_log_callback
    if _native_log_callback is not None:
        return

    @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
    def forward(level: int, text: bytes, _user_data: Any) -> None:
        line = text.decode("utf-8", "replace").rstrip("\n")
        if line:
            _NATIVE_LOGGER.log(logging.INFO if level == _GGML_LOG_LEVEL_ERROR else logging.DEBUG, "%s", line)

    _native_log_callback = forward
    llama_cpp.llama_log_set(forward, ctypes.c_void_p(0))


_GGML_LOG_LEVEL_ERROR = 3
"""ggml's enum ggml_log_level value for errors."""


def cpu_has_amx(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the CPU reports Intel AMX (the ``amx_int8`` flag; False where there is no cpuinfo)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return any(
        line.startswith("flags") and "amx_int8" in line.split(":", 1)[-1].split()
        for line in text.splitlines()
    )


def use_extra_buffers(setting: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """``engine.llamacpp_extra_buffers`` resolved: ``auto`` is off on an AMX CPU, on elsewhere."""
    if setting == "auto":
        return not cpu_has_amx(cpuinfo)
    return setting == "on"


_MODEL_PARAMS_LOCK = threading.Lock()


@contextlib.contextmanager
def _model_params(llama_cpp: Any, *, extra_buffers: bool) -> Iterator[None]:
    """While ``Llama(...)`` runs, the model parameters it starts from have ``use_extra_bufts`` as
    asked: llama-cpp-python 0.3.36 has no argument for it, and ``Llama.__init__`` takes its
    defaults from ``llama_cpp.llama_cpp.llama_model_default_params``, so that function is wrapped
    for the duration (under a lock: slots open one at a time anyway)."""
    low = llama_cpp.llama_cpp
    original = low.llama_model_default_params
    if extra_buffers or not hasattr(original(), "use_extra_bufts"):
        yield
        return

    def without_extra_buffers() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    with _MODEL_PARAMS_LOCK:
        low.llama_model_default_params = without_extra_buffers
        try:
            yield
        finally:
            low.llama_model_default_params = original


def _threads_for(busy_slots: int) -> int:
    """Threads for one request when ``engine.cpu_threads`` is unset: the cores shared among the
    requests running now. llama.cpp's threads spin while they wait for each other, so more threads
    than cores (slots x threads) stall every slot; fewer leave cores idle when one request runs."""
    return max((os.cpu_count() or 1) // max(busy_slots, 1), 1)


def _copy_sequence(llama_cpp: Any, source: Any, targets: Sequence[Any], tokens: Sequence[int]) -> None:
    """Copy sequence 0's KV entries (the evaluated ``tokens``) of ``source`` into each of ``targets``,
    and tell their ``Llama`` which tokens those are, so their prefix matching reuses them.

    ``Llama.save_state``/``load_state`` would also copy (and so make resident) the whole logits
    buffer of every slot; the per-sequence state API copies only the KV cells.
    """
    ctx = source._ctx.ctx
    size = int(llama_cpp.llama_state_seq_get_size(ctx, 0))
    buffer = (ctypes.c_uint8 * size)()
    written = int(llama_cpp.llama_state_seq_get_data(ctx, buffer, size, 0))
    for target in targets:
        if int(llama_cpp.llama_state_seq_set_data(target._ctx.ctx, buffer, written, 0)) == 0:
            raise EngineStartupError("llama.cpp could not copy the warmed system prompt into a slot")
        target.input_ids[: len(tokens)] = tokens
        target.n_tokens = len(tokens)


def _evaluated(perf: Any) -> int:
    """Tokens llama.cpp evaluated since its counters were reset (prompt batches plus single-token
    decodes). It reports a count of 0 as 1 (to spare divisions), so a count only stands when time
    was booked to it."""
    prompt = int(perf.n_p_eval) if perf.t_p_eval_ms > 0 else 0
    single = int(perf.n_eval) if perf.t_eval_ms > 0 else 0
    return prompt + single


class LlamaCppChatTokenizer(ChatTokenizer):
    """The GGUF's own tokenizer and chat template (``tokenizer.chat_template`` in its metadata), so
    the ids the bot counts and renders are exactly the ids llama.cpp evaluates."""

    def __init__(self, llama: Any, source: str) -> None:
        """``llama``: a loaded ``llama_cpp.Llama`` (only its vocabulary is used); ``source`` names the
        file in error messages."""
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        self._llama = llama
        template = llama.metadata.get("tokenizer.chat_template")
        if not template:
            raise EngineStartupError(
                f"{source} has no chat template (tokenizer.chat_template). Fix: use an instruction-tuned "
                "GGUF that carries its chat template"
            )
        model = llama._model
        self.bos_text = model.token_get_text(model.token_bos()) if model.token_bos() >= 0 else ""
        self.eos_text = model.token_get_text(model.token_eos()) if model.token_eos() >= 0 else ""
        self._formatters = {
            flag: Jinja2ChatFormatter(template, self.eos_text, self.bos_text, add_generation_prompt=flag)
            for flag in (True, False)
        }

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id of the vocabulary."""
        value = int(self._llama.token_eos())
        return value if value >= 0 else None

    def is_end(self, token: int) -> bool:
        """Whether ``token`` ends generation (llama.cpp's end-of-generation set: EOS, EOT, ...)."""
        import llama_cpp

        return bool(llama_cpp.llama_vocab_is_eog(self._llama._model.vocab, token))

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text (no BOS, special-token markup not parsed)."""
        return [int(t) for t in self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False)]

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        conversation: Any = [{"role": m.role, "content": m.content} for m in messages]
        prompt = self._formatters[add_generation_prompt](messages=conversation).prompt
        # The template writes BOS itself where the model wants one (as transformers renders it).
        return [int(t) for t in self._llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)]

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._llama.detokenize(list(token_ids), special=False).decode("utf-8", errors="replace"))

    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary (ids 0 to this, exclusive)."""
        return int(self._llama.n_vocab())


class _DetokenizerShim:
    """What ``_IncrementalDetokenizer`` needs of a tokenizer: ``decode(ids, **flags)``."""

    def __init__(self, tokenizer: LlamaCppChatTokenizer) -> None:
        self._tokenizer = tokenizer

    def decode(self, ids: list[int], **_flags: Any) -> str:
        # Special tokens are never rendered (llama.cpp's special=False), as skip_special_tokens.
        return self._tokenizer.decode(ids)


@dataclass(eq=False)
class _Slot:
    """One llama.cpp context; used by one request at a time."""

    index: int
    llama: Any
    busy: bool = False
    cancel: threading.Event | None = None
    """The running request's abort flag, read by llama.cpp's abort callback during a decode."""
    callback: Any = None
    """The ctypes callback object; held here so it outlives the context that calls it."""
    computing_at: float = 0.0
    """``time.monotonic()`` of the slot's latest computed graph node (set by the abort callback)."""

    def watch_aborts(self, llama_cpp: Any) -> None:
        """Let an abort stop a long prompt evaluation between graph nodes (llama.cpp's abort
        callback), not only at the next token; and note each call, the engine's sign that it is
        computing while a long prompt yields no token (:meth:`LlamaCppEngine.computing_at`)."""

        def should_abort(_data: Any) -> bool:
            self.computing_at = time.monotonic()
            return self.cancel is not None and self.cancel.is_set()

        self.callback = llama_cpp.ggml_abort_callback(should_abort)
        llama_cpp.llama_set_abort_callback(self.llama._ctx.ctx, self.callback, None)

    def shared_prefix(self, prompt: Sequence[int]) -> int:
        """Tokens at the start of ``prompt`` this slot's cache already holds."""
        held = self.llama.input_ids[: self.llama.n_tokens]
        n = 0
        for a, b in zip(held, prompt, strict=False):
            if a != b:
                break
            n += 1
        return n


class _GreedyGrammar:
    """A logits processor that makes a greedy constrained decode exact and cheap: the best token is
    checked against the grammar alone, and only when the grammar rejects it is every token checked.

    llama-cpp-python puts the grammar sampler in its chain before greedy, so llama.cpp matches all
    of the vocabulary (49,152 tokens for SmolLM2) against the grammar for every token: about a third
    of each decision token's time on 2 cores. llama.cpp's own ``common_sampler`` samples first and
    checks that one token; this is the same for greedy decoding. The answer is unchanged: the
    highest-scoring token the grammar accepts is the best token when the grammar accepts it, and is
    found over the whole vocabulary when it does not. The token is then the only one left with a
    finite score, so the chain's greedy step picks it. Only for temperature 0 and no repetition
    penalty (a penalty after this processor could move the choice; decisions use neither).
    """

    def __init__(self, llama_cpp: Any, llama: Any, grammar: Any, prompt_len: int) -> None:
        import numpy as np

        self._np = np
        self._low = llama_cpp
        self._sampler = llama_cpp.llama_sampler_init_grammar(
            llama._model.vocab, grammar._grammar.encode("utf-8"), grammar._root.encode("utf-8")
        )
        if not self._sampler:
            raise EngineGenerateError("llama.cpp could not build a sampler from the output grammar")
        self._accepted = prompt_len
        """Tokens of the sequence already fed to the grammar: the prompt's are not grammar input."""
        self._one = (llama_cpp.llama_token_data * 1)()
        self._all: Any = None
        self.full_checks = 0
        """Tokens for which the best one was rejected and the whole vocabulary was checked."""
        self.tokens = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        np, low = self._np, self._low
        # The token chosen last call is in input_ids now: advance the grammar over it.
        for token in input_ids[self._accepted :]:
            low.llama_sampler_accept(self._sampler, int(token))
        self._accepted = len(input_ids)
        self.tokens += 1
        best = int(np.argmax(scores))
        self._one[0].id, self._one[0].logit, self._one[0].p = best, float(scores[best]), 0.0
        one = low.llama_token_data_array(data=self._one, size=1, selected=-1, sorted=False)
        low.llama_sampler_apply(self._sampler, ctypes.byref(one))
        out = np.full_like(scores, -np.inf)
        if self._one[0].logit != -np.inf:
            out[best] = scores[best]
            return out
        self.full_checks += 1
        n = len(scores)
        if self._all is None:
            self._all = (low.llama_token_data * n)()
            self._view = np.ctypeslib.as_array(self._all)
        self._view["id"] = np.arange(n, dtype=np.intc)
        self._view["logit"] = scores
        whole = low.llama_token_data_array(data=self._all, size=n, selected=-1, sorted=False)
        low.llama_sampler_apply(self._sampler, ctypes.byref(whole))
        kept = self._view[: whole.size]
        out[kept["id"]] = kept["logit"]
        return out

    def close(self, request_id: str) -> None:
        """Free the grammar sampler (llama.cpp memory, not Python's) and log how often the whole
        vocabulary was checked for ``request_id``."""
        if self._sampler:
            self._low.llama_sampler_free(self._sampler)
            self._sampler = None
            logger.debug(
                "llama.cpp request %s: %d of %d constrained tokens needed the whole vocabulary checked",
                request_id,
                self.full_checks,
                self.tokens,
            )


class LlamaCppEngine(CpuEngine):
    """:class:`~inference.engine.Engine` on llama.cpp (llama-cpp-python), one context per slot."""

    backend = "llamacpp"
    _label = "llama.cpp engine"

    def __init__(
        self,
        config: EngineConfig,
        *,
        on_dead: Callable[[str], None] | None = None,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        """Reads ``model`` (+ ``gguf_file``), ``cpu_max_concurrency`` (slots), ``cpu_threads``,
        ``llamacpp_n_batch``, ``max_model_len`` (capped at the model's training context) and ``seed``;
        ``on_dead`` / ``on_fatal`` and restarts as the CPU engine."""
        super().__init__(config, on_dead=on_dead, on_fatal=on_fatal)
        self.gguf_path: Path | None = None
        self._slots: list[_Slot] = []
        self._slot_lock = threading.Lock()
        self._llama_tokenizer: LlamaCppChatTokenizer | None = None
        self._quantization: str | None = None
        self._prompt_tokens_total = 0
        self._cached_tokens_total = 0
        self._bans: dict[tuple[str, ...], list[int]] = {}
        """Bad words -> the token ids that would open an answer with one (:meth:`_opening_bans`)."""
        self._pieces: list[str] | None = None
        """Every token's text without leading spaces, by id (:meth:`_opening_bans` scans them)."""
        self._grammars: dict[str, Any] = {}
        """Output schema (JSON text) -> its ``LlamaGrammar`` (see :meth:`_grammar`)."""

    # --- loading ---------------------------------------------------------------------------------

    def _load(self, warmup_messages: Sequence[ChatMessage]) -> None:
        llama_cpp = _import_llama_cpp()
        path = find_gguf(self.model, self.config.gguf_file)
        self.gguf_path = path
        slots: list[_Slot] = []
        try:
            self._load_slots(llama_cpp, path, slots, warmup_messages)
        except BaseException:
            for slot in slots:  # free the contexts now, not whenever the collector runs
                slot.llama.close()
            self._model = None
            raise

    def _load_slots(
        self, llama_cpp: Any, path: Path, slots: list[_Slot], warmup_messages: Sequence[ChatMessage]
    ) -> None:
        cfg = self.config
        extra_buffers = use_extra_buffers(cfg.llamacpp_extra_buffers)  # resolved once for every slot
        if not extra_buffers:
            auto = cfg.llamacpp_extra_buffers == "auto"
            logger.info(
                "llama.cpp engine: extra weight buffers (AMX kernels, repacking) off "
                "(engine.llamacpp_extra_buffers = %r%s)",
                cfg.llamacpp_extra_buffers,
                ": this CPU has AMX, whose llama.cpp kernels crash here" if auto else "",
            )
        for index in range(cfg.cpu_max_concurrency):
            logger.info("llama.cpp engine loading slot %d/%d of %s", index + 1, cfg.cpu_max_concurrency, path)
            slots.append(_Slot(index, self._open(llama_cpp, path, cfg, extra_buffers=extra_buffers)))
            if self._state not in ("loading", "restarting"):  # shutdown() came meanwhile: stop early
                raise EngineStartupError("the llama.cpp engine was shut down while it was starting")
        first = slots[0].llama
        self._llama_tokenizer = LlamaCppChatTokenizer(first, str(path))
        self._model = first
        trained = int(first._model.n_ctx_train())
        # llama.cpp pads n_ctx up (to 256): the configured window is the limit answers keep to.
        self._context_len = min(int(first.n_ctx()), cfg.max_model_len, trained or cfg.max_model_len)
        ftype = first.metadata.get("general.file_type")
        self._quantization = _FILE_TYPES.get(int(ftype), f"type {ftype}") if ftype is not None else None
        if trained and trained < cfg.max_model_len:
            logger.info("llama.cpp engine: context capped at the model's %d training positions", trained)
        warmup = [first.token_bos() if first.token_bos() >= 0 else 0]
        if warmup_messages:
            try:
                warmup = self._llama_tokenizer.render(warmup_messages)[: self._context_len - 1]
            except Exception as exc:
                raise EngineStartupError(
                    f"the chat template of {path} cannot render the warm-up prompt: {_sentence(exc)}. Fix: "
                    "use a model whose chat template accepts system and user messages"
                ) from exc
        # The shared system prompt is evaluated once, in the first slot, and its KV state copied
        # into the others: every slot then serves it from cache.
        first.eval(warmup)
        llama_cpp.llama_synchronize(first._ctx.ctx)
        if len(slots) > 1:
            _copy_sequence(llama_cpp, first, [s.llama for s in slots[1:]], warmup)
        for slot in slots:
            slot.watch_aborts(llama_cpp)
        self._slots = slots

    def _open(self, llama_cpp: Any, path: Path, cfg: EngineConfig, *, extra_buffers: bool) -> Any:
        n_ctx = cfg.max_model_len
        try:
            with _model_params(llama_cpp, extra_buffers=extra_buffers):
                llama = llama_cpp.Llama(
                    model_path=str(path),
                    n_ctx=n_ctx,
                    n_batch=min(cfg.llamacpp_n_batch, n_ctx),
                    # Unset: set per request in _take_slot (the cores shared by the running requests).
                    n_threads=cfg.cpu_threads or 1,
                    n_threads_batch=cfg.cpu_threads or 1,
                    seed=cfg.seed,
                    use_mmap=True,
                    verbose=False,
                )
        except ValueError as exc:  # llama-cpp-python's "Failed to load model from file"
            raise EngineStartupError(
                f"llama.cpp cannot load {path}: {_sentence(exc)}. Fix: check that it is a complete GGUF file "
                "of an architecture this llama.cpp build knows (upgrade llama-cpp-python for new ones)"
            ) from exc
        trained = int(llama._model.n_ctx_train())
        if trained and trained < n_ctx:
            llama.close()
            capped = cfg.model_copy(update={"max_model_len": trained})
            return self._open(llama_cpp, path, capped, extra_buffers=extra_buffers)
        return llama

    def _describe(self) -> str:
        return (
            f"model={self.gguf_path} quantization={self._quantization or '?'} slots={len(self._slots)} "
            f"threads/request={self.config.cpu_threads or 'cores / running requests'} "
            f"context={self._context_len}"
        )

    def _release(self) -> None:
        for slot in self._slots:
            slot.llama.close()
        self._slots = []
        self._model = None

    @property
    def tokenizer(self) -> LlamaCppChatTokenizer:  # type: ignore[override]
        """The GGUF's tokenizer (available once ``start`` has returned)."""
        if self._llama_tokenizer is None:
            raise EngineDeadError(f"the {self._label} has no tokenizer yet: call start() first")
        return self._llama_tokenizer

    def stats(self) -> EngineStats:
        """The CPU engine's counts, plus the prompt-cache hit rate (tokens llama.cpp did not evaluate
        over all prompt tokens since start) and the file's quantization."""
        stats = super().stats()
        with self._lock:
            prompt, cached = self._prompt_tokens_total, self._cached_tokens_total
        stats.prefix_cache_hit_rate = cached / prompt if prompt else None
        stats.quantization = self._quantization
        return stats

    def computing_at(self) -> float | None:
        """The latest graph node any slot computed: a prompt evaluation starved of CPU time (a busy
        laptop, a 4,000-token incident on 2 cores) gives no token for a minute but is not hung."""
        return max((slot.computing_at for slot in self._slots), default=None) or None

    # --- worker thread ---------------------------------------------------------------------------

    def _take_slot(self, prompt: Sequence[int]) -> _Slot:
        """The free slot whose cache shares the longest prefix with ``prompt`` (one is always free:
        there are as many workers as slots)."""
        with self._slot_lock:
            free = [s for s in self._slots if not s.busy]
            if not free:
                raise EngineGenerateError("no free llama.cpp slot (more workers than slots)")
            slot = max(free, key=lambda s: s.shared_prefix(prompt))
            slot.busy = True
            busy = sum(s.busy for s in self._slots)
        threads = self.config.cpu_threads or _threads_for(busy)
        slot.llama._ctx.set_n_threads(threads, threads)
        return slot

    def _no_bad_words(
        self, sampling: SamplingSettings, detok: _IncrementalDetokenizer, prompt_len: int
    ) -> list[Callable[[Any, Any], Any]] | None:
        """A logits processor for ``sampling.bad_words`` (``None`` without any): no bad word is ever
        completed, as vLLM means them (:class:`~inference.bad_words.BadWordSequences`), and while the
        answer is still blank no token may begin one (a small model that opens by copying its
        prompt's fence markup, or a tool call after an investigation, has to start with words of
        its own; a stop string would otherwise end such an answer at once, empty)."""
        if not sampling.bad_words:
            return None
        assert self._llama_tokenizer is not None
        sequences = BadWordSequences(sampling.bad_words, self._llama_tokenizer.encode)
        opening = self._opening_bans(sampling.bad_words)

        def forbid(input_ids: Any, scores: Any) -> Any:
            if opening and not detok.seen().strip():  # only until the first visible character
                scores[opening] = -float("inf")
            banned = sequences.banned(input_ids[prompt_len:])
            if banned:
                scores[banned] = -float("inf")
            return scores

        return [forbid]

    def _opening_bans(self, bad_words: tuple[str, ...]) -> list[int]:
        """Token ids whose text (leading spaces aside) is a beginning of a bad word (``<``, ``<<``,
        ``{``, ``{"``), or holds a whole bad word; computed once per set of words (the last
        :data:`_MAX_GRAMMARS` sets are kept: the fence markers' every time, an answer asked again
        without what it copied once)."""
        with self._lock:
            found = self._bans.get(bad_words)
            pieces = self._pieces
        if found is not None:
            return found
        if pieces is None:  # every token's text, decoded once: a scan then costs string tests only
            assert self._llama_tokenizer is not None
            tok = self._llama_tokenizer
            pieces = [tok.decode([token]).lstrip() for token in range(tok.vocab_size)]
        found = [
            token
            for token, piece in enumerate(pieces)
            if piece and any(w.startswith(piece) or w in piece for w in bad_words)
        ]
        with self._lock:
            self._pieces = pieces
            if len(self._bans) >= _MAX_GRAMMARS:
                self._bans.clear()
            self._bans[bad_words] = found
        return found

    def _constraints(
        self, llama_cpp: Any, llama: Any, req: _Request, detok: _IncrementalDetokenizer, prompt_len: int
    ) -> tuple[Any, list[Callable[[Any, Any], Any]], _GreedyGrammar | None]:
        """What constrains one request's tokens: the grammar for llama-cpp-python's sampler chain (None
        where :class:`_GreedyGrammar` takes its place: greedy, no repetition penalty), the logits
        processors (the bad-words ban, then the greedy grammar) and that greedy grammar, if any."""
        sampling = req.request.sampling
        grammar = self._grammar(llama_cpp, sampling.json_schema)
        processors = self._no_bad_words(sampling, detok, prompt_len) or []
        greedy = grammar is not None and sampling.temperature < 1e-5 and sampling.repetition_penalty == 1.0
        if not greedy:
            return grammar, processors, None
        greedy_grammar = _GreedyGrammar(llama_cpp, llama, grammar, prompt_len)
        return None, [*processors, greedy_grammar], greedy_grammar

    def _grammar(self, llama_cpp: Any, json_schema: str | None) -> Any:
        """The llama.cpp grammar of ``json_schema`` (``None``: free text). Converting a schema to GBNF
        is Python work of a few ms: each schema is converted once (an investigation's steps share
        one), and the grammar text is only read by each request's own sampler."""
        if json_schema is None:
            return None
        with self._lock:
            grammar = self._grammars.get(json_schema)
        if grammar is None:
            try:
                grammar = llama_cpp.LlamaGrammar.from_json_schema(json_schema, verbose=False)
            except Exception as exc:  # the converter raises plain exceptions for schemas it cannot map
                raise EngineGenerateError(
                    f"the output schema cannot be made a llama.cpp grammar: {exc}"
                ) from exc
            with self._lock:
                if len(self._grammars) >= _MAX_GRAMMARS:
                    self._grammars.clear()
                self._grammars[json_schema] = grammar
        return grammar

    def _give_back(self, slot: _Slot) -> None:
        with self._slot_lock:
            slot.busy = False

    def _decode(self, req: _Request) -> None:
        import llama_cpp

        tok = self._llama_tokenizer
        assert tok is not None and req.started is not None
        request = req.request
        sampling = request.sampling
        if request.prompt_token_ids is not None:
            prompt = [int(t) for t in request.prompt_token_ids]
        else:
            assert request.messages is not None
            prompt = tok.render(request.messages)
        if not prompt:
            raise EngineGenerateError("the prompt is empty")
        if len(prompt) >= self._context_len:
            raise EngineGenerateError(
                f"the prompt has {len(prompt)} tokens but the context window is {self._context_len}"
            )
        budget = max(0, min(sampling.max_tokens, self._context_len - len(prompt)))
        slot = self._take_slot(prompt)
        slot.cancel = req.cancel
        try:
            result = self._run_on(slot, req, prompt, budget, llama_cpp)
        except RuntimeError as exc:
            if not req.cancel.is_set():
                raise
            # llama_decode returned "aborted": the abort callback stopped the prompt evaluation.
            # llama-cpp-python counted none of that batch, so the slot's cache stays consistent.
            logger.info(
                "llama.cpp engine request %s stopped after 0 tokens, during its prompt (%s): %s",
                req.request_id,
                exc,
                req.cancel_reason,
            )
            result = None
        finally:
            slot.cancel = None
            self._give_back(slot)
        # Posted once the slot is free: a follow-up sent on this result finds the slot's cache.
        if result is not None:
            req.post(result)

    def _run_on(
        self, slot: _Slot, req: _Request, prompt: list[int], budget: int, llama_cpp: Any
    ) -> GenerationResult | None:
        """Decode ``req`` on ``slot``; its result, or None when it was stopped or its reader left."""
        assert self._llama_tokenizer is not None and req.started is not None
        tok, llama, request = self._llama_tokenizer, slot.llama, req.request
        sampling = request.sampling
        llama.set_seed(sampling.seed if sampling.seed is not None else self._next_seed() & 0xFFFFFFFF)
        ctx = llama._ctx.ctx
        # llama.cpp books a decode's tokens at the next synchronize: flush what is queued (the
        # warm-up, an aborted answer's last token) so the counters cover this request alone.
        llama_cpp.llama_synchronize(ctx)
        llama_cpp.llama_perf_context_reset(ctx)
        detok = _IncrementalDetokenizer(_DetokenizerShim(tok), sampling.stop)
        output: list[int] = []
        first: float | None = None
        last = req.started
        finish_reason = "length"
        evaluated_prompt = len(prompt)
        # Only temperature, top-p and the repetition penalty are opsbot sampling settings: top-k and
        # min-p are off so the llama.cpp sampler chain means what the other engines' settings mean.
        # llama.cpp penalises repeats over its last 64 tokens (last_n_tokens_size), not the whole text.
        temp = 0.0 if sampling.temperature < 1e-5 else sampling.temperature
        grammar, processors, greedy_grammar = self._constraints(llama_cpp, llama, req, detok, len(prompt))
        tokens = llama.generate(
            prompt,
            top_k=0,
            top_p=sampling.top_p if 0.0 < sampling.top_p < 1.0 else 1.0,
            min_p=0.0,
            temp=temp,
            repeat_penalty=sampling.repetition_penalty,
            grammar=grammar,
            logits_processor=processors or None,
        )
        try:
            for token in tokens:
                last = time.perf_counter()
                if first is None:
                    first = last
                    # Only the prompt has been evaluated since the reset: what it did not evaluate
                    # came from the slot's cache. A 1-token suffix counts as a plain eval.
                    perf = llama_cpp.llama_perf_context(ctx)
                    evaluated_prompt = _evaluated(perf)
                    logger.debug(
                        "llama.cpp slot %d: %d prompt tokens, %d evaluated in %.1f ms, %d from cache",
                        slot.index,
                        len(prompt),
                        evaluated_prompt,
                        perf.t_p_eval_ms + perf.t_eval_ms,
                        len(prompt) - evaluated_prompt,
                    )
                output.append(int(token))
                req.kv_tokens = len(prompt) + len(output)
                if tok.is_end(int(token)) and not sampling.ignore_eos:
                    finish_reason = "stop"
                    break
                delta, stopped = detok.push(int(token))
                if delta and not req.post(TextDelta(delta)):
                    return None
                if stopped:
                    finish_reason = "stop"
                    break
                if req.cancel.is_set():
                    logger.info(
                        "llama.cpp engine request %s stopped after %d tokens: %s",
                        req.request_id,
                        len(output),
                        req.cancel_reason,
                    )
                    return None
                if len(output) >= budget:
                    break
        finally:
            tokens.close()
            if greedy_grammar is not None:
                greedy_grammar.close(req.request_id)
        tail = detok.flush()
        if tail and not req.post(TextDelta(tail)):
            return None
        if req.cancel.is_set():
            return None
        cached = max(0, len(prompt) - evaluated_prompt)
        with self._lock:
            self._prompt_tokens_total += len(prompt)
            self._cached_tokens_total += cached
        n = len(output)
        return GenerationResult(
            request_id=request.request_id,
            text=detok.text,
            finish_reason=finish_reason,
            prompt_tokens=len(prompt),
            cached_tokens=cached,
            output_tokens=n,
            queue_ms=(req.started - req.created) * 1e3,
            ttft_ms=(first - req.created) * 1e3 if first is not None else None,
            tpot_ms=(last - first) * 1e3 / (n - 1) if first is not None and n > 1 else None,
            e2e_ms=(last - req.created) * 1e3,
        )


__all__ = ["LlamaCppChatTokenizer", "LlamaCppEngine"]
