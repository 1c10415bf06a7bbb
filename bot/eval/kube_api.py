"""A Kubernetes API server for a recorded cluster state, speaking the real REST shapes for the read
calls opsbot makes: what ``opsbot eval`` serves each incident case from, and the tests' fake cluster.

Served by aiohttp on a free port; the real kubernetes-asyncio client reaches it through a kubeconfig
file (:meth:`KubernetesSnapshotServer.write_kubeconfig`), with a bearer token it checks. Nothing in
opsbot's own code is pointed at it except by that kubeconfig.

Routes (GET only unless ``write_token`` is set, see :mod:`bot.eval.kube_write`; anything else is 405,
as for a read-only service account): the list calls of
``/api/v1`` (pods, events, nodes, namespaces, services, configmaps, secrets, persistentvolumeclaims,
persistentvolumes), ``/apis/apps/v1`` (deployments, statefulsets, replicasets, daemonsets),
``/apis/discovery.k8s.io/v1/endpointslices``, ``/apis/storage.k8s.io/v1/storageclasses``,
``/apis/autoscaling/v2/horizontalpodautoscalers``, ``/apis/batch/v1/{cronjobs,jobs}`` (and
``/version``), each also in its namespaced form unless cluster-scoped, and each object by name
(``.../{name}``); a pod's ``/log`` (``container``, ``previous``, ``tailLines``). EndpointSlices
follow the pods a Service selects, as the controller keeps them. Secrets are served with planted
values (``SECRET-VALUE-<key>``) so a test can prove none reaches a prompt. List calls honour
``labelSelector`` (=, ==, !=, in, notin, exists, !exists) and ``fieldSelector`` (dotted paths, =
and !=). Errors are ``Status`` objects.

Faults are chosen per path: ``server.fail(r"/api/v1/nodes", 403)``, ``server.delay(r"/pods", 5.0)`` or
``server.garbage(r"/pods", "<html>bad gateway</html>", "text/html")`` (200 with a body the API never sends).
"""

from __future__ import annotations

