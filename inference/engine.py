"""The engine seam: one small interface for every inference backend, and the types it speaks.

The pipeline talks only to :class:`Engine`; the CPU engine (transformers) and the vLLM engine
(``AsyncLLM`` in-process) implement it. This module imports nothing heavy, so ``bot/`` and the
tests can use the types without torch or vLLM.

Errors form a small tree::

    EngineError
    ├── EngineStartupError     start() failed: the message names the cause and the fix
    │   └── QuantizationError       inference.quant: a model's quantization is not usable here
    ├── UnknownScenarioError   inference.scenarios: no such scenario (a config or request error)
    ├── UnknownEngineError     inference.engine_set: a scenario names an engine that does not exist
    ├── EngineGenerateError    one request failed; tell its user, carry on
    │   ├── EngineOverloadedError   admission refused (lane queue full / timed out)
    │   └── RequestAbortedError     aborted (user gone, shutdown)
    │       └── RequestTimeoutError     ran past its deadline (``engine.request_timeout_s``)
    └── EngineDeadError        the engine is gone: readiness flips, every waiter is told
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


class Lane(enum.StrEnum):
    """Priority lane a request is admitted through (see ``inference.admission``)."""

    URGENT = "urgent"
    """``/rca`` and alert summaries: someone is waiting on an incident."""
    NORMAL = "normal"
    """@-mentions and DMs."""
    BACKGROUND = "background"
    """Thread follow-ups and batch analysis: may wait while urgent work runs."""

    @property
    def vllm_priority(self) -> int:
        """vLLM ``priority`` value for this lane (lower runs first under the priority policy)."""
        return {Lane.URGENT: 0, Lane.NORMAL: 5, Lane.BACKGROUND: 10}[self]


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """Sampling parameters of one request (a scenario preset, possibly overridden)."""

    temperature: float = 0.3
    top_p: float = 0.95
    max_tokens: int = 512
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    """Benchmarks only: keep generating past end-of-sequence to get fixed-length outputs."""
    json_schema: str | None = None
    """JSON text of a JSON Schema the output must match (constrained decoding: a llama.cpp grammar,
    vLLM structured outputs, a server's ``response_format``); ``None``: free text."""
    bad_words: tuple[str, ...] = ()
    """Strings the answer must not write, as vLLM's ``bad_words`` means them (no word is ever
    completed; :mod:`inference.bad_words` does the same in the llama.cpp and CPU engines). A bad word
    that is also in ``stop`` may not even begin the answer on llama.cpp (a model echoing its prompt's
    markup starts that way, and the stop would leave the answer empty). A remote ``vllm serve``
    gets them as its ``bad_words`` parameter; other servers' APIs have none."""


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat turn; ``role`` is ``system``, ``user`` or ``assistant``."""

    role: str
    content: str


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """One tool a request may call: its name, what it does, and the JSON Schema of its arguments.

    A request with tools answers with one call in the shape :mod:`inference.tool_calls` defines
    (``{"name": ..., "arguments": {...}}``), whatever the backend: llama.cpp and vLLM decode it under
    that schema, a remote server is given the tools through its ``tools`` parameter."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(slots=True)
class GenerationRequest:
    """What the pipeline asks an engine for.

    At least one of ``messages`` (rendered by the engine's chat template) or ``prompt_token_ids``
    (already rendered, e.g. by ``bot.prompts``) must be set. When both are, the ids are the prompt
    and ``messages`` are what they were rendered from, for an engine that cannot take token ids
    (a remote server's chat endpoint, see ``inference.openai_engine``).
    """

    request_id: str
    scenario: str
    lane: Lane
    sampling: SamplingSettings
    messages: Sequence[ChatMessage] | None = None
    prompt_token_ids: Sequence[int] | None = None
    prompt_tokens_estimate: int | None = None
    """Prompt size used by admission control when token ids are not given."""
    tools: Sequence[ToolSpec] = ()
    """Tools this step may call (the output is then one call, :mod:`inference.tool_calls`)."""

    def __post_init__(self) -> None:
        if self.messages is None and self.prompt_token_ids is None:
            raise ValueError("GenerationRequest needs messages or prompt_token_ids")


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of newly generated text, in order."""

    text: str


@dataclass(slots=True)
class GenerationResult:
    """The last item of every successful ``generate`` stream: the whole text, counts and timings.

    All times are milliseconds, measured from the moment ``generate`` was called:
    ``queue_ms`` until the engine started the request (admission wait + engine queue),
    ``ttft_ms`` until the first token, ``tpot_ms`` the mean time per output token after the
    first, ``e2e_ms`` until the last token.
    """

    request_id: str
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    queue_ms: float
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float


GenerationEvent = TextDelta | GenerationResult


@dataclass(slots=True)
class EngineHealth:
    """Readiness of an engine; ``reason`` says why when not ready."""

    ready: bool
    reason: str = ""


@dataclass(slots=True)
class EngineStats:
    """A snapshot for ``/metrics`` and ``/rca status``. ``None`` means the backend cannot tell."""

    backend: str
    model: str
    running: int = 0
    waiting: int = 0
    waiting_by_lane: dict[str, int] = field(default_factory=dict)
    running_by_lane: dict[str, int] = field(default_factory=dict)
    kv_cache_usage: float | None = None
    """Fraction (0..1) of KV-cache blocks in use."""
    prefix_cache_hit_rate: float | None = None
    """Fraction (0..1) of prompt tokens served from the prefix cache since start."""
    preemptions: int | None = None
    quantization: str | None = None


class EngineError(Exception):
    """Base of every engine error."""


class EngineStartupError(EngineError):
    """The engine could not start; the message names the cause and the fix."""


class EngineGenerateError(EngineError):
    """One request failed; other requests and the engine are fine."""


class EngineOverloadedError(EngineGenerateError):
    """Admission control refused the request (its lane is full or the wait timed out)."""


class RequestAbortedError(EngineGenerateError):
    """The request was aborted before it finished (user gone, shutdown, timeout)."""


class RequestTimeoutError(RequestAbortedError):
    """The request ran longer than its deadline and was aborted (the one place that enforces
    ``engine.request_timeout_s`` is :class:`inference.admission.AdmittedEngine`)."""

    def __init__(self, request_id: str, seconds: float) -> None:
        super().__init__(
            f"request {request_id} timed out: the answer took longer than {seconds:g} s and was stopped"
        )
        self.seconds = seconds


class EngineDeadError(EngineError):
    """The engine died; no request can be served until it is restarted."""


class Engine(abc.ABC):
    """An in-process inference engine.

    Life cycle: ``await start()`` once, then any number of concurrent ``generate`` streams,
    then ``await shutdown()``. ``generate`` yields :class:`TextDelta` items as text arrives and
    ends with one :class:`GenerationResult`; closing the iterator early aborts the request.
    """

    backend: str = "abstract"

    @abc.abstractmethod
    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        """Load the model and warm up; raise :class:`EngineStartupError` on failure.

        ``warmup_messages`` (the bot's shared system prompt) is run once so that its KV blocks
        are in the prefix cache before the first real request.
        """

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Stream the answer to ``request``; raise :class:`EngineGenerateError` subclasses."""

    @abc.abstractmethod
    async def abort(self, request_id: str) -> None:
        """Stop a running request; a no-op for an unknown or finished id."""

    @abc.abstractmethod
    def health(self) -> EngineHealth:
        """Whether the engine can take requests now."""

    @abc.abstractmethod
    def stats(self) -> EngineStats:
        """Current load and cache figures."""

    @abc.abstractmethod
    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Stop taking requests, let in-flight ones finish up to the deadline, then release."""

    def declare_dead(self, reason: str) -> bool:
        """A watchdog found the engine hung: handle it as dead (fail what is in flight, restart or
        give up as configured). False: this engine cannot (only the stalled requests fail)."""
        return False

    def computing_at(self) -> float | None:
        """When (``time.monotonic()``) the engine last showed it was computing, tokens or not (a
        batch of a long prompt's evaluation): the watchdog takes no token for a while for a hang only
        if this is older too. ``None``: the engine shows only its tokens."""
        return None

    @property
    @abc.abstractmethod
    def tokenizer(self) -> ChatTokenizer:
        """The model's tokenizer, for prompt rendering and token budgets."""


class WrappedEngine(Engine):
    """An engine that hands everything to ``inner``: the base of wrappers that watch or record the
    requests going through (override :meth:`generate`, call ``self.inner``)."""

    def __init__(self, inner: Engine) -> None:
        self.inner = inner
        self.backend = inner.backend

    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        """Start ``inner``."""
        await self.inner.start(warmup_messages)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """``inner``'s stream for ``request``."""
        return self.inner.generate(request)

    async def abort(self, request_id: str) -> None:
        """Abort in ``inner``."""
        await self.inner.abort(request_id)

    def health(self) -> EngineHealth:
        """``inner``'s health."""
        return self.inner.health()

    def stats(self) -> EngineStats:
        """``inner``'s stats."""
        return self.inner.stats()

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Shut ``inner`` down."""
        await self.inner.shutdown(drain_timeout_s)

    def declare_dead(self, reason: str) -> bool:
        """Hand the watchdog's verdict to ``inner``."""
        return self.inner.declare_dead(reason)

    def computing_at(self) -> float | None:
        """``inner``'s."""
        return self.inner.computing_at()

    @property
    def tokenizer(self) -> ChatTokenizer:
        """``inner``'s tokenizer."""
        return self.inner.tokenizer


class ChatTokenizer(abc.ABC):
    """Token counting and chat-template rendering with the model's own tokenizer."""

    @abc.abstractmethod
    def count(self, text: str) -> int:
        """Number of tokens ``text`` encodes to (no special tokens)."""

    @abc.abstractmethod
    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` through the model's chat template."""

    @abc.abstractmethod
    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (special tokens skipped)."""


async def drain_running(
    label: str, running: Callable[[], int], idle: Callable[[], Awaitable[object]], timeout_s: float
) -> int:
    """The first half of every engine's shutdown: wait up to ``timeout_s`` for the requests running
    now to finish (``idle()`` resolves when none is left) and return how many still run, for the
    engine to abort its own way. Both steps are logged under ``label``."""
    count = running()
    if count:
        logger.info("%s: draining %d request(s) for up to %.1f s", label, count, timeout_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(idle(), max(timeout_s, 0.0))
    left = running()
    if left:
        logger.warning("%s: aborting %d request(s) still running at shutdown", label, left)
    return left
