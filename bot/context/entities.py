"""Find the Kubernetes objects a question or an alert is about.

Free text is read with a few explicit forms (``namespace payments``, ``-n payments``,
``deploy/api``, ``pod api-7f9c-x2x9q``, ``node worker-3``) plus bare names that look like
Kubernetes object names (``api-gateway``); an alert's labels (``namespace``, ``pod``,
``deployment``, ``service``, ``node``, ``alertname``, ``cluster``, ...) are taken as they are. The
providers match bare names against what they list, so a guess that names nothing costs nothing.

A configured cluster is picked up by its name or an alias when the words around it say it is one
("in eu-west", "on the prod cluster", "cluster=us-east") or the name is distinctive (a hyphen or
a digit: "eu-west api is slow"), never when a namespace word follows ("in default namespace").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# DNS-1123 label / subdomain, the shape of namespace, pod and workload names.
_NAME = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_SUBDOMAIN = rf"{_NAME}(?:\.{_NAME})*"

_KIND_WORDS: dict[str, str] = {
    "namespace": "namespaces",
    "namespaces": "namespaces",
    "ns": "namespaces",
    "pod": "pods",
    "pods": "pods",
    "po": "pods",
    "deployment": "deployments",
    "deployments": "deployments",
    "deploy": "deployments",
    "statefulset": "statefulsets",
    "statefulsets": "statefulsets",
    "sts": "statefulsets",
    "service": "services",
    "services": "services",
    "svc": "services",
    "node": "nodes",
    "nodes": "nodes",
    "no": "nodes",
}
_KINDS = "|".join(sorted(_KIND_WORDS, key=len, reverse=True))
# "deploy/api", "pod/api-1", "svc/web"
_SLASH_FORM = re.compile(rf"(?<![\w/.-])({_KINDS})/({_SUBDOMAIN})\b", re.IGNORECASE)
# "namespace payments", "pod api-1", "the deployment api" (short forms such as "no" and "po" are
# only trusted in the slash form: "no pods" is not a node). Never label text: in
# "container=app namespace=shop" the word before "namespace" is a label value.
_LONG_KINDS = "|".join(sorted((k for k in _KIND_WORDS if len(k) > 3), key=len, reverse=True))
_WORD_FORM = re.compile(
    rf"(?<![=:/\w-])({_LONG_KINDS}|pod|svc|sts)\s+[`'\"]?({_SUBDOMAIN})(?![\w-]|[=:]\S)", re.IGNORECASE
)
# "payments namespace", "api deployment"
_WORD_AFTER = re.compile(
    rf"(?<![=:/\w-])({_SUBDOMAIN})\s+(namespace|deployment|statefulset|service)\b(?!\s*[=:])", re.IGNORECASE
)
_PLURAL_KINDS = frozenset(k for k in _KIND_WORDS if k.endswith("s") and k not in ("ns", "sts", "svc"))
_NS_FLAG = re.compile(rf"(?:^|\s)(?:-n|--namespace)[=\s]+({_NAME})\b")
_NS_LABEL = re.compile(rf"\bnamespace\s*[=:]\s*[\"']?({_NAME})\b", re.IGNORECASE)
# Alert names are CamelCase identifiers (KubePodCrashLooping, HighErrorRate).
_ALERT_NAME = re.compile(r"\b([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*){1,})\b")
_ALERT_WORD = re.compile(r"\balert(?:name)?\s*[=:]?\s*[\"']?([A-Za-z_][A-Za-z0-9_:]*)", re.IGNORECASE)
# A pod of a Deployment: <deployment>-<replicaset hash>-<5 chars>; of a StatefulSet: <name>-<ordinal>.
_DEPLOYMENT_POD = re.compile(rf"\b({_NAME})-([a-z0-9]{{6,10}})-([a-z0-9]{{5}})\b")
_IPV4 = re.compile(
    r"(?<![\w.])((?:25[0-5]|2[0-4]\d|1?\d?\d)(?:\.(?:25[0-5]|2[0-4]\d|1?\d?\d)){3})(?![\w]|\.\d)"
)
"""An IPv4 address pasted from a log or a dashboard (a port after it is fine): the cluster knows
whose it is (a pod's, a Service's ClusterIP, a node's), so it is kept as a name."""
_BARE_NAME = re.compile(r"(?<![\w/.:@=-])([a-z][a-z0-9]*(?:-[a-z0-9]+)+)(?![\w/.@=-])")
# Words that look like object names but are ordinary hyphenated English or Kubernetes jargon.
_NOT_NAMES = frozenset(
    {
        "crash-loop",
        "crash-looping",
        "out-of-memory",
        "on-call",
        "follow-up",
        "read-only",
        "set-up",
        "roll-out",
        "kube-system",
        "t-shirt",
        "e-mail",
        "re-run",
        "re-deploy",
        "how-to",
        "end-to-end",
        "up-to-date",
        "last-applied-configuration",
    }
)
# Pod, container and node states and event reasons: CamelCase, but never alert names.
_ALERT_NOT_NAMES = frozenset(
    {
        *("CrashLoopBackOff", "ImagePullBackOff", "ErrImagePull", "OOMKilled", "ContainerCreating"),
        *("PodInitializing", "CreateContainerConfigError", "CreateContainerError", "RunContainerError"),
        *("InvalidImageName", "ErrImageNeverPull", "ContainerStatusUnknown", "DiskPressure"),
        *("MemoryPressure", "PIDPressure", "NetworkUnavailable", "NotReady", "BackoffLimitExceeded"),
        *("DeadlineExceeded", "ProgressDeadlineExceeded", "FailedScheduling", "FailedMount"),
        *("FailedCreatePodSandBox", "FailedAttachVolume", "ProvisioningFailed", "NodeNotReady"),
        *("ReadinessProbe", "LivenessProbe", "StartupProbe", "ConfigMap", "StatefulSet", "DaemonSet"),
        *("ReplicaSet", "CronJob", "PersistentVolumeClaim", "PersistentVolume", "StorageClass"),
        *("EndpointSlice", "HorizontalPodAutoscaler", "CoreDNS", "PgBouncer", "PostgreSQL", "MySQL"),
        *("MongoDB", "RabbitMQ", "JavaScript", "TypeScript", "GitHub", "GitLab", "OpenSearch"),
    }
)

_LABELS: dict[str, str] = {
    "namespace": "namespaces",
    "exported_namespace": "namespaces",
    "pod": "pods",
    "pod_name": "pods",
    "exported_pod": "pods",
    "deployment": "deployments",
    "statefulset": "statefulsets",
    "service": "services",
    "service_name": "services",
    "node": "nodes",
    "kubernetes_node": "nodes",
    "container": "containers",
    "job_name": "jobs",
    "alertname": "alert_names",
    "cluster": "clusters",
    "k8s_cluster": "clusters",
    "kubernetes_cluster": "clusters",
}
_CLUSTER_BEFORE = re.compile(
    r"(?:\b(?:in|on|at|from|for|of|across|cluster|context)(?:\s+the)?\s+|cluster\s*[=:]\s*)$"
)
_CLUSTER_AFTER = re.compile(r"^(?:\s+cluster\b|-cluster\b)")
_NAMESPACE_AFTER = re.compile(r"^\s+(?:namespaces?|ns)\b", re.IGNORECASE)


@dataclass(slots=True)
class Entities:
    """The objects a question is about; empty lists mean "not named"."""

    namespaces: list[str] = field(default_factory=list)
    pods: list[str] = field(default_factory=list)
    deployments: list[str] = field(default_factory=list)
    statefulsets: list[str] = field(default_factory=list)
    services: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)
    containers: list[str] = field(default_factory=list)
    jobs: list[str] = field(default_factory=list)
    alert_names: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    """Bare names that may be any workload, service, pod or node (``api-gateway``, ``kafka-2``)."""
    words: list[str] = field(default_factory=list)
    """Other words of the question that may name something (``payments``, ``chekout``): the
    providers match them, typos included, against what the cluster has; most name nothing."""
    clusters: list[str] = field(default_factory=list)
    """Clusters named (by the question: configured names; by an alert's ``cluster`` label: as is)."""

    def is_empty(self) -> bool:
        """True when nothing was named: the providers give a cluster overview."""
        return not any(
            (
                self.namespaces,
                self.pods,
                self.deployments,
                self.statefulsets,
                self.services,
                self.nodes,
                self.alert_names,
                self.names,
                self.jobs,
            )
        )

    def has_objects(self) -> bool:
        """True when a workload, pod, service or node (not only a namespace) was named."""
        return bool(
            self.pods or self.deployments or self.statefulsets or self.services or self.nodes or self.names
        )

    def workload_names(self) -> list[str]:
        """Every name that may match a pod's owner or prefix (deployments, statefulsets, services,
        bare names)."""
        return _unique([*self.deployments, *self.statefulsets, *self.services, *self.names])

    def key(self) -> tuple[tuple[str, ...], ...]:
        """Hashable form, for caches."""
        return (
            tuple(self.namespaces),
            tuple(self.pods),
            tuple(self.deployments),
            tuple(self.statefulsets),
            tuple(self.services),
            tuple(self.nodes),
            tuple(self.containers),
            tuple(self.jobs),
            tuple(self.alert_names),
            tuple(self.names),
            tuple(self.clusters),
            tuple(self.words),
        )

    def merge(self, other: Entities) -> Entities:
        """Both sets of names, without duplicates, ``self`` first."""
        return Entities(
            **{
                f: _unique([*getattr(self, f), *getattr(other, f)])
                for f in Entities.__dataclass_fields__  # type: ignore[attr-defined]
            }
        )

    def add(self, kind: str, value: str) -> None:
        """Add ``value`` to the list named ``kind`` (ignored when already there)."""
        values: list[str] = getattr(self, kind)
        if value and value not in values:
            values.append(value)


