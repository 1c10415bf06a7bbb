"""The ``openai`` backend against the real ``vllm serve`` (vLLM 0.26.0) on the 8B dummy model.

One OpenAI-compatible server process for the module, on a free port, started as
``python -m vllm.entrypoints.openai.api_server`` with ``--load-format dummy`` (random weights, real
shapes), ``--scheduling-policy priority``, ``--enable-prompt-tokens-details`` and
``--enable-per-request-metrics``; its log goes to ``$OPSBOT_VLLM_SERVER_LOG`` (else a temp file).
The tests stream through :class:`inference.openai_engine.OpenAIEngine` and also check that the real
server speaks exactly what ``tests/fakes/openai_server.py`` (the CPU tests' peer) speaks.
The server process group is stopped at the end, so the next GPU module finds the GPU free.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from gpu_streams import collect

from inference.admission import AdmittedEngine
from inference.config import EngineConfig
from inference.engine import ChatMessage, GenerationRequest, Lane, SamplingSettings, TextDelta
from inference.openai_engine import OpenAIEngine
from inference.server_tokenizer import ServerTokenizer
from inference.tokenization import HFChatTokenizer

SERVED = "opsbot-8b"
SYSTEM = ChatMessage(
    "system",
    "You are opsbot, an SRE assistant for incident response. Use only the facts in the context; "
    "quote exact numbers; say what is missing. " * 40,
)
START_TIMEOUT_S = 720.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@pytest.fixture(scope="module")
def vllm_server(model_8b: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of a running ``vllm serve`` of the 8B dummy model."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = Path(
        os.environ.get("OPSBOT_VLLM_SERVER_LOG") or tmp_path_factory.mktemp("vllm") / "server.log"
    )
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_8b),
        "--served-model-name",
        SERVED,
        "--load-format",
        "dummy",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "4096",
        "--gpu-memory-utilization",
        "0.85",
        "--max-num-seqs",
        "64",
        "--max-num-batched-tokens",
        "8192",
        "--scheduling-policy",
        "priority",
        "--enable-prompt-tokens-details",
        "--enable-per-request-metrics",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with log_path.open("w") as log:
        # Its own session: the API server and its engine-core child stop together at the end.
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    started = time.monotonic()
    last_note = started
    try:
        while not _healthy(url):
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                raise RuntimeError(
                    f"vllm serve exited with {proc.returncode} before /health answered:\n{tail}"
                )
            if time.monotonic() - started > START_TIMEOUT_S:
                raise RuntimeError(
                    f"vllm serve did not answer /health within {START_TIMEOUT_S:.0f} s ({log_path})"
                )
            if time.monotonic() - last_note > 15:
                last_note = time.monotonic()
                print(f"waiting for vllm serve: {last_note - started:.0f} s (log: {log_path})", flush=True)
            time.sleep(1)
        print(f"vllm serve healthy after {time.monotonic() - started:.0f} s", flush=True)
        yield url
    finally:
        _stop_group(proc)


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # the engine core may outlive the API server briefly
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def config(url: str, **overrides: object) -> EngineConfig:
    values: dict[str, object] = {
        "backend": "openai",
        "base_url": url,
        "served_model_name": SERVED,
        "max_model_len": 4096,
        "health_interval_s": 1.0,
    }
    values.update(overrides)
    return EngineConfig(**values)  # type: ignore[arg-type]


@pytest.fixture
async def engine(vllm_server: str) -> AsyncIterator[OpenAIEngine]:
    """The openai engine with the server's own tokenizer (``/tokenize``)."""
    eng = OpenAIEngine(config(vllm_server))
    await eng.start([SYSTEM])
    yield eng
    await eng.shutdown(drain_timeout_s=10)


