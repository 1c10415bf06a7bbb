"""The engine bridge (``workers = N``): a real CPU engine served over a real Unix socket to a
client, as a worker sees it: the same text and result, errors rebuilt as the same class, early
close aborting on the host, the host's loss failing generations and flipping readiness."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from engine_helpers import QUESTION, collect, make_request

from inference.bridge import BridgeClient, BridgeServer
from inference.config import EngineConfig
from inference.cpu_engine import CpuEngine
from inference.engine import EngineDeadError, EngineOverloadedError, RequestTimeoutError
from inference.engine_set import EngineSet


async def _pair(tiny_model: Path, tmp_path: Path) -> tuple[EngineSet, BridgeServer, BridgeClient]:
    config = EngineConfig(model=str(tiny_model), cpu_threads=1, cpu_max_concurrency=2)
    engines = EngineSet.single(CpuEngine(config))
    await engines.start(QUESTION[:1])
    server = BridgeServer(engines, {"default": str(tiny_model)}, str(tmp_path / "engine.sock"))
    await server.start()
    client = BridgeClient(server.path)
    await client.connect()
    return engines, server, client


async def test_a_generation_over_the_bridge_equals_the_engine_s_own(tiny_model: Path, tmp_path: Path) -> None:
    engines, server, client = await _pair(tiny_model, tmp_path)
    try:
        remote = client.engine_set()
        assert remote.names == engines.names and client.models == {"default": str(tiny_model)}
        texts, result = await collect(remote.generate(make_request("b1")))
        local_texts, local = await collect(engines.generate(make_request("b2")))
        assert "".join(texts) == result.text == local.text == "".join(local_texts)
        assert result.output_tokens == local.output_tokens == 12
        assert result.prompt_tokens == local.prompt_tokens
        # prompts are rendered in the worker with the host's tokenizer, sent in the hello
        assert remote.tokenizer.render(make_request("x").messages or []) == engines.tokenizer.render(
            make_request("x").messages or []
        )
        await asyncio.sleep(0.3)  # a snapshot arrives
        assert remote.health().ready and remote.stats().backend == engines.stats().backend
    finally:
        await client.close()
        await server.close()
        await engines.shutdown()


async def test_errors_keep_their_class_and_fields_and_early_close_cancels_on_the_host(
    tiny_model: Path, tmp_path: Path
) -> None:
    from inference import bridge

    rebuilt = bridge._rebuild_error(bridge._error_state(RequestTimeoutError("r9", 2.5)))
    assert type(rebuilt) is RequestTimeoutError and rebuilt.seconds == 2.5 and str(rebuilt)
    overloaded = bridge._rebuild_error(bridge._error_state(EngineOverloadedError("full")))
    assert type(overloaded) is EngineOverloadedError
    engines, server, client = await _pair(tiny_model, tmp_path)
    try:
        stream = client.engine_set().generate(make_request("c1", max_tokens=200))
        await stream.__anext__()
        await stream.aclose()  # type: ignore[attr-defined]
        for _ in range(100):
            if engines.stats().running == 0:
                break
            await asyncio.sleep(0.05)
        assert engines.stats().running == 0
    finally:
        await client.close()
        await server.close()
        await engines.shutdown()


async def test_the_host_going_away_fails_generations_and_readiness(tiny_model: Path, tmp_path: Path) -> None:
    engines, server, client = await _pair(tiny_model, tmp_path)
    lost: list[str] = []
    client.on_lost.append(lost.append)
    try:
        remote = client.engine_set()
        stream = remote.generate(make_request("d1", max_tokens=400))
        await stream.__anext__()
        await server.close()
        with pytest.raises(EngineDeadError):
            async for _ in stream:
                pass
        assert lost and not remote.health().ready
        with pytest.raises(EngineDeadError):
            await collect(remote.generate(make_request("d2")))
    finally:
        await client.close()
        await engines.shutdown()
