"""A Kubernetes API server for a recorded cluster state, speaking the real REST shapes for the read
calls opsbot makes: what ``opsbot eval`` serves each incident case from, and the tests' fake cluster.

Served by aiohttp on a free port; the real kubernetes-asyncio client reaches it through a kubeconfig
file (:meth:`KubernetesSnapshotServer.write_kubeconfig`), with a bearer token it checks. Nothing in
opsbot's own code is pointed at it except by that kubeconfig.

Routes (GET only; anything else is 405, as for a read-only service account):
``/api/v1/{pods,events,nodes,namespaces}``, ``/api/v1/namespaces/{ns}/{pods,events}``,
``/api/v1/namespaces/{ns}/pods/{name}``, ``/api/v1/namespaces/{ns}/pods/{name}/log``
(``container``, ``previous``, ``tailLines``), ``/apis/apps/v1/{deployments,statefulsets,replicasets}``
and their namespaced forms. List calls honour ``labelSelector`` (=, ==, !=, in, notin, exists, !exists)
and ``fieldSelector`` (dotted paths, = and !=). Errors are ``Status`` objects.

Faults are chosen per path: ``server.fail(r"/api/v1/nodes", 403)``, ``server.delay(r"/pods", 5.0)`` or
``server.garbage(r"/pods", "<html>bad gateway</html>", "text/html")`` (200 with a body the API never sends).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

NOW = datetime(2026, 11, 29, 20, 0, 0, tzinfo=UTC)


def ts(minutes_ago: float = 0) -> str:
    """RFC 3339 time ``minutes_ago`` before the fixture clock."""
    return (NOW - timedelta(minutes=minutes_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_object(code: int, reason: str, message: str) -> dict[str, Any]:
    """A ``metav1.Status`` failure body."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


_REASONS = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound", 500: "InternalError"}


@dataclass
class Fault:
    """What a matching request gets instead of its answer."""

    status: int | None = None
    delay_s: float = 0.0
    message: str = "injected fault"
    body: str | None = None
    """Served as is with 200 (a proxy's HTML page, a cut-off JSON document)."""
    content_type: str = "application/json"


