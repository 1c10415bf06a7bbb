"""opsbot's Prometheus metrics, declared once (default registry, so vLLM's own ``vllm:*`` metrics
appear next to them on ``/metrics``). Every latency is in seconds, every size in tokens or rows."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2.5, 5, 10, 30, 60, 120)
_TOKEN_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.1, 0.2, 0.5, 1)

REQUESTS = Counter(
    "opsbot_requests_total", "Answered requests by outcome", ["platform", "scenario", "lane", "status"]
)
TTFT = Histogram(
    "opsbot_ttft_seconds", "Time to first token (s)", ["scenario", "lane"], buckets=_LATENCY_BUCKETS
)
TPOT = Histogram("opsbot_tpot_seconds", "Time per output token (s)", ["scenario"], buckets=_TOKEN_BUCKETS)
E2E = Histogram(
    "opsbot_e2e_seconds", "Question to last token (s)", ["scenario", "lane"], buckets=_LATENCY_BUCKETS
)
QUEUE = Histogram(
    "opsbot_queue_seconds", "Admission + engine queue wait (s)", ["lane"], buckets=_LATENCY_BUCKETS
)
CONTEXT = Histogram("opsbot_context_seconds", "Context gathering time (s)", buckets=_LATENCY_BUCKETS)
CACHED_PROMPT_FRACTION = Histogram(
    "opsbot_cached_prompt_fraction",
    "Share of each prompt served from the prefix cache (0-1)",
    buckets=(0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0),
)

STORE_BUFFERED = Gauge("opsbot_store_buffered_rows", "Rows waiting in memory for the database")
STORE_DROPPED = Counter("opsbot_store_dropped_rows_total", "Rows dropped because the write buffer was full")
STORE_WRITE_FAILURES = Counter("opsbot_store_write_failures_total", "Failed database write attempts")
STORE_UP = Gauge("opsbot_store_up", "1 when the last database write or ping succeeded")

LANE_QUEUE_DEPTH = Gauge("opsbot_lane_queue_depth", "Requests waiting for admission", ["lane"])
LANE_IN_FLIGHT = Gauge("opsbot_lane_in_flight", "Requests admitted into the engine", ["lane"])
LANE_REJECTED = Counter(
    "opsbot_lane_rejected_total", "Requests refused by admission control", ["lane", "reason"]
)

ENGINE_READY = Gauge("opsbot_engine_ready", "1 when the engine can take requests")
ENGINE_KV_CACHE_USAGE = Gauge("opsbot_engine_kv_cache_usage_ratio", "KV-cache blocks in use (0-1)")
ENGINE_RUNNING = Gauge("opsbot_engine_running_requests", "Requests running in the engine")
ENGINE_WAITING = Gauge("opsbot_engine_waiting_requests", "Requests waiting inside the engine")
ENGINE_PREFIX_HIT_RATE = Gauge(
    "opsbot_engine_prefix_cache_hit_ratio", "Prompt tokens served from cache (0-1)"
)
ENGINE_PREEMPTIONS = Gauge("opsbot_engine_preemptions", "Preemptions since engine start")
ENGINE_RESTARTS = Counter("opsbot_engine_restarts_total", "Engine restarts after it died")

EVENTS_DUPLICATE = Counter(
    "opsbot_events_duplicate_total", "Deliveries dropped as already processed", ["platform"]
)
CHAT_API_RETRIES = Counter(
    "opsbot_chat_api_retries_total", "Chat API calls retried", ["platform", "method", "reason"]
)
REPLIES_FAILED = Counter(
    "opsbot_replies_failed_total", "Replies that could not be posted after retries", ["platform"]
)
CONTEXT_SOURCE = Counter("opsbot_context_source_total", "Context provider outcomes", ["source", "status"])
SECRETS_REDACTED = Counter("opsbot_secrets_redacted_total", "Secrets replaced before use", ["where"])
