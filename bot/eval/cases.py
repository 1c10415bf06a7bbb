"""Incident cases: what ``opsbot eval`` runs, and the files they are read from.

A case is a cluster state (served by :mod:`bot.eval.kube_api`), Prometheus series and alerts
(served by :mod:`bot.eval.prom_api`), a question or an Alertmanager alert, and what a correct
answer must contain. Cases come from YAML files (one case per file, or a list; the built-in ones
are ``bot/eval/cases/*.yaml``) or from JSONL written by ``opsbot feedback export`` (one replayed
request per line: its stored, redacted context instead of a cluster state).

YAML case keys::

    id: oom-worker                 # unique, [a-z0-9-]
    title: Worker pod OOMKilled
    question: why does worker-6d5f7c9b8-kq2lp in payments keep restarting?
    alert: {labels: {...}, annotations: {...}}   # instead of question: an Alertmanager alert
    scenario: root_cause           # optional: else picked as for a chat message
    cluster:
      namespaces: [payments]
      pods: [{name, namespace, phase, node, owner: ReplicaSet/x, labels, image, resources, env,
              volumes, ip, reason, message, unschedulable: <message>,
              containers: [{name, image, ready, restarts, waiting: {reason, message},
                            last_terminated: {reason, exit_code, minutes_ago}, and container spec
                            fields as written: resources, env, envFrom, readinessProbe, ...}],
              init_containers: [the same]}]
      events: [{namespace, object: Pod/name, reason, message, count, minutes_ago, type}]
      deployments / replicasets / statefulsets / daemonsets / nodes / services / configmaps /
      secrets / pvcs / pvs / storageclasses / hpas / cronjobs / jobs: the keyword arguments of the
      builders of bot/eval/kube_api.py (``type`` for ``type_``; ``claim: ns/name``; ``target:
      Kind/name``; ``template``: a pod spec with real field names)
      logs: [{namespace, pod, container, previous, text}]
    prometheus:
      alerts: [{labels, annotations, state, minutes_ago, value}]
      series: [{metric, labels, values: [oldest, ..., newest]}]
    expect:
      objects: [worker-6d5f7c9b8-kq2lp]    # each entry: a string, or a list of alternatives
      reasons: [[OOMKilled, out of memory]]
      numbers: ["512Mi", "137"]            # exactly as the context shows them

Every entry of ``expect`` must be met; a number must appear in the context the prompt carried (the
runner checks this, so a case cannot ask for a number the model was never shown).
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bot.errors import OpsbotError
from bot.eval import kube_api
from bot.eval.prom_api import Alert, PrometheusSnapshotServer, Series

BUILTIN_CASES = Path(__file__).parent / "cases"
"""Folder of the incident cases shipped with opsbot."""

_ID = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_CASE_KEYS = {"id", "title", "question", "alert", "scenario", "cluster", "prometheus", "expect", "notes"}
_REPLAY_KEYS = {
    "investigation",
    "id",
    "title",
    "source",
    "request_id",
    "scenario",
    "question",
    "asker",
    "alert",
    "context",
    "history",
    "reference_answer",
    "feedback",
    "model",
    "expect",
    "created_at",
}
_CLUSTER_KEYS = {
    "namespaces",
    "pods",
    "events",
    "deployments",
    "replicasets",
    "statefulsets",
    "daemonsets",
    "nodes",
    "logs",
    "services",
    "configmaps",
    "secrets",
    "pvcs",
    "pvs",
    "storageclasses",
    "hpas",
    "cronjobs",
    "jobs",
}
_EXPECT_KEYS = {"objects", "reasons", "numbers", "root_cause"}


class CaseError(OpsbotError, ValueError):
    """A case file cannot be read: names the file, the case and what is wrong."""


@dataclass(slots=True)
class Expectation:
    """What a correct answer contains; every entry is a list of alternatives, one of which must appear."""

    objects: list[list[str]] = field(default_factory=list)
    reasons: list[list[str]] = field(default_factory=list)
    numbers: list[list[str]] = field(default_factory=list)
    root_cause: list[list[str]] = field(default_factory=list)
    """The root-cause entities an investigation must name (ITBench-AA style), each
    ``[Kind] namespace/name`` with alternatives: ``Pod payments/worker-6d5f7c9b8-kq2lp``."""

    @property
    def empty(self) -> bool:
        """Nothing to check (a replayed 👎 answer nobody has written expectations for yet)."""
        return not (self.objects or self.reasons or self.numbers)

    def as_dict(self) -> dict[str, list[list[str]]]:
        """JSON-ready form (the shape :func:`parse_expect` reads back)."""
        found = {"objects": self.objects, "reasons": self.reasons, "numbers": self.numbers}
        if self.root_cause:
            found["root_cause"] = self.root_cause
        return found


@dataclass(slots=True)
class ReplayContext:
    """A stored request's redacted context bundle and prompt inputs (``opsbot feedback export``)."""

    sections: list[dict[str, Any]]
    notes: list[dict[str, Any]]
    history: list[dict[str, Any]] = field(default_factory=list)
    asker: str | None = None
    request_id: str = ""
    reference_answer: str | None = None
    feedback: int | None = None
    model: str | None = None
    investigation: dict[str, Any] | None = None
    """The live investigation's offered tools and recorded call outputs (:mod:`bot.tools.recorded`)."""


