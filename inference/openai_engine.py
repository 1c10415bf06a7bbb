"""The remote engine: an OpenAI-compatible model server behind the :class:`Engine` interface.

``engine.backend = "openai"`` streams every answer from a server at ``engine.base_url``: vLLM's
``vllm serve``, llama.cpp's ``llama-server``, Ollama, TGI or anything else that speaks OpenAI's
``/v1`` routes. It is the design most ChatOps tools use (bot -> HTTP -> model server) and the one
opsbot's in-process engines are measured against; teams that already run a model server use it
as it is.

**Server kinds** (``engine.server_kind``; ``auto`` detects it at start from ``/v1/models``'
``owned_by``, then ``GET /api/version`` for Ollama and ``GET /info`` for TGI):

=========  ==============  ====================  ============  ===========================
kind       health route    prompt                ``priority``  tokenizer without a local one
=========  ==============  ====================  ============  ===========================
vllm       ``/health``     token ids (``/v1/     sent          ``/tokenize``, ``/detokenize``
                           completions``)
llamacpp   ``/health``     token ids             not sent      ``/apply-template``,
                                                               ``/tokenize``, ``/detokenize``
tgi        ``/health``     chat messages         not sent      none: set ``engine.tokenizer``
ollama     ``/v1/models``  chat messages         not sent      none: set ``engine.tokenizer``
openai     ``/v1/models``  chat messages         not sent      none: set ``engine.tokenizer``
=========  ==============  ====================  ============  ===========================

**Prompts.** The bot renders the chat template itself and sends token ids, so the prompt it
budgeted is exactly the prompt the server runs (and the shared system prompt is the same prefix
every time, which the server's prefix cache needs). vLLM's ``/v1/completions`` takes a list of ids
as ``prompt``; llama.cpp's does too (no BOS is added to an id list). Ollama and TGI take text only,
and text through ``/v1/completions`` would be templated a second time (Ollama) or not at all, so
for them the request's ``messages`` go to ``/v1/chat/completions`` and the server applies its own
template (``engine.server_prompt`` overrides the choice).

**Tool calls** (the investigation loop): on the chat route the tools go in OpenAI's ``tools``
parameter and the server's tool-call parser answers (``delta.tool_calls``). Token ids have no chat
template for a parser to read, so there the decision's JSON schema is the server's structured output
(``response_format``; llama.cpp's ``json_schema``): the grammar the in-process engines apply, and the
text that comes back is the decision every engine gives.

**Lanes** are sent as vLLM's ``priority`` field (urgent 0, normal 5, background 10; lower runs
first). vLLM 0.26 honours it under ``--scheduling-policy priority`` and silently ignores it under
the default ``fcfs`` (it raises no error), so opsbot sends it to vLLM always; other servers do not
know the field. Admission control (``inference.admission``) still runs in front of this engine.

**Timings** are measured here, from the moment ``generate`` is called: TTFT when the first token's
chunk arrives, TPOT as the mean gap between token chunks after the first, e2e at the end of the
stream. The server's queue time is unknown, so ``queue_ms`` is 0 (admission control adds its own
wait on top), except where vLLM runs with ``--enable-per-request-metrics``: then its reported
``queue_time_ms`` is used. Counts come from the final ``usage`` chunk (``stream_options.
include_usage``): ``prompt_tokens``, ``completion_tokens`` and ``prompt_tokens_details.
cached_tokens`` (vLLM needs ``--enable-prompt-tokens-details``; llama.cpp's ``timings.cache_n`` is
the fallback); a server that reports no usage gets the sent id count and the token chunks counted.

**Abort** closes the HTTP stream; vLLM, llama.cpp and TGI abort the request when the client
disconnects. **Health**: the health route is polled every ``engine.health_interval_s`` in the
background, so ``health()`` (and ``/readyz``) flips when the server goes away and back when it
returns; a failed connection during a request flips it at once.

**Errors**::

    start():  server unreachable, 401, unknown model (lists what /v1/models offers), a context
              window smaller than engine.max_model_len, no tokenizer    -> EngineStartupError
    generate: cannot connect, 502 / 503 / 504, 401 / 403 / 404,
              connection lost mid-stream                                 -> EngineDeadError
              429                                                        -> EngineOverloadedError
              other 4xx, 500, an error event inside the stream,
              no data for engine.request_read_timeout_s                  -> EngineGenerateError
              abort() or shutdown                                        -> RequestAbortedError

**Tokenizer** (``engine.tokenizer``, the bot's prompt budgets): ``engine.tokenizer`` when set, else
``engine.model`` when it is a local folder with tokenizer files, else the server's own tokenizer
routes (:mod:`inference.server_tokenizer`: one blocking HTTP call per count or render, so a local
tokenizer is the faster choice), else a startup error naming ``engine.tokenizer``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp

from inference import tool_calls
from inference.config import EngineConfig
from inference.engine import (
    ChatMessage,
    ChatTokenizer,
    Engine,
    EngineDeadError,
    EngineError,
    EngineGenerateError,
    EngineHealth,
    EngineOverloadedError,
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

logger = logging.getLogger(__name__)

Kind = Literal["vllm", "llamacpp", "ollama", "tgi", "openai"]
_T = TypeVar("_T")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True, slots=True)
class ServerTraits:
    """What one kind of server accepts (see the module doc's table)."""

    health_path: str
    token_ids: bool
    """``/v1/completions`` takes a list of token ids as ``prompt``."""
    priority: bool
    """Requests may carry vLLM's ``priority`` field."""
    tokenizer: Literal["vllm", "llamacpp"] | None
    """Which tokenizer routes the server has, if any."""
    sampling_extras: Mapping[str, str] = field(default_factory=dict)
    """Our sampling fields beyond OpenAI's, by the name this server reads them under."""


SERVER_TRAITS: dict[Kind, ServerTraits] = {
    "vllm": ServerTraits(
        "/health",
        True,
        True,
        "vllm",
        {"repetition_penalty": "repetition_penalty", "ignore_eos": "ignore_eos", "bad_words": "bad_words"},
    ),
    "llamacpp": ServerTraits(
        "/health",
        True,
        False,
        "llamacpp",
        {"repetition_penalty": "repeat_penalty", "ignore_eos": "ignore_eos"},
    ),
    "tgi": ServerTraits("/health", False, False, None),
    "ollama": ServerTraits("/v1/models", False, False, None),
    "openai": ServerTraits("/v1/models", False, False, None),
}


def normalize_base_url(url: str) -> str:
    """``url`` without a trailing slash or ``/v1`` (routes such as ``/health`` live at the root)."""
    url = url.strip().rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


class _ServerError(Exception):
    """An HTTP error answer of the server, before it is mapped onto the engine's error tree."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


@dataclass
class _AnswerStream:
    """What one answer's server-sent chunks have said so far: its text, tool calls, timings and the
    server's usage, metrics and cache counts."""

    chat: bool
    """The chat route (deltas in ``delta.content``) rather than completions (``text``)."""
    pieces: list[str] = field(default_factory=list)
    first: float | None = None
    last: float = 0.0
    chunks: int = 0
    finish: str | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    calls: dict[int, list[str]] = field(default_factory=dict)
    """Tool calls streamed by the server: index -> [name, arguments text so far]."""
    server_metrics: dict[str, Any] = field(default_factory=dict)
    cache_n: int | None = None

    def feed(self, chunk: dict[str, Any]) -> list[str]:
        """The text deltas one chunk brings, in order; an empty one marks the first token (of text
        or of a tool call), so admission can end the request's prefill there."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        if isinstance(chunk.get("metrics"), dict):
            self.server_metrics = chunk["metrics"]
        timings = chunk.get("timings")
        if isinstance(timings, dict) and isinstance(timings.get("cache_n"), int):
            self.cache_n = timings["cache_n"]
        deltas: list[str] = []
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            if _add_tool_call(choice, self.calls) and self._tick():
                deltas.append("")
            text, is_token = _token_of(choice, self.chat)
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
            if not is_token:
                continue
            if self._tick() or text:
                self.pieces.append(text)
                deltas.append(text)
        return deltas

    def _tick(self) -> bool:
        """Count one token-bearing chunk; whether it is the answer's first."""
        self.chunks += 1
        self.last = time.perf_counter()
        if self.first is None:
            self.first = self.last
            return True
        return False

    def result(self, rid: str, sent_ids: int | None, t0: float, *, tools: bool) -> GenerationResult:
        """The finished answer: counts from the server's usage where it sent them, else our own."""
        t_end = time.perf_counter()
        usage = self.usage
        details = usage.get("prompt_tokens_details")
        cached = _int(details.get("cached_tokens")) if isinstance(details, dict) else None
        queue_ms = self.server_metrics.get("queue_time_ms")
        text = "".join(self.pieces)
        if tools:
            # One decision in the shape every engine gives (inference.tool_calls): the first call,
            # or the final answer when the model called nothing.
            first_call = self.calls[min(self.calls)] if self.calls else None
            if first_call is not None:
                text = tool_calls.decision_text(first_call[0], first_call[1])
            else:
                text = tool_calls.decision_text(tool_calls.FINAL_ANSWER, {})
        first, chunks = self.first, self.chunks
        return GenerationResult(
            request_id=rid,
            text=text,
            finish_reason=self.finish or "stop",
            prompt_tokens=_int(usage.get("prompt_tokens")) or sent_ids or 0,
            cached_tokens=cached if cached is not None else (self.cache_n or 0),
            output_tokens=_int(usage.get("completion_tokens")) or chunks,
            queue_ms=float(queue_ms) if isinstance(queue_ms, int | float) else 0.0,
            ttft_ms=None if first is None else (first - t0) * 1e3,
            tpot_ms=(self.last - first) * 1e3 / (chunks - 1) if first is not None and chunks > 1 else None,
            e2e_ms=(t_end - t0) * 1e3,
        )


@dataclass(eq=False)
class _Call:
    """One request in flight: what ``abort`` needs to stop it."""

    request_id: str
    lane: Lane
    response: aiohttp.ClientResponse | None = None
    first_token: bool = False
    aborted: str | None = None
    abort_event: asyncio.Event = field(default_factory=asyncio.Event)

    def abort(self, reason: str) -> None:
        """Close the stream: the reader fails with :class:`RequestAbortedError`, the server aborts."""
        if self.aborted is not None:
            return
        self.aborted = reason
        self.abort_event.set()
        if self.response is not None:
            self.response.content.set_exception(
                RequestAbortedError(f"request {self.request_id} was {reason}")
            )
            self.response.close()


@dataclass
class _ServerStats:
    """vLLM's own figures, scraped from its ``/metrics`` with each health check."""

    running: int | None = None
    waiting: int | None = None
    kv_cache_usage: float | None = None
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    preemptions: int | None = None


class OpenAIEngine(Engine):
    """:class:`Engine` over an OpenAI-compatible HTTP server (see the module doc)."""

    backend = "openai"

    def __init__(self, config: EngineConfig) -> None:
        """``config`` is the one engine configuration; this engine reads ``base_url``, ``api_key``,
        ``served_model_name`` (else ``model``), ``server_kind``, ``server_prompt``, ``server_priority``,
        ``tokenizer`` / ``model`` / ``trust_remote_code`` for a local tokenizer, ``max_model_len``,
        ``request_connect_timeout_s``, ``request_read_timeout_s``, ``health_interval_s``,
        ``server_wait_s`` and ``server_max_connections``."""
        if not config.base_url:
            raise ValueError("engine.backend = 'openai' needs engine.base_url (the model server's URL)")
        self.config = config
        self.base_url = normalize_base_url(config.base_url)
        self.model = config.served_model_name or config.model or ""
        self.kind: Kind | None = None if config.server_kind == "auto" else config.server_kind
        self.prompt_mode: Literal["token_ids", "messages"] = "messages"
        self.send_priority = False
        self.tokenizer_source = ""
        """Where the tokenizer came from: a folder / id, or ``server``."""
        self.warmup_cached_tokens = 0
        """``cached_tokens`` the server reported for the warm-up request."""
        self._state: Literal["new", "starting", "ready", "stopping", "stopped"] = "new"
        self._failure = ""
        self._server_ok = False
        self._server_reason = "not started"
        self._session: aiohttp.ClientSession | None = None
        self._tokenizer: ChatTokenizer | None = None
        self._active: dict[str, _Call] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._watch_task: asyncio.Task[None] | None = None
        self._probe_now = asyncio.Event()
        self._server_stats = _ServerStats()
        self._max_model_len: int | None = None

    # --- life cycle ------------------------------------------------------------------------------

    async def start(self, warmup_messages: Sequence[ChatMessage] = ()) -> None:
        """Reach the server, check the model name, pick the tokenizer and warm the prefix cache.

        Raises :class:`EngineStartupError` naming the cause and the fix.
        """
        if self._state != "new":
            raise EngineStartupError(f"the openai engine cannot start twice (it is {self._state})")
        self._state = "starting"
        t0 = time.perf_counter()
        cfg = self.config
        headers = {"Authorization": f"Bearer {cfg.api_key.get_secret_value()}"} if cfg.api_key else {}
        self._session = aiohttp.ClientSession(
            headers=headers,
            connector=aiohttp.TCPConnector(limit=cfg.server_max_connections, limit_per_host=0),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=cfg.request_connect_timeout_s, sock_read=cfg.request_read_timeout_s
            ),
            read_bufsize=2**20,
        )
        try:
            cards = await self._wait_for_models()
            await self._settle_kind(cards)
            self._check_model(cards)
            self._tokenizer = await asyncio.to_thread(self._make_tokenizer)
            traits = SERVER_TRAITS[self._kind]
            if cfg.server_prompt == "auto":
                self.prompt_mode = "token_ids" if traits.token_ids else "messages"
            else:
                self.prompt_mode = cfg.server_prompt
            self.send_priority = traits.priority if cfg.server_priority is None else cfg.server_priority
            self._server_ok, self._server_reason = True, ""
            self._state = "ready"
            await self._warm_up(warmup_messages)
        except BaseException as exc:
            self._state = "stopped"
            self._failure = str(exc) if isinstance(exc, EngineError) else f"{type(exc).__name__}: {exc}"
            await self._close_session()
            if isinstance(exc, EngineStartupError) or not isinstance(exc, Exception):
                raise
            raise EngineStartupError(f"the openai engine could not start: {self._failure}") from exc
        self._watch_task = asyncio.create_task(self._watch(), name="openai-engine-health")
        logger.info(
            "openai engine ready in %.1f s: %s server at %s, model %s, prompts as %s, priority %s, "
            "tokenizer %s, %d warm-up prompt tokens cached",
            time.perf_counter() - t0,
            self._kind,
            self.base_url,
            self.model,
            self.prompt_mode,
            "sent" if self.send_priority else "not sent",
            self.tokenizer_source,
            self.warmup_cached_tokens,
        )

    @property
    def _kind(self) -> Kind:
        assert self.kind is not None
        return self.kind

    async def _wait_for_models(self) -> list[dict[str, Any]]:
        """``/v1/models``' cards, waiting up to ``server_wait_s`` for the server to come up."""
        deadline = time.monotonic() + self.config.server_wait_s
        last_log = time.monotonic()
        started = time.monotonic()
        while True:
            try:
                body = await self._get_json("/v1/models")
            except _ServerError as exc:
                if exc.status in (401, 403):
                    raise EngineStartupError(
                        f"the model server at {self.base_url} refused opsbot ({exc.status}: {exc.message}). "
                        "Fix: set engine.api_key (OPSBOT_ENGINE__API_KEY) to the key the server was "
                        "started with (vllm serve --api-key)"
                    ) from None
                if exc.status == 404:
                    raise EngineStartupError(
                        f"{self.base_url}/v1/models does not exist, so this is not the root of an "
                        "OpenAI-compatible server. Fix: set engine.base_url to the server's root, "
                        "e.g. http://127.0.0.1:8000"
                    ) from None
                problem = f"it answered {exc.status}: {exc.message}"  # 503 while a model loads
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                problem = _describe(exc)
            else:
                data = body.get("data") if isinstance(body, dict) else None
                if not isinstance(data, list):
                    raise EngineStartupError(
                        f"{self.base_url}/v1/models answered without a model list ({str(body)[:200]}). "
                        "Fix: point engine.base_url at an OpenAI-compatible server"
                    )
                return [card for card in data if isinstance(card, dict)]
            now = time.monotonic()
            if now >= deadline:
                waited = f" after waiting {now - started:.0f} s" if self.config.server_wait_s else ""
                raise EngineStartupError(
                    f"cannot reach the model server at {self.base_url}{waited}: {problem}. Fix: start it "
                    "(e.g. `vllm serve MODEL --port 8000`), correct engine.base_url, or let opsbot wait "
                    "for it with engine.server_wait_s"
                )
            if now - last_log >= _PROGRESS_EVERY_S:
                last_log = now
                logger.info(
                    "waiting for the model server at %s (%.0f s of %.0f s): %s",
                    self.base_url,
                    now - started,
                    self.config.server_wait_s,
                    problem,
                )
            await asyncio.sleep(min(0.5, max(deadline - now, 0.0)))

    async def _settle_kind(self, cards: list[dict[str, Any]]) -> None:
        if self.kind is not None:
            return
        owners = {str(card.get("owned_by", "")) for card in cards}
        if "vllm" in owners:
            self.kind = "vllm"
        elif "llamacpp" in owners:
            self.kind = "llamacpp"
        elif await self._answers("/api/version", "version"):
            self.kind = "ollama"
        elif await self._answers("/info", "router"):
            self.kind = "tgi"
        else:
            self.kind = "openai"
        logger.info("model server at %s is %s (engine.server_kind = auto)", self.base_url, self.kind)

    async def _answers(self, path: str, key: str) -> bool:
        try:
            body = await self._get_json(path)
        except (_ServerError, aiohttp.ClientError, TimeoutError, OSError):
            return False
        return isinstance(body, dict) and key in body

    def _check_model(self, cards: list[dict[str, Any]]) -> None:
        offered = [str(card.get("id")) for card in cards if card.get("id") is not None]
        listing = ", ".join(offered) or "nothing"
        if not self.model:
            raise EngineStartupError(
                f"no model name configured; the server at {self.base_url} serves: {listing}. Fix: set "
                "engine.served_model_name (or engine.model) to one of them"
            )
        if self.model not in offered:
            if self.kind == "llamacpp":
                # llama-server serves its one model under any name.
                logger.warning(
                    "llama.cpp at %s lists %s, not %r; it serves its one model whatever the name",
                    self.base_url,
                    listing,
                    self.model,
                )
                return
            raise EngineStartupError(
                f"the model server at {self.base_url} does not serve a model named {self.model!r}; it "
                f"serves: {listing}. Fix: set engine.served_model_name (or engine.model) to one of them"
            )
        card = next(card for card in cards if str(card.get("id")) == self.model)
        window = card.get("max_model_len")
        if isinstance(window, int):
            self._max_model_len = window
            if window < self.config.max_model_len:
                raise EngineStartupError(
                    f"the server's context window for {self.model} is {window} tokens but "
                    f"engine.max_model_len is {self.config.max_model_len}, so opsbot would build prompts "
                    f"the server refuses. Fix: set engine.max_model_len = {window} (or start the server "
                    "with a larger --max-model-len)"
                )

    def _make_tokenizer(self) -> ChatTokenizer:
        cfg = self.config
        local = cfg.tokenizer
        if local is None and cfg.model and _has_tokenizer_files(cfg.model):
            local = cfg.model
        if local is not None:
            from inference.tokenization import HFChatTokenizer

            self.tokenizer_source = local
            return HFChatTokenizer(local, trust_remote_code=cfg.trust_remote_code)
        routes = SERVER_TRAITS[self._kind].tokenizer
        if routes is None:
            raise EngineStartupError(
                f"the {self._kind} server at {self.base_url} has no tokenizer routes, and opsbot needs "
                "the model's tokenizer for its prompt budgets. Fix: set engine.tokenizer to the model's "
                "tokenizer folder or Hugging Face id"
            )
        from inference.server_tokenizer import ServerTokenizer

        api_key = cfg.api_key.get_secret_value() if cfg.api_key else None
        tokenizer = ServerTokenizer(
            self.base_url,
            kind=routes,
            model=self.model,
            api_key=api_key,
            timeout_s=cfg.request_connect_timeout_s + 10.0,
        )
        try:
            tokenizer.render([ChatMessage("user", "ping")])
        except EngineError as exc:
            raise EngineStartupError(
                f"the server's tokenizer does not work ({exc}). Fix: set engine.tokenizer to the "
                "model's tokenizer folder or Hugging Face id"
            ) from exc
        self.tokenizer_source = "server"
        return tokenizer

    async def _warm_up(self, warmup_messages: Sequence[ChatMessage]) -> None:
        """One 1-token request with the shared system prompt: it lands in the server's prefix cache."""
        messages = list(warmup_messages) or [ChatMessage("user", "ping")]
        ids: list[int] | None = None
        if self.prompt_mode == "token_ids":
            ids = await asyncio.to_thread(
                self.tokenizer.render, messages, add_generation_prompt=not warmup_messages
            )
        elif warmup_messages and messages[-1].role != "user":
            messages.append(ChatMessage("user", "ping"))  # chat templates want a user turn
        request = GenerationRequest(
            request_id=f"opsbot-warmup-{int(time.time() * 1000)}",
            scenario="warmup",
            lane=Lane.BACKGROUND,
            sampling=SamplingSettings(temperature=0.0, max_tokens=1),
            messages=messages,
            prompt_token_ids=ids,
        )
        t0 = time.perf_counter()
        try:
            async for event in self.generate(request):
                if isinstance(event, GenerationResult):
                    self.warmup_cached_tokens = event.cached_tokens
                    logger.info(
                        "openai engine: warm-up done in %.0f ms (%d prompt tokens)",
                        (time.perf_counter() - t0) * 1e3,
                        event.prompt_tokens,
                    )
        except EngineError as exc:
            fix = (
                "set engine.server_prompt = 'messages' if this server takes no token ids"
                if self.prompt_mode == "token_ids"
                else "check the server's log for the cause"
            )
            raise EngineStartupError(
                f"the warm-up request to {self.base_url} failed: {exc}. Fix: {fix}"
            ) from exc

    async def shutdown(self, drain_timeout_s: float = 30.0) -> None:
        """Refuse new requests, let running ones finish up to ``drain_timeout_s``, abort the rest."""
        if self._state in ("stopping", "stopped"):
            return
        if self._state == "new":
            self._state = "stopped"
            return
        self._state = "stopping"
        if await drain_running("openai engine", lambda: len(self._active), self._idle.wait, drain_timeout_s):
            for call in list(self._active.values()):
                call.abort("stopped: the engine shut down")
            # Their streams are closed, so the server stops them; readers learn on their next read.
            self._active.clear()
            self._idle.set()
        if self._watch_task is not None:
            self._watch_task.cancel()
            with contextlib.suppress(BaseException):
                await self._watch_task
            self._watch_task = None
        await self._close_session()
        close = getattr(self._tokenizer, "close", None)
        if close is not None:
            close()
        self._state = "stopped"
        logger.info("openai engine stopped")

    async def _close_session(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- health ----------------------------------------------------------------------------------

    def health(self) -> EngineHealth:
        """Ready while started and the server's health route answers (polled in the background)."""
        if self._state == "ready":
            if self._server_ok:
                return EngineHealth(True)
            return EngineHealth(False, self._server_reason)
        reasons = {
            "new": "the openai engine is not started",
            "starting": f"connecting to the model server at {self.base_url}",
            "stopping": "the openai engine is shutting down",
            "stopped": f"the openai engine failed to start: {self._failure}"
            if self._failure
            else "the openai engine is shut down",
        }
        return EngineHealth(False, reasons[self._state])

    async def _watch(self) -> None:
        """Poll the health route (and vLLM's ``/metrics``) until shutdown."""
        while self._state == "ready":
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that coincides
            # with the event being set, and shutdown would wait for this task for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.health_interval_s):
                    await self._probe_now.wait()
            self._probe_now.clear()
            await self._probe()

    async def _probe(self) -> None:
        path = SERVER_TRAITS[self._kind].health_path
        try:
            await self._get(path)
        except _ServerError as exc:
            self._set_server(False, f"the model server at {self.base_url} is unhealthy ({path}: {exc})")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._set_server(False, f"the model server at {self.base_url} is unreachable: {_describe(exc)}")
        else:
            self._set_server(True, "")
            if self.kind == "vllm":
                await self._scrape_metrics()

    def _set_server(self, ok: bool, reason: str) -> None:
        if ok and not self._server_ok:
            logger.warning("the model server at %s answers again", self.base_url)
        elif not ok and self._server_ok:
            logger.error("%s", reason)
        self._server_ok = ok
        self._server_reason = reason

    def _server_lost(self, reason: str) -> None:
        """A request saw the server fail: not ready now, and check again at once."""
        self._set_server(False, reason)
        self._probe_now.set()

    async def _scrape_metrics(self) -> None:
        try:
            text = await self._get("/metrics")
        except (_ServerError, aiohttp.ClientError, TimeoutError, OSError):
            return
        from prometheus_client.parser import text_string_to_metric_families

        stats = _ServerStats()
        try:
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.labels.get("model_name") not in (None, self.model):
                        continue
                    name, value = sample.name, float(sample.value)
                    if name == "vllm:num_requests_running":
                        stats.running = int(value) + (stats.running or 0)
                    elif name == "vllm:num_requests_waiting":
                        stats.waiting = int(value) + (stats.waiting or 0)
                    elif name == "vllm:kv_cache_usage_perc":
                        stats.kv_cache_usage = value
                    elif name == "vllm:prefix_cache_queries_total":
                        stats.prefix_queries += value
                    elif name == "vllm:prefix_cache_hits_total":
                        stats.prefix_hits += value
                    elif name == "vllm:num_preemptions_total":
                        stats.preemptions = int(value) + (stats.preemptions or 0)
        except ValueError as exc:
            logger.debug("cannot parse %s/metrics: %s", self.base_url, exc)
            return
        self._server_stats = stats

    def stats(self) -> EngineStats:
        """Requests in flight from here; with vLLM also its running / waiting counts and cache figures."""
        running = sum(1 for call in self._active.values() if call.first_token)
        waiting = len(self._active) - running
        server = self._server_stats if self._state == "ready" else _ServerStats()
        hit_rate = server.prefix_hits / server.prefix_queries if server.prefix_queries else None
        return EngineStats(
            backend=self.backend,
            model=self.model,
            running=server.running if server.running is not None else running,
            waiting=server.waiting if server.waiting is not None else waiting,
            kv_cache_usage=server.kv_cache_usage,
            prefix_cache_hit_rate=hit_rate,
            preemptions=server.preemptions,
        )

    @property
    def tokenizer(self) -> ChatTokenizer:
        """The model's tokenizer (local, or the server's routes), available once ``start`` returned."""
        if self._tokenizer is None:
            raise EngineDeadError("the openai engine has no tokenizer yet: call start() first")
        return self._tokenizer

    # --- requests --------------------------------------------------------------------------------

    async def abort(self, request_id: str) -> None:
        """Close ``request_id``'s stream; it raises :class:`RequestAbortedError`, the server aborts it."""
        call = self._active.get(request_id)
        if call is not None:
            call.abort("aborted")

    def _check_ready(self, request_id: str) -> aiohttp.ClientSession:
        if self._state == "ready" and self._session is not None:
            return self._session
        if self._state in ("stopping", "stopped") and not self._failure:
            raise RequestAbortedError(f"request {request_id}: the openai engine is shutting down")
        raise EngineDeadError(f"the openai engine is not ready ({self.health().reason})")

    def _request(self, request: GenerationRequest) -> tuple[str, dict[str, Any], int | None]:
        """(path, JSON body, prompt length when sent as ids) for ``request``."""
        s = request.sampling
        traits = SERVER_TRAITS[self._kind]
        body: dict[str, Any] = {"model": self.model}
        sent_ids: int | None = None
        max_tokens = s.max_tokens
        if request.prompt_token_ids is not None and (
            self.prompt_mode == "token_ids" or request.messages is None
        ):
            if self.prompt_mode != "token_ids":
                raise EngineGenerateError(
                    "the request carries only token ids and this server takes chat messages "
                    "(engine.server_prompt = messages)"
                )
            ids = [int(i) for i in request.prompt_token_ids]
            window = self.config.max_model_len
            if len(ids) >= window:
                raise EngineGenerateError(
                    f"the prompt is {len(ids)} tokens and the context window is {window}; "
                    "shorten the question or the context"
                )
            max_tokens = min(max_tokens, window - len(ids))
            path, sent_ids = "/v1/completions", len(ids)
            body["prompt"] = ids
        else:
            assert request.messages is not None
            path = "/v1/chat/completions"
            body["messages"] = [{"role": m.role, "content": m.content} for m in request.messages]
        body.update(
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
        )
        if s.seed is not None:
            body["seed"] = s.seed
        if s.stop:
            body["stop"] = list(s.stop)
        extras = traits.sampling_extras
        if s.repetition_penalty != 1.0 and "repetition_penalty" in extras:
            body[extras["repetition_penalty"]] = s.repetition_penalty
        if s.ignore_eos and "ignore_eos" in extras:
            body[extras["ignore_eos"]] = True
        if s.bad_words and "bad_words" in extras:
            body[extras["bad_words"]] = list(s.bad_words)
        if self.send_priority:
            body["priority"] = request.lane.vllm_priority
        if request.tools and path.endswith("chat/completions"):
            # The server's own tool-call parser: calls come back as delta.tool_calls, not as text.
            body["tools"] = tool_calls.openai_tools(request.tools)
            body["tool_choice"] = "auto"
        elif request.tools and s.json_schema is None:
            raise EngineGenerateError(
                "tool calls on token ids need the decision's schema (or engine.server_prompt = messages)"
            )
        elif s.json_schema is not None:
            # Token ids (vLLM, llama.cpp) have no chat template for a tool parser to read: the
            # decision's own schema is the server's structured output, the grammar the in-process
            # engines use, and the text that comes back is the decision every engine gives.
            schema = json.loads(s.json_schema)
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "opsbot_output", "schema": schema, "strict": True},
            }
            if self._kind == "llamacpp":  # llama-server's own field: its /v1/completions ignores the other
                body["json_schema"] = schema
        return path, body, sent_ids

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:
        """Stream ``request`` from the server (see :meth:`Engine.generate`). The first delta may be
        empty: it marks the first token (admission control ends the request's prefill there)."""
        t0 = time.perf_counter()
        rid = request.request_id
        session = self._check_ready(rid)
        if rid in self._active:
            raise EngineGenerateError(f"request {rid} is already running")
        path, body, sent_ids = self._request(request)
        call = _Call(rid, request.lane)
        self._active[rid] = call
        self._idle.clear()
        stream = _AnswerStream(chat=path.endswith("chat/completions"))
        done = False
        response: aiohttp.ClientResponse | None = None
        try:
            try:
                response = await self._until_aborted(
                    call, session.post(self.base_url + path, json=body, headers={"X-Request-Id": rid})
                )
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                reason = f"cannot reach the model server at {self.base_url}: {_describe(exc)}"
                self._server_lost(reason)
                raise EngineDeadError(reason) from exc
            call.response = response
            if call.aborted is not None:
                raise RequestAbortedError(f"request {rid} was {call.aborted}")
            if response.status != 200:
                raise self._map_status(response.status, _error_message(await response.text()), rid)
            try:
                async for data in _sse_data(response.content):
                    if data == "[DONE]":
                        done = True
                        break
                    chunk = _loads(data)
                    if "error" in chunk:
                        raise _stream_error(chunk["error"], rid)
                    for delta in stream.feed(chunk):
                        call.first_token = True
                        yield TextDelta(delta)
            except RequestAbortedError:
                raise
            except TimeoutError as exc:  # aiohttp's ServerTimeoutError too: sock_read ran out
                raise EngineGenerateError(
                    f"the model server sent nothing for {self.config.request_read_timeout_s} s; "
                    f"request {rid} was given up"
                ) from exc
            except (aiohttp.ClientError, ConnectionError) as exc:
                if call.aborted is not None:
                    raise RequestAbortedError(f"request {rid} was {call.aborted}") from None
                reason = (
                    f"the model server at {self.base_url} dropped the connection mid-answer "
                    f"({_describe(exc)})"
                )
                self._server_lost(reason)
                raise EngineDeadError(reason) from exc
            if call.aborted is not None:
                raise RequestAbortedError(f"request {rid} was {call.aborted}")
            if not done and stream.finish is None:
                reason = (
                    f"the model server at {self.base_url} ended the stream before the answer was complete"
                )
                self._server_lost(reason)
                raise EngineDeadError(reason)
            if stream.finish == "abort":
                raise RequestAbortedError(f"request {rid} was aborted by the model server")
        finally:
            if response is not None:
                if done:
                    response.release()  # the stream ended cleanly: the connection goes back to the pool
                else:
                    response.close()  # consumer gone, abort or error: the server sees the disconnect
            self._active.pop(rid, None)
            if not self._active:
                self._idle.set()
        if not self._server_ok and self._state == "ready":
            self._set_server(True, "")  # a complete answer is proof enough
        yield stream.result(rid, sent_ids, t0, tools=bool(request.tools) and "tools" in body)

    async def _until_aborted(self, call: _Call, awaitable: Awaitable[_T]) -> _T:
        """``awaitable``'s result, or :class:`RequestAbortedError` as soon as ``call`` is aborted."""
        task = asyncio.ensure_future(awaitable)
        aborted = asyncio.ensure_future(call.abort_event.wait())
        try:
            await asyncio.wait({task, aborted}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            aborted.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):
                    result = await task
                    if isinstance(result, aiohttp.ClientResponse):
                        result.close()
        if task.cancelled():
            raise RequestAbortedError(f"request {call.request_id} was {call.aborted}")
        return task.result()

    def _map_status(self, status: int, message: str, rid: str) -> EngineError:
        where = f"the model server at {self.base_url}"
        if status in (401, 403):
            reason = f"{where} refused the API key ({status}: {message}); check engine.api_key"
            self._server_lost(reason)
            return EngineDeadError(reason)
        if status == 404:
            reason = f"{where} answered 404 for model {self.model!r}: {message}"
            self._server_lost(reason)
            return EngineDeadError(reason)
        if status == 429:
            return EngineOverloadedError(f"{where} is overloaded (429: {message}); try again shortly")
        if status in (502, 503, 504):
            reason = f"{where} is unavailable ({status}: {message})"
            self._server_lost(reason)
            return EngineDeadError(reason)
        if status >= 500:
            logger.warning("the request failed on the model server: %s %s", status, message)
            return EngineGenerateError(f"the model server failed this request ({status}: {message})")
        return EngineGenerateError(f"the model server refused this request ({status}: {message})")

    # --- plain HTTP ------------------------------------------------------------------------------

    async def _get(self, path: str) -> str:
        """GET ``path``; its body, or :class:`_ServerError` for a non-200 answer."""
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=self.config.request_connect_timeout_s + 10.0)
        async with self._session.get(self.base_url + path, timeout=timeout) as response:
            text = await response.text()
            if response.status != 200:
                raise _ServerError(response.status, _error_message(text))
            return text

    async def _get_json(self, path: str) -> Any:
        text = await self._get(path)
        try:
            return json.loads(text)
        except ValueError:
            raise _ServerError(200, f"not JSON: {text[:200]}") from None


