"""What a question is about, when it names nothing exactly: candidates ranked by closeness to what
was typed, then by how broken they are.

Every term of the question (names such as ``paymnets-api`` or ``kafka-2``, single words such as
``payments`` or ``chekout``, node and namespace names, IP addresses) is compared with what the
cluster has: workload names, the ``app`` / ``app.kubernetes.io/name`` / ``k8s-app`` labels of their
pods, Service names, pod names (StatefulSet ordinals), node names (``ip-10-0-7-21`` is the start of
``ip-10-0-7-21.eu-west-1.compute.internal``), namespaces (listed from the API), and the addresses of
pods, Services (ClusterIP) and nodes. Closeness:

- 1.0 the same name; 0.95 a node's short name
- 0.8 a whole part of a hyphenated name (``cart`` in ``shop-cart-service``; 0.6 for three letters)
- up to 0.75 a typo (``chekout`` / ``checkout``, similarity >= 0.85, five letters or more)

A namespace named puts all its pods in question (closeness 0.5, and candidates outside it count
less); a node named, the pods on it (0.7). Ties go to the more broken pod
(:func:`bot.context.kube_objects.severity`): crash loop and OOM, then failing to start, pending,
not ready, restarts. Nothing here calls the API.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher

from bot.context import kube_objects as ko
from bot.context.entities import Entities
from bot.context.kube_objects import Obj
from bot.context.kube_snapshot import Ref, Snapshot

_APP_LABELS = ("app", "app.kubernetes.io/name", "k8s-app", "app.kubernetes.io/instance", "component")
_TYPO_SIMILARITY = 0.85
_NAMESPACE_POD = 0.5
_NODE_POD = 0.7
_OUTSIDE_NAMED_NAMESPACE = 0.6
_WORD_WEIGHT = 0.9
"""A plain word is likelier to name nothing than a hyphenated name or a kind-tagged one."""


@functools.lru_cache(maxsize=65536)
def closeness(term: str, name: str) -> float:
    """How close ``name`` (a cluster object's) is to ``term`` (typed), 0 to 1 (see the module doc)."""
    term, name = term.lower(), name.lower()
    if not term or not name:
        return 0.0
    if term == name:
        return 1.0
    if name.startswith(term + ".") and "-" in term:
        return 0.95
    parts, wanted = name.split("-"), term.split("-")
    for i in range(len(parts) - len(wanted) + 1):
        if parts[i : i + len(wanted)] == wanted:
            return 0.8 if len(term) > 3 else 0.6 if len(term) == 3 else 0.0
    if len(term) < 5:
        return 0.0
    best = _similarity(term, name)
    # A typo of one part: "chekout" for the "checkout" of "checkout-api".
    for i in range(len(parts) - len(wanted) + 1):
        piece = "-".join(parts[i : i + len(wanted)])
        best = max(best, _similarity(term, piece) - 0.05)
    return 0.75 * best if best >= _TYPO_SIMILARITY else 0.0


def _similarity(a: str, b: str) -> float:
    """difflib's ratio, skipped (0) when even its cheap upper bound cannot reach a typo's."""
    matcher = SequenceMatcher(None, a, b)
    if matcher.real_quick_ratio() < _TYPO_SIMILARITY or matcher.quick_ratio() < _TYPO_SIMILARITY:
        return 0.0
    return matcher.ratio()


@dataclass(slots=True)
class Match:
    """One cluster object the question was taken to mean, and why."""

    what: str
    """``deployment storefront/checkout``, ``namespace ledger``, ``node ip-10-0-7-21...``."""
    term: str
    score: float
    how: str = ""
    """Why, when not by name (``its IP address``)."""

    def describe(self) -> str:
        """``'chekout' -> deployment storefront/checkout (closest name)``."""
        how = {1.0: "same name", 0.95: "short name", 0.8: "part of the name", 0.6: "part of the name"}
        return f"'{self.term}' -> {self.what} ({self.how or how.get(self.score, 'closest name')})"


@dataclass(slots=True)
class Focus:
    """The pods a question is about, most likely first, and what it was matched to."""

    pods: list[Obj] = field(default_factory=list)
    scores: dict[tuple[str, str], float] = field(default_factory=dict)
    """(namespace, pod) -> closeness of the pods in ``pods``."""
    workloads: list[Ref] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    matches: list[Match] = field(default_factory=list)

    def score(self, pod: Obj) -> float:
        """The closeness of ``pod`` (0 when it is not in question)."""
        return self.scores.get(ko.key(pod), 0.0)


def _terms(entities: Entities) -> list[tuple[str, float, str]]:
    """(term, weight, kind hint) for every name and word of the question."""
    terms: list[tuple[str, float, str]] = []
    for kind, values, weight in (
        ("pod", entities.pods, 1.0),
        ("deployment", entities.deployments, 1.0),
        ("statefulset", entities.statefulsets, 1.0),
        ("service", entities.services, 1.0),
        ("job", entities.jobs, 1.0),
        ("any", entities.names, 1.0),
        ("any", entities.words, _WORD_WEIGHT),
    ):
        terms.extend((v.lower(), weight, kind) for v in values)
    return terms


def _best(term: str, names: Iterable[str]) -> float:
    return max((closeness(term, n) for n in names if n), default=0.0)


def _by_address(terms: Iterable[str], snapshot: Snapshot) -> list[tuple[Obj, float, str, str]]:
    """Pods an IP address of the question belongs to: (pod, closeness, what matched, the address).
    A pod's own IP is the pod (1.0); a Service's ClusterIP, the pods it selects (0.9); a node's
    address, the pods on it (``_NODE_POD``)."""
    ips = {t for t in terms if t.count(".") == 3 and t.replace(".", "").isdigit()}
    if not ips:
        return []
    out: list[tuple[Obj, float, str, str]] = []
    for pod in snapshot.pods:
        ip = ko.status(pod).get("podIP")
        if ip in ips:
            out.append((pod, 1.0, f"pod {ko.namespace(pod)}/{ko.name(pod)}", str(ip)))
    for svc in snapshot.services:
        ip = ko.spec(svc).get("clusterIP")
        if ip in ips:
            what = f"service {ko.namespace(svc)}/{ko.name(svc)}"
            out += [(pod, 0.9, what, str(ip)) for pod in snapshot.selected_pods(svc)]
    for node in snapshot.nodes:
        for address in ko.status(node).get("addresses") or []:
            if address.get("address") in ips:
                what = f"node {ko.name(node)}"
                out += [
                    (pod, _NODE_POD, what, str(address["address"])) for pod in snapshot.pods_on(ko.name(node))
                ]
    return out


def resolve(entities: Entities, snapshot: Snapshot, *, limit: int = 200) -> Focus:
    """The pods ``entities`` are about in ``snapshot``, ranked (at most ``limit``)."""
    focus = Focus()
    terms = _terms(entities)
    # Namespaces: named ones, and words that are (or are a typo of) a namespace listed by the API.
    ns_scores: dict[str, float] = {n: 1.0 for n in entities.namespaces if n in snapshot.namespaces}
    for term, weight, _ in terms:
        for ns in snapshot.namespaces:
            raw = closeness(term, ns)
            score = raw * weight
            # A whole name, or a typo of one; never a part of a hyphenated one ("system").
            plausible = score >= 0.9 or (score >= 0.7 and "-" not in ns)
            if plausible and score > ns_scores.get(ns, 0.0):
                ns_scores[ns] = score
                if term != ns:
                    focus.matches.append(Match(f"namespace {ns}", term, raw))
    focus.namespaces = sorted(ns_scores, key=lambda n: -ns_scores[n])
    named_ns = set(entities.namespaces) & set(snapshot.namespaces)
    # Nodes: named, or a short name of one.
    node_names = [ko.name(n) for n in snapshot.nodes]
    for term in [*entities.nodes, *entities.names]:
        for node in node_names:
            score = closeness(term, node)
            if score >= 0.95 and node not in focus.nodes:
                focus.nodes.append(node)
                if term != node or term not in entities.nodes:
                    focus.matches.append(Match(f"node {node}", term, score))
    # Workloads: by name, by their pods' app labels, by the Services that select them.
    workload_scores: dict[Ref, tuple[float, str, float]] = {}
    if terms:
        services_by_ref: dict[Ref, list[str]] = {}
        for svc in snapshot.services:
            # Only a Service whose name is close to a term can lend it to its workloads.
            if any(closeness(term, ko.name(svc)) for term, _, _ in terms):
                for pod in snapshot.selected_pods(svc):
                    services_by_ref.setdefault(snapshot.workload_of(pod), []).append(ko.name(svc))
        for ref in snapshot.workloads():
            pods = snapshot.pods_of(ref)
            label_values = {ko.labels(p).get(k, "") for p in pods[:3] for k in _APP_LABELS}
            wl = snapshot.workload(ref)
            if wl is not None:
                label_values |= {ko.labels(wl).get(k, "") for k in _APP_LABELS}
            candidates = {ref[2], *label_values, *services_by_ref.get(ref, [])}
            for term, weight, _ in terms:
                raw = _best(term, candidates)
                score = raw * weight
                if named_ns and ref[1] not in named_ns:
                    score *= _OUTSIDE_NAMED_NAMESPACE
                if score > workload_scores.get(ref, (0.0, "", 0.0))[0]:
                    workload_scores[ref] = (score, term, raw)
    ranked_refs = sorted(workload_scores, key=lambda r: -workload_scores[r][0])
    focus.workloads = [r for r in ranked_refs if workload_scores[r][0] >= 0.45]
    for ref in focus.workloads[:5]:
        _, term, raw = workload_scores[ref]
        if ref[2] != term:
            focus.matches.append(Match(f"{ref[0].lower()} {ref[1]}/{ref[2]}", term, raw))
    # Pods: exact names (StatefulSet ordinals, bare pods), then by workload, namespace and node.
    scores: dict[tuple[str, str], float] = {}

    def consider(pod: Obj, score: float) -> None:
        if named_ns and ko.namespace(pod) not in named_ns:
            score *= _OUTSIDE_NAMED_NAMESPACE
        if score > scores.get(ko.key(pod), 0.0):
            scores[ko.key(pod)] = score

    exact = {t for t, _, kind in terms if kind in ("pod", "any")}
    by_key = {ko.key(p): p for p in snapshot.pods}
    for pod in snapshot.pods:
        if ko.name(pod) in exact:
            consider(pod, 1.0)
    for pod, score, what, ip in _by_address(exact, snapshot):
        consider(pod, score)
        if what not in {m.what for m in focus.matches}:
            focus.matches.append(Match(what, ip, score, "its IP address"))
    for ref in focus.workloads:
        for pod in snapshot.pods_of(ref):
            consider(pod, workload_scores[ref][0])
    for ns, score in ns_scores.items():
        for pod in snapshot.pods:
            if ko.namespace(pod) == ns:
                consider(pod, _NAMESPACE_POD * score)
    for node in focus.nodes:
        for pod in snapshot.pods_on(node):
            consider(pod, _NODE_POD)
    ordered = sorted(scores, key=lambda k: (-round(scores[k], 1), -ko.severity(by_key[k]), k))
    focus.pods = [by_key[k] for k in ordered[:limit]]
    focus.scores = {k: scores[k] for k in ordered[:limit]}
    return focus


def by_severity(pods: Sequence[Obj]) -> list[Obj]:
    """Unhealthy pods, most broken first (crash loop and OOM, failing to start, pending, not ready,
    restarts), then by namespace and name: never in API order."""
    bad = [p for p in pods if ko.pod_problems(p)]
    return sorted(bad, key=lambda p: (-ko.severity(p), ko.key(p)))
