"""Fixtures of the tool and investigation tests: a small cluster on the eval's in-process Kubernetes
and Prometheus APIs (an OOMKilled api pod in ``shop``, a database in ``data``, a secret and a
planted instruction in the api's log), and a gatherer whose channel ``C-SHOP`` may read ``shop``."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes.shop_cluster import cluster

from bot.config import ChannelScopeSettings, KubernetesSettings, PrometheusSettings, ScopeSettings, Settings
from bot.context.gatherer import ContextGatherer
from bot.eval.kube_api import KubernetesSnapshotServer
from bot.eval.prom_api import PrometheusSnapshotServer, Series
from inference.config import EngineConfig


@pytest.fixture
async def kube() -> AsyncIterator[KubernetesSnapshotServer]:
    server = cluster()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def prom() -> AsyncIterator[PrometheusSnapshotServer]:
    server = PrometheusSnapshotServer(
        series=[
            Series(
                "container_memory_working_set_bytes",
                {"namespace": "shop", "pod": "api-7f9c8d6b5-x2x9q"},
                [1e8, 2e8, 2.6e8],
            ),
            Series(
                "container_memory_working_set_bytes",
                {"namespace": "data", "pod": "postgres-0"},
                [5e8, 5e8, 5e8],
            ),
        ]
    )
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def gatherer(
    kube: KubernetesSnapshotServer, prom: PrometheusSnapshotServer, tmp_path: Path
) -> AsyncIterator[ContextGatherer]:
    settings = Settings(
        kubernetes=KubernetesSettings(
            enabled=True,
            kubeconfig=kube.write_kubeconfig(tmp_path / "kubeconfig", context="eval"),
            context="eval",
            namespaces=["shop", "data"],
        ),
        prometheus=PrometheusSettings(enabled=True, url=prom.url),
        scope=ScopeSettings(channels=[ChannelScopeSettings(match=["C-SHOP"], namespaces=["shop"])]),
    )
    found = ContextGatherer.from_settings(settings)
    yield found
    await found.close()


WINDOW = 8192
"""SmolLM2-135M's context window (the loop's transcript grows into it)."""


@pytest.fixture
async def engine(smollm2_gguf: Path) -> AsyncIterator[Any]:
    """The llama.cpp engine on SmolLM2-135M (skips without llama-cpp-python, except in CI)."""
    if os.environ.get("CI") != "true":
        pytest.importorskip("llama_cpp")
    from inference.llamacpp_engine import LlamaCppEngine

    # One slot: each step finds the last step's tokens in the same llama.cpp context.
    started = LlamaCppEngine(
        EngineConfig(model=str(smollm2_gguf), cpu_max_concurrency=1, cpu_threads=2, max_model_len=WINDOW)
    )
    await started.start()
    yield started
    await started.shutdown(1.0)
