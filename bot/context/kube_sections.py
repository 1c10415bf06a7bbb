"""The Kubernetes sections of a prompt, every line ranked (0: decisive ... 3: filler).

What :mod:`bot.context.kubernetes` gathered becomes: what the question was matched to; the pods in
question (then the other unhealthy ones, most broken first); their workloads' rollout with the
change cause and what the pod template changed; what they depend on and the cluster DNS; their
nodes and neighbours; their volumes; the ConfigMaps and Secrets they reference (names and keys);
events; pod details; logs by signature (identical replicas once). The budget keeps rank 0 of every
section before rank 1 of any, so the fact one hop away is not crowded out by a list of pods that
have nothing to do with the question.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.context import hops
from bot.context import kube_objects as ko
from bot.context.base import ContextSection, ranked_section
from bot.context.entities import Entities
from bot.context.kube_objects import Obj
from bot.context.kube_snapshot import Ref, Snapshot
from bot.context.logsig import CONTEXT, DECISIVE, ERROR, FILLER, Line, signature
from bot.context.matching import Focus
from bot.redact import redact

SOURCE = "Kubernetes"
_MAX_POD_LINES = 60
_MAX_EVENTS = 200
_MAX_REVISIONS = 5
_MAX_DETAILS = 3
_MAX_CONFIG_KEYS = 12
_MAX_SELECTLESS = 3
_MAX_CONFIG_VALUE = 160
_Lines = list[tuple[str, int]]


@dataclass(slots=True)
class LogStream:
    """One container log read: whose, which, and its condensed lines."""

    pod: Obj
    container: str
    previous: bool
    lines: list[Line] = field(default_factory=list)
    read: int = 0
    """Lines read before condensing."""
    ending: int = CONTEXT
    """Rank of the log's last lines (see :func:`bot.context.logsig.condense`)."""


@dataclass(slots=True)
class Gathered:
    """Everything one gathering read, for the sections."""

    snapshot: Snapshot
    focus: Focus
    top: list[Obj]
    """The pods in question whose logs and details were read (or, in ``overview``, the most broken)."""
    overview: bool
    """Nothing in the question matched: ``top`` are the most broken pods of the scope."""
    streams: list[LogStream]
    hop_streams: list[LogStream]
    plan: hops.Plan
    storage: list[Obj]
    """PersistentVolumes and StorageClasses behind the claims of ``top``."""
    scope: list[str] | None
    change_review: bool
    entities: Entities
    quiet: list[Obj] = field(default_factory=list)
    """With nothing named and nothing unhealthy: running pods whose logs were read for errors."""
    configmaps: list[Obj] = field(default_factory=list)
    """The ConfigMaps the pods in question reference, when ``kubernetes.read_configmaps`` is on."""
    configmap_values: str = ""
    """Why no ConfigMap values were read ("": they were, where the ConfigMap exists)."""


def build(g: Gathered) -> list[ContextSection]:
    """Every section with something to say."""
    makers = (
        _matched,
        _overview,
        _pods,
        _nodes,
        _storage,
        _dependencies,
        _workloads,
        _configs,
        _events,
        _details,
    )
    sections = [s for make in makers if (s := make(g)) is not None]
    sections += _log_sections(g, g.streams, hop=False)
    sections += _log_sections(g, g.hop_streams, hop=True)
    return sections


def _scope_text(g: Gathered) -> str:
    return ", ".join(g.scope) if g.scope else "all namespaces"


def _matched(g: Gathered) -> ContextSection | None:
    if not g.focus.matches:
        return None
    lines = [(m.describe(), DECISIVE) for m in g.focus.matches[:6]]
    return ranked_section(
        source=SOURCE,
        title="Names the question was matched to",
        lines=lines,
        priority=6,
        unit="more matches",
    )


