"""The report of a batch analysis: one JSON document, rendered as Markdown and as a PNG chart.

:func:`build_report` gathers everything into plain data (``report.json``): the input and its bad
lines, the window, what grouping saved, how the run went, the groups (largest first) with their
summaries, counts over time per group, and what changed during the window (groups that started or
went quiet, rates that rose or fell, rollouts seen in pod names, change events and log lines).
:func:`render_markdown` (``report.md``) and :func:`bot.plots.plot_counts` (``counts.png``, alert
counts over time per group) only render that document, so the three always agree.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.analyze.grouping import GroupingResult, severity
from bot.analyze.records import Group, ReadResult
from bot.analyze.results import ItemResult
from bot.analyze.runner import RunSummary
from bot.analyze.work import Plan, WorkItem
from bot.answer_clean import ECHO, EMPTY
from bot.errors import OpsbotError
from bot.plots import COUNTS_SIZE_PX, plot_counts
from bot.redact import redact

logger = logging.getLogger(__name__)

REPORT_MD = "report.md"
REPORT_JSON = "report.json"
COUNTS_PNG = "counts.png"
PNG_SIZE = COUNTS_SIZE_PX
"""Width and height of ``counts.png`` in pixels."""
_SERIES = 8
"""Groups drawn on their own in the chart and the counts table (the rest are summed as "other")."""
_BUCKETS_S = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 604800)
_MAX_BUCKETS = 48
_KIND_PLURAL = {"alert": "alert firings", "event": "events", "log": "log lines"}
_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
_POD = re.compile(rf"^(?P<base>.+)-(?P<rs>{_SAFE}{{6,10}})-{_SAFE}{{5}}$")
_CHANGE_REASONS = frozenset({"ScalingReplicaSet", "SuccessfulRescale", "DeploymentRollback", "RollingUpdate"})
_CHANGE_WORDS = re.compile(
    r"\b(?:deploy(?:ed|ing|ment)?|roll(?:ed|ing)?[ -]?(?:out|back)|rollout|upgrade[ds]?|release[ds]?|"
    r"migrat(?:e|ed|ion)|config(?:uration)? (?:reload(?:ed)?|change[ds]?)|new version)\b",
    re.IGNORECASE,
)


@dataclass(slots=True)
class ReportFiles:
    """Where a report was written."""

    markdown: Path
    json: Path
    png: Path


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z") if moment else None


def _hm(value: str | None) -> str:
    return value[11:16] if value else "-"


def build_report(
    *,
    input_name: str,
    read: ReadResult,
    outside_window: int,
    since: datetime | None,
    until: datetime | None,
    grouping: GroupingResult,
    plan: Plan,
    results: Mapping[str, ItemResult],
    summary: RunSummary | None,
    scenario: str,
    model: str,
) -> dict[str, Any]:
    """The whole report as plain data (see the module doc)."""
    groups = grouping.groups
    items_by_group = {item.group.key: item for item in plan.items}
    times = [r.at for g in groups for r in g.records if r.at is not None]
    first, last = (min(times), max(times)) if times else (None, None)
    kinds = {g.kind for g in groups}
    kind = kinds.pop() if len(kinds) == 1 else "record"
    rows = []
    for rank, group in enumerate(groups, start=1):
        item = items_by_group.get(group.key)
        result = results.get(item.id) if item is not None else None
        rows.append(
            {
                "rank": rank,
                "key": group.key,
                "kind": group.kind,
                "name": redact(group.name, where="batch"),
                "title": redact(group.title, where="batch"),
                "labels": {k: redact(v, where="batch") for k, v in group.labels.items()},
                "severity": severity(group),
                "occurrences": group.occurrences,
                "records": len(group.records),
                "distinct": group.instances,
                "repeats_merged": group.repeats_merged,
                "varying": {label: len(values) for label, values in group.varying.items()},
                "first": _iso(group.first),
                "last": _iso(group.last),
                "statuses": group.statuses(),
                "status": _status(item, result),
                "summary": result.text.strip() if result is not None and result.failure is None else None,
                "failure": result.failure if result is not None else None,
                "request_id": result.request_id if result is not None else None,
                "output_tokens": result.output_tokens if result is not None else None,
                "left_out": item.left_out if item is not None else [],
            }
        )
    done = sum(1 for row in rows if row["status"] == "done")
    failures = [row["failure"] for row in rows if row["failure"] is not None]
    return {
        "title": f"opsbot analyze: {scenario} of {input_name}",
        "generated_at": _iso(datetime.now(UTC)),
        "scenario": scenario,
        "model": model,
        "kind": kind,
        "input": {
            "name": input_name,
            "format": read.format,
            "files": read.files,
            "records": len(read.records),
            "outside_window": outside_window,
            "without_time": read.without_time,
            "bad_lines": len(read.bad_lines),
            "bad_line_list": [b.as_json() for b in read.bad_lines[:200]],
        },
        "window": {"since": _iso(since), "until": _iso(until), "first": _iso(first), "last": _iso(last)},
        "grouping": {
            **plan.savings.as_json(),
            "records": grouping.records,
            "repeats_merged": grouping.repeats_merged,
            "groups": len(groups),
        },
        "run": summary.as_json() if summary is not None else None,
        "totals": {
            "groups": len(groups),
            "summarised": done,
            "echoed": failures.count(ECHO),
            "empty": failures.count(EMPTY),
            "pending": sum(1 for row in rows if row["status"] == "pending"),
            "not_planned": len(plan.not_planned),
        },
        "groups": rows,
        "counts_over_time": counts_over_time(groups, first, last),
        "changes": changes(groups, first, last),
    }


def _status(item: WorkItem | None, result: ItemResult | None) -> str:
    """A group's row: ``done``, ``failed: <why>`` (an answer that is no summary), ``pending`` or
    ``not planned``."""
    if item is None:
        return "not planned"
    if result is None:
        return "pending"
    return "done" if result.failure is None else f"failed: {result.failure}"


def _failed_as(failure: str) -> str:
    return "was empty once fence markup was removed" if failure == EMPTY else "only repeated its prompt"


def summarised_text(totals: Mapping[str, int]) -> str:
    """``11 of 13 groups summarised, 2 echoed the prompt``: what the answers were worth."""
    text = f"{totals['summarised']} of {totals['groups']} groups summarised"
    if totals.get("echoed"):
        text += f", {totals['echoed']} echoed the prompt"
    if totals.get("empty"):
        text += f", {totals['empty']} empty"
    return text


def bucket_seconds(span: timedelta) -> int:
    """The smallest round bucket that splits ``span`` into at most 48 buckets."""
    for size in _BUCKETS_S:
        if span.total_seconds() / size <= _MAX_BUCKETS:
            return size
    return _BUCKETS_S[-1]


def _bucket_label(seconds: int) -> str:
    if seconds % 86400 == 0:
        return f"{seconds // 86400} d"
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    return f"{seconds // 60} min"


def counts_over_time(
    groups: Sequence[Group], first: datetime | None, last: datetime | None
) -> dict[str, Any]:
    """Occurrences per time bucket: in total and for the largest groups (the rest as ``other``)."""
    if first is None or last is None:
        return {"bucket_s": None, "bucket": None, "buckets": [], "total": [], "series": []}
    size = bucket_seconds(last - first)
    start = datetime.fromtimestamp(int(first.timestamp()) // size * size, UTC)
    count = int((last - start).total_seconds() // size) + 1
    buckets = [start + timedelta(seconds=size * i) for i in range(count)]

    def series_of(members: Sequence[Group]) -> list[int]:
        values = [0] * count
        for group in members:
            for record in group.records:
                if record.at is not None:
                    values[int((record.at - start).total_seconds() // size)] += record.count
        return values

    top = list(groups[:_SERIES])
    series = [{"key": g.key, "group": redact(g.title, where="batch"), "counts": series_of([g])} for g in top]
    rest = list(groups[_SERIES:])
    if rest:
        series.append({"key": "other", "group": f"{len(rest)} other groups", "counts": series_of(rest)})
    return {
        "bucket_s": size,
        "bucket": _bucket_label(size),
        "buckets": [_iso(b) for b in buckets],
        "total": series_of(groups),
        "series": series,
    }


def changes(groups: Sequence[Group], first: datetime | None, last: datetime | None) -> list[dict[str, Any]]:
    """What changed during the window, oldest first (see the module doc)."""
    found: list[dict[str, Any]] = []
    if first is None or last is None:
        return found
    span = last - first
    margin = span * 0.1
    middle = first + span / 2
    for group in groups:
        title = redact(group.title, where="batch")
        g_first, g_last = group.first, group.last
        if g_first is None or g_last is None:
            continue
        if span.total_seconds() > 0 and g_first > first + margin:
            found.append(
                {"at": _iso(g_first), "kind": "new", "what": f"{title} started ({group.occurrences} in all)"}
            )
        statuses = group.statuses()
        quiet = group.kind != "alert" or set(statuses) <= {"resolved"}
        if span.total_seconds() > 0 and g_last < last - margin and quiet:
            found.append({"at": _iso(g_last), "kind": "stopped", "what": f"{title} went quiet (last one)"})
        before = sum(r.count for r in group.records if r.at is not None and r.at < middle)
        after = sum(r.count for r in group.records if r.at is not None and r.at >= middle)
        if max(before, after) >= 5 and g_first <= first + margin:
            if after >= 2 * max(before, 1):
                found.append(
                    {
                        "at": _iso(middle),
                        "kind": "rate",
                        "what": f"{title} rose from {before} to {after} per half",
                    }
                )
            elif before >= 2 * max(after, 1):
                found.append(
                    {
                        "at": _iso(middle),
                        "kind": "rate",
                        "what": f"{title} fell from {before} to {after} per half",
                    }
                )
        found.extend(_change_records(group, title))
    found.extend(_rollouts(groups))
    unique: dict[tuple[str | None, str], dict[str, Any]] = {}
    for change in found:
        unique.setdefault((change["at"], change["what"]), change)
    return sorted(unique.values(), key=lambda c: (c["at"] or "", c["kind"], c["what"]))[:60]


def _change_records(group: Group, title: str) -> list[dict[str, Any]]:
    out = []
    if group.kind == "event" and group.name in _CHANGE_REASONS:
        for record in group.records[-10:]:
            text = redact(" ".join(record.text.split())[:200], where="batch")
            out.append({"at": _iso(record.at), "kind": "change", "what": f"{group.name}: {text}"})
    elif group.kind == "log" and _CHANGE_WORDS.search(group.name):
        for record in group.records[-5:]:
            text = redact(" ".join(record.text.split())[:200], where="batch")
            out.append(
                {"at": _iso(record.at), "kind": "change", "what": f"{record.labels.get('file')}: {text}"}
            )
    return out


def _rollouts(groups: Sequence[Group]) -> list[dict[str, Any]]:
    """Workloads whose pods came from more than one ReplicaSet during the window: a rollout."""
    seen: dict[str, dict[str, datetime]] = {}
    for group in groups:
        for record in group.records:
            pod = record.labels.get("pod") or (
                record.labels.get("object") if record.kind == "event" else None
            )
            match = _POD.match(pod or "")
            if match is None or record.at is None:
                continue
            hashes = seen.setdefault(match.group("base"), {})
            rs = match.group("rs")
            if rs not in hashes or record.at < hashes[rs]:
                hashes[rs] = record.at
    out = []
    for base, hashes in sorted(seen.items()):
        if len(hashes) < 2:
            continue
        ordered = sorted(hashes.items(), key=lambda pair: pair[1])
        chain = " -> ".join(f"{base}-{rs}" for rs, _ in ordered)
        out.append(
            {
                "at": _iso(ordered[1][1]),
                "kind": "rollout",
                "what": f"rollout of {base}: pods of ReplicaSets {chain} (the newer first seen then)",
            }
        )
    return out


# --- rendering ---------------------------------------------------------------------------------


def _fmt_time(value: str | None) -> str:
    return value.replace("T", " ")[:16] if value else "-"


def render_markdown(report: Mapping[str, Any]) -> str:
    """``report.md``: summary lines, top groups, counts over time, what changed, the summaries."""
    inp, window, grouping, run = report["input"], report["window"], report["grouping"], report["run"]
    plural = _KIND_PLURAL.get(report["kind"], "records")
    lines = [f"# {report['title']}", ""]
    lines.append(
        f"Input `{inp['name']}` ({inp['format']}, {inp['files']} file{'s' if inp['files'] != 1 else ''}): "
        f"{inp['records']} records read, {inp['bad_lines']} bad lines skipped"
        + (f", {inp['outside_window']} outside the window" if inp["outside_window"] else "")
        + (f", {inp['without_time']} without a timestamp" if inp["without_time"] else "")
        + "."
    )
    lines.append(
        f"Window (UTC): {_fmt_time(window['since'] or window['first'])} to "
        f"{_fmt_time(window['until'] or window['last'])}; scenario `{report['scenario']}`, "
        f"model `{report['model']}`."
    )
    lines.append("")
    lines.append(
        f"**Grouping:** {grouping['items']} {plural} (after {grouping['repeats_merged']} repeats merged) in "
        f"{grouping['groups']} groups: {grouping['items_saved']} requests and "
        f"{grouping['prompt_tokens_saved']:,} prompt tokens saved ({grouping['prompt_tokens_grouped']:,} "
        f"instead of {grouping['prompt_tokens_each']:,} tokens, counted with the model's tokenizer)."
    )
    totals = report["totals"]
    lines.append(
        f"**Summaries:** {summarised_text(totals)}"
        + (f", {totals['pending']} pending (re-run to finish)" if totals["pending"] else "")
        + (f", {totals['not_planned']} beyond --max-groups" if totals["not_planned"] else "")
        + "."
    )
    if run is not None:
        lines.append(
            f"**This run:** {run['mode']}, {run['finished']} items in {run['wall_s']:.1f} s "
            f"({run['items_per_s']:.2f} items/s, {run['output_tokens_per_s']:.0f} output tokens/s), "
            f"{run['skipped_already_done']} already done"
            + (f", {run['failed']} failed" if run["failed"] else "")
            + (f", interrupted with {run['aborted']} running" if run["interrupted"] else "")
            + "."
        )
    lines += ["", "## Top groups", ""]
    lines.append("| # | group | severity | count | distinct | first seen (UTC) | last seen (UTC) | summary |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for row in report["groups"][:20]:
        lines.append(
            f"| {row['rank']} | {_cell(row['title'])} | {row['severity'] or '-'} | {row['occurrences']} | "
            f"{row['distinct']} | {_fmt_time(row['first'])} | {_fmt_time(row['last'])} | {row['status']} |"
        )
    if len(report["groups"]) > 20:
        lines.append(f"\n{len(report['groups']) - 20} smaller groups are in `report.json`.")
    lines += _counts_table(report["counts_over_time"])
    lines += ["", "## What changed", ""]
    if report["changes"]:
        lines += [f"- {_fmt_time(c['at'])} ({c['kind']}) {c['what']}" for c in report["changes"]]
    else:
        lines.append("Nothing started, stopped or changed its rate noticeably within the window.")
    lines += ["", "## Summaries", ""]
    for row in report["groups"]:
        if row["status"] == "not planned":
            continue
        lines.append(f"### {row['rank']}. {row['title']} ({row['occurrences']} {_KIND_PLURAL[row['kind']]})")
        lines.append("")
        if row["failure"] is not None:
            lines.append(f"_No summary: the model's answer {_failed_as(row['failure'])}._")
        else:
            lines.append(
                row["summary"] or "_No summary yet: re-run `opsbot analyze` with the same --out to finish._"
            )
        notes = [f"request `{row['request_id']}`"] if row["request_id"] else []
        if row["left_out"]:
            notes.append("left out of the prompt: " + "; ".join(row["left_out"]))
        if notes:
            lines += ["", f"_{', '.join(notes)}_"]
        lines.append("")
    if inp["bad_lines"]:
        lines += ["## Bad input lines (skipped)", ""]
        lines += [f"- {b['source']} line {b['line']}: {b['reason']}" for b in inp["bad_line_list"]]
        if inp["bad_lines"] > len(inp["bad_line_list"]):
            lines.append(f"- ... and {inp['bad_lines'] - len(inp['bad_line_list'])} more")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _counts_table(counts: Mapping[str, Any]) -> list[str]:
    if not counts["buckets"]:
        return ["", "## Counts over time", "", "No record carries a timestamp."]
    series = counts["series"][:5]
    lines = ["", f"## Counts over time (per {counts['bucket']}, UTC)", ""]
    lines.append("| time | total | " + " | ".join(_cell(s["group"][:40]) for s in series) + " |")
    lines.append("|---" * (len(series) + 2) + "|")
    for index, bucket in enumerate(counts["buckets"]):
        values = [str(s["counts"][index]) for s in series]
        lines.append(f"| {_fmt_time(bucket)} | {counts['total'][index]} | " + " | ".join(values) + " |")
    lines += ["", f"![counts over time per group]({COUNTS_PNG})"]
    return lines


def write_report(out_dir: Path, report: Mapping[str, Any]) -> ReportFiles:
    """Write ``report.json``, ``report.md`` and ``counts.png`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out_dir / REPORT_MD, out_dir / REPORT_JSON, out_dir / COUNTS_PNG)
    files.json.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    files.markdown.write_text(render_markdown(report), encoding="utf-8")
    try:
        plot_counts(
            report["counts_over_time"],
            files.png,
            title=report["title"],
            unit=_KIND_PLURAL.get(report["kind"], "records"),
        )
    except OpsbotError as exc:  # the report itself is written; only the chart is missing
        logger.warning("%s", exc)
    return files


def chat_summary(
    report: Mapping[str, Any], *, top: int = 8, report_path: str | None = None
) -> tuple[str, str]:
    """The report as chat messages: a one-line header (the thread's first post) and the body (top
    groups with the start of their summaries, what changed) for the thread."""
    grouping, window = report["grouping"], report["window"]
    plural = _KIND_PLURAL.get(report["kind"], "records")
    header = (
        f":bar_chart: *opsbot analyze* ({report['scenario']}) of `{report['input']['name']}`: "
        f"{grouping['items']} {plural} in {grouping['groups']} groups, "
        f"{_fmt_time(window['first'])} to {_fmt_time(window['last'])} UTC"
    )
    lines = [
        f"Grouping saved {grouping['items_saved']} requests and "
        f"{grouping['prompt_tokens_saved']:,} prompt tokens.",
        "",
        "*Top groups*",
    ]
    for row in report["groups"][:top]:
        fallback = f"(no summary: {row['failure']})" if row["failure"] else "(no summary yet)"
        summary = " ".join((row["summary"] or fallback).split())
        if len(summary) > 400:
            summary = summary[:400].rsplit(" ", 1)[0] + " ..."
        lines.append(
            f"{row['rank']}. *{row['title']}*: {row['occurrences']}x, "
            f"{_hm(row['first'])}-{_hm(row['last'])} UTC. {summary}"
        )
    if report["changes"]:
        lines += ["", "*What changed*"]
        lines += [f"- {_hm(c['at'])} {c['what']}" for c in report["changes"][:10]]
    if report["input"]["bad_lines"]:
        lines += ["", f"{report['input']['bad_lines']} bad input lines were skipped (listed in the report)."]
    if report_path:
        lines += ["", f"Full report: `{report_path}`"]
    return header, "\n".join(lines)
