"""Batch inputs as :class:`~bot.analyze.records.Record` s: every format ``opsbot analyze`` reads.

- **JSON**: an Alertmanager API export (``GET /api/v2/alerts``: a list of alerts; ``/api/v2/alerts/
  groups``: a list of groups with their alerts), one webhook notification or a list of them (a
  webhook dump), or ``kubectl get events -o json`` (an ``EventList``).
- **JSONL** (one value a line): alerts (API or webhook shape), webhook notifications, Kubernetes
  events (``core/v1`` or ``events.k8s.io/v1``, bare or as watch events ``{"type", "object"}``), or
  structured log lines (``msg`` / ``message`` with ``ts`` / ``time`` / ``level``).
- **Log files**, a file or a folder of them (``.gz`` too): one record per line, with the timestamp
  (ISO 8601, klog, syslog) and level read from the line; continuation lines (stack traces) join the
  line they belong to.

A line that cannot be read never stops the run: it becomes a :class:`~bot.analyze.records.BadLine`
with its 1-based line number and the reason, and the rest is read. Only an input that cannot be
read at all (no such file, an empty folder) raises :class:`InputError`.
"""

from __future__ import annotations

import bisect
import gzip
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.analyze.records import BadLine, ReadResult, Record
from bot.errors import OpsbotError

FORMATS = ("auto", "json", "jsonl", "logs")
"""Input formats ``--format`` accepts (``auto``: by file name and content)."""

_MAX_TEXT = 2000
"""Characters of one record's text kept (a stack trace beyond that is cut)."""
_DECODER = json.JSONDecoder()


class InputError(OpsbotError):
    """The input cannot be read at all (a missing file, an empty folder, an unknown format)."""


class _Bad(ValueError):
    """One value is not a record we know (its reason goes into a :class:`BadLine`)."""


# --- times ------------------------------------------------------------------------------------


