"""Kubernetes tools: objects, events, logs, rollouts and nodes, read through the gathering's client.

Every call goes through :class:`~bot.context.kube_read.KubeReader` (GET only; Secrets and ConfigMaps
are not among the resources it knows) on the cluster's own :class:`KubernetesProvider` client, and
through the one-line renderings of :mod:`bot.context.kube_objects` that the gathered sections use,
so a tool's output reads like step 0's data. Namespaces are checked against the channel's scope
before any call; a node's pods are listed only from namespaces in scope.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from bot.context import kube_objects as ko
from bot.context.kube_read import KubeReader, Obj, api_error
from bot.context.kubernetes import KubernetesProvider
from bot.tools.base import (
    ClusterTools,
    Tool,
    ToolError,
    ToolOutput,
    ToolScope,
    cluster_arg,
    int_arg,
    integer,
    obj,
    object_name,
    string,
    text_arg,
)

KINDS: dict[str, str] = {
    "pod": "pods",
    "deployment": "deployments",
    "statefulset": "statefulsets",
    "daemonset": "daemonsets",
    "replicaset": "replicasets",
    "service": "services",
    "node": "nodes",
    "job": "jobs",
    "cronjob": "cronjobs",
    "hpa": "horizontalpodautoscalers",
    "pvc": "persistentvolumeclaims",
    "pv": "persistentvolumes",
    "namespace": "namespaces",
    "storageclass": "storageclasses",
}
"""The kinds a call may name, and their API resources (never Secrets or ConfigMaps)."""

_LINES: dict[str, Any] = {
    "pods": ko.pod_line,
    "deployments": ko.deployment_line,
    "statefulsets": ko.statefulset_line,
    "daemonsets": ko.daemonset_line,
    "replicasets": ko.replicaset_line,
    "nodes": ko.node_line,
    "jobs": ko.job_line,
    "cronjobs": ko.cronjob_line,
    "horizontalpodautoscalers": ko.hpa_line,
    "persistentvolumeclaims": ko.pvc_line,
    "persistentvolumes": ko.pv_line,
    "storageclasses": ko.storageclass_line,
}
_MAX_LISTED = 40
_LOG_LIMIT_BYTES = 256 * 1024


def _namespace_arg(scope: ToolScope, description: str = "Namespace.") -> dict[str, Any]:
    return string(description, enum=scope.namespaces() or None)


class _KubeTool(Tool):
    """A tool over one cluster's Kubernetes API."""

    def available(self, scope: ToolScope) -> bool:
        """Offered when some cluster in scope has a Kubernetes provider."""
        return any(c.provider(KubernetesProvider) is not None for c in scope.clusters)

    async def _reader(
        self, scope: ToolScope, arguments: Mapping[str, Any]
    ) -> tuple[ClusterTools, KubeReader]:
        cluster = scope.cluster(text_arg(arguments, "cluster") or None)
        scope.check_namespace(cluster, text_arg(arguments, "namespace") or None)
        provider = cluster.provider(KubernetesProvider)
        if provider is None:
            raise ToolError(f"cluster {cluster.name} has no Kubernetes API configured")
        try:
            return cluster, await provider.reader()
        except Exception as exc:  # kubeconfig / in-cluster configuration errors
            raise ToolError(f"cannot reach the Kubernetes API of {cluster.name}: {exc}") from exc

    @staticmethod
    def _source(cluster: ClusterTools) -> str:
        return f"Kubernetes {cluster.name}"

    @staticmethod
    def _in_scope(cluster: ClusterTools, items: Sequence[Obj]) -> list[Obj]:
        if cluster.namespaces is None:
            return list(items)
        return [i for i in items if not ko.namespace(i) or ko.namespace(i) in cluster.namespaces]