async def _sse_data(content: aiohttp.StreamReader) -> AsyncIterator[str]:
    """The ``data`` of each server-sent event (WHATWG rules: lines, blank line ends an event)."""
    lines: list[str] = []
    async for raw in content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if lines:
                yield "\n".join(lines)
                lines = []
            continue
        if line.startswith(":"):
            continue  # a comment, e.g. llama.cpp's keep-alive ping
        name, _, value = line.partition(":")
        if name == "data":
            lines.append(value[1:] if value.startswith(" ") else value)
    if lines:
        yield "\n".join(lines)


def _token_of(choice: dict[str, Any], chat: bool) -> tuple[str, bool]:
    """(text, whether this choice chunk carries a generated token)."""
    if not chat:
        text = choice.get("text")
        return (text if isinstance(text, str) else ""), True
    delta = choice.get("delta") or {}
    content = delta.get("content") if isinstance(delta, dict) else None
    text = content if isinstance(content, str) else ""
    # vLLM opens with {"role": "assistant", "content": ""} before any token; Ollama puts the role
    # on the first token's chunk. A finish chunk always ends on a token (possibly EOS, no text).
    is_token = (
        bool(text)
        or bool(choice.get("finish_reason"))
        or (isinstance(delta, dict) and "role" not in delta and "content" in delta)
    )
    return text, is_token