def parse_time(value: object) -> datetime | None:
    """An ISO 8601 time (Go's nanoseconds and ``Z`` too) or epoch seconds / milliseconds, as UTC;
    ``None`` for empty values and Go's zero time (``0001-01-01T00:00:00Z``: "not set").
    :class:`ValueError` for anything else."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a time")
    if isinstance(value, int | float):
        seconds = value / 1000 if value > 1e11 else value  # epoch milliseconds are 13 digits
        return datetime.fromtimestamp(seconds, UTC)
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a time")
    text = value.strip()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{value!r} is not an ISO 8601 time") from None
    if moment.year <= 1:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str, *, now: datetime | None = None) -> datetime:
    """``--since`` / ``--until``: an ISO 8601 time (UTC unless it says otherwise) or a duration back
    from now (``8h``, ``30m``, ``2d``); :class:`ValueError` for anything else."""
    value = text.strip()
    if match := _DURATION.match(value):
        seconds = float(match.group(1)) * _UNIT_S[match.group(2)]
        return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO 8601 time (2026-11-30T08:00Z) nor a duration back from now (8h)"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def filter_window(
    records: list[Record], since: datetime | None, until: datetime | None
) -> tuple[list[Record], int]:
    """The records inside ``[since, until)`` (records without a time are kept: nothing places them
    outside), and how many were dropped."""
    kept = [
        r
        for r in records
        if r.at is None or ((since is None or r.at >= since) and (until is None or r.at < until))
    ]
    return kept, len(records) - len(kept)


# --- entry points -----------------------------------------------------------------------------


def read_path(path: Path, fmt: str = "auto") -> ReadResult:
    """Read a file or a folder of files (see the module doc)."""
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise InputError(f"{path} is an empty folder: nothing to analyse")
        parts = [_read_file(p, fmt, name=str(p.relative_to(path))) for p in files]
        return ReadResult(
            records=[r for part in parts for r in part.records],
            bad_lines=[b for part in parts for b in part.bad_lines],
            format=",".join(sorted({part.format for part in parts})),
            files=len(files),
            without_time=sum(part.without_time for part in parts),
        )
    if not path.exists():
        raise InputError(f"{path}: no such file or folder")
    return _read_file(path, fmt, name=path.name)


def read_bytes(data: bytes, name: str, fmt: str = "auto") -> ReadResult:
    """Read one input given as bytes (an HTTP upload); ``name`` labels its lines."""
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    return _read_data(data, fmt, name, year=datetime.now(UTC).year)


def _read_file(path: Path, fmt: str, *, name: str) -> ReadResult:
    try:
        data = path.read_bytes()
        year = datetime.fromtimestamp(path.stat().st_mtime, UTC).year
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return _read_data(data, fmt, name, year=year)


def _read_data(data: bytes, fmt: str, name: str, *, year: int) -> ReadResult:
    if name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            return ReadResult([], [BadLine(name, 1, f"not a readable gzip file ({exc}); skipped")], "logs")
        name = name[: -len(".gz")]
    if b"\x00" in data[:4096]:
        return ReadResult([], [BadLine(name, 1, "a binary file, not text; skipped")], "logs")
    chosen = fmt if fmt != "auto" else _sniff(name, data)
    if chosen == "json":
        text, bad = _decode(data, name)
        if bad is not None:
            return ReadResult([], [bad], "json")
        result = _read_json(text, name)
        if result is None:  # a .json file that is really JSON lines
            return _read_jsonl(data, name)
        return result
    if chosen == "jsonl":
        return _read_jsonl(data, name)
    return _read_logs(data, name, year)


def _decode(data: bytes, name: str) -> tuple[str, BadLine | None]:
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        return "", BadLine(name, line, "not UTF-8 text; the file was skipped")


def _sniff(name: str, data: bytes) -> str:
    lower = name.lower()
    if lower.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if lower.endswith(".json"):
        return "json"
    head = data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1]
    if head == b"[":
        return "json"
    if head == b"{":
        # One JSON object over several lines (a pretty-printed notification) or one per line.
        first = data.lstrip().split(b"\n", 1)[0]
        try:
            json.loads(first)
        except ValueError:
            return "json"
        return "jsonl"
    return "logs"


# --- JSON documents ---------------------------------------------------------------------------


class _Lines:
    """Offset -> 1-based line number in one text."""

    def __init__(self, text: str) -> None:
        self._starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def at(self, offset: int) -> int:
        return bisect.bisect_right(self._starts, offset)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _array_elements(text: str, start: int) -> list[tuple[Any, int]]:
    """The elements of the JSON array opening at ``start``, each with its offset;
    :class:`json.JSONDecodeError` at the first thing that is not JSON."""
    out: list[tuple[Any, int]] = []
    i = _skip_ws(text, start + 1)
    if i < len(text) and text[i] == "]":
        return out
    while True:
        value, end = _DECODER.raw_decode(text, i)
        out.append((value, i))
        i = _skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if i < len(text) and text[i] == "]":
            return out
        raise json.JSONDecodeError("Expecting ',' or ']' after an element", text, i)


def _read_json(text: str, name: str) -> ReadResult | None:
    """A JSON document; ``None`` when it is really JSON lines (several values, one per line)."""
    lines = _Lines(text)
    start = _skip_ws(text, 0)
    records: list[Record] = []
    bad: list[BadLine] = []
    if start >= len(text):
        return ReadResult([], [BadLine(name, 1, "empty file")], "json")
    if text[start] == "[":
        try:
            elements = _array_elements(text, start)
        except json.JSONDecodeError as exc:
            # What came before the broken element is kept; after it nothing can be trusted.
            elements = _elements_before(text, start, exc.pos)
            bad.append(
                BadLine(name, exc.lineno, f"not valid JSON ({exc.msg}); the rest of the file was skipped")
            )
        for value, offset in elements:
            _collect(value, name, lines.at(offset), records, bad)
        return ReadResult(records, bad, "json")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            return None
        return ReadResult([], [BadLine(name, exc.lineno, f"not valid JSON ({exc.msg}); skipped")], "json")
    if isinstance(value, dict):
        for key in ("alerts", "items", "data"):
            nested = value.get(key)
            if isinstance(nested, list) and nested:
                located = _locate_array(text, key, nested)
                if located is not None:
                    _collect_container(value, key, located, name, lines, records, bad)
                    return ReadResult(records, bad, "json")
    _collect(value, name, lines.at(start), records, bad)
    return ReadResult(records, bad, "json")


def _elements_before(text: str, start: int, error_at: int) -> list[tuple[Any, int]]:
    """The array's elements that end before ``error_at`` (parsed again, one by one)."""
    out: list[tuple[Any, int]] = []
    i = _skip_ws(text, start + 1)
    while i < error_at:
        try:
            value, end = _DECODER.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        if end > error_at:
            break
        out.append((value, i))
        i = _skip_ws(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
        else:
            break
    return out


def _locate_array(text: str, key: str, expected: list[Any]) -> list[tuple[Any, int]] | None:
    """Offsets of the elements of the top-level object's ``key`` array (checked against the decoded
    value, so a key of the same name deeper down is never taken for it)."""
    for match in re.finditer(rf'"{re.escape(key)}"\s*:\s*\[', text):
        try:
            elements = _array_elements(text, match.end() - 1)
        except json.JSONDecodeError:
            continue
        if [v for v, _ in elements] == expected:
            return elements
    return None


def _collect_container(
    value: dict[str, Any],
    key: str,
    elements: list[tuple[Any, int]],
    name: str,
    lines: _Lines,
    records: list[Record],
    bad: list[BadLine],
) -> None:
    """A top-level object holding a list: a webhook notification's alerts, an ``EventList``'s items."""
    if key == "alerts" and not _is_alert(value):
        fallback = _payload_status(value)
        for element, offset in elements:
            line = lines.at(offset)
            if isinstance(element, Mapping):
                try:
                    records.append(_alert(element, f"{name}:{line}", fallback))
                except _Bad as exc:
                    bad.append(BadLine(name, line, str(exc)))
            else:
                bad.append(BadLine(name, line, "an alert must be a JSON object"))
        return
    for element, offset in elements:
        _collect(element, name, lines.at(offset), records, bad)


def _text_lines(data: bytes, name: str, bad: list[BadLine]) -> Iterator[tuple[int, str]]:
    """The non-blank lines of ``data`` with their numbers (a BOM and CR line ends dropped); a line
    that is not UTF-8 is reported in ``bad`` and skipped, the rest of the file still read."""
    for number, raw in enumerate(data.split(b"\n"), start=1):
        raw = raw.rstrip(b"\r")
        if not raw.strip():
            continue
        try:
            yield number, raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError:
            bad.append(BadLine(name, number, "not UTF-8 text"))


def _read_jsonl(data: bytes, name: str) -> ReadResult:
    records: list[Record] = []
    bad: list[BadLine] = []
    for number, line in _text_lines(data, name, bad):
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            bad.append(BadLine(name, number, f"not JSON ({exc.msg} at column {exc.colno})"))
            continue
        _collect(value, name, number, records, bad)
    return ReadResult(records, bad, "jsonl")


# --- one JSON value ---------------------------------------------------------------------------


def _collect(value: Any, name: str, line: int, records: list[Record], bad: list[BadLine]) -> None:
    """The records one JSON value holds (an alert, a notification, an event, a log line ...)."""
    source = f"{name}:{line}"
    if not isinstance(value, Mapping):
        bad.append(BadLine(name, line, f"expected a JSON object, got {type(value).__name__}"))
        return
    try:
        if _is_alert(value):
            records.append(_alert(value, source))
        elif isinstance(value.get("alerts"), list):  # a webhook notification or an alert group
            fallback = _payload_status(value)
            for index, alert in enumerate(value["alerts"], start=1):
                try:
                    if not isinstance(alert, Mapping):
                        raise _Bad("an alert must be a JSON object")
                    records.append(_alert(alert, source, fallback))
                except _Bad as exc:
                    bad.append(BadLine(name, line, f"alert {index} of the notification starting here: {exc}"))
        elif isinstance(value.get("items"), list):  # kubectl get events -o json
            for index, item in enumerate(value["items"], start=1):
                try:
                    if not isinstance(item, Mapping):
                        raise _Bad("an event must be a JSON object")
                    records.append(_event(item, source))
                except _Bad as exc:
                    bad.append(BadLine(name, line, f"item {index} of the list starting here: {exc}"))
        elif value.get("type") in ("ADDED", "MODIFIED", "DELETED") and isinstance(
            value.get("object"), Mapping
        ):
            if value["type"] != "DELETED":  # an event expiring says nothing about the cluster
                records.append(_event(value["object"], source))
        elif _is_event(value):
            records.append(_event(value, source))
        elif any(isinstance(value.get(k), str) for k in ("msg", "message", "log")):
            records.append(_json_log(value, name, source))
        else:
            raise _Bad(
                "not an alert, an Alertmanager notification, a Kubernetes event or a log line "
                f"(keys: {', '.join(sorted(map(str, value))[:8])})"
            )
    except _Bad as exc:
        bad.append(BadLine(name, line, str(exc)))


def _is_alert(value: Mapping[str, Any]) -> bool:
    # An alert group of /api/v2/alerts/groups has labels too, and its alerts beside them.
    return isinstance(value.get("labels"), Mapping) and not isinstance(value.get("alerts"), list)


def _is_event(value: Mapping[str, Any]) -> bool:
    return (
        value.get("kind") == "Event"
        or isinstance(value.get("involvedObject"), Mapping)
        or isinstance(value.get("regarding"), Mapping)
    )


def _payload_status(payload: Mapping[str, Any]) -> str:
    status = payload.get("status")
    return status if isinstance(status, str) else "firing"


def _time_field(value: Mapping[str, Any], key: str) -> datetime | None:
    try:
        return parse_time(value.get(key))
    except ValueError as exc:
        raise _Bad(f"{key}: {exc}") from None


def labels_fingerprint(labels: Mapping[str, str]) -> str:
    """A stable hash of an alert's labels (Alertmanager's fingerprint, where an input lacks it)."""
    return hashlib.sha256(json.dumps(dict(labels), sort_keys=True).encode()).hexdigest()[:16]


def _alert(alert: Mapping[str, Any], source: str, fallback_status: str = "firing") -> Record:
    labels = alert.get("labels")
    if not isinstance(labels, Mapping):
        raise _Bad("an alert needs a 'labels' object")
    name = labels.get("alertname")
    if not isinstance(name, str) or not name:
        raise _Bad("an alert needs labels.alertname")
    clean = {str(k): str(v) for k, v in labels.items()}
    raw_status = alert.get("status", fallback_status)
    if isinstance(raw_status, Mapping):  # API v2: {"state": "active" | "suppressed" | "unprocessed"}
        status = "suppressed" if raw_status.get("state") == "suppressed" else "firing"
    else:
        status = str(raw_status or fallback_status)
    starts = _time_field(alert, "startsAt") or _time_field(alert, "activeAt")  # activeAt: Prometheus' API
    ends = _time_field(alert, "endsAt") if status == "resolved" else None
    annotations = alert.get("annotations") if isinstance(alert.get("annotations"), Mapping) else {}
    assert isinstance(annotations, Mapping)
    text = next(
        (str(annotations[k]) for k in ("summary", "description", "message") if annotations.get(k)), ""
    )
    fingerprint = alert.get("fingerprint")
    return Record(
        kind="alert",
        name=name,
        labels=clean,
        at=starts,
        text=text[:_MAX_TEXT],
        source=source,
        status=status,
        ends_at=ends,
        identity=fingerprint if isinstance(fingerprint, str) and fingerprint else labels_fingerprint(clean),
    )


def _event(event: Mapping[str, Any], source: str) -> Record:
    involved = event.get("involvedObject") or event.get("regarding") or {}
    if not isinstance(involved, Mapping):
        raise _Bad("involvedObject must be an object")
    reason = event.get("reason")
    if not isinstance(reason, str) or not reason:
        raise _Bad("a Kubernetes event needs a 'reason'")
    meta = event.get("metadata") if isinstance(event.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    series = event.get("series") if isinstance(event.get("series"), Mapping) else {}
    assert isinstance(series, Mapping)
    namespace = str(involved.get("namespace") or meta.get("namespace") or "")
    kind = str(involved.get("kind") or "")
    obj = str(involved.get("name") or "")
    at = None
    for value, key in (
        (event, "lastTimestamp"),
        (series, "lastObservedTime"),
        (event, "eventTime"),
        (event, "deprecatedLastTimestamp"),
        (event, "firstTimestamp"),
        (meta, "creationTimestamp"),
    ):
        at = _time_field(value, key)
        if at is not None:
            break
    raw_count = event.get("count") or series.get("count") or event.get("deprecatedCount") or 1
    try:
        count = max(1, int(raw_count))
    except (TypeError, ValueError):
        raise _Bad(f"count {raw_count!r} is not a number") from None
    source_info = event.get("source") if isinstance(event.get("source"), Mapping) else {}
    assert isinstance(source_info, Mapping)
    component = str(
        source_info.get("component")
        or event.get("reportingComponent")
        or event.get("reportingController")
        or ""
    )
    kind_of_event = str(event.get("type") or "Normal")
    uid = meta.get("uid")
    return Record(
        kind="event",
        name=reason,
        labels={
            "namespace": namespace,
            "object_kind": kind,
            "object": obj,
            "type": kind_of_event,
            "component": component,
        },
        at=at,
        text=str(event.get("message") or event.get("note") or "")[:_MAX_TEXT],
        source=source,
        status=kind_of_event,
        count=count,
        identity=str(uid) if uid else f"{namespace}/{kind}/{obj}/{reason}",
    )


# --- log lines --------------------------------------------------------------------------------

_LEVELS = {
    "trace": "DEBUG",
    "debug": "DEBUG",
    "info": "INFO",
    "notice": "INFO",
    "warn": "WARNING",
    "warning": "WARNING",
    "error": "ERROR",
    "err": "ERROR",
    "crit": "CRITICAL",
    "critical": "CRITICAL",
    "fatal": "CRITICAL",
    "panic": "CRITICAL",
}
_KLOG_LEVELS = {"I": "INFO", "W": "WARNING", "E": "ERROR", "F": "CRITICAL"}
_ISO_PREFIX = re.compile(
    r"^\[?(?P<ts>\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?)\]?[\s|,]*"
)
_KLOG = re.compile(
    r"^(?P<lvl>[IWEF])(?P<mm>\d{2})(?P<dd>\d{2}) (?P<time>\d{2}:\d{2}:\d{2}(?:\.\d+)?)\s+\d+\s+[^\]]*\]\s?"
)
_SYSLOG = re.compile(
    r"^(?P<mon>Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) +(?P<day>\d{1,2}) "
    r"(?P<time>\d{2}:\d{2}:\d{2}) (?P<host>\S+) (?P<prog>[^:\[\s]+)(?:\[\d+\])?: ?"
)
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1
    )
}
_LEVEL_WORD = re.compile(
    r"(?:^|[\s\[|(\"'])(?:level=|lvl=)?\"?(?P<lvl>TRACE|DEBUG|INFO|NOTICE|WARN(?:ING)?|ERROR|ERR|"
    r"CRIT(?:ICAL)?|FATAL|PANIC)\b\"?[\]:|)]?\s*",
    re.IGNORECASE,
)
_CONTINUATION = re.compile(
    r"^(?:\s+\S|at\s|Caused by|Traceback|\.\.\. \d+ more|During handling|"
    r"[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)(?::|$))"
)
_FILE_DATE = re.compile(r"[-_.]\d{4}-?\d{2}-?\d{2}(?:[-_T]?\d{2,6})?$|[-_.]\d+$")


