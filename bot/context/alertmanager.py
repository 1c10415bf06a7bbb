"""Alertmanager notifications as data: parsing a webhook payload, and the alerts as prompt context.

Payload (webhook version 4)::

    {"version": "4", "groupKey": "{}:{alertname=\\"X\\"}", "truncatedAlerts": 0,
     "status": "firing" | "resolved", "receiver": "opsbot",
     "groupLabels": {...}, "commonLabels": {...}, "commonAnnotations": {...}, "externalURL": "...",
     "alerts": [{"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL",
                 "fingerprint"}, ...]}

The receiver that turns notifications into alert threads is an inbound adapter:
:mod:`bot.adapters.alertmanager`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from bot.context.base import ContextSection
from bot.errors import OpsbotError
from bot.redact import redact
from bot.types import clean_text

SOURCE = "Alertmanager"
_MAX_ALERTS_IN_TEXT = 20


class PayloadError(OpsbotError, ValueError):
    """The webhook body is not an Alertmanager notification."""


def parse_payload(body: bytes) -> dict[str, Any]:
    """The notification in ``body``; :class:`PayloadError` says what is wrong."""
    try:
        payload = _cleaned(json.loads(body))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"body is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise PayloadError("body must be a JSON object (an Alertmanager webhook notification)")
    missing = [key for key in ("groupKey", "status", "alerts") if key not in payload]
    if missing:
        raise PayloadError(f"not an Alertmanager notification: missing {', '.join(missing)}")
    if not isinstance(payload["alerts"], list) or not all(isinstance(a, dict) for a in payload["alerts"]):
        raise PayloadError("'alerts' must be a list of objects")
    if payload["status"] not in ("firing", "resolved"):
        raise PayloadError(f"'status' must be 'firing' or 'resolved', got {payload['status']!r}")
    if not isinstance(payload["groupKey"], str) or not payload["groupKey"]:
        raise PayloadError("'groupKey' must be a non-empty string")
    # The webhook's documented shape: label and annotation sets are string -> string maps, the
    # other fields strings. Checked here so that processing, later and in the background, can
    # trust it (a list where a map belongs would fail there, with nobody to tell).
    _check_fields(payload, "", _GROUP_MAPS, _GROUP_TEXTS)
    for index, alert in enumerate(payload["alerts"]):
        _check_fields(alert, f"alerts[{index}].", _ALERT_MAPS, _ALERT_TEXTS)
    return payload


def _cleaned(value: Any) -> Any:
    """``value`` with every string made encodable (JSON escapes can carry lone surrogates and NUL,
    which the store and the tokenizer refuse): see :func:`bot.types.clean_text`."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, list):
        return [_cleaned(v) for v in value]
    if isinstance(value, dict):
        return {_cleaned(k): _cleaned(v) for k, v in value.items()}
    return value


_GROUP_MAPS = ("groupLabels", "commonLabels", "commonAnnotations")
_GROUP_TEXTS = ("receiver", "externalURL", "version")
_ALERT_MAPS = ("labels", "annotations")
_ALERT_TEXTS = ("status", "startsAt", "endsAt", "generatorURL", "fingerprint")


def _check_fields(data: Mapping[str, Any], where: str, maps: tuple[str, ...], texts: tuple[str, ...]) -> None:
    for key in maps:
        value = data.get(key)
        if value is None:
            continue
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise PayloadError(f"'{where}{key}' must be an object of string values")
    for key in texts:
        if data.get(key) is not None and not isinstance(data[key], str):
            raise PayloadError(f"'{where}{key}' must be a string")