def _unique(values: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def from_text(
    text: str, known_namespaces: Iterable[str] = (), known_clusters: Mapping[str, str] | None = None
) -> Entities:
    """The entities named in a free-text question (``known_clusters``: each word that names a
    configured cluster, lowercased, and the cluster's name)."""
    found = Entities()
    known = {n.lower() for n in known_namespaces}
    claimed: set[str] = set()
    for word, cluster in _clusters_named(text, known_clusters or {}):
        found.add("clusters", cluster)
        claimed.add(word)
    for match in _SLASH_FORM.finditer(text):
        found.add(_KIND_WORDS[match.group(1).lower()], match.group(2).lower())
        claimed.add(match.group(2).lower())
    for match in _WORD_FORM.finditer(text):
        kind_word, name = match.group(1).lower(), match.group(2).lower()
        kind = _KIND_WORDS[kind_word]
        if name in _STOP_WORDS:
            continue
        # "services fail", "pods on": after a plural, only a name-like word (a hyphen or a digit) is one.
        if kind_word in _PLURAL_KINDS and not any(c == "-" or c.isdigit() for c in name):
            continue
        found.add(kind, name)
        claimed.add(name)
    for match in _WORD_AFTER.finditer(text):
        name, kind = match.group(1).lower(), _KIND_WORDS[match.group(2).lower()]
        if name in _STOP_WORDS:
            continue
        found.add(kind, name)
        claimed.add(name)
    for regex in (_NS_FLAG, _NS_LABEL):
        for match in regex.finditer(text):
            found.add("namespaces", match.group(1).lower())
            claimed.add(match.group(1).lower())
    for match in _DEPLOYMENT_POD.finditer(text):
        if match.group(0) not in claimed and any(c.isdigit() for c in match.group(2)):
            found.add("pods", match.group(0))
            claimed.add(match.group(0))
    for match in _IPV4.finditer(text):
        found.add("names", match.group(1))
        claimed.add(match.group(1))
    for match in _BARE_NAME.finditer(text):
        name = match.group(1)
        if name in claimed or name in _NOT_NAMES:
            continue
        if name in known:
            found.add("namespaces", name)
        else:
            found.add("names", name)
    # Lowercase words (a capital first letter allowed): CamelCase states are not names.
    for token in re.findall(r"(?<![\w/.:@=-])[A-Za-z][a-z0-9]*(?![\w/@=-])", text):
        word = token.lower()
        if word in known:
            found.add("namespaces", word)
        elif (
            word not in claimed
            and len(word) >= 3
            and word not in _STOP_WORDS
            and word not in _COMMON_WORDS
            and word not in _KIND_WORDS
        ):
            found.add("words", word)
    for match in _ALERT_WORD.finditer(text):
        if match.group(1).lower() not in _STOP_WORDS and not match.group(1).islower():
            found.add("alert_names", match.group(1))
    for match in _ALERT_NAME.finditer(text):
        name = match.group(1)
        if name not in _ALERT_NOT_NAMES and re.search(r"[a-z][A-Z]", name):
            found.add("alert_names", name)
    return found


def _clusters_named(text: str, words: Mapping[str, str]) -> list[tuple[str, str]]:
    """(word, cluster) for every configured cluster word ``text`` uses as a cluster name."""
    named: list[tuple[str, str]] = []
    for word in sorted(words, key=len, reverse=True):
        for match in re.finditer(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text, re.IGNORECASE):
            before, after = text[: match.start()], text[match.end() :]
            if _NAMESPACE_AFTER.match(after):
                continue
            distinctive = "-" in word or any(c.isdigit() for c in word)
            if distinctive or _CLUSTER_BEFORE.search(before.lower()) or _CLUSTER_AFTER.match(after.lower()):
                named.append((word, words[word]))
                break
    return named


_STOP_WORDS = frozenset(
    {
        *("is", "are", "was", "the", "a", "an", "in", "on", "of", "for", "to", "and", "or", "that", "this"),
        *("it", "with", "check", "restart", "which", "what", "my", "our", "your", "new", "old", "each"),
        *("every", "any", "failing", "broken", "slow", "whole", "same", "other", "first", "last", "from"),
    }
)


_COMMON_TEXT = """
    about after again all also always any anything are around ask asked back bad been before being
    both broke broken but can cannot cant check checked could crash crashed crashes crashing customers
    day days did didn does doesn doing don done down during error errors ever every everything fail
    failed failing fails few fine fire fired firing fix for from get gets getting give going gone got
    had has have having help her here high him his hour hours how its just keep keeps know last like
    lot lots low many may maybe minute minutes more most much must need never new nothing now off
    okay once one only other our out over please pod pods problem problems random randomly really
    right run running said same saw say says see seem seems should since slow some someone something
    not ready restart restarted restarting evicted evicting pending timeout timeouts latency errors
    look looks unhappy happy healthy unhealthy weird strange issue issues incident outage
    started still stop stopped stuck such sure take than thanks that the their them then there these
    they thing things think this those through time times today too tried try trying two until up
    users very was wasn way well went were what whats when where which while who why will with won
    work working works worry would wrong yes yesterday yet you your help
    alert alerts cluster clusters container containers deploy deployed deployment deployments
    namespace namespaces node nodes service services statefulset statefulsets
"""
_COMMON_WORDS = frozenset(_COMMON_TEXT.split())
"""Words that name nothing in a cluster question; the rest may name something (:attr:`Entities.words`)."""


def from_alert(payload: Mapping[str, Any]) -> Entities:
    """The entities of an Alertmanager webhook payload (common labels, then each alert's labels)
    or of a single alert (a mapping with ``labels``)."""
    found = Entities()
    label_sets: list[Mapping[str, Any]] = []
    for key in ("commonLabels", "groupLabels", "labels"):
        value = payload.get(key)
        if isinstance(value, Mapping):
            label_sets.append(value)
    alerts = payload.get("alerts")
    if isinstance(alerts, list):
        for alert in alerts:
            if isinstance(alert, Mapping) and isinstance(alert.get("labels"), Mapping):
                label_sets.append(alert["labels"])
    for labels in label_sets:
        for label, kind in _LABELS.items():
            value = labels.get(label)
            if isinstance(value, str) and value:
                found.add(kind, value)
        instance = labels.get("instance")
        if (
            isinstance(instance, str)
            and instance
            and not found.nodes
            and labels.get("job") == "node-exporter"
        ):
            found.add("nodes", instance.split(":")[0])
    return found


def extract(
    question: str,
    alert: Mapping[str, Any] | None = None,
    known_namespaces: Iterable[str] = (),
    known_clusters: Mapping[str, str] | None = None,
) -> Entities:
    """Entities of an alert (when given) merged with those named in the question."""
    text_entities = from_text(question, known_namespaces, known_clusters)
    if alert is None:
        return text_entities
    return from_alert(alert).merge(text_entities)
