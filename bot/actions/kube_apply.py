"""The write side of Kubernetes: the one module that sends PATCH and DELETE, on credentials of its
own (``[actions] kubeconfig`` or ``service_account_token``), never the read-only ones of
:mod:`bot.context.kube_read`, and never reachable from the engine, the tools or the prompt.

Every action is run twice the same way: first as a server-side dry run (``dryRun=All``: the API
server runs admission and validation and answers the object as it would be, storing nothing),
whose difference from the object now is what the card shows; then, after a person approved, for
real. Requests are what kubectl sends:

- rollout restart: a strategic-merge patch of the pod template's
  ``kubectl.kubernetes.io/restartedAt`` annotation (``kubectl rollout restart``);
- roll back: the chosen ReplicaSet's pod template (its ``pod-template-hash`` label removed) put
  back into the Deployment by a JSON patch (``kubectl rollout undo --to-revision``);
- scale: a merge patch of ``spec.replicas`` on the ``/scale`` subresource (``kubectl scale``);
- delete a pod: ``DELETE`` (its controller makes a new one);
- cordon / uncordon: a strategic-merge patch of the node's ``spec.unschedulable``.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from bot.actions.catalog import ActionSpec, resource_path
from bot.config import ActionsSettings
from bot.errors import OpsbotError

logger = logging.getLogger(__name__)

Obj = dict[str, Any]
STRATEGIC = "application/strategic-merge-patch+json"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"
REVISION = "deployment.kubernetes.io/revision"
_NOISE = ("managedFields", "resourceVersion", "generation", "uid", "creationTimestamp", "selfLink")
_SA_CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"


class ApplyError(OpsbotError, RuntimeError):
    """A dry run or an apply was refused or failed; the text is the API server's reason."""


@dataclass
class Applied:
    """What one run (dry or real) did."""

    diff: str
    """Unified diff of the object before and after (what the card shows)."""
    summary: str
    """One line: the change in words (``replicas 3 -> 0``)."""
    before: Obj | None
    after: Obj | None
    inverse: ActionSpec | None
    """The action that undoes this one, where one exists (offered after applying)."""


