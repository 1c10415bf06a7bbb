"""The ``openai`` backend (a remote OpenAI-compatible server) against a fake vLLM 0.26 server.

No llama.cpp server binary and no GPU are available on this machine, so the peer is
``tests/fakes/openai_server.py``: a real HTTP server on a free port, in its own thread, speaking
vLLM's SSE protocol byte for byte (its docstring lists what is faithful). The real ``vllm serve``
is the peer of ``tests/gpu/test_openai_vllm_serve.py`` on the H200.

The first section is the engine contract every backend passes (the CPU engine's tests check the
same behaviour); only its ``contract`` fixture knows this backend. The rest is what is particular
to a remote server: protocol, lanes as priorities, usage counts, server kinds, errors, health.
"""

from __future__ import annotations

import asyncio
import gc
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from fakes.openai_server import FINGERPRINT, FakeOpenAIServer, Fault
from pydantic import ValidationError

from inference.admission import AdmittedEngine
from inference.config import EngineConfig
from inference.engine import (
    ChatMessage,
    Engine,
    EngineDeadError,
    EngineGenerateError,
    EngineOverloadedError,
    EngineStartupError,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    Lane,
    RequestAbortedError,
    SamplingSettings,
    TextDelta,
)
from inference.openai_engine import OpenAIEngine, normalize_base_url
from inference.server_tokenizer import ServerTokenizer
from inference.tokenization import HFChatTokenizer

MODEL = "tiny-chat"
SYSTEM = ChatMessage("system", "You are opsbot, an incident assistant. Quote exact numbers. " * 6)
QUESTION = [SYSTEM, ChatMessage("user", "Why is checkout-api crashlooping?")]


def make_request(
    request_id: str,
    *,
    lane: Lane = Lane.NORMAL,
    messages: list[ChatMessage] | None = None,
    prompt_token_ids: list[int] | None = None,
    **sampling: object,
) -> GenerationRequest:
    settings = {"temperature": 1.0, "top_p": 0.95, "max_tokens": 12, "seed": 7, "ignore_eos": True}
    settings.update(sampling)
    return GenerationRequest(
        request_id=request_id,
        scenario="chat",
        lane=lane,
        sampling=SamplingSettings(**settings),  # type: ignore[arg-type]
        messages=messages if messages is not None or prompt_token_ids is not None else QUESTION,
        prompt_token_ids=prompt_token_ids,
    )


async def collect(stream: AsyncIterator[GenerationEvent]) -> tuple[list[str], GenerationResult]:
    deltas: list[str] = []
    async for event in stream:
        if isinstance(event, TextDelta):
            deltas.append(event.text)
        else:
            return deltas, event
    raise AssertionError("the stream ended without a GenerationResult")


