"""What a batch run keeps on disk: one JSON line per finished item, appended as it completes.

``results.jsonl`` in the output folder is the run's memory. Every finished item is one line, written
and flushed the moment its answer is complete, so a Ctrl-C or a killed process loses only the items
still running; a re-run reads the file, skips every item whose id is there and runs the rest. A
line cut short by a kill mid-write is reported and its item simply runs again.

``run.json`` holds the run's id (request ids of its rows in the store carry it), made on the first
run into a folder and reused by every re-run there.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from bot.analyze.records import BadLine
from bot.routing import BATCH_SCENARIO
from bot.store import RequestRecord
from inference.engine import Lane

logger = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
RUN_FILE = "run.json"


@dataclass(slots=True)
class ItemResult:
    """One finished item: its answer, counts and timings (milliseconds)."""

    id: str
    group: str
    """The group's key."""
    scenario: str
    request_id: str
    text: str
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    queue_ms: float | None
    ttft_ms: float | None
    tpot_ms: float | None
    e2e_ms: float | None
    created_at: str
    """ISO 8601 UTC: when the item's request was made."""
    finished_at: str
    model: str = ""
    mode: str = ""
    """``offline`` (vLLM static batch) or ``engine`` (an engine's own interface, the bot's lanes)."""
    platform: str = "analyze"
    channel: str | None = None
    left_out: list[str] = field(default_factory=list)
    failure: str | None = None
    """Why the answer does not count as a summary (``empty``, ``echoed the prompt``;
    :func:`bot.answer_clean.echo_verdict`), ``None`` when it does."""

    def to_record(self) -> RequestRecord:
        """The request row of this item (status ``ok``)."""
        return RequestRecord(
            request_id=self.request_id,
            platform=self.platform,
            channel=self.channel,
            thread_id=None,
            user=None,
            scenario=BATCH_SCENARIO,
            lane=Lane.BACKGROUND.value,
            status="ok",
            model=self.model or None,
            prompt_tokens=self.prompt_tokens,
            cached_tokens=self.cached_tokens,
            output_tokens=self.output_tokens,
            queue_ms=self.queue_ms,
            ttft_ms=self.ttft_ms,
            tpot_ms=self.tpot_ms,
            e2e_ms=self.e2e_ms,
            created_at=datetime.fromisoformat(self.created_at),
            finished_at=datetime.fromisoformat(self.finished_at),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ItemResult:
        """Read back one line (unknown keys from a newer opsbot are ignored)."""
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


class ResultLog:
    """``results.jsonl`` of one output folder (see the module doc)."""

    def __init__(self, out_dir: Path) -> None:
        self.path = out_dir / RESULTS_FILE
        self._file: IO[str] | None = None

    def load(self) -> tuple[dict[str, ItemResult], list[BadLine]]:
        """Finished items by id, and the lines that could not be read (a write cut short by a kill)."""
        done: dict[str, ItemResult] = {}
        bad: list[BadLine] = []
        if not self.path.exists():
            return done, bad
        with self.path.open(encoding="utf-8", errors="replace") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    result = ItemResult.from_json(json.loads(line))
                except (ValueError, TypeError) as exc:
                    bad.append(
                        BadLine(RESULTS_FILE, number, f"unreadable result ({exc}); its item runs again")
                    )
                    continue
                done[result.id] = result
        return done, bad

    def append(self, result: ItemResult) -> None:
        """Write one finished item and flush it to the OS: a killed process keeps it (an OS crash may
        lose the last lines, whose items then simply run again; no fsync per item, which would slow a
        fast batch to the disk's pace)."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            needs_newline = (
                self.path.exists() and self.path.stat().st_size > 0 and not _ends_with_newline(self.path)
            )
            self._file = self.path.open("a", encoding="utf-8")
            if needs_newline:  # the last run was killed mid-line: never glue a new line onto it
                self._file.write("\n")
        self._file.write(json.dumps(asdict(result), ensure_ascii=False) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file (appending again reopens it)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _ends_with_newline(path: Path) -> bool:
    with path.open("rb") as handle:
        handle.seek(-1, 2)
        return handle.read(1) == b"\n"


def run_id(out_dir: Path, about: dict[str, Any]) -> str:
    """The run id of ``out_dir``: read from ``run.json``, or made and written there on a first run."""
    path = out_dir / RUN_FILE
    if path.exists():
        try:
            value = json.loads(path.read_text(encoding="utf-8"))["run_id"]
            if isinstance(value, str) and value:
                return value
        except (ValueError, KeyError, TypeError):
            logger.warning("%s is unreadable; starting a new run id there", path)
    value = secrets.token_hex(4)
    out_dir.mkdir(parents=True, exist_ok=True)
    payload = {"run_id": value, "created_at": datetime.now(UTC).isoformat(), **about}
    path.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return value
