"""A small cluster for the actions tests: the fake Kubernetes API with a write ServiceAccount, a
Deployment with two revisions, a StatefulSet, pods and a node; and the ``[actions]`` settings of
an opsbot pointed at it through its own kubeconfig."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.actions.service import ActionService, CardPoster
from bot.config import ActionsSettings
from bot.eval.kube_api import KubernetesSnapshotServer, deployment, node, pod, replicaset, statefulset
from bot.store import Store

ACTIONS_SECRET = "actions-hmac-secret"
WRITE_TOKEN = "actions-write-token"
NS = "shop"


def cluster() -> KubernetesSnapshotServer:
    """``deployment/api`` (revision 2 running ``app:2.0``, revision 1 ``app:1.0``), its pods,
    ``statefulset/db``, ``node/worker-1``."""
    api = deployment("api", NS, replicas=3, revision=2, image="registry.example.com/app:2.0")
    rs_old = replicaset("api", "aaa111", 1, namespace=NS, image="registry.example.com/app:1.0")
    rs_new = replicaset(
        "api", "bbb222", 2, namespace=NS, image="registry.example.com/app:2.0", replicas=3, ready=3
    )
    pods = [
        pod(
            f"api-bbb222-{i}",
            NS,
            owner=("ReplicaSet", "api-bbb222"),
            labels={"app": "api", "pod-template-hash": "bbb222"},
        )
        for i in range(3)
    ]
    server = KubernetesSnapshotServer(
        write_token=WRITE_TOKEN,
        pods=pods,
        deployments=[api],
        replicasets=[rs_old, rs_new],
        statefulsets=[statefulset("db", NS, replicas=2, ready=2)],
        nodes=[node("worker-1")],
        namespaces=[NS],
    )
    return server


def actions_settings(server: KubernetesSnapshotServer, tmp: Path, **overrides: Any) -> ActionsSettings:
    """``[actions]`` with its own kubeconfig (the write token), a secret, and ``overrides``."""
    kubeconfig = server.write_kubeconfig(tmp / "actions-kubeconfig.json", token=WRITE_TOKEN)
    values: dict[str, Any] = {
        "enabled": True,
        "kubeconfig": kubeconfig,
        "secret": ACTIONS_SECRET,
        "verify_s": 5.0,
        "verify_poll_s": 0.05,
        "timeout_s": 5.0,
    }
    values.update(overrides)
    return ActionsSettings(**values)


def service(settings: ActionsSettings, store: Store, adapters: dict[str, CardPoster]) -> ActionService:
    """An :class:`ActionService` attached to ``adapters``."""
    svc = ActionService(settings, store)
    svc.attach(adapters)
    return svc


def applied(server: KubernetesSnapshotServer) -> list[str]:
    """The real (not dry-run) writes the server took, as ``METHOD path``."""
    return [f"{w.method} {w.path}" for w in server.writes if not w.dry_run and w.status == 200]
