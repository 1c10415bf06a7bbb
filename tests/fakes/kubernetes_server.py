"""The tests' fake Kubernetes API: :class:`bot.eval.kube_api.KubernetesSnapshotServer` (the server
``opsbot eval`` serves its incident cases from) with the sample cluster the context tests read.

Routes, selectors, faults and the object builders are documented in :mod:`bot.eval.kube_api`.
"""

from __future__ import annotations

from bot.eval.kube_api import (
    NOW,
    Fault,
    KubernetesSnapshotServer,
    config_map,
    container_status,
    cronjob,
    daemonset,
    deployment,
    event,
    horizontal_pod_autoscaler,
    job,
    match_fields,
    match_labels,
    node,
    persistent_volume,
    persistent_volume_claim,
    pod,
    replicaset,
    secret,
    service,
    statefulset,
    status_object,
    storage_class,
    terminated,
    ts,
)

FakeKubernetes = KubernetesSnapshotServer
"""The name the tests know it by."""

__all__ = [
    "CRASH_LOG",
    "NOW",
    "FakeKubernetes",
    "Fault",
    "config_map",
    "container_status",
    "cronjob",
    "daemonset",
    "deployment",
    "event",
    "horizontal_pod_autoscaler",
    "job",
    "match_fields",
    "match_labels",
    "node",
    "persistent_volume",
    "persistent_volume_claim",
    "pod",
    "replicaset",
    "sample_cluster",
    "secret",
    "service",
    "statefulset",
    "status_object",
    "storage_class",
    "terminated",
    "ts",
]


CRASH_LOG = "".join(
    f"2026-11-29T19:5{i % 10}:0{i % 10}Z INFO handled request id={i} status=200\n" for i in range(200)
) + (
    "2026-11-29T19:59:58Z ERROR failed to connect to postgres at db.payments.svc:5432: connection refused\n"
    "2026-11-29T19:59:59Z FATAL cannot start without database, exiting (exit code 1)\n"
)