class KubeGet(_KubeTool):
    """List objects of a kind, or one object as a describe-like summary."""

    name = "kube_get"
    description = (
        "List Kubernetes objects of a kind in a namespace, or describe one object by name "
        "(status, containers, restarts, conditions)."
    )

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """kind, namespace, name (optional), cluster (optional)."""
        return obj(
            {
                "kind": string("Object kind.", enum=list(KINDS)),
                "namespace": _namespace_arg(scope, "Namespace (namespaced kinds)."),
                "name": string("Object name; empty lists them all."),
                "cluster": cluster_arg(scope),
            },
            required=["kind", "namespace", "name"],
        )

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """Its list or its summary."""
        kind = text_arg(arguments, "kind").lower()
        resource = KINDS.get(kind)
        if resource is None:
            raise ToolError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
        namespace = text_arg(arguments, "namespace")
        name = object_name(text_arg(arguments, "name"), namespace, kind)
        cluster, reader = await self._reader(scope, arguments)
        try:
            if name:
                found = await reader.get(resource, namespace or None, name)
                if found is None:
                    raise ToolError(
                        f"{kind} {namespace + '/' if namespace else ''}{name} not found"
                        + (f" ({'; '.join(reader.log.errors)})" if reader.log.errors else "")
                    )
                if ko.namespace(found) and cluster.namespaces is not None:
                    scope.check_namespace(cluster, ko.namespace(found))
                lines = _describe(resource, found)
                summary = lines[0] if lines else f"{kind} {name}"
            else:
                spaces = (
                    [namespace] if namespace else list(cluster.namespaces) if cluster.namespaces else None
                )
                items = self._in_scope(cluster, await reader.list_kind(resource, spaces))
                render = _LINES.get(resource, _generic_line)
                lines = [render(i) for i in items[:_MAX_LISTED]]
                if len(items) > _MAX_LISTED:
                    lines.append(f"[{len(items) - _MAX_LISTED} more {resource} not listed]")
                summary = f"{len(items)} {resource}"
                if not items:
                    lines = [f"no {resource} in {namespace or 'scope'}"]
        except ApiException as exc:
            raise ToolError(api_error(exc)) from exc
        return ToolOutput("\n".join(lines), self._source(cluster), summary, reader.log.queries)


class KubeEvents(_KubeTool):
    """Events of one object, or of a namespace, newest last."""

    name = "kube_events"
    description = "Kubernetes events (warnings and normal) of one object, or of a whole namespace."

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """namespace, name (optional), cluster (optional)."""
        return obj(
            {
                "namespace": _namespace_arg(scope),
                "name": string("Name of the object the events are about; empty: the whole namespace."),
                "cluster": cluster_arg(scope),
            },
            required=["namespace", "name"],
        )

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """The events, oldest first."""
        namespace = text_arg(arguments, "namespace")
        name = object_name(text_arg(arguments, "name"), namespace)
        cluster, reader = await self._reader(scope, arguments)
        selector = f"involvedObject.name={name}" if name else None
        spaces = [namespace] if namespace else list(cluster.namespaces) if cluster.namespaces else None
        try:
            events = await reader.list_kind("events", spaces, field_selector=selector)
        except ApiException as exc:
            raise ToolError(api_error(exc)) from exc
        events = sorted(self._in_scope(cluster, events), key=ko.event_time)
        lines = [ko.event_line(e) for e in events[-_MAX_LISTED:]]
        if len(events) > _MAX_LISTED:
            lines.insert(0, f"[{len(events) - _MAX_LISTED} older events not listed]")
        where = f"{namespace}/{name}" if name else namespace or "scope"
        return ToolOutput(
            "\n".join(lines) or f"no events for {where}",
            self._source(cluster),
            f"{len(events)} events of {where}",
            reader.log.queries,
        )