async def eventually(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached before the deadline")
        await asyncio.sleep(0.005)


def remote_config(server: FakeOpenAIServer, **overrides: object) -> EngineConfig:
    values: dict[str, object] = {
        "backend": "openai",
        "base_url": server.url,
        "model": MODEL,
        "max_model_len": 2048,
        "health_interval_s": 0.05,
    }
    values.update(overrides)
    return EngineConfig(**values)  # type: ignore[arg-type]


async def started(server: FakeOpenAIServer, **overrides: object) -> OpenAIEngine:
    engine = OpenAIEngine(remote_config(server, **overrides))
    await engine.start([SYSTEM])
    return engine


@pytest.fixture(scope="module")
def server(tiny_model: Path) -> Iterator[FakeOpenAIServer]:
    """One fake vLLM server (16 batch slots) shared by the tests that do not break it."""
    with FakeOpenAIServer(tiny_model, served_model_name=MODEL) as srv:
        yield srv


@pytest.fixture
def fresh_server(tiny_model: Path) -> Callable[..., FakeOpenAIServer]:
    """Factory for a server of the test's own (stopped at the end)."""
    servers: list[FakeOpenAIServer] = []

    def make(**options: object) -> FakeOpenAIServer:
        options.setdefault("served_model_name", MODEL)
        srv = FakeOpenAIServer(tiny_model, **options).start()  # type: ignore[arg-type]
        servers.append(srv)
        return srv

    yield make  # type: ignore[misc]
    for srv in servers:
        srv.stop()


@pytest.fixture
async def engine(server: FakeOpenAIServer) -> AsyncIterator[OpenAIEngine]:
    eng = await started(server)
    yield eng
    await eng.shutdown(drain_timeout_s=5)


# ================================================================================================
# Engine contract: the behaviour every backend owes the pipeline. Backend-specific parts live in
# the `contract` fixture only (a started engine, a factory for engines with overrides, and
# `stopped`, which waits for proof that generation stopped and says how many tokens were made).
# ================================================================================================


@dataclass
class Contract:
    engine: Engine
    make: Callable[..., Awaitable[Engine]]
    """A started engine with the given configuration overrides (``max_concurrency`` = 1: one
    request runs, the others wait)."""
    stopped: Callable[[str], Awaitable[int]]
    """Wait until ``request_id`` stopped early; returns the tokens it produced."""


@pytest.fixture
async def contract(
    engine: OpenAIEngine, server: FakeOpenAIServer, fresh_server: Callable[..., FakeOpenAIServer]
) -> AsyncIterator[Contract]:
    extra: list[Engine] = []

    async def make(max_concurrency: int | None = None, **overrides: object) -> Engine:
        target = server if max_concurrency is None else fresh_server(max_num_seqs=max_concurrency)
        eng = await started(target, **overrides)
        extra.append(eng)
        return eng

    async def stopped(request_id: str) -> int:
        await server.until(lambda: server.outcome(request_id) == "aborted")
        return server.requests_for(request_id)[-1].tokens_sent

    yield Contract(engine, make, stopped)
    for eng in extra:
        await eng.shutdown(drain_timeout_s=5)


async def test_contract_stream_yields_several_deltas_then_a_result_whose_text_is_their_concatenation(
    contract: Contract,
) -> None:
    deltas, result = await collect(contract.engine.generate(make_request("c-stream", max_tokens=16)))
    assert len(deltas) >= 3
    assert result.text == "".join(deltas)
    assert result.request_id == "c-stream"
    assert result.finish_reason == "length"
    assert result.output_tokens == 16
    assert result.prompt_tokens == len(contract.engine.tokenizer.render(QUESTION))


async def test_contract_timings_are_present_and_ordered(contract: Contract) -> None:
    _, result = await collect(contract.engine.generate(make_request("c-timings", max_tokens=8)))
    assert result.ttft_ms is not None and result.tpot_ms is not None
    assert 0 <= result.queue_ms <= result.ttft_ms <= result.e2e_ms
    assert result.tpot_ms > 0
    assert result.tpot_ms * (result.output_tokens - 1) <= result.e2e_ms - result.ttft_ms + 1e-6


async def test_contract_max_tokens_is_respected(contract: Contract) -> None:
    _, result = await collect(contract.engine.generate(make_request("c-max-1", max_tokens=3)))
    assert result.output_tokens == 3 and result.finish_reason == "length"
    _, free = await collect(contract.engine.generate(make_request("c-max-2", max_tokens=3, ignore_eos=False)))
    assert free.output_tokens <= 3


async def test_contract_prompt_token_ids_are_accepted_as_they_are(contract: Contract) -> None:
    ids = contract.engine.tokenizer.render(QUESTION)
    _, result = await collect(
        contract.engine.generate(make_request("c-ids", prompt_token_ids=ids, max_tokens=4))
    )
    assert result.prompt_tokens == len(ids)
    assert result.output_tokens == 4


async def test_contract_a_stop_string_ends_the_answer_before_it(contract: Contract) -> None:
    _, plain = await collect(
        contract.engine.generate(make_request("c-stop-1", temperature=0.0, max_tokens=24))
    )
    stop = plain.text[8:11]
    assert len(stop) == 3
    deltas, stopped = await collect(
        contract.engine.generate(make_request("c-stop-2", temperature=0.0, max_tokens=24, stop=(stop,)))
    )
    assert stopped.text == plain.text[: plain.text.find(stop)] == "".join(deltas)
    assert stopped.finish_reason == "stop"


async def test_contract_a_prompt_longer_than_the_context_is_a_generate_error(contract: Contract) -> None:
    long_question = [ChatMessage("user", "pod " * 5000)]
    with pytest.raises(EngineGenerateError, match="context"):
        await collect(contract.engine.generate(make_request("c-long", messages=long_question)))


async def test_contract_a_duplicate_running_request_id_is_refused(contract: Contract) -> None:
    first = contract.engine.generate(make_request("c-dup", max_tokens=2000))
    await anext(first)
    with pytest.raises(EngineGenerateError, match="already running"):
        await anext(contract.engine.generate(make_request("c-dup")))
    await first.aclose()  # type: ignore[attr-defined]


async def test_contract_four_concurrent_requests_all_progress_before_any_finishes(contract: Contract) -> None:
    events: list[tuple[str, str]] = []

    async def consume(name: str) -> None:
        async for event in contract.engine.generate(make_request(name, max_tokens=100)):
            kind = "delta" if isinstance(event, TextDelta) else "result"
            if kind == "result" or (name, "delta") not in events:
                events.append((name, kind))

    names = [f"c-conc-{i}" for i in range(4)]
    await asyncio.gather(*(consume(n) for n in names))
    first_result = next(i for i, (_, kind) in enumerate(events) if kind == "result")
    assert sorted(name for name, _ in events[:first_result]) == names


async def test_contract_the_event_loop_stays_responsive_while_requests_stream(contract: Contract) -> None:
    ticks = 0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            await asyncio.sleep(0)

    tick_task = asyncio.create_task(ticker())
    results = await asyncio.gather(
        *(collect(contract.engine.generate(make_request(f"c-loop-{i}", max_tokens=40))) for i in range(2))
    )
    done.set()
    await tick_task
    assert ticks > sum(len(deltas) for deltas, _ in results)


async def test_contract_abort_mid_stream_raises_request_aborted_and_stops_generating(
    contract: Contract,
) -> None:
    stream = contract.engine.generate(make_request("c-abort", max_tokens=2000))
    assert isinstance(await anext(stream), TextDelta)
    await contract.engine.abort("c-abort")
    with pytest.raises(RequestAbortedError, match="c-abort"):
        while True:
            await anext(stream)
    assert await contract.stopped("c-abort") < 2000
    await contract.engine.abort("c-abort")  # a finished id is a no-op
    await contract.engine.abort("never-seen")


async def test_contract_closing_the_iterator_aborts_the_request(contract: Contract) -> None:
    stream = contract.engine.generate(make_request("c-close", max_tokens=2000))
    await anext(stream)
    await stream.aclose()  # type: ignore[attr-defined]
    with pytest.raises(StopAsyncIteration):
        await anext(stream)
    assert await contract.stopped("c-close") < 2000


async def test_contract_breaking_out_of_the_loop_aborts_the_request(contract: Contract) -> None:
    async for _ in contract.engine.generate(make_request("c-break", max_tokens=2000)):
        break
    gc.collect()
    assert await contract.stopped("c-break") < 2000


async def test_contract_cancelling_the_reading_task_aborts_the_request(contract: Contract) -> None:
    got_first = asyncio.Event()

    async def reader() -> None:
        async for _ in contract.engine.generate(make_request("c-cancel", max_tokens=2000)):
            got_first.set()

    task = asyncio.create_task(reader())
    await got_first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await contract.stopped("c-cancel") < 2000


async def test_contract_a_request_past_its_timeout_is_aborted(contract: Contract) -> None:
    admitted = AdmittedEngine(contract.engine, request_timeout_s=0.05)
    with pytest.raises(RequestAbortedError, match="timed out"):
        await collect(admitted.generate(make_request("c-slow", max_tokens=2000)))
    assert await contract.stopped("c-slow") < 2000


async def test_contract_health_follows_the_life_cycle_and_shutdown_drains_in_flight_requests(
    server: FakeOpenAIServer,
) -> None:
    engine = OpenAIEngine(remote_config(server))
    assert not engine.health().ready and "not started" in engine.health().reason
    with pytest.raises(EngineDeadError):
        await anext(engine.generate(make_request("c-early")))
    with pytest.raises(EngineDeadError):
        _ = engine.tokenizer
    await engine.start([SYSTEM])
    assert engine.health().ready
    stream = engine.generate(make_request("c-drain", max_tokens=60))
    first = await anext(stream)
    assert isinstance(first, TextDelta)
    stopping = asyncio.create_task(engine.shutdown(drain_timeout_s=60))
    await eventually(lambda: not engine.health().ready)
    assert "shutting down" in engine.health().reason
    with pytest.raises(RequestAbortedError, match="shutting down"):
        await anext(engine.generate(make_request("c-late")))
    deltas, result = await collect(stream)
    assert result.output_tokens == 60
    assert result.text == first.text + "".join(deltas)
    await stopping
    assert not engine.health().ready and "shut down" in engine.health().reason
    await engine.shutdown()  # twice is harmless


async def test_contract_shutdown_aborts_what_outlives_the_drain_deadline(contract: Contract) -> None:
    engine = await contract.make(max_concurrency=1)
    running = engine.generate(make_request("c-outlive-1", max_tokens=2000))
    await anext(running)
    waiting = engine.generate(make_request("c-outlive-2", max_tokens=2000))
    waiting_next = asyncio.create_task(anext(waiting))
    await eventually(lambda: engine.stats().waiting == 1)
    await engine.shutdown(drain_timeout_s=0)
    with pytest.raises(RequestAbortedError, match="shut down"):
        while True:
            await anext(running)
    with pytest.raises(RequestAbortedError, match="shut down"):
        await waiting_next
    assert engine.stats().running == engine.stats().waiting == 0


# ================================================================================================
# What is particular to a remote server
# ================================================================================================

# --- the wire protocol ------------------------------------------------------------------------


async def test_the_fake_streams_vllm_0_26_chat_chunks_byte_for_byte(server: FakeOpenAIServer) -> None:
    # Pins the fake to vLLM's serialization (serving.py: exclude_unset token chunks, usage chunk
    # with exclude_none), so the engine is tested against the real byte stream.
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{server.url}/v1/chat/completions", json=body, headers={"X-Request-Id": "bytes-1"}
        ) as r,
    ):
        assert r.status == 200 and r.headers["Content-Type"] == "text/event-stream; charset=utf-8"
        raw = (await r.read()).decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    created = chunks[0]["created"]
    head = (
        'data: {"id":"chatcmpl-bytes-1","object":"chat.completion.chunk",'
        f'"created":{created},"model":"{MODEL}",'
    )
    assert events[0] == head + (
        '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
        '"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}'
    )
    first_text = json.dumps(chunks[1]["choices"][0]["delta"]["content"], ensure_ascii=False)
    assert events[1] == head + (
        f'"choices":[{{"index":0,"delta":{{"content":{first_text}}},"logprobs":null,"finish_reason":null,'
        '"token_ids":null}]}'
    )
    assert chunks[2]["choices"][0]["finish_reason"] == "length" and "stop_reason" in chunks[2]["choices"][0]
    prompt = chunks[3]["usage"]["prompt_tokens"]
    cached = chunks[3]["usage"]["prompt_tokens_details"]["cached_tokens"]
    written = chunks[3]["usage"]["prompt_tokens_details"]["created_cache_tokens"]
    assert events[3] == head + (
        f'"choices":[],"usage":{{"prompt_tokens":{prompt},"total_tokens":{prompt + 2},"completion_tokens":2,'
        f'"prompt_tokens_details":{{"cached_tokens":{cached},"created_cache_tokens":{written}}}}},'
        f'"system_fingerprint":"{FINGERPRINT}"}}'
    )