def _overview(g: Gathered) -> ContextSection | None:
    if g.focus.pods and not g.overview:
        return None
    pods = g.snapshot.pods
    unhealthy = [p for p in pods if ko.pod_problems(p)]
    by_namespace: dict[str, dict[str, int]] = {}
    for pod in pods:
        phases = by_namespace.setdefault(ko.namespace(pod), {})
        phase = ko.status(pod).get("phase") or "Unknown"
        phases[phase] = phases.get(phase, 0) + 1
    bad: dict[str, int] = {}
    for pod in unhealthy:
        bad[ko.namespace(pod)] = bad.get(ko.namespace(pod), 0) + 1
    lines = [
        (
            f"{ns}: {sum(phases.values())} pods ("
            + ", ".join(f"{n} {phase}" for phase, n in sorted(phases.items()))
            + f"), {bad.get(ns, 0)} not healthy",
            ERROR if bad.get(ns) else FILLER,
        )
        for ns, phases in sorted(by_namespace.items(), key=lambda item: (-bad.get(item[0], 0), item[0]))
    ]
    return ranked_section(
        source=SOURCE,
        title=f"Cluster overview ({_scope_text(g)}): {len(pods)} pods, {len(unhealthy)} not healthy",
        lines=lines or [("no pods", CONTEXT)],
        priority=8,
        unit="more namespaces",
    )


def _pods(g: Gathered) -> ContextSection | None:
    lines: _Lines = []
    shown: set[tuple[str, str]] = set()

    def add(pod: Obj, rank: int) -> None:
        if ko.key(pod) not in shown and len(lines) < _MAX_POD_LINES:
            shown.add(ko.key(pod))
            lines.append((ko.pod_line(pod), rank))

    for pod in g.top:
        add(pod, DECISIVE)
    if not g.overview:
        for pod in g.focus.pods:
            close = g.focus.score(pod) >= 0.7
            add(
                pod,
                ERROR
                if close and ko.pod_problems(pod)
                else CONTEXT
                if close or ko.pod_problems(pod)
                else FILLER,
            )
    near = {ko.namespace(p) for p in g.top}
    for rank_index, pod in enumerate(
        sorted((p for p in g.snapshot.pods if ko.pod_problems(p)), key=_broken_first)
    ):
        if g.overview:
            rank = ERROR if rank_index < 10 else CONTEXT if rank_index < 25 else FILLER
        else:
            rank = CONTEXT if ko.namespace(pod) in near else FILLER
        add(pod, rank)
    if not lines:
        return None
    focused = bool(g.focus.pods) and not g.overview
    return ranked_section(
        source=SOURCE,
        title="Pods in question first, then other pods that are not healthy"
        if focused
        else "Pods that are not healthy (most broken first)",
        lines=lines,
        priority=10,
        unit="more pods",
    )


def _broken_first(pod: Obj) -> tuple[int, str, str]:
    return (-ko.severity(pod), ko.namespace(pod), ko.name(pod))


def could_starve(pod: Obj) -> bool:
    """A pod that can take more of its node than it asked for: no CPU or memory limit, or an
    emptyDir without a size limit."""
    unbounded = any(
        "emptyDir" in v and not (v.get("emptyDir") or {}).get("sizeLimit")
        for v in ko.spec(pod).get("volumes") or []
    )
    return unbounded or ko.limits_of(pod, "cpu") is None or ko.limits_of(pod, "memory") is None


def _neighbour_line(pod: Obj, node: str) -> str:
    parts = [f"also on {node}: {ko.namespace(pod)}/{ko.name(pod)}", ko.status(pod).get("phase") or "?"]
    cpu, memory = ko.requests_of(pod, "cpu"), ko.requests_of(pod, "memory")
    parts.append(f"requests cpu {cpu:g} cores, memory {memory / 1024**2:.0f}Mi")
    cpu_limit, memory_limit = ko.limits_of(pod, "cpu"), ko.limits_of(pod, "memory")
    parts.append(
        "limits "
        + ("cpu none" if cpu_limit is None else f"cpu {cpu_limit:g}")
        + (", memory none" if memory_limit is None else f", memory {memory_limit / 1024**2:.0f}Mi")
    )
    for volume in ko.spec(pod).get("volumes") or []:
        if "emptyDir" in volume:
            parts.append(f"volume {ko.volume_line(volume)}")
    problems = ko.pod_problems(pod)
    if problems:
        parts.append("problems: " + "; ".join(problems))
    return " | ".join(parts)


