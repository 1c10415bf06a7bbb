"""Tools over what people wrote: runbooks by alert name, and the chat thread searched by a word.

The runbook tool asks the shared :class:`~bot.context.runbooks.RunbookProvider` as the gathering
does (annotation URL, folder, base URL, each host allow-listed); the thread tool searches the turns
and the thread read back that the pipeline already holds for this request (no platform call).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.context.base import ContextRequest, ProviderStatus
from bot.context.entities import Entities
from bot.context.runbooks import RunbookProvider
from bot.tools.base import Tool, ToolError, ToolOutput, ToolScope, obj, string, text_arg

_MAX_HITS = 20


class Runbook(Tool):
    """The runbook of an alert."""

    name = "runbook"
    description = "The team's runbook for an alert (by alert name)."

    def available(self, scope: ToolScope) -> bool:
        """Offered when runbooks are configured."""
        return any(isinstance(p, RunbookProvider) for p in scope.shared)

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """alert."""
        return obj({"alert": string("Alert name, e.g. KubePodCrashLooping.", 80)}, required=["alert"])

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """The runbook's text."""
        alert = text_arg(arguments, "alert")
        if not alert:
            raise ToolError("runbook needs an alert name")
        provider = next(p for p in scope.shared if isinstance(p, RunbookProvider))
        first = scope.clusters[0] if scope.clusters else None
        request = ContextRequest(
            question=alert,
            scenario="root_cause",
            entities=Entities(alert_names=[alert]),
            cluster=first.name if first else "",
            namespaces=first.namespaces if first else None,
        )
        result = await provider.fetch(request)
        if result.status is not ProviderStatus.OK:
            raise ToolError(result.error or f"no runbook found for {alert}")
        text = "\n\n".join(f"{s.title}\n{s.body}" for s in result.sections)
        return ToolOutput(text, f"Runbooks {provider.target}", f"runbook of {alert}", [result.query])


class ThreadSearch(Tool):
    """Earlier messages of this chat thread containing a word."""

    name = "thread_search"
    description = "Search the earlier messages of this chat thread for a word (who said what, when)."

    def available(self, scope: ToolScope) -> bool:
        """Offered when the request has a thread to search."""
        return bool(scope.thread or scope.thread_sections)

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """text."""
        return obj({"text": string("Word or phrase to look for (case-insensitive).", 60)}, required=["text"])

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """Matching lines, oldest first."""
        word = text_arg(arguments, "text").lower()
        if not word:
            raise ToolError("thread_search needs a word to look for")
        lines = [
            line
            for section in scope.thread_sections
            for line in section.body.splitlines()
            if word in line.lower()
        ]
        lines += [
            f"{m.created_at:%H:%M} {m.user or m.role}: {line}"
            for m in scope.thread
            for line in m.content.splitlines()
            if word in line.lower()
        ]
        hits = list(dict.fromkeys(lines))
        shown = hits[-_MAX_HITS:]
        if len(hits) > _MAX_HITS:
            shown.insert(0, f"[{len(hits) - _MAX_HITS} older matching lines not listed]")
        return ToolOutput(
            "\n".join(shown) or f"no message of this thread contains {word!r}",
            "chat thread",
            f"{len(hits)} matching lines",
        )


def document_tools() -> list[Tool]:
    """The runbook and thread tools."""
    return [Runbook(), ThreadSearch()]