async def test_token_ids_go_to_the_completions_endpoint_with_the_request_id_and_lane_priority(
    engine: OpenAIEngine, server: FakeOpenAIServer
) -> None:
    ids = engine.tokenizer.render(QUESTION)
    request = make_request("wire-1", prompt_token_ids=ids, messages=QUESTION, lane=Lane.URGENT, max_tokens=5)
    await collect(engine.generate(request))
    (received,) = server.requests_for("wire-1")
    assert received.path == "/v1/completions"
    assert received.body["prompt"] == ids and received.body["model"] == MODEL
    assert received.body["stream"] is True and received.body["stream_options"] == {"include_usage": True}
    assert received.body["priority"] == 0 and received.body["ignore_eos"] is True
    assert received.headers["X-Request-Id"] == "wire-1"
    for lane, priority in ((Lane.NORMAL, 5), (Lane.BACKGROUND, 10)):
        await collect(
            engine.generate(make_request(f"wire-{lane}", prompt_token_ids=ids, lane=lane, max_tokens=1))
        )
        assert server.requests_for(f"wire-{lane}")[0].body["priority"] == priority


async def test_a_base_url_ending_in_v1_is_accepted(server: FakeOpenAIServer) -> None:
    assert normalize_base_url("http://h:8000/v1/") == "http://h:8000"
    engine = await started(server, base_url=server.url + "/v1")
    try:
        _, result = await collect(engine.generate(make_request("v1-url", max_tokens=2)))
        assert result.output_tokens == 2
    finally:
        await engine.shutdown(5)


