"""Health, readiness and metrics endpoints on the real aiohttp server."""

from __future__ import annotations

from typing import Any

import aiohttp

from bot.http import build_http_app, start_http


async def serve(parts: Any) -> tuple[Any, str]:
    app = build_http_app(engine=parts.engine, store=parts.store)
    runner, port = await start_http(app, "127.0.0.1", 0)
    return runner, f"http://127.0.0.1:{port}"


async def test_healthz_readyz_and_metrics_answer_when_everything_is_up(parts: Any) -> None:
    await parts.adapter._submit(parts.adapter.to_message("what is failing?"))
    runner, base = await serve(parts)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/healthz") as resp:
                assert resp.status == 200
            async with http.get(f"{base}/readyz") as resp:
                assert resp.status == 200 and (await resp.json())["ready"] is True
            async with http.get(f"{base}/metrics") as resp:
                body = await resp.text()
                assert resp.status == 200
                assert 'opsbot_engine_ready{engine="default"} 1.0' in body
                assert "opsbot_ttft_seconds_bucket" in body
                assert "opsbot_requests_total" in body
    finally:
        await runner.cleanup()


async def test_readyz_flips_to_503_with_the_reason_when_the_engine_is_gone(parts: Any) -> None:
    runner, base = await serve(parts)
    try:
        await parts.engine.shutdown(1)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{base}/readyz") as resp:
                data = await resp.json()
                assert resp.status == 503 and data["ready"] is False
                assert "engine not ready" in data["reason"]
            async with http.get(f"{base}/healthz") as resp:
                assert resp.status == 200
    finally:
        await runner.cleanup()
