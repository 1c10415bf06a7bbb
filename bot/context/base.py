"""The context seam: ``ContextProvider`` (one source of cluster facts) and the types it returns.

A provider never raises into the pipeline. It returns a :class:`ProviderResult` with a status, the
exact query it ran and the upstream error text (in the manner of HolmesGPT's
``StructuredToolResult``); the gatherer turns that into :class:`ContextSection` s for the prompt and
a :class:`~bot.types.SourceNote` for the answer's footer.

Status tree::

    ok       facts were found
    empty    the source answered, nothing relevant
    failed   the source answered with an error, or could not be reached
    timeout  the source did not answer within its deadline
    skipped  the provider had nothing to do for this question
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from bot.context.entities import Entities
from bot.types import SourceNote


class ProviderStatus(enum.StrEnum):
    """Outcome of one provider call (the values are those of :attr:`SourceNote.status`)."""

    OK = "ok"
    EMPTY = "empty"
    FAILED = "failed"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"


DropFrom = Literal["start", "end", "none"]


@dataclass(slots=True)
class ContextSection:
    """One labelled block of facts for the prompt.

    ``body`` is a list of lines, each with a rank (``ranks``, 0 the most decisive; without them every
    line has ``rank``). When the budget is short, whole lines are removed, the highest ranks of all
    sections first; among lines of one rank, from the side ``drop_from`` names (``start`` for
    chronological bodies such as log tails and events, so the newest lines stay; ``end`` for lists
    ordered most relevant first; ``none``: all or nothing).
    """

    source: str
    title: str
    body: str
    priority: int
    """Lower is more relevant; the budget keeps sections in this order."""
    unit: str = "lines"
    """What a cut removes, for the footer (``"older events"``, ``"older log lines of api/app"``)."""
    drop_from: DropFrom = "start"
    """Which end of ``body`` loses lines first when the section is cut (among lines of one rank)."""
    ranks: tuple[int, ...] | None = None
    """The rank of each line of ``body`` (0: decisive, 1: errors, 2: context, 3: filler; see
    :mod:`bot.context.logsig`); ``None``: every line has ``rank``."""
    rank: int = 1
    """The rank of every line when ``ranks`` is not given."""

    def lines(self) -> list[str]:
        """The body as lines (the units the budget cuts)."""
        return self.body.splitlines()

    def line_ranks(self) -> list[int]:
        """The rank of each line (``ranks`` when they match the body, else ``rank`` for all)."""
        lines = self.lines()
        if self.ranks is not None and len(self.ranks) == len(lines):
            return list(self.ranks)
        return [self.rank] * len(lines)


def ranked_section(
    *,
    source: str,
    title: str,
    lines: Sequence[tuple[str, int]],
    priority: int,
    unit: str,
    drop_from: DropFrom = "end",
) -> ContextSection:
    """A section from (line, rank) pairs (a line holding a newline is split, each part keeping the rank)."""
    flat = [(part, rank) for text, rank in lines for part in (text.splitlines() or [""])]
    return ContextSection(
        source=source,
        title=title,
        body="\n".join(text for text, _ in flat),
        priority=priority,
        unit=unit,
        drop_from=drop_from,
        ranks=tuple(rank for _, rank in flat),
    )


@dataclass(frozen=True, slots=True)
class UsedScope:
    """One cluster an answer read, and the namespaces it read there (``None``: all it may list)."""

    cluster: str
    namespaces: tuple[str, ...] | None = None

    def describe(self) -> str:
        """``cluster eu-west, namespaces payments, checkout`` (or ``all namespaces``)."""
        spaces = f"namespaces {', '.join(self.namespaces)}" if self.namespaces else "all namespaces"
        return f"cluster {self.cluster}, {spaces}"


@dataclass(slots=True)
class ContextBundle:
    """Everything gathered for one question."""

    sections: list[ContextSection]
    notes: list[SourceNote]
    elapsed_ms: float
    scope: list[UsedScope] = field(default_factory=list)
    """The clusters and namespaces read (empty: none, e.g. a channel outside every scope)."""
    scope_notes: list[str] = field(default_factory=list)
    """What the channel's scope kept out ("cluster us-east is outside this channel's scope")."""
    scoped: bool = False
    """True when any cluster source is configured (then the footer states the scope)."""

    def scope_text(self) -> str | None:
        """The scope line of the footer and the prompt, or ``None`` with no cluster source at all."""
        if not self.scoped:
            return None
        used = "; ".join(u.describe() for u in self.scope) or "no cluster (this channel has no cluster scope)"
        return used + "".join(f" ({note})" for note in self.scope_notes)


