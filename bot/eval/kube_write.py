"""The write calls of the fake Kubernetes API (:class:`~bot.eval.kube_api.KubernetesSnapshotServer`
with a ``write_token``), made the way the real API server makes them, for ``bot.actions``' tests.

- ``PATCH`` of Deployments, StatefulSets, DaemonSets and Nodes with the three patch types
  (``application/strategic-merge-patch+json``: maps merged, lists of objects merged by ``name``;
  ``application/merge-patch+json``: RFC 7386; ``application/json-patch+json``: RFC 6902 add,
  replace, remove, test); any other content type is 415;
- ``GET`` / ``PATCH`` of the ``/scale`` subresource (``autoscaling/v1`` ``Scale``);
- ``DELETE`` of a pod (the object is answered; its ReplicaSet, if any, makes a new pod);
- ``dryRun=All`` on every write: the answer is the object as it would be, nothing is stored; any
  other ``dryRun`` value is 400, as on the real server;
- the controllers a write sets off: a changed Deployment pod template gets a ReplicaSet (an
  existing one with the same template, as ``rollout undo`` finds, or a new one) whose
  ``deployment.kubernetes.io/revision`` becomes the newest; ``metadata.generation`` counts spec
  changes; the status catches up (``observedGeneration``, updated / ready / available replicas)
  after ``rollout_delay_s``.

Only the write token may write: the read-only token gets 403 Forbidden, as RBAC answers a
get/list/watch ServiceAccount. Every write is recorded in ``writes`` (time, method, path, dry run).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import hashlib
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

if TYPE_CHECKING:
    from bot.eval.kube_api import KubernetesSnapshotServer

STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_REVISION = "deployment.kubernetes.io/revision"
_WORKLOADS = {"deployments": "Deployment", "statefulsets": "StatefulSet", "daemonsets": "DaemonSet"}


@dataclass
class Write:
    """One write call the server took."""

    at: float
    """``time.perf_counter()`` when it arrived."""
    method: str
    path: str
    dry_run: bool
    status: int


class Invalid(Exception):
    """A write the API server refuses (status, reason, message)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


def add_write_routes(server: KubernetesSnapshotServer, app: web.Application) -> None:
    """Register the write routes on ``app``."""
    for plural in _WORKLOADS:
        base = f"/apis/apps/v1/namespaces/{{ns}}/{plural}/{{name}}"
        app.router.add_patch(base, functools.partial(_patch_object, server, plural=plural))
        if plural != "daemonsets":
            app.router.add_get(base + "/scale", functools.partial(_scale, server, plural=plural))
            app.router.add_patch(base + "/scale", functools.partial(_scale, server, plural=plural))
    app.router.add_patch("/api/v1/nodes/{name}", functools.partial(_patch_object, server, plural="nodes"))
    app.router.add_delete("/api/v1/namespaces/{ns}/pods/{name}", functools.partial(_delete_pod, server))


def _find(server: KubernetesSnapshotServer, plural: str, ns: str | None, name: str) -> dict[str, Any]:
    for item in server.items(plural):
        meta = item["metadata"]
        if meta["name"] == name and (ns is None or meta.get("namespace") == ns):
            return item
    raise Invalid(404, "NotFound", f'{plural} "{name}" not found')


def _dry_run(request: web.Request) -> bool:
    values = request.query.getall("dryRun", [])
    if any(v != "All" for v in values):
        raise Invalid(400, "BadRequest", f"Invalid dry run value: {values}; only All is accepted")
    return bool(values)


async def _body(request: web.Request) -> Any:
    try:
        return json.loads(await request.text())
    except ValueError as exc:
        raise Invalid(400, "BadRequest", f"the body of the request was in an unknown format: {exc}") from None


