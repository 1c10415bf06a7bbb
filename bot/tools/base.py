"""The tool seam: :class:`Tool` (one read-only question an investigation may ask) and what it gets.

A tool declares its name, a one-line description and the JSON Schema of its arguments (what the
engines constrain their calls to, :mod:`inference.tool_calls`). It runs with a :class:`ToolScope`:
the clusters and namespaces the channel may read, with each cluster's providers (the same clients
the context providers use: one connection pool, one configuration). A tool checks its arguments
against the scope and raises :class:`ToolError` for a call outside it; the model sees that error
as the step's output, so it can ask again within scope. What a tool returns is plain text: the
registry (:mod:`bot.tools.registry`) applies the timeout, redaction and the token cap to every
tool alike, so no tool can skip them.

Errors::

    ToolError          the call is refused or failed: its message is the step's output
    └── OutOfScope     the arguments name a cluster or namespace outside the channel's scope
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bot.actions.catalog import ActionSpec
from bot.context.alertmanager_api import AlertmanagerApi
from bot.context.base import ContextProvider, ContextSection
from bot.errors import OpsbotError
from bot.store import ThreadMessage

NAME_MAX = 63
"""Longest Kubernetes object name a call may carry (DNS label); bounds a constrained call's length."""


class ToolError(OpsbotError):
    """A tool call refused or failed; the message is what the model reads as the step's output."""


class OutOfScope(ToolError):
    """The call names a cluster or namespace this channel may not read."""


@dataclass(slots=True)
class ClusterTools:
    """One cluster an investigation may read: its name, namespaces and providers."""

    name: str
    namespaces: tuple[str, ...] | None
    """Namespaces the channel may read there (``None``: all the cluster lets opsbot list)."""
    providers: Sequence[ContextProvider] = ()

    def provider(self, kind: type[Any]) -> Any:
        """This cluster's provider of class ``kind``, or ``None``."""
        return next((p for p in self.providers if isinstance(p, kind)), None)


@dataclass(slots=True)
class ToolScope:
    """What one investigation's tools may read: the channel's clusters, shared providers (runbooks)
    and the chat thread it was asked in."""

    clusters: list[ClusterTools]
    shared: Sequence[ContextProvider] = ()
    thread: Sequence[ThreadMessage] = ()
    """Stored turns of the thread (oldest first)."""
    thread_sections: Sequence[ContextSection] = ()
    """The thread as read back from the platform (the gathered sections of the chat thread)."""
    alertmanager: AlertmanagerApi | None = None
    """Alertmanager's API (``alertmanager.api_url``), when configured."""
    may_propose: bool = False
    """Whether a fix may be proposed here (actions on, and the channel's policy names an approver)."""

    def cluster(self, name: str | None) -> ClusterTools:
        """The cluster ``name`` (``None`` or empty: the first in scope); :class:`OutOfScope` else."""
        if not self.clusters:
            raise OutOfScope("this channel may read no cluster (no cluster scope)")
        if not name:
            return self.clusters[0]
        for cluster in self.clusters:
            if cluster.name == name:
                return cluster
        readable = ", ".join(c.name for c in self.clusters)
        raise OutOfScope(f"cluster {name} is outside this channel's scope (readable: {readable})")

    def check_namespace(self, cluster: ClusterTools, namespace: str | None) -> None:
        """:class:`OutOfScope` when ``namespace`` is outside what the channel may read in ``cluster``."""
        if namespace and cluster.namespaces is not None and namespace not in cluster.namespaces:
            raise OutOfScope(
                f"namespace {namespace} is outside this channel's scope in cluster {cluster.name} "
                f"(readable: {', '.join(cluster.namespaces)})"
            )

    def namespaces(self) -> list[str]:
        """Every namespace named by the scope (empty when some cluster may read all)."""
        if any(c.namespaces is None for c in self.clusters):
            return []
        return sorted({n for c in self.clusters for n in c.namespaces or ()})


