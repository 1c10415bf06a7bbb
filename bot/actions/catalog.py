"""The closed set of actions opsbot can propose, each with its JSON schema, its risk and its inverse.

Nothing outside this set can be proposed, let alone applied: a proposal (from ``/rca propose``, the
investigation loop's ``propose_action`` tool, or a ``kubectl`` command an answer suggests) is
parsed into an :class:`ActionSpec` here, and every field is checked against the kind's schema
before any API sees it. The schemas are plain JSON Schema so a tool-calling engine can be
constrained to them.

Kinds: ``rollout_restart`` (Deployment, StatefulSet, DaemonSet), ``rollback`` (a Deployment to a
revision: 0 = the previous one), ``scale`` (Deployment, StatefulSet), ``delete_pod``, ``cordon`` /
``uncordon`` (a node), ``silence`` (create an Alertmanager silence) and ``expire_silence``.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.errors import OpsbotError

_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
"""A DNS-1123 subdomain: every object name these actions touch."""
_NAME_RE = re.compile(_NAME)
_WORKLOADS = {"deployment": "deployments", "statefulset": "statefulsets", "daemonset": "daemonsets"}
_SHORT = {
    "deploy": "deployment",
    "deployments": "deployment",
    "sts": "statefulset",
    "statefulsets": "statefulset",
    "ds": "daemonset",
    "daemonsets": "daemonset",
    "po": "pod",
    "pods": "pod",
    "no": "node",
    "nodes": "node",
}


class ActionError(OpsbotError, ValueError):
    """A proposal that is not in the catalog or does not fit its kind's schema (the text says why)."""


_TARGET = {"type": "string", "pattern": _NAME, "maxLength": 253}
_NS = {"type": "string", "pattern": _NAME, "maxLength": 63}
_MATCHER = {
    "type": "object",
    "required": ["name", "value"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 100},
        "value": {"type": "string", "maxLength": 1000},
        "isRegex": {"type": "boolean"},
        "isEqual": {"type": "boolean"},
    },
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "rollout_restart": {
        "required": ["kind", "namespace", "name"],
        "properties": {
            "kind": {"enum": ["deployment", "statefulset", "daemonset"]},
            "namespace": _NS,
            "name": _TARGET,
        },
    },
    "rollback": {
        "required": ["kind", "namespace", "name"],
        "properties": {
            "kind": {"enum": ["deployment"]},
            "namespace": _NS,
            "name": _TARGET,
            "revision": {"type": "integer", "minimum": 0},
        },
    },
    "scale": {
        "required": ["kind", "namespace", "name", "replicas"],
        "properties": {
            "kind": {"enum": ["deployment", "statefulset"]},
            "namespace": _NS,
            "name": _TARGET,
            "replicas": {"type": "integer", "minimum": 0, "maximum": 1000},
        },
    },
    "delete_pod": {
        "required": ["kind", "namespace", "name"],
        "properties": {"kind": {"enum": ["pod"]}, "namespace": _NS, "name": _TARGET},
    },
    "cordon": {"required": ["kind", "name"], "properties": {"kind": {"enum": ["node"]}, "name": _TARGET}},
    "uncordon": {"required": ["kind", "name"], "properties": {"kind": {"enum": ["node"]}, "name": _TARGET}},
    "silence": {
        "required": ["matchers", "duration_m", "comment"],
        "properties": {
            "matchers": {"type": "array", "items": _MATCHER, "minItems": 1, "maxItems": 20},
            "duration_m": {"type": "integer", "minimum": 1, "maximum": 7 * 24 * 60},
            "comment": {"type": "string", "minLength": 1, "maxLength": 500},
        },
    },
    "expire_silence": {
        "required": ["silence_id"],
        "properties": {"silence_id": {"type": "string", "pattern": "^[0-9a-fA-F-]{8,64}$"}},
    },
}
"""Each kind's parameters as JSON Schema (``type: object``, no other properties), for the tool."""

