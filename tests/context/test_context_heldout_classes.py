"""Incident classes the held-out cases (``bot/eval/cases-heldout``) found opsbot missing, each read
from the eval's fake Kubernetes / Prometheus APIs with the real clients: a ConfigMap's value, a
Service selecting nothing, a StatefulSet's half-done rollout, an error only in a Running pod's log,
and a failing upstream only Prometheus names."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.config import KubernetesSettings, PrometheusSettings
from bot.context.base import ContextRequest, ContextSection, Findings, ProviderResult, WorkloadFacts
from bot.context.entities import Entities, extract
from bot.context.kubernetes import KubernetesProvider
from bot.context.prometheus import PrometheusProvider
from bot.eval.cases import BUILTIN_CASES, load_cases
from bot.eval.kube_api import KubernetesSnapshotServer, config_map
from bot.eval.prom_api import PrometheusSnapshotServer, Series

HELDOUT = BUILTIN_CASES.parent / "cases-heldout"
CASES = {c.id: c for c in load_cases([HELDOUT, BUILTIN_CASES])}


@pytest.fixture
async def ask(tmp_path: Path) -> AsyncIterator:
    """Serve a case, ask its question (or ``question``) with ``settings``; returns the result, the
    server and the provider (still open: a second question reuses it)."""
    servers: list[KubernetesSnapshotServer] = []
    providers: list[KubernetesProvider] = []

    async def run(
        case_id: str,
        question: str | None = None,
        *,
        server: KubernetesSnapshotServer | None = None,
        provider: KubernetesProvider | None = None,
        **settings: object,
    ) -> tuple[ProviderResult, KubernetesSnapshotServer, KubernetesProvider]:
        case = CASES[case_id]
        if server is None:
            server = case.kubernetes_server()
            assert server is not None
            await server.start()
            servers.append(server)
        if provider is None:
            config = server.write_kubeconfig(tmp_path / f"{case_id}.kubeconfig")
            provider = KubernetesProvider(
                KubernetesSettings(enabled=True, kubeconfig=config, timeout_s=10, **settings)  # type: ignore[arg-type]
            )
            providers.append(provider)
        text = question or case.question or ""
        result = await provider.fetch(ContextRequest(text, "root_cause", extract(text, case.alert)))
        assert result.status.value == "ok", result.error
        return result, server, provider

    yield run
    for provider in providers:
        await provider.close()
    for server in servers:
        await server.stop()


def _section(result: ProviderResult, prefix: str) -> ContextSection:
    found = [s for s in result.sections if s.title.startswith(prefix)]
    assert found, f"no section {prefix!r} in {[s.title for s in result.sections]}"
    return found[0]


def _ranked(section: ContextSection) -> dict[str, int]:
    return dict(zip(section.lines(), section.line_ranks(), strict=True))


# -- ConfigMaps the pods reference -----------------------------------------------------------------


async def test_a_configmap_the_pods_reference_is_read_by_name_and_its_value_shown(ask):
    result, server, _ = await ask("ho-configmap-db-host")
    body = _section(result, "ConfigMaps the pods reference").body
    assert "configmap shop/orders-env: keys DB_HOST, DB_NAME, DB_PORT, LOG_LEVEL" in body
    assert "  DB_HOST=pg-replica.data.svc" in body
    # One get by name; never a list of ConfigMaps, never a Secret.
    reads = [r for r in server.requests if "configmaps" in r]
    assert reads == ["GET /api/v1/namespaces/shop/configmaps/orders-env"]
    assert not any("secrets" in r for r in server.requests)


async def test_a_referenced_key_the_configmap_lacks_is_decisive(ask):
    case = CASES["hop-configmap-key-typo"]
    server = case.kubernetes_server()
    assert server is not None
    # The pod names one key through env; the ConfigMap has another.
    server.pods[0]["spec"]["containers"][0]["env"] = [
        {"name": "RULES", "valueFrom": {"configMapKeyRef": {"name": "pricing-rules", "key": "rules.yaml"}}}
    ]
    await server.start()
    try:
        result, _, provider = await ask("hop-configmap-key-typo", server=server)
        await provider.close()
    finally:
        await server.stop()
    lines = _ranked(_section(result, "ConfigMaps the pods reference"))
    assert lines["  rules.yaml: referenced, but the ConfigMap has no such key"] == 0
    assert "configmap shop/pricing-rules: keys currency.yaml, rule.yaml" in lines


async def test_configmap_values_are_redacted(ask):
    case = CASES["ho-configmap-db-host"]
    server = case.kubernetes_server()
    assert server is not None
    server.configmaps = [
        config_map(
            "orders-env",
            "shop",
            data={
                "DB_HOST": "pg-main.data.svc",
                "DATABASE_URL": "postgres://orders:Xk9-pLm2-Qr7z@pg-main/orders",
            },
        )
    ]
    await server.start()
    try:
        result, _, provider = await ask("ho-configmap-db-host", server=server)
        await provider.close()
    finally:
        await server.stop()
    body = _section(result, "ConfigMaps the pods reference").body
    assert "DB_HOST=pg-main.data.svc" in body
    assert "DATABASE_URL=" in body and "Xk9-pLm2-Qr7z" not in body


async def test_with_read_configmaps_off_no_configmap_is_asked_for(ask):
    result, server, _ = await ask("ho-configmap-db-host", read_configmaps=False)
    body = _section(result, "ConfigMaps the pods reference").body
    assert (
        "configmap shop/orders-env: all keys (mounted or envFrom) "
        "(values not read: kubernetes.read_configmaps is off)" in body
    )
    assert "pg-replica.data.svc" not in body
    assert not any("configmaps" in r or "secrets" in r for r in server.requests)


async def test_a_role_without_configmaps_is_asked_once_and_is_no_failure(ask):
    case = CASES["ho-configmap-db-host"]
    server = case.kubernetes_server()
    assert server is not None
    server.fail(r"/configmaps/", 403, 'configmaps "orders-env" is forbidden')
    await server.start()
    try:
        first, _, provider = await ask("ho-configmap-db-host", server=server)
        second, _, _ = await ask("ho-configmap-db-host", server=server, provider=provider)
        await provider.close()
    finally:
        await server.stop()
    assert first.error is None and second.error is None
    assert (
        "(values not read: opsbot's Role grants no get on configmaps)"
        in _section(second, "ConfigMaps the pods reference").body
    )
    assert sum("configmaps" in r for r in server.requests) == 1


# -- Services, StatefulSets, quiet clusters --------------------------------------------------------


async def test_a_service_whose_selector_matches_no_pod_is_decisive_with_the_labels_the_pods_carry(ask):
    result, _, _ = await ask("ho-svc-selector-mismatch")
    lines = _ranked(_section(result, "Dependencies"))
    line = next(line for line in lines if line.startswith("service billing/billing selects"))
    assert line.startswith(
        "service billing/billing selects app=billing-api: no pod matches (no endpoints); billing-"
    )
    assert line.endswith("carries app=billing")
    assert lines[line] == 0


async def test_a_service_that_selects_its_pods_is_not_listed(ask):
    result, _, _ = await ask("ho-sidecar-oom")
    assert not any("no pod matches" in s.body for s in result.sections)


async def test_a_statefulsets_broken_pod_is_compared_with_a_healthy_one(ask):
    result, _, _ = await ask("ho-sts-rollout-limit")
    body = _section(result, "Workloads").body
    assert (
        "  kafka-2 (not healthy) differs from kafka-0 (healthy): kafka image: "
        "registry.example.com/kafka:3.7.0 -> registry.example.com/kafka:3.7.1; "
        "kafka memory limit: 4Gi -> 1Gi; kafka memory request: 4Gi -> 1Gi"
    ) in body


async def test_a_daemonsets_pod_on_one_node_is_compared_with_its_healthy_siblings(ask):
    result, _, _ = await ask("ho-daemonset-one-node")
    body = _section(result, "Workloads").body
    # Same spec everywhere: the cause is the node (port 9100 taken there), not a rollout.
    assert "node-exporter-k7l8m (not healthy) has the same pod spec as node-exporter-a1b2c (healthy)" in body


async def test_nothing_named_nothing_unhealthy_reads_running_pods_logs_for_errors(ask):
    result, server, _ = await ask("ho-cert-expired-running")
    log = _section(result, "Log of integrations/notifier-")
    assert "errors in the log of a running pod (no pod is unhealthy)" in log.title
    assert any("x509: certificate has expired" in line for line in log.lines())
    assert not any("heartbeat ok" in line for line in log.lines())
    assert "deployment integrations/notifier" in _section(result, "Workloads").body
    assert any("/log?" in r for r in server.requests)


async def test_with_a_broken_pod_in_the_scope_no_running_pods_log_is_sampled(ask):
    result, server, _ = await ask("ho-disk-pressure-evictions", "what is broken?")
    assert not any("no pod is unhealthy" in s.title for s in result.sections)
    healthy = "cart-1f2e3d4c5-okk1"
    assert not any(f"/pods/{healthy}/log" in r for r in server.requests)


# -- Prometheus: the upstream a failing service calls ----------------------------------------------


def _findings(error_ratio: float) -> tuple[Findings, PrometheusSnapshotServer]:
    findings = Findings(
        workloads=(WorkloadFacts("shop", "Deployment", "checkout", ("checkout-1",), ("checkout",), "asked"),),
    )
    prom = PrometheusSnapshotServer(
        series=[
            Series("http_requests_total", {"namespace": "shop", "service": "checkout"}, [0.0, error_ratio]),
            Series(
                "envoy_cluster_upstream_rq_xx",
                {"namespace": "shop", "pod": "checkout-1", "envoy_cluster_name": "fraud-check"},
                [0.0, 19.4],
            ),
            Series(
                "istio_requests_total",
                {"namespace": "shop", "pod": "checkout-1", "destination_service_name": "ledger"},
                [0.0, 3.0],
            ),
        ]
    )
    return findings, prom


@pytest.mark.parametrize("ratio, asked", [(0.12, True), (0.002, False)])
async def test_a_failing_service_gets_its_proxies_5xx_by_upstream(ratio, asked):
    findings, prom = _findings(ratio)
    await prom.start()
    provider = PrometheusProvider(PrometheusSettings(enabled=True, url=prom.url, timeout_s=5))
    try:
        result = await provider.follow(ContextRequest("q", "root_cause", Entities()), findings)
    finally:
        await provider.close()
        await prom.stop()
    assert result is not None and result.status.value == "ok", result and result.error
    upstream = [q for q in prom.queries if "envoy_cluster_upstream_rq_xx" in q or "istio_requests_total" in q]
    body = result.sections[0].body
    if asked:
        assert len(upstream) == 2
        assert 'upstream 5xx (envoy) {envoy_cluster_name="fraud-check"' in body
        assert 'upstream 5xx (istio) {destination_service_name="ledger"' in body
    else:
        # Below 1% errors: no extra queries.
        assert upstream == [] and "upstream" not in body


# -- a startup error older than the log tail ------------------------------------------------------


def _buried(server: KubernetesSnapshotServer, lines_after: int) -> None:
    """The notifier's log: one startup error, then ``lines_after`` routine lines."""
    key = next(k for k in server.logs if k[1].startswith("notifier-"))
    server.logs[key] = (
        "2026-12-05T08:00:00Z INFO starting notifier\n"
        "2026-12-05T08:00:01Z ERROR cannot load CA bundle /etc/ssl/partner-ca.pem: "
        "no such file or directory\n"
        + "".join(f"2026-12-05T09:00:00Z INFO delivered=0 batch={i}\n" for i in range(lines_after))
    )


@pytest.mark.parametrize("lines_after, head_read", [(2600, True), (100, False)])
async def test_a_startup_error_older_than_the_tail_is_read_from_the_logs_start(ask, lines_after, head_read):
    server = CASES["ho-cert-expired-running"].kubernetes_server()
    assert server is not None
    _buried(server, lines_after)
    await server.start()
    try:
        result, _, provider = await ask("ho-cert-expired-running", "notifier sends nothing", server=server)
        await provider.close()
    finally:
        await server.stop()
    log = _section(result, "Log of integrations/notifier-")
    assert any("partner-ca.pem: no such file or directory" in line for line in log.lines())
    heads = [r for r in server.requests if "/log?" in r and "limitBytes" in r and "tailLines" not in r]
    # Only a cut log without an error in its tail costs the second call.
    assert len(heads) == (1 if head_read else 0)
