"""Prometheus queries derived from what the Kubernetes side found (:class:`~bot.context.base.Findings`).

First round, for the workloads in question and the ones they depend on: error ratio and p99 latency
by the Services that select them (``http_requests_total`` / ``http_request_duration_seconds``),
CPU, memory, CPU throttling and restarts of their pods, and the connection pools of common
exporters on their pods (PgBouncer, PostgreSQL, MySQL, Redis gauges, one query). For their nodes:
CPU and memory, and the pods on the node that use the most CPU, memory, and (with DiskPressure)
disk. Second round, when the first found a likely culprit (a pod on the node using more than the
pods in question, or a pool with clients waiting): that pod's CPU, memory and restarts; when a
service in question fails (5xx ratio from ``FAILING_RATIO``): its proxies' 5xx by upstream.

One query per measure covers every workload (or node) at once, so a question costs about a dozen
queries whatever it found. Queries name pods by regex (``pod=~"a|b"``), not by a ``node`` label, so
they work whether or not the cAdvisor series carry one; series are kept only for the pods and
Services Kubernetes named, and a node's consumers only for pods Kubernetes placed there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bot.context.base import Findings, WorkloadFacts

POOL_GAUGES = (
    "pgbouncer_pools_client_waiting_connections",
    "pgbouncer_pools_client_active_connections",
    "pgbouncer_pools_server_active_connections",
    "pgbouncer_pools_client_maxwait_seconds",
    "pg_stat_activity_count",
    "pg_settings_max_connections",
    "mysql_global_status_threads_connected",
    "mysql_global_variables_max_connections",
    "redis_connected_clients",
    "redis_blocked_clients",
    "redis_memory_used_bytes",
    "redis_memory_max_bytes",
)
"""Connection-pool and saturation gauges of common exporters, read for the pods in question and their
dependencies."""

_MAX_WORKLOADS = 6
_MAX_NODES = 3
_MAX_PODS_IN_REGEX = 300
TOP_PER_NODE = 3
"""A node's consumers shown (the biggest), per measure."""

Subject = tuple[str, str]
"""(namespace, pod) or (namespace, service): what a series is about."""


@dataclass(frozen=True, slots=True)
class Derived:
    """One derived query and how its series are kept and ranked."""

    name: str
    promql: str
    unit: str
    rank: int
    """Rank of its lines (0: decisive) unless ``ranks`` says otherwise for a subject."""
    by: str = "pod"
    """The label that names a series' subject with ``namespace``: ``pod`` or ``service``."""
    ranks: Mapping[Subject, int] = field(default_factory=dict)
    keep: frozenset[Subject] | None = None
    """Only series of these subjects (``None``: all, e.g. per node)."""
    groups: Mapping[Subject, str] | None = None
    """Top consumers: subject -> its node; the biggest ``TOP_PER_NODE`` of each node are kept."""

    def subject(self, labels: Mapping[str, str]) -> Subject:
        """The series' subject."""
        return labels.get("namespace", ""), labels.get(self.by, "")


def _rx(values: Iterable[str]) -> str:
    return "|".join(re.escape(v) for v in dict.fromkeys(values) if v)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _cpu(selector: str) -> str:
    return (
        f'sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{{{selector}, container!=""}}[5m]))'
    )


def _memory(selector: str) -> str:
    return f'sum by (namespace, pod) (container_memory_working_set_bytes{{{selector}, container!=""}})'


def _restarts(selector: str) -> str:
    return f"sum by (namespace, pod) (increase(kube_pod_container_status_restarts_total{{{selector}}}[10m]))"


def _workload_queries(workloads: Sequence[WorkloadFacts]) -> list[Derived]:
    spaces = _quote(_rx(w.namespace for w in workloads))
    service_rank = {
        (w.namespace, s): 0 if w.role == "asked" else 1 for w in workloads for s in (*w.services, w.name)
    }
    pod_rank = {(w.namespace, p): 0 if w.role == "asked" else 1 for w in workloads for p in w.pods}
    services = f'namespace=~"{spaces}", service=~"{_quote(_rx(s for _, s in service_rank))}"'
    errors = f'sum by (namespace, service) (rate(http_requests_total{{{services}, code=~"5.."}}[5m]))'
    total = f"sum by (namespace, service) (rate(http_requests_total{{{services}}}[5m]))"
    latency = (
        f"sum by (namespace, service, le) (rate(http_request_duration_seconds_bucket{{{services}}}[5m]))"
    )
    named = frozenset(service_rank)
    out = [
        Derived("error_rate", f"{errors} / {total}", "ratio", 1, "service", service_rank, named),
        Derived(
            "latency_p99",
            f"histogram_quantile(0.99, {latency})",
            "seconds",
            1,
            "service",
            service_rank,
            named,
        ),
    ]
    pods = _quote(_rx(p for _, p in list(pod_rank)[:_MAX_PODS_IN_REGEX]))
    if not pods:
        return out
    selector = f'namespace=~"{spaces}", pod=~"{pods}"'
    throttled = (
        f"sum by (namespace, pod) (rate(container_cpu_cfs_throttled_periods_total{{{selector}}}[5m])) / "
        f"sum by (namespace, pod) (rate(container_cpu_cfs_periods_total{{{selector}}}[5m]))"
    )
    keep = frozenset(pod_rank)
    saturation = {v: min(3, r + 1) for v, r in pod_rank.items()}
    return out + [
        Derived("cpu", _cpu(selector), "cores", 2, keep=keep),
        Derived("memory", _memory(selector), "bytes", 2, ranks=saturation, keep=keep),
        Derived("cpu_throttled", throttled, "ratio", 2, keep=keep),
        Derived("restarts", _restarts(selector), "restarts", 2, ranks=saturation, keep=keep),
        Derived("pools", f'{{__name__=~"{"|".join(POOL_GAUGES)}", {selector}}}', "", 0, keep=keep),
    ]