def _nodes(g: Gathered) -> ContextSection | None:
    nodes = g.snapshot.nodes
    if not nodes:
        return None
    lines: _Lines = []
    asked = list(dict.fromkeys([*g.focus.nodes, *g.plan.neighbours]))
    for name in asked:
        node = g.snapshot.get("Node", "", name)
        if node is None:
            continue
        lines.append((ko.node_line(node), DECISIVE if ko.node_problems(node) else ERROR))
        for i, pod in enumerate(g.plan.neighbours.get(name, [])):
            lines.append((f"  {_neighbour_line(pod, name)}", ERROR if i < 3 else CONTEXT))
    others = [n for n in nodes if ko.node_problems(n) and ko.name(n) not in asked]
    lines += [(ko.node_line(n), CONTEXT) for n in others]
    ready = sum(1 for n in nodes if not any(p.startswith("NotReady") for p in ko.node_problems(n)))
    with_problems = sum(1 for n in nodes if ko.node_problems(n))
    return ranked_section(
        source=SOURCE,
        title=f"Nodes: {len(nodes)} total, {ready} Ready, {with_problems} with problems"
        + (" (theirs first, with the pods beside them)" if asked else ""),
        lines=lines or [("all nodes Ready, no pressure", CONTEXT)],
        priority=22 if asked else 40,
        unit="more node lines",
    )


def _storage(g: Gathered) -> ContextSection | None:
    if not g.plan.claims:
        return None
    lines: _Lines = []
    for pvc in g.plan.claims:
        bound = ko.status(pvc).get("phase") == "Bound"
        lines.append((ko.pvc_line(pvc), ERROR if bound else DECISIVE))
    for obj in g.storage:
        if "provisioner" in obj:
            lines.append((ko.storageclass_line(obj), DECISIVE))
        else:
            lines.append((ko.pv_line(obj), ERROR))
    return ranked_section(
        source=SOURCE,
        title="Volumes (PVC, PV, StorageClass)",
        lines=lines,
        priority=24,
        unit="more volume lines",
    )


def _dependencies(g: Gathered) -> ContextSection | None:
    lines: _Lines = []
    for dep in g.plan.dependencies:
        broken = dep.broken()
        health = (
            f"{len(broken)} of {len(dep.pods)} pods not healthy"
            if broken
            else f"{len(dep.pods)} pods healthy"
        )
        if dep.service is not None:
            ready, total = g.snapshot.endpoints(dep.service)
            health = f"endpoints {ready}/{total} ready, {health}"
        lines.append((f"{dep.label} ({dep.why}): {health}", DECISIVE if broken else CONTEXT))
        for pod in broken[:3]:
            lines += _broken_pod_lines(pod)
    if g.plan.dns_reason:
        lines.append((f"cluster DNS ({g.plan.dns_reason}):", DECISIVE))
        if not g.plan.dns:
            lines.append(("  no CoreDNS / kube-dns pods in the scope read", ERROR))
        for pod in g.plan.dns[:4]:
            lines += _broken_pod_lines(pod) if ko.pod_problems(pod) else [(f"  {ko.pod_line(pod)}", ERROR)]
        for svc in g.snapshot.services:
            if ko.name(svc) in ("kube-dns", "coredns") and ko.namespace(svc) == "kube-system":
                ready, total = g.snapshot.endpoints(svc)
                lines.append(
                    (f"  service kube-system/{ko.name(svc)}: endpoints {ready}/{total} ready", ERROR)
                )
    lines += _services_selecting_nothing(g)
    if not lines:
        return None
    return ranked_section(
        source=SOURCE,
        title="Dependencies (from env, error lines and log mentions)",
        lines=lines,
        priority=18,
        unit="more dependency lines",
    )


