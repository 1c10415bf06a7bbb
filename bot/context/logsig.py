"""Logs by signature, not position: the lines of a container log that say what broke, ranked.

A log is read whole (up to the provider's limit) and every line gets a rank, 0 the most decisive:

0. the first exception of a Java-style stack and each ``Caused by:`` of its chain; a Go ``panic:`` /
   ``fatal error:`` and its first goroutine; a Python traceback's exception line and its last
   frames; OOM and kill lines; TLS, DNS and connection errors; FATAL / PANIC / CRITICAL lines
1. other error lines (and the lines that continue them: ``DETAIL:``, indented text), readiness and
   liveness complaints
2. warnings, the last lines of the log (how it ended; decisive before an OOM kill, an error line
   before another abnormal exit), the first frames of a stack
3. everything else: info lines, the rest of a stack, other goroutines

Repeated lines are folded first: lines equal but for their numbers, times and ids are one line,
the first one, with ``[x42 similar, last 19:58:02]`` appended. The budget
(:func:`bot.context.budget.fit_to_budget`) then drops the highest ranks first, so a ``Caused by:``
above a long stack, or one error among hundreds of repeated warnings, survives where a tail would not.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

DECISIVE, ERROR, CONTEXT, FILLER = 0, 1, 2, 3
"""Line ranks (lower is kept first)."""

_JAVA_HEADER = re.compile(
    r"^(?:Exception in thread \"[^\"]*\" )?"
    r"(?:[a-zA-Z_$][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error|Throwable)\b(?::|$)"
)
_CAUSED_BY = re.compile(r"^\s*Caused by: ")
_JAVA_FRAME = re.compile(r"^\s+(?:at |\.\.\. \d+ (?:more|common frames omitted))")
_GO_PANIC = re.compile(r"^(?:panic: |fatal error: )")
_GO_GOROUTINE = re.compile(r"^goroutine \d+ \[")
_PY_TRACEBACK = re.compile(r"^(?:\s*)Traceback \(most recent call last\):")
_PY_FRAME = re.compile(r'^\s+File "')
_PY_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exit|Interrupt|Warning|Fault)\b(?::|$)|^[A-Z]\w+Error:"
)
_FATAL = re.compile(
    r"\b(?:FATAL|PANIC|CRITICAL|EMERG|SEVERE|[Ff]atal(?: error)?)\b|level=(?:fatal|panic|crit)"
)
_DECISIVE_WORDS = re.compile(
    r"(?i)out of memory|oom[- ]?kill|killed process|memory cgroup|x509:|\btls:|certificate (?:has )?expired|"
    r"certificate signed by unknown|handshake (?:failure|timeout)|connection refused|no such host|"
    r"i/o timeout|connection reset|connection timed out|context deadline exceeded|could not connect|"
    r"unable to connect|failed to connect|network is unreachable|no route to host|server misbehaving|"
    r"too many (?:clients|connections)|no space left|read-only file system|permission denied|forbidden|"
    r"authentication failed|access denied|unauthorized|segmentation (?:fault|violation)|timeout after|"
    r"timed out|unreachable|does not exist|not found:|missing required|must be set"
)
_ERROR = re.compile(
    r"\b(?:ERROR|ERR|Error|error|E\d{4}|FAIL(?:ED|URE)?|failed|Exception|exception)\b|level=(?:error|err)|\[E\]|\bE\s\d"
)
_WARN = re.compile(r"\b(?:WARN(?:ING)?|Warning|warning|W\d{4})\b|level=warn")
_PROBE = re.compile(r"(?i)readiness|liveness|health ?check|not ready")
_CONTINUATION = re.compile(r"^(?:\s+\S|DETAIL:|HINT:|CONTEXT:|STATEMENT:|\t)")
_STAMP = re.compile(
    r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?|\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"
)
_VOLATILE = re.compile(r"0x[0-9a-f]+|\b[0-9a-f]{8,}\b|\d+")
_TAIL_LINES = 3
"""The last lines of a log rank as context: how it ended."""
_MAX_FRAMES_KEPT = 2


@dataclass(frozen=True, slots=True)
class Line:
    """One kept line of a log and its rank."""

    text: str
    rank: int


def shape(line: str) -> str:
    """``line`` without its times, numbers and ids: lines of one shape are repeats of each other."""
    return _VOLATILE.sub("#", _STAMP.sub("", line)).strip()


def _rank_lines(lines: Sequence[str], ending: int = CONTEXT) -> list[int]:
    """A rank per line (see the module doc), from the blocks the lines form."""
    ranks = [FILLER] * len(lines)
    first_exception_seen = False
    in_stack = False  # inside a Java stack (frames, Caused by)
    frames_since_header = 0
    goroutine = 0  # 0: none yet; 1: the first goroutine; 2: later ones
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped:
            if goroutine == 1:
                goroutine = 2
            continue
        if _JAVA_HEADER.match(stripped) or _CAUSED_BY.match(line):
            ranks[i] = DECISIVE if (not first_exception_seen or _CAUSED_BY.match(line) or in_stack) else ERROR
            first_exception_seen = True
            in_stack = True
            frames_since_header = 0
            continue
        if in_stack and _JAVA_FRAME.match(line):
            frames_since_header += 1
            ranks[i] = CONTEXT if frames_since_header <= _MAX_FRAMES_KEPT else FILLER
            continue
        in_stack = False
        if _GO_PANIC.match(stripped):
            ranks[i] = DECISIVE
            goroutine = 0
            continue
        if _GO_GOROUTINE.match(stripped):
            goroutine = 1 if goroutine == 0 and any(r == DECISIVE for r in ranks[max(0, i - 4) : i]) else 2
            ranks[i] = DECISIVE if goroutine == 1 else FILLER
            continue
        if goroutine == 1:
            ranks[i] = DECISIVE
            continue
        if goroutine == 2:
            continue
        ranks[i] = _line_rank(stripped)
        if ranks[i] > ERROR and _CONTINUATION.match(line) and i and ranks[i - 1] <= ERROR:
            ranks[i] = ranks[i - 1]
    _rank_tracebacks(lines, ranks)
    for i in range(max(0, len(lines) - _TAIL_LINES), len(lines)):
        ranks[i] = min(ranks[i], ending)
    return ranks


def _line_rank(line: str) -> int:
    if _FATAL.search(line) or _DECISIVE_WORDS.search(line):
        return DECISIVE
    if _ERROR.search(line):
        return ERROR
    if _WARN.search(line):
        return ERROR if _PROBE.search(line) else CONTEXT
    return FILLER


def _rank_tracebacks(lines: Sequence[str], ranks: list[int]) -> None:
    """A Python traceback: its header and last frames are context, its exception line decisive."""
    i = 0
    while i < len(lines):
        if not _PY_TRACEBACK.match(lines[i]):
            i += 1
            continue
        start = i
        i += 1
        frames: list[int] = []
        while i < len(lines) and (lines[i].startswith(" ") or lines[i].startswith("\t")):
            if _PY_FRAME.match(lines[i]):
                frames.append(i)
            i += 1
        ranks[start] = min(ranks[start], ERROR)
        for frame in frames[-_MAX_FRAMES_KEPT:]:
            for j in range(frame, min(frame + 2, i)):
                ranks[j] = min(ranks[j], ERROR)
        if i < len(lines) and _PY_EXCEPTION.match(lines[i].strip()):
            ranks[i] = DECISIVE
            i += 1


def condense(text: str, ending: int = CONTEXT) -> list[Line]:
    """The lines of a log with their ranks, repeats folded into their first occurrence; its last
    lines rank at least ``ending`` (what a container did before it was OOMKilled is decisive)."""
    lines = text.splitlines()
    ranks = _rank_lines(lines, ending)
    first: dict[str, int] = {}
    counts: dict[str, int] = {}
    last_stamp: dict[str, str] = {}
    order: list[int] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        # Frames and goroutine dumps are never folded into each other's counts: only their ranks matter.
        key = shape(line)
        if key in first:
            counts[key] += 1
            ranks[first[key]] = min(ranks[first[key]], ranks[i])
            stamp = _STAMP.search(line)
            if stamp:
                last_stamp[key] = stamp.group(0)
            continue
        first[key] = i
        counts[key] = 1
        order.append(i)
    out = []
    for i in order:
        key = shape(lines[i])
        text_i = lines[i]
        if counts[key] > 1:
            seen = f", last {last_stamp[key]}" if key in last_stamp else ""
            text_i = f"{text_i} [x{counts[key]} similar{seen}]"
        out.append(Line(text_i, ranks[i]))
    return out


def signature(lines: Sequence[Line]) -> tuple[str, ...]:
    """What two replicas' logs must share to be shown once ("same in 3 of 3 replicas"): the shapes of
    their decisive and error lines, or of every line when they have none."""
    telling = [ln for ln in lines if ln.rank <= ERROR] or list(lines)
    return tuple(shape(re.sub(r" \[x\d+ similar[^\]]*\]$", "", ln.text)) for ln in telling)


def error_lines(lines: Sequence[Line], limit: int = 12) -> list[str]:
    """The most decisive lines (rank 0, then 1), in log order, at most ``limit``: what a dependency's
    or neighbour's log says, in a line or two."""
    chosen = sorted(range(len(lines)), key=lambda i: (lines[i].rank, i))[:limit]
    return [lines[i].text for i in sorted(chosen) if lines[i].rank <= ERROR]
