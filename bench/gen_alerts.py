"""A shift's worth of realistic Alertmanager alerts, for the batch benchmark and the tests.

An 8-hour shift on a Kubernetes cluster with a few incidents: a ``payments-api`` rollout that
crashloops and raises the error rate and p99 latency, a node whose disk fills up, a flapping
Kafka consumer lag, CPU throttling that never quite stops, failing CronJob runs, and the usual
background (``Watchdog``, ``TargetDown`` blips). Pods carry real Deployment names with
ReplicaSet hashes and pod suffixes (``payments-api-7d9f8b6c4-x2x9z``, two ReplicaSets where a
rollout happened), nodes are EC2-style host names, and alerts fire again after they resolved
(flapping), so grouping has something to do.

``generate_alerts(n)`` returns ``n`` firings in the Alertmanager API v2 shape (``GET
/api/v2/alerts``); :func:`webhook_payloads` turns them into the notifications Alertmanager would
have sent (every notification of a group repeats the group's active alerts), the way a webhook dump
looks. Deterministic for a seed.

    python bench/gen_alerts.py --n 1000 --format api --out alerts.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

SHIFT_START = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
SHIFT = timedelta(hours=8)
_SAFE = "bcdfghjklmnpqrstvwxz2456789"  # Kubernetes' alphabet for generated name suffixes


@dataclass(frozen=True)
class Source:
    """One kind of alert and where it fires."""

    alertname: str
    severity: str
    namespace: str
    target: str
    """What fires: a Deployment (``deploy:name``), a StatefulSet (``sts:name``), a node (``node``),
    a CronJob (``cron:name``) or a scrape job (``job:name``)."""
    weight: float
    window: tuple[float, float]
    """Part of the shift (0-1) in which it fires."""
    summary: str
    minutes: tuple[int, int]
    """How long one firing lasts before it resolves."""
    extra: tuple[tuple[str, str], ...] = ()


SOURCES: tuple[Source, ...] = (
    Source(
        "KubePodCrashLooping",
        "warning",
        "payments",
        "deploy:payments-api",
        9,
        (0.32, 0.55),
        'Pod {namespace}/{pod} ({container}) is in waiting state (reason: "CrashLoopBackOff").',
        (3, 15),
        (("container", "api"),),
    ),
    Source(
        "HighErrorRate",
        "critical",
        "payments",
        "deploy:payments-api",
        6,
        (0.33, 0.52),
        "{service} 5xx ratio is {value}% over the last 5 minutes (threshold 5%).",
        (5, 25),
        (("route", "/v1/charges"),),
    ),
    Source(
        "HighLatencyP99",
        "warning",
        "checkout",
        "deploy:checkout-api",
        6,
        (0.34, 0.56),
        "{service} p99 latency is {value} ms (SLO 300 ms).",
        (5, 20),
        (("route", "/cart/checkout"),),
    ),
    Source(
        "KubeDeploymentReplicasMismatch",
        "warning",
        "payments",
        "deploy:payments-api",
        2,
        (0.32, 0.5),
        "Deployment {namespace}/{service} has not matched the expected number of replicas for 15 minutes.",
        (15, 45),
    ),
    Source(
        "CPUThrottlingHigh",
        "info",
        "search",
        "deploy:search-api",
        10,
        (0.0, 1.0),
        "{value}% throttling of CPU in namespace {namespace} for container {container} in pod {pod}.",
        (10, 40),
        (("container", "search"),),
    ),
    Source(
        "KubePodNotReady",
        "warning",
        "checkout",
        "deploy:cart-service",
        4,
        (0.1, 0.3),
        "Pod {namespace}/{pod} has been in a non-ready state for longer than 15 minutes.",
        (15, 30),
    ),
    Source(
        "NodeFilesystemSpaceFillingUp",
        "warning",
        "monitoring",
        "node",
        5,
        (0.6, 0.9),
        "Filesystem on /dev/nvme0n1p1 at {instance} has only {value}% available space left.",
        (10, 60),
        (("device", "/dev/nvme0n1p1"), ("mountpoint", "/var/lib/containerd"), ("job", "node-exporter")),
    ),
    Source(
        "KubeNodeNotReady",
        "critical",
        "monitoring",
        "node",
        1,
        (0.82, 0.9),
        "{node} has been unready for more than 15 minutes.",
        (15, 40),
        (("job", "kube-state-metrics"),),
    ),
    Source(
        "KafkaConsumerGroupLag",
        "warning",
        "data",
        "sts:orders-consumer",
        7,
        (0.0, 1.0),
        "Consumer group orders-processor lags {value} messages behind on topic orders.",
        (3, 12),
        (("consumergroup", "orders-processor"), ("topic", "orders")),
    ),
    Source(
        "PostgresReplicationLag",
        "critical",
        "data",
        "sts:ledger-db",
        2,
        (0.45, 0.6),
        "Replica {pod} is {value} s behind the primary.",
        (5, 20),
        (("cluster", "ledger"),),
    ),
    Source(
        "KubeJobFailed",
        "warning",
        "platform",
        "cron:report-export",
        2,
        (0.0, 1.0),
        "Job {namespace}/{job_name} failed to complete.",
        (30, 60),
    ),
    Source(
        "TargetDown",
        "warning",
        "ingress-nginx",
        "job:ingress-nginx-controller-metrics",
        3,
        (0.0, 1.0),
        "{value}% of the ingress-nginx-controller-metrics/ingress-nginx targets in ingress-nginx are down.",
        (2, 8),
    ),
    Source(
        "KubeHpaMaxedOut",
        "warning",
        "checkout",
        "hpa:checkout-api",
        2,
        (0.35, 0.6),
        "HPA {namespace}/{service} has been running at max replicas for longer than 15 minutes.",
        (15, 45),
    ),
    Source(
        "KubeContainerOOMKilled",
        "warning",
        "data",
        "deploy:orders-worker",
        4,
        (0.5, 0.95),
        "Container worker in pod {namespace}/{pod} has been OOMKilled {value} times in the last 10 minutes.",
        (5, 15),
        (("container", "worker"),),
    ),
    Source(
        "ProbeFailed",
        "critical",
        "monitoring",
        "probe:blackbox",
        3,
        (0.34, 0.5),
        "Probe of {instance} failed: HTTP {value}.",
        (2, 10),
    ),
    Source(
        "SLOErrorBudgetBurn",
        "critical",
        "payments",
        "slo:payments-api",
        3,
        (0.35, 0.6),
        "payments-api is burning its 30-day error budget {value}x too fast ({window} window).",
        (10, 40),
    ),
    Source(
        "Watchdog",
        "none",
        "monitoring",
        "job:prometheus",
        1,
        (0.0, 1.0),
        "This is an alert meant to ensure that the entire alerting pipeline is functional.",
        (60, 120),
    ),
)


def _suffix(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(_SAFE) for _ in range(n))


class Cluster:
    """Names that stay stable within one shift: ReplicaSet hashes, pods, nodes, pod IPs."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.nodes = [
            f"ip-10-0-{rng.randrange(1, 64)}-{rng.randrange(2, 250)}.eu-west-1.compute.internal"
            for _ in range(12)
        ]
        self._pods: dict[tuple[str, float], list[str]] = {}
        self._ips: dict[str, str] = {}
        self._hashes: dict[str, list[str]] = {}

    def replicasets(self, deployment: str) -> list[str]:
        """Two ReplicaSet hashes: before and after the mid-shift rollout."""
        if deployment not in self._hashes:
            self._hashes[deployment] = [_suffix(self.rng, 10), _suffix(self.rng, 9)]
        return self._hashes[deployment]

    def pod(self, target: str, when: float) -> str:
        kind, _, name = target.partition(":")
        if kind == "sts":
            return f"{name}-{self.rng.randrange(0, 3)}"
        if kind == "cron":
            return name
        if kind == "job":
            return name
        rs = self.replicasets(name)[0 if when < 0.35 else 1]
        pool = self._pods.setdefault((name, rs == self.replicasets(name)[1]), [])
        if len(pool) < 4 or self.rng.random() < 0.1:
            pool.append(f"{name}-{rs}-{_suffix(self.rng, 5)}")
        return self.rng.choice(pool)

    def ip(self, pod: str) -> str:
        if pod not in self._ips:
            self._ips[pod] = f"10.42.{self.rng.randrange(0, 32)}.{self.rng.randrange(2, 250)}"
        return self._ips[pod]