def _node_queries(findings: Findings, nodes: Sequence[str], allowed: Sequence[str]) -> list[Derived]:
    instance = f'instance=~"({_quote(_rx(nodes))})(:.*)?"'
    available = f"node_memory_MemAvailable_bytes{{{instance}}} / node_memory_MemTotal_bytes{{{instance}}}"
    idle = f'rate(node_cpu_seconds_total{{mode="idle", {instance}}}[5m])'
    out = [
        Derived("node_cpu", f"1 - avg by (instance) ({idle})", "ratio", 1),
        Derived("node_memory", f"1 - avg by (instance) ({available})", "ratio", 1),
    ]
    placed = {
        (ns, pod): node
        for node, ns, pod in findings.node_pods
        if node in nodes and (not allowed or ns in allowed)
    }
    if not placed:
        return out
    selector = f'pod=~"{_quote(_rx(p for _, p in list(placed)[:_MAX_PODS_IN_REGEX]))}"'
    tops = [("top_cpu", "cores", _cpu(selector)), ("top_memory", "bytes", _memory(selector))]
    pressed = {n for n, c in findings.pressure if c == "DiskPressure"}
    if pressed & set(nodes):
        tops.append(
            ("top_disk", "bytes", f"sum by (namespace, pod) (container_fs_usage_bytes{{{selector}}})")
        )
    return out + [
        Derived(f"{name} on node", q, unit, 0, keep=frozenset(placed), groups=placed)
        for name, unit, q in tops
    ]


def first_round(findings: Findings, allowed: Sequence[str] = ()) -> list[Derived]:
    """The first round's queries (see the module doc); ``allowed``: the namespaces this answer may
    read (empty: any)."""
    out: list[Derived] = []
    workloads = [
        w for w in findings.workloads if w.role != "neighbour" and (not allowed or w.namespace in allowed)
    ]
    if workloads:
        out += _workload_queries(workloads[:_MAX_WORKLOADS])
    if findings.nodes:
        out += _node_queries(findings, findings.nodes[:_MAX_NODES], allowed)
    return out


FAILING_RATIO = 0.01
"""Error ratio (5xx / all) of a service in question from which its upstreams' errors are read."""

UPSTREAM_ERRORS = (
    (
        "upstream 5xx (envoy)",
        "envoy_cluster_name",
        "sum by (namespace, envoy_cluster_name) (rate(envoy_cluster_upstream_rq_xx{{{selector}, "
        'envoy_response_code_class="5"}}[5m]))',
    ),
    (
        "upstream 5xx (istio)",
        "destination_service_name",
        "sum by (namespace, destination_service_name) (rate(istio_requests_total{{{selector}, "
        'reporter="source", response_code=~"5.."}}[5m]))',
    ),
)
"""Outbound 5xx by destination as the common proxies report them (Envoy's cluster stats, Istio's
standard metrics): (name, the label naming the upstream, query template)."""


def upstream_round(findings: Findings, failing: Iterable[Subject]) -> list[Derived]:
    """The second round for services in question whose error ratio reached ``FAILING_RATIO``: the
    5xx their pods' proxies got from each upstream, so a failing dependency outside the cluster's
    objects (another team's API, a payment provider) is named by the metrics themselves."""
    wanted = set(failing)
    chosen = [
        w
        for w in findings.workloads
        if w.role == "asked" and any((w.namespace, s) in wanted for s in (*w.services, w.name))
    ]
    if not chosen:
        return []
    spaces = _quote(_rx(w.namespace for w in chosen))
    pods = _quote(_rx(p for w in chosen for p in w.pods[:_MAX_PODS_IN_REGEX]))
    selector = f'namespace=~"{spaces}"' + (f', pod=~"{pods}"' if pods else "")
    return [
        Derived(name, template.format(selector=selector), "req/s", 0, by)
        for name, by, template in UPSTREAM_ERRORS
    ]


def culprit_round(culprits: Iterable[Subject]) -> list[Derived]:
    """The second round: CPU, memory and restarts of the pods the first round pointed at."""
    chosen = list(dict.fromkeys(culprits))[:2]
    if not chosen:
        return []
    selector = f'namespace=~"{_quote(_rx(n for n, _ in chosen))}", pod=~"{_quote(_rx(p for _, p in chosen))}"'
    keep = frozenset(chosen)
    return [
        Derived("culprit cpu", _cpu(selector), "cores", 0, keep=keep),
        Derived("culprit memory", _memory(selector), "bytes", 1, keep=keep),
        Derived("culprit restarts", _restarts(selector), "restarts", 1, keep=keep),
    ]
