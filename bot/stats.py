"""Request statistics from the store's rows: groups, percentiles, a TTFT histogram, time series, and
their renderings for ``opsbot stats`` (text for an 80-column terminal, JSON, CSV).

Everything here is pure computation over :class:`~bot.store.RequestRecord` lists (the store reads
them, :mod:`bot.plots` draws the time series): the same numbers on SQLite and PostgreSQL, and
testable without a database. Latencies are milliseconds, as the rows keep them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta

from bot.store import RequestRecord, StepRecord
from bot.store.records import Percentiles, percentile, percentiles

DIMENSIONS = ("scenario", "lane", "platform", "channel", "model", "engine")
"""What ``opsbot stats --by`` can group by (request row columns)."""
METRICS = (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("queue_ms", "queue"), ("e2e_ms", "end-to-end"))
"""Latency columns and their names in the tables."""
HISTOGRAM_EDGES_MS = (10, 25, 50, 100, 250, 500, 1000, 2000, 5000, 10_000, 30_000)
"""TTFT histogram bucket edges in ms (10 ms to 30 s, as the Prometheus buckets)."""
WIDTH = 80
"""Columns the text report fits in."""


@dataclass
class GroupStats:
    """The requests of one group (one value per ``--by`` dimension) over the window."""

    key: dict[str, str]
    count: int
    errors: int
    """Requests whose status is not ``ok``."""
    by_status: dict[str, int]
    prompt_tokens: int
    """Prompt tokens of the ``ok`` requests."""
    cached_tokens: int
    """Of those, tokens served from the prefix cache."""
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    queue_ms: Percentiles
    e2e_ms: Percentiles

    @property
    def error_rate(self) -> float:
        """Share (0-1) of the group's requests that did not end ``ok``."""
        return self.errors / self.count if self.count else 0.0

    @property
    def prefix_cache_reuse(self) -> float | None:
        """Share (0-1) of prompt tokens served from the prefix cache (``None``: no ok request)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def as_dict(self) -> dict[str, object]:
        """JSON shape: the dimension values at the top level, next to the numbers."""
        return {
            **self.key,
            "count": self.count,
            "errors": self.errors,
            "error_rate": round(self.error_rate, 6),
            "by_status": self.by_status,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefix_cache_reuse": None
            if self.prefix_cache_reuse is None
            else round(self.prefix_cache_reuse, 6),
            **{name: asdict(getattr(self, name)) for name, _ in METRICS},
        }


@dataclass
class HistogramBin:
    """One bar of the TTFT histogram: answers with ``low_ms <= TTFT < high_ms`` (``None``: no bound)."""

    low_ms: float
    high_ms: float | None
    count: int

    @property
    def label(self) -> str:
        """``25-50 ms``, ``1-2 s``, ``>= 30 s``: with its unit."""

        def fmt(ms: float) -> str:
            return f"{ms / 1000:g}" if ms >= 1000 else f"{ms:g}"

        unit = "s" if self.low_ms >= 1000 else "ms"
        if self.high_ms is None:
            return f">= {fmt(self.low_ms)} {unit}"
        if self.low_ms == 0:
            return f"< {fmt(self.high_ms)} {'s' if self.high_ms >= 1000 else 'ms'}"
        if unit == "ms" and self.high_ms >= 1000:
            return f"{fmt(self.low_ms)} ms-{fmt(self.high_ms)} s"
        return f"{fmt(self.low_ms)}-{fmt(self.high_ms)} {unit}"


@dataclass
class Report:
    """What ``opsbot stats`` shows: the window, the groups, the total and the TTFT histogram."""

    since: datetime
    until: datetime
    by: tuple[str, ...]
    groups: list[GroupStats]
    total: GroupStats
    histogram: list[HistogramBin] = field(default_factory=list)
    investigations: InvestigationStats | None = None
    """The investigation loop's steps in the window (``None``: no investigation ran)."""


@dataclass
class ToolStats:
    """One tool's calls in the window."""

    tool: str
    calls: int
    failed: int
    """Calls whose result was not ``ok`` (refused out of scope, not found, timeout, repeated)."""
    latency_ms: Percentiles
    output_tokens: int


@dataclass
class InvestigationStats:
    """The investigations of the window, from their step rows."""

    investigations: int
    steps: int
    calls_unparsed: int
    step_ttft_ms: Percentiles
    decode_ms: Percentiles
    cached_of_previous_mean: float | None
    """Mean over steps 2.. of cached prompt tokens / the previous step's prompt tokens (0-1)."""
    cached_of_previous_min: float | None
    tools: list[ToolStats] = field(default_factory=list)