def _services_selecting_nothing(g: Gathered) -> _Lines:
    """Services in the namespaces of the pods in question whose selector matches no pod: traffic to
    them goes nowhere (a selector typo, a label changed by a rollout), while every pod looks healthy.
    One named like a workload in question is decisive; the labels its pods do carry are shown."""
    spaces = {ko.namespace(p) for p in g.top}
    names = {ref[2] for ref in hops.workload_refs(g.snapshot, g.top)}
    lines: _Lines = []
    for svc in g.snapshot.services:
        selector = ko.spec(svc).get("selector")
        if ko.namespace(svc) not in spaces or not selector:
            continue
        if any(ko.selects(selector, p) for p in g.snapshot.pods_in(ko.namespace(svc))):
            continue
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
        line = f"service {ko.namespace(svc)}/{ko.name(svc)} selects {wanted}: no pod matches (no endpoints)"
        similar = [p for p in g.top if ko.name(svc) in names or ko.name(p).startswith(ko.name(svc))]
        if similar:
            carried = ", ".join(f"{k}={v}" for k, v in sorted(ko.labels(similar[0]).items()) if k in selector)
            line += f"; {ko.name(similar[0])} carries {carried or 'none of these labels'}"
        lines.append((line, DECISIVE if similar else ERROR))
    return lines[:_MAX_SELECTLESS]


def _broken_pod_lines(pod: Obj) -> _Lines:
    """A broken pod one hop away: its line, and its containers' resources (an OOM kill's limit)."""
    lines: _Lines = [(f"  {ko.pod_line(pod)}", DECISIVE)]
    for c in ko.spec(pod).get("containers") or []:
        lines.append((f"    container {c.get('name')}: {ko.resources_text(c)}", ERROR))
    return lines


def _focus_refs(g: Gathered) -> list[Ref]:
    refs = hops.workload_refs(g.snapshot, g.top)
    for kind, names in (("Deployment", g.entities.deployments), ("StatefulSet", g.entities.statefulsets)):
        for obj in getattr(g.snapshot, f"{kind.lower()}s"):
            if ko.name(obj) in names:
                refs.append((kind, ko.namespace(obj), ko.name(obj)))
    return list(dict.fromkeys(refs))


def _workloads(g: Gathered) -> ContextSection | None:
    lines: _Lines = []
    refs = (
        # Nothing in question: the workloads whose running pods' logs were read, if any.
        hops.workload_refs(g.snapshot, g.quiet)
        if g.overview
        else [*_focus_refs(g), *(r for r in g.focus.workloads[:2] if not g.snapshot.pods_of(r))]
    )
    refs = list(dict.fromkeys(refs))
    # A rollout is a likely cause when the pods in question are broken (or the question is a review).
    suspect = g.change_review or any(ko.pod_problems(p) for p in g.top)
    for ref in refs:
        lines += _workload_lines(g.snapshot, ref, DECISIVE, suspect=suspect)
    if g.overview or g.change_review or not refs:
        # With nothing in question: the workloads that are not healthy.
        for dep in g.snapshot.deployments:
            if not ko.deployment_healthy(dep) and ("Deployment", *ko.key(dep)) not in refs:
                lines += _workload_lines(g.snapshot, ("Deployment", *ko.key(dep)), ERROR, suspect=True)
        for sts in g.snapshot.statefulsets:
            if not ko.statefulset_healthy(sts) and ("StatefulSet", *ko.key(sts)) not in refs:
                lines.append((ko.statefulset_line(sts), ERROR))
        for ds in g.snapshot.daemonsets:
            if not ko.daemonset_healthy(ds) and ("DaemonSet", *ko.key(ds)) not in refs:
                lines.append((ko.daemonset_line(ds), ERROR))
        for job in g.snapshot.jobs:
            if ko.job_failed(job):
                lines.append((ko.job_line(job), CONTEXT))
    if not lines:
        return None
    return ranked_section(
        source=SOURCE,
        title="Workloads: rollout, revisions (newest first), what changed, autoscalers, jobs",
        lines=lines,
        priority=5 if g.change_review else 28,
        unit="more workload lines",
    )


