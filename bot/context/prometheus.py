"""Prometheus provider: firing alerts and targeted metrics over the HTTP API (``/api/v1``).

Range queries are summarised per series (min / max / last / trend, with units) instead of dumped.
Query templates are PromQL with placeholders filled from the question's entities:

``{namespace}``      regex of the namespaces named (or configured, or ``.+``)
``{pod_regex}``      regex of the pods named and of pods of the workloads named (``api-.*``)
``{service_regex}``  regex of the services / workloads named
``{node}``           regex of the nodes named
``{alertname}``      regex of the alert names named

A template runs only when every placeholder it uses has a value, so a plain question runs only
the templates without placeholders (``up == 0``). ``settings.queries`` / ``instant_queries`` add
templates or replace built-in ones by name.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bot.config import PrometheusSettings
from bot.context import prom_follow
from bot.context.base import (
    ContextProvider,
    ContextRequest,
    ContextSection,
    Findings,
    ProviderResult,
    ProviderStatus,
    ranked_section,
)
from bot.context.entities import Entities
from bot.errors import OpsbotError

logger = logging.getLogger(__name__)

SOURCE = "Prometheus"

DEFAULT_RANGE_QUERIES: dict[str, str] = {
    "cpu": 'sum by (namespace, pod) (rate(container_cpu_usage_seconds_total{namespace=~"{namespace}", '
    'pod=~"{pod_regex}", container!=""}[5m]))',
    "memory": 'sum by (namespace, pod) (container_memory_working_set_bytes{namespace=~"{namespace}", '
    'pod=~"{pod_regex}", container!=""})',
    "restarts": "sum by (namespace, pod) (increase(kube_pod_container_status_restarts_total"
    '{namespace=~"{namespace}", pod=~"{pod_regex}"}[10m]))',
    "error_rate": 'sum by (namespace, service) (rate(http_requests_total{namespace=~"{namespace}", '
    'service=~"{service_regex}", code=~"5.."}[5m])) / sum by (namespace, service) '
    '(rate(http_requests_total{namespace=~"{namespace}", service=~"{service_regex}"}[5m]))',
    "latency_p99": "histogram_quantile(0.99, sum by (namespace, service, le) "
    '(rate(http_request_duration_seconds_bucket{namespace=~"{namespace}", service=~"{service_regex}"}[5m])))',
    "node_cpu": "1 - avg by (instance) "
    '(rate(node_cpu_seconds_total{mode="idle", instance=~"{node}(:.*)?"}[5m]))',
    "node_memory": '1 - avg by (instance) (node_memory_MemAvailable_bytes{instance=~"{node}(:.*)?"} '
    '/ node_memory_MemTotal_bytes{instance=~"{node}(:.*)?"})',
}
"""Built-in range query templates by name (summarised per series)."""

DEFAULT_INSTANT_QUERIES: dict[str, str] = {
    "targets_down": "up == 0",
}
"""Built-in instant query templates by name (listed per series)."""

DEFAULT_UNITS: dict[str, str] = {
    "cpu": "cores",
    "memory": "bytes",
    "restarts": "restarts",
    "error_rate": "ratio",
    "latency_p99": "seconds",
    "node_cpu": "ratio",
    "node_memory": "ratio",
    "targets_down": "",
}
"""Units of the built-in templates (``bytes``, ``seconds``, ``ratio``, ``cores`` are formatted)."""

_PLACEHOLDER = re.compile(r"\{(namespace|pod_regex|service_regex|node|alertname)\}")
_MAX_SERIES = 10
_MAX_GET_PARAMS = 2000
"""Longer query parameters go in a POST body (a derived query can name a few hundred pods)."""


@dataclass(slots=True)
class _QueryOutcome:
    name: str
    promql: str
    lines: list[str]
    error: str | None = None


@dataclass(slots=True)
class _Followed:
    """One derived query's ranked lines, and the pods it points at."""

    name: str
    promql: str
    lines: list[tuple[str, int]] = field(default_factory=list)
    culprits: list[tuple[str, str]] = field(default_factory=list)
    failing: list[tuple[str, str]] = field(default_factory=list)
    """(namespace, service) in question whose error ratio reached ``prom_follow.FAILING_RATIO``."""
    error: str | None = None


class PrometheusError(OpsbotError):
    """Prometheus answered with an error (``errorType: error``) or could not be reached."""


