"""opsbot's Prometheus metrics, declared once (default registry, so vLLM's own ``vllm:*`` metrics
appear next to them on ``/metrics``).

Names follow Prometheus conventions: ``opsbot_`` prefix, base units (``_seconds``, ratios 0-1),
``_total`` on counters. Per-request histograms carry ``scenario``, ``lane`` and ``platform``; their
buckets resolve 10 ms to 30 s (TTFT's 2 s SLO sits between the 1.5 s and 2.5 s buckets). The
Grafana dashboard and the alert rules in ``deploy/`` query these names; ``tests/deploy`` proves
every query against a real Prometheus scraping a running opsbot.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0,
)  # fmt: skip
"""Seconds: 10 ms to 30 s, finest where the TTFT targets are (0.1-3 s)."""
E2E_BUCKETS = (*LATENCY_BUCKETS, 60.0, 120.0, 300.0)
"""A long answer takes minutes end to end; the request deadline defaults to 300 s."""
TOKEN_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0)
"""Seconds per output token: decoding runs at 1-100 ms a token, so TPOT needs finer buckets."""

_REQUEST = ("scenario", "lane", "platform")

# -- requests -------------------------------------------------------------------------------------
REQUESTS = Counter(
    "opsbot_requests_total",
    "Requests that ended, by outcome (status: ok, timeout, aborted, overloaded, engine_dead, error, "
    "undelivered, throttled)",
    ["platform", "scenario", "lane", "status"],
)
TTFT = Histogram(
    "opsbot_ttft_seconds",
    "Time to first token: from generate() (admission wait included) to the first token (s)",
    _REQUEST,
    buckets=LATENCY_BUCKETS,
)
TPOT = Histogram(
    "opsbot_tpot_seconds", "Time per output token after the first (s)", _REQUEST, buckets=TOKEN_BUCKETS
)
E2E = Histogram(
    "opsbot_e2e_seconds",
    "From the adapter taking the event to the last token (s)",
    _REQUEST,
    buckets=E2E_BUCKETS,
)
QUEUE = Histogram(
    "opsbot_queue_seconds",
    "Admission + engine queue wait before the engine started the request (s)",
    _REQUEST,
    buckets=LATENCY_BUCKETS,
)
FIRST_VISIBLE = Histogram(
    "opsbot_first_visible_token_seconds",
    "From the adapter taking the event to answer text first visible in the chat (s)",
    _REQUEST,
    buckets=LATENCY_BUCKETS,
)
STEPPED_ASIDE = Histogram(
    "opsbot_stepped_aside_seconds",
    "Time a background answer paused at a checkpoint while urgent answers were prepared (s)",
    ["lane"],
    buckets=LATENCY_BUCKETS,
)
CONTEXT = Histogram(
    "opsbot_context_seconds",
    "Context gathering time of a request, all providers together (s)",
    _REQUEST,
    buckets=LATENCY_BUCKETS,
)
CONTEXT_PROVIDER = Histogram(
    "opsbot_context_provider_seconds",
    "One context provider's fetch (cache misses only), by outcome (s)",
    ["provider", "status"],
    buckets=LATENCY_BUCKETS,
)
CACHED_PROMPT_FRACTION = Histogram(
    "opsbot_cached_prompt_fraction",
    "Share of each prompt served from the prefix cache (0-1)",
    buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0),
)
PROMPT_TOKENS = Counter("opsbot_prompt_tokens_total", "Prompt tokens of finished requests", _REQUEST)
CACHED_PROMPT_TOKENS = Counter(
    "opsbot_prompt_cached_tokens_total",
    "Prompt tokens served from the prefix cache (reuse = this / opsbot_prompt_tokens_total)",
    _REQUEST,
)
OUTPUT_TOKENS = Counter("opsbot_output_tokens_total", "Generated tokens of finished requests", _REQUEST)

# -- store ----------------------------------------------------------------------------------------
STORE_BUFFERED = Gauge("opsbot_store_buffered_rows", "Rows waiting in memory for the database")
STORE_ROWS_BUFFERED = Counter(
    "opsbot_store_rows_buffered_total", "Rows taken into the write buffer (every write goes through it)"
)
STORE_DROPPED = Counter(
    "opsbot_store_dropped_rows_total",
    "Rows dropped (write buffer full or closed, or refused by the database)",
)
STORE_WRITE_FAILURES = Counter("opsbot_store_write_failures_total", "Failed database write attempts")
STORE_UP = Gauge("opsbot_store_up", "1 when the last database write or ping succeeded")

# -- admission and engine -------------------------------------------------------------------------
LANE_QUEUE_DEPTH = Gauge("opsbot_lane_queue_depth", "Requests waiting for admission", ["lane", "engine"])
LANE_IN_FLIGHT = Gauge(
    "opsbot_lane_in_flight", "Requests admitted into the engine (running)", ["lane", "engine"]
)
LANE_REJECTED = Counter(
    "opsbot_lane_rejected_total", "Requests refused by admission control", ["lane", "reason"]
)
LANE_LIMIT = Gauge(
    "opsbot_admission_max_in_flight",
    "Current in-flight limit per lane (the SLO guard lowers it; absent lanes are unlimited)",
    ["lane"],
)
LANE_MAX_TOKENS_CAP = Gauge(
    "opsbot_admission_max_tokens_cap",
    "Current max_tokens cap per lane set by the SLO guard (0: no cap)",
    ["lane"],
)

# One series per named engine ([engines.NAME]; the [engine] section is "default").
ENGINE_READY = Gauge("opsbot_engine_ready", "1 when the engine can take requests", ["engine"])
ENGINE_KV_CACHE_USAGE = Gauge(
    "opsbot_engine_kv_cache_usage_ratio", "KV-cache blocks in use (0-1)", ["engine"]
)
ENGINE_RUNNING = Gauge("opsbot_engine_running_requests", "Requests running in the engine", ["engine"])
ENGINE_WAITING = Gauge("opsbot_engine_waiting_requests", "Requests waiting inside the engine", ["engine"])
ENGINE_PREFIX_HIT_RATE = Gauge(
    "opsbot_engine_prefix_cache_hit_ratio",
    "Prompt tokens served from cache since engine start (0-1)",
    ["engine"],
)
ENGINE_PREEMPTIONS = Counter("opsbot_engine_preemptions_total", "Requests the engine preempted", ["engine"])
ENGINE_RESTARTS = Counter("opsbot_engine_restarts_total", "Engine restarts after it died")

# -- SLO guard (bot/slo.py) -----------------------------------------------------------------------
SLO_TTFT_P99 = Gauge(
    "opsbot_slo_ttft_p99_seconds", "Rolling P99 TTFT per lane over the guard's window (s)", ["lane"]
)
SLO_TARGET = Gauge("opsbot_slo_ttft_target_seconds", "Configured P99 TTFT target per lane (s)", ["lane"])
SLO_BREACHED = Gauge(
    "opsbot_slo_breached", "1 while the lane's rolling P99 TTFT is over its target", ["lane"]
)
SLO_LEVEL = Gauge("opsbot_slo_guard_level", "How many tightening steps the SLO guard has applied")
SLO_ACTIONS = Counter(
    "opsbot_slo_actions_total",
    "SLO guard actions (action: warn, recovered, background_in_flight, background_max_tokens, "
    "kv_in_flight; direction: tighten or relax)",
    ["action", "direction"],
)

# -- platforms and inputs -------------------------------------------------------------------------
EVENTS_DUPLICATE = Counter(
    "opsbot_events_duplicate_total", "Deliveries dropped as already processed", ["platform"]
)
CHAT_API_CALLS = Counter(
    "opsbot_chat_api_calls_total",
    "Chat platform API call attempts by outcome (ok, ratelimited, server_error, connection, rejected)",
    ["platform", "method", "outcome"],
)
CHAT_API_RETRIES = Counter(
    "opsbot_chat_api_retries_total",
    "Chat API calls retried, by the failure that caused the retry",
    ["platform", "method", "reason"],
)
REPLIES_FAILED = Counter(
    "opsbot_replies_failed_total", "Replies that could not be posted after retries", ["platform"]
)
ACTION_EVENTS = Counter(
    "opsbot_action_events_total",
    "Action events (bot.actions: proposed, refused, approved, rejected, applied, failed, verified)",
    ["platform", "event"],
)
RATE_BUDGET_PROBLEMS = Counter(
    "opsbot_rate_budget_problems_total",
    "Broken rate-budget rules, each a bug (kind: wait_while_holding, stalled; bot.adapters.ratelimit)",
    ["budget", "kind"],
)
ANSWERS_STALLED = Counter(
    "opsbot_answers_stalled_total",
    "Answers failed by the watchdog: no engine token and no platform call completed for answer.stall_s",
    ["platform"],
)
CONTEXT_SOURCE = Counter("opsbot_context_source_total", "Context provider outcomes", ["source", "status"])
SECRETS_REDACTED = Counter(
    "opsbot_secrets_redacted_total",
    "Secrets replaced before use, by where they were found and what kind of secret they were",
    ["where", "kind"],
)


# -- counting with every outcome present ----------------------------------------------------------
# rate() only sees an increase in a series Prometheus has scraped before: the first 429 or the first
# failed request of a label set would never show. So the first use of a label set creates all its
# outcomes at 0 (Prometheus' advice: initialise the label values you know).
REQUEST_STATUSES = (
    "ok",
    "timeout",
    "aborted",
    "overloaded",
    "engine_dead",
    "error",
    "undelivered",
    "throttled",
    "stalled",
)
"""Every ``status`` of a request row (``bot.store.RequestRecord.status``)."""
CHAT_OUTCOMES = ("ok", "ratelimited", "server_error", "connection", "rejected")
"""Every ``outcome`` of a chat API call attempt."""
_children: dict[tuple[int, tuple[str, ...]], Any] = {}
"""Label children already looked up: ``labels()`` takes a lock and builds a key on every call, and
a Web API call was counted that way several times per answer."""


def _count(metric: Counter, labels: tuple[str, ...], every: tuple[str, ...]) -> None:
    """Add one to ``metric`` at ``labels``; the first time the leading labels are seen, every value
    of the last one in ``every`` is created too, so each outcome shows (at 0) from then on."""
    child = _children.get((id(metric), labels))
    if child is None:
        for each in every:
            key = (*labels[:-1], each)
            _children[(id(metric), key)] = metric.labels(*key)
        child = _children.setdefault((id(metric), labels), metric.labels(*labels))
    child.inc()


def count_request(platform: str, scenario: str, lane: str, status: str) -> None:
    """Count one finished request in ``opsbot_requests_total``."""
    _count(REQUESTS, (platform, scenario, lane, status), REQUEST_STATUSES)


def count_chat_call(platform: str, method: str, outcome: str) -> None:
    """Count one chat API call attempt in ``opsbot_chat_api_calls_total``."""
    _count(CHAT_API_CALLS, (platform, method, outcome), CHAT_OUTCOMES)


TOOL_CALLS = Counter(
    "opsbot_tool_calls_total",
    "Tool calls of investigations, by tool and outcome (ok, error, timeout, repeated, unknown)",
    ("tool", "status"),
)
INVESTIGATION_STEPS = Histogram(
    "opsbot_investigation_steps",
    "Model steps per investigation (tool decisions and the answer)",
    ("scenario", "lane"),
    buckets=(1, 2, 3, 4, 5, 6, 8, 10, 15, 20),
)
STEP_TTFT = Histogram(
    "opsbot_investigation_step_ttft_seconds",
    "Time to first token of each investigation step (the step's prompt extends the last: a prefix-cache hit)",
    ("scenario", "lane"),
    buckets=LATENCY_BUCKETS,
)
STEP_CACHED_FRACTION = Histogram(
    "opsbot_investigation_step_cached_prompt_fraction",
    "Cached prompt tokens of an investigation step over the previous step's prompt tokens",
    buckets=(0.5, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0),
)
