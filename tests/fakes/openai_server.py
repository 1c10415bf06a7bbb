"""A fake OpenAI-compatible model server, speaking vLLM 0.26's HTTP protocol byte for byte.

It is the peer of ``inference.openai_engine`` in the CPU tests: no llama.cpp server binary and no
GPU are available here, so this aiohttp server on a free port stands in for ``vllm serve``. It runs
in **its own thread with its own event loop**, like a separate server process: the engine's
synchronous server tokenizer (``/tokenize``) can then call it from the test's event loop without a
deadlock, and a stalled test loop does not stall the server.

What is faithful to vLLM 0.26.0 (read from its ``entrypoints/`` sources):

- ``POST /v1/completions`` (``prompt`` as text or a list of token ids) and
  ``POST /v1/chat/completions`` (``messages`` through the model's chat template), streaming
  ``data: {json}\\n\\n`` chunks serialized as pydantic does (compact, fields in declaration order,
  ``exclude_unset`` for token chunks): the chat stream opens with a ``role`` chunk, one chunk per
  token, ``finish_reason`` / ``stop_reason`` on the last token's chunk, then with
  ``stream_options.include_usage`` a usage chunk with ``"choices":[]`` (``prompt_tokens_details``
  only with ``enable_prompt_tokens_details``, per-request ``metrics`` only with
  ``enable_per_request_metrics``), then ``data: [DONE]``. Chunk ids are ``cmpl-`` / ``chatcmpl-``
  plus the ``X-Request-Id`` header.
- Errors: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status in ``code``
  (404 ``NotFoundError`` with ``param: "model"`` for an unknown model, 400 for a prompt beyond
  ``max_model_len``); inside a started stream an error is a ``data: {"error": ...}`` event (Python
  ``json.dumps`` spacing, as vLLM writes it) followed by ``data: [DONE]``. ``--api-key`` guards
  ``/v1/*`` only and answers ``401 {"error":"Unauthorized"}``.
- ``GET /health`` (200, empty; 503 when the engine is dead), ``GET /v1/models`` (``owned_by: vllm``,
  ``max_model_len``), ``GET /version``, ``POST /tokenize`` / ``/detokenize``, ``GET /metrics``
  (``vllm:num_requests_running`` / ``waiting``, ``vllm:kv_cache_usage_perc``, prefix-cache counters).
- ``priority`` is honoured only under ``scheduling_policy="priority"`` (lower first) and silently
  ignored under ``fcfs``, as in 0.26 (no error either way). ``max_num_seqs`` requests run at once;
  the rest wait. Prefix caching is block-aligned (``block_size``) and never covers the last prompt
  token, so ``cached_tokens`` behaves like vLLM's.
- A client that disconnects aborts its request (aiohttp handler cancellation, as Starlette's
  disconnect listener does for vLLM); :attr:`FakeOpenAIServer.log` records it as ``aborted``.

The model is the tiny offline test model's real tokenizer; the "generation" replays a canned
incident answer token by token (deterministic: ``seed`` and ``temperature`` are accepted, not used).

Flavours: ``vllm`` (all of the above); ``llamacpp`` (``owned_by: llamacpp``, any model name, its
``/tokenize`` ``{content, add_special, parse_special}`` -> ``{tokens}``, ``/detokenize`` ->
``{content}``, ``/apply-template`` -> ``{prompt}``, ``/health`` -> ``{"status":"ok"}``, no
``/version``; the routes and fields from llama.cpp's server README, the chunk bytes stay vLLM's);
``ollama`` (``owned_by: library``, ``GET /api/version``, no ``/health`` and no ``/tokenize``,
``/v1/completions`` refuses token-id prompts, no ``prompt_tokens_details``).

Faults are chosen per request by its ``X-Request-Id``: ``server.fault("rid", Fault(...))``, or for
every request with ``server.default_fault``. ``crash()`` kills the server (open streams are reset,
new connections refused); ``revive()`` brings it back on the same port.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from multidict import CIMultiDict

Flavour = Literal["vllm", "llamacpp", "ollama"]

VLLM_VERSION = "0.26.0"
FINGERPRINT = "vllm-0.26.0-5f1c0a9e"

CANNED_ANSWER = (
    "Most likely cause: checkout-api is OOMKilled. Pod checkout-api-7d9f4 restarted 14 times in "
    "the last hour (exit code 137); its memory limit is 512Mi while p99 usage is 610Mi.\n\n"
    "Next steps:\n- `kubectl describe pod checkout-api-7d9f4 -n production`\n"
    "- raise the limit or find the leak in the 2.3.1 rollout."
)


@dataclass
class Fault:
    """What one request gets instead of (or on top of) a normal answer."""

    status: int | None = None
    """Answer with this HTTP status and a vLLM error body instead of streaming."""
    message: str = "injected fault"
    first_token_delay_s: float = 0.0
    """Extra time before the first token (a slow prefill)."""
    token_interval_s: float | None = None
    """Seconds between tokens for this request (default: the server's)."""
    die_after_tokens: int | None = None
    """Reset the connection after this many token chunks (the server process died)."""
    stream_error_after_tokens: int | None = None
    """After this many token chunks, send vLLM's in-stream error event and ``[DONE]``."""
    stall_after_tokens: int | None = None
    """Stop sending after this many token chunks, keeping the connection open."""
    answer: str | None = None
    """What this request "generates" instead of the server's answer."""


@dataclass
class Received:
    """One request as the server saw it, and how it ended."""

    method: str
    path: str
    headers: CIMultiDict[str]
    """Case-insensitive, as HTTP headers are."""
    body: Any
    request_id: str | None = None
    outcome: str = "open"
    """``open``, ``finished``, ``aborted`` (client went away), ``error`` or ``died``."""
    tokens_sent: int = 0
    cached_tokens: int = 0
    prompt_tokens: int = 0
    priority: int = 0
    started_at: float | None = None
    """``time.monotonic()`` when it got a batch slot (after waiting in the server's queue)."""


@dataclass(order=True)
class _Waiter:
    key: tuple[int, int]
    future: asyncio.Future[None] = field(compare=False)


class _Scheduler:
    """``max_num_seqs`` running requests; the rest wait, by (priority, arrival) or arrival only."""

    def __init__(self, slots: int, policy: str) -> None:
        self.slots = slots
        self.policy = policy
        self.running = 0
        self._waiting: list[_Waiter] = []
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiting if not w.future.done())

    async def acquire(self, priority: int) -> None:
        if self.running < self.slots and not self.waiting:
            self.running += 1
            return
        rank = priority if self.policy == "priority" else 0
        waiter = _Waiter((rank, next(self._arrivals)), asyncio.get_running_loop().create_future())
        heapq.heappush(self._waiting, waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release()  # granted just as the client left
            raise

    def release(self) -> None:
        self.running -= 1
        while self._waiting and self.running < self.slots:
            waiter = heapq.heappop(self._waiting)
            if not waiter.future.done():
                self.running += 1
                waiter.future.set_result(None)


class FakeOpenAIServer:
    """The fake server: ``start()`` it (or use it as a context manager), point ``base_url`` at ``url``."""

    def __init__(
        self,
        tokenizer_dir: Path | str,
        *,
        flavour: Flavour = "vllm",
        served_model_name: str = "tiny-chat",
        max_model_len: int = 2048,
        max_num_seqs: int = 16,
        scheduling_policy: Literal["fcfs", "priority"] = "fcfs",
        enable_prompt_tokens_details: bool = True,
        enable_per_request_metrics: bool = False,
        api_key: str | None = None,
        token_interval_s: float = 0.002,
        block_size: int = 16,
        answer: str = CANNED_ANSWER,
    ) -> None:
        from transformers import AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.flavour = flavour
        self.served_model_name = served_model_name
        self.model_path = str(tokenizer_dir)
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.scheduling_policy = scheduling_policy
        self.enable_prompt_tokens_details = enable_prompt_tokens_details
        self.enable_per_request_metrics = enable_per_request_metrics
        self.api_key = api_key
        self.token_interval_s = token_interval_s
        self.block_size = block_size
        self.healthy = True
        """``False``: ``/health`` answers 503, as vLLM does once its engine core died."""
        self.tool_call: tuple[str, str] | None = None
        """What the model calls when a chat request offers ``tools``: (function name, arguments as
        JSON text). vLLM's tool parser streams it as ``delta.tool_calls`` pieces (a first piece with
        the id, type and name, then the arguments a few characters at a time) and ends the choice
        with ``finish_reason: "tool_calls"``. ``None``: the canned answer, as without tools."""
        self.default_fault: Fault | None = None
        self.log: list[Received] = []
        self.port = 0
        self._faults: dict[str, Fault] = {}
        # What every request "generates" (a test may give one a model that echoes fence markup).
        self._answer_ids: list[int] = self.tokenizer.encode(answer, add_special_tokens=False)
        self._cached_blocks: set[tuple[int, ...]] = set()
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._scheduler = _Scheduler(max_num_seqs, scheduling_policy)

    # --- life cycle (called from the test's thread) ---------------------------------------------

    @property
    def url(self) -> str:
        """Base URL, without ``/v1``."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FakeOpenAIServer:
        """Start the server thread and listen on a free port."""
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self._serve())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._shutdown())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-openai-server", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake OpenAI server did not start")
        return self

    def stop(self) -> None:
        """Stop the server and its thread."""
        if self._loop is None or self._thread is None:
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def crash(self) -> None:
        """The server process dies: open streams are reset, new connections are refused."""
        self._call(self._crash())

    def revive(self) -> None:
        """Listen again on the same port (the server was restarted)."""
        self._call(self._listen())

    def fault(self, request_id: str, fault: Fault) -> None:
        """Give the request with this ``X-Request-Id`` the ``fault``."""
        self._faults[request_id] = fault

    def requests_for(self, request_id: str) -> list[Received]:
        """Everything received for ``request_id`` (generation routes carry it as ``X-Request-Id``)."""
        return [r for r in list(self.log) if r.request_id == request_id]

    async def until(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Poll ``predicate()`` from the caller's event loop (which keeps running: a closed client
        socket is only really closed by that loop) until it holds, or fail after ``timeout``."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError("the fake OpenAI server never reached the expected state")
            await asyncio.sleep(0.005)

    def outcome(self, request_id: str) -> str | None:
        """How the generation request ``request_id`` ended, ``None`` if it never arrived."""
        found = [r for r in self.requests_for(request_id) if r.path.startswith("/v1/")]
        return found[-1].outcome if found else None

    def _call(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # --- server side -----------------------------------------------------------------------------

    async def _serve(self) -> None:
        app = web.Application(middlewares=[self._auth])
        routes = [
            web.get("/v1/models", self._models),
            web.post("/v1/completions", self._completions),
            web.post("/v1/chat/completions", self._chat),
        ]
        if self.flavour in ("vllm", "llamacpp"):
            routes += [
                web.get("/health", self._health),
                web.post("/tokenize", self._tokenize),
                web.post("/detokenize", self._detokenize),
            ]
        if self.flavour == "vllm":
            routes += [web.get("/version", self._version), web.get("/metrics", self._metrics)]
        if self.flavour == "llamacpp":
            routes.append(web.post("/apply-template", self._apply_template))
        if self.flavour == "ollama":
            routes.append(web.get("/api/version", self._ollama_version))
        app.add_routes(routes)
        # Cancel a handler when its client disconnects, as Starlette's disconnect listener does.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await self._listen()

    async def _listen(self) -> None:
        assert self._runner is not None
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await self._site.start()
        server = self._site._server
        assert server is not None and server.sockets
        self.port = server.sockets[0].getsockname()[1]

    async def _crash(self) -> None:
        if self._site is not None:
            await self._site.stop()
            self._site = None
        for entry in self.log:
            if entry.outcome == "open" and entry.path.startswith("/v1/"):
                entry.outcome = "died"
        # Streams in flight and idle keep-alive connections die with the process (RST).
        assert self._runner is not None and self._runner.server is not None
        for conn in list(self._runner.server.connections):
            if conn.transport is not None:
                conn.transport.abort()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        guarded = request.path.startswith(("/v1", "/v2", "/inference"))
        if self.api_key is not None and guarded:
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or token != self.api_key:
                return _json({"error": "Unauthorized"}, 401)
        response: web.StreamResponse = await handler(request)
        return response

    def _record(self, request: web.Request, body: Any) -> Received:
        entry = Received(request.method, request.path, CIMultiDict(request.headers), body)
        entry.request_id = request.headers.get("X-Request-Id")
        self.log.append(entry)
        return entry

    async def _health(self, request: web.Request) -> web.Response:
        self._record(request, None)
        if self.flavour == "llamacpp":
            return (
                _json({"status": "ok"})
                if self.healthy
                else _json(
                    {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, 503
                )
            )
        return web.Response(status=200 if self.healthy else 503)

    async def _version(self, request: web.Request) -> web.Response:
        return _json({"version": VLLM_VERSION})

    async def _ollama_version(self, request: web.Request) -> web.Response:
        return _json({"version": "0.13.0"})

    async def _models(self, request: web.Request) -> web.Response:
        self._record(request, None)
        created = int(time.time())
        if self.flavour == "vllm":
            card: dict[str, Any] = {
                "id": self.served_model_name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.model_path,
                "parent": None,
                "max_model_len": self.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        elif self.flavour == "llamacpp":
            card = {
                "id": self.served_model_name,
                "object": "model",
                "created": created,
                "owned_by": "llamacpp",
                "meta": {"vocab_type": 2, "n_vocab": len(self.tokenizer), "n_ctx_train": self.max_model_len},
            }
        else:
            card = {
                "id": self.served_model_name,
                "object": "model",
                "created": created,
                "owned_by": "library",
            }
        return _json({"object": "list", "data": [card]})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        if self.flavour == "llamacpp":
            ids = self.tokenizer.encode(
                body["content"], add_special_tokens=bool(body.get("add_special", False))
            )
            return _json({"tokens": ids})
        if (error := self._check_model(body)) is not None:
            return error
        if "messages" in body:
            ids = self._render(body["messages"], bool(body.get("add_generation_prompt", True)))
        else:
            ids = self.tokenizer.encode(
                body["prompt"], add_special_tokens=bool(body.get("add_special_tokens", True))
            )
        return _json(
            {"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None}
        )

    async def _detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        text = self.tokenizer.decode(body["tokens"])  # vLLM keeps special tokens here
        if self.flavour == "llamacpp":
            return _json({"content": text})
        if (error := self._check_model(body)) is not None:
            return error
        return _json({"prompt": text})

    async def _apply_template(self, request: web.Request) -> web.Response:
        body = await request.json()
        self._record(request, body)
        text = self.tokenizer.apply_chat_template(
            body["messages"], add_generation_prompt=True, tokenize=False
        )
        return _json({"prompt": text})

    async def _metrics(self, request: web.Request) -> web.Response:
        labels = f'engine="0",model_name="{self.served_model_name}"'
        used = self._scheduler.running / max(self.max_num_seqs, 1)
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {float(self._scheduler.running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {float(self._scheduler.waiting)}",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} {used}",
            "# HELP vllm:prefix_cache_queries_total "
            "Prefix cache queries, in terms of number of queried tokens.",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f"vllm:prefix_cache_queries_total{{{labels}}} {float(self._prefix_queries)}",
            "# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.",
            "# TYPE vllm:prefix_cache_hits_total counter",
            f"vllm:prefix_cache_hits_total{{{labels}}} {float(self._prefix_hits)}",
            "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
            "# TYPE vllm:num_preemptions_total counter",
            f"vllm:num_preemptions_total{{{labels}}} 0.0",
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain", charset="utf-8")

    def _check_model(self, body: dict[str, Any]) -> web.Response | None:
        model = body.get("model")
        if self.flavour == "llamacpp" or not model or model == self.served_model_name:
            return None
        return _error(f"The model `{model}` does not exist.", "NotFoundError", 404, "model")

    def _render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> list[int]:
        ids = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        entry = self._record(request, body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
            if self.flavour == "ollama":
                entry.outcome = "error"
                return _json(
                    {
                        "error": {
                            "message": "invalid prompt",
                            "type": "invalid_request_error",
                            "param": None,
                            "code": None,
                        }
                    },
                    400,
                )
            ids = [int(i) for i in prompt]
        elif isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=bool(body.get("add_special_tokens", True)))
        else:
            entry.outcome = "error"
            return _error("prompt must be a string or a list of token ids", "BadRequestError", 400, "prompt")
        return await self._generate(request, entry, body, ids, chat=False)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        entry = self._record(request, body)
        ids = self._render(body["messages"], bool(body.get("add_generation_prompt", True)))
        return await self._generate(request, entry, body, ids, chat=True)

    def _prefix_cache(self, ids: list[int]) -> int:
        """Block-aligned cached prefix of ``ids`` (never the last token), then cache its full blocks."""
        bs = self.block_size
        cached = 0
        limit = (len(ids) - 1) // bs * bs
        while cached + bs <= limit and tuple(ids[: cached + bs]) in self._cached_blocks:
            cached += bs
        for end in range(bs, len(ids) // bs * bs + 1, bs):
            self._cached_blocks.add(tuple(ids[:end]))
        self._prefix_queries += len(ids)
        self._prefix_hits += cached
        return cached

    async def _generate(
        self, request: web.Request, entry: Received, body: dict[str, Any], ids: list[int], *, chat: bool
    ) -> web.StreamResponse:
        fault = self._faults.get(entry.request_id or "") or self.default_fault or Fault()
        if (error := self._check_model(body)) is not None:
            entry.outcome = "error"
            return error
        if fault.status is not None:
            entry.outcome = "error"
            kinds = {
                400: "BadRequestError",
                404: "NotFoundError",
                429: "TooManyRequests",
                503: "ServiceUnavailable",
            }
            return _error(fault.message, kinds.get(fault.status, "InternalServerError"), fault.status, None)
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_completion_tokens")
        if len(ids) >= self.max_model_len:
            entry.outcome = "error"
            requested = int(max_tokens or 0)
            return _error(
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {requested} output tokens and your prompt contains {len(ids)} input tokens, "
                f"for a total of {len(ids) + requested} tokens. Please reduce the length of the input "
                "prompt or the number of requested output tokens.",
                "BadRequestError",
                400,
                "input_tokens",
            )
        budget = self.max_model_len - len(ids)
        max_tokens = budget if max_tokens is None else min(int(max_tokens), budget)
        entry.prompt_tokens = len(ids)
        entry.priority = int(body.get("priority", 0)) if self.flavour == "vllm" else 0
        prefix = "chatcmpl-" if chat else "cmpl-"
        rid = prefix + (entry.request_id or uuid.uuid4().hex)
        created = int(time.time())
        model = self.served_model_name
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        interval = fault.token_interval_s if fault.token_interval_s is not None else self.token_interval_s

        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        granted = False
        queued_at = time.monotonic()
        try:
            await response.prepare(request)
            await self._scheduler.acquire(entry.priority)
            granted = True
            entry.started_at = time.monotonic()
            scheduled = time.monotonic()
            entry.cached_tokens = self._prefix_cache(ids)
            # Prefill: a little time per uncached token, plus what the fault adds.
            await asyncio.sleep(0.00002 * (len(ids) - entry.cached_tokens) + fault.first_token_delay_s)
            if chat and body.get("tools") and self.tool_call is not None:
                await self._stream_tool_call(response, rid, created, model, len(ids), entry, include_usage)
                return response
            out: list[int] = []
            text = full = ""
            hold = max((len(stop) for stop in stops), default=1) - 1
            answer_ids = self._answer_ids
            if fault.answer is not None:
                answer_ids = self.tokenizer.encode(fault.answer, add_special_tokens=False)
            finish: str | None = None
            stop_reason: str | None = None
            first_ts = last_ts = 0.0
            while finish is None:
                position = len(out)
                answer_done = position >= len(answer_ids) and not body.get("ignore_eos")
                if answer_done:
                    finish = "stop"  # the model emitted EOS: counted, not shown
                    delta = full[len(text) :]  # what was held back for a stop string goes out now
                    text += delta
                    if self.tokenizer.eos_token_id is not None:
                        out.append(int(self.tokenizer.eos_token_id))
                else:
                    out.append(answer_ids[position % len(answer_ids)])
                    decoded = self.tokenizer.decode(out, skip_special_tokens=True)
                    if not decoded.endswith("\ufffd"):  # an incomplete character waits for its bytes
                        full = decoded
                    found = [(full.find(stop), stop) for stop in stops if stop in full]
                    if found:
                        at, stop_reason = min(found)
                        full, finish = full[:at], "stop"
                    elif len(out) >= max_tokens:
                        finish = "length"
                    # vLLM holds back the last len(stop) - 1 characters: they may start a stop string.
                    visible = len(full) if finish is not None else len(full) - hold
                    delta = full[len(text) : max(visible, len(text))]
                    text += delta
                now = time.monotonic()
                first_ts = first_ts or now
                last_ts = now
                if chat and position == 0:
                    await self._send(response, _chat_role_chunk(rid, created, model))
                if fault.die_after_tokens is not None and entry.tokens_sent >= fault.die_after_tokens:
                    entry.outcome = "died"
                    if request.transport is not None:
                        request.transport.abort()
                    return response
                if (
                    fault.stream_error_after_tokens is not None
                    and entry.tokens_sent >= fault.stream_error_after_tokens
                ):
                    entry.outcome = "error"
                    await self._send(response, _stream_error(fault.message, "InternalServerError", 500))
                    await self._send(response, "data: [DONE]\n\n")
                    return response
                if fault.stall_after_tokens is not None and entry.tokens_sent >= fault.stall_after_tokens:
                    await asyncio.Event().wait()  # until the client goes away (handler cancelled)
                if chat:
                    chunk = _chat_token_chunk(rid, created, model, delta, finish, stop_reason)
                else:
                    chunk = _completion_token_chunk(rid, created, model, delta, finish, stop_reason)
                await self._send(response, chunk)
                entry.tokens_sent += 1
                if finish is None and interval > 0:
                    await asyncio.sleep(interval)
            if include_usage:
                usage: dict[str, Any] = {
                    "prompt_tokens": len(ids),
                    "total_tokens": len(ids) + len(out),
                    "completion_tokens": len(out),
                }
                if self.enable_prompt_tokens_details and self.flavour != "ollama":
                    details: dict[str, Any] = {"cached_tokens": entry.cached_tokens}
                    if chat:
                        written = len(ids) // self.block_size * self.block_size - entry.cached_tokens
                        details["created_cache_tokens"] = max(written, 0)
                    usage["prompt_tokens_details"] = details
                final: dict[str, Any] = {
                    "id": rid,
                    "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                    "system_fingerprint": FINGERPRINT,
                }
                if self.enable_per_request_metrics:
                    final["metrics"] = {
                        "time_to_first_token_ms": (first_ts - scheduled) * 1e3,
                        "generation_time_ms": (last_ts - first_ts) * 1e3,
                        "queue_time_ms": (scheduled - queued_at) * 1e3,
                        "mean_itl_ms": (last_ts - first_ts) * 1e3 / max(len(out) - 1, 1),
                        "tokens_per_second": len(out) / max(last_ts - scheduled, 1e-9),
                    }
                await self._send(response, f"data: {_dumps(final)}\n\n")
            await self._send(response, "data: [DONE]\n\n")
            await response.write_eof()
            entry.outcome = "finished"
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            if entry.outcome == "open":
                entry.outcome = "aborted"
            raise
        finally:
            if granted:
                self._scheduler.release()

    async def _stream_tool_call(
        self,
        response: web.StreamResponse,
        rid: str,
        created: int,
        model: str,
        prompt_tokens: int,
        entry: Received,
        include_usage: bool,
    ) -> None:
        """:attr:`tool_call` as vLLM's streaming tool parser sends it, then usage and ``[DONE]``."""
        assert self.tool_call is not None
        name, arguments = self.tool_call
        await self._send(response, _chat_role_chunk(rid, created, model))
        pieces = [arguments[i : i + 8] for i in range(0, len(arguments), 8)]
        deltas: list[dict[str, Any]] = [
            {
                "tool_calls": [
                    {
                        "id": f"chatcmpl-tool-{rid[-8:]}",
                        "type": "function",
                        "index": 0,
                        "function": {"name": name, "arguments": ""},
                    }
                ]
            }  # fmt: skip
        ]
        deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} for piece in pieces]
        for delta in deltas:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
            chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
            await self._send(response, f"data: {_dumps({**chunk, 'choices': [choice]})}\n\n")
            entry.tokens_sent += 1
        end = {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": "tool_calls"}
        chunk = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
        await self._send(response, f"data: {_dumps({**chunk, 'choices': [end]})}\n\n")
        if include_usage:
            usage = {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens + len(deltas),
                "completion_tokens": len(deltas),
            }
            final = {**chunk, "choices": [], "usage": usage, "system_fingerprint": FINGERPRINT}
            await self._send(response, f"data: {_dumps(final)}\n\n")
        await self._send(response, "data: [DONE]\n\n")
        await response.write_eof()
        entry.outcome = "finished"

    async def _send(self, response: web.StreamResponse, data: str) -> None:
        await response.write(data.encode("utf-8"))


def _dumps(value: Any) -> str:
    """JSON as pydantic's ``model_dump_json`` and Starlette's ``JSONResponse`` write it: compact, UTF-8."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=_dumps(value).encode("utf-8"), status=status, content_type="application/json")


def _error(message: str, kind: str, status: int, param: str | None) -> web.Response:
    return _json({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


def _stream_error(message: str, kind: str, status: int) -> str:
    # vLLM's create_streaming_error_response uses json.dumps with its default spacing.
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return f"data: {json.dumps(body)}\n\n"


def _chat_role_chunk(rid: str, created: int, model: str) -> str:
    chunk = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ],
        "prompt_token_ids": None,
        "prompt_text": None,
    }
    return f"data: {_dumps(chunk)}\n\n"


def _chat_token_chunk(
    rid: str, created: int, model: str, delta: str, finish: str | None, stop_reason: str | None
) -> str:
    choice: dict[str, Any] = {
        "index": 0,
        "delta": {"content": delta},
        "logprobs": None,
        "finish_reason": finish,
    }
    if finish is not None:
        choice["stop_reason"] = stop_reason
    choice["token_ids"] = None
    chunk = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    return f"data: {_dumps(chunk)}\n\n"


def _completion_token_chunk(
    rid: str, created: int, model: str, delta: str, finish: str | None, stop_reason: str | None
) -> str:
    choice = {
        "index": 0,
        "text": delta,
        "logprobs": None,
        "finish_reason": finish,
        "stop_reason": stop_reason,
        "prompt_token_ids": None,
        "token_ids": None,
    }
    chunk = {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": [choice]}
    return f"data: {_dumps(chunk)}\n\n"


__all__ = ["CANNED_ANSWER", "Fault", "FakeOpenAIServer", "Received"]