def log_source(name: str) -> str:
    """The log's name without folder, extension, rotation number or date (``api-2025-12-01.log.1``
    -> ``api``): rotated files of one log are one source."""
    stem = Path(name).name
    for _ in range(3):
        stem = re.sub(r"\.(?:log|txt|out|err|\d+)$", "", stem)
    return _FILE_DATE.sub("", stem) or stem


def _read_logs(data: bytes, name: str, year: int) -> ReadResult:
    records: list[Record] = []
    bad: list[BadLine] = []
    without_time = 0
    source_name = log_source(name)
    for number, line in _text_lines(data, name, bad):
        if records and _CONTINUATION.match(line) and not _ISO_PREFIX.match(line.lstrip()):
            previous = records[-1]
            if len(previous.text) < _MAX_TEXT:
                previous.text = (previous.text + "\n" + line)[:_MAX_TEXT]
            continue
        if line.lstrip().startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                value = None
            if isinstance(value, Mapping) and any(
                isinstance(value.get(k), str) for k in ("msg", "message", "log")
            ):
                try:
                    record = _json_log(value, name, f"{name}:{number}")
                except _Bad as exc:
                    bad.append(BadLine(name, number, str(exc)))
                    continue
                without_time += record.at is None
                records.append(record)
                continue
        record = _text_log(line, source_name, f"{name}:{number}", year)
        without_time += record.at is None
        records.append(record)
    return ReadResult(records, bad, "logs", without_time=without_time)


