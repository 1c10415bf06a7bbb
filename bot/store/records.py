"""Plain data the store takes and gives back: no SQLAlchemy types leak out of ``bot.store``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC (every timestamp the store keeps is UTC)."""
    return datetime.now(UTC)


@dataclass
class RequestRecord:
    """One inference request as the pipeline saw it: who asked, how it went, how long each step took."""

    request_id: str
    platform: str
    channel: str | None
    thread_id: str | None
    user: str | None
    scenario: str
    lane: str
    status: str
    """``ok``, ``timeout``, ``aborted``, ``overloaded``, ``engine_dead``, ``error`` (the engine could
    not answer), ``undelivered`` or ``throttled`` (the platform refused or kept failing),
    ``interrupted`` (the replica answering it died; written by another replica's sweeper): one per
    branch of the engine's and the bot's error trees (``bot.pipeline``)."""
    error: str | None = None
    model: str | None = None
    engine: str | None = None
    """The named engine that answered (``default``: the ``[engine]`` section; ``[engines.NAME]``)."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    queue_ms: float | None = None
    context_ms: float | None = None
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None
    post_ms: float | None = None
    created_at: datetime = field(default_factory=utcnow)
    finished_at: datetime | None = None
    replay_inputs: str | None = None
    """What replays this answer (:mod:`bot.replay`: redacted question, context bundle, thread
    turns, scenario); ``None`` when the request ended before its prompt was built."""
    root_cause: str | None = None
    """An investigation's root-cause block as JSON (entities and claims citing steps,
    :mod:`bot.investigate`); ``None`` without one."""
    steps: list[StepRecord] = field(default_factory=list)
    """An investigation's model steps (``opsbot_investigation_steps``); empty without the loop.
    Not a column of the request row: written to their own table with it."""


@dataclass(slots=True)
class StepRecord:
    """One model step of an investigation (:mod:`bot.investigate`), stored linked to its request."""

    index: int
    """1.. for tool decisions (step 0, the gathering, has no row); the answer and the root-cause
    block follow the last decision."""
    kind: str
    """``call`` (a tool decision), ``answer`` or ``root_cause``."""
    status: str
    """A call: its tool result's status (``ok``, ``error``, ``timeout``, ``repeated``, ``unknown``),
    ``final`` (the model chose to answer) or ``unparsed``; the answer and block: ``ok`` or an error."""
    tool: str | None = None
    arguments: str | None = None
    """The call's arguments as JSON text."""
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    ttft_ms: float | None = None
    decode_ms: float | None = None
    """Time from the step's first token to its last (ms)."""
    tool_ms: float | None = None
    """How long the tool call took (ms)."""
    tool_tokens: int = 0
    """Tokens of the tool output appended to the transcript."""
    summary: str = ""
    source: str = ""
    request_id: str = ""
    """The request the step belongs to (set when read back)."""


@dataclass
class RatedRequest:
    """A request someone voted on: what replays it, its answer and the votes (user -> +1 / -1)."""

    request_id: str
    scenario: str
    model: str | None
    status: str
    created_at: datetime
    replay_inputs: str | None
    answer: str | None
    """The answer as stored in its thread (``None``: the turn was not stored)."""
    votes: dict[str, int] = field(default_factory=dict)

    @property
    def rating(self) -> int:
        """Sum of the votes (> 0: liked on balance)."""
        return sum(self.votes.values())


@dataclass
class ThreadMessage:
    """One turn of a conversation thread (``role`` is ``user`` or ``assistant``)."""

    role: str
    content: str
    user: str | None
    created_at: datetime
    request_id: str | None


@dataclass
class AlertThread:
    """The chat thread that carries one Alertmanager group (``status``: ``firing`` / ``resolved``)."""

    group_key: str
    platform: str
    channel: str
    thread_id: str
    status: str
    """``opening`` (a replica claimed the group and is posting its header), ``firing``, ``resolved``."""
    firing: list[str] | None = None
    """Fingerprints firing at the group's last notification (``None``: not known)."""


@dataclass
class Claim:
    """A leased claim on an event: who answers it, where, and until when the lease runs."""

    platform: str
    event_id: str
    request_id: str | None = None
    channel: str | None = None
    thread_id: str | None = None
    user: str | None = None
    scenario: str | None = None
    lane: str | None = None
    owner: str | None = None
    lease_until: datetime | None = None


@dataclass
class Percentiles:
    """P50 / P90 / P99 of one latency in milliseconds (``None`` when no row had a value)."""

    p50: float | None
    p90: float | None
    p99: float | None


@dataclass
class LatencyStats:
    """Latency summary of the requests of one (scenario, platform) pair over a time window.

    ``errors`` counts rows whose status is not ``ok``; ``by_status`` has the count per status.
    Percentiles are over the rows that carry the value (a refused request has no TTFT).
    """

    scenario: str
    platform: str
    count: int
    errors: int
    ttft_ms: Percentiles
    tpot_ms: Percentiles
    queue_ms: Percentiles
    e2e_ms: Percentiles
    by_status: dict[str, int] = field(default_factory=dict)


def percentile(sorted_values: list[float], pct: float) -> float | None:
    """Linear-interpolated percentile (numpy's default method) of an ascending list; ``None`` if empty."""
    if not sorted_values:
        return None
    rank = pct / 100.0 * (len(sorted_values) - 1)
    low = int(rank)
    high = min(low + 1, len(sorted_values) - 1)
    frac = rank - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * frac


def percentiles(values: list[float]) -> Percentiles:
    """P50 / P90 / P99 of unsorted values."""
    ordered = sorted(values)
    return Percentiles(percentile(ordered, 50), percentile(ordered, 90), percentile(ordered, 99))
