"""Context gathering benchmark: one question's whole gathering (Kubernetes, then Prometheus following
what Kubernetes found) against a fake cluster of 2,000 pods in 50 namespaces, with an API latency.

The fake Kubernetes API and Prometheus (``bot.eval.kube_api``, ``bot.eval.prom_api``) run in a child
process, so their JSON work is not charged to the gathering; every answer waits a uniformly drawn
``--latency-ms`` first (a real API server's round trip). The gathering is opsbot's own
``ContextGatherer`` with the default settings (the cache off, so every question asks the API), the
same as in the bot. Per question: wall time of ``gather()`` and the number of API calls (Kubernetes
and Prometheus, counted by the servers).

The cluster: ``--namespaces`` namespaces, each with Deployments (two revisions each, a Service, env
naming a database in another namespace), a StatefulSet database, a CronJob's pods; a few crash-loop
(long Java logs), are OOMKilled, Pending or not Ready; Warning events; nodes, one under pressure;
Prometheus series for the pods of a few namespaces. Questions: an exact pod, a one-word name shared
by every namespace, a namespace alone, "what is broken?", a typo, a node, a StatefulSet ordinal, a
dependency one hop away, an alert, a vague job question.

Usage (about 2 minutes on 2 cores)::

    python bench/context_bench.py --out bench/results/context_bench-$(date +%F)

Results: JSON (every sample, the command, versions, hardware, commit) and Markdown next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run_meta import package_versions, run_meta  # noqa: E402

from bot.eval import kube_api  # noqa: E402
from bot.eval.prom_api import Alert, PrometheusSnapshotServer, Series  # noqa: E402
from bot.eval.report import hardware  # noqa: E402

APPS = ("checkout", "payments", "orders", "search", "catalog", "cart", "notifier")
JAVA_STACK = [
    "org.springframework.beans.factory.BeanCreationException: Error creating bean with name 'dataSource'",
    *(f"\tat org.springframework.beans.factory.support.Bean{i}.invoke(Unknown Source)" for i in range(60)),
    'Caused by: org.postgresql.util.PSQLException: FATAL: database "orders_v2" does not exist',
    *(f"\tat org.postgresql.core.v3.Conn{i}.open(Unknown Source)" for i in range(80)),
    "\t... 55 common frames omitted",
]


def _ns(i: int) -> str:
    return f"ns-{i:02d}"


def build_cluster(
    pods: int, namespaces: int, seed: int
) -> tuple[kube_api.KubernetesSnapshotServer, PrometheusSnapshotServer]:
    """The fake cluster and Prometheus (see the module doc)."""
    rng = random.Random(seed)
    kube = kube_api.KubernetesSnapshotServer(namespaces=[_ns(i) for i in range(namespaces)] + ["kube-system"])
    prom = PrometheusSnapshotServer()
    per_ns = max(10, pods // namespaces)
    replicas = max(1, (per_ns - 5) // len(APPS))
    nodes = [f"worker-{i}" for i in range(max(3, pods // 50))]
    kube.nodes = [kube_api.node(n, pressure=("MemoryPressure",) if n == "worker-17" else ()) for n in nodes]
    for i in range(namespaces):
        ns = _ns(i)
        for a, app in enumerate(APPS):
            pod_hash = f"{zlib_hash(ns + app):08x}"[:9]
            old_hash = f"{zlib_hash(app + ns):08x}"[:9]
            kube.deployments.append(kube_api.deployment(app, ns, replicas=replicas, revision=4))
            for rev, h, cause in (
                (4, pod_hash, f"deploy {app} 2.{i}.1"),
                (3, old_hash, f"deploy {app} 2.{i}.0"),
            ):
                kube.replicasets.append(
                    kube_api.replicaset(
                        app, h, rev, namespace=ns, replicas=replicas if rev == 4 else 0, change_cause=cause
                    )
                )
            kube.services.append(kube_api.service(app, ns, ports=[8080]))
            env = [
                {"name": "DB_HOST", "value": f"db.{_ns((i + 1) % namespaces)}.svc.cluster.local"},
                {"name": "CACHE_URL", "value": f"redis://cache.{ns}.svc:6379"},
            ]
            for r in range(replicas):
                name = f"{app}-{pod_hash}-{r:02d}x{a}q"
                broken = (i % 5 == 2 and a == 1) or (i % 7 == 3 and a == 2 and r == 0)
                statuses = None
                if broken:
                    statuses = [
                        kube_api.container_status(
                            ready=False,
                            restart_count=rng.randint(3, 30),
                            state={"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s"}},
                            last_state=kube_api.terminated("Error", 1, 2),
                        )
                    ]
                    kube.logs[(ns, name, "app", True)] = "\n".join(
                        [
                            *(f"2026-11-29T19:5{k % 10}:00Z INFO starting worker {k}" for k in range(300)),
                            *JAVA_STACK,
                        ]
                    )
                    kube.events.append(
                        kube_api.event(
                            ns,
                            "Pod",
                            name,
                            "BackOff",
                            f"Back-off restarting failed container app in pod {name}",
                            count=12,
                        )
                    )
                elif i % 9 == 4 and a == 3 and r == 0:
                    statuses = [
                        kube_api.container_status(
                            restart_count=4, last_state=kube_api.terminated("OOMKilled", 137, 3)
                        )
                    ]
                kube.pods.append(
                    kube_api.pod(
                        name,
                        ns,
                        statuses=statuses,
                        node=nodes[(i * len(APPS) + a * replicas + r) % len(nodes)],
                        labels={"app": app, "pod-template-hash": pod_hash},
                        owner=("ReplicaSet", f"{app}-{pod_hash}"),
                        env=env,
                    )
                )
                if not broken:
                    kube.logs[(ns, name, "app", False)] = "\n".join(
                        f"2026-11-29T19:{40 + k % 20}:00Z INFO GET /{app}/{k} 200" for k in range(200)
                    )
        kube.statefulsets.append(kube_api.statefulset("db", ns, replicas=3, ready=2 if i % 6 == 1 else 3))
        kube.services.append(kube_api.service("db", ns, ports=[5432]))
        for o in range(3):
            pending = i % 6 == 1 and o == 2
            kube.pods.append(
                kube_api.pod(
                    f"db-{o}",
                    ns,
                    phase="Pending" if pending else "Running",
                    statuses=[] if pending else None,
                    node=None if pending else nodes[(i + o) % len(nodes)],
                    labels={"app": "db"},
                    owner=("StatefulSet", "db"),
                    conditions=[
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "0/40 nodes are available: 40 Insufficient memory.",
                        }
                    ]
                    if pending
                    else None,
                )
            )
        kube.cronjobs.append(kube_api.cronjob("report", ns, schedule="0 2 * * *"))
        for j in range(2):
            job = f"report-2940{i:02d}{j}0"
            kube.jobs.append(
                kube_api.job(job, ns, cronjob_name="report", succeeded=1 if j else 0, failed=0 if j else 4)
            )
            kube.pods.append(
                kube_api.pod(
                    f"{job}-x{j}z{i:02d}",
                    ns,
                    phase="Succeeded" if j else "Failed",
                    statuses=[
                        kube_api.container_status(
                            "job",
                            ready=False,
                            state=kube_api.terminated("Completed" if j else "Error", 0 if j else 1, 30),
                        )
                    ],
                    owner=("Job", job),
                    labels={"job-name": job},
                )
            )
        for e in range(10):
            target = rng.choice([p for p in kube.pods if p["metadata"]["namespace"] == ns])
            kube.events.append(
                kube_api.event(
                    ns, "Pod", target["metadata"]["name"], "Unhealthy", "Readiness probe failed: 503", index=e
                )
            )
        if i < 8:  # metrics for a few namespaces: the derived queries find series there
            for pod in [p for p in kube.pods if p["metadata"]["namespace"] == ns]:
                labels = {"namespace": ns, "pod": pod["metadata"]["name"]}
                prom.series.append(
                    Series("container_cpu_usage_seconds_total", labels, [0.1, 0.2, rng.random()])
                )
                prom.series.append(Series("container_memory_working_set_bytes", labels, [2e8, 3e8, 4e8]))
            for app in APPS:
                prom.series.append(
                    Series("http_requests_total", {"namespace": ns, "service": app}, [0.01, 0.02, 0.3])
                )
    kube.pods += [
        kube_api.pod(
            f"coredns-5d78c9869d-{s}",
            "kube-system",
            labels={"k8s-app": "kube-dns"},
            owner=("ReplicaSet", "coredns-5d78c9869d"),
        )
        for s in ("a1b2c", "d3e4f")
    ]
    prom.alerts.append(
        Alert(labels={"alertname": "KubePodCrashLooping", "namespace": _ns(2), "severity": "warning"})
    )
    return kube, prom


def zlib_hash(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())


def questions(kube: kube_api.KubernetesSnapshotServer) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(label, question, alert payload) of each question kind."""
    crash = next(
        p
        for p in kube.pods
        if p["metadata"]["namespace"] == _ns(7)
        and p["status"].get("containerStatuses", [{}])[0].get("restartCount", 0) >= 3
    )
    alert = {
        "status": "firing",
        "commonLabels": {
            "alertname": "KubePodCrashLooping",
            "namespace": _ns(12),
            "deployment": "payments",
            "container": "app",
        },
        "alerts": [
            {
                "status": "firing",
                "labels": {
                    "alertname": "KubePodCrashLooping",
                    "namespace": _ns(12),
                    "deployment": "payments",
                },
            }
        ],
    }
    return [
        ("exact pod", f"why is {crash['metadata']['name']} in {_ns(7)} crashing?", None),
        ("one word, 50 namespaces", "checkout is slow", None),
        ("namespace only", f"anything wrong in {_ns(23)}?", None),
        ("overview", "what is broken?", None),
        ("typo", "paymnets keeps restarting", None),
        ("node", "node worker-17 looks unhappy", None),
        ("ordinal", f"db-2 in {_ns(31)} is pending", None),
        ("dependency hop", f"orders in {_ns(12)} returns 503s", None),
        ("alert", "KubePodCrashLooping fired", alert),
        ("vague job", "did the nightly report run?", None),
    ]