def apply_patch(obj: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """``obj`` with ``patch`` applied as ``content_type`` says (a new object)."""
    if content_type in (MERGE, STRATEGIC):
        merged: dict[str, Any] = _merge(copy.deepcopy(obj), patch, strategic=content_type == STRATEGIC)
        return merged
    if content_type == JSON_PATCH:
        return _json_patch(copy.deepcopy(obj), patch)
    raise Invalid(415, "UnsupportedMediaType", f"the media type {content_type!r} is not supported for PATCH")


def _merge(target: Any, patch: Any, *, strategic: bool) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif strategic and isinstance(value, list) and isinstance(target.get(key), list) and _named(value):
            # strategic merge: containers, env, volumes ... merge by their "name" key
            merged = {item["name"]: item for item in target[key] if isinstance(item, dict) and "name" in item}
            for item in value:
                merged[item["name"]] = _merge(merged.get(item["name"], {}), item, strategic=True)
            target[key] = list(merged.values())
        else:
            target[key] = _merge(target.get(key), value, strategic=strategic)
    return target


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def _json_patch(obj: dict[str, Any], ops: Any) -> dict[str, Any]:
    if not isinstance(ops, list):
        raise Invalid(400, "BadRequest", "a JSON patch is a list of operations")
    for op in ops:
        if not isinstance(op, dict) or op.get("op") not in ("add", "replace", "remove", "test"):
            raise Invalid(422, "Invalid", f"unsupported JSON patch operation {op!r}")
        parts = [p.replace("~1", "/").replace("~0", "~") for p in str(op.get("path", "")).split("/")[1:]]
        if not parts:
            raise Invalid(422, "Invalid", "JSON patch path must not be empty")
        parent: Any = obj
        for part in parts[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else None
            if parent is None:
                raise Invalid(422, "Invalid", f"JSON patch path {op['path']} does not exist")
        leaf = parts[-1]
        if not isinstance(parent, dict):
            raise Invalid(422, "Invalid", f"JSON patch path {op['path']} is not an object member")
        if op["op"] in ("replace", "remove", "test") and leaf not in parent:
            raise Invalid(422, "Invalid", f"JSON patch path {op['path']} does not exist")
        if op["op"] == "remove":
            del parent[leaf]
        elif op["op"] == "test":
            if parent[leaf] != op.get("value"):
                raise Invalid(422, "Invalid", f"JSON patch test failed at {op['path']}")
        else:
            parent[leaf] = copy.deepcopy(op.get("value"))
    return obj


def _validate(plural: str, obj: dict[str, Any]) -> None:
    spec = obj.get("spec") or {}
    if plural == "nodes":
        if not isinstance(spec.get("unschedulable", False), bool):
            raise Invalid(422, "Invalid", "spec.unschedulable: Invalid value: must be a boolean")
        return
    replicas = spec.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise Invalid(
            422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}: must be greater than or equal to 0"
        )
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers")
    if not containers or not all(
        isinstance(c, dict) and c.get("name") and c.get("image") for c in containers
    ):
        raise Invalid(422, "Invalid", "spec.template.spec.containers: Required value")


def _stored(server: KubernetesSnapshotServer, plural: str, old: dict[str, Any], new: dict[str, Any]) -> None:
    """Store ``new`` in place of ``old`` and run what the controllers would do."""
    meta = new.setdefault("metadata", {})
    meta["resourceVersion"] = str(int(old["metadata"].get("resourceVersion", "1000")) + 1)
    if plural != "nodes" and new.get("spec") != old.get("spec"):
        meta["generation"] = int(old["metadata"].get("generation", 1)) + 1
    if plural == "deployments" and (new["spec"].get("template") != old["spec"].get("template")):
        _new_revision(server, new)
    old.clear()
    old.update(new)
    if plural in _WORKLOADS:
        _settle_later(server, old)


def _template_hash(template: dict[str, Any]) -> str:
    clean = copy.deepcopy(template)
    (clean.get("metadata") or {}).get("labels", {}).pop("pod-template-hash", None)
    return hashlib.sha256(json.dumps(clean, sort_keys=True).encode()).hexdigest()[:10]


def _new_revision(server: KubernetesSnapshotServer, deploy: dict[str, Any]) -> None:
    """The deployment controller: the ReplicaSet of the new template becomes the newest revision."""
    meta = deploy["metadata"]
    owned = [
        rs
        for rs in server.replicasets
        if rs["metadata"].get("namespace") == meta["namespace"]
        and any(o.get("name") == meta["name"] for o in rs["metadata"].get("ownerReferences", []))
    ]
    newest = max([int(rs["metadata"].get("annotations", {}).get(_REVISION, 0)) for rs in owned] + [0]) + 1
    wanted = _template_hash(deploy["spec"]["template"])
    match = next((rs for rs in owned if _template_hash(rs["spec"]["template"]) == wanted), None)
    if match is None:
        template = copy.deepcopy(deploy["spec"]["template"])
        template.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = wanted
        match = {
            "metadata": {
                "name": f"{meta['name']}-{wanted}",
                "namespace": meta["namespace"],
                "uid": f"uid-{meta['name']}-{wanted}",
                "labels": dict(template["metadata"]["labels"]),
                "annotations": {},
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "Deployment",
                        "name": meta["name"],
                        "uid": meta.get("uid", f"uid-{meta['name']}"),
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": dict(template["metadata"]["labels"])},
                "template": template,
            },
            "status": {"replicas": 0},
        }
        server.replicasets.append(match)
    match["metadata"].setdefault("annotations", {})[_REVISION] = str(newest)
    meta.setdefault("annotations", {})[_REVISION] = str(newest)


def _settle_later(server: KubernetesSnapshotServer, obj: dict[str, Any]) -> None:
    """The workload controller catches up after ``rollout_delay_s`` (0: at once)."""

    def settle() -> None:
        replicas = int(obj["spec"].get("replicas", 1))
        status = obj.setdefault("status", {})
        status.update(
            observedGeneration=int(obj["metadata"].get("generation", 1)),
            replicas=replicas,
            updatedReplicas=replicas,
            readyReplicas=replicas,
            availableReplicas=replicas,
        )
        status.pop("unavailableReplicas", None)
        if "updateRevision" in status:
            status["currentRevision"] = status["updateRevision"]

    if server.rollout_delay_s > 0:
        asyncio.get_running_loop().call_later(server.rollout_delay_s, settle)
    else:
        settle()


def _answer(
    server: KubernetesSnapshotServer, request: web.Request, dry: bool, body: dict[str, Any]
) -> web.Response:
    server.writes.append(Write(time.perf_counter(), request.method, request.path, dry, 200))
    return web.json_response(body)


def _refused(server: KubernetesSnapshotServer, request: web.Request, exc: Invalid) -> web.Response:
    from bot.eval.kube_api import status_object

    server.writes.append(
        Write(time.perf_counter(), request.method, request.path, "dryRun" in request.query, exc.status)
    )
    return web.json_response(status_object(exc.status, exc.reason, str(exc)), status=exc.status)


async def _patch_object(server: KubernetesSnapshotServer, request: web.Request, plural: str) -> web.Response:
    try:
        dry = _dry_run(request)
        ns = request.match_info.get("ns")
        old = _find(server, plural, ns, request.match_info["name"])
        new = apply_patch(old, await _body(request), request.content_type)
        new["metadata"]["name"], new["metadata"]["uid"] = old["metadata"]["name"], old["metadata"].get("uid")
        _validate(plural, new)
    except Invalid as exc:
        return _refused(server, request, exc)
    kind = _WORKLOADS.get(plural, "Node")
    api_version = "v1" if plural == "nodes" else "apps/v1"
    if dry:
        shown = copy.deepcopy(new)
        if new.get("spec") != old.get("spec") and plural != "nodes":
            shown["metadata"]["generation"] = int(old["metadata"].get("generation", 1)) + 1
        return _answer(server, request, True, {"kind": kind, "apiVersion": api_version, **shown})
    _stored(server, plural, old, new)
    return _answer(server, request, False, {"kind": kind, "apiVersion": api_version, **old})


async def _scale(server: KubernetesSnapshotServer, request: web.Request, plural: str) -> web.Response:
    try:
        dry = _dry_run(request) if request.method == "PATCH" else False
        obj = _find(server, plural, request.match_info["ns"], request.match_info["name"])
        scale = _scale_object(obj)
        if request.method == "GET":
            return web.json_response(scale)
        patched = apply_patch(scale, await _body(request), request.content_type)
        replicas = (patched.get("spec") or {}).get("replicas")
        new = copy.deepcopy(obj)
        new["spec"]["replicas"] = replicas
        _validate(plural, new)
    except Invalid as exc:
        return _refused(server, request, exc)
    if not dry:
        _stored(server, plural, obj, new)
        new = obj
    return _answer(server, request, dry, _scale_object(new))


def _scale_object(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    labels = ((obj.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion", "1000"),
        },
        "spec": {"replicas": int(obj["spec"].get("replicas", 1))},
        "status": {
            "replicas": int((obj.get("status") or {}).get("replicas", 0)),
            "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
        },
    }


async def _delete_pod(server: KubernetesSnapshotServer, request: web.Request) -> web.Response:
    try:
        dry = _dry_run(request)
        pod = _find(server, "pods", request.match_info["ns"], request.match_info["name"])
    except Invalid as exc:
        return _refused(server, request, exc)
    answer = {"kind": "Pod", "apiVersion": "v1", **copy.deepcopy(pod)}
    if dry:
        return _answer(server, request, True, answer)
    server.pods.remove(pod)
    owners = [o for o in pod["metadata"].get("ownerReferences", []) if o.get("kind") == "ReplicaSet"]
    if owners:  # the ReplicaSet controller makes a new pod in its place
        fresh = copy.deepcopy(pod)
        suffix = hashlib.sha256(f"{pod['metadata']['name']}{time.time_ns()}".encode()).hexdigest()[:5]
        fresh["metadata"]["name"] = f"{owners[0]['name']}-{suffix}"
        fresh["metadata"]["uid"] = f"uid-{fresh['metadata']['name']}"
        server.pods.append(fresh)
    return _answer(server, request, False, answer)
