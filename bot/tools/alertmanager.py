"""Alertmanager tools: the active alerts (with their silenced / inhibited state) and the active
silences, from Alertmanager's own API (:class:`~bot.context.alertmanager_api.AlertmanagerApi`).
Alerts and silences of namespaces outside the channel's scope are dropped and counted."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bot.context.alertmanager_api import AlertmanagerApiError
from bot.tools.base import Tool, ToolError, ToolOutput, ToolScope, dropped_note, obj, string, text_arg

_MAX_LISTED = 30


def _in_scope(scope: ToolScope, namespace: str | None) -> bool:
    allowed = scope.namespaces()
    return not allowed or not namespace or namespace in allowed


class _AlertmanagerTool(Tool):
    def available(self, scope: ToolScope) -> bool:
        """Offered when ``alertmanager.api_url`` is set."""
        return scope.alertmanager is not None

    async def _get(self, scope: ToolScope, path: str, params: Mapping[str, str]) -> Any:
        assert scope.alertmanager is not None
        try:
            return await scope.alertmanager.get(path, params)
        except AlertmanagerApiError as exc:
            raise ToolError(str(exc)) from exc


class AlertmanagerAlerts(_AlertmanagerTool):
    """Active alerts as Alertmanager holds them."""

    name = "am_alerts"
    description = "Alerts active in Alertmanager, with whether each is silenced or inhibited."

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """alertname (empty: all)."""
        return obj({"alertname": string("Only this alert; empty: all.")}, required=["alertname"])

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """One line per alert, newest first."""
        wanted = text_arg(arguments, "alertname")
        params = {"active": "true", "silenced": "true", "inhibited": "true"}
        if wanted:
            params["filter"] = f'alertname="{wanted}"'
        found = [a for a in await self._get(scope, "alerts", params) or [] if isinstance(a, dict)]
        inside = [a for a in found if _in_scope(scope, (a.get("labels") or {}).get("namespace"))]
        inside.sort(key=lambda a: str(a.get("startsAt")), reverse=True)
        lines = []
        for alert in inside[:_MAX_LISTED]:
            labels = dict(alert.get("labels") or {})
            name = labels.pop("alertname", "?")
            status = alert.get("status") or {}
            state = str(status.get("state") or "?")
            if status.get("silencedBy"):
                state += f" (silenced by {', '.join(status['silencedBy'])})"
            if status.get("inhibitedBy"):
                state += f" (inhibited by {', '.join(status['inhibitedBy'])})"
            summary = (alert.get("annotations") or {}).get("summary") or ""
            lines.append(
                f"{state} since {alert.get('startsAt', '?')}: {name} "
                + " ".join(f"{k}={v}" for k, v in sorted(labels.items()))
                + (f" - {summary}" if summary else "")
            )
        lines += dropped_note(len(found), len(inside), "alerts")
        return ToolOutput(
            "\n".join(lines) or "no active alerts",
            f"Alertmanager {scope.alertmanager.url}",  # type: ignore[union-attr]
            f"{len(inside)} alerts",
            ["GET /api/v2/alerts"],
        )


class AlertmanagerSilences(_AlertmanagerTool):
    """Silences in force (and pending), with who set them and why."""

    name = "am_silences"
    description = (
        "Silences in Alertmanager that are active or pending: matchers, who set them, why, until when."
    )

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """No arguments."""
        return obj({})

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """One line per silence."""
        found = [s for s in await self._get(scope, "silences", {}) or [] if isinstance(s, dict)]
        live = [s for s in found if (s.get("status") or {}).get("state") in ("active", "pending")]

        def namespace(silence: dict[str, Any]) -> str | None:
            for matcher in silence.get("matchers") or []:
                if (
                    matcher.get("name") == "namespace"
                    and matcher.get("isEqual", True)
                    and not matcher.get("isRegex")
                ):
                    return str(matcher.get("value"))
            return None

        inside = [s for s in live if _in_scope(scope, namespace(s))]
        lines = []
        for silence in inside[:_MAX_LISTED]:
            matchers = ", ".join(
                f"{m.get('name')}{'=' if m.get('isEqual', True) else '!'}{'~' if m.get('isRegex') else ''}"
                f'"{m.get("value")}"'
                for m in silence.get("matchers") or []
            )
            lines.append(
                f"{(silence.get('status') or {}).get('state')} until {silence.get('endsAt')}: {{{matchers}}} "
                f"by {silence.get('createdBy')}: {silence.get('comment')}"
            )
        lines += dropped_note(len(live), len(inside), "silences")
        return ToolOutput(
            "\n".join(lines) or "no active silences",
            f"Alertmanager {scope.alertmanager.url}",  # type: ignore[union-attr]
            f"{len(inside)} silences",
            ["GET /api/v2/silences"],
        )


def alertmanager_tools() -> list[Tool]:
    """The Alertmanager tools."""
    return [AlertmanagerAlerts(), AlertmanagerSilences()]