async def serve(args: argparse.Namespace) -> None:
    """Child mode: build and serve the cluster; answer ``count`` lines with the request counts."""
    kube, prom = build_cluster(args.pods, args.namespaces, args.seed)
    kube.latency_s = prom.latency_s = (args.latency_ms[0] / 1000, args.latency_ms[1] / 1000)
    await kube.start()
    await prom.start()
    print(
        json.dumps({"kube": kube.url, "prom": prom.url, "token": kube.token, "pods": len(kube.pods)}),
        flush=True,
    )
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        print(json.dumps({"kube": len(kube.requests), "prom": len(prom.queries)}), flush=True)
    await kube.stop()
    await prom.stop()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Start the servers in a child process, then ask every question ``--rounds`` times."""
    from bot.config import Settings
    from bot.context.gatherer import ContextGatherer

    child = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--serve",
            "--pods",
            str(args.pods),
            "--namespaces",
            str(args.namespaces),
            "--seed",
            str(args.seed),
            "--latency-ms",
            *map(str, args.latency_ms),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    info = json.loads(child.stdout.readline())

    def counts() -> dict[str, int]:
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("count\n")
        child.stdin.flush()
        return dict(json.loads(child.stdout.readline()))

    kube, _ = build_cluster(args.pods, args.namespaces, args.seed)  # the same cluster: for the questions
    with tempfile.TemporaryDirectory() as tmp:
        server = kube_api.KubernetesSnapshotServer(url=info["kube"], token=info["token"])
        config = server.write_kubeconfig(Path(tmp) / "kubeconfig")
        settings = Settings(
            kubernetes={"enabled": True, "kubeconfig": config, "context": "fake-cluster"},
            prometheus={"enabled": True, "url": info["prom"]},
            context={"cache_ttl_s": 0},
        )
        gatherer = ContextGatherer.from_settings(settings)
        samples: list[dict[str, Any]] = []
        try:
            asked = questions(kube)
            await gatherer.gather(asked[3][1], scenario="root_cause")  # connect once, as a running bot has
            for round_ in range(args.rounds):
                for label, question, alert in asked:
                    before = counts()
                    started = time.perf_counter()
                    bundle = await gatherer.gather(question, scenario="root_cause", alert=alert)
                    wall_ms = (time.perf_counter() - started) * 1000
                    after = counts()
                    samples.append(
                        {
                            "round": round_,
                            "question": label,
                            "wall_ms": round(wall_ms, 1),
                            "kube_calls": after["kube"] - before["kube"],
                            "prom_calls": after["prom"] - before["prom"],
                            "sections": len(bundle.sections),
                            "chars": sum(len(s.body) for s in bundle.sections),
                            "notes": [f"{n.name} {n.status}" for n in bundle.notes],
                        }
                    )
        finally:
            await gatherer.close()
            child.stdin.close()
            child.wait(timeout=30)
    return {"pods": info["pods"], "samples": samples}


def summarise(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """P50 / P90 / P99 / max wall time and API calls, overall and per question kind."""

    def stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
        walls = [r["wall_ms"] for r in rows]
        kube = [r["kube_calls"] for r in rows]
        prom = [r["prom_calls"] for r in rows]
        return {
            "n": len(rows),
            "wall_ms": {q: _percentile(walls, p) for q, p in (("p50", 50), ("p90", 90), ("p99", 99))}
            | {"max": max(walls)},
            "kube_calls": {"mean": round(statistics.mean(kube), 1), "max": max(kube)},
            "prom_calls": {"mean": round(statistics.mean(prom), 1), "max": max(prom)},
            "not_ok": sorted({n for r in rows for n in r["notes"] if not n.endswith(" ok")}),
        }

    kinds = list(dict.fromkeys(r["question"] for r in samples))
    return {
        "all": stats(samples),
        "by_question": {k: stats([r for r in samples if r["question"] == k]) for k in kinds},
    }


def render(report: dict[str, Any]) -> str:
    """The Markdown report."""
    s, meta = report["summary"], report["meta"]
    lines = [
        f"# Context gathering: {report['pods']} pods in {report['args']['namespaces']} namespaces, "
        f"{report['args']['latency_ms'][0]}-{report['args']['latency_ms'][1]} ms API latency",
        "",
        f"- date: {meta['date']}; commit {report['commit']}",
        f"- command: `{meta['command']}`",
        f"- hardware: {report['hardware']}; load average (1 / 5 / 15 min) before "
        f"{report['load_1_5_15_min']['before']}, after {report['load_1_5_15_min']['after']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        f"- {s['all']['n']} gatherings ({report['args']['rounds']} rounds of {len(s['by_question'])} "
        "questions), cache off, Kubernetes then Prometheus following it",
        "",
        "| question | P50 ms | P90 ms | P99 ms | max ms | Kubernetes calls (mean / max) "
        "| Prometheus queries (mean / max) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, st in [("**all**", s["all"]), *s["by_question"].items()]:
        w = st["wall_ms"]
        kube, prom = st["kube_calls"], st["prom_calls"]
        lines.append(
            f"| {label} | {w['p50']:.0f} | {w['p90']:.0f} | {w['p99']:.0f} | {w['max']:.0f} | "
            f"{kube['mean']} / {kube['max']} | {prom['mean']} / {prom['max']} |"
        )
    if s["all"]["not_ok"]:
        lines += ["", "Sources not ok in some gathering: " + ", ".join(s["all"]["not_ok"])]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--namespaces", type=int, default=50)
    parser.add_argument("--latency-ms", type=float, nargs=2, default=[20.0, 50.0], metavar=("LOW", "HIGH"))
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="output path without extension (.json and .md are written)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args))
        return 0
    load_before = os.getloadavg()
    result = asyncio.run(measure(args))
    load_after = os.getloadavg()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    report = {
        "meta": run_meta(["bench/context_bench.py", *argv]),
        "commit": commit,
        "hardware": ", ".join(f"{k} {v}" for k, v in hardware().items() if v),
        "versions": package_versions("bot", "kubernetes_asyncio", "aiohttp"),
        # The machine may be shared: its load says how much of it the run had.
        "load_1_5_15_min": {
            "before": [round(x, 2) for x in load_before],
            "after": [round(x, 2) for x in load_after],
        },
        "args": {
            "pods": args.pods,
            "namespaces": args.namespaces,
            "latency_ms": args.latency_ms,
            "rounds": args.rounds,
        },
        "pods": result["pods"],
        "summary": summarise(result["samples"]),
        "samples": result["samples"],
    }
    markdown = render(report)
    print(markdown)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