# --- lanes as priorities ------------------------------------------------------------------------


async def test_under_vllm_priority_scheduling_an_urgent_request_jumps_the_servers_queue(
    fresh_server: Callable[..., FakeOpenAIServer],
) -> None:
    srv = fresh_server(max_num_seqs=1, scheduling_policy="priority")
    engine = await started(srv)
    try:
        blocker = engine.generate(make_request("prio-blocker", max_tokens=2000))
        await anext(blocker)
        normal = asyncio.create_task(collect(engine.generate(make_request("prio-normal", max_tokens=2))))
        await srv.until(lambda: srv.outcome("prio-normal") == "open")
        urgent = asyncio.create_task(
            collect(engine.generate(make_request("prio-urgent", lane=Lane.URGENT, max_tokens=2)))
        )
        await srv.until(lambda: srv.outcome("prio-urgent") == "open")
        await engine.abort("prio-blocker")
        with pytest.raises(RequestAbortedError):
            await collect(blocker)
        await asyncio.gather(normal, urgent)
        started_at = {rid: srv.requests_for(rid)[0].started_at for rid in ("prio-normal", "prio-urgent")}
        assert started_at["prio-urgent"] < started_at["prio-normal"]  # type: ignore[operator]
    finally:
        await engine.shutdown(5)


