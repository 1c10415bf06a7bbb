"""Context faults end to end: the Kubernetes API and Prometheus slower than their timeouts, answering
500, or answering garbage (200 with a body the API never sends). Every question is still answered,
and the answer's footer names what went wrong with each source.

Kubernetes is the fake API server (tests/fakes) reached by the real kubernetes-asyncio client;
Prometheus is a small HTTP endpoint speaking the ``/api/v1`` JSON shapes, which can also answer
slowly, with Prometheus' error body and 500, or with garbage (the real server cannot be made to).
The tests in tests/context cover each provider's notes on its own; this is the whole flow.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from fakes.kubernetes_server import FakeKubernetes, sample_cluster
from fakes.mattermost_server import FakeMattermost

from bot.adapters.mattermost import MattermostAdapter
from bot.app import OpsBot
from bot.config import Settings
from reliability.helpers import poll

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

FOOTER_MARK = "request `"
TIMEOUT_S = 0.5


class FakePrometheus:
    """``/api/v1`` of Prometheus (alerts, query, query_range), with a fault mode the test sets."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.calls = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/api/v1/{path:.*}", self._api)
        app.router.add_post("/api/v1/{path:.*}", self._api)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _api(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        if self.mode == "slow":
            await asyncio.sleep(TIMEOUT_S * 6)
        if self.mode == "500":
            body = {"status": "error", "errorType": "internal", "error": "query processing panicked"}
            return web.json_response(body, status=500)
        if self.mode == "garbage":
            return web.Response(text="<html><body>502 Bad Gateway</body></html>", content_type="text/html")
        path = request.match_info["path"]
        data: dict[str, Any]
        if path == "alerts":
            data = {"alerts": []}
        elif path == "query_range":
            data = {"resultType": "matrix", "result": []}
        else:
            data = {"resultType": "vector", "result": []}
        return web.json_response({"status": "success", "data": data})


@pytest.fixture
async def cluster() -> AsyncIterator[FakeKubernetes]:
    fake = sample_cluster()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
async def prom() -> AsyncIterator[FakePrometheus]:
    fake = FakePrometheus()
    await fake.start()
    yield fake
    await fake.stop()


# (which source, the fault, words the footer must carry for that source)
FAULTS = [
    ("kubernetes", "slow", ["Kubernetes", "timed out"]),
    ("kubernetes", "500", ["Kubernetes", "failed"]),
    ("kubernetes", "garbage", ["Kubernetes", "failed"]),
    ("prometheus", "slow", ["Prometheus", "timed out"]),
    ("prometheus", "500", ["Prometheus", "failed"]),
    ("prometheus", "garbage", ["Prometheus", "failed"]),
]


async def test_every_context_fault_still_gets_an_answer_with_the_fault_in_its_footer(
    tiny_model: Path, tmp_path: Path, cluster: FakeKubernetes, prom: FakePrometheus
) -> None:
    async with FakeMattermost(rate_limit=None) as mm:
        alice = mm.add_user("alice")
        channel = mm.add_channel("incidents", [alice, mm.bot_user_id])
        s = Settings(
            data_dir=tmp_path,
            engine={"backend": "cpu", "model": str(tiny_model), "max_model_len": 2048},
            scenarios={"root_cause": {"max_tokens": 8}},
            http={"enabled": False},
            slo={"enabled": False},
            kubernetes={
                "enabled": True,
                "kubeconfig": cluster.write_kubeconfig(tmp_path / "kubeconfig"),
                "timeout_s": TIMEOUT_S,
            },
            prometheus={"enabled": True, "url": prom.url, "timeout_s": TIMEOUT_S},
            context={"timeout_s": 4 * TIMEOUT_S, "cache_ttl_s": 0},
            mattermost={"enabled": True, **mm.settings_kwargs(), "channel_post_interval_s": 0},
        )
        bot = OpsBot(s)
        await bot.start_core()
        assert bot.store is not None
        footers: dict[str, str] = {}
        try:
            await bot.start_service([MattermostAdapter(s.mattermost, bot.store)])
            await poll(lambda: mm.live_connections() > 0, what="the websocket")

            async def ask(label: str) -> str:
                post = await mm.user_posts(
                    alice, channel, "@opsbot why is api-7f9c8d6b5-x2x9q in payments crashing?"
                )

                def final() -> list[str]:
                    return [
                        p["message"]
                        for p in mm.bot_posts()
                        if p["root_id"] == post["id"] and FOOTER_MARK in p["message"]
                    ]

                await poll(final, timeout_s=60, what=f"the answer under {label}")
                return final()[0].rsplit("\n---\n", 1)[-1]

            footers["none"] = await ask("no fault")
            for source, fault, _ in FAULTS:
                cluster.faults.clear()
                prom.mode = "ok"
                if source == "kubernetes":
                    if fault == "slow":
                        cluster.delay(r"/", TIMEOUT_S * 6)
                    elif fault == "500":
                        cluster.fail(r"/", 500, "etcdserver: request timed out")
                    else:
                        cluster.garbage(
                            r"/", '{"kind": "PodList", "items": [{"metadata": ', "application/json"
                        )
                else:
                    prom.mode = fault
                footers[f"{source} {fault}"] = await ask(f"{source} {fault}")
        finally:
            await bot.shutdown()
    for label, footer in footers.items():
        print(f"{label:>20}: {footer}")
    assert (
        "Kubernetes" in footers["none"]
        and "failed" not in footers["none"]
        and "timed out" not in footers["none"]
    )
    for source, fault, words in FAULTS:
        footer = footers[f"{source} {fault}"]
        assert all(word in footer for word in words), (source, fault, footer)
        other = "Prometheus" if source == "kubernetes" else "Kubernetes"
        assert other in footer  # the healthy source is still there
    with __import__("sqlite3").connect(tmp_path / "opsbot.db") as db:
        statuses = [r[0] for r in db.execute("SELECT status FROM opsbot_requests")]
    assert statuses == ["ok"] * (len(FAULTS) + 1)