@dataclass(slots=True)
class EvalCase:
    """One incident case (see the module doc)."""

    id: str
    title: str
    question: str | None
    expect: Expectation
    source: str
    """The file it was read from (and the line, for JSONL)."""
    alert: dict[str, Any] | None = None
    """An Alertmanager webhook payload: the case is an alert notification, not a question."""
    scenario: str | None = None
    cluster: dict[str, Any] | None = None
    prometheus: dict[str, Any] | None = None
    replay: ReplayContext | None = None

    def kubernetes_server(self) -> kube_api.KubernetesSnapshotServer | None:
        """The case's cluster state as a (not yet started) Kubernetes API server."""
        return build_kubernetes(self.cluster, self.where) if self.cluster is not None else None

    def prometheus_server(self) -> PrometheusSnapshotServer | None:
        """The case's series and alerts as a (not yet started) Prometheus API server."""
        return build_prometheus(self.prometheus, self.where) if self.prometheus is not None else None

    @property
    def where(self) -> str:
        """``file: case id`` for error messages."""
        return f"{self.source}: case {self.id}"


def load_cases(paths: Sequence[Path]) -> list[EvalCase]:
    """Every case in ``paths`` (files or folders of ``*.yaml`` / ``*.yml`` / ``*.jsonl``), in file
    order; :class:`CaseError` for an unreadable file, a bad case or a repeated id."""
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml", ".jsonl"))
            if not found:
                raise CaseError(f"{path}: no case files (*.yaml, *.yml, *.jsonl) in this folder")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise CaseError(f"{path}: no such file or folder")
    cases: list[EvalCase] = []
    seen: dict[str, str] = {}
    for file in files:
        for case in _load_file(file):
            if case.id in seen:
                raise CaseError(f"{case.source}: case id {case.id!r} is already used by {seen[case.id]}")
            seen[case.id] = case.source
            cases.append(case)
    return cases


def _load_file(path: Path) -> list[EvalCase]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CaseError(f"{path}: cannot read: {exc}") from None
    if path.suffix == ".jsonl":
        cases = []
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CaseError(f"{path}:{number}: not JSON: {exc}") from None
            cases.append(parse_replay(data, f"{path}:{number}"))
        return cases
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CaseError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    items = data if isinstance(data, list) else [data]
    return [parse_case(item, str(path)) for item in items]