def firing(payload: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The alerts of ``payload`` that are firing."""
    return [a for a in payload.get("alerts", []) if a.get("status") == "firing"]


def fingerprint(alert: Mapping[str, Any]) -> str:
    """Alertmanager's fingerprint, or a stable hash of the labels when it is missing (version < 4)."""
    value = alert.get("fingerprint")
    if isinstance(value, str) and value:
        return value
    labels = json.dumps(alert.get("labels", {}), sort_keys=True)
    return hashlib.sha256(labels.encode()).hexdigest()[:16]


def notification_digest(payload: Mapping[str, Any]) -> str:
    """Hash of the firing fingerprints and the status: equal for repeats of one notification."""
    prints = sorted(fingerprint(a) for a in firing(payload))
    return hashlib.sha256(json.dumps([payload.get("status"), prints]).encode()).hexdigest()[:16]


def _alert_line(alert: Mapping[str, Any], common: Mapping[str, Any]) -> str:
    labels = {k: v for k, v in (alert.get("labels") or {}).items() if common.get(k) != v or k == "alertname"}
    name = labels.pop("alertname", (alert.get("labels") or {}).get("alertname", "?"))
    annotations = alert.get("annotations") or {}
    summary = annotations.get("summary") or annotations.get("description") or annotations.get("message") or ""
    label_text = " ".join(f"{k}={v}" for k, v in sorted(labels.items()))
    since = alert.get("startsAt", "?")
    return f"[{alert.get('status', '?')}] {name} {label_text} since {since}" + (
        f": {summary}" if summary else ""
    )


def describe(payload: Mapping[str, Any]) -> str:
    """A plain-text description of a notification (the question opsbot answers for it)."""
    alerts = payload.get("alerts", [])
    common = payload.get("commonLabels") or {}
    name = common.get("alertname") or (payload.get("groupLabels") or {}).get("alertname") or "alerts"
    lines = [
        f"Alertmanager notification: {len(firing(payload))} firing, "
        f"{len(alerts) - len(firing(payload))} resolved alert(s) in group {name} "
        f"(status {payload.get('status')}).",
    ]
    if common:
        lines.append("Common labels: " + " ".join(f"{k}={v}" for k, v in sorted(common.items())))
    common_annotations = payload.get("commonAnnotations") or {}
    for key in ("summary", "description", "runbook_url"):
        if common_annotations.get(key):
            lines.append(f"{key}: {common_annotations[key]}")
    for alert in alerts[:_MAX_ALERTS_IN_TEXT]:
        lines.append("- " + _alert_line(alert, common))
    if len(alerts) > _MAX_ALERTS_IN_TEXT:
        lines.append(f"- ... and {len(alerts) - _MAX_ALERTS_IN_TEXT} more")
    if payload.get("truncatedAlerts"):
        lines.append(f"({payload['truncatedAlerts']} further alerts were truncated by Alertmanager)")
    lines.append("Summarise what is happening, the likely cause and the first checks to run.")
    return redact("\n".join(lines), where="alert")


def alert_section(payload: Mapping[str, Any]) -> ContextSection | None:
    """The alerts of a notification as a context section (most relevant of all: priority 0)."""
    alerts = payload.get("alerts")
    if not isinstance(alerts, list) or not alerts:
        return None
    common = payload.get("commonLabels") or {}
    lines = []
    for alert in alerts:
        if not isinstance(alert, Mapping):
            continue
        lines.append(_alert_line(alert, common))
        annotations = alert.get("annotations") or {}
        for key, value in sorted(annotations.items()):
            if key not in ("summary",):
                lines.append(f"    {key}: {value}")
    name = common.get("alertname") or "alert group"
    return ContextSection(
        source=SOURCE,
        title=f"Alert {name}: {len(firing(payload))} firing of {len(alerts)} (common labels "
        + " ".join(f"{k}={v}" for k, v in sorted(common.items()))
        + ")",
        body="\n".join(lines),
        priority=0,
        unit="more alert lines",
        drop_from="end",
    )


_GROUP_LABELS = re.compile(r":\{([^{}]*)\}$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def group_labels(group_key: str) -> dict[str, str]:
    """The group labels in an Alertmanager ``groupKey`` (``{}/{team="a"}:{alertname="X", ...}``:
    the route's matchers, then the group's label set)."""
    found = _GROUP_LABELS.search(group_key)
    if found is None:
        return {}
    labels: dict[str, str] = {}
    for name, value in _LABEL.findall(found.group(1)):
        try:
            labels[name] = json.loads(f'"{value}"')  # Go's %q escapes are JSON's for these
        except ValueError:
            labels[name] = value
    return labels


def thread_reference(group_key: str) -> dict[str, Any]:
    """An alert thread's group as a payload without alerts: its group labels (common to every alert
    of the group), for context on questions asked in the thread after the summary."""
    labels = group_labels(group_key)
    return {"groupKey": group_key, "groupLabels": labels, "commonLabels": labels, "alerts": []}