@dataclass
class KubernetesSnapshotServer:
    """State of the cluster plus the server that serves it."""

    token: str = "snapshot-token"
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    deployments: list[dict[str, Any]] = field(default_factory=list)
    statefulsets: list[dict[str, Any]] = field(default_factory=list)
    replicasets: list[dict[str, Any]] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    logs: dict[tuple[str, str, str, bool], str] = field(default_factory=dict)
    """(namespace, pod, container, previous) -> full log text."""
    faults: list[tuple[re.Pattern[str], Fault]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    """Every request as ``METHOD path?query``, for assertions."""
    _runner: web.AppRunner | None = None
    _stopping: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""

    def state_text(self) -> str:
        """Everything this server serves, as one text (objects as JSON, then every log): what an
        eval case's decisive facts are looked up in when they did not reach the prompt."""
        objects = {
            name: value
            for name, value in vars(self).items()
            if isinstance(value, list) and value and isinstance(value[0], dict)
        }
        logs = [f"{ns}/{pod}/{container}: {text}" for (ns, pod, container, _), text in self.logs.items()]
        return "\n".join([json.dumps(objects, sort_keys=True), *self.namespaces, *logs])

    # -- faults ------------------------------------------------------------------------------

    def fail(self, path_regex: str, status: int, message: str = "injected fault") -> None:
        """Requests whose path matches get ``status`` with a Status body."""
        self.faults.append((re.compile(path_regex), Fault(status=status, message=message)))

    def garbage(self, path_regex: str, body: str, content_type: str = "application/json") -> None:
        """Requests whose path matches get ``body`` with 200: not what the API would send."""
        self.faults.append((re.compile(path_regex), Fault(body=body, content_type=content_type)))

    def delay(self, path_regex: str, seconds: float) -> None:
        """Requests whose path matches are answered after ``seconds``."""
        self.faults.append((re.compile(path_regex), Fault(delay_s=seconds)))

    # -- server ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/api/v1/pods", self._list_pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self._list_pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self._log)
        app.router.add_get("/api/v1/events", self._list_events)
        app.router.add_get("/api/v1/namespaces/{ns}/events", self._list_events)
        app.router.add_get("/api/v1/nodes", self._list_nodes)
        app.router.add_get("/api/v1/namespaces", self._list_namespaces)
        for kind in ("deployments", "statefulsets", "replicasets"):
            app.router.add_get(f"/apis/apps/v1/{kind}", self._list_apps)
            app.router.add_get(f"/apis/apps/v1/namespaces/{{ns}}/{kind}", self._list_apps)
        return app

    async def start(self) -> str:
        """Serve on a free port of 127.0.0.1; returns the base URL."""
        self._stopping = asyncio.Event()
        self._runner = web.AppRunner(self.app())
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def write_kubeconfig(self, path: Path, context: str = "fake-cluster", token: str | None = None) -> Path:
        """A kubeconfig (JSON is YAML) with one context pointing at this server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "opsbot", "user": {"token": token or self.token}}],
            "contexts": [{"name": context, "context": {"cluster": "fake", "user": "opsbot"}}],
            "current-context": context,
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path_qs}")
        if request.method != "GET":
            return web.json_response(
                status_object(405, "MethodNotAllowed", "read-only snapshot server"), status=405
            )
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response(status_object(401, "Unauthorized", "Unauthorized"), status=401)
        for pattern, fault in self.faults:
            if pattern.search(request.path):
                if fault.delay_s:
                    # Cut short by stop(), so a slow route never holds up a test's teardown.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), fault.delay_s)
                if fault.body is not None:
                    return web.Response(text=fault.body, content_type=fault.content_type)
                if fault.status:
                    reason = _REASONS.get(fault.status, "InternalError")
                    return web.json_response(
                        status_object(fault.status, reason, fault.message), status=fault.status
                    )
        result: web.StreamResponse = await handler(request)
        return result

    # -- handlers ----------------------------------------------------------------------------

    def _filtered(self, request: web.Request, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ns = request.match_info.get("ns")
        if ns is not None:
            items = [i for i in items if i["metadata"].get("namespace") == ns]
        labels = request.query.get("labelSelector")
        if labels:
            items = [i for i in items if match_labels(labels, i["metadata"].get("labels") or {})]
        fields = request.query.get("fieldSelector")
        if fields:
            items = [i for i in items if match_fields(fields, i)]
        return items

    @staticmethod
    def _list(request: web.Request, kind: str, api_version: str, items: list[dict[str, Any]]) -> web.Response:
        metadata: dict[str, Any] = {"resourceVersion": "12345"}
        limit = int(request.query.get("limit", "0") or 0)
        if limit and len(items) > limit:
            # Real servers page with an opaque continue token; one page is all opsbot reads.
            metadata["continue"] = f"page-after-{limit}"
            metadata["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return web.json_response(
            {"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": items}
        )

    async def _list_pods(self, request: web.Request) -> web.Response:
        pods = [{"kind": "Pod", "apiVersion": "v1", **p} for p in self._filtered(request, self.pods)]
        return self._list(request, "PodList", "v1", pods)

    async def _get_pod(self, request: web.Request) -> web.Response:
        for pod in self.pods:
            meta = pod["metadata"]
            if meta["namespace"] == request.match_info["ns"] and meta["name"] == request.match_info["name"]:
                return web.json_response({"kind": "Pod", "apiVersion": "v1", **pod})
        message = f'pods "{request.match_info["name"]}" not found'
        return web.json_response(status_object(404, "NotFound", message), status=404)

    async def _log(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        pod = next(
            (p for p in self.pods if p["metadata"]["namespace"] == ns and p["metadata"]["name"] == name), None
        )
        if pod is None:
            return web.json_response(status_object(404, "NotFound", f'pods "{name}" not found'), status=404)
        containers = [c["name"] for c in pod["spec"]["containers"]]
        container = request.query.get("container")
        if container is None:
            if len(containers) != 1:
                choices = " ".join(containers)
                message = f"a container name must be specified for pod {name}, choose one of: [{choices}]"
                return web.json_response(status_object(400, "BadRequest", message), status=400)
            container = containers[0]
        if container not in containers:
            message = f"container {container} is not valid for pod {name}"
            return web.json_response(status_object(400, "BadRequest", message), status=400)
        previous = request.query.get("previous", "false").lower() == "true"
        key = (ns, name, container, previous)
        if key not in self.logs:
            statuses = {s["name"]: s for s in pod.get("status", {}).get("containerStatuses", [])}
            waiting = statuses.get(container, {}).get("state", {}).get("waiting")
            if previous:
                message = f'previous terminated container "{container}" in pod "{name}" not found'
            elif waiting:
                message = (
                    f'container "{container}" in pod "{name}" is waiting to start: '
                    f"{waiting.get('reason', 'ContainerCreating')}"
                )
            else:
                return web.Response(text="", content_type="text/plain")
            return web.json_response(status_object(400, "BadRequest", message), status=400)
        lines = self.logs[key].splitlines(keepends=True)
        tail = request.query.get("tailLines")
        if tail is not None:
            lines = lines[-int(tail) :] if int(tail) > 0 else []
        return web.Response(text="".join(lines), content_type="text/plain")

    async def _list_events(self, request: web.Request) -> web.Response:
        events = [{"kind": "Event", "apiVersion": "v1", **e} for e in self._filtered(request, self.events)]
        return self._list(request, "EventList", "v1", events)

    async def _list_nodes(self, request: web.Request) -> web.Response:
        nodes = [{"kind": "Node", "apiVersion": "v1", **n} for n in self._filtered(request, self.nodes)]
        return self._list(request, "NodeList", "v1", nodes)

    async def _list_namespaces(self, request: web.Request) -> web.Response:
        names = self.namespaces or sorted({p["metadata"]["namespace"] for p in self.pods})
        items = [
            {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": n}, "status": {"phase": "Active"}}
            for n in names
        ]
        return self._list(request, "NamespaceList", "v1", items)

    async def _list_apps(self, request: web.Request) -> web.Response:
        kind = request.path.rstrip("/").rsplit("/", 1)[-1]
        source = {
            "deployments": self.deployments,
            "statefulsets": self.statefulsets,
            "replicasets": self.replicasets,
        }
        singular = {"deployments": "Deployment", "statefulsets": "StatefulSet", "replicasets": "ReplicaSet"}[
            kind
        ]
        items = [
            {"kind": singular, "apiVersion": "apps/v1", **i} for i in self._filtered(request, source[kind])
        ]
        return self._list(request, f"{singular}List", "apps/v1", items)


# -- selectors -------------------------------------------------------------------------------

_SET_REQ = re.compile(r"^\s*([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def _split_selector(selector: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current)
    return parts


def match_labels(selector: str, labels: dict[str, str]) -> bool:
    """Kubernetes label selector semantics for the forms kubectl writes."""
    for requirement in _split_selector(selector):
        requirement = requirement.strip()
        set_match = _SET_REQ.match(requirement)
        if set_match:
            key, op, values = set_match.groups()
            options = {v.strip() for v in values.split(",")}
            if op == "in" and labels.get(key) not in options:
                return False
            if op == "notin" and key in labels and labels[key] in options:
                return False
        elif "!=" in requirement:
            key, value = (s.strip() for s in requirement.split("!=", 1))
            if labels.get(key) == value:
                return False
        elif "=" in requirement:
            key, value = (s.strip() for s in requirement.replace("==", "=").split("=", 1))
            if labels.get(key) != value:
                return False
        elif requirement.startswith("!"):
            if requirement[1:].strip() in labels:
                return False
        elif requirement not in labels:
            return False
    return True


def _path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def match_fields(selector: str, obj: dict[str, Any]) -> bool:
    """Field selector semantics (``a.b=c``, ``a.b!=c``)."""
    for requirement in selector.split(","):
        if "!=" in requirement:
            key, value = requirement.split("!=", 1)
            if str(_path(obj, key.strip())) == value.strip():
                return False
        else:
            key, value = requirement.replace("==", "=").split("=", 1)
            if str(_path(obj, key.strip())) != value.strip():
                return False
    return True


# -- object builders (real field names and shapes) ---------------------------------------------


def container_status(
    name: str = "app",
    *,
    image: str = "registry.example.com/app:1.0.0",
    ready: bool = True,
    restart_count: int = 0,
    state: dict[str, Any] | None = None,
    last_state: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imageID": f"registry.example.com/app@sha256:{'ab' * 32}",
        "containerID": f"containerd://{'cd' * 32}",
        "ready": ready,
        "started": ready,
        "restartCount": restart_count,
        "state": state if state is not None else {"running": {"startedAt": ts(60)}},
        "lastState": last_state or {},
    }


def terminated(reason: str, exit_code: int, minutes_ago: float = 1) -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": exit_code,
            "reason": reason,
            "startedAt": ts(minutes_ago + 1),
            "finishedAt": ts(minutes_ago),
            "containerID": f"containerd://{'ef' * 32}",
        }
    }


def pod(
    name: str,
    namespace: str = "payments",
    *,
    phase: str = "Running",
    statuses: list[dict[str, Any]] | None = None,
    node: str | None = "worker-1",
    labels: dict[str, str] | None = None,
    owner: tuple[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    image: str = "registry.example.com/app:1.0.0",
    reason: str | None = None,
    resources: dict[str, dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Pod object; ``resources`` apply to every container (default: requests 250m / 256Mi,
    limits 1 / 512Mi)."""
    if resources is None:
        resources = {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        }
    statuses = statuses if statuses is not None else [container_status(image=image)]
    all_ready = bool(statuses) and all(s["ready"] for s in statuses)
    if conditions is None:
        conditions = [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(60)},
            {"type": "Initialized", "status": "True", "lastTransitionTime": ts(60)},
            {
                "type": "ContainersReady",
                "status": "True" if all_ready else "False",
                "lastTransitionTime": ts(5),
                **({} if all_ready else {"reason": "ContainersNotReady"}),
            },
            {
                "type": "Ready",
                "status": "True" if all_ready else "False",
                "lastTransitionTime": ts(5),
                **({} if all_ready else {"reason": "ContainersNotReady"}),
            },
        ]
    containers = [
        {
            "name": s["name"],
            "image": s["image"],
            "resources": resources,
            "env": env or [],
        }
        for s in statuses
    ] or [{"name": "app", "image": image, "env": env or []}]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "creationTimestamp": ts(120),
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if owner:
        meta["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": owner[0],
                "name": owner[1],
                "uid": f"uid-{owner[1]}",
                "controller": True,
            }
        ]
    status: dict[str, Any] = {"phase": phase, "conditions": conditions, "startTime": ts(120)}
    if statuses and phase != "Pending" or any("waiting" in s["state"] for s in statuses):
        status["containerStatuses"] = statuses
    if reason:
        status["reason"] = reason
    spec: dict[str, Any] = {"containers": containers, "restartPolicy": "Always"}
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": status}


