"""A Prometheus HTTP API (``/api/v1``) that answers from a case's recorded series and alerts.

It does not evaluate PromQL. A case records the *result* series a query returns (the labels after
the query's aggregation, and the values); a query is answered with the recorded series whose
``metric`` is selected by the query and whose labels satisfy every label matcher of the query that
names one of those labels (``namespace=~"payments"``, ``pod=~"api-.*"``, ``instance=~"worker-2(:.*)?"``;
matchers on labels the result does not carry, such as ``container!=""`` or ``mode="idle"``, are
aggregated away and ignored). Range queries get the recorded values spread evenly over the
requested window, so the summary opsbot writes (min / max / last, trend) is the case's numbers.

Routes: ``GET|POST /api/v1/query``, ``/api/v1/query_range``, ``GET /api/v1/alerts``,
``/api/v1/rules``, ``/-/ready``; answers and errors in Prometheus' JSON envelope.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from bot.eval.local_server import LocalApiServer

_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*\{([^}]*)\}")
_BARE_METRIC = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:[=!<>]|$)")
_MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Series:
    """One recorded result series: the metric a query selects, its result labels, its values."""

    metric: str
    labels: Mapping[str, str]
    values: Sequence[float]
    """Oldest first; spread over a range query's window, the last one answers an instant query."""


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert as ``/api/v1/alerts`` lists it."""

    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)
    state: str = "firing"
    active_at: str = ""
    value: str = ""
    expr: str = ""
    """The PromQL of its rule (``/api/v1/rules``), when the case gives it."""
    for_s: float = 0.0
    """The rule's ``for`` in seconds."""


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\\\", "\\")


def _matches(op: str, pattern: str, value: str) -> bool:
    if op == "=":
        return value == pattern
    if op == "!=":
        return value != pattern
    try:  # PromQL regexes are anchored at both ends
        hit = re.fullmatch(pattern, value) is not None
    except re.error:
        return False
    return hit if op == "=~" else not hit


def selected(promql: str) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """The metric selectors of ``promql``: (metric name, [(label, op, value)]) in order."""
    found = [
        (name, [(k, op, _unescape(v)) for k, op, v in _MATCHER.findall(body)])
        for name, body in _SELECTOR.findall(promql)
        if name not in ("by", "without", "on", "ignoring", "group_left", "group_right")
        # A bare {...} selects by its __name__ matcher ({__name__=~"a|b", pod="x"}).
        and (name or "__name__" in body)
    ]
    if not found:
        bare = _BARE_METRIC.match(promql)
        if bare:
            found.append((bare.group(1), []))
    return found