class PrometheusProvider(ContextProvider):
    """Firing alerts and targeted metrics from one Prometheus server."""

    name = SOURCE

    def __init__(self, settings: PrometheusSettings, namespaces: Sequence[str] = ()) -> None:
        self.settings = settings
        self.namespaces = list(namespaces)
        """Namespaces opsbot watches (``kubernetes.namespaces``): the default ``{namespace}``."""
        self._session: aiohttp.ClientSession | None = None
        self.range_queries = {**DEFAULT_RANGE_QUERIES, **settings.queries}
        self.instant_queries = {**DEFAULT_INSTANT_QUERIES, **settings.instant_queries}
        for name in settings.instant_queries:
            self.range_queries.pop(name, None)
        for name in settings.queries:
            self.instant_queries.pop(name, None)
        self.units = {**DEFAULT_UNITS, **settings.query_units}

    @property
    def target(self) -> str:
        """The Prometheus base URL."""
        return self.settings.url.rstrip("/")

    @property
    def timeout_s(self) -> float:
        """``prometheus.timeout_s``."""
        return self.settings.timeout_s

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json"}
            if self.settings.bearer_token is not None:
                headers["Authorization"] = f"Bearer {self.settings.bearer_token.get_secret_value()}"
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s)
            )
        return self._session

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def api(self, path: str, params: Mapping[str, str]) -> Any:
        """``GET /api/v1/<path>`` and its ``data`` (``POST`` with a form body for a query too long
        for a URL); :class:`PrometheusError` with the upstream text."""
        url = f"{self.target}/api/v1/{path}"
        long = sum(len(k) + len(v) for k, v in params.items()) > _MAX_GET_PARAMS
        try:
            request = (
                self._client().post(url, data=dict(params))
                if long
                else self._client().get(url, params=params)
            )
            async with request as response:
                text = await response.text()
                try:
                    body = await response.json(content_type=None)
                except ValueError:
                    raise PrometheusError(f"HTTP {response.status} from {url}: {text[:300]}") from None
        except aiohttp.ClientError as exc:
            raise PrometheusError(f"cannot reach {url}: {exc}") from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error", text[:300]) if isinstance(body, dict) else text[:300]
            kind = body.get("errorType", "error") if isinstance(body, dict) else "error"
            raise PrometheusError(f"HTTP {response.status} {kind}: {error}")
        return body.get("data")

    async def check(self) -> str | None:
        """``GET /-/ready``: Prometheus answers 200 once it serves queries."""
        url = f"{self.target}/-/ready"
        try:
            async with self._client().get(url) as response:
                if response.status != 200:
                    return f"HTTP {response.status} from {url}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"cannot reach {url}: {exc or type(exc).__name__}"
        return None

    async def fetch(self, request: ContextRequest) -> ProviderResult:
        """Firing alerts plus every template whose placeholders the entities fill, within the
        request's namespaces (series and alerts of other namespaces are dropped)."""
        allowed = list(request.namespaces) if request.namespaces is not None else self.namespaces
        values = placeholder_values(request.entities, allowed)
        keep = NamespaceFilter(allowed)
        tasks: list[asyncio.Task[_QueryOutcome]] = [asyncio.create_task(self._alerts(request.entities, keep))]
        for name, template in self.range_queries.items():
            promql = fill(template, values)
            if promql is not None:
                tasks.append(asyncio.create_task(self._range(name, promql, keep)))
        for name, template in self.instant_queries.items():
            promql = fill(template, values)
            if promql is not None:
                tasks.append(asyncio.create_task(self._instant(name, promql, keep)))
        outcomes = await asyncio.gather(*tasks)
        query = "; ".join(o.promql for o in outcomes)
        errors = [f"{o.name}: {o.error}" for o in outcomes if o.error]
        outside = [n for n in request.entities.namespaces if allowed and n not in allowed]
        if outside and len(errors) < len(outcomes):
            errors.append(f"namespace(s) {', '.join(outside)} outside opsbot's configured scope")
        if len(errors) == len(outcomes):
            return ProviderResult.failed(SOURCE, self.target, query, errors[0])
        sections: list[ContextSection] = []
        alerts = outcomes[0]
        if alerts.lines:
            sections.append(
                ContextSection(
                    source=SOURCE,
                    title="Firing alerts (Prometheus)",
                    body="\n".join(alerts.lines),
                    priority=12,
                    unit="more firing alerts",
                    drop_from="end",
                )
            )
        metric_lines = [line for o in outcomes[1:] for line in o.lines]
        if metric_lines:
            window = self.settings.range_minutes
            sections.append(
                ContextSection(
                    source=SOURCE,
                    title=f"Metrics (Prometheus, last {window} min: min / max / last, trend)",
                    body="\n".join(metric_lines),
                    priority=22,
                    unit="more metric series",
                    drop_from="end",
                )
            )
        return self._answer(sections, query, errors)

    def _answer(self, sections: list[ContextSection], query: str, errors: Sequence[str]) -> ProviderResult:
        """An answer: ok with sections, else empty; the errors of queries that failed beside others."""
        return ProviderResult(
            source=SOURCE,
            status=ProviderStatus.OK if sections else ProviderStatus.EMPTY,
            sections=sections,
            query=query,
            error="; ".join(errors) or None,
            target=self.target,
        )

    async def _alerts(self, entities: Entities, keep: NamespaceFilter) -> _QueryOutcome:
        outcome = _QueryOutcome("alerts", "GET /api/v1/alerts", [])
        try:
            data = await self.api("alerts", {})
        except PrometheusError as exc:
            outcome.error = str(exc)
            return outcome
        alerts = [a for a in (data or {}).get("alerts", []) if isinstance(a, dict) and keep(a.get("labels"))]
        wanted = set(entities.alert_names) | set(entities.namespaces)

        def relevance(alert: dict[str, Any]) -> tuple[int, int, str]:
            labels = alert.get("labels") or {}
            named = labels.get("alertname") in wanted or labels.get("namespace") in wanted
            return (0 if named else 1, 0 if alert.get("state") == "firing" else 1, str(alert.get("activeAt")))

        for alert in sorted(alerts, key=relevance):
            labels = dict(alert.get("labels") or {})
            name = labels.pop("alertname", "?")
            annotations = alert.get("annotations") or {}
            summary = annotations.get("summary") or annotations.get("description") or ""
            label_text = " ".join(f"{k}={v}" for k, v in sorted(labels.items()))
            outcome.lines.append(
                f"{alert.get('state', '?')} since {alert.get('activeAt', '?')}: {name} {label_text}"
                + (f" value={alert['value']}" if alert.get("value") else "")
                + (f" - {summary}" if summary else "")
            )
        return outcome

    async def runbook_urls(self, alert_names: Sequence[str]) -> dict[str, str]:
        """The ``runbook_url`` annotation of each named alert: from its active alerts (templates
        expanded), else from its alerting rule (unless the rule's value is still a template)."""
        wanted = set(alert_names)
        found: dict[str, str] = {}
        data = await self.api("alerts", {})
        for alert in (data or {}).get("alerts", []):
            name = (alert.get("labels") or {}).get("alertname")
            url = (alert.get("annotations") or {}).get("runbook_url")
            if name in wanted and isinstance(url, str) and url:
                found.setdefault(name, url)
        if wanted - found.keys():
            rules = await self.api("rules", {"type": "alert"})
            for group in (rules or {}).get("groups", []):
                for rule in group.get("rules", []):
                    url = (rule.get("annotations") or {}).get("runbook_url")
                    name = rule.get("name")
                    if name in wanted and isinstance(url, str) and url and "{{" not in url:
                        found.setdefault(name, url)
        return found

    async def _series(self, promql: str, keep: NamespaceFilter) -> list[tuple[dict[str, str], list[float]]]:
        """A range query's series over ``range_minutes`` as (labels, finite values), in scope."""
        end = time.time()
        start = end - self.settings.range_minutes * 60
        step = max(15.0, (end - start) / 60)
        data = await self.api(
            "query_range",
            {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"},
        )
        out = []
        for series in (data or {}).get("result", []):
            if keep(series.get("metric")):
                points = [float(v) for _, v in series.get("values", []) if finite(v)]
                if points:
                    out.append((dict(series.get("metric") or {}), points))
        return out

    async def _range(self, name: str, promql: str, keep: NamespaceFilter) -> _QueryOutcome:
        outcome = _QueryOutcome(name, promql, [])
        try:
            series = await self._series(promql, keep)
        except PrometheusError as exc:
            outcome.error = str(exc)
            return outcome
        unit = self.units.get(name, _guess_unit(name))
        for labels, points in series[:_MAX_SERIES]:
            outcome.lines.append(f"{name} {series_labels(labels)}: {summarise(points, unit)}")
        return outcome

    async def follow(self, request: ContextRequest, findings: Findings) -> ProviderResult | None:
        """Queries derived from what Kubernetes found (:mod:`bot.context.prom_follow`): the workloads'
        error rate, latency and saturation, their pools, their nodes' load and top consumers; then a
        second round on the likely culprit the first one pointed at."""
        allowed = list(request.namespaces) if request.namespaces is not None else self.namespaces
        keep = NamespaceFilter(allowed)
        derived = prom_follow.first_round(findings, allowed)
        if not derived:
            return None
        asked = {(w.namespace, p) for w in findings.workloads if w.role == "asked" for p in w.pods}
        first = await asyncio.gather(*(self._derived(d, keep) for d in derived))
        culprits = [c for outcome in first for c in outcome.culprits if c not in asked]
        failing = [f for outcome in first for f in outcome.failing]
        # A service failing while its pods look fine: who it calls that fails (mesh / proxy metrics).
        second_round = [
            *prom_follow.culprit_round(culprits),
            *prom_follow.upstream_round(findings, failing),
        ]
        second = await asyncio.gather(*(self._derived(d, keep) for d in second_round))
        outcomes = [*first, *second]
        lines = [line for o in outcomes for line in o.lines]
        errors = [f"{o.name}: {o.error}" for o in outcomes if o.error]
        query = "; ".join(o.promql for o in outcomes)
        if errors and len(errors) == len(outcomes):
            return ProviderResult.failed(SOURCE, self.target, query, errors[0])
        sections = []
        window = self.settings.range_minutes
        if lines:
            sections.append(
                ranked_section(
                    source=SOURCE,
                    title=f"Metrics of the workloads and nodes found (last {window} min)",
                    lines=lines,
                    priority=19,
                    unit="more derived metric series",
                )
            )
        return self._answer(sections, query, errors)

    async def _derived(self, query: prom_follow.Derived, keep: NamespaceFilter) -> _Followed:
        outcome = _Followed(query.name, query.promql)
        try:
            series = await self._series(query.promql, keep)
        except PrometheusError as exc:
            outcome.error = str(exc)
            return outcome
        if query.keep is not None:
            series = [s for s in series if query.subject(s[0]) in query.keep]
        tops: set[int] = set()
        if query.groups is not None:
            # A node's top consumers: the biggest last values of each node, biggest first.
            series.sort(key=lambda s: -s[1][-1])
            seen: dict[str, int] = {}
            for i, (labels, _) in enumerate(series):
                node = query.groups.get(query.subject(labels), "")
                seen[node] = seen.get(node, 0) + 1
                if seen[node] == 1:
                    outcome.culprits.append(query.subject(labels))
                if seen[node] <= prom_follow.TOP_PER_NODE:
                    tops.add(i)
            series = [s for i, s in enumerate(series) if i in tops]
        for labels, points in series[:_MAX_SERIES]:
            metric = labels.pop("__name__", "")
            unit = query.unit or _guess_unit(metric)
            rank = query.ranks.get(query.subject(labels), query.rank)
            if metric.endswith("waiting_connections") and max(points) > 0:
                outcome.culprits.append(query.subject(labels))
                rank = 0
            if query.name == "error_rate" and rank == 0 and max(points) >= prom_follow.FAILING_RATIO:
                outcome.failing.append(query.subject(labels))
            where = f" on {query.groups[query.subject(labels)]}" if query.groups else ""
            name = f"{query.name.removesuffix(' on node')}{where} {metric}".strip()
            outcome.lines.append((f"{name} {series_labels(labels)}: {summarise(points, unit)}", rank))
        return outcome

    async def _instant(self, name: str, promql: str, keep: NamespaceFilter) -> _QueryOutcome:
        outcome = _QueryOutcome(name, promql, [])
        try:
            data = await self.api("query", {"query": promql})
        except PrometheusError as exc:
            outcome.error = str(exc)
            return outcome
        unit = self.units.get(name, _guess_unit(name))
        result = (data or {}).get("result", [])
        if (data or {}).get("resultType") == "scalar" and isinstance(result, list) and len(result) == 2:
            outcome.lines.append(f"{name}: {format_value(float(result[1]), unit)}")
            return outcome
        result = [series for series in result if keep(series.get("metric"))]
        for series in result[:_MAX_SERIES]:
            value = series.get("value", [0, "NaN"])[1]
            outcome.lines.append(
                f"{name} {series_labels(series.get('metric', {}))}: {format_value(float(value), unit)}"
            )
        if len(result) > _MAX_SERIES:
            outcome.lines.append(f"{name}: {len(result) - _MAX_SERIES} more series")
        return outcome


class NamespaceFilter:
    """Keeps series and alerts of the allowed namespaces (and those without a namespace label, such
    as node or target series); with no namespaces configured, keeps everything."""

    def __init__(self, allowed: Sequence[str]) -> None:
        self.allowed = frozenset(allowed)

    def __call__(self, labels: object) -> bool:
        if not self.allowed or not isinstance(labels, Mapping):
            return True
        spaces = [labels[k] for k in ("namespace", "exported_namespace") if labels.get(k)]
        return all(space in self.allowed for space in spaces)


def finite(value: object) -> bool:
    """Whether a sample value (a number or Prometheus' text of one) is a finite number."""
    try:
        return math.isfinite(float(str(value)))
    except ValueError:
        return False


def series_labels(metric: Mapping[str, str]) -> str:
    shown = {k: v for k, v in metric.items() if k != "__name__"}
    name = metric.get("__name__", "")
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(shown.items())) + "}"


