"""One batch analysis from records to report: the flow both entry points share.

:func:`prepare` (CPU work, no engine: call it off the event loop where one runs) filters the window,
groups, renders one prompt per group and counts what grouping saved. :func:`execute` runs what is
not finished yet (an executor is only built when something is left: a finished analysis re-runs
without starting vLLM). :func:`finish` writes ``report.json``, ``report.md`` and ``counts.png``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from bot.analyze.grouping import GroupingResult, group_records
from bot.analyze.readers import filter_window
from bot.analyze.records import ReadResult
from bot.analyze.report import ReportFiles, build_report, write_report
from bot.analyze.runner import BatchRunner, Executor, RunSummary
from bot.analyze.work import Plan, plan_work
from bot.answer_clean import with_fence_stops
from bot.prompts import PromptBuilder
from bot.routing import LANES
from bot.types import MessageKind
from inference.engine import SamplingSettings
from inference.scenarios import ScenarioRegistry

SCENARIOS: tuple[str, ...] = tuple(s for s in LANES[MessageKind.BATCH] if s != "chat")
"""Scenarios a batch analysis can run (the lane table's batch row, without plain chat)."""


@dataclass(slots=True)
class JobSpec:
    """What to analyse and how."""

    input_name: str
    scenario: str
    out_dir: Path
    since: datetime | None = None
    until: datetime | None = None
    max_tokens: int | None = None
    """Answer tokens per group (``None``: the scenario's preset)."""
    max_groups: int = 200
    max_group_lines: int = 40
    instance_labels: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {self.scenario!r}; use one of {', '.join(SCENARIOS)}")
        if self.since is not None and self.until is not None and self.since >= self.until:
            raise ValueError("--since must be before --until")


@dataclass(slots=True)
class Prepared:
    """An analysis ready to run."""

    spec: JobSpec
    read: ReadResult
    outside_window: int
    grouping: GroupingResult
    plan: Plan
    sampling: SamplingSettings


def prepare(spec: JobSpec, read: ReadResult, builder: PromptBuilder, scenarios: ScenarioRegistry) -> Prepared:
    """Window, groups, prompts and savings (see the module doc)."""
    records, outside = filter_window(read.records, spec.since, spec.until)
    grouping = (
        group_records(records, spec.instance_labels) if spec.instance_labels else group_records(records)
    )
    sampling = with_fence_stops(scenarios.get(spec.scenario))
    if spec.max_tokens is not None:
        sampling = replace(sampling, max_tokens=spec.max_tokens)
    plan = plan_work(
        grouping.groups,
        spec.scenario,
        builder,
        sampling.max_tokens,
        max_groups=spec.max_groups,
        max_lines=spec.max_group_lines,
    )
    return Prepared(spec, read, outside, grouping, plan, sampling)


async def execute(
    prepared: Prepared,
    runner: BatchRunner,
    make_executor: Callable[[], Awaitable[Executor]],
    stop: asyncio.Event,
) -> RunSummary:
    """Run the items not finished yet; builds the executor only when there are some."""
    items = prepared.plan.items
    finished = runner.load_finished()
    if all(item.id in finished for item in items):
        return await runner.run(items, _Nothing(), prepared.sampling, stop)
    executor = await make_executor()
    return await runner.run(items, executor, prepared.sampling, stop)


class _Nothing(Executor):
    """Stands in when every item is finished already (the runner then runs none)."""

    mode = "none (all done earlier)"

    async def run(
        self, items: Sequence[Any], sampling: SamplingSettings, done: Any, stop: asyncio.Event
    ) -> None:
        return None


def finish(
    prepared: Prepared, runner: BatchRunner, summary: RunSummary | None, model: str
) -> tuple[dict[str, Any], ReportFiles]:
    """Build and write the report from everything finished so far (this run's and earlier ones')."""
    spec = prepared.spec
    report = build_report(
        input_name=spec.input_name,
        read=prepared.read,
        outside_window=prepared.outside_window,
        since=spec.since,
        until=spec.until,
        grouping=prepared.grouping,
        plan=prepared.plan,
        results=runner.finished or runner.load_finished(),
        summary=summary,
        scenario=spec.scenario,
        model=model,
    )
    return report, write_report(spec.out_dir, report)