def event(
    namespace: str,
    kind: str,
    name: str,
    reason: str,
    message: str,
    *,
    count: int = 1,
    minutes_ago: float = 1,
    type_: str = "Warning",
    index: int = 0,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{name}.{index:016x}",
            "namespace": namespace,
            "creationTimestamp": ts(minutes_ago + 5),
        },
        "involvedObject": {"kind": kind, "namespace": namespace, "name": name, "apiVersion": "v1"},
        "reason": reason,
        "message": message,
        "source": {"component": "kubelet", "host": "worker-1"},
        "firstTimestamp": ts(minutes_ago + 5),
        "lastTimestamp": ts(minutes_ago),
        "count": count,
        "type": type_,
        "reportingComponent": "kubelet",
        "reportingInstance": "worker-1",
    }


def _template(image: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels},
        "spec": {"containers": [{"name": "app", "image": image}]},
    }


def deployment(
    name: str,
    namespace: str = "payments",
    *,
    replicas: int = 3,
    ready: int = 3,
    updated: int = 3,
    available: int = 3,
    revision: int = 1,
    image: str = "registry.example.com/app:1.0.0",
    progressing: tuple[str, str, str] = (
        "True",
        "NewReplicaSetAvailable",
        "ReplicaSet has successfully progressed.",
    ),
) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "generation": revision,
            "creationTimestamp": ts(60 * 24),
            "labels": labels,
            "annotations": {"deployment.kubernetes.io/revision": str(revision)},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": _template(image, labels),
            "strategy": {"type": "RollingUpdate"},
        },
        "status": {
            "observedGeneration": revision,
            "replicas": max(replicas, updated),
            "updatedReplicas": updated,
            "readyReplicas": ready,
            "availableReplicas": available,
            **({"unavailableReplicas": replicas - available} if available < replicas else {}),
            "conditions": [
                {
                    "type": "Available",
                    "status": "True" if available >= replicas else "False",
                    "reason": "MinimumReplicasAvailable"
                    if available >= replicas
                    else "MinimumReplicasUnavailable",
                    "message": "Deployment has minimum availability."
                    if available >= replicas
                    else "Deployment does not have minimum availability.",
                    "lastUpdateTime": ts(10),
                    "lastTransitionTime": ts(10),
                },
                {
                    "type": "Progressing",
                    "status": progressing[0],
                    "reason": progressing[1],
                    "message": progressing[2],
                    "lastUpdateTime": ts(5),
                    "lastTransitionTime": ts(5),
                },
            ],
        },
    }


