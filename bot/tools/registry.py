"""The tool registry: which tools exist, and one request's :class:`ToolBox` that runs them safely.

Every call takes the same path, whatever the tool (HolmesGPT's ``StructuredToolResult`` in spirit:
a result with a status, never an exception into the loop):

    parse (the engine's decision, already schema-shaped) -> offered? -> repeated? -> scope (the
    tool's own check of cluster and namespace arguments) -> run within the tool's timeout ->
    redact -> cap at ``max_output_tokens`` (whole lines, with a note of what was cut)

The scope is the request's: the clusters and namespaces its channel may read, taken from step 0's
bundle, never from anything the model or the data says. A tool output can therefore not widen
the scope, offer itself more tools or change a budget: those are fixed before the first step.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bot import metrics
from bot.context.alertmanager_api import AlertmanagerApi
from bot.context.base import ContextBundle
from bot.context.gatherer import ContextGatherer
from bot.context.thread import SOURCE as THREAD_SOURCE
from bot.redact import redact
from bot.store import ThreadMessage
from bot.tools.actions import action_tools
from bot.tools.alertmanager import alertmanager_tools
from bot.tools.base import ClusterTools, ProposedAction, Tool, ToolError, ToolScope
from bot.tools.documents import document_tools
from bot.tools.kubernetes import kubernetes_tools
from bot.tools.prometheus import prometheus_tools
from inference.engine import ToolSpec
from inference.tool_calls import ToolCall

logger = logging.getLogger(__name__)

CHRONOLOGICAL = frozenset({"kube_logs", "kube_events"})
"""Tools whose output is oldest first: a cut keeps the newest lines (the end)."""


@dataclass(slots=True)
class ToolResult:
    """One call's outcome, as the model, the store and the live step line see it."""

    call: ToolCall
    status: str
    """``ok``, ``error`` (the tool failed or refused: out of scope, not found), ``timeout``,
    ``repeated`` (the same call again: refused) or ``unknown`` (no such tool)."""
    text: str
    """The redacted, capped output (or the error) the model reads."""
    source: str = ""
    summary: str = ""
    latency_ms: float = 0.0
    output_tokens: int = 0
    cut_tokens: int = 0
    """Tokens the cap removed (0: the whole output fitted)."""
    proposal: ProposedAction | None = None
    """The fix a ``propose_action`` call recorded."""


class ToolRegistry:
    """The tools opsbot has, over the providers of a :class:`ContextGatherer` (the same clients)."""

    def __init__(
        self,
        gatherer: ContextGatherer,
        tools: Sequence[Tool] | None = None,
        alertmanager: AlertmanagerApi | None = None,
    ) -> None:
        self.gatherer = gatherer
        self.alertmanager = alertmanager
        self.tools = (
            list(tools)
            if tools is not None
            else [
                *kubernetes_tools(),
                *prometheus_tools(),
                *alertmanager_tools(),
                *document_tools(),
                *action_tools(),
            ]
        )

    async def close(self) -> None:
        """Close the clients the registry owns (the gatherer closes its providers itself)."""
        if self.alertmanager is not None:
            await self.alertmanager.close()

    def scope_for(
        self,
        bundle: ContextBundle | None,
        history: Sequence[ThreadMessage] = (),
        *,
        may_propose: bool = False,
    ) -> ToolScope:
        """The tools' scope of one request: the clusters and namespaces step 0 read (the channel's
        scope, decided by the gatherer), the shared providers, the thread it was asked in, and
        whether its channel takes proposals (``may_propose``, decided by the actions' policy)."""
        clusters = {c.name: c for c in self.gatherer.clusters}
        used = bundle.scope if bundle is not None else []
        return ToolScope(
            clusters=[
                ClusterTools(u.cluster, u.namespaces, clusters[u.cluster].providers)
                for u in used
                if u.cluster in clusters
            ],
            shared=self.gatherer.shared,
            thread=list(history),
            thread_sections=[s for s in (bundle.sections if bundle else []) if s.source == THREAD_SOURCE],
            alertmanager=self.alertmanager,
            may_propose=may_propose,
        )

    def box(
        self,
        scope: ToolScope,
        *,
        max_output_tokens: int,
        count: Callable[[str], int],
        timeout_s: float = 5.0,
    ) -> ToolBox:
        """A request's tool box: the tools available in ``scope``, each call within ``timeout_s``
        and its output capped at ``max_output_tokens``."""
        available = [t for t in self.tools if t.available(scope)]
        return ToolBox(available, scope, max_output_tokens, count, timeout_s)