async def test_priority_is_not_sent_to_servers_that_do_not_know_it(
    fresh_server: Callable[..., FakeOpenAIServer],
) -> None:
    srv = fresh_server(flavour="llamacpp")
    engine = await started(srv)
    try:
        await collect(engine.generate(make_request("llama-prio", lane=Lane.URGENT, max_tokens=2)))
        assert "priority" not in srv.requests_for("llama-prio")[0].body
    finally:
        await engine.shutdown(5)


# --- usage, cached tokens and timings -------------------------------------------------------------


async def test_usage_counts_and_cached_tokens_come_from_the_servers_usage_chunk(
    engine: OpenAIEngine, server: FakeOpenAIServer
) -> None:
    # The warm-up sent the shared system prompt, so its full KV blocks are in the server's cache.
    system_tokens = len(engine.tokenizer.render([SYSTEM], add_generation_prompt=False))
    _, result = await collect(engine.generate(make_request("usage-1", max_tokens=6)))
    (received,) = server.requests_for("usage-1")
    assert result.prompt_tokens == received.prompt_tokens
    assert result.cached_tokens == received.cached_tokens >= system_tokens // 16 * 16 > 0
    assert result.output_tokens == 6
    assert result.queue_ms == 0.0  # the server does not report its queue time here


async def test_the_servers_queue_time_is_used_when_vllm_reports_per_request_metrics(
    fresh_server: Callable[..., FakeOpenAIServer],
) -> None:
    srv = fresh_server(max_num_seqs=1, enable_per_request_metrics=True)
    engine = await started(srv)
    try:
        blocker = asyncio.create_task(collect(engine.generate(make_request("queue-1", max_tokens=60))))
        await srv.until(
            lambda: srv.outcome("queue-1") == "open" and srv.requests_for("queue-1")[0].tokens_sent > 0
        )
        _, waited = await collect(engine.generate(make_request("queue-2", max_tokens=2)))
        await blocker
        assert waited.queue_ms > 0  # it waited for the only batch slot on the server
        assert waited.queue_ms <= waited.ttft_ms  # type: ignore[operator]
    finally:
        await engine.shutdown(5)


async def test_without_prompt_token_details_cached_tokens_are_zero(
    fresh_server: Callable[..., FakeOpenAIServer],
) -> None:
    srv = fresh_server(enable_prompt_tokens_details=False)
    engine = await started(srv)
    try:
        _, result = await collect(engine.generate(make_request("nodetails", max_tokens=2)))
        assert result.cached_tokens == 0 and result.prompt_tokens > 0
    finally:
        await engine.shutdown(5)