@dataclass
class PrometheusSnapshotServer(LocalApiServer):
    """Serves recorded series and alerts over the Prometheus HTTP API on a free port."""

    series: list[Series] = field(default_factory=list)
    alerts: list[Alert] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)
    """Every query asked (PromQL, or the path for alerts and rules), for the report and tests."""

    def answer(self, promql: str) -> list[Series]:
        """The recorded series ``promql`` returns (see the module doc)."""
        selectors = selected(promql)
        if not selectors:
            return []
        # The first selector decides: in a ratio (errors / all) the numerator names the result.
        name, matchers = selectors[0]
        out = []
        for s in self.series:
            if name and s.metric != name:
                continue
            if not all(_matches(op, v, s.metric) for k, op, v in matchers if k == "__name__"):
                continue
            if all(_matches(op, v, s.labels[k]) for k, op, v in matchers if k in s.labels):
                out.append(s)
        return out

    def state_text(self) -> str:
        """Every recorded series (labels and values) and alert, as one text (see
        :mod:`bot.eval.evidence`)."""
        lines = [
            f"{s.metric}{json.dumps(dict(s.labels), sort_keys=True)} {' '.join(_fmt(v) for v in s.values)}"
            for s in self.series
        ]
        lines += [
            json.dumps({"labels": dict(a.labels), "annotations": dict(a.annotations)}, sort_keys=True)
            for a in self.alerts
        ]
        return "\n".join(lines)

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self._latency])
        for path, handler in (("/api/v1/query", self._query), ("/api/v1/query_range", self._query_range)):
            app.router.add_get(path, handler)
            app.router.add_post(path, handler)
        app.router.add_get("/api/v1/alerts", self._alerts)
        app.router.add_get("/api/v1/rules", self._rules)
        app.router.add_get("/-/ready", self._ready)
        return app

    @web.middleware
    async def _latency(self, request: web.Request, handler: Any) -> web.StreamResponse:
        await self.answer_delay()
        result: web.StreamResponse = await handler(request)
        return result

    @staticmethod
    def _ok(data: Any) -> web.Response:
        return web.json_response({"status": "success", "data": data})

    @staticmethod
    def _bad(message: str) -> web.Response:
        return web.json_response({"status": "error", "errorType": "bad_data", "error": message}, status=400)

    @staticmethod
    async def _params(request: web.Request) -> Mapping[str, str]:
        if request.method == "POST":
            form = await request.post()
            return {k: str(v) for k, v in form.items()}
        return request.query

    async def _query(self, request: web.Request) -> web.Response:
        params = await self._params(request)
        promql = params.get("query")
        if not promql:
            return self._bad('invalid parameter "query": empty query')
        self.queries.append(promql)
        now = float(params.get("time") or time.time())
        result = [
            {"metric": _result_labels(s, promql), "value": [now, _fmt(s.values[-1])]}
            for s in self.answer(promql)
            if s.values
        ]
        return self._ok({"resultType": "vector", "result": result})

    async def _query_range(self, request: web.Request) -> web.Response:
        params = await self._params(request)
        promql = params.get("query")
        if not promql:
            return self._bad('invalid parameter "query": empty query')
        try:
            start, end = float(params["start"]), float(params["end"])
            step = float(params.get("step") or 15)
        except (KeyError, ValueError):
            return self._bad('invalid parameter "start", "end" or "step"')
        if end < start or step <= 0:
            return self._bad("end timestamp must not be before start time, step must be positive")
        self.queries.append(promql)
        result = []
        for s in self.answer(promql):
            if not s.values:
                continue
            count = len(s.values)
            span = end - start
            points = [
                [start + (span * i / (count - 1) if count > 1 else span), _fmt(v)]
                for i, v in enumerate(s.values)
            ]
            result.append({"metric": _result_labels(s, promql), "values": points})
        return self._ok({"resultType": "matrix", "result": result})

    async def _alerts(self, request: web.Request) -> web.Response:
        self.queries.append("GET /api/v1/alerts")
        alerts = [
            {
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "state": a.state,
                "activeAt": a.active_at,
                "value": a.value,
            }
            for a in self.alerts
        ]
        return self._ok({"alerts": alerts})

    async def _rules(self, request: web.Request) -> web.Response:
        self.queries.append("GET /api/v1/rules")
        return self._ok({"groups": [{"name": "snapshot", "file": "snapshot.yml", "rules": self.rules()}]})

    def rules(self) -> list[dict[str, Any]]:
        """One alerting rule per alert name, as ``/api/v1/rules?type=alert`` lists it: its
        expression when the case gives one, the labels its alerts share, their instances."""
        by_name: dict[str, list[Alert]] = {}
        for alert in self.alerts:
            by_name.setdefault(alert.labels.get("alertname", "?"), []).append(alert)
        rules = []
        for name, alerts in by_name.items():
            shared = {k: v for k, v in alerts[0].labels.items() if all(a.labels.get(k) == v for a in alerts)}
            shared.pop("alertname", None)
            states = {a.state for a in alerts}
            rules.append(
                {
                    "name": name,
                    "query": alerts[0].expr or "(not in this snapshot)",
                    "duration": alerts[0].for_s,
                    "labels": {k: v for k, v in shared.items() if k == "severity"},
                    "annotations": dict(alerts[0].annotations),
                    "alerts": [
                        {
                            "labels": dict(a.labels),
                            "annotations": dict(a.annotations),
                            "state": a.state,
                            "activeAt": a.active_at,
                            "value": a.value,
                        }
                        for a in alerts
                    ],
                    "health": "ok",
                    "state": "firing" if "firing" in states else "pending",
                    "type": "alerting",
                }
            )
        return rules

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(text="Prometheus Server is Ready.\n")


def _result_labels(series: Series, promql: str) -> dict[str, str]:
    labels = dict(series.labels)
    if "(" not in promql.split("{", 1)[0]:  # aggregations and functions drop __name__, as Prometheus does
        labels["__name__"] = series.metric
    return labels


def _fmt(value: float) -> str:
    return repr(float(value)) if value != int(value) else str(int(value))
