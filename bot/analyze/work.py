"""From groups to work items: one prompt per group, a stable id per item, and what grouping saved.

Each group becomes one request: the analysis scenario's task (``bot.prompts``), the group's data as
one fenced, labelled section of untrusted data (shared labels, what varies, statuses, counts over
time, the distinct messages, then the firings themselves), within the same token budget the bot
uses for cluster context. The shared system prompt comes first, byte-identical to the bot's, so
every item of a batch reuses its cached KV blocks.

An item's id hashes the scenario, the group and its members (not the rendered prompt, whose fences
carry a random tag): a re-run over the same input finds its finished items by id and skips them.

Savings are counted with the model's tokenizer: the prompt tokens every record would have needed
as an item of its own (the same task, system prompt and fences around that one record's line)
against the tokens of the grouped prompts.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from bot.analyze.grouping import severity, template
from bot.analyze.records import Group, Record
from bot.context.base import ContextBundle, ContextSection
from bot.context.budget import section_tokens
from bot.prompts import PromptBuilder, PromptPlan
from bot.redact import redact
from inference.scenarios import ALERT_SUMMARY, CHANGE_REVIEW, ROOT_CAUSE, TIMELINE

SOURCE = "opsbot analyze"
_KIND_WORDS = {
    "alert": ("alert firing", "alert firings"),
    "event": ("event", "events"),
    "log": ("log line", "log lines"),
}
_QUESTIONS = {
    ALERT_SUMMARY: "Summarise this group for the shift hand-over report: what fired, where, when and how "
    "often, the likely impact, and the first thing to check.",
    ROOT_CAUSE: "What is the most likely root cause behind this group? Name the failing component and the "
    "evidence, then the next diagnostic steps.",
    CHANGE_REVIEW: "Review what changed in this group (rollouts, restarts, configuration) for risk and for a "
    "link to the problems it shows; say whether a rollback looks warranted.",
    TIMELINE: "Write the timeline of this group: oldest first, one line per step, UTC times.",
}


@dataclass(slots=True)
class WorkItem:
    """One request of a batch: a group and its rendered prompt."""

    id: str
    group: Group
    scenario: str
    token_ids: list[int]
    left_out: list[str] = field(default_factory=list)
    """Data of the group that did not fit the budget (``"40 more lines of this group"``)."""
    prompt: str = ""
    """The prompt's text (every message): an answer that only repeats it counts as failed."""
    task: str = ""
    """The prompt's last user turn: an answer that opens by copying it loses the copy."""

    @property
    def prompt_tokens(self) -> int:
        """Prompt length in tokens."""
        return len(self.token_ids)


@dataclass(slots=True)
class Savings:
    """What grouping saved (tokens counted with the model's tokenizer)."""

    items: int
    """Records (repeats merged) that would each have been an item without grouping."""
    groups: int
    tokens_each: int
    """Prompt tokens of those items, one prompt per record."""
    tokens_grouped: int
    """Prompt tokens of the grouped items."""

    @property
    def items_saved(self) -> int:
        """Requests grouping saved."""
        return self.items - self.groups

    @property
    def tokens_saved(self) -> int:
        """Prompt tokens grouping saved."""
        return self.tokens_each - self.tokens_grouped

    def as_json(self) -> dict[str, int | str]:
        """For the JSON report."""
        return {
            "items": self.items,
            "groups": self.groups,
            "items_saved": self.items_saved,
            "prompt_tokens_each": self.tokens_each,
            "prompt_tokens_grouped": self.tokens_grouped,
            "prompt_tokens_saved": self.tokens_saved,
            "unit": "tokens",
        }


@dataclass(slots=True)
class Plan:
    """The work of one batch analysis."""

    items: list[WorkItem]
    savings: Savings
    not_planned: list[Group] = field(default_factory=list)
    """Groups beyond ``max_groups``: listed in the report without a summary."""