def investigation_stats(steps: Sequence[StepRecord]) -> InvestigationStats | None:
    """Per investigation and per tool, from ``steps`` (ordered by request, then step)."""
    if not steps:
        return None
    fractions: list[float] = []
    previous: dict[str, int] = {}
    for step in steps:
        before = previous.get(step.request_id)
        if before:
            fractions.append(step.cached_tokens / before)
        previous[step.request_id] = step.prompt_tokens or before or 0
    by_tool: dict[str, list[StepRecord]] = {}
    for step in steps:
        if step.kind == "call" and step.tool and step.status not in ("final", "unparsed"):
            by_tool.setdefault(step.tool, []).append(step)
    return InvestigationStats(
        investigations=len(previous),
        steps=len(steps),
        calls_unparsed=sum(1 for s in steps if s.status == "unparsed"),
        step_ttft_ms=percentiles([s.ttft_ms for s in steps if s.ttft_ms is not None]),
        decode_ms=percentiles([s.decode_ms for s in steps if s.decode_ms is not None]),
        cached_of_previous_mean=sum(fractions) / len(fractions) if fractions else None,
        cached_of_previous_min=min(fractions) if fractions else None,
        tools=[
            ToolStats(
                tool=name,
                calls=len(calls),
                failed=sum(1 for c in calls if c.status != "ok"),
                latency_ms=percentiles([c.tool_ms for c in calls if c.tool_ms is not None]),
                output_tokens=sum(c.tool_tokens for c in calls),
            )
            for name, calls in sorted(by_tool.items())
        ],
    )


def group_stats(records: Iterable[RequestRecord], by: Sequence[str]) -> list[GroupStats]:
    """Per distinct combination of the ``by`` columns (sorted), the counts and percentiles."""
    groups: dict[tuple[str, ...], list[RequestRecord]] = {}
    for record in records:
        key = tuple(_value(record, dim) for dim in by)
        groups.setdefault(key, []).append(record)
    return [_summarise(dict(zip(by, key, strict=True)), members) for key, members in sorted(groups.items())]


def summarise(records: Sequence[RequestRecord]) -> GroupStats:
    """One group of every request in ``records``."""
    return _summarise({}, list(records))


def _value(record: RequestRecord, dimension: str) -> str:
    value = getattr(record, dimension)
    return "-" if value is None or value == "" else str(value)


def _summarise(key: dict[str, str], members: list[RequestRecord]) -> GroupStats:
    by_status: dict[str, int] = {}
    for m in members:
        by_status[m.status] = by_status.get(m.status, 0) + 1
    ok = [m for m in members if m.status == "ok"]

    def column(name: str) -> list[float]:
        return [float(v) for v in (getattr(m, name) for m in members) if v is not None]

    return GroupStats(
        key=key,
        count=len(members),
        errors=len(members) - by_status.get("ok", 0),
        by_status=dict(sorted(by_status.items())),
        prompt_tokens=sum(m.prompt_tokens for m in ok),
        cached_tokens=sum(m.cached_tokens for m in ok),
        ttft_ms=percentiles(column("ttft_ms")),
        tpot_ms=percentiles(column("tpot_ms")),
        queue_ms=percentiles(column("queue_ms")),
        e2e_ms=percentiles(column("e2e_ms")),
    )


def ttft_histogram(records: Iterable[RequestRecord]) -> list[HistogramBin]:
    """TTFT counts per bucket of :data:`HISTOGRAM_EDGES_MS`, from the first to the last non-empty one."""
    edges = (0.0, *map(float, HISTOGRAM_EDGES_MS))
    counts = [0] * len(edges)
    for record in records:
        if record.ttft_ms is None:
            continue
        index = sum(1 for edge in edges[1:] if record.ttft_ms >= edge)
        counts[index] += 1
    bins = [
        HistogramBin(edges[i], edges[i + 1] if i + 1 < len(edges) else None, counts[i])
        for i in range(len(edges))
    ]
    used = [i for i, c in enumerate(counts) if c]
    return bins[used[0] : used[-1] + 1] if used else []


def build_report(
    records: Sequence[RequestRecord],
    since: datetime,
    until: datetime,
    by: Sequence[str],
    steps: Sequence[StepRecord] = (),
) -> Report:
    """Everything ``opsbot stats`` prints, from the window's rows (``steps``: its investigations'
    step rows)."""
    return Report(
        since=since,
        until=until,
        by=tuple(by),
        groups=group_stats(records, by),
        total=summarise(records),
        histogram=ttft_histogram(records),
        investigations=investigation_stats(steps),
    )