async def test_a_slow_first_token_shows_in_ttft_not_in_tpot(
    engine: OpenAIEngine, server: FakeOpenAIServer
) -> None:
    server.fault("slow-first", Fault(first_token_delay_s=0.3))
    _, result = await collect(engine.generate(make_request("slow-first", max_tokens=5)))
    assert result.ttft_ms is not None and result.tpot_ms is not None
    assert result.ttft_ms >= 300  # the injected delay is a floor, not a target
    assert result.tpot_ms * 4 <= result.e2e_ms - result.ttft_ms + 1e-6


# --- tokenizers -----------------------------------------------------------------------------------


async def test_the_servers_tokenizer_counts_renders_and_decodes_like_the_models_own(
    engine: OpenAIEngine, tiny_model: Path
) -> None:
    local = HFChatTokenizer(str(tiny_model))
    remote = engine.tokenizer
    assert isinstance(remote, ServerTokenizer) and engine.tokenizer_source == "server"
    text = "pod checkout-api-7d9f4: OOMKilled, 14 restarts, café ✓"
    assert await asyncio.to_thread(remote.count, text) == local.count(text)
    for generation_prompt in (True, False):
        assert await asyncio.to_thread(remote.render, QUESTION, generation_prompt) == local.render(
            QUESTION, generation_prompt
        )
    ids = local.hf.encode(text, add_special_tokens=False)
    assert await asyncio.to_thread(remote.decode, ids) == local.decode(ids)


async def test_a_configured_local_tokenizer_is_used_and_the_server_is_not_asked(
    server: FakeOpenAIServer, tiny_model: Path
) -> None:
    before = sum(1 for r in server.log if r.path == "/tokenize")
    engine = await started(server, tokenizer=str(tiny_model))
    try:
        assert isinstance(engine.tokenizer, HFChatTokenizer) and engine.tokenizer_source == str(tiny_model)
        ids = engine.tokenizer.render(QUESTION)
        await collect(engine.generate(make_request("local-tok", prompt_token_ids=ids, max_tokens=2)))
        assert sum(1 for r in server.log if r.path == "/tokenize") == before
    finally:
        await engine.shutdown(5)


async def test_llama_cpp_gets_token_ids_and_lends_its_tokenizer(
    fresh_server: Callable[..., FakeOpenAIServer], tiny_model: Path
) -> None:
    srv = fresh_server(flavour="llamacpp", served_model_name="/models/tiny.gguf")
    engine = await started(srv, model="tiny")  # llama-server answers to any model name
    try:
        assert engine.kind == "llamacpp" and engine.prompt_mode == "token_ids"
        local = HFChatTokenizer(str(tiny_model))
        assert await asyncio.to_thread(engine.tokenizer.render, QUESTION) == local.render(QUESTION)
        ids = local.render(QUESTION)
        _, result = await collect(
            engine.generate(make_request("llama-1", prompt_token_ids=ids, max_tokens=3))
        )
        received = srv.requests_for("llama-1")[0]
        assert received.path == "/v1/completions" and received.body["prompt"] == ids
        assert result.output_tokens == 3 and result.prompt_tokens == len(ids)
        assert {"/apply-template", "/tokenize"} <= {r.path for r in srv.log}
    finally:
        await engine.shutdown(5)


async def test_a_server_without_token_id_prompts_gets_chat_messages(
    fresh_server: Callable[..., FakeOpenAIServer], tiny_model: Path
) -> None:
    srv = fresh_server(flavour="ollama", served_model_name="llama3:latest")
    engine = await started(srv, model="llama3:latest", tokenizer=str(tiny_model))
    try:
        assert engine.kind == "ollama" and engine.prompt_mode == "messages" and not engine.send_priority
        ids = engine.tokenizer.render(QUESTION)
        _, result = await collect(
            engine.generate(make_request("chat-1", prompt_token_ids=ids, messages=QUESTION, max_tokens=3))
        )
        received = srv.requests_for("chat-1")[0]
        assert received.path == "/v1/chat/completions"
        assert received.body["messages"] == [{"role": m.role, "content": m.content} for m in QUESTION]
        assert "ignore_eos" not in received.body and "priority" not in received.body
        assert result.output_tokens == 3 and result.cached_tokens == 0
        with pytest.raises(EngineGenerateError, match="only token ids"):
            await collect(engine.generate(make_request("chat-2", prompt_token_ids=ids, messages=None)))
    finally:
        await engine.shutdown(5)


