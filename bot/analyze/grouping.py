"""Grouping before generation: near-identical records are summarised once.

Two alerts are alike when they have the same ``alertname`` and the same labels once the
*instance-like* ones are set aside (``instance``, ``pod``, ``pod_ip``, ``node``, container ids ...:
:data:`INSTANCE_LABELS`) and replica hashes in the values are masked (``checkout-api-7d9f8b6c4-x2x9z``
and ``checkout-api-5c8d9f7b6-q7w2k`` are both ``checkout-api-*``). The same alert firing again later
(a new ``startsAt``) joins its group as another firing; the same firing seen twice (a webhook dump
repeats every alert in each notification of its group) counts once.

Kubernetes events are alike when reason, type, namespace, object kind, the object's name without
its hash or ordinal, and the message with its numbers and names masked agree; a watched event seen
again with a higher ``count`` replaces the older copy. Log lines are alike when file, level and the
message template (numbers, ids, addresses, hashes masked) agree.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from bot.analyze.records import Group, Record
from bot.config import INSTANCE_LABELS

_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"  # Kubernetes' alphabet for generated name suffixes
_DEPLOYMENT_POD = re.compile(rf"^(?P<base>.+)-{_SAFE}{{6,10}}-{_SAFE}{{5}}$")
_HASH_SUFFIX = re.compile(rf"^(?P<base>.+)-(?:{_SAFE}{{6,10}}|\d{{6,}})$")  # ReplicaSet, CronJob's Job
_SHORT_SUFFIX = re.compile(rf"^(?P<base>.+)-{_SAFE}{{5}}$")  # DaemonSet and Job pods
_ORDINAL = re.compile(r"^(?P<base>.+)-\d+$")  # StatefulSet pods
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I)
_IP = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b|\[[0-9a-f:]+\](?::\d+)?")
_HEX = re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{12,}\b", re.I)
_TIME = re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")
_NAME_TOKEN = re.compile(r"(?<![A-Za-z0-9.-])[a-z0-9]+(?:[-.][a-z0-9]+)+(?![A-Za-z0-9-])")
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:[a-zA-Z%]{0,3})?\b")
_TEMPLATE_CHARS = 200


def normalise_value(value: str) -> str:
    """A label value with what differs between replicas masked: generated name suffixes, UUIDs,
    addresses, long hex ids (``checkout-api-7d9f8b6c4-x2x9z`` -> ``checkout-api-*``)."""
    if _UUID.fullmatch(value) or _IP.fullmatch(value) or _HEX.fullmatch(value):
        return "*"
    for pattern in (_DEPLOYMENT_POD, _HASH_SUFFIX, _SHORT_SUFFIX):
        if match := pattern.match(value):
            return match.group("base") + "-*"
    return value


def normalise_name(name: str) -> str:
    """An object name without its generated suffix or StatefulSet ordinal."""
    masked = normalise_value(name)
    if masked == name and (match := _ORDINAL.match(name)):
        return match.group("base") + "-*"
    return masked


def template(text: str) -> str:
    """The shape of a message: times, ids, addresses, generated names and numbers masked, so
    ``restarted 3 times`` and ``restarted 7 times`` read alike (first line, at most 200 characters)."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    out = _TIME.sub("<time>", first)
    out = _UUID.sub("<uuid>", out)
    out = _IP.sub("<ip>", out)
    out = _HEX.sub("<hex>", out)
    out = _NAME_TOKEN.sub(lambda m: normalise_name(m.group(0)), out)
    out = _NUMBER.sub("<n>", out)
    return " ".join(out.split())[:_TEMPLATE_CHARS]


@dataclass(slots=True)
class GroupingResult:
    """Groups, largest first, and what grouping merged."""

    groups: list[Group]
    records: int
    """Records that went in (after the time window), repeats included."""
    repeats_merged: int
    """Records dropped as repeats of one firing (or older copies of a watched event)."""

    @property
    def items(self) -> int:
        """Records left once repeats are merged: what would be summarised one by one without grouping."""
        return self.records - self.repeats_merged


