"""Read-only Kubernetes API access as plain JSON: list and get calls, logs, each counted and bounded.

The generated models of kubernetes-asyncio cost about a millisecond per pod to build; a cluster of a
few thousand pods would spend the whole context deadline on deserialising. So the client is used
for what it is good at (kubeconfig, in-cluster credentials, TLS, auth refresh) and the answers are
read as JSON dicts, in the API's own field names.

Only GET is ever sent (``deploy/base/rbac.yaml`` grants get / list / watch); Secrets and ConfigMaps are
not among the resources this module knows, so no code path can read one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
"""One API object as JSON (``metadata``, ``spec``, ``status`` ...)."""

RESOURCES: dict[str, tuple[str, bool]] = {
    "pods": ("/api/v1", True),
    "events": ("/api/v1", True),
    "nodes": ("/api/v1", False),
    "namespaces": ("/api/v1", False),
    "services": ("/api/v1", True),
    "persistentvolumeclaims": ("/api/v1", True),
    "persistentvolumes": ("/api/v1", False),
    "deployments": ("/apis/apps/v1", True),
    "statefulsets": ("/apis/apps/v1", True),
    "daemonsets": ("/apis/apps/v1", True),
    "replicasets": ("/apis/apps/v1", True),
    "endpointslices": ("/apis/discovery.k8s.io/v1", True),
    "storageclasses": ("/apis/storage.k8s.io/v1", False),
    "horizontalpodautoscalers": ("/apis/autoscaling/v2", True),
    "jobs": ("/apis/batch/v1", True),
    "cronjobs": ("/apis/batch/v1", True),
}
"""Every resource opsbot lists or gets: API prefix and whether it is namespaced. Never ``secrets``
nor ``configmaps`` (both may hold credentials; ``deploy/base/rbac.yaml`` grants neither): a pod's
references to them are read from its own spec (a referenced ConfigMap's values only as
:data:`OPT_IN_RESOURCES` allows)."""

OPT_IN_RESOURCES: dict[str, tuple[str, bool]] = {
    "configmaps": ("/api/v1", True),
}
"""Resources read only when a setting asks for them (``kubernetes.read_configmaps``), one object at a
time, and only where opsbot's Role grants ``get`` (``deploy/base/rbac.yaml`` does not): a 403 is remembered
in :attr:`KubeReader.denied`, not reported as a failure. Never ``secrets``."""


def api_error(exc: BaseException) -> str:
    """One line for a failed call (``HTTP 403 Forbidden: ...``)."""
    if isinstance(exc, ApiException):
        body = exc.body[:300] if isinstance(exc.body, str) else ""
        return f"HTTP {exc.status} {exc.reason}: {body}".strip()
    return f"{type(exc).__name__}: {exc}"


@dataclass(slots=True)
class CallLog:
    """What one gathering asked of the API: queries for the footer, partial failures, the count."""

    queries: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    calls: int = 0


class KubeReader:
    """GET calls against one API server, as JSON, each within ``timeout_s``."""

    def __init__(self, api: client.ApiClient, *, timeout_s: float, list_limit: int) -> None:
        self.api = api
        self.timeout_s = timeout_s
        self.list_limit = list_limit
        self.log = CallLog()
        self.denied: set[str] = set()
        """Opt-in resources (:data:`OPT_IN_RESOURCES`) that answered 403: not granted, not broken."""

    async def get_json(self, path: str, query: Mapping[str, str | int | bool] | None = None) -> Any:
        """``GET path`` parsed as JSON; :class:`ApiException` for a non-2xx answer."""
        text = await self._get(path, query, accept="application/json")
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ApiException(status=0, reason=f"not JSON from {path}: {text[:200]!r}") from exc

    async def _get(self, path: str, query: Mapping[str, str | int | bool] | None, accept: str) -> str:
        self.log.calls += 1
        params = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()]
        response = await self.api.call_api(
            path,
            "GET",
            query_params=params,
            header_params={"Accept": accept},
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=self.timeout_s,
        )
        async with response:
            data = await response.read()
            text = bytes(data).decode("utf-8", errors="replace")
            if not 200 <= response.status <= 299:
                error = ApiException(status=response.status, reason=response.reason)
                error.body = text  # type: ignore[assignment]  # what callers read (api_error)
                raise error
        return text

    async def list_kind(
        self,
        resource: str,
        namespaces: Iterable[str] | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[Obj]:
        """Items of ``resource`` in ``namespaces`` (one call each, concurrently) or in all of them
        (``None``, and always for cluster-scoped resources); one page per call, a cut is noted."""
        prefix, namespaced = RESOURCES[resource]
        query: dict[str, str | int | bool] = {"limit": self.list_limit}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        spaces = list(namespaces) if namespaces is not None and namespaced else None
        if spaces is None:
            self.log.queries.append(f"list {resource}" + (" (all namespaces)" if namespaced else ""))
            paths = [f"{prefix}/{resource}"]
        else:
            self.log.queries.append(f"list {resource} in {','.join(spaces)}")
            paths = [f"{prefix}/namespaces/{ns}/{resource}" for ns in spaces]
        answers = await asyncio.gather(*(self.get_json(p, query) for p in paths))
        if any((a.get("metadata") or {}).get("continue") for a in answers):
            self.log.errors.append(f"{resource}: only the first {self.list_limit} per namespace were read")
        return [item for answer in answers for item in answer.get("items") or []]

    async def optional_kind(
        self, resource: str, namespaces: Iterable[str] | None = None, **kwargs: Any
    ) -> list[Obj]:
        """:meth:`list_kind`, with a failure (403 to a namespaced Role, 404 on an old cluster) noted
        instead of raised."""
        try:
            return await self.list_kind(resource, namespaces, **kwargs)
        except ApiException as exc:
            self.log.errors.append(f"{resource}: {api_error(exc)}")
            return []

    async def get(self, resource: str, namespace: str | None, name: str) -> Obj | None:
        """One object, or ``None`` when it does not exist (a failure is noted; a 403 on an opt-in
        resource is only remembered in :attr:`denied`)."""
        opt_in = resource in OPT_IN_RESOURCES
        prefix, namespaced = OPT_IN_RESOURCES[resource] if opt_in else RESOURCES[resource]
        where = f"/namespaces/{namespace}" if namespaced and namespace else ""
        self.log.queries.append(f"get {resource} {namespace + '/' if namespace else ''}{name}")
        try:
            found: Obj = await self.get_json(f"{prefix}{where}/{resource}/{name}")
        except ApiException as exc:
            if opt_in and exc.status == 403:
                self.denied.add(resource)
            elif exc.status != 404:
                self.log.errors.append(f"{resource} {name}: {api_error(exc)}")
            return None
        return found

    async def log_head(
        self, namespace: str, pod: str, container: str, *, previous: bool, limit_bytes: int
    ) -> str:
        """The first ``limit_bytes`` of a container's log (no ``tailLines``: the API then answers from
        the start); empty when it has none."""
        return await self.log_text(
            namespace, pod, container, previous=previous, tail_lines=None, limit_bytes=limit_bytes
        )

    async def log_text(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        previous: bool,
        tail_lines: int | None,
        limit_bytes: int,
        since_seconds: int | None = None,
    ) -> str:
        """A container's log (its last ``tail_lines`` lines, at most ``limit_bytes``; ``tail_lines``
        ``None``: its first ``limit_bytes``); empty when it has none (a container that never started
        is a fact, not a failure)."""
        part = f"tail {tail_lines}" if tail_lines is not None else f"head {limit_bytes} bytes"
        self.log.queries.append(f"log {namespace}/{pod}/{container}{' previous' if previous else ''} {part}")
        query: dict[str, str | int | bool] = {"container": container, "previous": previous}
        if tail_lines is not None:
            query["tailLines"] = tail_lines
        query["limitBytes"] = limit_bytes
        if since_seconds is not None:
            query["sinceSeconds"] = since_seconds
        try:
            return await self._get(f"/api/v1/namespaces/{namespace}/pods/{pod}/log", query, accept="*/*")
        except ApiException as exc:
            if exc.status not in (400, 404):
                self.log.errors.append(f"log {namespace}/{pod}/{container}: {api_error(exc)}")
            return ""