RISK: dict[str, str] = {
    "rollout_restart": "medium: every pod is replaced, one surge at a time (readiness gates traffic)",
    "rollback": "medium: the pod template goes back to an older revision; pods are replaced",
    "scale": "medium to high: fewer replicas mean less capacity; more need room on the nodes",
    "delete_pod": "low: its controller creates a new pod (a bare pod is gone for good)",
    "cordon": "low: running pods stay; no new pod lands on the node",
    "uncordon": "low: the node takes new pods again",
    "silence": "medium: matching alerts stop notifying until the silence ends",
    "expire_silence": "low: matching alerts notify again",
}
"""What can go wrong, shown on every card."""

KINDS = tuple(SCHEMAS)


@dataclass(frozen=True)
class ActionSpec:
    """One action from the catalog: its kind and its checked parameters."""

    action: str
    """A key of :data:`SCHEMAS`."""
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check(self.action, self.params)

    @property
    def namespace(self) -> str | None:
        """The namespace it touches (``None``: cluster-scoped or not Kubernetes)."""
        ns = self.params.get("namespace")
        return str(ns) if ns else None

    @property
    def target(self) -> str:
        """What it acts on, as a person reads it (``deployment/api -n shop``, ``node/n1``)."""
        p = self.params
        if self.action == "silence":
            return "alerts " + ",".join(_matcher_text(m) for m in p["matchers"])
        if self.action == "expire_silence":
            return f"silence/{p['silence_id']}"
        where = f" -n {p['namespace']}" if p.get("namespace") else ""
        return f"{p['kind']}/{p['name']}{where}"

    @property
    def is_kubernetes(self) -> bool:
        """True for the actions applied to the Kubernetes API (the rest go to Alertmanager)."""
        return self.action not in ("silence", "expire_silence")

    def describe(self) -> str:
        """One line: what it does (``Restart deployment/api -n shop``)."""
        p = self.params
        if self.action == "rollout_restart":
            return f"Rollout restart {self.target}"
        if self.action == "rollback":
            rev = p.get("revision") or 0
            return f"Roll back {self.target} to " + (f"revision {rev}" if rev else "the previous revision")
        if self.action == "scale":
            return f"Scale {self.target} to {p['replicas']} replicas"
        if self.action == "delete_pod":
            return f"Delete {self.target}"
        if self.action in ("cordon", "uncordon"):
            return f"{self.action.capitalize()} {self.target}"
        if self.action == "silence":
            return f"Silence {self.target} for {p['duration_m']} min"
        return f"Expire {self.target}"

    def canonical(self) -> str:
        """The spec as canonical JSON (what the digest and the audit row hold)."""
        return json.dumps(
            {"action": self.action, "params": self.params}, sort_keys=True, separators=(",", ":")
        )

    def digest(self) -> str:
        """SHA-256 of :meth:`canonical`: the buttons sign it, so a card cannot be repointed."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> ActionSpec:
        """The spec :meth:`canonical` wrote."""
        data = json.loads(text)
        return cls(str(data["action"]), dict(data["params"]))


PROPOSABLE = ("rollout_restart", "rollback", "scale", "delete_pod", "cordon", "uncordon")
"""The kinds a model may propose (``propose_action``): the Kubernetes ones. Silences stay a
person's command: their matchers select alerts, and a model's guess at them could hide the page."""


def name_schema(max_length: int) -> dict[str, Any]:
    """A DNS-1123 name of at most ``max_length`` characters, its pattern bounded alike (a grammar
    built from the pattern then admits nothing longer than ``maxLength`` says)."""
    return {
        "type": "string",
        "pattern": f"^[a-z0-9]([-a-z0-9.]{{0,{max_length - 2}}}[a-z0-9])?$",
        "maxLength": max_length,
    }


def tool_schema(namespaces: Sequence[str] = (), name_max: int = 63, max_step: int = 50) -> dict[str, Any]:
    """The ``propose_action`` tool's arguments, a closed object (what the OpenAI ``tools`` form
    requires at the top): ``action`` one of :data:`PROPOSABLE`, ``params`` one of their parameter
    schemas (a namespace one of ``namespaces`` when given, names at most ``name_max`` characters),
    a one-line ``why`` and the ``steps`` whose outputs show it. Bounded, so a grammar constrains a
    call wholly; that ``params`` fit ``action`` is checked when the call runs (:func:`check`)."""
    options: list[dict[str, Any]] = []
    for action in PROPOSABLE:
        schema = SCHEMAS[action]
        props: dict[str, Any] = {}
        for key, value in schema["properties"].items():
            if key == "namespace":
                value = {"type": "string", "enum": list(namespaces)} if namespaces else name_schema(63)
            elif key == "name":
                value = name_schema(name_max)
            props[key] = value
        option = {
            "type": "object",
            "properties": props,
            "required": list(schema["required"]),
            "additionalProperties": False,
        }
        if option not in options:  # cordon and uncordon take the same parameters
            options.append(option)
    return {
        "type": "object",
        "properties": {
            "action": {"type": "string", "enum": list(PROPOSABLE)},
            "params": {"anyOf": options},
            "why": {"type": "string", "maxLength": 200},
            "steps": {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": max_step},
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["action", "params", "why", "steps"],
        "additionalProperties": False,
    }


def check(action: str, params: dict[str, Any]) -> None:
    """Raise :class:`ActionError` unless ``params`` fit ``action``'s schema exactly."""
    schema = SCHEMAS.get(action)
    if schema is None:
        raise ActionError(f"unknown action {action!r} (known: {', '.join(KINDS)})")
    if not isinstance(params, dict):
        raise ActionError(f"{action}: parameters must be an object")
    _check_object(action, params, schema)


