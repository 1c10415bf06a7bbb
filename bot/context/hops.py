"""The hop planner: from the pods a question is about to what they depend on and what shares their node.

Pure: it reads a :class:`~bot.context.kube_snapshot.Snapshot` and the condensed logs of the pods in
question, and says what to look at next; :mod:`bot.context.kubernetes` fetches it.

- **dependencies**: hosts in the pods' env (``*_HOST``, ``*_URL``, ``*_ADDR``, connection strings,
  bootstrap lists) and in their error lines (``orders-db.data.svc:5432``, a Service's cluster IP in
  ``dial tcp 10.96.40.12:5432``, ``kafka-1.kafka-headless...`` for one pod of a headless Service),
  resolved to in-cluster Services and the pods those select; names of workloads, Jobs and pods of
  the namespace that a log line mentions ("waiting for migration job orders-migrate-42").
- **DNS**: a lookup failure in a log (``no such host``, ``server misbehaving``, ``i/o timeout`` on
  port 53, ``NXDOMAIN``) or DNS in the question leads to the cluster DNS pods (CoreDNS / kube-dns).
- **neighbours**: the other pods on the nodes of the pods in question, the most broken and the
  biggest first (unhealthy; no limits; an emptyDir without sizeLimit on a node with DiskPressure).
- **storage and configuration**: the PVCs the pods mount; the ConfigMaps and Secrets they reference
  (names and keys; a Secret is never read).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from bot.context import kube_objects as ko
from bot.context.kube_objects import Obj
from bot.context.kube_snapshot import Ref, Snapshot
from bot.context.logsig import ERROR, Line

_ENV_HOST_NAME = re.compile(
    r"(?i)(?:HOST|URL|URI|ADDR|ADDRESS|ENDPOINT|SERVER|SERVERS|BOOTSTRAP|BROKERS?|DSN|CONN)"
)
_HOST = re.compile(
    r"(?<![\w@/.-])(?:[a-z][a-z0-9+.-]*://)?(?:[^@\s/]+@)?"
    r"((?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]*[a-z0-9])?|\d{1,3}(?:\.\d{1,3}){3})"
    r"(?::(\d{2,5}))?"
)
_LOG_HOST = re.compile(
    r"(?<![\w/@-])((?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+svc(?:\.[a-z0-9.-]+)?|"
    r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)?(?=:\d{2,5}\b)|"
    r"\d{1,3}(?:\.\d{1,3}){3}(?=:\d{2,5}\b))"
)
_DNS_FAILURE = re.compile(
    r"(?i)no such host|server misbehaving|NXDOMAIN|SERVFAIL|temporary failure in name resolution|"
    r"name or service not known|could not resolve|lookup \S+ on \S+:53|getaddrinfo|UnknownHostException|"
    r"dns (?:lookup|resolution) fail"
)
_DNS_LABELS = (("k8s-app", "kube-dns"), ("k8s-app", "coredns"), ("app.kubernetes.io/name", "coredns"))
_MAX_DEPENDENCIES = 6
_MAX_NEIGHBOURS = 8


@dataclass(slots=True)
class Dependency:
    """An in-cluster Service (or a workload, or one pod) the pods in question use, and how we know."""

    service: Obj | None
    pods: list[Obj]
    why: str
    label: str = ""
    """``service data/orders-db``, ``statefulset data/orders-db``, ``pod messaging/kafka-1``."""

    def broken(self) -> list[Obj]:
        """Its pods that are not healthy, most broken first."""
        return sorted((p for p in self.pods if ko.pod_problems(p)), key=lambda p: -ko.severity(p))


@dataclass(slots=True)
class Plan:
    """What to look at next (see the module doc)."""

    dependencies: list[Dependency] = field(default_factory=list)
    dns: list[Obj] = field(default_factory=list)
    """Cluster DNS pods, when a DNS failure was seen (empty otherwise)."""
    dns_reason: str = ""
    neighbours: dict[str, list[Obj]] = field(default_factory=dict)
    """node -> the other pods on it, most telling first."""
    pressured: set[str] = field(default_factory=set)
    """Nodes of ``neighbours`` under pressure (memory, disk, PIDs) or not Ready."""
    claims: list[Obj] = field(default_factory=list)
    configs: dict[tuple[str, str, str], set[str]] = field(default_factory=dict)
    """(configmap / secret, namespace, name) -> keys referenced (empty: the whole object)."""


def env_hosts(pod: Obj) -> list[tuple[str, str]]:
    """(env name, host) for every host in a pod's env values whose name says it holds one, and in
    every value that is a URL or connection string."""
    found: list[tuple[str, str]] = []
    containers = [*(ko.spec(pod).get("initContainers") or []), *(ko.spec(pod).get("containers") or [])]
    for c in containers:
        for env in c.get("env") or []:
            name, value = str(env.get("name") or ""), env.get("value")
            if not isinstance(value, str) or not value:
                continue
            if not (_ENV_HOST_NAME.search(name) or "://" in value):
                continue
            for part in re.split(r"[,;\s]+", value):
                match = _HOST.match(part.strip())
                if match and ("." in match.group(1) or match.group(2) or "://" in part):
                    found.append((name, match.group(1)))
    return found


def log_hosts(lines: Iterable[Line]) -> list[str]:
    """Hosts named in the error lines of a log (``x.ns.svc``, ``name:port``, ``10.96.0.5:5432``)."""
    hosts: dict[str, None] = {}
    for line in lines:
        if line.rank > ERROR:
            continue
        for match in _LOG_HOST.finditer(line.text.lower()):
            hosts.setdefault(match.group(1).rstrip("."), None)
    return list(hosts)


def resolve_host(host: str, namespace: str, snapshot: Snapshot) -> tuple[Obj | None, list[Obj]]:
    """The Service (and its pods) an in-cluster host names, seen from ``namespace``: ``svc``,
    ``svc.ns``, ``svc.ns.svc[.cluster.local]``, ``pod.svc.ns.svc...`` (one pod of a headless
    Service), or a Service's cluster IP / a pod's IP."""
    host = host.lower().rstrip(".")
    if re.fullmatch(r"\d{1,3}(?:\.\d{1,3}){3}", host):
        for svc in snapshot.services:
            if host in (ko.spec(svc).get("clusterIPs") or [ko.spec(svc).get("clusterIP")]):
                return svc, snapshot.selected_pods(svc)
        pods = [p for p in snapshot.pods if ko.status(p).get("podIP") == host]
        return None, pods
    labels = host.removesuffix(".cluster.local").removesuffix(".svc").split(".")
    candidates: list[tuple[str | None, str, str]] = []  # (pod, service, namespace)
    if len(labels) == 1:
        candidates.append((None, labels[0], namespace))
    elif len(labels) == 2:
        candidates += [(None, labels[0], labels[1]), (labels[0], labels[1], namespace)]
    elif len(labels) >= 3:
        candidates.append((labels[0], labels[1], labels[2]))
    for pod_name, svc_name, ns in candidates:
        found = snapshot.get("Service", ns, svc_name)
        if found is None:
            # No such Service listed (or none may be): the workload, app label or pod of that name.
            named = _named_pods(snapshot, ns, svc_name)
            if pod_name:
                named = [p for p in named if ko.name(p) == pod_name] or _named_pods(snapshot, ns, pod_name)
            if named:
                return None, named
            continue
        svc = found
        pods = snapshot.selected_pods(svc)
        if pod_name:
            pods = [p for p in pods if ko.name(p) == pod_name] or pods
            return (svc if len(pods) != 1 or ko.name(pods[0]) != pod_name else None), pods
        return svc, pods
    return None, []


def _named_pods(snapshot: Snapshot, namespace: str, name: str) -> list[Obj]:
    """Pods of the workload ``name`` in ``namespace``, else with that app label, else the pod itself."""
    for ref in snapshot.workloads():
        if ref[1] == namespace and ref[2] == name and ref[0] != "Pod":
            return snapshot.pods_of(ref)
    labelled = [
        p
        for p in snapshot.pods_in(namespace)
        if name in (ko.labels(p).get(k) for k in ("app", "app.kubernetes.io/name"))
    ]
    return labelled or [p for p in snapshot.pods_in(namespace) if ko.name(p) == name]


def _label(snapshot: Snapshot, service: Obj | None, pods: Sequence[Obj]) -> str:
    """What a dependency is called: its Service, else the workload of its pods, else its pod."""
    if service is not None:
        return f"service {ko.namespace(service)}/{ko.name(service)}"
    refs = {snapshot.workload_of(p) for p in pods}
    kind, ns, name = next(iter(refs)) if len(refs) == 1 else ("Pod", ko.namespace(pods[0]), ko.name(pods[0]))
    single = f" (pod {ko.name(pods[0])})" if len(pods) == 1 and kind != "Pod" else ""
    return f"{kind.lower()} {ns}/{name}{single}"


def _mentions(lines: Iterable[Line], namespace: str, snapshot: Snapshot, own: set[Ref]) -> list[Obj]:
    """Pods of ``namespace`` whose name, owner (a Job, a ReplicaSet) or workload the log lines name
    (whole words), outside the workloads ``own`` ("waiting for migration job orders-migrate-42")."""
    text = "\n".join(line.text for line in lines)
    if not text:
        return []
    found: list[Obj] = []
    for pod in snapshot.pods_in(namespace):
        ref = snapshot.workload_of(pod)
        if ref in own:
            continue
        names = {ko.name(pod), ref[2], *(name for _, name in ko.owners(pod))}
        if any(_named(name, text) for name in names):
            found.append(pod)
    return found


def _named(name: str, text: str) -> bool:
    return len(name) > 4 and re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text) is not None


def dns_pods(snapshot: Snapshot) -> list[Obj]:
    """The cluster DNS pods (CoreDNS / kube-dns), most broken first."""
    pods = [
        p
        for p in snapshot.pods
        if any(ko.labels(p).get(k) == v for k, v in _DNS_LABELS)
        or ko.name(p).startswith(("coredns-", "kube-dns-"))
    ]
    return sorted(pods, key=lambda p: (-ko.severity(p), ko.name(p)))


def neighbours(snapshot: Snapshot, node: str, exclude: set[tuple[str, str]]) -> list[Obj]:
    """The other pods on ``node``, most telling first: unhealthy, then those that could starve it
    (an emptyDir without sizeLimit on a node with DiskPressure, no CPU or memory limit), then by
    their requests."""
    node_obj = snapshot.get("Node", "", node)
    problems = " ".join(ko.node_problems(node_obj)) if node_obj else ""

    def weight(pod: Obj) -> tuple[float, ...]:
        unbounded_disk = "DiskPressure" in problems and any(
            "emptyDir" in v and not (v.get("emptyDir") or {}).get("sizeLimit")
            for v in ko.spec(pod).get("volumes") or []
        )
        no_limits = ko.limits_of(pod, "cpu") is None or ko.limits_of(pod, "memory") is None
        return (
            -ko.severity(pod),
            -float(unbounded_disk),
            -float(no_limits),
            -ko.requests_of(pod, "cpu"),
            -ko.requests_of(pod, "memory"),
        )

    others = [
        p
        for p in snapshot.pods_on(node)
        if ko.key(p) not in exclude and ko.status(p).get("phase") != "Succeeded"
    ]
    return sorted(others, key=weight)[:_MAX_NEIGHBOURS]


def plan(
    snapshot: Snapshot,
    pods: Sequence[Obj],
    logs: Mapping[tuple[str, str], Sequence[Line]],
    *,
    question: str = "",
) -> Plan:
    """What to look at next for the pods in question ``pods`` whose condensed logs are ``logs``
    ((namespace, pod) -> lines)."""
    out = Plan()
    own = {ko.key(p) for p in pods}
    # The replicas of the pods in question are neither their neighbours nor their dependencies.
    replicas = {ko.key(p) for ref in workload_refs(snapshot, pods) for p in snapshot.pods_of(ref)}
    seen: set[tuple[str, ...]] = set()

    def depend(service: Obj | None, dep_pods: list[Obj], why: str) -> None:
        # A Service's health counts all its pods, those in question too (their logs are read anyway).
        if service is None:
            dep_pods = [p for p in dep_pods if ko.key(p) not in own]
        key = (
            ("svc", *ko.key(service))
            if service is not None
            else ("pods", *sorted(ko.name(p) for p in dep_pods))
        )
        if (service is None and not dep_pods) or key in seen:
            return
        seen.add(key)
        out.dependencies.append(Dependency(service, dep_pods, why, _label(snapshot, service, dep_pods)))

    for pod in pods:
        ns = ko.namespace(pod)
        for env_name, host in env_hosts(pod):
            svc, dep_pods = resolve_host(host, ns, snapshot)
            if svc is not None or dep_pods:
                depend(svc, dep_pods, f"env {env_name} of {ko.name(pod)} names {host}")
        lines = logs.get(ko.key(pod), [])
        for host in log_hosts(lines):
            svc, dep_pods = resolve_host(host, ns, snapshot)
            if svc is not None or dep_pods:
                depend(svc, dep_pods, f"the log of {ko.name(pod)} names {host}")
        mentioned = _mentions(lines, ns, snapshot, set(workload_refs(snapshot, pods)))
        for ref in workload_refs(snapshot, mentioned):
            group = [p for p in mentioned if snapshot.workload_of(p) == ref]
            depend(None, group, f"the log of {ko.name(pod)} names {ref[2]}")
        if not out.dns_reason:
            failure = next((ln.text for ln in lines if _DNS_FAILURE.search(ln.text)), None)
            if failure:
                out.dns_reason = f"DNS failure in the log of {ko.name(pod)}: {ko.short(failure, 200)}"
        for claim in ko.claims(pod):
            pvc = snapshot.get("PersistentVolumeClaim", ns, claim)
            if pvc is not None and pvc not in out.claims:
                out.claims.append(pvc)
        for (kind, name), keys in ko.config_references(ko.spec(pod)).items():
            out.configs.setdefault((kind, ns, name), set()).update(keys)
        node = ko.spec(pod).get("nodeName")
        if node and node not in out.neighbours:
            out.neighbours[str(node)] = neighbours(snapshot, str(node), own | replicas)
            node_obj = snapshot.get("Node", "", str(node))
            if node_obj is not None and ko.node_problems(node_obj):
                out.pressured.add(str(node))
    if not out.dns_reason and re.search(r"(?i)\bdns\b|coredns|name resolution", question):
        out.dns_reason = "the question is about DNS"
    if out.dns_reason:
        out.dns = [p for p in dns_pods(snapshot) if ko.key(p) not in own]
    # Dependencies with broken pods first: that is where the hop most likely ends.
    out.dependencies.sort(key=lambda d: -max((ko.severity(p) for p in d.pods), default=0))
    del out.dependencies[_MAX_DEPENDENCIES:]
    return out


def owner_chain(snapshot: Snapshot, pod: Obj) -> list[str]:
    """``pod -> replicaset/x -> deployment/y`` (the ownership links of one pod; a top owner that was
    not listed is inferred from the names, as :meth:`Snapshot.workload_of` does)."""
    chain = [f"pod {ko.namespace(pod)}/{ko.name(pod)}"]
    ns = ko.namespace(pod)
    current: Obj | None = pod
    for _ in range(3):
        refs = ko.owners(current) if current is not None else []
        if not refs:
            break
        kind, name = refs[0]
        chain.append(f"{kind.lower()}/{name}")
        current = snapshot.get(kind, ns, name)
    top_kind, _, top_name = snapshot.workload_of(pod)
    if top_kind != "Pod" and f"{top_kind.lower()}/{top_name}" not in chain:
        chain.append(f"{top_kind.lower()}/{top_name}")
    return chain


def workload_refs(snapshot: Snapshot, pods: Iterable[Obj]) -> list[Ref]:
    """The workloads of ``pods``, each once, in order."""
    return list(dict.fromkeys(snapshot.workload_of(p) for p in pods))