class KubeLogs(_KubeTool):
    """A container's log: current or previous, a tail, a time window, lines matching a word."""

    name = "kube_logs"
    description = (
        "Log lines of a pod's container: the current or the previous (crashed) run, the last N lines, "
        "optionally only lines containing a word."
    )

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """namespace, pod, container, previous, tail, since_minutes, grep, cluster."""
        return obj(
            {
                "namespace": _namespace_arg(scope),
                "pod": string("Pod name."),
                "previous": {"type": "boolean", "description": "The previous (crashed) container's log."},
                "tail": integer("Last lines to read.", 1, 500),
                "grep": string("Keep only lines containing this text (case-insensitive); empty: all.", 40),
                "container": string("Container; empty: the first."),
                "since_minutes": integer("Only lines of the last N minutes (0: no limit).", 0, 1440),
                "cluster": cluster_arg(scope),
            },
            required=["namespace", "pod", "previous", "tail", "grep"],
        )

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """The log lines (redaction and the cap are the registry's)."""
        namespace = text_arg(arguments, "namespace")
        pod_name = object_name(text_arg(arguments, "pod"), namespace, "pod")
        if not namespace or not pod_name:
            raise ToolError("kube_logs needs a namespace and a pod")
        previous = bool(arguments.get("previous", False))
        tail = int_arg(arguments, "tail", 100, 1, 500)
        since = int_arg(arguments, "since_minutes", 0, 0, 1440)
        grep = text_arg(arguments, "grep").lower()
        cluster, reader = await self._reader(scope, arguments)
        container = text_arg(arguments, "container")
        try:
            pod = await reader.get("pods", namespace, pod_name)
        except ApiException as exc:
            raise ToolError(api_error(exc)) from exc
        if pod is None:
            raise ToolError(f"pod {namespace}/{pod_name} not found")
        names = [str(c.get("name")) for c in (ko.spec(pod).get("containers") or [])]
        if not container:
            container = names[0] if names else ""
        elif names and container not in names:
            raise ToolError(f"pod {pod_name} has no container {container} (it has {', '.join(names)})")
        text = await reader.log_text(
            namespace,
            pod_name,
            container,
            previous=previous,
            tail_lines=tail if not grep else max(tail, 500),
            limit_bytes=_LOG_LIMIT_BYTES,
            since_seconds=since * 60 if since else None,
        )
        lines = text.splitlines()
        if grep:
            lines = [line for line in lines if grep in line.lower()][-tail:]
        which = f"{namespace}/{pod_name}/{container}{' (previous)' if previous else ''}"
        if reader.log.errors:
            raise ToolError("; ".join(reader.log.errors))
        body = "\n".join(lines) or f"no log lines{' containing ' + repr(grep) if grep else ''} in {which}"
        return ToolOutput(
            body, self._source(cluster), f"{len(lines)} log lines of {which}", reader.log.queries
        )


class KubeRollout(_KubeTool):
    """A Deployment's revisions (its ReplicaSets) and what changed in the newest template."""

    name = "kube_rollout"
    description = (
        "Rollout history of a Deployment: its revisions, images, and what changed between the last two."
    )

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """namespace, deployment, cluster."""
        return obj(
            {
                "namespace": _namespace_arg(scope),
                "deployment": string("Deployment name."),
                "cluster": cluster_arg(scope),
            },
            required=["namespace", "deployment"],
        )

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """Revisions, newest first, and the template diff."""
        namespace = text_arg(arguments, "namespace")
        name = object_name(text_arg(arguments, "deployment"), namespace, "deployment")
        cluster, reader = await self._reader(scope, arguments)
        try:
            deployment = await reader.get("deployments", namespace, name)
            if deployment is None:
                raise ToolError(f"deployment {namespace}/{name} not found")
            replicasets = await reader.list_kind("replicasets", [namespace])
        except ApiException as exc:
            raise ToolError(api_error(exc)) from exc
        owned = [rs for rs in replicasets if ("Deployment", name) in ko.owners(rs)]
        owned.sort(key=ko.revision, reverse=True)
        lines = [ko.deployment_line(deployment)]
        lines += [f"revision {ko.revision(rs)}: {ko.replicaset_line(rs)}" for rs in owned[:10]]
        if len(owned) >= 2:
            diff = ko.template_diff(ko.spec(owned[0]).get("template"), ko.spec(owned[1]).get("template"))
            lines.append(f"changes revision {ko.revision(owned[1])} -> {ko.revision(owned[0])}:")
            lines += [f"  {change}" for change in diff] or ["  none in the pod template"]
        return ToolOutput(
            "\n".join(lines), self._source(cluster), f"{len(owned)} revisions of {name}", reader.log.queries
        )