def _workload_lines(snapshot: Snapshot, ref: Ref, rank: int, *, suspect: bool) -> _Lines:
    """A workload's status, revisions (with the change cause and what the pod template changed),
    autoscalers and jobs; the history of a healthy, unsuspected Deployment is context only."""
    kind, ns, name = ref
    obj = snapshot.workload(ref)
    lines: _Lines = []
    # The status line answers "is it ok?"; the history matters when the rollout may be the cause.
    unhealthy = obj is not None and kind == "Deployment" and not ko.deployment_healthy(obj)
    history = rank if suspect or unhealthy else CONTEXT
    if kind == "Deployment" and obj is not None:
        lines.append((ko.deployment_line(obj), rank))
        revisions = snapshot.revisions(obj)[:_MAX_REVISIONS]
        for i, rs in enumerate(revisions):
            lines.append(("  " + ko.replicaset_line(rs), history if i == 0 else min(FILLER, history + 1)))
        if len(revisions) >= 2:
            current, previous = revisions[0], revisions[1]
            changes = ko.template_diff(ko.spec(current).get("template"), ko.spec(previous).get("template"))
            what = f"  changes from revision {ko.revision(previous)} to {ko.revision(current)}"
            lines.append((f"{what}: " + ("; ".join(changes) or "none in the pod template"), history))
    elif kind == "StatefulSet" and obj is not None:
        lines.append((ko.statefulset_line(obj), rank))
        lines += _sibling_diff(snapshot, ref, history)
    elif kind == "DaemonSet" and obj is not None:
        lines.append((ko.daemonset_line(obj), rank))
        lines += _sibling_diff(snapshot, ref, history)
    elif kind == "CronJob" and obj is not None:
        lines.append((ko.cronjob_line(obj), rank))
        for i, job in enumerate(snapshot.jobs_of(obj)[:3]):
            lines.append(("  " + ko.job_line(job), rank if i == 0 else ERROR))
    elif kind == "Job" and (single := snapshot.get("Job", ns, name)) is not None:
        lines.append((ko.job_line(single), rank))
    for hpa in snapshot.hpas_for(ref):
        lines.append(("  " + ko.hpa_line(hpa), rank))
    return lines


def _sibling_diff(snapshot: Snapshot, ref: Ref, rank: int) -> _Lines:
    """What differs between a broken pod of a StatefulSet or DaemonSet and a healthy one of the same
    workload (image, resources, env, probes ...): their revisions are ControllerRevisions opsbot does
    not read, but a rollout half done (or one node's pod) shows in the pods' own specs."""
    pods = snapshot.pods_of(ref)
    broken = next((p for p in sorted(pods, key=_broken_first) if ko.pod_problems(p)), None)
    healthy = next((p for p in sorted(pods, key=ko.key) if not ko.pod_problems(p)), None)
    if broken is None or healthy is None:
        return []
    changes = ko.template_diff({"spec": ko.spec(broken)}, {"spec": ko.spec(healthy)})
    if not changes:
        # Worth saying: the cause is then not a rollout but the node, the data or a dependency.
        return [
            (f"  {ko.name(broken)} (not healthy) has the same pod spec as {ko.name(healthy)} (healthy)", rank)
        ]
    what = f"  {ko.name(broken)} (not healthy) differs from {ko.name(healthy)} (healthy)"
    return [(f"{what}: " + "; ".join(changes), rank)]


def _configs(g: Gathered) -> ContextSection | None:
    if not g.plan.configs:
        return None
    read = {ko.key(cm): cm for cm in g.configmaps}
    lines: _Lines = []
    for (kind, ns, name), keys in sorted(g.plan.configs.items()):
        if name.startswith("kube-root-ca.crt"):
            continue
        what = f"keys {', '.join(sorted(keys))}" if keys else "all keys (mounted or envFrom)"
        configmap = read.get((ns, name)) if kind == "configmap" else None
        if configmap is None:
            never = (
                " (values are never read)"
                if kind == "secret"
                else f" (values not read: {g.configmap_values or 'no such ConfigMap'})"
            )
            lines.append((f"{kind} {ns}/{name}: {what}{never}", ERROR))
            continue
        lines += _configmap_lines(configmap, keys)
    if not lines:
        return None
    return ranked_section(
        source=SOURCE,
        title="ConfigMaps the pods reference (values redacted) and Secret references (names and keys only)",
        lines=lines,
        priority=30,
        unit="more references",
    )