def _check_object(where: str, value: dict[str, Any], schema: dict[str, Any]) -> None:
    props: dict[str, Any] = schema["properties"]
    for key in schema.get("required", []):
        if key not in value:
            raise ActionError(f"{where}: {key} is required")
    for key, item in value.items():
        if key not in props:
            raise ActionError(f"{where}: unknown parameter {key!r}")
        _check_value(f"{where}.{key}", item, props[key])


def _check_value(where: str, value: Any, schema: dict[str, Any]) -> None:
    if "enum" in schema and value not in schema["enum"]:
        raise ActionError(f"{where}: {value!r} is not one of {', '.join(map(str, schema['enum']))}")
    kind = schema.get("type")
    if kind == "string":
        if not isinstance(value, str):
            raise ActionError(f"{where}: expected a string")
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 10_000):
            raise ActionError(f"{where}: length {len(value)} out of bounds")
        if "pattern" in schema and not re.match(schema["pattern"], value):
            raise ActionError(f"{where}: {value!r} is not a valid name")
    elif kind == "integer":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ActionError(f"{where}: expected an integer")
        if value < schema.get("minimum", value) or value > schema.get("maximum", value):
            raise ActionError(f"{where}: {value} out of range")
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise ActionError(f"{where}: expected true or false")
    elif kind == "array":
        if not isinstance(value, list) or not schema["minItems"] <= len(value) <= schema["maxItems"]:
            raise ActionError(f"{where}: expected {schema['minItems']} to {schema['maxItems']} items")
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                raise ActionError(f"{where}[{index}]: expected an object")
            _check_object(f"{where}[{index}]", item, schema["items"])


def _matcher_text(m: dict[str, Any]) -> str:
    op = (
        ("=~" if m.get("isRegex") else "=")
        if m.get("isEqual", True)
        else ("!~" if m.get("isRegex") else "!=")
    )
    return f"{m['name']}{op}{m['value']}"


_COMMAND_WORDS = {
    "restart": "rollout_restart",
    "rollback": "rollback",
    "undo": "rollback",
    "scale": "scale",
    "delete": "delete_pod",
    "cordon": "cordon",
    "uncordon": "uncordon",
    "silence": "silence",
    "expire": "expire_silence",
    "unsilence": "expire_silence",
}
COMMAND_USAGE = (
    "`propose restart deployment/NAME -n NS` · `propose rollback deployment/NAME -n NS [--to-revision N]` · "
    "`propose scale deployment/NAME -n NS --replicas N` · `propose delete pod/NAME -n NS` · "
    "`propose cordon node/NAME` · `propose uncordon node/NAME` · "
    "`propose silence alertname=X [label=value ...] --for 60m --comment TEXT` · `propose expire silence/ID`"
)
"""The words of ``/rca propose``."""