def _mapping(value: Any, where: str, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CaseError(f"{where}: {what} must be a mapping, got {type(value).__name__}")
    return value


def _unknown(data: Mapping[str, Any], allowed: set[str], where: str, what: str) -> None:
    extra = sorted(set(data) - allowed)
    if extra:
        raise CaseError(
            f"{where}: unknown {what} key(s) {', '.join(extra)} (known: {', '.join(sorted(allowed))})"
        )


def parse_expect(data: Any, where: str) -> Expectation:
    """The ``expect`` mapping: each list entry a string or a list of alternative strings."""
    if data is None:
        return Expectation()
    data = _mapping(data, where, "expect")
    _unknown(data, _EXPECT_KEYS, where, "expect")
    out = Expectation()
    for key in _EXPECT_KEYS:
        entries = data.get(key) or []
        if not isinstance(entries, list):
            raise CaseError(f"{where}: expect.{key} must be a list")
        for entry in entries:
            options = entry if isinstance(entry, list) else [entry]
            if not options or not all(isinstance(o, str | int | float) and str(o).strip() for o in options):
                raise CaseError(f"{where}: expect.{key} entry {entry!r} must be text or a list of texts")
            getattr(out, key).append([str(o) for o in options])
    return out


def _check_id(data: Mapping[str, Any], where: str) -> str:
    case_id = data.get("id")
    if not isinstance(case_id, str) or not _ID.match(case_id):
        raise CaseError(
            f"{where}: every case needs an id of lowercase letters, digits, '-', '.', '_' (got {case_id!r})"
        )
    return case_id


def _case_head(data: Any, source: str, what: str, keys: set[str]) -> tuple[dict[str, Any], str, str]:
    """A case's mapping, its checked id and ``file: case id`` for messages; unknown keys refused."""
    data = _mapping(data, source, f"a {what}")
    case_id = _check_id(data, source)
    where = f"{source}: case {case_id}"
    _unknown(data, keys, where, what)
    return data, case_id, where


def parse_case(data: Any, source: str) -> EvalCase:
    """One YAML case (see the module doc)."""
    data, case_id, where = _case_head(data, source, "case", _CASE_KEYS)
    question, alert = data.get("question"), data.get("alert")
    if (question is None) == (alert is None):
        raise CaseError(f"{where}: give exactly one of question or alert")
    if question is not None and (not isinstance(question, str) or not question.strip()):
        raise CaseError(f"{where}: question must be non-empty text")
    cluster = data.get("cluster")
    if cluster is not None:
        _unknown(_mapping(cluster, where, "cluster"), _CLUSTER_KEYS, where, "cluster")
    prometheus = data.get("prometheus")
    if prometheus is not None:
        _unknown(_mapping(prometheus, where, "prometheus"), {"alerts", "series"}, where, "prometheus")
    case = EvalCase(
        id=case_id,
        title=str(data.get("title") or case_id),
        question=question,
        expect=parse_expect(data.get("expect"), where),
        source=source,
        alert=alert_payload(_mapping(alert, where, "alert")) if alert is not None else None,
        scenario=data.get("scenario"),
        cluster=cluster,
        prometheus=prometheus,
    )
    # Build once now, so a typo in the state is reported when the file is read, not mid-run.
    case.kubernetes_server()
    case.prometheus_server()
    return case


def parse_replay(data: Any, source: str) -> EvalCase:
    """One line of ``opsbot feedback export``: a stored request replayed with its stored context."""
    data, case_id, where = _case_head(data, source, "replayed request", _REPLAY_KEYS)
    context = _mapping(data.get("context"), where, "context")
    sections = context.get("sections") or []
    for section in sections:
        if not isinstance(section, dict) or not {"source", "title", "body"} <= section.keys():
            raise CaseError(f"{where}: every context section needs source, title and body")
    question = data.get("question")
    if not isinstance(question, str) or not question.strip():
        raise CaseError(f"{where}: question must be non-empty text")
    feedback = data.get("feedback")
    return EvalCase(
        id=case_id,
        title=str(data.get("title") or case_id),
        question=question,
        expect=parse_expect(data.get("expect"), where),
        source=source,
        alert=data.get("alert") if isinstance(data.get("alert"), dict) else None,
        scenario=data.get("scenario"),
        replay=ReplayContext(
            sections=list(sections),
            notes=list(context.get("notes") or []),
            history=list(data.get("history") or []),
            asker=data.get("asker"),
            request_id=str(data.get("request_id") or ""),
            reference_answer=data.get("reference_answer"),
            feedback=int(feedback) if isinstance(feedback, int) else None,
            model=data.get("model"),
            investigation=data.get("investigation") if isinstance(data.get("investigation"), dict) else None,
        ),
    )


def alert_payload(alert: Mapping[str, Any]) -> dict[str, Any]:
    """An Alertmanager webhook payload (version 4) carrying one firing alert."""
    labels = {str(k): str(v) for k, v in (alert.get("labels") or {}).items()}
    annotations = {str(k): str(v) for k, v in (alert.get("annotations") or {}).items()}
    name = labels.get("alertname", "Alert")
    starts = kube_api.ts(float(alert.get("minutes_ago", 5)))
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{name}"}}',
        "status": "firing",
        "receiver": "opsbot",
        "groupLabels": {"alertname": name},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": "http://alertmanager.example:9093",
        "truncatedAlerts": 0,
        "alerts": [
            {
                "status": "firing",
                "labels": labels,
                "annotations": annotations,
                "startsAt": starts,
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus.example:9090/graph",
                "fingerprint": f"{zlib.crc32(name.encode()):016x}",
            }
        ],
    }


# -- cluster state -> API objects ---------------------------------------------------------------


def _call(builder: Any, kwargs: Mapping[str, Any], where: str, what: str) -> dict[str, Any]:
    try:
        result: dict[str, Any] = builder(**kwargs)
    except TypeError as exc:
        raise CaseError(f"{where}: bad {what} {dict(kwargs)!r}: {exc}") from None
    return result


