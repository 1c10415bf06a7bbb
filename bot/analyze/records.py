"""Plain data of a batch analysis: what the readers produce, what grouping makes of it, what a run
keeps per item. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

RecordKind = Literal["alert", "event", "log"]


@dataclass(slots=True)
class Record:
    """One input item, whatever the format: an alert firing, a Kubernetes event, a log line."""

    kind: RecordKind
    name: str
    """``alertname``, the event's ``reason``, or the log line's level (the template comes later)."""
    labels: dict[str, str]
    """Alert labels; for events ``namespace``, ``object_kind``, ``object``, ``type``, ``component``;
    for log lines ``file`` and ``level``."""
    at: datetime | None
    """When it fired / happened (UTC); ``None`` when the input does not say."""
    text: str
    """Human text: the alert's summary or description, the event's message, the log message."""
    source: str
    """Where it was read: ``file:line``."""
    status: str = ""
    """``firing`` / ``resolved`` / ``suppressed`` (alerts), ``Normal`` / ``Warning`` (events), the
    level (log lines)."""
    ends_at: datetime | None = None
    """When a resolved alert ended."""
    count: int = 1
    """Occurrences this record stands for (a Kubernetes event's ``count``)."""
    identity: str = ""
    """What stays equal across repeats of the same thing (an alert's fingerprint, an event's uid):
    two records with the same identity and time are one firing seen twice."""


@dataclass(frozen=True, slots=True)
class BadLine:
    """An input line (or JSON element) that was skipped, and why."""

    source: str
    line: int
    """1-based line number in ``source``."""
    reason: str

    def __str__(self) -> str:
        return f"{self.source} line {self.line}: {self.reason}"

    def as_json(self) -> dict[str, Any]:
        """For the JSON report."""
        return {"source": self.source, "line": self.line, "reason": self.reason}


@dataclass(slots=True)
class ReadResult:
    """Everything read from one input."""

    records: list[Record]
    bad_lines: list[BadLine]
    format: str
    """``json``, ``jsonl``, ``logs`` (or several, comma-separated, for a folder)."""
    files: int = 1
    without_time: int = 0
    """Records with no timestamp (kept regardless of ``--since`` / ``--until``)."""


@dataclass(slots=True)
class Group:
    """Near-identical records summarised once."""

    key: str
    """Stable id of the group (a hash of what makes its records alike)."""
    kind: RecordKind
    name: str
    """What the group is about: the alertname, the event reason, the log template."""
    labels: dict[str, str]
    """What every record of the group shares (instance-like labels dropped, replica hashes masked)."""
    records: list[Record] = field(default_factory=list)
    varying: dict[str, list[str]] = field(default_factory=dict)
    """Instance-like labels and the distinct values seen (``pod``, ``instance``, ``node``, ...)."""
    repeats_merged: int = 0
    """Records dropped as repeats of one firing (the same alert in several notifications)."""

    @property
    def occurrences(self) -> int:
        """Firings / events / lines the group stands for (a Kubernetes event's count included)."""
        return sum(r.count for r in self.records)

    @property
    def first(self) -> datetime | None:
        """Earliest record time."""
        times = [r.at for r in self.records if r.at is not None]
        return min(times) if times else None

    @property
    def last(self) -> datetime | None:
        """Latest record time."""
        times = [r.at for r in self.records if r.at is not None]
        return max(times) if times else None

    @property
    def instances(self) -> int:
        """Distinct things that fired (fingerprints / objects / files)."""
        return len({r.identity for r in self.records}) or 1

    @property
    def title(self) -> str:
        """One line naming the group: its name and the labels that tell it apart most."""
        first = ("namespace", "service", "deployment", "object", "file", "severity", "level", "type")
        keys = [k for k in first if self.labels.get(k)] + sorted(k for k in self.labels if k not in first)
        shown = [f"{k}={self.labels[k]}" for k in keys if k != "alertname" and self.labels[k]][:4]
        return f"{self.name}" + (f" ({', '.join(shown)})" if shown else "")

    def statuses(self) -> dict[str, int]:
        """Records per status."""
        out: dict[str, int] = {}
        for r in self.records:
            out[r.status or "unknown"] = out.get(r.status or "unknown", 0) + 1
        return out