@dataclass(frozen=True, slots=True)
class ContextRequest:
    """What a provider is asked: the question, its scenario and the entities found in it."""

    question: str
    scenario: str
    entities: Entities
    alert: dict[str, Any] | None = None
    cluster: str = ""
    """The cluster asked (the provider is that cluster's; shared providers read it too)."""
    namespaces: tuple[str, ...] | None = None
    """Namespaces this answer may read (the channel's scope within the cluster's configuration);
    ``None``: the provider's configured namespaces."""

    def cache_key(self) -> tuple[object, ...]:
        """Requests with equal keys get the same facts (for the gatherer's short-lived cache): the
        scope is part of it, so one channel is never served another channel's namespaces."""
        return (self.scenario, self.entities.key(), self.cluster, self.namespaces)


@dataclass(frozen=True, slots=True)
class WorkloadFacts:
    """One workload a provider found relevant, for the others to query (Prometheus: its error rate,
    latency and saturation)."""

    namespace: str
    kind: str
    name: str
    pods: tuple[str, ...] = ()
    services: tuple[str, ...] = ()
    role: str = "asked"
    """``asked`` (the question is about it), ``dependency`` (what an asked-about pod calls) or
    ``neighbour`` (shares a node with one)."""


@dataclass(frozen=True, slots=True)
class Findings:
    """What one provider found that another can follow (Kubernetes -> Prometheus): the workloads in
    question and around them, their nodes and the pods on those nodes, pressure on them."""

    workloads: tuple[WorkloadFacts, ...] = ()
    nodes: tuple[str, ...] = ()
    node_pods: tuple[tuple[str, str, str], ...] = ()
    """(node, namespace, pod) of every pod on ``nodes``."""
    pressure: tuple[tuple[str, str], ...] = ()
    """(node, condition) of the nodes' pressure conditions (``DiskPressure`` ...)."""

    def key(self) -> tuple[object, ...]:
        """Hashable form, for caches."""
        return (self.workloads, self.nodes, self.node_pods, self.pressure)

    def __bool__(self) -> bool:
        return bool(self.workloads or self.nodes)


@dataclass(slots=True)
class ProviderResult:
    """What one provider found, with the query and upstream error behind it."""

    source: str
    status: ProviderStatus
    sections: list[ContextSection] = field(default_factory=list)
    query: str = ""
    """What was asked of the source (API paths, PromQL), for the footer and the logs."""
    error: str | None = None
    """Upstream error text when ``status`` is failed or timeout (or a partial failure when ok)."""
    target: str = ""
    """Where the source lives (a URL or kubeconfig context)."""
    elapsed_ms: float = 0.0
    links: list[str] = field(default_factory=list)
    """Documents the answer used that the footer links (runbook URLs or files)."""
    findings: Findings | None = None
    """What other providers of the same cluster may follow (see :meth:`ContextProvider.follow`)."""

    @classmethod
    def failed(cls, source: str, target: str, query: str, error: str) -> ProviderResult:
        """A failure result."""
        return cls(source=source, status=ProviderStatus.FAILED, query=query, error=error, target=target)


class ContextProvider(abc.ABC):
    """One source of cluster facts (Kubernetes, Prometheus, ...)."""

    name: str = "abstract"
    """Display name in footers and notes (``Kubernetes``, ``Prometheus``)."""

    @property
    @abc.abstractmethod
    def target(self) -> str:
        """Where the source lives, for error notes (a URL or a kubeconfig context)."""

    @property
    @abc.abstractmethod
    def timeout_s(self) -> float:
        """This provider's own deadline."""

    @abc.abstractmethod
    async def fetch(self, request: ContextRequest) -> ProviderResult:
        """Facts for ``request``; errors are returned as a failed result, never raised."""

    def cache_key(self, request: ContextRequest) -> tuple[object, ...]:
        """What makes two requests the same for this provider (default: the request's key)."""
        return request.cache_key()

    async def follow(self, request: ContextRequest, findings: Findings) -> ProviderResult | None:
        """A second round from what the other providers of the cluster found (``findings``), within
        what is left of the deadline; ``None``: nothing to follow (the default)."""
        return None

    async def check(self) -> str | None:
        """One cheap request to the source (the start banner's health check): ``None`` when it
        answered, else why not, in one line. A provider with nothing remote to ask (runbook files)
        keeps this default."""
        return None

    async def close(self) -> None:  # noqa: B027 - optional hook, most providers hold nothing
        """Release connections."""