def _guess_unit(name: str) -> str:
    lowered = name.lower()
    for hint, unit in (
        ("bytes", "bytes"),
        ("memory", "bytes"),
        ("seconds", "seconds"),
        ("latency", "seconds"),
    ):
        if hint in lowered:
            return unit
    if "ratio" in lowered or "rate" in lowered:
        return "ratio"
    return ""


def format_value(value: float, unit: str) -> str:
    """``value`` in a readable unit (``512 MiB``, ``230 ms``, ``4.2%``, ``0.35 cores``)."""
    if math.isnan(value):
        return "NaN"
    if unit == "bytes":
        size = abs(value)
        for suffix, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
            if size >= scale:
                return f"{value / scale:.1f} {suffix}"
        return f"{value:.0f} B"
    if unit == "seconds":
        return f"{value * 1000:.0f} ms" if abs(value) < 1 else f"{value:.2f} s"
    if unit == "ratio":
        return f"{value * 100:.1f}%"
    number = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return f"{number} {unit}".strip()


def summarise(points: Sequence[float], unit: str) -> str:
    """One line for a range series: min / max / last, and whether it rose, fell or stayed flat."""
    low, high, last = min(points), max(points), points[-1]
    quarter = max(1, len(points) // 4)
    first_mean = sum(points[:quarter]) / quarter
    last_mean = sum(points[-quarter:]) / quarter
    scale = max(abs(first_mean), abs(last_mean), abs(high - low), 1e-12)
    change = (last_mean - first_mean) / scale
    trend = "flat" if abs(change) < 0.15 else "rising" if change > 0 else "falling"
    return (
        f"min {format_value(low, unit)}, max {format_value(high, unit)}, last {format_value(last, unit)}, "
        f"{trend} ({len(points)} points)"
    )


def _regex(values: Sequence[str]) -> str:
    return "|".join(re.escape(v) for v in values)


def placeholder_values(entities: Entities, namespaces: Sequence[str] = ()) -> dict[str, str]:
    """Values of the template placeholders the entities can fill (``namespaces``: the allowed ones,
    empty: any)."""
    values: dict[str, str] = {}
    # Named namespaces count only inside the allowed ones: a channel never queries another's.
    named = [n for n in entities.namespaces if not namespaces or n in namespaces]
    spaces = named or list(namespaces)
    values["namespace"] = _regex(spaces) if spaces else ".+"
    pods = [re.escape(p) for p in entities.pods] + [f"{re.escape(w)}-.*" for w in entities.workload_names()]
    if pods:
        values["pod_regex"] = "|".join(pods)
    services = [*entities.services, *entities.deployments, *entities.statefulsets, *entities.names]
    if services:
        values["service_regex"] = _regex(list(dict.fromkeys(services)))
    if entities.nodes:
        values["node"] = _regex(entities.nodes)
    if entities.alert_names:
        values["alertname"] = _regex(entities.alert_names)
    return values


def fill(template: str, values: Mapping[str, str]) -> str | None:
    """``template`` with its placeholders replaced (escaped for a PromQL string), or ``None`` when
    one has no value."""
    needed = set(_PLACEHOLDER.findall(template))
    if not needed <= values.keys():
        return None
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)].replace("\\", "\\\\").replace('"', '\\"'), template)