# -- time series (for the plot) ---------------------------------------------------------------------
_BUCKETS = (
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=15),
    timedelta(minutes=30),
    timedelta(hours=1),
    timedelta(hours=3),
    timedelta(hours=6),
    timedelta(hours=12),
    timedelta(days=1),
)


def pick_bucket(window: timedelta, points: int = 60) -> timedelta:
    """The smallest of 1 min ... 1 d that cuts ``window`` into at most ``points`` buckets."""
    return next((b for b in _BUCKETS if window / b <= points), _BUCKETS[-1])


@dataclass
class SeriesPoint:
    """One time bucket of one scenario: P50 / P99 of TTFT and TPOT (ms) and the answer count."""

    start: datetime
    count: int
    ttft_p50: float | None
    ttft_p99: float | None
    tpot_p50: float | None
    tpot_p99: float | None


def time_series(
    records: Iterable[RequestRecord], since: datetime, bucket: timedelta, by: str = "scenario"
) -> dict[str, list[SeriesPoint]]:
    """Per value of ``by``, one point per ``bucket`` (from ``since``) that has answers."""
    cells: dict[str, dict[int, list[RequestRecord]]] = {}
    for record in records:
        index = int((record.created_at - since) / bucket)
        cells.setdefault(_value(record, by), {}).setdefault(index, []).append(record)
    series: dict[str, list[SeriesPoint]] = {}
    for name, buckets in sorted(cells.items()):
        points = []
        for index, members in sorted(buckets.items()):
            ttft = sorted(m.ttft_ms for m in members if m.ttft_ms is not None)
            tpot = sorted(m.tpot_ms for m in members if m.tpot_ms is not None)
            points.append(
                SeriesPoint(
                    start=since + bucket * index,
                    count=len(members),
                    ttft_p50=percentile(ttft, 50),
                    ttft_p99=percentile(ttft, 99),
                    tpot_p50=percentile(tpot, 50),
                    tpot_p99=percentile(tpot, 99),
                )
            )
        series[name] = points
    return series


