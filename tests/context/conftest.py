"""Fixtures of the context tests: the fake Kubernetes API server and settings pointing at it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes.kubernetes_server import FakeKubernetes, sample_cluster

from bot.config import KubernetesSettings


@pytest.fixture
async def fake_k8s() -> AsyncIterator[FakeKubernetes]:
    """The sample cluster, served on a free port."""
    fake = sample_cluster()
    await fake.start()
    yield fake
    await fake.stop()


@pytest.fixture
def kubeconfig(fake_k8s: FakeKubernetes, tmp_path: Path) -> Path:
    """A kubeconfig file whose only context points at :func:`fake_k8s`."""
    return fake_k8s.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def k8s_settings(kubeconfig: Path) -> KubernetesSettings:
    """Kubernetes provider settings using :func:`kubeconfig`."""
    return KubernetesSettings(enabled=True, kubeconfig=kubeconfig, context="fake-cluster", timeout_s=5.0)
