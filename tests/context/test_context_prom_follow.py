"""Prometheus follows what Kubernetes found: derived queries, a second round on the culprit, all in
the one context deadline (the eval's fake Prometheus answers; the gatherer drives both rounds)."""

from __future__ import annotations

from pathlib import Path

from bot.config import PrometheusSettings, Settings
from bot.context.base import ContextRequest, Findings, WorkloadFacts
from bot.context.entities import Entities
from bot.context.gatherer import ContextGatherer
from bot.context.prometheus import PrometheusProvider
from bot.eval.cases import BUILTIN_CASES, load_cases
from bot.eval.prom_api import PrometheusSnapshotServer, Series


def _findings() -> Findings:
    return Findings(
        workloads=(
            WorkloadFacts("web", "Deployment", "search", ("search-1", "search-2"), ("search",), "asked"),
            WorkloadFacts("data", "Deployment", "pgbouncer", ("pgbouncer-1",), ("pgbouncer",), "dependency"),
        ),
        nodes=("worker-4",),
        node_pods=(("worker-4", "web", "search-1"), ("worker-4", "batch", "reindex-1")),
    )


async def test_derived_queries_rank_what_was_asked_keep_a_nodes_pods_only_and_follow_the_culprit():
    prom = PrometheusSnapshotServer(
        series=[
            Series("http_requests_total", {"namespace": "web", "service": "search"}, [0.01, 0.2]),
            Series("http_requests_total", {"namespace": "data", "service": "pgbouncer"}, [0.0, 0.0]),
            Series("container_cpu_usage_seconds_total", {"namespace": "web", "pod": "search-1"}, [0.5, 0.5]),
            Series(
                "container_cpu_usage_seconds_total", {"namespace": "batch", "pod": "reindex-1"}, [0.2, 7.4]
            ),
            # Not on worker-4: never a top consumer of it, however big.
            Series(
                "container_cpu_usage_seconds_total", {"namespace": "batch", "pod": "elsewhere-1"}, [9.0, 9.0]
            ),
            Series(
                "pgbouncer_pools_client_waiting_connections",
                {"namespace": "data", "pod": "pgbouncer-1", "database": "orders"},
                [0, 212],
            ),
        ]
    )
    await prom.start()
    provider = PrometheusProvider(PrometheusSettings(enabled=True, url=prom.url, timeout_s=5))
    try:
        result = await provider.follow(ContextRequest("q", "root_cause", Entities()), _findings())
    finally:
        await provider.close()
        await prom.stop()
    assert result is not None and result.status.value == "ok", result and result.error
    (section,) = result.sections
    lines = dict(zip(section.lines(), section.line_ranks(), strict=True))
    error = next(line for line in lines if line.startswith("error_rate") and "search" in line)
    assert lines[error] == 0 and "last 20.0%" in error
    top = [line for line in lines if line.startswith("top_cpu on worker-4")]
    assert "reindex-1" in top[0] and "7.4 cores" in top[0] and not any("elsewhere-1" in t for t in top)
    pool = next(line for line in lines if "pgbouncer_pools_client_waiting_connections" in line)
    assert lines[pool] == 0 and "max 212" in pool
    # The second round asked about the culprits the first one pointed at (not the asked pods).
    culprit = [q for q in prom.queries if "data|batch" in q and "reindex" in q and "pgbouncer" in q]
    assert culprit and any(line.startswith("culprit cpu") and "reindex-1" in line for line in lines)
    assert len(prom.queries) <= 20


async def test_a_query_too_long_for_a_url_is_sent_in_a_post_body():
    pods = tuple(f"search-7f9c8d6b5-{i:05d}" for i in range(150))
    findings = Findings(workloads=(WorkloadFacts("web", "Deployment", "search", pods, ("search",), "asked"),))
    prom = PrometheusSnapshotServer(
        series=[Series("container_memory_working_set_bytes", {"namespace": "web", "pod": pods[-1]}, [2**30])]
    )
    await prom.start()
    provider = PrometheusProvider(PrometheusSettings(enabled=True, url=prom.url, timeout_s=5))
    try:
        result = await provider.follow(ContextRequest("q", "root_cause", Entities()), findings)
    finally:
        await provider.close()
        await prom.stop()
    assert result is not None and result.error is None
    assert any("1.0 GiB" in line for line in result.sections[0].lines())


async def test_the_gatherer_gives_prometheus_what_kubernetes_found_within_the_one_deadline(tmp_path: Path):
    case = next(c for c in load_cases([BUILTIN_CASES]) if c.id == "hop-noisy-neighbour-cpu")
    kube, prom = case.kubernetes_server(), case.prometheus_server()
    assert kube is not None and prom is not None
    await kube.start()
    await prom.start()
    settings = Settings(
        kubernetes={
            "enabled": True,
            "kubeconfig": kube.write_kubeconfig(tmp_path / "k"),
            "context": "fake-cluster",
        },
        prometheus={"enabled": True, "url": prom.url},
        context={"timeout_s": 4.0},
    )
    gatherer = ContextGatherer.from_settings(settings)
    try:
        bundle = await gatherer.gather(case.question or "", scenario="root_cause")
        # Kubernetes answers too late for a second round: Prometheus' first round stands alone.
        kube.delay(r"/pods$", 1.0)
        gatherer.clear_cache()
        gatherer.timeout_s = 0.6
        late = await gatherer.gather(case.question or "", scenario="root_cause")
    finally:
        await gatherer.close()
        await prom.stop()
        await kube.stop()
    derived = next(
        s for s in bundle.sections if s.title.startswith("Metrics of the workloads and nodes found")
    )
    assert "top_cpu on worker-4" in derived.body and "7.4 cores" in derived.body
    notes = {n.name: n for n in bundle.notes}
    assert notes["Prometheus"].status == "ok" and "Metrics of the workloads" in notes["Prometheus"].detail
    assert not any(s.title.startswith("Metrics of the workloads") for s in late.sections)
    # (Prometheus' own first round found nothing the question names: empty, and not asked again.)
    assert {n.name: n.status for n in late.notes} == {"Kubernetes": "timeout", "Prometheus": "empty"}