def sample_cluster() -> FakeKubernetes:
    """A small cluster with one pod in each failure state, events, logs, workloads and nodes."""
    fake = FakeKubernetes(namespaces=["payments", "web", "kube-system"])
    crash = "api-7f9c8d6b5-x2x9q"
    fake.pods = [
        pod(
            crash,
            labels={"app": "api", "pod-template-hash": "7f9c8d6b5"},
            owner=("ReplicaSet", "api-7f9c8d6b5"),
            image="registry.example.com/api:2.4.1",
            statuses=[
                container_status(
                    image="registry.example.com/api:2.4.1",
                    ready=False,
                    restart_count=7,
                    state={
                        "waiting": {
                            "reason": "CrashLoopBackOff",
                            "message": f"back-off 5m0s restarting failed container=app pod={crash}",
                        }
                    },
                    last_state=terminated("Error", 1),
                )
            ],
            env=[
                {"name": "DB_HOST", "value": "db.payments.svc"},
                {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "api-db", "key": "password"}}},
            ],
        ),
        pod(
            "worker-6d5f7c9b8-kq2lp",
            labels={"app": "worker"},
            owner=("ReplicaSet", "worker-6d5f7c9b8"),
            statuses=[
                container_status(
                    ready=True,
                    restart_count=4,
                    state={"running": {"startedAt": ts(2)}},
                    last_state=terminated("OOMKilled", 137, 3),
                )
            ],
        ),
        pod(
            "reports-5c4b8d7f9-zz8mn",
            phase="Pending",
            node=None,
            owner=("ReplicaSet", "reports-5c4b8d7f9"),
            statuses=[],
            conditions=[
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient memory. "
                    "preemption: 0/3 nodes are available.",
                    "lastTransitionTime": ts(15),
                }
            ],
        ),
        pod(
            "frontend-84c6d9f7b-m4t8r",
            "web",
            phase="Pending",
            owner=("ReplicaSet", "frontend-84c6d9f7b"),
            statuses=[
                container_status(
                    image="registry.example.com/frontend:9.9.9-typo",
                    ready=False,
                    state={
                        "waiting": {
                            "reason": "ImagePullBackOff",
                            "message": 'Back-off pulling image "registry.example.com/frontend:9.9.9-typo"',
                        }
                    },
                )
            ],
        ),
        pod(
            "cache-0",
            "web",
            owner=("StatefulSet", "cache"),
            statuses=[container_status("redis", ready=False, restart_count=0)],
        ),
        pod("web-5b7d8c9f6-abcde", "web", owner=("ReplicaSet", "web-5b7d8c9f6")),
        pod("coredns-5d78c9869d-7xk2p", "kube-system", owner=("ReplicaSet", "coredns-5d78c9869d")),
    ]
    fake.logs = {
        ("payments", crash, "app", True): CRASH_LOG,
        ("payments", crash, "app", False): "2026-11-29T20:00:01Z INFO starting api 2.4.1\n"
        + CRASH_LOG.splitlines(True)[-1],
        ("payments", "worker-6d5f7c9b8-kq2lp", "app", True): "processing batch 4411\nallocating 2Gi buffer\n",
        ("payments", "worker-6d5f7c9b8-kq2lp", "app", False): "processing batch 4412\n",
    }
    fake.events = [
        event(
            "payments",
            "Pod",
            crash,
            "BackOff",
            "Back-off restarting failed container app in pod " + crash,
            count=31,
        ),
        event(
            "payments",
            "Pod",
            "worker-6d5f7c9b8-kq2lp",
            "OOMKilling",
            "Memory cgroup out of memory: Killed process 4242",
        ),
        event(
            "payments",
            "Pod",
            "reports-5c4b8d7f9-zz8mn",
            "FailedScheduling",
            "0/3 nodes are available: 3 Insufficient memory.",
            minutes_ago=2,
        ),
        event(
            "web",
            "Pod",
            "frontend-84c6d9f7b-m4t8r",
            "Failed",
            'Failed to pull image "registry.example.com/frontend:9.9.9-typo": not found',
        ),
        event(
            "web",
            "Pod",
            "cache-0",
            "Unhealthy",
            "Readiness probe failed: dial tcp 10.244.1.7:6379: connect: connection refused",
        ),
        event("payments", "Pod", "api-7f9c8d6b5-x2x9q", "Scheduled", "Successfully assigned", type_="Normal"),
    ]
    fake.deployments = [
        deployment(
            "api",
            replicas=3,
            ready=1,
            updated=1,
            available=1,
            revision=7,
            image="registry.example.com/api:2.4.1",
            progressing=(
                "False",
                "ProgressDeadlineExceeded",
                'ReplicaSet "api-7f9c8d6b5" has timed out progressing.',
            ),
        ),
        deployment("worker", replicas=2, ready=2, updated=2, available=2, revision=3),
        deployment("web", "web", revision=12),
    ]
    fake.replicasets = [
        replicaset(
            "api",
            "7f9c8d6b5",
            7,
            image="registry.example.com/api:2.4.1",
            replicas=1,
            minutes_ago=20,
            change_cause="deploy api 2.4.1: switch to pgbouncer",
        ),
        replicaset(
            "api",
            "6b8d9c7f4",
            6,
            image="registry.example.com/api:2.4.0",
            replicas=2,
            ready=2,
            minutes_ago=60 * 24,
        ),
        replicaset("api", "5a7c8b6d3", 5, image="registry.example.com/api:2.3.9", minutes_ago=60 * 48),
    ]
    fake.statefulsets = [
        statefulset("cache", "web", replicas=1, ready=0, current_revision="5c", update_revision="6d")
    ]
    # What a real cluster also has: the Services in front of the pods (EndpointSlices follow them), a
    # Secret the api pod references (never read), a claim, an autoscaler.
    fake.services = [service("api", ports=[8080]), service("db", selector={"app": "db"}, ports=[5432])]
    fake.secrets = [secret("api-db", keys=["password"])]
    fake.persistentvolumeclaims = [
        persistent_volume_claim("reports-data", phase="Pending", storage_class="gp3")
    ]
    fake.storageclasses = [storage_class("gp3")]
    fake.horizontalpodautoscalers = [horizontal_pod_autoscaler("api", current_replicas=3, max_replicas=3)]
    fake.nodes = [
        node("worker-1"),
        node("worker-2", pressure=("MemoryPressure",)),
        node("worker-3", ready=False, unschedulable=True),
    ]
    return fake