_CONTAINER_SPEC_KEYS = {
    "resources",
    "env",
    "envFrom",
    "readinessProbe",
    "livenessProbe",
    "startupProbe",
    "ports",
    "volumeMounts",
    "args",
    "command",
}
"""Container keys passed through to the pod's container spec as written (real field names)."""


def _container(spec: Mapping[str, Any], image: str, where: str) -> dict[str, Any]:
    allowed = {
        "name",
        "image",
        "ready",
        "restarts",
        "waiting",
        "running_minutes",
        "terminated",
        "last_terminated",
        *_CONTAINER_SPEC_KEYS,
    }
    _unknown(spec, allowed, where, "container")
    state: dict[str, Any]
    if spec.get("waiting"):
        state = {"waiting": dict(spec["waiting"])}
    elif spec.get("terminated"):
        t = spec["terminated"]
        state = kube_api.terminated(t["reason"], int(t["exit_code"]), float(t.get("minutes_ago", 1)))
    else:
        state = {"running": {"startedAt": kube_api.ts(float(spec.get("running_minutes", 60)))}}
    last = spec.get("last_terminated")
    last_state = (
        kube_api.terminated(last["reason"], int(last["exit_code"]), float(last.get("minutes_ago", 1)))
        if last
        else None
    )
    return kube_api.container_status(
        str(spec.get("name", "app")),
        image=str(spec.get("image", image)),
        ready=bool(spec.get("ready", "waiting" not in state and "terminated" not in state)),
        restart_count=int(spec.get("restarts", 0)),
        state=state,
        last_state=last_state,
    )


def _owner(value: Any, where: str) -> tuple[str, str] | None:
    if value is None:
        return None
    kind, _, name = str(value).partition("/")
    if not name:
        raise CaseError(f"{where}: owner must be Kind/name (got {value!r})")
    return kind, name


def _pod(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    allowed = {
        "name",
        "namespace",
        "phase",
        "node",
        "owner",
        "labels",
        "annotations",
        "image",
        "reason",
        "resources",
        "env",
        "containers",
        "init_containers",
        "volumes",
        "ip",
        "message",
        "unschedulable",
    }
    _unknown(spec, allowed, where, "pod")
    image = str(spec.get("image", "registry.example.com/app:1.0.0"))
    containers = spec.get("containers", [{}])
    inits = spec.get("init_containers") or []
    statuses = [_container(c, image, where) for c in containers]
    init_statuses = [_container({"name": "init", **c}, image, where) for c in inits]
    container_specs = {
        str(c.get("name", "init" if c in inits else "app")): {
            k: v for k, v in c.items() if k in _CONTAINER_SPEC_KEYS
        }
        for c in [*containers, *inits]
    }
    conditions = None
    if spec.get("unschedulable"):
        conditions = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": str(spec["unschedulable"]),
                "lastTransitionTime": kube_api.ts(15),
            }
        ]
        statuses = []
    return kube_api.pod(
        str(spec["name"]),
        str(spec.get("namespace", "default")),
        phase=str(spec.get("phase", "Pending" if conditions else "Running")),
        statuses=statuses,
        node=None if conditions else spec.get("node", "worker-1"),
        labels=spec.get("labels"),
        owner=_owner(spec.get("owner"), where),
        annotations=spec.get("annotations"),
        env=spec.get("env"),
        conditions=conditions,
        image=image,
        reason=spec.get("reason"),
        resources=spec.get("resources"),
        container_specs=container_specs,
        init_statuses=init_statuses or None,
        volumes=spec.get("volumes"),
        ip=spec.get("ip"),
        message=spec.get("message"),
    )


def _event(spec: Mapping[str, Any], index: int, where: str) -> dict[str, Any]:
    allowed = {"namespace", "object", "reason", "message", "count", "minutes_ago", "type"}
    _unknown(spec, allowed, where, "event")
    kind, name = _owner(spec.get("object"), where) or ("Pod", "")
    return kube_api.event(
        str(spec.get("namespace", "default")),
        kind,
        name,
        str(spec["reason"]),
        str(spec["message"]),
        count=int(spec.get("count", 1)),
        minutes_ago=float(spec.get("minutes_ago", 1)),
        type_=str(spec.get("type", "Warning")),
        index=index,
    )