async def test_a_server_without_tokenizer_routes_needs_engine_tokenizer(
    fresh_server: Callable[..., FakeOpenAIServer],
) -> None:
    srv = fresh_server(flavour="ollama", served_model_name="llama3:latest")
    engine = OpenAIEngine(remote_config(srv, model="llama3:latest"))
    with pytest.raises(EngineStartupError, match="engine.tokenizer"):
        await engine.start([SYSTEM])
    assert not engine.health().ready and "failed to start" in engine.health().reason


# --- startup errors -------------------------------------------------------------------------------


async def test_a_server_that_is_down_is_a_startup_error_naming_the_url_and_the_fix(
    fresh_server: Callable[..., FakeOpenAIServer],
) -> None:
    srv = fresh_server()
    srv.crash()
    engine = OpenAIEngine(remote_config(srv))
    with pytest.raises(EngineStartupError) as info:
        await engine.start()
    message = str(info.value)
    assert "cannot reach the model server at " + srv.url in message
    assert "engine.base_url" in message and "vllm serve" in message


async def test_start_waits_for_a_server_that_comes_up_late(
    fresh_server: Callable[..., FakeOpenAIServer], caplog: pytest.LogCaptureFixture
) -> None:
    srv = fresh_server()
    srv.crash()
    threading.Timer(0.4, srv.revive).start()
    engine = OpenAIEngine(remote_config(srv, server_wait_s=10))
    await engine.start()
    try:
        assert engine.health().ready
    finally:
        await engine.shutdown(5)


async def test_an_unknown_model_name_is_a_startup_error_listing_what_the_server_offers(
    server: FakeOpenAIServer,
) -> None:
    engine = OpenAIEngine(remote_config(server, model="llama-3-70b"))
    with pytest.raises(EngineStartupError) as info:
        await engine.start()
    assert "'llama-3-70b'" in str(info.value) and f"serves: {MODEL}" in str(info.value)
    assert "engine.served_model_name" in str(info.value)


async def test_no_model_name_at_all_is_a_startup_error_listing_what_the_server_offers(
    server: FakeOpenAIServer,
) -> None:
    engine = OpenAIEngine(remote_config(server, model=None))
    with pytest.raises(EngineStartupError, match=f"no model name configured; .* serves: {MODEL}"):
        await engine.start()


async def test_served_model_name_wins_over_model(server: FakeOpenAIServer, tiny_model: Path) -> None:
    engine = await started(server, model=str(tiny_model), served_model_name=MODEL)
    try:
        assert engine.model == MODEL and engine.tokenizer_source == str(tiny_model)  # a local folder
    finally:
        await engine.shutdown(5)


async def test_a_missing_or_wrong_api_key_is_a_startup_error_and_the_right_one_works(
    fresh_server: Callable[..., FakeOpenAIServer],
) -> None:
    srv = fresh_server(api_key="s3cret-key")
    engine = OpenAIEngine(remote_config(srv))
    with pytest.raises(EngineStartupError, match="engine.api_key"):
        await engine.start()
    engine = await started(srv, api_key="s3cret-key")
    try:
        await collect(engine.generate(make_request("auth-1", max_tokens=1)))
        assert srv.requests_for("auth-1")[0].headers["Authorization"] == "Bearer s3cret-key"
        assert "s3cret-key" not in repr(engine.config)
    finally:
        await engine.shutdown(5)


async def test_a_server_context_window_smaller_than_max_model_len_is_a_startup_error(
    server: FakeOpenAIServer,
) -> None:
    engine = OpenAIEngine(remote_config(server, max_model_len=8192))
    with pytest.raises(EngineStartupError, match="engine.max_model_len = 2048"):
        await engine.start()


def test_the_openai_backend_needs_a_base_url() -> None:
    with pytest.raises(ValidationError, match="engine.base_url"):
        EngineConfig(backend="openai", model="m")


# --- errors during a request ----------------------------------------------------------------------