def _add_tool_call(choice: dict[str, Any], calls: dict[int, list[str]]) -> bool:
    """Fold a chunk's ``delta.tool_calls`` pieces into ``calls``; whether it carried any."""
    delta = choice.get("delta")
    pieces = delta.get("tool_calls") if isinstance(delta, dict) else None
    if not isinstance(pieces, list) or not pieces:
        return False
    for piece in pieces:
        if not isinstance(piece, dict):
            continue
        index = piece.get("index", 0) if isinstance(piece.get("index"), int) else 0
        entry = calls.setdefault(index, ["", ""])
        function = piece.get("function") or {}
        if isinstance(function.get("name"), str):
            entry[0] += function["name"]
        if isinstance(function.get("arguments"), str):
            entry[1] += function["arguments"]
    return True


def _loads(data: str) -> dict[str, Any]:
    try:
        chunk = json.loads(data)
    except ValueError as exc:
        raise EngineGenerateError(f"the model server sent an event that is not JSON: {data[:200]!r}") from exc
    if not isinstance(chunk, dict):
        raise EngineGenerateError(f"the model server sent an unexpected event: {data[:200]!r}")
    return chunk


def _stream_error(error: Any, rid: str) -> EngineGenerateError:
    message = error.get("message", error) if isinstance(error, dict) else error
    code = error.get("code") if isinstance(error, dict) else None
    kind = error.get("type") if isinstance(error, dict) else None
    if not str(message).strip():  # vllm serve sent {"message": "", "code": 500} for a failed request
        said = ", ".join(str(x) for x in (kind, code) if x) or "no details"
        message = f"no message ({said}; see the server's log)"
    logger.warning("the model server reported an error mid-answer: %s (%s)", message, code)
    return EngineGenerateError(f"the model server failed while answering: {message}")


def _error_message(text: str) -> str:
    """The message of an OpenAI-style error body (``{"error": {"message": ...}}``), else its start."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip()[:300] or "no details"
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str):
        return error
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return text.strip()[:300]


def _describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _has_tokenizer_files(model: str) -> bool:
    folder = Path(model).expanduser()
    return folder.is_dir() and any((folder / name).is_file() for name in _TOKENIZER_FILES)


__all__ = ["SERVER_TRAITS", "OpenAIEngine", "ServerTraits", "normalize_base_url"]
