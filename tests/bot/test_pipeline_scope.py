"""The pipeline with cluster context: the footer names the cluster scope the answer read, and a
question asked in an alert's thread gets the alert's runbook (linked in the footer)."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from fakes.kubernetes_server import FakeKubernetes, sample_cluster

from bot.adapters.console import ConsoleAdapter
from bot.app import submit_to
from bot.config import Settings
from bot.context.gatherer import ContextGatherer
from bot.pipeline import Pipeline
from bot.store import AlertThread


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """rich wraps the footer at the terminal's width: make it one line to read it back."""
    monkeypatch.setenv("COLUMNS", "1000")


@pytest.fixture
async def cluster() -> AsyncIterator[FakeKubernetes]:
    fake = sample_cluster()
    await fake.start()
    yield fake
    await fake.stop()


async def _console(parts: Any, settings: Settings) -> tuple[ConsoleAdapter, io.StringIO, ContextGatherer]:
    gatherer = ContextGatherer.from_settings(settings)
    pipeline = Pipeline(
        engine=parts.engine,
        store=parts.store,
        prompts=parts.pipeline.prompts,
        scenarios=parts.pipeline.scenarios,
        context=gatherer,
        model_name="tiny",
    )
    out = io.StringIO()
    adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=out)
    await adapter.start(submit_to(pipeline, adapter))
    return adapter, out, gatherer


async def test_the_footer_names_the_cluster_and_namespaces_of_the_channels_scope(
    parts: Any, cluster: FakeKubernetes, tmp_path: Path
) -> None:
    settings = Settings(
        kubernetes={"enabled": True, "kubeconfig": cluster.write_kubeconfig(tmp_path / "kubeconfig")},
        context={"default_cluster": "eu-west"},
        scope={"channels": [{"match": ["terminal"], "platform": "console", "namespaces": ["payments"]}]},
    )
    adapter, out, gatherer = await _console(parts, settings)
    try:
        await adapter._submit(adapter.to_message("what is broken in namespace web?"))  # type: ignore[misc]
    finally:
        await gatherer.close()
    footer = out.getvalue().strip().splitlines()[-1]
    assert "sources: Kubernetes" in footer
    assert "scope: cluster eu-west, namespaces payments" in footer
    assert not any("/namespaces/web/" in r for r in cluster.requests)


async def test_a_question_in_an_alert_thread_gets_the_alerts_runbook_linked_in_the_footer(
    parts: Any, tmp_path: Path
) -> None:
    folder = tmp_path / "runbooks"
    folder.mkdir()
    (folder / "PaymentsDown.md").write_text("# PaymentsDown\n1. check the payments api pods\n")
    settings = Settings(runbooks={"enabled": True, "folder": folder})
    adapter, out, gatherer = await _console(parts, settings)
    # The terminal session is the thread opsbot opened for this alert group.
    await parts.store.save_alert_thread(
        AlertThread('{}:{alertname="PaymentsDown"}', "console", "terminal", adapter.session, "firing")
    )
    try:
        await adapter._submit(adapter.to_message("is it still failing?"))  # type: ignore[misc]
    finally:
        await gatherer.close()
    footer = out.getvalue().strip().splitlines()[-1]
    assert "sources: Runbook" in footer
    assert f"runbook: {(folder / 'PaymentsDown.md').resolve()}" in footer
    # No cluster source is configured, so no scope is claimed.
    assert "scope:" not in footer