async def test_a_server_dying_mid_stream_is_engine_dead_and_readiness_follows_the_server(
    fresh_server: Callable[..., FakeOpenAIServer],
) -> None:
    srv = fresh_server()
    engine = await started(srv)
    try:
        srv.fault("die-1", Fault(die_after_tokens=3))
        stream = engine.generate(make_request("die-1", max_tokens=50))
        with pytest.raises(EngineDeadError, match="dropped the connection mid-answer"):
            await collect(stream)
        assert not engine.health().ready  # at once, before the next health check
        srv.crash()
        await eventually(lambda: "unreachable" in engine.health().reason)
        with pytest.raises(EngineDeadError, match="cannot reach"):
            await collect(engine.generate(make_request("die-2")))
        srv.revive()
        await eventually(lambda: engine.health().ready)
        _, result = await collect(engine.generate(make_request("die-3", max_tokens=2)))
        assert result.output_tokens == 2
    finally:
        await engine.shutdown(5)


async def test_an_unhealthy_server_flips_readiness_without_any_request(
    fresh_server: Callable[..., FakeOpenAIServer],
) -> None:
    srv = fresh_server()
    engine = await started(srv)
    try:
        srv.healthy = False  # vLLM answers 503 on /health once its engine core died
        await eventually(lambda: not engine.health().ready)
        assert "/health" in engine.health().reason and "503" in engine.health().reason
        srv.healthy = True
        await eventually(lambda: engine.health().ready)
    finally:
        await engine.shutdown(5)


@pytest.mark.parametrize(
    ("status", "error", "match"),
    [
        (500, EngineGenerateError, "failed this request"),
        (400, EngineGenerateError, "refused this request"),
        (429, EngineOverloadedError, "overloaded"),
        (503, EngineDeadError, "unavailable"),
        (404, EngineDeadError, "404"),
    ],
)
async def test_http_errors_map_onto_the_engine_error_tree(
    engine: OpenAIEngine,
    server: FakeOpenAIServer,
    status: int,
    error: type[Exception],
    match: str,
) -> None:
    rid = f"status-{status}"
    server.fault(rid, Fault(status=status, message=f"injected {status}"))
    with pytest.raises(error, match=match) as info:
        await collect(engine.generate(make_request(rid)))
    assert f"injected {status}" in str(info.value)
    if error is EngineGenerateError:
        assert engine.health().ready  # one request failed; the server is fine


async def test_an_error_event_inside_the_stream_is_a_generate_error(
    engine: OpenAIEngine, server: FakeOpenAIServer
) -> None:
    server.fault("in-stream", Fault(stream_error_after_tokens=2, message="Internal server error"))
    with pytest.raises(EngineGenerateError, match="failed while answering: Internal server error"):
        await collect(engine.generate(make_request("in-stream", max_tokens=20)))
    assert engine.health().ready
    # vllm serve sent an empty message for a request its structured outputs could not run (H100,
    # 2026-12-06): the reason still says what is known and where to look.
    server.fault("in-stream-2", Fault(stream_error_after_tokens=1, message=""))
    with pytest.raises(
        EngineGenerateError, match=r"no message \(InternalServerError, 500; see the server's log\)"
    ):
        await collect(engine.generate(make_request("in-stream-2", max_tokens=20)))


async def test_a_stalled_stream_fails_after_the_read_timeout_and_the_server_sees_the_disconnect(
    server: FakeOpenAIServer,
) -> None:
    engine = await started(server, request_read_timeout_s=0.3)
    try:
        server.fault("stall-1", Fault(stall_after_tokens=2))
        with pytest.raises(EngineGenerateError, match="sent nothing for 0.3 s"):
            await collect(engine.generate(make_request("stall-1", max_tokens=50)))
        await server.until(lambda: server.outcome("stall-1") == "aborted")
    finally:
        await engine.shutdown(5)


# --- stats ------------------------------------------------------------------------------------------


async def test_stats_carry_vllms_own_figures_from_its_metrics(
    engine: OpenAIEngine, server: FakeOpenAIServer
) -> None:
    await collect(engine.generate(make_request("stats-1", max_tokens=2)))
    await eventually(lambda: engine.stats().kv_cache_usage is not None)
    stats = engine.stats()
    assert stats.backend == "openai" and stats.model == MODEL
    assert stats.prefix_cache_hit_rate is not None and 0 < stats.prefix_cache_hit_rate < 1
    assert stats.preemptions == 0