def _configmap_lines(configmap: Obj, keys: set[str]) -> _Lines:
    """A ConfigMap the pods reference: its referenced keys with their values (all keys for a volume
    or ``envFrom``), a key referenced but missing called out, since the pod then reads nothing."""
    data = {str(k): str(v) for k, v in (configmap.get("data") or {}).items()}
    binary = sorted(str(k) for k in configmap.get("binaryData") or {})
    wanted = sorted(keys) if keys else sorted(data)
    header = (
        f"configmap {ko.namespace(configmap)}/{ko.name(configmap)}: keys {', '.join(sorted(data)) or 'none'}"
    )
    lines: _Lines = [(header + (f"; binary keys {', '.join(binary)}" if binary else ""), ERROR)]
    for key in wanted[:_MAX_CONFIG_KEYS]:
        if key in data:
            # Redacted here as well as with the section: a ConfigMap is where credentials leak.
            value = redact(ko.short(data[key], _MAX_CONFIG_VALUE), where="context")
            lines.append((f"  {key}={value}", ERROR))
        elif key not in binary:
            lines.append((f"  {key}: referenced, but the ConfigMap has no such key", DECISIVE))
    if len(wanted) > _MAX_CONFIG_KEYS:
        lines.append((f"  ... {len(wanted) - _MAX_CONFIG_KEYS} more keys", CONTEXT))
    return lines


def _related_names(g: Gathered) -> tuple[set[str], set[str], set[str]]:
    """Names whose events are decisive, related, and words whose mention in a message is decisive."""
    decisive = {ko.name(p) for p in g.top} | {ko.name(c) for c in g.plan.claims}
    decisive |= {ko.name(o) for o in g.storage}
    related: set[str] = set(g.focus.nodes)
    for ref in hops.workload_refs(g.snapshot, g.top):
        related.add(ref[2])
        related |= {owner for p in g.snapshot.pods_of(ref) for _, owner in ko.owners(p)}
        # A new revision that cannot create its pods (a quota, an admission webhook) has events, no pods.
        workload = g.snapshot.workload(ref)
        if workload is not None and ref[0] == "Deployment":
            related |= {ko.name(rs) for rs in g.snapshot.revisions(workload)[:2]}
    related |= {ko.spec(p).get("nodeName") or "" for p in g.top}
    for dep in g.plan.dependencies:
        related |= {ko.name(p) for p in dep.pods}
        if dep.service is not None:
            related.add(ko.name(dep.service))
    related |= {ko.name(p) for p in g.plan.dns}
    related |= {ko.name(p) for pods in g.plan.neighbours.values() for p in pods[:3]}
    mentions = {name for (_, _, name) in g.plan.configs}
    return decisive, related - {""}, mentions


def _events(g: Gathered) -> ContextSection | None:
    events = g.snapshot.events
    if not events:
        return None
    decisive, related, mentions = _related_names(g)
    ranked: list[tuple[Obj, int]] = []
    # A pending pod in question and a volume event of its namespace: likely its claim.
    pending = {ko.namespace(p) for p in g.top if ko.status(p).get("phase") == "Pending"}
    for event in events:
        obj = event.get("involvedObject") or {}
        name = obj.get("name") or ""
        message = str(event.get("message") or "")
        volume = (
            obj.get("kind") in ("PersistentVolumeClaim", "PersistentVolume")
            and ko.namespace(event) in pending
        )
        if name in decisive or volume or any(f'"{m}"' in message or f" {m} " in message for m in mentions):
            rank = DECISIVE
        elif name in related:
            rank = ERROR
        else:
            rank = CONTEXT if g.overview else FILLER
        ranked.append((event, rank))
    ranked.sort(key=lambda pair: ko.event_time(pair[0]))
    ranked = ranked[-_MAX_EVENTS:]
    return ranked_section(
        source=SOURCE,
        title=f"Warning events in {_scope_text(g)} (oldest first)",
        lines=[(ko.event_line(e), rank) for e, rank in ranked],
        priority=26,
        unit="older events",
        drop_from="start",
    )


