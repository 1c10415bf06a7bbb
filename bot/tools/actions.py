"""``propose_action``: the one tool that is not a read. The model may propose a fix from the closed
catalog (:mod:`bot.actions.catalog`); the call only records it. After the answer, the pipeline
offers each recorded proposal as a card with its server-side dry run, and a person approves or
rejects it (:mod:`bot.actions.service`). Neither this tool nor the model holds the write
credentials, and a proposal outside the channel's scope is refused like any out-of-scope read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.actions.catalog import ActionError, ActionSpec, tool_schema
from bot.tools.base import NAME_MAX, OutOfScope, ProposedAction, Tool, ToolError, ToolOutput, ToolScope

SOURCE = "opsbot actions (proposal only)"
PROPOSE_ACTION = "propose_action"


class ProposeAction(Tool):
    """Record one fix for a person to approve."""

    name = PROPOSE_ACTION
    description = (
        "Propose ONE fix for a person to approve (restart, roll back, scale, delete a pod, cordon, "
        "uncordon), citing the steps that show it is needed. You cannot apply it: after your answer "
        "the thread gets a card with its dry run, and only a person can approve it."
    )

    def available(self, scope: ToolScope) -> bool:
        """Offered when the request's channel lets someone approve proposals."""
        return scope.may_propose

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """action, params (that action's), why, steps."""
        return tool_schema(scope.namespaces(), name_max=NAME_MAX)

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """The proposal recorded (after its catalog and scope checks); nothing is sent anywhere."""
        params = arguments.get("params")
        try:
            spec = ActionSpec(
                str(arguments.get("action", "")), dict(params) if isinstance(params, dict) else {}
            )
        except ActionError as exc:
            raise ToolError(f"not a proposable action: {exc}") from exc
        readable = scope.namespaces()
        if spec.namespace is not None and readable and spec.namespace not in readable:
            raise OutOfScope(
                f"namespace {spec.namespace} is outside this channel's scope ({', '.join(readable)})"
            )
        if spec.namespace is None and readable:
            raise OutOfScope("this channel's scope is namespaces: a node action cannot be proposed here")
        why = str(arguments.get("why") or "").strip()[:200]
        steps = tuple(sorted({n for n in arguments.get("steps") or [] if isinstance(n, int) and n >= 0}))
        return ToolOutput(
            f"Recorded: {spec.describe()}. After your answer the thread shows it as a card with its "
            "dry run; a person approves or rejects it. Say in your answer that you proposed it.",
            SOURCE,
            f"proposed: {spec.describe()}",
            proposal=ProposedAction(spec, why, steps),
        )


def action_tools() -> list[Tool]:
    """The proposal tool."""
    return [ProposeAction()]