# -- renderings -------------------------------------------------------------------------------------
def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}"


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, the cut marked with an ellipsis."""
    return text if len(text) <= width else text[: width - 1] + "…"


def describe_window(since: datetime, until: datetime) -> str:
    """``2026-11-29 09:00 to 10:00 UTC (1 h)``."""
    same_day = since.date() == until.date()
    end = until.strftime("%H:%M") if same_day else until.strftime("%Y-%m-%d %H:%M")
    return f"{since.strftime('%Y-%m-%d %H:%M')} to {end} UTC ({human_duration(until - since)})"


def human_duration(delta: timedelta) -> str:
    """``90 s``, ``15 min``, ``1 h``, ``7 d``, ``36 h``: the window length with its unit."""
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def render_text(report: Report, width: int = WIDTH) -> str:
    """The report as plain text no wider than ``width`` columns (units in every header)."""
    by = ", ".join(report.by)
    lines = [
        _fit(f"opsbot stats, {describe_window(report.since, report.until)}", width),
        _fit(f"{report.total.count} request{'' if report.total.count == 1 else 's'}, grouped by {by}", width),
    ]
    if not report.total.count:
        lines.append("no requests in this window")
        return "\n".join(lines)
    numbers = 8 + 8 + 9 + 10  # requests, errors, error %, reuse %
    label_width = width - numbers - 1
    rows = [*report.groups, report.total] if len(report.groups) > 1 else report.groups
    lines += [
        "",
        f"{'group':<{label_width}} {'requests':>8}{'errors':>8}{'error %':>9}{'reuse %':>10}",
    ]
    for g in rows:
        label = _label(g, report.by)
        lines.append(
            f"{_fit(label, label_width):<{label_width}} {g.count:>8}{g.errors:>8}"
            f"{_pct(g.error_rate):>9}{_pct(g.prefix_cache_reuse):>10}"
        )
    lines.append("(reuse %: prompt tokens served from the prefix cache)")
    label_width = width - 12 - 3 * 11
    lines += ["", f"{'latency':<{label_width}}{'metric':<12}{'p50 ms':>11}{'p90 ms':>11}{'p99 ms':>11}"]
    for g in rows:
        label = _fit(_label(g, report.by), label_width - 1)
        for i, (name, title) in enumerate(METRICS):
            p: Percentiles = getattr(g, name)
            head = label if i == 0 else ""
            lines.append(f"{head:<{label_width}}{title:<12}{_ms(p.p50):>11}{_ms(p.p90):>11}{_ms(p.p99):>11}")
    lines += ["", *render_histogram(report.histogram, width)]
    if report.investigations is not None:
        lines += ["", *render_investigations(report.investigations, width)]
    return "\n".join(lines)


def render_investigations(inv: InvestigationStats, width: int = WIDTH) -> list[str]:
    """The investigations section: steps, step TTFT, prefix-cache reuse per step, calls per tool."""
    lines = [
        _fit(
            f"investigations: {inv.investigations}, {inv.steps} model steps, "
            f"{inv.calls_unparsed} unparsed calls",
            width,
        ),
        _fit(f"step TTFT p50 / p99: {_ms(inv.step_ttft_ms.p50)} / {_ms(inv.step_ttft_ms.p99)} ms", width),
        _fit(
            f"cached prompt tokens / previous step's prompt: mean {_pct(inv.cached_of_previous_mean)} %, "
            f"min {_pct(inv.cached_of_previous_min)} %",
            width,
        ),
        f"{'tool':<20}{'calls':>8}{'failed':>8}{'p50 ms':>11}{'p99 ms':>11}{'out tokens':>12}",
    ]
    for tool in inv.tools:
        lines.append(
            f"{_fit(tool.tool, 19):<20}{tool.calls:>8}{tool.failed:>8}{_ms(tool.latency_ms.p50):>11}"
            f"{_ms(tool.latency_ms.p99):>11}{tool.output_tokens:>12}"
        )
    return lines


def _label(group: GroupStats, by: Sequence[str]) -> str:
    return " / ".join(group.key[d] for d in by) if group.key else "all"


def render_histogram(bins: Sequence[HistogramBin], width: int = WIDTH) -> list[str]:
    """A text bar chart of TTFT, one line per bucket, ``width`` columns at most."""
    total = sum(b.count for b in bins)
    if not total:
        return ["TTFT histogram: no answer had a first token"]
    label_width = max(len(b.label) for b in bins)
    count_width = len(str(max(b.count for b in bins)))
    bar_room = width - label_width - count_width - 4
    biggest = max(b.count for b in bins)
    lines = [f"TTFT histogram ({total} answers with a first token)"]
    for b in bins:
        bar = "█" * max(1 if b.count else 0, round(b.count / biggest * bar_room))
        lines.append(f"{b.label:>{label_width}} │{bar:<{bar_room}} {b.count:>{count_width}}")
    return lines


def render_json(report: Report) -> dict[str, object]:
    """The report as JSON-ready data (latencies in ms, shares 0-1)."""
    return {
        "since": report.since.isoformat(),
        "until": report.until.isoformat(),
        "unit": "ms",
        "by": list(report.by),
        "total": report.total.as_dict(),
        "groups": [g.as_dict() for g in report.groups],
        "ttft_histogram": [
            {"low_ms": b.low_ms, "high_ms": b.high_ms, "count": b.count} for b in report.histogram
        ],
        "investigations": asdict(report.investigations) if report.investigations is not None else None,
    }


CSV_COLUMNS = (
    "requests",
    "errors",
    "error_rate",
    "prefix_cache_reuse",
    "prompt_tokens",
    "cached_tokens",
    *(f"{name.removesuffix('_ms')}_{p}_ms" for name, _ in METRICS for p in ("p50", "p90", "p99")),
)
"""CSV columns after the ``--by`` dimensions (shares 0-1, latencies in ms)."""


def render_csv(report: Report) -> str:
    """One CSV row per group: the ``--by`` dimensions, then :data:`CSV_COLUMNS`."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*report.by, *CSV_COLUMNS])

    def num(value: float | None) -> str:
        return "" if value is None else f"{value:.3f}"

    for g in report.groups:
        latencies = [num(getattr(getattr(g, name), p)) for name, _ in METRICS for p in ("p50", "p90", "p99")]
        writer.writerow(
            [
                *(g.key[d] for d in report.by),
                g.count,
                g.errors,
                f"{g.error_rate:.6f}",
                "" if g.prefix_cache_reuse is None else f"{g.prefix_cache_reuse:.6f}",
                g.prompt_tokens,
                g.cached_tokens,
                *latencies,
            ]
        )
    return out.getvalue()