def item_id(scenario: str, group: Group, max_tokens: int) -> str:
    """The stable id of ``group``'s item in ``scenario`` (see the module doc)."""
    members = [[r.identity, r.at.isoformat() if r.at else "", r.source, r.count] for r in group.records]
    blob = json.dumps([scenario, group.key, max_tokens, members], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%SZ") if moment else "time unknown"


def record_line(record: Record) -> str:
    """One record as one line of data."""
    when = record.at.strftime("%H:%M:%S") if record.at else "--:--:--"
    text = " ".join(record.text.split())[:300]
    if record.kind == "alert":
        ended = f" until {record.ends_at.strftime('%H:%M:%S')}" if record.ends_at else ""
        which = " ".join(
            f"{k}={record.labels[k]}" for k in ("pod", "instance", "node", "job_name") if record.labels.get(k)
        )
        return f"- {when}{ended} [{record.status}] {which}: {text}".rstrip(": ")
    if record.kind == "event":
        obj = f"{record.labels.get('object_kind', '')}/{record.labels.get('object', '')}".strip("/")
        times = f" x{record.count}" if record.count > 1 else ""
        return f"- {when} [{record.status}] {obj}{times}: {text}"
    return f"- {when} {record.labels.get('level', '')} {record.labels.get('file', '')}: {text}"


def describe_group(group: Group, max_lines: int = 40) -> str:
    """The data of ``group`` for its prompt: facts first, then the records (oldest first)."""
    singular, plural = _KIND_WORDS[group.kind]
    n = group.occurrences
    lines = [
        f"{n} {singular if n == 1 else plural} of {group.name} ({group.instances} distinct), "
        f"{_when(group.first)} to {_when(group.last)} (UTC)",
    ]
    if group.labels:
        lines.append("Shared labels: " + " ".join(f"{k}={v}" for k, v in group.labels.items() if v))
    for label, values in group.varying.items():
        shown = ", ".join(values[:8]) + (f" and {len(values) - 8} more" if len(values) > 8 else "")
        lines.append(f"Varies by {label} ({len(values)}): {shown}")
    lines.append("Status: " + ", ".join(f"{count} {status}" for status, count in group.statuses().items()))
    if group.repeats_merged:
        lines.append(f"Repeats of the same firing merged: {group.repeats_merged}")
    shapes = Counter(template(r.text) for r in group.records if r.text)
    if len(shapes) > 1:
        lines.append(f"Distinct messages ({len(shapes)}), most frequent first:")
        lines.extend(f"  {count}x {shape}" for shape, count in shapes.most_common(5))
    listed = group.records if len(group.records) <= max_lines else _spread(group.records, max_lines)
    lines.append(f"Records ({len(listed)} of {len(group.records)}, oldest first):")
    lines.extend(record_line(r) for r in listed)
    if len(listed) < len(group.records):
        lines.append(f"- ... {len(group.records) - len(listed)} more not listed")
    return redact("\n".join(lines), where="batch")


def _spread(records: Sequence[Record], count: int) -> list[Record]:
    """``count`` records spread over the whole span, first and last included (a listing that shows
    how the group went, not only how it began)."""
    if count <= 1:
        return [records[0]]
    step = (len(records) - 1) / (count - 1)
    return [records[round(i * step)] for i in range(count)]


def question(scenario: str, group: Group, index: int, total: int) -> str:
    """The instruction of one item (the scenario's task itself comes from ``bot.prompts``)."""
    ask = _QUESTIONS.get(scenario, _QUESTIONS[ALERT_SUMMARY])
    level = severity(group)
    tag = f" ({level})" if level else ""
    return f"Batch analysis, group {index} of {total}: {group.title}{tag}. {ask}"


def _bundle(group: Group, index: int, total: int, max_lines: int) -> ContextBundle:
    section = ContextSection(
        source=SOURCE,
        title=redact(f"group {index} of {total}: {group.title}", where="batch"),
        body=describe_group(group, max_lines),
        priority=0,
        unit="more lines of this group",
        drop_from="end",
    )
    return ContextBundle(sections=[section], notes=[], elapsed_ms=0.0)


def _fitting_bundle(
    group: Group, index: int, total: int, max_lines: int, builder: PromptBuilder, budget: int
) -> ContextBundle:
    """The group's data with as many records listed as fit ``budget`` tokens: fewer records spread
    over the whole span tell more than the budget cutting the newest ones off the end."""
    lines = max_lines
    while True:
        bundle = _bundle(group, index, total, lines)
        if lines <= 3 or section_tokens(bundle.sections[0], builder.tokenizer) <= budget:
            return bundle
        lines = max(3, int(lines * 0.6))


def _fitting_prompt(
    group: Group,
    index: int,
    total: int,
    scenario: str,
    builder: PromptBuilder,
    max_tokens: int,
    max_lines: int,
) -> PromptPlan:
    """The item's prompt, its data cut until prompt and answer fit the context window (the system
    prompt and the task take their share first)."""
    room = builder.max_model_len - max_tokens
    budget = builder.context_budget
    while True:
        plan = builder.build(
            scenario=scenario,
            question=question(scenario, group, index, total),
            asker=None,
            context=_fitting_bundle(group, index, total, max_lines, builder, budget),
            max_tokens=max_tokens,
        )
        if plan.prompt_tokens <= room or budget <= 64:
            return plan
        budget = max(64, budget - (plan.prompt_tokens - room) - 16)


def plan_work(
    groups: Sequence[Group],
    scenario: str,
    builder: PromptBuilder,
    max_tokens: int,
    *,
    max_groups: int | None = None,
    max_lines: int = 40,
) -> Plan:
    """One item per group (the first ``max_groups``), and the savings of grouping."""
    chosen = list(groups if max_groups is None else groups[:max_groups])
    items: list[WorkItem] = []
    for index, group in enumerate(chosen, start=1):
        plan = _fitting_prompt(group, index, len(chosen), scenario, builder, max_tokens, max_lines)
        items.append(
            WorkItem(
                item_id(scenario, group, max_tokens),
                group,
                scenario,
                plan.token_ids,
                plan.left_out,
                prompt="\n".join(m.content for m in plan.messages),
                task=plan.messages[-1].content,
            )
        )
    savings = _savings(chosen, items, scenario, builder, max_tokens, max_lines)
    return Plan(items=items, savings=savings, not_planned=list(groups[len(chosen) :]))


def _savings(
    groups: Sequence[Group],
    items: Sequence[WorkItem],
    scenario: str,
    builder: PromptBuilder,
    max_tokens: int,
    max_lines: int,
) -> Savings:
    """Prompt tokens one item per record would have taken: the exact prompt of one one-record item
    (the fixed part), plus each record's own data line counted with the tokenizer."""
    records = [r for g in groups for r in g.records]
    if not records:
        return Savings(items=0, groups=len(groups), tokens_each=0, tokens_grouped=0)
    sample = groups[0].records[0]
    single = Group(
        key="single", kind=sample.kind, name=groups[0].name, labels=groups[0].labels, records=[sample]
    )
    fixed = builder.build(
        scenario=scenario,
        question=question(scenario, single, 1, 1),
        asker=None,
        context=_bundle(single, 1, 1, max_lines),
        max_tokens=max_tokens,
    ).prompt_tokens - builder.tokenizer.count(record_line(sample))
    each = sum(fixed + builder.tokenizer.count(record_line(r)) for r in records)
    return Savings(
        items=len(records),
        groups=len(groups),
        tokens_each=each,
        tokens_grouped=sum(i.prompt_tokens for i in items),
    )