def _labels(source: Source, cluster: Cluster, when: float, rng: random.Random) -> dict[str, str]:
    labels = {"alertname": source.alertname, "severity": source.severity, "namespace": source.namespace}
    labels.update(dict(source.extra))
    kind, _, name = source.target.partition(":")
    if kind == "probe":
        target = rng.choice(("https://pay.example.com/healthz", "https://api.example.com/v1/status"))
        labels.update({"instance": target, "job": name})
    elif kind == "slo":
        labels.update({"service": name, "slo": "availability", "long_window": rng.choice(("1h", "6h"))})
    elif kind == "hpa":
        labels.update({"horizontalpodautoscaler": name, "service": name, "job": "kube-state-metrics"})
    elif kind == "node":
        node = rng.choice(cluster.nodes[:3] if source.alertname != "KubeNodeNotReady" else cluster.nodes[:1])
        labels.update({"node": node, "instance": f"{node}:9100"})
        labels.setdefault("job", "node-exporter")
    elif kind == "job":
        labels.update({"job": name, "service": name})
        if source.alertname == "TargetDown":
            labels["instance"] = f"{cluster.ip(name + str(rng.randrange(3)))}:10254"
    elif kind == "cron":
        run = int((SHIFT_START + SHIFT * when).timestamp() // 60)
        labels.update({"job_name": f"{name}-{run}", "job": "kube-state-metrics", "cronjob": name})
    else:
        pod = cluster.pod(source.target, when)
        labels.update(
            {
                "pod": pod,
                "service": name,
                "instance": f"{cluster.ip(pod)}:8080",
                "node": rng.choice(cluster.nodes),
            }
        )
        labels.setdefault("job", "kube-state-metrics" if source.alertname.startswith("Kube") else name)
    return labels


def _fingerprint(labels: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]


def _iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def generate_alerts(n: int = 1000, seed: int = 0, start: datetime = SHIFT_START) -> list[dict[str, Any]]:
    """``n`` alert firings over one 8-hour shift from ``start``, in the API v2 shape, oldest first.

    About a third of them are repeated firings: an alert that resolved fires again for the same pod
    or node (the same labels and fingerprint, a later ``startsAt``)."""
    rng = random.Random(seed)
    cluster = Cluster(rng)
    weights = [s.weight for s in SOURCES]
    alerts: list[dict[str, Any]] = []
    busy_until: dict[str, datetime] = {}
    previous: list[tuple[Source, dict[str, str]]] = []
    while len(alerts) < n:
        if previous and rng.random() < 0.35:  # flapping: the same alert fires again later
            source, labels = rng.choice(previous)
        else:
            source = rng.choices(SOURCES, weights)[0]
            when = rng.uniform(*source.window)
            labels = _labels(source, cluster, when, rng)
        fp = _fingerprint(labels)
        low, high = source.window
        begin = start + SHIFT * rng.uniform(low, high)
        if fp in busy_until and begin < busy_until[fp]:
            begin = busy_until[fp] + timedelta(minutes=rng.randrange(2, 20))
        if begin >= start + SHIFT:
            continue
        duration = timedelta(minutes=rng.randrange(*source.minutes), seconds=rng.randrange(60))
        end = begin + duration
        busy_until[fp] = end
        previous.append((source, labels))
        value = {
            "HighErrorRate": f"{rng.uniform(6, 38):.1f}",
            "HighLatencyP99": str(rng.randrange(320, 2400)),
            "CPUThrottlingHigh": str(rng.randrange(26, 91)),
            "NodeFilesystemSpaceFillingUp": f"{rng.uniform(1.5, 9.5):.2f}",
            "KafkaConsumerGroupLag": str(rng.randrange(12_000, 480_000)),
            "PostgresReplicationLag": str(rng.randrange(31, 420)),
            "TargetDown": str(rng.choice((33, 50, 66))),
            "KubeContainerOOMKilled": str(rng.randrange(1, 6)),
            "ProbeFailed": str(rng.choice((502, 503, 504))),
            "SLOErrorBudgetBurn": f"{rng.uniform(2, 15):.1f}",
        }.get(source.alertname, "")
        fields = {"service": "", "window": labels.get("long_window", "")} | labels
        summary = source.summary.format(value=value, **fields)
        resolved = end <= start + SHIFT
        alerts.append(
            {
                "labels": labels,
                "annotations": {
                    "summary": summary,
                    "runbook_url": f"https://runbooks.example.com/{source.alertname.lower()}",
                },
                "startsAt": _iso(begin),
                "endsAt": _iso(end if resolved else begin + timedelta(minutes=5)),
                "updatedAt": _iso(min(end, start + SHIFT)),
                "fingerprint": fp,
                "generatorURL": f"http://prometheus.monitoring:9090/graph?g0.expr={source.alertname}",
                "receivers": [{"name": "opsbot"}],
                "status": {"state": "active", "silencedBy": [], "inhibitedBy": [], "mutedBy": []},
                "resolved": resolved,
            }
        )
    alerts.sort(key=lambda a: a["startsAt"])
    for alert in alerts:
        alert.pop("resolved")
    return alerts


def webhook_payloads(alerts: Sequence[dict[str, Any]], receiver: str = "opsbot") -> list[dict[str, Any]]:
    """The webhook notifications Alertmanager would have sent for ``alerts`` (grouped by alertname and
    namespace, each notification repeating the group's alerts still active), version 4."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for alert in alerts:
        key = (alert["labels"]["alertname"], alert["labels"].get("namespace", ""))
        groups.setdefault(key, []).append(alert)
    payloads: list[dict[str, Any]] = []
    for (name, namespace), members in groups.items():
        members.sort(key=lambda a: a["startsAt"])
        for index, alert in enumerate(members):
            active = [
                a
                for a in members[: index + 1]
                if a["endsAt"] > alert["startsAt"] or a is alert  # still firing when this one starts
            ]
            payloads.append(
                {
                    "version": "4",
                    "groupKey": f'{{}}:{{alertname="{name}", namespace="{namespace}"}}',
                    "truncatedAlerts": 0,
                    "status": "firing",
                    "receiver": receiver,
                    "groupLabels": {"alertname": name, "namespace": namespace},
                    "commonLabels": {"alertname": name, "namespace": namespace},
                    "commonAnnotations": {},
                    "externalURL": "http://alertmanager.monitoring:9093",
                    "alerts": [_webhook_alert(a) for a in active[-20:]],
                }
            )
    payloads.sort(key=lambda p: max(a["startsAt"] for a in p["alerts"]))
    return payloads


def _webhook_alert(alert: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": alert["labels"],
        "annotations": alert["annotations"],
        "startsAt": alert["startsAt"],
        "endsAt": "0001-01-01T00:00:00Z",
        "generatorURL": alert.get("generatorURL", ""),
        "fingerprint": alert["fingerprint"],
    }


def write(alerts: list[dict[str, Any]], fmt: str, out: Path) -> None:
    """Write ``alerts`` as an API export (``api``), a webhook dump (``webhook``) or JSON lines."""
    if fmt == "api":
        out.write_text(json.dumps(alerts, indent=1) + "\n")
    elif fmt == "webhook":
        out.write_text(json.dumps(webhook_payloads(alerts), indent=1) + "\n")
    else:
        out.write_text("".join(json.dumps(a) + "\n" for a in alerts))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="alert firings (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--format", choices=("api", "webhook", "jsonl"), default="api")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    alerts = generate_alerts(args.n, args.seed)
    write(alerts, args.format, args.out)
    print(f"{len(alerts)} alerts ({args.format}) written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