def request(
    rid: str, engine: OpenAIEngine, question: str, *, lane: Lane = Lane.NORMAL, max_tokens: int = 32
) -> GenerationRequest:
    messages = [SYSTEM, ChatMessage("user", question)]
    return GenerationRequest(
        request_id=rid,
        scenario="chat",
        lane=lane,
        sampling=SamplingSettings(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
        messages=messages,
        prompt_token_ids=engine.tokenizer.render(messages),
    )


def system_tokens(engine: OpenAIEngine) -> int:
    return len(engine.tokenizer.render([SYSTEM], add_generation_prompt=False))


async def metric(url: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples with ``labels`` on vLLM's ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as response:
        text = await response.text()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += float(sample.value)
    return total


async def test_vllm_serve_streams_through_the_openai_backend_with_usage_and_cached_tokens(
    engine: OpenAIEngine,
) -> None:
    assert engine.kind == "vllm" and engine.prompt_mode == "token_ids" and engine.send_priority
    assert engine.tokenizer_source == "server" and engine.health().ready
    req = request("serve-stream", engine, "why is checkout slow?")
    deltas, result = await collect(engine.generate(req))
    assert result.output_tokens == 32 and len(deltas) >= 2
    assert result.prompt_tokens == len(req.prompt_token_ids or [])
    # The warm-up put the shared system prompt into vLLM's prefix cache (block-aligned).
    assert min(result.cached_tokens, system_tokens(engine)) / system_tokens(engine) >= 0.95
    assert result.ttft_ms is not None and result.tpot_ms is not None
    assert 0 <= result.queue_ms <= result.ttft_ms <= result.e2e_ms  # queue: vLLM's per-request metrics


async def test_vllm_serve_takes_lane_priorities_and_an_urgent_request_completes_under_load(
    engine: OpenAIEngine,
) -> None:
    admitted = AdmittedEngine(engine)
    background = [
        asyncio.create_task(
            collect(
                admitted.generate(
                    request(
                        f"serve-bg-{i}", engine, "summarise the week", lane=Lane.BACKGROUND, max_tokens=200
                    )
                )
            )
        )
        for i in range(32)
    ]
    await asyncio.sleep(0)
    _, urgent = await collect(
        admitted.generate(request("serve-urgent", engine, "pager: api down", lane=Lane.URGENT, max_tokens=16))
    )
    assert urgent.output_tokens == 16 and urgent.ttft_ms is not None
    results = await asyncio.gather(*background)
    assert all(r.output_tokens == 200 for _, r in results)
    # Timing targets are measured by the benchmarks, not asserted here.


async def test_the_servers_tokenizer_matches_the_models_own(engine: OpenAIEngine, model_8b: Path) -> None:
    local = HFChatTokenizer(str(model_8b))
    remote = engine.tokenizer
    assert isinstance(remote, ServerTokenizer)
    question = [SYSTEM, ChatMessage("user", "pod checkout-api-7d9f4: OOMKilled, 14 restarts, café ✓")]
    assert await asyncio.to_thread(remote.render, question) == local.render(question)
    assert await asyncio.to_thread(remote.count, question[1].content) == local.count(question[1].content)


async def test_a_local_tokenizer_and_chat_messages_work_against_vllm_serve(
    vllm_server: str, model_8b: Path
) -> None:
    eng = OpenAIEngine(config(vllm_server, tokenizer=str(model_8b), server_prompt="messages"))
    await eng.start([SYSTEM])
    try:
        assert eng.tokenizer_source == str(model_8b) and eng.prompt_mode == "messages"
        deltas, result = await collect(
            eng.generate(request("serve-chat", eng, "what changed?", max_tokens=24))
        )
        assert result.output_tokens == 24 and "".join(d.text for d in deltas) == result.text
        assert min(result.cached_tokens, system_tokens(eng)) / system_tokens(eng) >= 0.95
    finally:
        await eng.shutdown(10)


async def test_closing_the_stream_aborts_the_request_in_vllm(engine: OpenAIEngine, vllm_server: str) -> None:
    # vLLM 0.26 counts no finished_reason="abort" for a client that disconnects (its output
    # processor drops the request without finish stats; the H200 run of 2026-12-03 waited 60 s for
    # one). What shows the abort: the request stops running long before its 3000 tokens (about
    # 15 s on the H200) and never finishes.
    finished_before = await metric(vllm_server, "vllm:request_success_total")
    stream = engine.generate(request("serve-close", engine, "write a long postmortem", max_tokens=3000))
    got = 0
    async for event in stream:
        got += isinstance(event, TextDelta)
        if got >= 3:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while await metric(vllm_server, "vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline, "vLLM still runs the request 30 s after its stream closed"
        await asyncio.sleep(0.1)
    generated = await metric(vllm_server, "vllm:generation_tokens_total")
    await asyncio.sleep(1.0)
    assert await metric(vllm_server, "vllm:generation_tokens_total") == generated, "still generating"
    assert await metric(vllm_server, "vllm:request_success_total") == finished_before, (
        "the request ran to its end: closing the stream did not abort it"
    )


async def test_an_unknown_model_name_is_a_startup_error_listing_what_vllm_serves(vllm_server: str) -> None:
    from inference.engine import EngineStartupError

    eng = OpenAIEngine(config(vllm_server, served_model_name="llama-3-70b"))
    with pytest.raises(EngineStartupError, match=f"serves: {SERVED}"):
        await eng.start()


async def test_vllm_serve_speaks_what_the_fake_server_speaks(vllm_server: str) -> None:
    """The CPU tests' fake must stay true: the same framing, field order and error body as 0.26."""
    body = {
        "model": SERVED,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as session:
        headers = {"X-Request-Id": "serve-bytes"}
        async with session.post(f"{vllm_server}/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            raw = (await r.read()).decode()
        async with session.post(f"{vllm_server}/v1/completions", json={"model": "nope", "prompt": "x"}) as r:
            assert r.status == 404
            assert await r.json() == {
                "error": {
                    "message": "The model `nope` does not exist.",
                    "type": "NotFoundError",
                    "param": "model",
                    "code": 404,
                }
            }
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert [list(c) for c in chunks[:1]] == [
        ["id", "object", "created", "model", "choices", "prompt_token_ids", "prompt_text"]
    ]
    assert chunks[0]["id"] == "chatcmpl-serve-bytes"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    token_chunks = [c for c in chunks[1:] if c["choices"]]
    assert len(token_chunks) == 2 and token_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert list(token_chunks[0]["choices"][0]) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2
    assert "cached_tokens" in usage["usage"]["prompt_tokens_details"]
    assert "queue_time_ms" in usage["metrics"]