def replicaset(
    deployment_name: str,
    pod_hash: str,
    revision: int,
    *,
    namespace: str = "payments",
    image: str = "registry.example.com/app:1.0.0",
    replicas: int = 0,
    ready: int = 0,
    minutes_ago: float = 60,
    change_cause: str | None = None,
) -> dict[str, Any]:
    annotations = {"deployment.kubernetes.io/revision": str(revision)}
    if change_cause:
        annotations["kubernetes.io/change-cause"] = change_cause
    labels = {"app": deployment_name, "pod-template-hash": pod_hash}
    return {
        "metadata": {
            "name": f"{deployment_name}-{pod_hash}",
            "namespace": namespace,
            "uid": f"uid-{deployment_name}-{pod_hash}",
            "creationTimestamp": ts(minutes_ago),
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "name": deployment_name,
                    "uid": f"uid-{deployment_name}",
                    "controller": True,
                }
            ],
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": _template(image, labels),
        },
        "status": {"replicas": replicas, "readyReplicas": ready, "availableReplicas": ready},
    }


def statefulset(
    name: str,
    namespace: str = "payments",
    *,
    replicas: int = 3,
    ready: int = 3,
    current_revision: str = "1",
    update_revision: str = "1",
    image: str = "registry.example.com/db:15.4",
) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels},
        "spec": {
            "replicas": replicas,
            "serviceName": name,
            "selector": {"matchLabels": labels},
            "template": _template(image, labels),
        },
        "status": {
            "replicas": replicas,
            "readyReplicas": ready,
            "currentReplicas": replicas if current_revision == update_revision else replicas - 1,
            "updatedReplicas": replicas if current_revision == update_revision else 1,
            "currentRevision": f"{name}-{current_revision}",
            "updateRevision": f"{name}-{update_revision}",
            "observedGeneration": 2,
        },
    }