def build_kubernetes(cluster: Mapping[str, Any], where: str) -> kube_api.KubernetesSnapshotServer:
    """The API server for a case's ``cluster`` mapping (see the module doc)."""
    try:
        server = kube_api.KubernetesSnapshotServer(namespaces=list(cluster.get("namespaces") or []))
        server.pods = [_pod(p, where) for p in cluster.get("pods") or []]
        server.events = [_event(e, i, where) for i, e in enumerate(cluster.get("events") or [])]
        server.deployments = [
            _call(kube_api.deployment, _tupled(d, "progressing"), where, "deployment")
            for d in cluster.get("deployments") or []
        ]
        server.replicasets = [
            _call(kube_api.replicaset, r, where, "replicaset") for r in cluster.get("replicasets") or []
        ]
        server.statefulsets = [
            _call(kube_api.statefulset, s, where, "statefulset") for s in cluster.get("statefulsets") or []
        ]
        server.nodes = [
            _call(kube_api.node, _tupled(n, "pressure"), where, "node") for n in cluster.get("nodes") or []
        ]
        for name, (plural, builder) in _BUILDERS.items():
            built = [
                _call(builder, _kwargs(i, where), where, name.rstrip("s")) for i in cluster.get(name) or []
            ]
            setattr(server, plural, built)
        for log in cluster.get("logs") or []:
            _unknown(log, {"namespace", "pod", "container", "previous", "text"}, where, "log")
            key = (
                str(log.get("namespace", "default")),
                str(log["pod"]),
                str(log.get("container", "app")),
                bool(log.get("previous", False)),
            )
            server.logs[key] = str(log["text"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, CaseError):
            raise
        raise CaseError(f"{where}: bad cluster state: {type(exc).__name__} {exc}") from None
    return server


_BUILDERS: dict[str, tuple[str, Any]] = {
    "daemonsets": ("daemonsets", kube_api.daemonset),
    "services": ("services", kube_api.service),
    "configmaps": ("configmaps", kube_api.config_map),
    "secrets": ("secrets", kube_api.secret),
    "pvcs": ("persistentvolumeclaims", kube_api.persistent_volume_claim),
    "pvs": ("persistentvolumes", kube_api.persistent_volume),
    "storageclasses": ("storageclasses", kube_api.storage_class),
    "hpas": ("horizontalpodautoscalers", kube_api.horizontal_pod_autoscaler),
    "cronjobs": ("cronjobs", kube_api.cronjob),
    "jobs": ("jobs", kube_api.job),
}
"""Case keys built by one builder of :mod:`bot.eval.kube_api` each: (server attribute, builder)."""


def _kwargs(spec: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A case entry as builder arguments: ``type`` is ``type_``; ``claim`` / ``target`` are
    ``namespace/name`` / ``Kind/name`` pairs; list values of tuple arguments become tuples."""
    out = dict(spec)
    if "type" in out:
        out["type_"] = out.pop("type")
    for key in ("claim", "target"):
        if isinstance(out.get(key), str):
            out[key] = _owner(out[key], where)
    if isinstance(out.get("condition"), list):
        out["condition"] = tuple(out["condition"])
    if isinstance(out.get("conditions"), list):
        out["conditions"] = [tuple(c) for c in out["conditions"]]
    return out


def _tupled(spec: Mapping[str, Any], key: str) -> dict[str, Any]:
    out = dict(spec)
    if key in out and isinstance(out[key], list):
        out[key] = tuple(out[key])
    return out


def build_prometheus(spec: Mapping[str, Any], where: str) -> PrometheusSnapshotServer:
    """The Prometheus API server for a case's ``prometheus`` mapping (see the module doc)."""
    server = PrometheusSnapshotServer()
    try:
        for s in spec.get("series") or []:
            _unknown(s, {"metric", "labels", "values"}, where, "series")
            values = [float(v) for v in s["values"]]
            if not values:
                raise CaseError(f"{where}: series {s['metric']} has no values")
            server.series.append(
                Series(str(s["metric"]), {str(k): str(v) for k, v in (s.get("labels") or {}).items()}, values)
            )
        for a in spec.get("alerts") or []:
            _unknown(
                a, {"labels", "annotations", "state", "minutes_ago", "value", "expr", "for_s"}, where, "alert"
            )
            server.alerts.append(
                Alert(
                    labels={str(k): str(v) for k, v in (a.get("labels") or {}).items()},
                    annotations={str(k): str(v) for k, v in (a.get("annotations") or {}).items()},
                    state=str(a.get("state", "firing")),
                    active_at=kube_api.ts(float(a.get("minutes_ago", 5))).replace("Z", ".000Z"),
                    value=str(a.get("value", "")),
                    expr=str(a.get("expr", "")),
                    for_s=float(a.get("for_s", 0)),
                )
            )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CaseError):
            raise
        raise CaseError(f"{where}: bad prometheus data: {type(exc).__name__} {exc}") from None
    return server


def case_ids(cases: Iterable[EvalCase]) -> list[str]:
    """The ids, in order (for ``--case`` errors)."""
    return [c.id for c in cases]