import base64
import functools
import json
import re
import zlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from bot.eval.kube_write import Write, add_write_routes
from bot.eval.local_server import LocalApiServer

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
class KubernetesSnapshotServer(LocalApiServer):
    """State of the cluster plus the server that serves it."""

    token: str = "snapshot-token"
    pods: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    deployments: list[dict[str, Any]] = field(default_factory=list)
    statefulsets: list[dict[str, Any]] = field(default_factory=list)
    replicasets: list[dict[str, Any]] = field(default_factory=list)
    daemonsets: list[dict[str, Any]] = field(default_factory=list)
    services: list[dict[str, Any]] = field(default_factory=list)
    endpointslices: list[dict[str, Any]] = field(default_factory=list)
    """Slices served as they are; every Service with a selector not covered here gets one made from
    the pods it selects, as the EndpointSlice controller would."""
    configmaps: list[dict[str, Any]] = field(default_factory=list)
    secrets: list[dict[str, Any]] = field(default_factory=list)
    persistentvolumeclaims: list[dict[str, Any]] = field(default_factory=list)
    persistentvolumes: list[dict[str, Any]] = field(default_factory=list)
    storageclasses: list[dict[str, Any]] = field(default_factory=list)
    horizontalpodautoscalers: list[dict[str, Any]] = field(default_factory=list)
    cronjobs: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    logs: dict[tuple[str, str, str, bool], str] = field(default_factory=dict)
    """(namespace, pod, container, previous) -> full log text."""
    faults: list[tuple[re.Pattern[str], Fault]] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    """Every request as ``METHOD path?query``, for assertions."""
    write_token: str | None = None
    """The token of a ServiceAccount that may write (:mod:`bot.eval.kube_write`: patch, scale,
    delete a pod, dry runs); ``None``: the server is read-only and every write is 405."""
    rollout_delay_s: float = 0.0
    """Seconds a written workload's status takes to catch up (its controller's rollout)."""
    writes: list[Write] = field(default_factory=list)
    """Every write call taken (dry runs too), for assertions and ``bench``."""

    def state_text(self) -> str:
        """Everything this server serves, as one text (objects as JSON, then every log): what an
        eval case's decisive facts are looked up in when they did not reach the prompt."""
        objects = {plural: self.items(plural) for plural in _KINDS}
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
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}", self._get_pod)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{name}/log", self._log)
        app.router.add_get("/api/v1/namespaces", self._list_namespaces)
        app.router.add_get("/version", self._version)
        app.router.add_get("/version/", self._version)  # kubernetes-asyncio's VersionApi asks this
        for prefix, plural in _ROUTES:
            handler = functools.partial(self._list_kind, prefix, plural)
            one = functools.partial(self._get_kind, prefix, plural)
            app.router.add_get(f"{prefix}/{plural}", handler)
            if plural in _CLUSTER_SCOPED:
                app.router.add_get(f"{prefix}/{plural}/{{name}}", one)
            else:
                app.router.add_get(f"{prefix}/namespaces/{{ns}}/{plural}", handler)
                if plural != "pods":
                    app.router.add_get(f"{prefix}/namespaces/{{ns}}/{plural}/{{name}}", one)
        if self.write_token is not None:
            add_write_routes(self, app)
        return app

    async def _version(self, request: web.Request) -> web.Response:
        # The health check's call (kubectl version asks the same); fixed, as a pinned server's.
        return web.json_response(
            {
                "major": "1",
                "minor": "31",
                "gitVersion": "v1.31.0",
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2024-08-13T07:28:49Z",
                "goVersion": "go1.22.5",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        )

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
        auth = request.headers.get("Authorization")
        writer = self.write_token is not None and auth == f"Bearer {self.write_token}"
        if request.method != "GET":
            if self.write_token is None:
                return web.json_response(
                    status_object(405, "MethodNotAllowed", "read-only snapshot server"), status=405
                )
            if auth == f"Bearer {self.token}":  # what RBAC answers the get/list/watch account
                message = f"the read-only ServiceAccount cannot {request.method.lower()} {request.path}"
                return web.json_response(status_object(403, "Forbidden", message), status=403)
        if not writer and auth != f"Bearer {self.token}":
            return web.json_response(status_object(401, "Unauthorized", "Unauthorized"), status=401)
        await self.answer_delay()
        for pattern, fault in self.faults:
            if pattern.search(request.path):
                if fault.delay_s:
                    await self.hold(fault.delay_s)
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

    def items(self, plural: str) -> list[dict[str, Any]]:
        """The objects of one resource (``pods``, ``endpointslices`` ...) as served."""
        if plural == "endpointslices":
            covered = {
                (e["metadata"].get("namespace"), e["metadata"]["labels"].get(_SERVICE_NAME_LABEL))
                for e in self.endpointslices
            }
            made = [
                endpoint_slice(svc, self.pods)
                for svc in self.services
                if svc["spec"].get("selector")
                and (svc["metadata"]["namespace"], svc["metadata"]["name"]) not in covered
            ]
            return [*self.endpointslices, *made]
        items: list[dict[str, Any]] = getattr(self, plural)
        return items

    async def _list_kind(self, prefix: str, plural: str, request: web.Request) -> web.Response:
        kind, api_version = _KINDS[plural], prefix.removeprefix("/apis/").removeprefix("/api/")
        items = [
            {"kind": kind, "apiVersion": api_version, **i}
            for i in self._filtered(request, self.items(plural))
        ]
        return self._list(request, f"{kind}List", api_version, items)

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
        containers = [c["name"] for c in [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]]
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
            status = pod.get("status", {})
            statuses = {
                s["name"]: s
                for s in [*status.get("initContainerStatuses", []), *status.get("containerStatuses", [])]
            }
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
        text = "".join(lines)
        limit = request.query.get("limitBytes")
        if limit is not None:
            # As the kubelet does: the first limitBytes of what tailLines selected (or of the whole log).
            text = text.encode()[: int(limit)].decode(errors="ignore")
        return web.Response(text=text, content_type="text/plain")

    async def _get_kind(self, prefix: str, plural: str, request: web.Request) -> web.Response:
        kind, api_version = _KINDS[plural], prefix.removeprefix("/apis/").removeprefix("/api/")
        ns, name = request.match_info.get("ns"), request.match_info["name"]
        for item in self.items(plural):
            meta = item["metadata"]
            if meta["name"] == name and (ns is None or meta.get("namespace") == ns):
                return web.json_response({"kind": kind, "apiVersion": api_version, **item})
        message = f'{plural} "{name}" not found'
        return web.json_response(status_object(404, "NotFound", message), status=404)

    async def _list_namespaces(self, request: web.Request) -> web.Response:
        names = self.namespaces or sorted({p["metadata"]["namespace"] for p in self.pods})
        items = [
            {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": n}, "status": {"phase": "Active"}}
            for n in names
        ]
        return self._list(request, "NamespaceList", "v1", items)


_SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_ROUTES: tuple[tuple[str, str], ...] = (
    ("/api/v1", "pods"),
    ("/api/v1", "events"),
    ("/api/v1", "nodes"),
    ("/api/v1", "services"),
    ("/api/v1", "configmaps"),
    ("/api/v1", "secrets"),
    ("/api/v1", "persistentvolumeclaims"),
    ("/api/v1", "persistentvolumes"),
    ("/apis/apps/v1", "deployments"),
    ("/apis/apps/v1", "statefulsets"),
    ("/apis/apps/v1", "replicasets"),
    ("/apis/apps/v1", "daemonsets"),
    ("/apis/discovery.k8s.io/v1", "endpointslices"),
    ("/apis/storage.k8s.io/v1", "storageclasses"),
    ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    ("/apis/batch/v1", "cronjobs"),
    ("/apis/batch/v1", "jobs"),
)
"""Every list route served: (API prefix, resource); each also namespaced unless cluster-scoped."""
_CLUSTER_SCOPED = frozenset({"nodes", "persistentvolumes", "storageclasses"})
_KINDS = {
    "pods": "Pod",
    "events": "Event",
    "nodes": "Node",
    "services": "Service",
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "persistentvolumes": "PersistentVolume",
    "deployments": "Deployment",
    "statefulsets": "StatefulSet",
    "replicasets": "ReplicaSet",
    "daemonsets": "DaemonSet",
    "endpointslices": "EndpointSlice",
    "storageclasses": "StorageClass",
    "horizontalpodautoscalers": "HorizontalPodAutoscaler",
    "cronjobs": "CronJob",
    "jobs": "Job",
}


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
    container_specs: dict[str, dict[str, Any]] | None = None,
    init_statuses: list[dict[str, Any]] | None = None,
    volumes: list[dict[str, Any]] | None = None,
    ip: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    """A Pod object; ``resources`` and ``env`` apply to every container (default resources: requests
    250m / 256Mi, limits 1 / 512Mi); ``container_specs`` adds spec fields by container name (probes,
    ports, volumeMounts, envFrom, args, or its own resources / env) to containers and init containers;
    ``init_statuses``: the init containers' statuses (their specs are made from them)."""
    if resources is None:
        resources = {
            "requests": {"cpu": "250m", "memory": "256Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        }
    statuses = statuses if statuses is not None else [container_status(image=image)]
    all_ready = bool(statuses) and all(s["ready"] for s in statuses)
    inits_done = all(
        (s.get("state") or {}).get("terminated", {}).get("exitCode") == 0 for s in init_statuses or []
    )
    if conditions is None:
        conditions = _pod_conditions(all_ready, inits_done)
    extra = container_specs or {}

    def spec_of(status: dict[str, Any]) -> dict[str, Any]:
        base = {"name": status["name"], "image": status["image"], "resources": resources, "env": env or []}
        return {**base, **extra.get(status["name"], {})}

    containers = [spec_of(s) for s in statuses] or [
        {"name": "app", "image": image, "env": env or [], **extra.get("app", {})}
    ]
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{namespace}-{name}",
        "creationTimestamp": ts(120),
        "labels": labels or {},
        "annotations": annotations or {},
    }
    if owner:
        meta["ownerReferences"] = [_controller_reference(*owner)]
    status: dict[str, Any] = {"phase": phase, "conditions": conditions, "startTime": ts(120)}
    if statuses and phase != "Pending" or any("waiting" in s["state"] for s in statuses):
        status["containerStatuses"] = statuses
    if init_statuses:
        status["initContainerStatuses"] = init_statuses
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    spec: dict[str, Any] = {
        "containers": containers,
        "restartPolicy": "Never" if owner and owner[0] == "Job" else "Always",
        "serviceAccountName": "default",
    }
    if init_statuses:
        spec["initContainers"] = [spec_of(s) for s in init_statuses]
    if volumes:
        spec["volumes"] = volumes
    if node:
        spec["nodeName"] = node
        status["hostIP"] = _ip("10.0.0", node)
        if phase in ("Running", "Succeeded", "Failed") and reason != "Evicted":
            status["podIP"] = ip or _ip("10.244", f"{namespace}/{name}", octets=2)
            status["podIPs"] = [{"ip": status["podIP"]}]
    return {"metadata": meta, "spec": spec, "status": status}


def _pod_conditions(all_ready: bool, inits_done: bool) -> list[dict[str, Any]]:
    """The four conditions the kubelet sets, from whether every container is ready and every init
    container has finished."""

    def condition(kind: str, true: bool, since: str, reason: str) -> dict[str, Any]:
        return {
            "type": kind,
            "status": "True" if true else "False",
            "lastTransitionTime": since,
            **({} if true else {"reason": reason}),
        }

    return [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": ts(60)},
        condition("Initialized", inits_done, ts(60), "ContainersNotInitialized"),
        condition("ContainersReady", all_ready, ts(5), "ContainersNotReady"),
        condition("Ready", all_ready, ts(5), "ContainersNotReady"),
    ]


def _controller_reference(kind: str, name: str) -> dict[str, Any]:
    """The ``ownerReferences`` entry a controller of ``kind`` sets on what it makes."""
    return {
        "apiVersion": "batch/v1" if kind in ("Job", "CronJob") else "apps/v1",
        "kind": kind,
        "name": name,
        "uid": f"uid-{name}",
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _ip(prefix: str, key: str, octets: int = 1) -> str:
    """A stable made-up address under ``prefix`` for ``key``."""
    digest = zlib.crc32(key.encode())
    parts = [str((digest >> (8 * i)) % 250 + 2) for i in range(octets)]
    return ".".join([prefix, *parts])


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


def _template(image: str, labels: dict[str, str], spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """A pod template: one container ``app`` running ``image``, or the pod spec ``spec`` (real field
    names: containers with resources, env, probes; volumes; initContainers)."""
    return {
        "metadata": {"labels": labels},
        "spec": spec if spec is not None else {"containers": [{"name": "app", "image": image}]},
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
    template: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Deployment; ``template``: its pod spec (default: one container running ``image``)."""
    labels = labels or {"app": name}
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
            "template": _template(image, labels, template),
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
    template: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One revision of a Deployment; ``template``: its pod spec (default: one container, ``image``)."""
    annotations = {"deployment.kubernetes.io/revision": str(revision)}
    if change_cause:
        annotations["kubernetes.io/change-cause"] = change_cause
    labels = {**(labels or {"app": deployment_name}), "pod-template-hash": pod_hash}
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
            "template": _template(image, labels, template),
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
    template: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    volume_claims: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A StatefulSet; ``template``: its pod spec; ``volume_claims``: its volumeClaimTemplates."""
    labels = labels or {"app": name}
    spec: dict[str, Any] = {
        "replicas": replicas,
        "serviceName": name,
        "selector": {"matchLabels": labels},
        "template": _template(image, labels, template),
    }
    if volume_claims:
        spec["volumeClaimTemplates"] = volume_claims
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "labels": labels},
        "spec": spec,
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
    allocatable: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    conditions_extra: list[dict[str, Any]] | None = None,
    not_ready_message: str = "Kubelet stopped posting node status.",
) -> dict[str, Any]:
    """A Node; ``allocatable`` overrides cpu / memory / pods / ephemeral-storage; ``conditions_extra``
    adds conditions as written (``NetworkUnavailable`` and the like)."""
    conditions = list(conditions_extra or [])
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
            "message": "kubelet is posting ready status" if ready else not_ready_message,
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
        "metadata": {
            "name": name,
            "uid": f"uid-node-{name}",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **(labels or {})},
        },
        "spec": spec,
        "status": {
            "conditions": conditions,
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"},
            "allocatable": {
                "cpu": "7910m",
                "memory": "30Gi",
                "pods": "110",
                "ephemeral-storage": "95Gi",
                **(allocatable or {}),
            },
            "addresses": [
                {"type": "InternalIP", "address": _ip("10.0.0", name)},
                {"type": "Hostname", "address": name},
            ],
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


def object_meta(name: str, namespace: str, kind: str, **fields: Any) -> dict[str, Any]:
    """``metadata`` of a namespaced object: name, namespace, a uid made of them, created a day ago
    (``fields`` add or replace keys: labels, annotations, generation, creationTimestamp ...)."""
    return {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{kind}-{namespace}-{name}",
        "creationTimestamp": ts(60 * 24),
        **fields,
    }


def daemonset(
    name: str,
    namespace: str = "kube-system",
    *,
    desired: int = 3,
    ready: int = 3,
    updated: int | None = None,
    image: str = "registry.example.com/agent:1.0.0",
    template: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A DaemonSet with ``desired`` scheduled pods, ``ready`` of them ready."""
    labels = labels or {"app": name}
    return {
        "metadata": object_meta(name, namespace, "ds", labels=labels, generation=1),
        "spec": {
            "selector": {"matchLabels": labels},
            "template": _template(image, labels, template),
            "updateStrategy": {"type": "RollingUpdate"},
        },
        "status": {
            "currentNumberScheduled": desired,
            "desiredNumberScheduled": desired,
            "numberReady": ready,
            "numberAvailable": ready,
            "updatedNumberScheduled": desired if updated is None else updated,
            "numberMisscheduled": 0,
            **({"numberUnavailable": desired - ready} if ready < desired else {}),
            "observedGeneration": 1,
        },
    }


def service(
    name: str,
    namespace: str = "payments",
    *,
    selector: dict[str, str] | None = None,
    ports: list[int | dict[str, Any]] | None = None,
    type_: str = "ClusterIP",
    cluster_ip: str | None = None,
    external_name: str | None = None,
) -> dict[str, Any]:
    """A Service selecting ``selector`` (default ``app: name``; ``{}``: none) on ``ports``."""
    spec: dict[str, Any] = {"type": type_}
    if type_ == "ExternalName":
        spec["externalName"] = external_name or f"{name}.example.com"
    else:
        spec["clusterIP"] = cluster_ip or _ip("10.96", f"{namespace}/{name}", octets=2)
        spec["clusterIPs"] = [spec["clusterIP"]]
        spec["selector"] = {"app": name} if selector is None else selector
        spec["ports"] = [
            p
            if isinstance(p, dict)
            else {"name": f"port-{p}", "port": int(p), "targetPort": int(p), "protocol": "TCP"}
            for p in (ports or [80])
        ]
        if not spec["selector"]:
            del spec["selector"]
    meta = object_meta(name, namespace, "svc", labels={"app": name}, creationTimestamp=ts(60 * 24 * 30))
    return {"metadata": meta, "spec": spec, "status": {"loadBalancer": {}}}


def endpoint_slice(svc: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The EndpointSlice the controller keeps for ``svc``: one endpoint per selected pod that has an
    address (ready or not), with its node and a reference to the pod."""
    meta, spec = svc["metadata"], svc["spec"]
    selector = spec.get("selector") or {}
    endpoints = []
    for p in pods:
        labels = p["metadata"].get("labels") or {}
        ip = p.get("status", {}).get("podIP")
        if p["metadata"]["namespace"] != meta["namespace"] or not ip:
            continue
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            continue
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or []
        )
        endpoints.append(
            {
                "addresses": [ip],
                "conditions": {"ready": ready, "serving": ready, "terminating": False},
                "nodeName": p["spec"].get("nodeName"),
                "targetRef": {
                    "kind": "Pod",
                    "namespace": meta["namespace"],
                    "name": p["metadata"]["name"],
                    "uid": p["metadata"]["uid"],
                },
            }
        )
    return {
        "metadata": {
            "name": f"{meta['name']}-{zlib.crc32(meta['name'].encode()) % 100000:05d}",
            "namespace": meta["namespace"],
            "labels": {
                _SERVICE_NAME_LABEL: meta["name"],
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Service", "name": meta["name"], "uid": meta["uid"]}
            ],
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [
            {"name": p.get("name", ""), "port": int(p.get("targetPort", p["port"])), "protocol": "TCP"}
            for p in spec.get("ports", [])
        ],
    }


def config_map(
    name: str, namespace: str = "payments", *, data: dict[str, str] | None = None
) -> dict[str, Any]:
    """A ConfigMap with ``data``."""
    return {"metadata": object_meta(name, namespace, "cm"), "data": dict(data or {})}


def secret(
    name: str, namespace: str = "payments", *, keys: list[str] | None = None, type_: str = "Opaque"
) -> dict[str, Any]:
    """A Secret with ``keys``; each value is a planted marker (``SECRET-VALUE-<key>``, base64) that
    must never reach a prompt: opsbot never reads Secrets."""
    return {
        "metadata": object_meta(name, namespace, "secret"),
        "type": type_,
        "data": {k: base64.b64encode(f"SECRET-VALUE-{k}".encode()).decode() for k in keys or []},
    }


def persistent_volume_claim(
    name: str,
    namespace: str = "payments",
    *,
    storage_class: str | None = "standard",
    size: str = "10Gi",
    phase: str = "Bound",
    volume: str | None = None,
    access_modes: list[str] | None = None,
) -> dict[str, Any]:
    """A PVC; ``Bound`` ones name their volume (default ``pvc-<uid>``)."""
    uid = f"{zlib.crc32(f'{namespace}/{name}'.encode()):08x}-0000-4000-8000-000000000000"
    spec: dict[str, Any] = {
        "accessModes": access_modes or ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
        "volumeMode": "Filesystem",
    }
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    status: dict[str, Any] = {"phase": phase}
    if phase == "Bound":
        spec["volumeName"] = volume or f"pvc-{uid}"
        status.update({"accessModes": spec["accessModes"], "capacity": {"storage": size}})
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "creationTimestamp": ts(60)},
        "spec": spec,
        "status": status,
    }


def persistent_volume(
    name: str,
    *,
    claim: tuple[str, str] | None = None,
    storage_class: str | None = "standard",
    size: str = "10Gi",
    phase: str = "Bound",
    driver: str = "ebs.csi.aws.com",
    node_affinity_zone: str | None = None,
) -> dict[str, Any]:
    """A CSI PersistentVolume, bound to ``claim`` (namespace, name) when given."""
    spec: dict[str, Any] = {
        "capacity": {"storage": size},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Delete",
        "csi": {"driver": driver, "volumeHandle": f"vol-{zlib.crc32(name.encode()):08x}", "fsType": "ext4"},
        "volumeMode": "Filesystem",
    }
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    if claim is not None:
        spec["claimRef"] = {"kind": "PersistentVolumeClaim", "namespace": claim[0], "name": claim[1]}
    if node_affinity_zone:
        spec["nodeAffinity"] = {
            "required": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": [node_affinity_zone],
                            }
                        ]
                    }
                ]
            }
        }
    return {"metadata": {"name": name, "uid": f"uid-pv-{name}"}, "spec": spec, "status": {"phase": phase}}


def storage_class(
    name: str,
    *,
    provisioner: str = "ebs.csi.aws.com",
    parameters: dict[str, str] | None = None,
    binding_mode: str = "WaitForFirstConsumer",
    default: bool = False,
) -> dict[str, Any]:
    """A StorageClass."""
    annotations = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {
        "metadata": {"name": name, "uid": f"uid-sc-{name}", "annotations": annotations},
        "provisioner": provisioner,
        "parameters": dict(parameters or {}),
        "reclaimPolicy": "Delete",
        "volumeBindingMode": binding_mode,
        "allowVolumeExpansion": True,
    }


def horizontal_pod_autoscaler(
    name: str,
    namespace: str = "payments",
    *,
    target: tuple[str, str] | None = None,
    min_replicas: int = 2,
    max_replicas: int = 10,
    current_replicas: int = 2,
    desired_replicas: int | None = None,
    cpu_target: int = 70,
    cpu_current: int | None = 40,
    conditions: list[tuple[str, str, str, str]] | None = None,
) -> dict[str, Any]:
    """An autoscaling/v2 HPA on CPU utilization of ``target`` (kind, name; default the Deployment
    ``name``); ``conditions``: (type, status, reason, message)."""
    kind, target_name = target or ("Deployment", name)
    metrics = []
    if cpu_current is not None:
        metrics.append(
            {
                "type": "Resource",
                "resource": {"name": "cpu", "current": {"averageUtilization": cpu_current}},
            }
        )
    return {
        "metadata": object_meta(name, namespace, "hpa"),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": target_name},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Resource",
                    "resource": {
                        "name": "cpu",
                        "target": {"type": "Utilization", "averageUtilization": cpu_target},
                    },
                }
            ],
        },
        "status": {
            "currentReplicas": current_replicas,
            "desiredReplicas": current_replicas if desired_replicas is None else desired_replicas,
            "currentMetrics": metrics,
            "conditions": [
                {"type": t, "status": st, "reason": r, "message": m, "lastTransitionTime": ts(20)}
                for t, st, r, m in conditions or []
            ],
        },
    }


def cronjob(
    name: str,
    namespace: str = "payments",
    *,
    schedule: str = "0 2 * * *",
    last_schedule_minutes_ago: float | None = 60,
    last_success_minutes_ago: float | None = None,
    suspend: bool = False,
    active: list[str] | None = None,
    image: str = "registry.example.com/job:1.0.0",
    template: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A batch/v1 CronJob."""
    status: dict[str, Any] = {}
    if last_schedule_minutes_ago is not None:
        status["lastScheduleTime"] = ts(last_schedule_minutes_ago)
    if last_success_minutes_ago is not None:
        status["lastSuccessfulTime"] = ts(last_success_minutes_ago)
    if active:
        status["active"] = [
            {"kind": "Job", "namespace": namespace, "name": j, "apiVersion": "batch/v1"} for j in active
        ]
    pod_spec = template or {"containers": [{"name": "job", "image": image}], "restartPolicy": "Never"}
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
        "spec": {
            "schedule": schedule,
            "suspend": suspend,
            "concurrencyPolicy": "Forbid",
            "jobTemplate": {"spec": {"backoffLimit": 3, "template": {"spec": pod_spec}}},
        },
        "status": status,
    }


def job(
    name: str,
    namespace: str = "payments",
    *,
    cronjob_name: str | None = None,
    succeeded: int = 0,
    failed: int = 0,
    active: int = 0,
    backoff_limit: int = 3,
    condition: tuple[str, str, str] | None = None,
    minutes_ago: float = 30,
    image: str = "registry.example.com/job:1.0.0",
) -> dict[str, Any]:
    """A batch/v1 Job (of the CronJob ``cronjob_name`` when given); ``condition``: (type, reason,
    message) such as ("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": f"uid-{name}",
        "creationTimestamp": ts(minutes_ago),
        "labels": {"job-name": name},
    }
    if cronjob_name:
        meta["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "CronJob",
                "name": cronjob_name,
                "uid": f"uid-{cronjob_name}",
                "controller": True,
            }
        ]
    status: dict[str, Any] = {"startTime": ts(minutes_ago)}
    for key, value in (("succeeded", succeeded), ("failed", failed), ("active", active)):
        if value:
            status[key] = value
    if condition:
        status["conditions"] = [
            {
                "type": condition[0],
                "status": "True",
                "reason": condition[1],
                "message": condition[2],
                "lastTransitionTime": ts(max(0.0, minutes_ago - 5)),
            }
        ]
    return {
        "metadata": meta,
        "spec": {
            "backoffLimit": backoff_limit,
            "completions": 1,
            "parallelism": 1,
            "template": {"spec": {"containers": [{"name": "job", "image": image}], "restartPolicy": "Never"}},
        },
        "status": status,
    }