def node(
    name: str,
    *,
    ready: bool = True,
    pressure: tuple[str, ...] = (),
    unschedulable: bool = False,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    conditions = []
    for kind, reason in (
        ("MemoryPressure", "KubeletHasInsufficientMemory"),
        ("DiskPressure", "KubeletHasDiskPressure"),
        ("PIDPressure", "KubeletHasInsufficientPID"),
    ):
        on = kind in pressure
        conditions.append(
            {
                "type": kind,
                "status": "True" if on else "False",
                "reason": reason if on else f"KubeletHasNo{kind}",
                "message": f"kubelet has {kind}" if on else f"kubelet has no {kind}",
                "lastHeartbeatTime": ts(1),
                "lastTransitionTime": ts(30),
            }
        )
    conditions.append(
        {
            "type": "Ready",
            "status": "True" if ready else "Unknown",
            "reason": "KubeletReady" if ready else "NodeStatusUnknown",
            "message": "kubelet is posting ready status" if ready else "Kubelet stopped posting node status.",
            "lastHeartbeatTime": ts(1),
            "lastTransitionTime": ts(30),
        }
    )
    spec: dict[str, Any] = {"podCIDR": "10.244.1.0/24"}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
        "status": {
            "conditions": conditions,
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "7910m", "memory": "30Gi", "pods": "110"},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": f"boot-{name}",
                "containerRuntimeVersion": "containerd://2.1.4",
                "kernelVersion": "6.12.48-amd64",
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.34.1",
                "machineID": f"machine-{name}",
                "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 13 (trixie)",
                "systemUUID": f"uuid-{name}",
            },
        },
    }
