"""Prometheus per cluster and per channel scope, against two real Prometheus servers (one per
cluster), and runbook URLs looked up in the cluster's Prometheus (active alerts, then rules)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prom_fixtures import ALERT_NAME, PromStack, series_present, start_stack, wait_until
from runbook_fixtures import RunbookWiki, sample_wiki

from bot.config import Settings
from bot.context.gatherer import ContextGatherer
from bot.context.scope import ChannelRef


@pytest.fixture(scope="module")
def wiki() -> Iterator[RunbookWiki]:
    server = sample_wiki()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory, wiki: RunbookWiki) -> Iterator[dict[str, PromStack]]:
    """eu-west: the test alert in payments, with a runbook_url, plus a quiet rule with one; us-east:
    the test alert in web."""
    eu = start_stack(
        tmp_path_factory.mktemp("prom-eu"),
        rule_annotations={
            "summary": "eu-west: api in payments is crash-looping",
            "runbook_url": f"{wiki.url}/runbooks/{ALERT_NAME}.md?job={{{{ $labels.job }}}}",
        },
        extra_rules=[
            {
                "alert": "QuietAlert",
                "expr": "opsbot_test_trigger > 100",
                "labels": {"namespace": "payments"},
                "annotations": {"runbook_url": f"{wiki.url}/runbooks/QuietAlert.md"},
            }
        ],
    )
    us = start_stack(
        tmp_path_factory.mktemp("prom-us"),
        rule_labels={"severity": "warning", "namespace": "web"},
        rule_annotations={"summary": "us-east: frontend in web is down"},
    )
    try:
        for stack in (eu, us):
            stack.exporter.trigger = 1
            wait_until(
                lambda stack=stack: series_present(
                    stack, f'ALERTS{{alertname="{ALERT_NAME}",alertstate="firing"}}'
                ),
                30,
                "the test alert to fire",
            )
        yield {"eu-west": eu, "us-east": us}
    finally:
        eu.stop()
        us.stop()


def _settings(stacks: dict[str, PromStack], **more: object) -> Settings:
    return Settings(
        prometheus={"enabled": True, "url": stacks["eu-west"].prometheus_url, "range_minutes": 5},
        kubernetes={"namespaces": ["payments", "web"]},
        context={"default_cluster": "eu-west"},
        clusters={
            "us-east": {
                "prometheus": {"enabled": True, "url": stacks["us-east"].prometheus_url, "timeout_s": 2.0},
                "kubernetes": {"namespaces": ["payments", "web"]},
            }
        },
        **more,
    )


def _alerts(bundle: object) -> str:
    return "\n".join(s.body for s in bundle.sections if s.title.startswith("Firing alerts"))  # type: ignore[attr-defined]


async def test_each_cluster_reads_its_own_prometheus(stacks):
    gatherer = ContextGatherer.from_settings(_settings(stacks))
    try:
        eu = await gatherer.gather("which alerts fire?", scenario="chat")
        us = await gatherer.gather("which alerts fire in us-east?", scenario="chat")
    finally:
        await gatherer.close()
    assert "eu-west: api in payments is crash-looping" in _alerts(eu) and "us-east:" not in _alerts(eu)
    assert "us-east: frontend in web is down" in _alerts(us) and "eu-west:" not in _alerts(us)
    assert us.scope_text() == "cluster us-east, namespaces payments, web"


async def test_a_channel_scoped_to_one_namespace_sees_no_alert_or_series_of_another(stacks):
    scope = {
        "channels": [
            {"match": ["CWEB"], "clusters": ["eu-west"], "namespaces": ["web"]},
            {"match": ["CPAY"], "clusters": ["eu-west"], "namespaces": ["payments"]},
        ]
    }
    gatherer = ContextGatherer.from_settings(_settings(stacks, scope=scope))
    question = "why is api-7f9c8d6b5-x2x9q slow in namespace payments?"
    try:
        pay = await gatherer.gather(question, scenario="root_cause", channel=ChannelRef("slack", "CPAY"))
        web = await gatherer.gather(question, scenario="root_cause", channel=ChannelRef("slack", "CWEB"))
    finally:
        await gatherer.close()
    pay_text = "\n".join(s.body for s in pay.sections)
    web_text = "\n".join(s.body for s in web.sections)
    assert ALERT_NAME in pay_text and 'namespace="payments"' in pay_text
    assert "payments" not in web_text and ALERT_NAME not in web_text
    note = next(n for n in web.notes if n.name == "Prometheus")
    assert "namespace(s) payments outside opsbot's configured scope" in note.detail or note.status == "empty"
    assert web.scope_text() == "cluster eu-west, namespaces web"


async def test_an_rca_naming_an_alert_finds_its_runbook_url_in_the_clusters_prometheus(stacks, wiki):
    gatherer = ContextGatherer.from_settings(_settings(stacks, runbooks={"enabled": True}))
    try:
        active = await gatherer.gather(f"/rca {ALERT_NAME}", scenario="root_cause")
        quiet = await gatherer.gather("/rca what does QuietAlert mean?", scenario="root_cause")
        elsewhere = await gatherer.gather(f"/rca {ALERT_NAME} in us-east", scenario="root_cause")
    finally:
        await gatherer.close()
    # The active alert carries the annotation with its template expanded by Prometheus.
    note = next(n for n in active.notes if n.name == "Runbook")
    assert note.links == [f"{wiki.url}/runbooks/{ALERT_NAME}.md?job=opsbot-test"], note
    assert any("kubectl -n payments get pods" in s.body for s in active.sections if s.source == "Runbook")
    # A rule that is not firing: its annotation comes from the rules API.
    assert next(n for n in quiet.notes if n.name == "Runbook").links == [f"{wiki.url}/runbooks/QuietAlert.md"]
    # us-east's rule has no runbook_url, and nothing else is configured: a clear note, no section.
    runbook = next(n for n in elsewhere.notes if n.name == "Runbook")
    assert runbook.links == [] and "no runbook_url annotation" in runbook.detail