class KubeApply:
    """PATCH / DELETE against one API server with the actions identity."""

    def __init__(self, settings: ActionsSettings) -> None:
        self.settings = settings
        self._api: client.ApiClient | None = None
        self._lock = asyncio.Lock()

    async def _client(self) -> client.ApiClient:
        async with self._lock:
            if self._api is None:
                configuration = client.Configuration()
                s = self.settings
                try:
                    if s.kubeconfig is not None:
                        await config.load_kube_config(
                            config_file=str(s.kubeconfig),
                            context=s.context,
                            client_configuration=configuration,
                            persist_config=False,
                        )
                    elif s.service_account_token is not None:
                        # The pod's own token is the read-only account; this one is projected beside it.
                        loader = config.incluster_config.InClusterConfigLoader(
                            token_filename=str(s.service_account_token), cert_filename=_SA_CA
                        )
                        loader.load_and_set(client_configuration=configuration)  # type: ignore[no-untyped-call]
                    else:
                        raise ApplyError(
                            "no write credentials: set actions.kubeconfig or actions.service_account_token"
                        )
                except (ConfigException, OSError, ValueError) as exc:
                    raise ApplyError(f"cannot load the actions credentials: {exc}") from exc
                self._api = client.ApiClient(configuration=configuration)
            return self._api

    async def close(self) -> None:
        """Close the connection pool."""
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        content_type: str = "application/json",
        query: dict[str, str] | None = None,
        dry_run: bool = False,
    ) -> Obj | None:
        """One API call as JSON; ``None`` for a 404 on GET; :class:`ApplyError` for any other failure."""
        api = await self._client()
        params = list((query or {}).items())
        if dry_run:
            params.append(("dryRun", "All"))
        if method in ("PATCH", "POST", "PUT"):
            params.append(("fieldManager", "opsbot-actions"))
        try:
            response = await api.call_api(
                path,
                method,
                query_params=params,
                header_params={"Accept": "application/json", "Content-Type": content_type},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=self.settings.timeout_s,
            )
            async with response:
                text = (await response.read()).decode("utf-8", errors="replace")
                status = response.status
        except ApiException as exc:
            if exc.status == 404 and method == "GET":
                return None
            raise ApplyError(_status_text(method, path, exc.status, str(exc.body or exc.reason))) from exc
        except (TimeoutError, OSError) as exc:
            raise ApplyError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if status == 404 and method == "GET":
            return None
        if not 200 <= status <= 299:
            raise ApplyError(_status_text(method, path, status, text))
        try:
            data = json.loads(text) if text else {}
        except ValueError as exc:
            raise ApplyError(f"{method} {path}: not JSON: {text[:200]!r}") from exc
        return data if isinstance(data, dict) else {}

    async def run(self, spec: ActionSpec, *, dry_run: bool) -> Applied:
        """Run ``spec`` (as a server-side dry run when ``dry_run``); what changed."""
        path = resource_path(spec)
        p = spec.params
        before = await self.call("GET", path)
        if before is None:
            raise ApplyError(f"{spec.target} does not exist")
        if spec.action == "rollout_restart":
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            patch = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now}}}}}
            after = await self.call("PATCH", path, body=patch, content_type=STRATEGIC, dry_run=dry_run)
            return _applied(before, after, f"pod template annotation {RESTARTED_AT} = {now}", None)
        if spec.action == "rollback":
            return await self._rollback(spec, path, before, dry_run)
        if spec.action == "scale":
            old = int((before.get("spec") or {}).get("replicas", 1))
            patch = {"spec": {"replicas": p["replicas"]}}
            scale = await self.call("PATCH", path + "/scale", body=patch, content_type=MERGE, dry_run=dry_run)
            new = int(((scale or {}).get("spec") or {}).get("replicas", p["replicas"]))
            after = json.loads(json.dumps(before))
            after.setdefault("spec", {})["replicas"] = new
            inverse = ActionSpec("scale", {**p, "replicas": old}) if old != new else None
            return _applied(before, after, f"replicas {old} -> {new}", inverse)
        if spec.action == "delete_pod":
            await self.call("DELETE", path, dry_run=dry_run)
            owners = [
                o.get("kind", "?") + "/" + o.get("name", "?")
                for o in _meta(before).get("ownerReferences", [])
            ]
            why = (
                f"its controller {', '.join(owners)} creates a new one"
                if owners
                else "a bare pod: nothing recreates it"
            )
            diff = "".join(f"- {line}\n" for line in _lines(before)[:40])
            return Applied(diff, f"pod {p['name']} deleted ({why})", before, None, None)
        if spec.action in ("cordon", "uncordon"):
            cordon = spec.action == "cordon"
            node_patch = {"spec": {"unschedulable": cordon}}
            after = await self.call("PATCH", path, body=node_patch, content_type=STRATEGIC, dry_run=dry_run)
            inverse = ActionSpec("uncordon" if cordon else "cordon", dict(p))
            return _applied(before, after, f"spec.unschedulable = {str(cordon).lower()}", inverse)
        raise ApplyError(f"{spec.action} is not a Kubernetes action")

    async def _rollback(self, spec: ActionSpec, path: str, deploy: Obj, dry_run: bool) -> Applied:
        """What ``kubectl rollout undo`` does: find the ReplicaSet of the revision, patch its template in."""
        ns = spec.params["namespace"]
        uid = _meta(deploy).get("uid")
        listed = await self.call("GET", f"/apis/apps/v1/namespaces/{ns}/replicasets") or {}
        name = spec.params["name"]

        def owns(o: Obj) -> bool:
            return bool(o.get("uid") == uid or (o.get("kind") == "Deployment" and o.get("name") == name))

        owned = [
            rs for rs in listed.get("items", []) if any(owns(o) for o in _meta(rs).get("ownerReferences", []))
        ]
        revisions = {_revision(rs): rs for rs in owned if _revision(rs) > 0}
        current = _revision(deploy)
        wanted = int(spec.params.get("revision") or 0)
        if wanted == 0:
            older = [r for r in revisions if r < current]
            if not older:
                raise ApplyError(f"{spec.target}: no revision before {current} to roll back to")
            wanted = max(older)
        if wanted not in revisions:
            known = ", ".join(map(str, sorted(revisions))) or "none"
            raise ApplyError(f"{spec.target}: no revision {wanted} (known: {known})")
        if wanted == current:
            raise ApplyError(f"{spec.target} is already at revision {wanted}")
        template = json.loads(json.dumps((revisions[wanted].get("spec") or {}).get("template") or {}))
        (template.get("metadata") or {}).get("labels", {}).pop("pod-template-hash", None)
        patch = [{"op": "replace", "path": "/spec/template", "value": template}]
        after = await self.call("PATCH", path, body=patch, content_type=JSON_PATCH, dry_run=dry_run)
        inverse = (
            ActionSpec("rollback", {**spec.params, "revision": current}) if current in revisions else None
        )
        return _applied(deploy, after, f"pod template of revision {wanted} (now at {current})", inverse)


def _applied(before: Obj, after: Obj | None, summary: str, inverse: ActionSpec | None) -> Applied:
    return Applied(object_diff(before, after or {}), summary, before, after, inverse)


def object_diff(before: Obj, after: Obj) -> str:
    """Unified diff of two versions of an object, without the fields every write changes."""
    lines = difflib.unified_diff(_lines(before), _lines(after), "now", "after", n=2, lineterm="")
    return "\n".join(list(lines)[2:])  # the two file-name lines say nothing here


def _lines(obj: Obj) -> list[str]:
    clean = {k: v for k, v in obj.items() if k != "status"}
    meta = {k: v for k, v in _meta(obj).items() if k not in _NOISE}
    clean["metadata"] = meta
    return json.dumps(clean, indent=1, sort_keys=True).splitlines()


def _meta(obj: Obj) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _revision(obj: Obj) -> int:
    try:
        return int((_meta(obj).get("annotations") or {}).get(REVISION, 0))
    except (TypeError, ValueError):
        return 0


def _status_text(method: str, path: str, status: int, body: str) -> str:
    try:
        message = json.loads(body).get("message") or body
    except (ValueError, AttributeError):
        message = body
    return f"{method} {path}: HTTP {status}: {str(message)[:300]}"