class KubeNode(_KubeTool):
    """A node's conditions and capacity, and its pods by what they request."""

    name = "kube_node"
    description = "A node's conditions, capacity and its top pods by memory and CPU requests, with restarts."

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """node, cluster."""
        return obj({"node": string("Node name."), "cluster": cluster_arg(scope)}, required=["node"])

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """The node line, capacity, and its pods in scope."""
        name = object_name(text_arg(arguments, "node"), kind="node")
        cluster, reader = await self._reader(scope, arguments)
        try:
            node = await reader.get("nodes", None, name)
            if node is None:
                raise ToolError(f"node {name} not found")
            pods = await reader.list_kind("pods", cluster.namespaces, field_selector=f"spec.nodeName={name}")
        except ApiException as exc:
            raise ToolError(api_error(exc)) from exc
        pods = self._in_scope(cluster, pods)
        st = ko.status(node)
        lines = [ko.node_line(node)]
        for what in ("capacity", "allocatable"):
            values = st.get(what) or {}
            shown = ", ".join(
                f"{k} {values[k]}" for k in ("cpu", "memory", "pods", "ephemeral-storage") if k in values
            )
            if shown:
                lines.append(f"{what}: {shown}")
        pods.sort(key=lambda p: (ko.requests_of(p, "memory"), ko.requests_of(p, "cpu")), reverse=True)
        lines.append(f"pods on {name} (in scope), by memory request:")
        for pod in pods[:15]:
            memory, cpu = ko.requests_of(pod, "memory"), ko.requests_of(pod, "cpu")
            limit = ko.limits_of(pod, "memory")
            lines.append(
                f"  {ko.namespace(pod)}/{ko.name(pod)}: requests {cpu:g} CPU, {memory / 2**20:.0f} MiB"
                + (f" (limit {limit / 2**20:.0f} MiB)" if limit else " (no memory limit)")
                + f", {ko.restarts(pod)} restarts"
            )
        return ToolOutput(
            "\n".join(lines), self._source(cluster), f"node {name}, {len(pods)} pods", reader.log.queries
        )


def _describe(resource: str, found: Obj) -> list[str]:
    """A describe-like summary: the object's line, then what ``kubectl describe`` leads with."""
    render = _LINES.get(resource, _generic_line)
    lines = [render(found)]
    if resource == "pods":
        lines += ko.pod_details(found)
    elif resource in ("deployments", "statefulsets", "daemonsets", "replicasets", "jobs"):
        template = ko.spec(found).get("template") or {}
        lines += ko.pod_spec_lines(template.get("spec") or {})
    for condition in ko.status(found).get("conditions") or []:
        if isinstance(condition, Mapping):
            message = ko.short(condition.get("message") or "", 200)
            lines.append(
                f"condition {condition.get('type')}={condition.get('status')}"
                + (f" ({condition.get('reason')})" if condition.get("reason") else "")
                + (f": {message}" if message else "")
            )
    return lines


def _generic_line(item: Obj) -> str:
    """A line for a kind without its own rendering (Services, Namespaces)."""
    where = f"{ko.namespace(item)}/" if ko.namespace(item) else ""
    spec = ko.spec(item)
    extra = []
    if spec.get("type"):
        extra.append(f"type {spec['type']}")
    if spec.get("selector") and isinstance(spec["selector"], Mapping):
        extra.append(
            "selector " + ",".join(f"{k}={v}" for k, v in spec["selector"].items() if isinstance(v, str))
        )
    ports = spec.get("ports")
    if isinstance(ports, list) and ports:
        extra.append("ports " + ",".join(str(p.get("port")) for p in ports if isinstance(p, Mapping)))
    phase = ko.status(item).get("phase")
    if phase:
        extra.append(str(phase))
    return f"{where}{ko.name(item)}" + (f": {'; '.join(extra)}" if extra else "")


def kubernetes_tools() -> list[Tool]:
    """Every Kubernetes tool."""
    return [KubeGet(), KubeEvents(), KubeLogs(), KubeRollout(), KubeNode()]
