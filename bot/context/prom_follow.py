"""Prometheus queries derived from what the Kubernetes side found (:class:`~bot.context.base.Findings`).

First round, for the workloads in question and the ones they depend on: error ratio and p99 latency
by the Services that select them (``http_requests_total`` / ``http_request_duration_seconds``),
CPU, memory, CPU throttling and restarts of their pods, and the connection pools of common
exporters on their pods (PgBouncer, PostgreSQL, MySQL, Redis gauges, one query). For their nodes:
CPU and memory, and the pods on the node that use the most CPU, memory, and (with DiskPressure)
disk. Second round, when the first found a likely culprit (a pod on the node using more than the
pods in question, or a pool with clients waiting): that pod's CPU, memory and restarts.

Queries name pods by regex (``pod=~"a|b"``), not by a ``node`` label, so they work whether or not
the cAdvisor series carry one; series are kept only for pods Kubernetes placed there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
_MAX_PODS_IN_REGEX = 110


@dataclass(frozen=True, slots=True)
class Derived:
    """One derived query."""

    name: str
    promql: str
    unit: str
    rank: int
    """Rank of its lines (0: decisive)."""
    about: str = ""
    """What it is about, for the line (``node worker-4``, ``shop/orders``)."""
    top_of: tuple[tuple[str, str], ...] = ()
    """When set: keep only series of these (namespace, pod), biggest last value first (a node's top
    consumers)."""


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


def _ratio(metric: str, selector: str, errors: str) -> str:
    """``errors`` over all of ``metric`` by Service (an error ratio)."""
    total = f"sum by (namespace, service) (rate({metric}{{{selector}}}[5m]))"
    return f"sum by (namespace, service) (rate({metric}{{{selector}, {errors}}}[5m])) / {total}"


def _workload_queries(w: WorkloadFacts) -> list[Derived]:
    ns, about = _quote(w.namespace), f"{w.namespace}/{w.name}"
    services = f'namespace="{ns}", service=~"{_quote(_rx([*w.services, w.name]))}"'
    pods = _quote(_rx(w.pods[:_MAX_PODS_IN_REGEX]))
    asked = w.role == "asked"
    latency = (
        f"sum by (namespace, service, le) (rate(http_request_duration_seconds_bucket{{{services}}}[5m]))"
    )
    out = [
        Derived(
            f"error_rate {about}",
            _ratio("http_requests_total", services, 'code=~"5.."'),
            "ratio",
            0 if asked else 1,
            about,
        ),
        Derived(
            f"latency_p99 {about}",
            f"histogram_quantile(0.99, {latency})",
            "seconds",
            0 if asked else 1,
            about,
        ),
    ]
    if not pods:
        return out
    selector = f'namespace="{ns}", pod=~"{pods}"'
    throttled = (
        f"sum by (namespace, pod) (rate(container_cpu_cfs_throttled_periods_total{{{selector}}}[5m])) / "
        f"sum by (namespace, pod) (rate(container_cpu_cfs_periods_total{{{selector}}}[5m]))"
    )
    out += [
        Derived(f"cpu {about}", _cpu(selector), "cores", 2, about),
        Derived(f"memory {about}", _memory(selector), "bytes", 1 if asked else 2, about),
        Derived(f"cpu_throttled {about}", throttled, "ratio", 2, about),
        Derived(f"pools {about}", f'{{__name__=~"{"|".join(POOL_GAUGES)}", {selector}}}', "", 0, about),
    ]
    if asked:
        out.append(Derived(f"restarts {about}", _restarts(selector), "restarts", 1, about))
    return out


def _node_queries(node: str, pods: Sequence[tuple[str, str]], pressure: set[str]) -> list[Derived]:
    instance = f'instance=~"{_quote(re.escape(node))}(:.*)?"'
    about = f"node {node}"
    available = f"node_memory_MemAvailable_bytes{{{instance}}} / node_memory_MemTotal_bytes{{{instance}}}"
    out = [
        Derived(
            f"node_cpu {node}",
            f'1 - avg by (instance) (rate(node_cpu_seconds_total{{mode="idle", {instance}}}[5m]))',
            "ratio",
            1,
            about,
        ),
        Derived(f"node_memory {node}", f"1 - avg by (instance) ({available})", "ratio", 1, about),
    ]
    regex = _quote(_rx(p for _, p in pods[:_MAX_PODS_IN_REGEX]))
    if not regex:
        return out
    selector = f'pod=~"{regex}"'
    tops = [("top_cpu", "cores", _cpu(selector)), ("top_memory", "bytes", _memory(selector))]
    if "DiskPressure" in pressure:
        tops.append(
            ("top_disk", "bytes", f"sum by (namespace, pod) (container_fs_usage_bytes{{{selector}}})")
        )
    return out + [
        Derived(f"{name} on {about}", promql, unit, 0, about, tuple(pods)) for name, unit, promql in tops
    ]


def first_round(findings: Findings, allowed: Sequence[str] = ()) -> list[Derived]:
    """The first round's queries (see the module doc); ``allowed``: the namespaces this answer may
    read (empty: any)."""
    out: list[Derived] = []
    workloads = [
        w for w in findings.workloads if w.role != "neighbour" and (not allowed or w.namespace in allowed)
    ]
    for w in workloads[:_MAX_WORKLOADS]:
        out += _workload_queries(w)
    for node in findings.nodes:
        pods = [
            (ns, pod) for n, ns, pod in findings.node_pods if n == node and (not allowed or ns in allowed)
        ]
        out += _node_queries(node, pods, {c for n, c in findings.pressure if n == node})
    return out


def culprit_round(culprits: Iterable[tuple[str, str]]) -> list[Derived]:
    """The second round: CPU, memory and restarts of each (namespace, pod) the first round pointed at."""
    out: list[Derived] = []
    for ns, pod in list(dict.fromkeys(culprits))[:2]:
        selector = f'namespace="{_quote(ns)}", pod="{_quote(pod)}"'
        about = f"{ns}/{pod}"
        out += [
            Derived(f"culprit cpu {about}", _cpu(selector), "cores", 0, about),
            Derived(f"culprit memory {about}", _memory(selector), "bytes", 1, about),
            Derived(f"culprit restarts {about}", _restarts(selector), "restarts", 1, about),
        ]
    return out