def group_records(
    records: Iterable[Record], instance_labels: Iterable[str] = INSTANCE_LABELS
) -> GroupingResult:
    """Group near-identical records (see the module doc); largest groups first."""
    instance = frozenset(instance_labels)
    groups: dict[str, Group] = {}
    seen: dict[tuple[str, str, str], int] = {}  # (group, what repeats share) -> index in the group
    total = merged = 0
    for record in records:
        total += 1
        key_parts, labels, name, varying = _shape(record, instance)
        key = hashlib.sha256(json.dumps(key_parts, sort_keys=True).encode()).hexdigest()[:16]
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(key=key, kind=record.kind, name=name, labels=labels)
        repeat = _repeat_key(record)
        if repeat is not None and (key, *repeat) in seen:
            index = seen[(key, *repeat)]
            merged += 1
            group.repeats_merged += 1
            if _newer(record, group.records[index]):
                group.records[index] = record
            continue
        if repeat is not None:
            seen[(key, *repeat)] = len(group.records)
        group.records.append(record)
        for label, value in varying.items():
            values = group.varying.setdefault(label, [])
            if value not in values:
                values.append(value)
    for group in groups.values():
        group.records.sort(key=lambda r: (r.at is None, r.at.timestamp() if r.at else 0.0, r.source))
    ordered = sorted(
        groups.values(),
        key=lambda g: (
            -g.occurrences,
            _severity_rank(g),
            g.first is None,
            g.first.timestamp() if g.first else 0.0,
            g.key,
        ),
    )
    return GroupingResult(groups=ordered, records=total, repeats_merged=merged)


def _repeat_key(record: Record) -> tuple[str, str] | None:
    """What two copies of one firing share: an alert's fingerprint and start, a watched event's uid
    (its newer copies carry a higher count); log lines never repeat (each one happened)."""
    if record.kind == "alert":
        return record.identity, record.at.isoformat() if record.at else record.source
    if record.kind == "event":
        return record.identity, ""
    return None


def _newer(record: Record, old: Record) -> bool:
    """Whether ``record`` should replace its repeat ``old``: the newer copy of a watched event, the
    resolved copy of an alert (it knows when the alert ended)."""
    if record.kind == "event":
        later = (record.at.timestamp() if record.at else 0.0) > (old.at.timestamp() if old.at else 0.0)
        return record.count > old.count or (record.count == old.count and later)
    return record.status == "resolved" and old.status != "resolved"


def _shape(
    record: Record, instance: frozenset[str]
) -> tuple[list[object], dict[str, str], str, dict[str, str]]:
    """What makes ``record`` alike to others (the key parts), the labels its group shows, the
    group's name, and the instance-like values it varies by."""
    if record.kind == "alert":
        shared = {
            k: normalise_value(v)
            for k, v in sorted(record.labels.items())
            if k not in instance and k != "alertname"
        }
        varying = {k: v for k, v in record.labels.items() if k in instance}
        alert_key: list[object] = ["alert", record.name, sorted(shared.items())]
        return alert_key, shared, record.name, varying
    if record.kind == "event":
        labels = record.labels
        shape = template(record.text)
        shared = {
            "namespace": labels.get("namespace", ""),
            "object_kind": labels.get("object_kind", ""),
            "object": normalise_name(labels.get("object", "")),
            "type": labels.get("type", ""),
        }
        key: list[object] = ["event", record.name, sorted(shared.items()), shape]
        return key, {k: v for k, v in shared.items() if v}, record.name, {"object": labels.get("object", "")}
    shape = template(record.text)
    shared = {"file": record.labels.get("file", ""), "level": record.labels.get("level", "")}
    log_key: list[object] = ["log", sorted(shared.items()), shape]
    return log_key, shared, shape or "(empty line)", {}


_SEVERITY = {"critical": 0, "page": 0, "error": 1, "high": 1, "warning": 2, "warn": 2, "info": 3, "none": 4}


def _severity_rank(group: Group) -> int:
    severity = group.labels.get("severity") or group.labels.get("level") or group.labels.get("type") or ""
    return _SEVERITY.get(severity.lower(), 5)


def severity(group: Group) -> str:
    """The group's severity as its data says it (``severity`` label, log level, event type)."""
    return group.labels.get("severity") or group.labels.get("level") or group.labels.get("type") or ""
