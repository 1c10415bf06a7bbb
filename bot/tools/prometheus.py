"""Prometheus tools: an instant or range query summarised per series, the alerts that fire, and the
alerting rules behind them.

Queries go through the cluster's :class:`~bot.context.prometheus.PrometheusProvider` (its session,
URL and bearer token). A range query is summarised as the gathered metrics are (min / max / last
and a trend, over points downsampled to at most 60 steps), never dumped; series of namespaces
outside the channel's scope are dropped and counted, so a query cannot read another channel's
namespaces however it is written.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from bot.context.prometheus import (
    NamespaceFilter,
    PrometheusError,
    PrometheusProvider,
    finite,
    format_value,
    series_labels,
    summarise,
)
from bot.tools.base import (
    ClusterTools,
    Tool,
    ToolError,
    ToolOutput,
    ToolScope,
    cluster_arg,
    dropped_note,
    int_arg,
    integer,
    obj,
    string,
    text_arg,
)

_MAX_SERIES = 15
_MAX_POINTS = 60
_UNITS = ("", "bytes", "seconds", "ratio", "cores")


class _PromTool(Tool):
    def available(self, scope: ToolScope) -> bool:
        """Offered when some cluster in scope has a Prometheus."""
        return any(c.provider(PrometheusProvider) is not None for c in scope.clusters)

    @staticmethod
    def _provider(scope: ToolScope, arguments: Mapping[str, Any]) -> tuple[ClusterTools, PrometheusProvider]:
        cluster = scope.cluster(text_arg(arguments, "cluster") or None)
        provider = cluster.provider(PrometheusProvider)
        if provider is None:
            raise ToolError(f"cluster {cluster.name} has no Prometheus configured")
        return cluster, provider

    @staticmethod
    def _filter(cluster: ClusterTools) -> NamespaceFilter:
        return NamespaceFilter(list(cluster.namespaces or ()))


class PromQuery(_PromTool):
    """PromQL, instant (``minutes`` 0) or over the last minutes, summarised per series."""

    name = "prom_query"
    description = (
        "Run a PromQL query: the current value per series (minutes 0), or min / max / last and trend "
        "over the last N minutes."
    )

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """query, minutes, unit, cluster."""
        return obj(
            {
                "query": string("PromQL expression.", 120),
                "minutes": integer("Range in minutes; 0 for the current value.", 0, 1440),
                "unit": string("Unit of the values.", enum=list(_UNITS)),
                "cluster": cluster_arg(scope),
            },
            required=["query", "minutes"],
        )

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """One line per series in scope."""
        promql = text_arg(arguments, "query")
        if not promql:
            raise ToolError("prom_query needs a query")
        minutes = int_arg(arguments, "minutes", 0, 0, 1440)
        unit = text_arg(arguments, "unit")
        unit = unit if unit in _UNITS else ""
        cluster, provider = self._provider(scope, arguments)
        keep = self._filter(cluster)
        try:
            if minutes:
                end = time.time()
                step = max(15.0, minutes * 60 / _MAX_POINTS)
                data = await provider.api(
                    "query_range",
                    {
                        "query": promql,
                        "start": f"{end - minutes * 60:.3f}",
                        "end": f"{end:.3f}",
                        "step": f"{step:g}",
                    },
                )
            else:
                data = await provider.api("query", {"query": promql})
        except PrometheusError as exc:
            raise ToolError(str(exc)) from exc
        result = (data or {}).get("result", [])
        if (data or {}).get("resultType") == "scalar" and isinstance(result, list) and len(result) == 2:
            return ToolOutput(
                f"{promql}: {format_value(float(result[1]), unit)}", self._where(provider), "1 value"
            )
        series = [s for s in result if isinstance(s, dict)]
        inside = [s for s in series if keep(s.get("metric"))]
        lines = []
        for s in inside[:_MAX_SERIES]:
            labels = series_labels(s.get("metric") or {})
            if minutes:
                points = [float(v) for _, v in s.get("values", []) if finite(v)]
                if points:
                    lines.append(f"{labels}: {summarise(points, unit)}")
            else:
                value = (s.get("value") or [0, "NaN"])[1]
                lines.append(f"{labels}: {format_value(float(value), unit) if finite(value) else value}")
        if len(inside) > _MAX_SERIES:
            lines.append(f"[{len(inside) - _MAX_SERIES} more series not listed]")
        lines += dropped_note(len(series), len(inside), "series")
        window = f"last {minutes} min" if minutes else "now"
        return ToolOutput(
            "\n".join(lines) or f"no series for {promql} ({window})",
            self._where(provider),
            f"{len(inside)} series ({window})",
            [promql],
        )

    @staticmethod
    def _where(provider: PrometheusProvider) -> str:
        return f"Prometheus {provider.target}"


class PromAlerts(_PromTool):
    """The alerts Prometheus holds (firing and pending), in scope."""

    name = "prom_alerts"
    description = "Alerts that are firing or pending in Prometheus, with labels, since when and summary."

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """alertname filter, cluster."""
        return obj(
            {"alertname": string("Only this alert; empty: all."), "cluster": cluster_arg(scope)},
            required=["alertname"],
        )

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """One line per alert."""
        wanted = text_arg(arguments, "alertname")
        cluster, provider = self._provider(scope, arguments)
        keep = self._filter(cluster)
        try:
            data = await provider.api("alerts", {})
        except PrometheusError as exc:
            raise ToolError(str(exc)) from exc
        alerts = [a for a in (data or {}).get("alerts", []) if isinstance(a, dict) and keep(a.get("labels"))]
        if wanted:
            alerts = [a for a in alerts if (a.get("labels") or {}).get("alertname") == wanted]
        lines = []
        for alert in alerts[: _MAX_SERIES * 2]:
            labels = dict(alert.get("labels") or {})
            name = labels.pop("alertname", "?")
            annotations = alert.get("annotations") or {}
            summary = annotations.get("summary") or annotations.get("description") or ""
            lines.append(
                f"{alert.get('state', '?')} since {alert.get('activeAt', '?')}: {name} "
                + " ".join(f"{k}={v}" for k, v in sorted(labels.items()))
                + (f" - {summary}" if summary else "")
            )
        return ToolOutput(
            "\n".join(lines) or "no alerts firing or pending",
            f"Prometheus {provider.target}",
            f"{len(alerts)} alerts",
            ["GET /api/v1/alerts"],
        )


class PromRules(_PromTool):
    """The alerting rules behind the alerts: expression, ``for``, state, health, instances in scope."""

    name = "prom_rules"
    description = (
        "Alerting rules: an alert's PromQL expression and threshold, its 'for' duration, state, "
        "evaluation health and last error, and its instances in scope."
    )

    def parameters(self, scope: ToolScope) -> dict[str, Any]:
        """alertname filter, cluster."""
        return obj(
            {
                "alertname": string("This alert's rule; empty: the rules firing, pending or failing."),
                "cluster": cluster_arg(scope),
            },
            required=["alertname"],
        )

    async def run(self, arguments: Mapping[str, Any], scope: ToolScope) -> ToolOutput:
        """One block per rule: its header line, expression and instances."""
        wanted = text_arg(arguments, "alertname")
        cluster, provider = self._provider(scope, arguments)
        keep = self._filter(cluster)
        try:
            data = await provider.api("rules", {"type": "alert"})
        except PrometheusError as exc:
            raise ToolError(str(exc)) from exc
        rules = [
            (str(group.get("name", "?")), rule)
            for group in (data or {}).get("groups", [])
            if isinstance(group, dict)
            for rule in group.get("rules", [])
            if isinstance(rule, dict) and rule.get("type", "alerting") == "alerting"
        ]
        if wanted:
            rules = [(g, r) for g, r in rules if r.get("name") == wanted]
        else:  # only what needs a look: the rest of a large rule set would drown it
            rules = [(g, r) for g, r in rules if r.get("state") in ("firing", "pending") or _failing(r)]
        lines: list[str] = []
        for group, rule in rules[:_MAX_RULES]:
            lines.extend(_rule_lines(group, rule, keep))
        if len(rules) > _MAX_RULES:
            lines.append(f"[{len(rules) - _MAX_RULES} more rules not listed]")
        empty = f"no alerting rule named {wanted}" if wanted else "no rule is firing, pending or failing"
        return ToolOutput(
            "\n".join(lines) or empty,
            f"Prometheus {provider.target}",
            f"{len(rules)} rules",
            ["GET /api/v1/rules?type=alert"],
        )


_MAX_RULES = 8
_MAX_INSTANCES = 5


def _failing(rule: Mapping[str, Any]) -> bool:
    return rule.get("health") not in (None, "ok", "unknown") or bool(rule.get("lastError"))


def _rule_lines(group: str, rule: Mapping[str, Any], keep: NamespaceFilter) -> list[str]:
    """A rule as the model reads it: the header (state, for, health), the expression, the
    severity and summary, and its active instances in scope (others counted, never shown)."""
    labels = rule.get("labels") or {}
    annotations = rule.get("annotations") or {}
    duration = rule.get("duration") or 0
    header = (
        f"rule {rule.get('name', '?')} (group {group}): {rule.get('state', '?')}, "
        f"for {duration:g} s, health {rule.get('health', '?')}"
    )
    if rule.get("lastError"):
        header += f", last error: {rule['lastError']}"
    lines = [header, f"  expr: {' '.join(str(rule.get('query', '')).split())}"]
    if labels.get("severity"):
        lines.append(f"  severity: {labels['severity']}")
    summary = annotations.get("summary") or annotations.get("description")
    if summary:
        lines.append(f"  summary (template): {' '.join(str(summary).split())}")
    instances = [a for a in rule.get("alerts") or [] if isinstance(a, dict)]
    inside = [a for a in instances if keep(a.get("labels"))]
    for alert in inside[:_MAX_INSTANCES]:
        shown = {k: v for k, v in (alert.get("labels") or {}).items() if k not in labels and k != "alertname"}
        own = " ".join(f"{k}={v}" for k, v in sorted(shown.items())) or "(no labels of its own)"
        since, value = alert.get("activeAt", "?"), alert.get("value", "?")
        lines.append(f"  {alert.get('state', '?')} since {since}, value {value}: {own}")
    if len(inside) > _MAX_INSTANCES:
        lines.append(f"  [{len(inside) - _MAX_INSTANCES} more instances]")
    lines += dropped_note(len(instances), len(inside), "instances", indent="  ")
    return lines


def prometheus_tools() -> list[Tool]:
    """Every Prometheus tool."""
    return [PromQuery(), PromAlerts(), PromRules()]