def _details(g: Gathered) -> ContextSection | None:
    chosen: list[Obj] = []
    seen: set[Ref] = set()
    for pod in g.top:
        ref = g.snapshot.workload_of(pod)
        if ref in seen:
            continue
        seen.add(ref)
        chosen.append(pod)
    if not chosen:
        return None
    lines: _Lines = []
    for i, pod in enumerate(chosen[:_MAX_DETAILS]):
        base = DECISIVE if i == 0 else ERROR
        header, *rest = ko.pod_details(pod)
        lines.append((header, base))  # the pod's name: kept with its container lines (also rank ``base``)
        chain = hops.owner_chain(g.snapshot, pod)
        if len(chain) > 1:
            lines.append(("  owned by: " + " -> ".join(chain[1:]), ERROR))
        lines += [(line, _detail_rank(line, base)) for line in rest]
    return ranked_section(
        source=SOURCE,
        title="Pod details (images, resources, probes, volumes, env)",
        lines=lines,
        priority=32,
        unit="pod detail lines",
    )


def _detail_rank(line: str, base: int) -> int:
    text = line.strip()
    if not line.startswith("  "):
        return base
    if text.startswith("annotation "):
        return FILLER
    if text.startswith(("container ", "init container ")):
        return base  # image, requests and limits: an OOM or a throttled pod is explained here
    if text.startswith("env "):
        value = text.split("=", 1)[-1]
        telling = "://" in value or ".svc" in value or value.startswith("<from")
        return min(FILLER, base + (1 if telling else 2))
    return min(FILLER, base + 1)


def _log_sections(g: Gathered, streams: Sequence[LogStream], *, hop: bool) -> list[ContextSection]:
    """One section per group of identical replicas' logs (same workload, container and signature)."""
    groups: dict[tuple[Ref, str, bool, tuple[str, ...]], list[LogStream]] = {}
    totals: dict[tuple[Ref, str, bool], int] = {}
    for stream in streams:
        ref = g.snapshot.workload_of(stream.pod)
        key = (ref, stream.container, stream.previous)
        totals[key] = totals.get(key, 0) + 1
        groups.setdefault((*key, signature(stream.lines)), []).append(stream)
    first_ref = g.snapshot.workload_of(g.top[0]) if g.top else None
    sections = []
    for (ref, container, previous, _), members in groups.items():
        stream = members[0]
        where = f"{ko.namespace(stream.pod)}/{ko.name(stream.pod)}/{container}"
        same = ""
        if len(members) > 1:
            names = ", ".join(ko.name(s.pod) for s in members)
            same = f"; same in {len(members)} of {totals[(ref, container, previous)]} replicas: {names}"
        kept = stream.lines
        shift = 0
        if hop:
            # What the dependency, DNS pod or neighbour says is wrong; a Ready CoreDNS that cannot
            # list EndpointSlices answers NXDOMAIN all the same: its errors keep their rank.
            why = _hop_reason(g, stream.pod)
            healthy = not ko.pod_problems(stream.pod)
            kept = [ln for ln in kept if ln.rank <= (CONTEXT if not healthy or "neighbour" in why else ERROR)]
            same += f"; {why}"
        elif first_ref is not None and ref != first_ref:
            shift = 1
        if not kept:
            continue
        which = "previous container" if previous else "current container"
        folded = f", {stream.read} lines read" if stream.read > len(kept) else ""
        sections.append(
            ranked_section(
                source=SOURCE,
                title=f"Log of {where} ({which}{folded}{same})",
                lines=[(ln.text, min(FILLER, ln.rank + shift)) for ln in kept],
                priority=(20 if hop else 14 if previous else 16),
                unit=f"log lines of {where}",
                drop_from="start",
            )
        )
    return sections


def _hop_reason(g: Gathered, pod: Obj) -> str:
    for dep in g.plan.dependencies:
        if pod in dep.pods:
            return f"{dep.label}, {dep.why}"
    if pod in g.plan.dns:
        return "cluster DNS"
    if pod in g.quiet:
        return "errors in the log of a running pod (no pod is unhealthy)"
    for node, pods in g.plan.neighbours.items():
        if pod in pods:
            return f"neighbour on node {node}"
    return "related"
