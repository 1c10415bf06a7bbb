"""After an action is applied: watch what it touched for at most ``actions.verify_s`` and say how
it ended, in words a person reads in the thread.

- a restart, roll back or scale: the rollout is complete when the controller has seen the new
  generation and every replica is updated and available (what ``kubectl rollout status`` waits
  for: ``observedGeneration``, ``updatedReplicas``, ``availableReplicas``; a StatefulSet's
  ``currentRevision == updateRevision``; a DaemonSet's ``updatedNumberScheduled``);
- a deleted pod: gone, or replaced by one with another uid;
- a cordon / uncordon: the node's ``spec.unschedulable`` says so;
- a silence: ``active`` (created) or ``expired``.

Then, where an Alertmanager is configured, the alerts still firing for what the action touched
(:func:`alerts_after`): the namespace's alerts naming the workload or pod, or the node's.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from bot.actions.catalog import ActionSpec, resource_path
from bot.actions.kube_apply import ApplyError, KubeApply
from bot.actions.silences import Silences


@dataclass
class Outcome:
    """What verification saw."""

    ok: bool
    text: str
    waited_s: float


async def verify(
    spec: ActionSpec,
    kube: KubeApply,
    silences: Silences,
    *,
    window_s: float,
    poll_s: float,
    silence_id: str | None = None,
) -> Outcome:
    """Look every ``poll_s`` until ``spec``'s effect is seen or ``window_s`` passes."""
    started = time.monotonic()
    last = "not looked yet"
    while True:
        try:
            done, last = await _look(spec, kube, silences, silence_id)
        except ApplyError as exc:
            done, last = False, f"could not read it: {exc}"
        waited = time.monotonic() - started
        if done:
            return Outcome(True, last, waited)
        if waited + poll_s > window_s:
            return Outcome(False, f"not done after {window_s:.0f} s: {last}", waited)
        await asyncio.sleep(poll_s)


async def _look(
    spec: ActionSpec, kube: KubeApply, silences: Silences, silence_id: str | None
) -> tuple[bool, str]:
    p = spec.params
    if spec.action == "silence":
        silence = await silences.call("GET", f"/silence/{silence_id}") if silence_id else None
        state = ((silence or {}).get("status") or {}).get("state", "missing")
        return state == "active", f"silence {silence_id} is {state}"
    if spec.action == "expire_silence":
        silence = await silences.call("GET", f"/silence/{p['silence_id']}")
        state = ((silence or {}).get("status") or {}).get("state", "missing")
        return state == "expired", f"silence {p['silence_id']} is {state}"
    obj = await kube.call("GET", resource_path(spec))
    if spec.action == "delete_pod":
        return obj is None, "pod is gone" if obj is None else "pod still exists (terminating)"
    if obj is None:
        return False, f"{spec.target} is gone"
    if spec.action in ("cordon", "uncordon"):
        want = spec.action == "cordon"
        now = bool((obj.get("spec") or {}).get("unschedulable", False))
        return now == want, f"node {p['name']} is {'cordoned' if now else 'schedulable'}"
    return rollout_done(p["kind"], obj)


def rollout_done(kind: str, obj: dict[str, Any]) -> tuple[bool, str]:
    """Whether a workload's rollout is complete, and a line saying where it stands."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    generation = int((obj.get("metadata") or {}).get("generation", 0))
    observed = int(status.get("observedGeneration", 0))
    if kind == "daemonset":
        want = int(status.get("desiredNumberScheduled", 0))
        updated = int(status.get("updatedNumberScheduled", 0))
        available = int(status.get("numberAvailable", 0))
        done = observed >= generation and updated == want and available == want
        return done, f"{updated}/{want} updated, {available} available"
    want = int(spec.get("replicas", 1))
    updated = int(status.get("updatedReplicas", 0))
    available = int(status.get("availableReplicas", status.get("readyReplicas", 0)))
    total = int(status.get("replicas", 0))
    done = observed >= generation and updated == want and available == want and total == want
    if kind == "statefulset":
        done = done and status.get("currentRevision") == status.get("updateRevision")
    return (
        done,
        f"{updated}/{want} updated, {available} available, {total} total "
        f"(generation {observed}/{generation})",
    )


async def alerts_after(spec: ActionSpec, silences: Silences) -> str | None:
    """A line on the alerts still firing (unsilenced) for what ``spec`` touched, or ``None`` when
    that cannot be said (no Alertmanager, a silence action, Alertmanager unreachable)."""
    if not silences.settings.alertmanager_url or not spec.is_kubernetes:
        return None
    p = spec.params
    filters = [("active", "true"), ("silenced", "false"), ("inhibited", "false")]
    if p["kind"] == "node":
        filters.append(("filter", f'node="{p["name"]}"'))
    else:
        filters.append(("filter", f'namespace="{p["namespace"]}"'))
    try:
        alerts = await silences.call("GET", "/alerts", params=filters) or []
    except ApplyError as exc:
        return f"alerts unknown: {exc}"
    name = str(p["name"])
    mine = [
        a
        for a in alerts
        if p["kind"] == "node"
        or any(str(v) == name or str(v).startswith(name + "-") for v in (a.get("labels") or {}).values())
    ]
    if not mine:
        return f"no alert is firing for {spec.target}"
    names = sorted({str((a.get("labels") or {}).get("alertname", "?")) for a in mine})
    return f"{len(mine)} alert(s) still firing for {spec.target}: {', '.join(names[:5])}"