def _text_log(line: str, source_name: str, source: str, year: int) -> Record:
    at: datetime | None = None
    level = ""
    rest = line
    if match := _ISO_PREFIX.match(line):
        try:
            at = parse_time(match.group("ts").replace(",", "."))
        except ValueError:
            at = None
        rest = line[match.end() :]
    elif match := _KLOG.match(line):
        level = _KLOG_LEVELS[match.group("lvl")]
        at = _clock(year, int(match.group("mm")), int(match.group("dd")), match.group("time"))
        rest = line[match.end() :]
    elif match := _SYSLOG.match(line):
        at = _clock(year, _MONTHS[match.group("mon")], int(match.group("day")), match.group("time"))
        source_name = match.group("prog")
        rest = line[match.end() :]
    if not level and (found := _LEVEL_WORD.search(rest[:80])):
        level = _LEVELS.get(found.group("lvl").lower(), "")
        if found.start() <= 2:  # the level opens the message: it is not part of what was said
            rest = rest[found.end() :]
    return _log_record(level or "INFO", source_name, at, rest, source)


def _clock(year: int, month: int, day: int, clock: str) -> datetime | None:
    try:
        return datetime.fromisoformat(f"{year:04d}-{month:02d}-{day:02d}T{clock}").replace(tzinfo=UTC)
    except ValueError:
        return None


