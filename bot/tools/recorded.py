"""Recorded tools: an investigation's calls and their redacted outputs, served back without a cluster.

A live investigation records the tools it offered (their exact schemas) and every call's output
(:meth:`bot.investigate.Investigation.replay_record`); the request row keeps them in its replay
inputs, ``opsbot feedback export`` writes them into the eval case, and ``opsbot eval`` replays the
case with these tools: a call the recording holds gets its recorded output (or error), any other
call the error a missing source would give. No API is asked, so a replay is the same on any machine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bot.context.gatherer import ContextGatherer
from bot.tools.base import Tool, ToolError, ToolOutput, ToolScope
from bot.tools.registry import ToolRegistry
from inference.tool_calls import ToolCall

NOT_RECORDED = "no recorded output for this call (a replay serves only the calls the live investigation made)"


class RecordedTool(Tool):
    """One tool as the live investigation offered it, answering from its recorded calls."""

    def __init__(
        self, name: str, description: str, parameters: Mapping[str, Any], calls: Sequence[Mapping[str, Any]]
    ):
        self.name = name
        self.description = description
        self._parameters = dict(parameters)
        self._outputs = {
            ToolCall(name, dict(c.get("arguments") or {})).key(): c for c in calls if c.get("name") == name
        }

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """The schema the live investigation offered (the same grammar, so the same choices)."""
        return self._parameters

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """The recorded output of this exact call; :class:`ToolError` with the recorded error, or
        for a call the recording does not hold."""
        found = self._outputs.get(ToolCall(self.name, dict(arguments)).key())
        if found is None:
            raise ToolError(NOT_RECORDED)
        if found.get("status") != "ok":
            raise ToolError(str(found.get("text") or "failed"))
        return ToolOutput(
            str(found.get("text") or ""), str(found.get("source") or ""), str(found.get("summary") or "")
        )


def recorded_registry(gatherer: ContextGatherer, recording: Mapping[str, Any]) -> ToolRegistry:
    """A registry of the recorded tools (``recording``: ``{"tools": [...], "calls": [...]}``)."""
    calls = [c for c in recording.get("calls") or [] if isinstance(c, Mapping)]
    tools: list[Tool] = [
        RecordedTool(str(t["name"]), str(t.get("description") or ""), t.get("parameters") or {}, calls)
        for t in recording.get("tools") or []
        if isinstance(t, Mapping) and t.get("name")
    ]
    return ToolRegistry(gatherer, tools=tools)