@dataclass(slots=True)
class ToolOutput:
    """What a tool found: the text for the model and where it came from (for the footer, the step
    record and the live step line)."""

    text: str
    source: str
    """Where the facts came from (``Kubernetes eu-west``, ``Prometheus http://...``)."""
    summary: str = ""
    """One line for the live step list (``12 events``, ``3 series``)."""
    queries: list[str] = field(default_factory=list)
    proposal: ProposedAction | None = None
    """A fix the call proposed (``propose_action``): offered as a card after the answer."""


@dataclass(frozen=True, slots=True)
class ProposedAction:
    """A fix the model proposed during an investigation: never applied by it; after the answer a
    person sees the card (its dry run) and decides."""

    spec: ActionSpec
    why: str
    """The model's one line (untrusted text: shown as the model's, mentions defused)."""
    steps: tuple[int, ...]
    """The steps whose outputs the model says show it."""


class Tool(abc.ABC):
    """One read-only question an investigation may ask (see the module docstring)."""

    name: str = "abstract"
    description: str = ""

    @abc.abstractmethod
    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """The JSON Schema of the arguments (closed object; strings bounded) for ``scope``."""

    @abc.abstractmethod
    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """Run the call; :class:`ToolError` (its message shown to the model) when refused or failed."""

    def available(self, scope: ToolScope) -> bool:
        """Whether this tool has anything to read in ``scope`` (a tool without its source is not offered)."""
        return True


def string(description: str, max_length: int = NAME_MAX, enum: Sequence[str] | None = None) -> dict[str, Any]:
    """A bounded string argument (an enum when the values are known: then a call cannot misspell it)."""
    if enum:
        return {"type": "string", "enum": list(enum), "description": description}
    return {"type": "string", "maxLength": max_length, "description": description}


def dropped_note(total: int, kept: int, what: str, indent: str = "") -> list[str]:
    """The line saying how many ``what`` a listing left out as outside the channel's namespaces
    (none when nothing was): the model learns they exist, never what they say."""
    if kept >= total:
        return []
    return [f"{indent}[{total - kept} {what} of namespaces outside this channel's scope dropped]"]


def cluster_arg(scope: ToolScope) -> dict[str, Any] | None:
    """The optional cluster argument: only offered when the scope holds several (one fewer field
    for a model to fill, and one it cannot fill wrongly)."""
    names = [c.name for c in scope.clusters]
    return string("Cluster (default: the first in scope).", enum=names) if len(names) > 1 else None


def integer(description: str, minimum: int, maximum: int) -> dict[str, Any]:
    """A bounded integer argument."""
    return {"type": "integer", "minimum": minimum, "maximum": maximum, "description": description}


def obj(properties: Mapping[str, Any | None], required: Sequence[str] = ()) -> dict[str, Any]:
    """A closed object of ``properties`` (``None`` ones left out; required ones first: a grammar
    writes them in order)."""
    present = {k: v for k, v in properties.items() if v is not None}
    ordered = {k: present[k] for k in required} | {k: v for k, v in present.items() if k not in required}
    return {
        "type": "object",
        "properties": ordered,
        "required": list(required),
        "additionalProperties": False,
    }


def text_arg(arguments: Mapping[str, Any], key: str, default: str = "") -> str:
    """``arguments[key]`` as a stripped string (a model may send a number where a name belongs)."""
    value = arguments.get(key, default)
    return str(value).strip() if value is not None else default


def object_name(name: str, namespace: str = "", kind: str = "") -> str:
    """``name`` without leading parts that repeat its namespace or its kind: Kubernetes names hold
    no "/", so ``shop/api-1`` in namespace ``shop`` and kubectl's ``pod/api-1`` are the object
    ``api-1``. Models write both (SmolLM2 called ``kube_get name=payments/worker-...`` and named
    ``payments/payments/worker-...`` as the root cause); any other prefix is kept as written."""
    parts = name.split("/")
    repeated = {namespace.lower(), kind.lower(), kind.lower() + "s"} - {""}
    while len(parts) > 1 and parts[0].strip().lower() in repeated:
        parts.pop(0)
    return "/".join(parts)


def int_arg(arguments: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    """``arguments[key]`` as an int within ``[low, high]`` (the schema's bounds, enforced again for
    a server that does not constrain)."""
    try:
        value = int(arguments.get(key, default))
    except (TypeError, ValueError):
        value = default
    return max(low, min(high, value))