def _json_log(value: Mapping[str, Any], name: str, source: str) -> Record:
    message = next((value[k] for k in ("msg", "message", "log") if isinstance(value.get(k), str)), "")
    at = None
    for key in ("ts", "time", "timestamp", "@timestamp", "t"):
        if key in value:
            at = _time_field(value, key)
            break
    raw_level = next((value[k] for k in ("level", "lvl", "severity", "log.level") if value.get(k)), "info")
    level = _LEVELS.get(str(raw_level).lower(), str(raw_level).upper())
    source_name = str(value.get("logger") or value.get("app") or value.get("service") or log_source(name))
    return _log_record(level, source_name, at, message, source)


def _log_record(level: str, source_name: str, at: datetime | None, text: str, source: str) -> Record:
    """A log line as a record: grouped by its file (or logger) and level, its text cut to
    ``_MAX_TEXT`` characters."""
    return Record(
        kind="log",
        name=level,
        labels={"file": source_name, "level": level},
        at=at,
        text=text.strip()[:_MAX_TEXT],
        source=source,
        status=level,
        identity=source_name,
    )


def describe_bad_lines(bad: Iterable[BadLine], limit: int = 20) -> list[str]:
    """Up to ``limit`` bad lines as text, and a count of the rest."""
    items = list(bad)
    lines = [str(b) for b in items[:limit]]
    if len(items) > limit:
        lines.append(f"... and {len(items) - limit} more bad lines")
    return lines