def parse_command(text: str) -> ActionSpec:
    """``restart deployment/api -n shop`` (the words after ``propose``) as a checked spec.

    Raises :class:`ActionError` with the usage when the words are not one of the catalog's forms.
    """
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ActionError(f"cannot read {text!r}: {exc}") from exc
    if not words or words[0].lower() not in _COMMAND_WORDS:
        raise ActionError("say which action: " + COMMAND_USAGE)
    action = _COMMAND_WORDS[words[0].lower()]
    flags: dict[str, str] = {}
    rest: list[str] = []
    i = 1
    while i < len(words):
        word = words[i]
        if word.startswith("-") and i + 1 < len(words):
            key = word.lstrip("-").lower()
            flags[{"n": "namespace", "for": "duration", "to-revision": "revision"}.get(key, key)] = words[
                i + 1
            ]
            i += 2
            continue
        if word.startswith("--") and "=" in word:
            key, _, val = word[2:].partition("=")
            flags[{"for": "duration", "to-revision": "revision"}.get(key.lower(), key.lower())] = val
        else:
            rest.append(word)
        i += 1
    if action == "silence":
        matchers = []
        for word in rest:
            name, sep, value = word.partition("=")
            if not sep:
                raise ActionError(f"silence: {word!r} is not label=value; " + COMMAND_USAGE)
            matchers.append({"name": name, "value": value, "isRegex": False, "isEqual": True})
        return ActionSpec(
            action,
            {
                "matchers": matchers,
                "duration_m": _minutes(flags.pop("duration", "60m")),
                "comment": flags.pop("comment", "via opsbot"),
            },
        )
    if len(rest) != 1:
        raise ActionError(f"{words[0]}: name exactly one target; " + COMMAND_USAGE)
    kind, sep, name = rest[0].partition("/")
    if action == "expire_silence":
        return ActionSpec(action, {"silence_id": name if sep else kind})
    if not sep:
        kind, name = (
            {"delete_pod": "pod", "cordon": "node", "uncordon": "node"}.get(action, "deployment"),
            kind,
        )
    kind = canonical_kind(kind)
    params: dict[str, Any] = {"kind": kind, "name": name}
    if kind != "node":
        params["namespace"] = flags.pop("namespace", "default")
    if action == "scale":
        params["replicas"] = _integer(flags.pop("replicas", ""), "--replicas")
    if action == "rollback" and "revision" in flags:
        params["revision"] = _integer(flags.pop("revision"), "--to-revision")
    return ActionSpec(action, params)


def canonical_kind(word: str) -> str:
    """A resource word as the catalog names its kind (``deploy``, ``deployments`` -> ``deployment``)."""
    return _SHORT.get(word.lower(), word.lower())


def _integer(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ActionError(f"{what} needs a whole number, not {text!r}") from None


def _minutes(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([mhd]?)", text.strip().lower())
    if not match:
        raise ActionError(f"--for {text!r}: say 30m, 2h or 1d")
    return int(match.group(1)) * {"": 1, "m": 1, "h": 60, "d": 1440}[match.group(2)]


def resource_path(spec: ActionSpec) -> str:
    """The API path of the object a Kubernetes action touches."""
    p = spec.params
    if p["kind"] == "node":
        return f"/api/v1/nodes/{p['name']}"
    if p["kind"] == "pod":
        return f"/api/v1/namespaces/{p['namespace']}/pods/{p['name']}"
    return f"/apis/apps/v1/namespaces/{p['namespace']}/{_WORKLOADS[p['kind']]}/{p['name']}"


def is_name(text: str) -> bool:
    """True for a valid object name."""
    return bool(_NAME_RE.match(text))
