"""The cluster as one gathering read it: the lists of the first round and the links between them.

:class:`Snapshot` holds what the API answered (pods, events, nodes, workloads, Services,
EndpointSlices, PVCs, HPAs, Jobs ...) and indexes the cluster's own links: pod -> ReplicaSet ->
Deployment, pod -> StatefulSet / DaemonSet, pod -> Job -> CronJob, pod -> node, Service ->
selected pods, PVC -> pods. The matcher (:mod:`bot.context.matching`) and the hop planner
(:mod:`bot.context.hops`) walk these links; nothing here calls the API.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bot.context import kube_objects as ko
from bot.context.kube_objects import Obj

Ref = tuple[str, str, str]
"""(kind, namespace, name) of a workload (``Deployment``, ``StatefulSet``, ``DaemonSet``,
``CronJob``, ``Job``, ``ReplicaSet``) or of a bare ``Pod``."""


@dataclass(slots=True)
class Snapshot:
    """The first round's lists, and indexes over them."""

    pods: list[Obj] = field(default_factory=list)
    events: list[Obj] = field(default_factory=list)
    nodes: list[Obj] = field(default_factory=list)
    deployments: list[Obj] = field(default_factory=list)
    statefulsets: list[Obj] = field(default_factory=list)
    daemonsets: list[Obj] = field(default_factory=list)
    replicasets: list[Obj] = field(default_factory=list)
    services: list[Obj] = field(default_factory=list)
    endpointslices: list[Obj] = field(default_factory=list)
    jobs: list[Obj] = field(default_factory=list)
    cronjobs: list[Obj] = field(default_factory=list)
    hpas: list[Obj] = field(default_factory=list)
    pvcs: list[Obj] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    """Namespaces the API listed (or the configured scope when it could not list them)."""
    _by_kind: dict[str, dict[tuple[str, str], Obj]] = field(default_factory=dict, init=False)
    _pods_by_owner: dict[Ref, list[Obj]] = field(default_factory=dict, init=False)
    _pods_by_node: dict[str, list[Obj]] = field(default_factory=dict, init=False)
    _pods_by_namespace: dict[str, list[Obj]] = field(default_factory=dict, init=False)
    _revisions: dict[tuple[str, str], list[Obj]] = field(default_factory=dict, init=False)

    def index(self) -> Snapshot:
        """Build the indexes (call once the lists are filled); returns ``self``."""
        self._by_kind = {
            kind: {ko.key(o): o for o in objs}
            for kind, objs in (
                ("Pod", self.pods),
                ("Deployment", self.deployments),
                ("StatefulSet", self.statefulsets),
                ("DaemonSet", self.daemonsets),
                ("ReplicaSet", self.replicasets),
                ("Service", self.services),
                ("Job", self.jobs),
                ("CronJob", self.cronjobs),
                ("PersistentVolumeClaim", self.pvcs),
            )
        }
        self._by_kind["Node"] = {("", ko.name(n)): n for n in self.nodes}
        self._revisions = {}
        for rs in self.replicasets:
            for kind, owner in ko.owners(rs):
                if kind == "Deployment":
                    self._revisions.setdefault((ko.namespace(rs), owner), []).append(rs)
        self._pods_by_owner = {}
        self._pods_by_node = {}
        self._pods_by_namespace = {}
        for pod in self.pods:
            self._pods_by_namespace.setdefault(ko.namespace(pod), []).append(pod)
            self._pods_by_owner.setdefault(self.workload_of(pod), []).append(pod)
            node = ko.spec(pod).get("nodeName")
            if node:
                self._pods_by_node.setdefault(str(node), []).append(pod)
        return self

    def add_replicasets(self, replicasets: Sequence[Obj]) -> None:
        """ReplicaSets read after the first round (only the namespaces in question need revisions)."""
        known = self._by_kind.setdefault("ReplicaSet", {})
        for rs in replicasets:
            if ko.key(rs) in known:
                continue
            known[ko.key(rs)] = rs
            self.replicasets.append(rs)
            for kind, owner in ko.owners(rs):
                if kind == "Deployment":
                    self._revisions.setdefault((ko.namespace(rs), owner), []).append(rs)

    def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        """One object by kind, namespace ("" for nodes) and name."""
        return self._by_kind.get(kind, {}).get((namespace, name))

    def workload_of(self, pod: Obj) -> Ref:
        """The top of ``pod``'s owner chain: its Deployment (through the ReplicaSet), StatefulSet,
        DaemonSet, CronJob (through the Job) or Job; the pod itself when it has no owner."""
        ns = ko.namespace(pod)
        refs = ko.owners(pod)
        if not refs:
            return ("Pod", ns, ko.name(pod))
        kind, name = refs[0]
        if kind == "ReplicaSet":
            rs = self.get("ReplicaSet", ns, name)
            parent = ko.owners(rs) if rs is not None else []
            if parent and parent[0][0] == "Deployment":
                return ("Deployment", ns, parent[0][1])
            # A ReplicaSet not listed (a namespaced Role without replicasets): its name still says
            # which Deployment it belongs to, <deployment>-<pod-template-hash>.
            if rs is None and "-" in name:
                return ("Deployment", ns, name.rsplit("-", 1)[0])
        if kind == "Job":
            job = self.get("Job", ns, name)
            parent = ko.owners(job) if job is not None else []
            if parent and parent[0][0] == "CronJob":
                return ("CronJob", ns, parent[0][1])
            # A Job already cleaned up (its pods linger, Evicted or Failed): a CronJob names its Jobs
            # <cronjob>-<scheduled minute>.
            base, _, stamp = name.rpartition("-")
            if job is None and stamp.isdigit() and self.get("CronJob", ns, base) is not None:
                return ("CronJob", ns, base)
        return (kind, ns, name)

    def pods_of(self, ref: Ref) -> list[Obj]:
        """Pods whose owner chain ends at ``ref``."""
        return list(self._pods_by_owner.get(ref, []))

    def pods_in(self, namespace: str) -> list[Obj]:
        """Pods of ``namespace``."""
        return list(self._pods_by_namespace.get(namespace, []))

    def pods_on(self, node: str) -> list[Obj]:
        """Pods placed on ``node``."""
        return list(self._pods_by_node.get(node, []))

    def workload(self, ref: Ref) -> Obj | None:
        """The workload object of ``ref`` (``None`` for a bare pod or one not listed)."""
        return self.get(ref[0], ref[1], ref[2])

    def workloads(self) -> list[Ref]:
        """Every workload (and bare pod) that has pods, plus listed workloads without any."""
        refs = dict.fromkeys(self._pods_by_owner)
        for kind, objs in (
            ("Deployment", self.deployments),
            ("StatefulSet", self.statefulsets),
            ("DaemonSet", self.daemonsets),
            ("CronJob", self.cronjobs),
        ):
            for obj in objs:
                refs.setdefault((kind, ko.namespace(obj), ko.name(obj)))
        return list(refs)

    def revisions(self, deployment: Obj) -> list[Obj]:
        """The ReplicaSets of a Deployment, newest revision first."""
        return sorted(self._revisions.get(ko.key(deployment), []), key=ko.revision, reverse=True)

    def services_of(self, pods: Iterable[Obj]) -> list[Obj]:
        """Services selecting any of ``pods``."""
        chosen = list(pods)
        spaces = {ko.namespace(p) for p in chosen}
        return [
            svc
            for svc in self.services
            if ko.namespace(svc) in spaces
            and any(
                ko.namespace(p) == ko.namespace(svc) and ko.selects(ko.spec(svc).get("selector"), p)
                for p in chosen
            )
        ]

    def selected_pods(self, service: Obj) -> list[Obj]:
        """Pods a Service selects (by its selector, else by its EndpointSlices' pod references)."""
        ns = ko.namespace(service)
        selector = ko.spec(service).get("selector")
        if selector:
            return [p for p in self.pods_in(ns) if ko.selects(selector, p)]
        names = {
            (e.get("targetRef") or {}).get("name")
            for s in self.endpointslices
            if ko.namespace(s) == ns and ko.labels(s).get("kubernetes.io/service-name") == ko.name(service)
            for e in s.get("endpoints") or []
        }
        return [p for p in self.pods_in(ns) if ko.name(p) in names]

    def endpoints(self, service: Obj) -> tuple[int, int]:
        """(ready, total) endpoints of a Service, from its EndpointSlices (or its pods' readiness
        when no slice was listed)."""
        ns, name = ko.key(service)
        slices = [
            s
            for s in self.endpointslices
            if ko.namespace(s) == ns and ko.labels(s).get("kubernetes.io/service-name") == name
        ]
        if slices:
            endpoints = [e for s in slices for e in s.get("endpoints") or []]
            ready = sum(1 for e in endpoints if (e.get("conditions") or {}).get("ready") is not False)
            return ready, len(endpoints)
        pods = self.selected_pods(service)
        return sum(1 for p in pods if "not Ready" not in ko.pod_problems(p) and not ko.pod_problems(p)), len(
            pods
        )

    def hpas_for(self, ref: Ref) -> list[Obj]:
        """Autoscalers whose target is the workload ``ref``."""
        kind, ns, name = ref
        return [
            h
            for h in self.hpas
            if ko.namespace(h) == ns
            and (ko.spec(h).get("scaleTargetRef") or {}).get("name") == name
            and (ko.spec(h).get("scaleTargetRef") or {}).get("kind") == kind
        ]

    def jobs_of(self, cronjob: Obj) -> list[Obj]:
        """A CronJob's Jobs, newest first."""
        ns, name = ko.key(cronjob)
        owned = [j for j in self.jobs if ko.namespace(j) == ns and ("CronJob", name) in ko.owners(j)]
        return sorted(owned, key=lambda j: ko.status(j).get("startTime") or "", reverse=True)

    def events_about(self, names: Sequence[tuple[str, str]]) -> list[Obj]:
        """Events whose involved object is one of (namespace, name) (namespace "" matches any)."""
        wanted = set(names)
        any_ns = {n for ns, n in wanted if not ns}
        return [
            e
            for e in self.events
            if (
                (e.get("involvedObject") or {}).get("namespace") or ko.namespace(e),
                (e.get("involvedObject") or {}).get("name"),
            )
            in wanted
            or (e.get("involvedObject") or {}).get("name") in any_ns
        ]