class ToolBox:
    """The tools one investigation may call, and the calls it made (see the module docstring)."""

    def __init__(
        self,
        tools: Sequence[Tool],
        scope: ToolScope,
        max_output_tokens: int,
        count: Callable[[str], int],
        timeout_s: float = 5.0,
    ) -> None:
        self.tools = {t.name: t for t in tools}
        self.timeout_s = timeout_s
        self.scope = scope
        self.max_output_tokens = max_output_tokens
        self.count = count
        self._seen: set[str] = set()
        self._specs = tuple(ToolSpec(t.name, t.description, t.parameters(scope)) for t in tools)

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """The tools' specs (fixed when the box is made: nothing a call returns changes them)."""
        return self._specs

    async def call(self, call: ToolCall, max_tokens: int | None = None) -> ToolResult:
        """Run ``call`` on the path of the module docstring; never raises for a tool's failure.
        ``max_tokens``: a lower cap for this output than the box's (the room left in the window)."""
        started = time.perf_counter()
        cap = self.max_output_tokens if max_tokens is None else min(self.max_output_tokens, max_tokens)
        result = await self._call(call, cap)
        result.latency_ms = (time.perf_counter() - started) * 1000
        result.output_tokens = self.count(result.text)
        metrics.TOOL_CALLS.labels(
            tool=call.name if call.name in self.tools else "unknown", status=result.status
        ).inc()
        return result

    async def _call(self, call: ToolCall, cap: int) -> ToolResult:
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolResult(
                call, "unknown", f"there is no tool {call.name!r}; tools: {', '.join(self.tools)}"
            )
        key = call.key()
        if key in self._seen:
            # Loop detection: the model already has this output; a second run would read the same.
            return ToolResult(
                call,
                "repeated",
                "this exact call was already made: its output is above; call something else or answer",
            )
        self._seen.add(key)
        try:
            output = await asyncio.wait_for(tool.run(call.arguments, self.scope), self.timeout_s)
        except TimeoutError:
            return ToolResult(
                call, "timeout", f"{call.name} took longer than {self.timeout_s:g} s and was stopped"
            )
        except ToolError as exc:
            return ToolResult(call, "error", redact(str(exc), where="tools"))
        except Exception as exc:  # a tool bug costs the step, never the answer
            logger.exception("tool %s failed", call.name)
            return ToolResult(
                call, "error", redact(f"{call.name} failed: {type(exc).__name__}: {exc}", where="tools")
            )
        text = redact(output.text, where="tools")
        text, cut = self._capped(text, cap, keep_end=call.name in CHRONOLOGICAL)
        return ToolResult(
            call,
            "ok",
            text,
            redact(output.source, where="tools"),
            redact(output.summary, where="tools"),
            cut_tokens=cut,
            proposal=output.proposal,
        )

    def _capped(self, text: str, cap: int, *, keep_end: bool) -> tuple[str, int]:
        """``text`` within ``cap`` tokens, whole lines, with a note of what was cut."""
        total = self.count(text)
        if total <= cap:
            return text, 0
        lines = text.splitlines()
        kept: list[str] = []
        used = 0
        budget = cap - 24  # room for the note
        for line in reversed(lines) if keep_end else lines:
            cost = self.count(line) + 1
            if used + cost > budget:
                break
            kept.append(line)
            used += cost
        if keep_end:
            kept.reverse()
        dropped = len(lines) - len(kept)
        which = "older" if keep_end else "further"
        note = f"[cut: {dropped} {which} lines, about {total - used} tokens over the {cap}-token cap]"
        body = "\n".join([note, *kept] if keep_end else [*kept, note])
        return body, total - used
