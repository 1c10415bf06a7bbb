"""opsbot's configuration: one typed settings object, declared once, documented per field.

Sources, strongest first: keyword arguments (tests), ``OPSBOT_...`` environment variables
(nested with ``__``, e.g. ``OPSBOT_ENGINE__MODEL``), the TOML file (``OPSBOT_CONFIG`` or
``./opsbot.toml``), then the defaults here. Secrets are ``SecretStr``: they print as ``**********``
and are only unwrapped where a client needs them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from bot.errors import OpsbotError
from inference.config import AdmissionConfig, ConfigSection, EngineConfig
from inference.engine import Lane
from inference.engine_set import DEFAULT_ENGINE

ENV_PREFIX = "OPSBOT_"
CONFIG_FILE_ENV = "OPSBOT_CONFIG"
DEFAULT_CONFIG_FILE = "opsbot.toml"


class ConfigError(OpsbotError):
    """A configuration problem, phrased as one line: the key, what is wrong, how to fix it."""


def default_data_dir() -> Path:
    """Where opsbot keeps its SQLite file and generated test model by default."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "opsbot"


EngineSettings = EngineConfig
"""``[engine]``: declared once in :mod:`inference.config`, read by every backend as it is."""
AdmissionSettings = AdmissionConfig
"""``[admission]``: declared once in :mod:`inference.config`, read by the admission controller."""

_deprecations: dict[str, None] = {}
_IGNORED_WHY = {"drain_timeout_s": "engine.drain_timeout_s is the one shutdown deadline for every adapter"}


def deprecation_notes() -> list[str]:
    """Deprecated settings seen while loading the configuration, one line each (then forgotten)."""
    notes = list(_deprecations)
    _deprecations.clear()
    return notes


def _move_renamed(section: str, data: Any, renames: dict[str, str | None]) -> Any:
    """Accept the old names of renamed fields for one release: move each into its new place (the new
    name wins when both are given) and remember a deprecation line for the log."""
    if not isinstance(data, dict):
        return data
    data = dict(data)
    for old, new in renames.items():
        if old not in data:
            continue
        value = data.pop(old)
        if new is None:
            why = _IGNORED_WHY.get(old, "")
            _deprecations[f"config: {section}.{old} is no longer used and is ignored; {why}".rstrip("; ")] = (
                None
            )
            continue
        parent, _, leaf = new.partition(".")
        current = data.get(parent)
        sub = current.model_dump() if isinstance(current, BaseModel) else dict(current or {})
        sub.setdefault(leaf, value)
        data[parent] = sub
        _deprecations[
            f"config: {section}.{old} is deprecated and will be removed in the next release; "
            f"use {section}.{new} instead"
        ] = None
    return data


class RetrySettings(ConfigSection):
    """Retry knobs, the same shape in every section that retries (see :mod:`bot.retry`)."""

    max_retries: int | None = Field(6, ge=0)
    """Retries after 5xx answers, timeouts and connection errors before giving up (``None``: retry
    for ever, with backoff). 429s do not count here: they are waits, bounded by ``patience_s``."""
    initial_s: float = Field(0.5, gt=0)
    """First backoff after a failure in seconds; it doubles per retry (with jitter) up to ``max_s``."""
    max_s: float = Field(30.0, gt=0)
    """Longest backoff between two tries in seconds."""
    patience_s: float = Field(300.0, gt=0)
    """How long in seconds one call keeps honouring 429 ``Retry-After`` answers before it gives up."""
    deadline_s: float | None = Field(None, gt=0)
    """Longest time in seconds one call may take in all: its waits for a rate-budget slot, its tries,
    backoffs and ``Retry-After`` waits (``None``: bounded by ``max_retries`` and ``patience_s``
    alone). Past it the call fails like one whose retries ran out."""


class PlatformRetrySettings(RetrySettings):
    """Retry knobs of chat platform calls: as :class:`RetrySettings`, with a deadline by default."""

    deadline_s: float | None = Field(300.0, gt=0)
    """Longest time in seconds one call may take in all: its waits for a rate-budget slot, its tries,
    backoffs and ``Retry-After`` waits (as long as the default ``patience_s``, so no call waits on
    the platform for ever). Past it the call fails like one whose retries ran out; an answer's
    final text retries failures until this deadline rather than ``max_retries`` times."""


class RateLimit(ConfigSection):
    """One rate budget (see :mod:`bot.adapters.ratelimit`): at most ``per_minute`` calls in any 60 s
    window, of which ``burst`` may go at once; the rest refill evenly over the minute."""

    per_minute: float = Field(gt=0)
    """Most calls in any 60 s window (Slack's tiers: Tier 2 20, Tier 3 50, Tier 4 100; Mattermost's
    limiter: 60 x ``PerSec`` + ``MaxBurst``)."""
    burst: int = Field(1, ge=1)
    """Calls that may start at once after a quiet spell (the rest of ``per_minute`` refills evenly)."""

    @model_validator(mode="after")
    def _burst_below_limit(self) -> RateLimit:
        if self.burst >= self.per_minute:
            raise ValueError("burst must be smaller than per_minute (the rest of the minute refills)")
        return self

    def __repr__(self) -> str:  # the README's reference table shows the defaults this way
        return f"{self.per_minute:g}/min burst {self.burst}"

    __str__ = __repr__


SLACK_RATE_LIMITS: dict[str, RateLimit] = {
    # Published tiers, per method per app per workspace (docs.slack.dev/apis/web-api/rate-limits):
    # Tier 2 is 20+ per minute, Tier 3 50+, Tier 4 100+; the burst is a share of the same minute.
    "chat.update": RateLimit(per_minute=50, burst=10),
    "chat.appendStream": RateLimit(per_minute=100, burst=20),
    "chat.startStream": RateLimit(per_minute=20, burst=5),
    "chat.stopStream": RateLimit(per_minute=20, burst=5),
    "chat.postEphemeral": RateLimit(per_minute=100, burst=40),
    # "several hundred per minute per workspace" on top of the per-channel limit
    "chat.postMessage": RateLimit(per_minute=300, burst=30),
    "reactions.add": RateLimit(per_minute=50, burst=40),
    "reactions.remove": RateLimit(per_minute=20, burst=10),
    "conversations.replies": RateLimit(per_minute=50, burst=10),
    "conversations.history": RateLimit(per_minute=50, burst=10),
    "assistant.threads.setStatus": RateLimit(per_minute=100, burst=40),
    "apps.connections.open": RateLimit(per_minute=50, burst=10),
    # the thread read back (author names, channel names for scopes) and postmortem files
    "conversations.info": RateLimit(per_minute=50, burst=10),
    "users.info": RateLimit(per_minute=100, burst=40),
    "files.getUploadURLExternal": RateLimit(per_minute=100, burst=20),
    "files.completeUploadExternal": RateLimit(per_minute=100, burst=20),
}
"""Default ``slack.rate_limits``: Slack's published tier of each method opsbot calls."""


class AccessSettings(ConfigSection):
    """Who opsbot answers on a platform (one rule set, :mod:`bot.access`, for every platform)."""

    allowed_channels: list[str] = Field(default_factory=list)
    """Channel ids opsbot answers in (empty: all)."""
    allowed_users: list[str] = Field(default_factory=list)
    """User ids opsbot answers (empty: all)."""
    direct_messages: Literal["allow", "as_channel", "deny"] = "allow"
    """Direct messages: ``allow`` (a DM is the asker's own space: only ``allowed_users`` applies),
    ``as_channel`` (the DM must be in ``allowed_channels`` too) or ``deny`` (never answer DMs)."""
    allowed_bots: list[str] = Field(default_factory=list)
    """Bots opsbot does answer, by id or name (Slack: ``bot_id``, bot user id or bot / app name;
    Mattermost: user id or username). Every other bot, integration, webhook and workflow post is
    ignored, so two bots never talk to each other forever."""


class PromptSettings(ConfigSection):
    """The shared system prompt and how the context window is shared out."""

    system_prompt: str | None = None
    """System prompt text (byte-identical for every request, so it stays in the prefix cache).
    Unset: the built-in prompt in ``bot/prompts.py``."""
    system_prompt_file: Path | None = None
    """Read the system prompt from this file instead (wins over ``system_prompt``)."""
    context_share: float = Field(0.45, gt=0, lt=1)
    """Share of the context window cluster context may fill."""
    history_share: float = Field(0.2, ge=0, lt=1)
    """Share of the context window a thread's earlier turns may fill (oldest dropped first)."""

    @model_validator(mode="after")
    def _shares_leave_room(self) -> PromptSettings:
        if self.context_share + self.history_share >= 0.9:
            raise ValueError(
                "context_share + history_share must stay below 0.9 to leave room for the question "
                "and the answer"
            )
        return self


class StoreSettings(ConfigSection):
    """Where requests, threads and de-duplication keys are stored."""

    url: str | None = None
    """SQLAlchemy async URL: ``sqlite+aiosqlite:///path.db`` or
    ``postgresql+asyncpg://user@host/db``. Unset: ``opsbot.db`` in ``data_dir``. A URL without the
    async driver (``postgres://``, ``postgresql://``, ``sqlite:///``, as libpq, Heroku or a
    Kubernetes secret write it) is taken with the driver added, and the start-up log says so."""
    auto_upgrade: bool = True
    """Run Alembic migrations up to head at start."""
    buffer_size: int = Field(10_000, ge=1)
    """Rows held in memory while the database is unreachable; overflow is counted and logged."""
    retry: RetrySettings = Field(default_factory=lambda: RetrySettings(max_retries=None))
    """Write retries while the database is unreachable (buffered rows are retried for ever:
    ``max_retries`` stays unset)."""
    busy_timeout_ms: int = Field(5000, ge=0)
    """SQLite busy_timeout for concurrent writers."""
    connect_timeout_s: float = Field(5.0, gt=0)
    """Seconds to wait for a database connection."""
    claim_lease_s: float = Field(20.0, gt=0, le=600)
    """Seconds an answering replica's claim on an event lasts unless renewed (each replica renews all
    of its leases every quarter of this while its answers run). A replica killed mid-answer leaves
    its leases to run out; another replica (or the restarted one) then notes each such answer as
    interrupted in its thread, within about 1.25 x this many seconds of the kill."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return _move_renamed(
            "store", data, {"retry_initial_s": "retry.initial_s", "retry_max_s": "retry.max_s"}
        )

    @field_validator("url")
    @classmethod
    def _async_driver(cls, url: str | None) -> str | None:
        return with_async_driver(url) if url else url


class HttpSettings(ConfigSection):
    """opsbot's own HTTP server (Slack events, slash commands, webhooks, health, metrics)."""

    enabled: bool = True
    """Serve HTTP in ``opsbot run`` (``opsbot chat`` never does)."""
    host: str = "0.0.0.0"
    """Address to bind."""
    port: int = Field(8080, ge=0, le=65535)
    """Port to bind (0: any free port)."""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    """Largest request body in bytes: a larger one is answered 413 before it is read (from its
    ``Content-Length``) or as soon as it passes the limit (chunked)."""


class SlackSettings(AccessSettings):
    """Slack app connection."""

    enabled: bool = False
    """Connect to Slack in ``opsbot run``."""
    mode: Literal["socket", "http"] = "socket"
    """``socket`` (Socket Mode, needs ``app_token``) or ``http`` (Events API, needs ``signing_secret``)."""
    bot_token: SecretStr | None = None
    """Bot token (``xoxb-...``); required when enabled."""
    app_token: SecretStr | None = None
    """App-level token (``xapp-...``); required in socket mode."""
    signing_secret: SecretStr | None = None
    """Signing secret; required in http mode."""
    api_base_url: str = "https://slack.com/api/"
    """Web API base URL (tests and corporate proxies point it elsewhere)."""
    edit_interval_s: float = Field(1.0, ge=0)
    """Least seconds between two text updates of one streamed message (edits or stream appends);
    the first words replace the placeholder as soon as they exist."""
    channel_post_interval_s: float = Field(1.0, ge=0)
    """Seconds per new post to one channel once its burst (``channel_post_burst``) is spent; a post's
    turn counts from when the previous one completed (0: no per-channel limit)."""
    retry: PlatformRetrySettings = Field(default_factory=PlatformRetrySettings)
    """Web API call retries: 429s wait ``Retry-After`` up to ``patience_s``; 5xx and connection
    errors back off up to ``max_retries`` times; no call takes longer than ``deadline_s``."""
    command: str = "/rca"
    """The slash command opsbot answers (as configured in the Slack app)."""
    events_path: str = "/slack/events"
    """HTTP mode: path of the one Request URL for events, slash commands and interactivity."""
    message_limit: int = Field(39_000, ge=200, le=40_000)
    """Characters of answer text per Slack message; longer answers are split into several."""
    socket_ping_interval_s: float = Field(5.0, gt=0)
    """Socket Mode: seconds between websocket pings on every connection."""
    socket_pong_timeout_s: float = Field(5.0, gt=0)
    """Socket Mode: a connection whose ping is not answered within this many seconds is replaced
    (a new one is opened first, then the silent one closed): a half-open socket is gone within
    ``socket_ping_interval_s + socket_pong_timeout_s`` plus one connect."""
    socket_connections: int = Field(2, ge=2, le=10)
    """Socket Mode connections kept open at once, at least 2 (Slack allows up to 10 per app and
    spreads events over them): what Slack routes into a connection that died is redelivered on
    another after its ack timeout, while the dead one is being replaced."""
    reconnect: RetrySettings = Field(default_factory=lambda: RetrySettings(max_retries=None, max_s=30.0))
    """Socket Mode reconnects (``apps.connections.open`` and the websocket): retried for ever, with
    backoff and jitter."""
    rate_budgets: bool = True
    """Share app-wide rate budgets (``rate_limits``, per method, and the per-channel post limit)
    between every answer in flight, so calls stay inside Slack's tiers; off: calls go out as soon
    as answers make them (a 429's ``Retry-After`` is honoured either way)."""
    rate_limits: dict[str, RateLimit] = Field(default_factory=lambda: dict(SLACK_RATE_LIMITS))
    """Budget per Web API method, app-wide (Slack's tiers); a method not listed has none. Set one
    with e.g. ``[slack.rate_limits."chat.update"] per_minute = 50, burst = 10``."""
    channel_post_burst: int = Field(3, ge=1)
    """New posts to one channel that may go at once (then one per ``channel_post_interval_s``):
    Slack allows about one message per second per channel with short bursts."""
    streaming: Literal["auto", "native", "edit"] = "auto"
    """How answers stream: ``auto`` uses Slack's native streaming (``chat.startStream`` /
    ``appendStream`` / ``stopStream``) where the workspace offers it and a ``startStream`` slot
    (Tier 2) is free within ``native_start_wait_s``, else post-and-edit (``chat.update``);
    ``native`` waits for that slot instead; ``edit`` always posts and edits. A workspace that
    answers the streaming methods are unavailable is remembered and gets post-and-edit."""
    native_start_wait_s: float = Field(1.0, ge=0)
    """``streaming = auto``: longest wait in seconds for a ``chat.startStream`` slot before the
    answer uses post-and-edit instead."""
    post_placeholder: Literal["auto", "always"] = "auto"
    """Post-and-edit: ``auto`` posts the answer's first message with its first text when a sign of
    life (reaction or thread status) was shown, and a ``_thinking…_`` placeholder at once only when
    none could be; ``always`` posts the placeholder at once."""
    ack_reaction: str = "eyes"
    """Sign of life: reaction added to the asking message before context gathering starts, within
    a second (in assistant threads the thread status is set instead); empty: no sign of life."""
    done_reaction: str = "white_check_mark"
    """Reaction that replaces ``ack_reaction`` when the answer is complete (empty: none); swapped
    in the background at the lowest priority, as the reaction budget allows."""
    failed_reaction: str = "warning"
    """Reaction that replaces ``ack_reaction`` when the answer failed (empty: none)."""
    ack_wait_s: float = Field(1.0, ge=0)
    """Longest wait in seconds for the reaction budget before the sign of life is skipped (it must
    never hold up the answer)."""
    ack_fallback_text: str = ":eyes: Looking into it…"
    """When the reaction budget is spent (Tier 3: 50 per minute for the whole app), the sign of life
    is an ephemeral message with this text, seen by the asker only (empty: none; then the answer's
    placeholder post is the sign of life)."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return _move_renamed(
            "slack",
            data,
            {
                "max_retries": "retry.max_retries",
                "rate_limit_patience_s": "retry.patience_s",
                "retry_backoff_s": "retry.initial_s",
                "drain_timeout_s": None,
            },
        )

    @model_validator(mode="after")
    def _tokens_when_enabled(self) -> SlackSettings:
        if self.enabled:
            if self.bot_token is None:
                raise ValueError("bot_token is required when slack.enabled is true")
            if self.mode == "socket" and self.app_token is None:
                raise ValueError("app_token (xapp-...) is required when slack.mode is 'socket'")
            if self.mode == "http" and self.signing_secret is None:
                raise ValueError("signing_secret is required when slack.mode is 'http'")
        return self


class MattermostSettings(AccessSettings):
    """Mattermost bot connection."""

    enabled: bool = False
    """Connect to Mattermost in ``opsbot run``."""
    url: str = "localhost"
    """Server host name (no scheme)."""
    scheme: Literal["https", "http"] = "https"
    """``https`` unless the server really is plain HTTP."""
    port: int = Field(443, ge=1, le=65535)
    """Server port."""
    basepath: str = "/api/v4"
    """REST API base path."""
    verify_tls: bool = True
    """Verify the server's TLS certificate (turn off only for a test server)."""
    token: SecretStr | None = None
    """Bot account personal access token; required when enabled."""
    slash_command_token: SecretStr | None = None
    """Token Mattermost sends with the ``/rca`` custom slash command; required for ``/rca``."""
    action_secret: SecretStr | None = None
    """Secret embedded in feedback buttons' action context to verify clicks."""
    public_url: str | None = None
    """URL at which Mattermost reaches opsbot's HTTP server (for button actions)."""
    edit_interval_s: float = Field(1.0, ge=0)
    """Least seconds between two edits of one streamed post; the first words replace the
    placeholder as soon as they exist."""
    websocket_silence_s: float = Field(60.0, gt=0)
    """Reconnect when no websocket frame arrived for this long (pings with a deadline, below, find a
    half-open socket sooner)."""
    reconnect: RetrySettings = Field(default_factory=lambda: RetrySettings(max_retries=None, max_s=60.0))
    """Websocket reconnects and the REST catch-up after them (retried for ever, with backoff)."""
    retry: PlatformRetrySettings = Field(default_factory=lambda: PlatformRetrySettings(max_s=20.0))
    """REST call retries: 429s wait ``Retry-After`` (else ``X-Ratelimit-Reset``) up to
    ``patience_s``; 5xx and connection errors back off up to ``max_retries`` times; no call takes
    longer than ``deadline_s``."""
    request_timeout_s: float = Field(30.0, gt=0)
    """Deadline of one REST call (a timeout counts as a connection error and is retried)."""
    channel_post_interval_s: float = Field(0.1, ge=0)
    """Seconds per new post to one channel once its burst (``channel_post_burst``) is spent (0: no
    per-channel limit; every call also counts against ``rate_limit``)."""
    slash_command_wait_s: float = Field(2.0, ge=0, lt=3)
    """Seconds a slash command's HTTP response waits for the pipeline's first word (a refusal,
    ``/rca help``, ``/rca status``) so it can carry it directly (later text goes to the
    ``response_url``)."""
    websocket_ping_interval_s: float = Field(5.0, gt=0)
    """Seconds between websocket pings (at most a third of ``websocket_silence_s``)."""
    websocket_pong_timeout_s: float = Field(5.0, gt=0)
    """A websocket whose ping is not answered within this many seconds is replaced, whatever other
    traffic it carries: a half-open socket is gone within ``websocket_ping_interval_s +
    websocket_pong_timeout_s`` plus one connect (the replacement is opened before it is closed)."""
    rate_budgets: bool = True
    """Share the server's rate limit (``rate_limit``) and the per-channel post limit between every
    answer in flight; off: calls go out as soon as answers make them (a 429 still waits)."""
    rate_limit: RateLimit = Field(default_factory=lambda: RateLimit(per_minute=700, burst=100))
    """Budget for every REST call of the bot account: the server's rate limiter defaults, 10
    requests per second per user (``RateLimitSettings.PerSec``) with a burst of 100 (``MaxBurst``),
    i.e. at most 700 in any minute. Replicas sharing one bot account share the server's budget:
    divide it between them."""
    channel_post_burst: int = Field(3, ge=1)
    """New posts to one channel that may go at once (then one per ``channel_post_interval_s``)."""
    post_placeholder: Literal["auto", "always"] = "auto"
    """``auto`` posts the answer's first post with its first text when a sign of life (reaction)
    was shown, and a ``_thinking…_`` placeholder at once only when none could be; ``always`` posts
    the placeholder at once."""
    ack_reaction: str = "eyes"
    """Sign of life: reaction (``POST /reactions``) on the asking post before context gathering
    starts; empty: no sign of life."""
    done_reaction: str = "white_check_mark"
    """Reaction that replaces ``ack_reaction`` when the answer is complete (empty: none); swapped
    in the background at the lowest priority, as the reaction budget allows."""
    failed_reaction: str = "warning"
    """Reaction that replaces ``ack_reaction`` when the answer failed (empty: none)."""
    ack_wait_s: float = Field(1.0, ge=0)
    """Longest wait in seconds for the rate budget before the sign of life is skipped."""

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return _move_renamed(
            "mattermost",
            data,
            {
                "max_retries": "retry.max_retries",
                "retry_initial_s": "retry.initial_s",
                "retry_max_s": "retry.max_s",
                "reconnect_initial_s": "reconnect.initial_s",
                "reconnect_max_s": "reconnect.max_s",
            },
        )

    @model_validator(mode="after")
    def _token_when_enabled(self) -> MattermostSettings:
        if self.enabled and self.token is None:
            raise ValueError("token is required when mattermost.enabled is true")
        return self


class KubernetesSettings(ConfigSection):
    """Kubernetes context provider."""

    enabled: bool = False
    """Gather pod, event, log, workload and node facts."""
    kubeconfig: Path | None = None
    """kubeconfig file (unset: in-cluster service account, then ``~/.kube/config``)."""
    context: str | None = None
    """kubeconfig context to use."""
    namespaces: list[str] = Field(default_factory=list)
    """Namespaces opsbot may read (empty: all it is allowed to list)."""
    label_selector: str | None = None
    """Only objects matching this selector."""
    timeout_s: float = Field(3.0, gt=0)
    """Deadline for the whole provider."""
    log_tail_lines: int = Field(2000, ge=0)
    """Log lines read per container of the pods in question, current and previous (the last ones, at
    most 512 KiB); they are condensed by error signature, so the prompt gets the decisive lines, not
    the tail. 0: no logs."""
    list_limit: int = Field(2000, ge=1)
    """Most objects one list call reads per namespace (one page; a cut is noted in the footer)."""
    read_configmaps: bool = True
    """Read the ConfigMaps the pods in question reference (``env`` keys, ``envFrom``, volumes; one
    ``get`` each, at most 4) and show the referenced keys' values, redacted like every section: a
    wrong value in a ConfigMap (a database host, a feature flag) is often the whole incident and is
    nowhere else. Needs ``get`` on ``configmaps`` in opsbot's Role, which ``deploy/base/rbac.yaml`` does not
    grant: without it the first 403 stops the asking until restart and the section says why (no
    failure). Secrets are never read whatever this says. ``false``: names and keys only."""


class PrometheusSettings(ConfigSection):
    """Prometheus context provider."""

    enabled: bool = False
    """Gather firing alerts and targeted metrics."""
    url: str = "http://localhost:9090"
    """Prometheus base URL."""
    timeout_s: float = Field(2.0, gt=0)
    """Deadline for the whole provider."""
    bearer_token: SecretStr | None = None
    """Bearer token for Prometheus, if it needs one."""
    range_minutes: int = Field(30, ge=1)
    """Window of range queries."""
    queries: dict[str, str] = Field(default_factory=dict)
    """Extra or overriding query templates by name (``{namespace}``, ``{pod}`` are filled in)."""
    instant_queries: dict[str, str] = Field(default_factory=dict)
    """Extra or overriding instant query templates by name (listed per series, not summarised);
    placeholders as in ``queries`` (see ``bot/context/prometheus.py``)."""
    query_units: dict[str, str] = Field(default_factory=dict)
    """Unit of a query's values by template name (``bytes``, ``seconds``, ``ratio``, ``cores`` or any
    word), for summaries such as ``max 512.0 MiB``."""


class AlertmanagerSettings(ConfigSection):
    """Alertmanager webhook receiver."""

    enabled: bool = False
    """Serve ``POST /alertmanager`` and summarise new alert groups."""
    bearer_token: SecretStr | None = None
    """Bearer token the receiver requires (unset: none)."""
    targets: list[str] = Field(default_factory=list)
    """Where summaries go, as ``platform:channel`` (``slack:C123``, ``mattermost:abc``)."""
    storm_threshold: int | None = Field(6, ge=1)
    """Alert storms: new alert groups one target channel gets a thread of its own each within
    ``storm_window_s``; further new groups join one storm thread ("N alert groups firing") with a
    one-line summary per group and one analysis for all of them. ``None``: never coalesce."""
    storm_window_s: float = Field(60.0, gt=0)
    """Alert storms: the window new groups are counted in; a storm thread takes new groups until
    this long passes without one."""
    storm_settle_s: float = Field(5.0, ge=0)
    """Alert storms: seconds without a new group joining before the storm's one analysis starts
    (groups that join later get a further analysis of their own)."""
    api_url: str | None = None
    """Alertmanager's HTTP API (``http://alertmanager.monitoring:9093``) that investigations read
    (active alerts with their silenced / inhibited state, active silences); unset: no such tools."""
    api_bearer_token: SecretStr | None = None
    """Bearer token sent to ``api_url`` (unset: none)."""
    api_timeout_s: float = Field(3.0, gt=0)
    """Deadline of one call to ``api_url``."""


class ContextSettings(ConfigSection):
    """How cluster context is gathered."""

    timeout_s: float = Field(4.0, gt=0)
    """Overall deadline for all providers together."""
    cache_ttl_s: float = Field(15.0, ge=0)
    """Seconds a provider's answer is reused for the same query (incident bursts)."""
    default_cluster: str = Field("default", min_length=1)
    """Name of the default cluster (footers, channel scopes, questions naming it): the one
    ``[kubernetes]`` / ``[prometheus]`` describe, or the ``[clusters.<name>]`` entry of this name."""
    default_cluster_aliases: list[str] = Field(default_factory=list)
    """Other words that name the default cluster in a question (``"in prod ..."``)."""


class ClusterSettings(ConfigSection):
    """One more cluster (``[clusters.<name>]``): its own Kubernetes and Prometheus providers, each
    with its own timeout, and its own context cache."""

    aliases: list[str] = Field(default_factory=list)
    """Other words that name this cluster in a question (``"in europe ..."``); its name always does."""
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    """This cluster's Kubernetes API (``[clusters.<name>.kubernetes]``, the fields of ``[kubernetes]``)."""
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    """This cluster's Prometheus (``[clusters.<name>.prometheus]``, the fields of ``[prometheus]``)."""
    cache_ttl_s: float | None = Field(None, ge=0)
    """Seconds this cluster's answers are reused (unset: ``context.cache_ttl_s``)."""


class ChannelScopeSettings(ConfigSection):
    """One channel scope (``[[scope.channels]]``): which clusters and namespaces its channels see."""

    match: list[str] = Field(min_length=1)
    """Channel ids (``C0123ABCD``, a Mattermost channel id) or, starting with ``#``, shell-style
    patterns of channel names (``#inc-payments-*``)."""
    platform: Literal["slack", "mattermost", "console"] | None = None
    """Only channels of this platform (unset: any)."""
    clusters: list[str] = Field(default_factory=list)
    """Clusters these channels may read: one named in the question is used, else the first (empty:
    the default cluster)."""
    namespaces: list[str] = Field(default_factory=list)
    """Namespaces they may read in those clusters (empty: each cluster's configured namespaces); must
    lie inside a cluster's ``kubernetes.namespaces`` where that is set."""


class ScopeSettings(ConfigSection):
    """Per-channel cluster scope: which clusters and namespaces an answer in a channel may read."""

    channels: list[ChannelScopeSettings] = Field(default_factory=list)
    """Channel scopes, first match wins, e.g. ``[[scope.channels]] match = ["#inc-payments-*"]
    clusters = ["eu-west"] namespaces = ["payments"]``."""
    unmapped: Literal["default", "none"] = "default"
    """A channel outside every scope: ``default`` (any cluster, one named in the question or the
    default one, with its configured namespaces) or ``none`` (no cluster context at all)."""


class AnswerSettings(ConfigSection):
    """Answers in flight."""

    stall_s: float | None = Field(120.0, gt=0)
    """Watchdog: an answer that made no progress (no engine token, no platform call completed) for
    this many seconds is failed visibly: a note in its thread where one can be posted, the failed
    reaction, its request row (status ``stalled``), the claim released. Time the answer waits for
    the engine does not count (``engine.stall_timeout_s`` and ``engine.request_timeout_s`` bound
    it). ``None``: no watchdog."""


class ThreadSettings(ConfigSection):
    """The chat thread as context: what people wrote there, read back from the platform."""

    enabled: bool = True
    """Read the thread an answer goes into and add the human messages as context (since opsbot's
    last answer first, earlier ones as the budget allows)."""
    max_messages: int = Field(500, ge=1)
    """Most messages read from one thread (the newest are kept; a cut is noted in the footer)."""
    page_size: int = Field(200, ge=1, le=1000)
    """Messages asked per API call (Slack ``limit``, Mattermost ``perPage``, at most 200 there)."""
    timeout_s: float = Field(3.0, gt=0)
    """Deadline for reading the thread; the answer goes on without it (noted in the footer)."""
    max_message_chars: int = Field(2000, ge=100)
    """Characters kept of one message (a pasted log is cut, and says so)."""


class ActionPolicySettings(ConfigSection):
    """Who may approve proposed actions in some channels (``[[actions.policies]]``)."""

    match: list[str] = Field(min_length=1)
    """Channel ids or, starting with ``#``, shell-style patterns of channel names (as in
    ``[[scope.channels]]``); the first policy that matches a channel decides."""
    platform: Literal["slack", "mattermost", "console"] | None = None
    """Only channels of this platform (unset: any)."""
    approvers: list[str] = Field(default_factory=list)
    """Who may approve: platform user ids (Slack ``U0123``, Mattermost user ids), ``@group`` (a
    name in ``actions.groups``) and ``asker`` (whoever the proposal was made for). Empty: nobody
    (cards are shown, every click is refused)."""
    actions: list[str] = Field(default_factory=list)
    """Action kinds these channels may propose (``rollout_restart``, ``rollback``, ``scale``,
    ``delete_pod``, ``cordon``, ``uncordon``, ``silence``, ``expire_silence``); empty: all."""
    namespaces: list[str] = Field(default_factory=list)
    """Namespaces actions here may touch (empty: any); cluster-scoped nodes are allowed only when
    this is empty."""


class ActionsSettings(ConfigSection):
    """Approval-gated actions (``[actions]``): proposals become cards, a person approves, opsbot
    applies with credentials of their own (never the read-only ones, never seen by the model)."""

    enabled: bool = False
    """Offer actions (``/rca propose ...``, proposal cards, Approve / Reject buttons)."""
    kubeconfig: Path | None = None
    """The kubeconfig of the *write* identity (a second file, e.g. for the ``opsbot-actions``
    ServiceAccount of ``deploy/components/actions``); unset: that account's token file under
    ``service_account_token`` below."""
    context: str | None = None
    """Context in ``kubeconfig`` (unset: its current context)."""
    service_account_token: Path | None = None
    """In-cluster: a projected token file of the write ServiceAccount (the pod's own token stays
    the read-only one); used when ``kubeconfig`` is unset."""
    alertmanager_url: str | None = None
    """Alertmanager that silences are created in and expired from (``/api/v2/silences``)."""
    alertmanager_token: SecretStr | None = None
    """Bearer token for ``alertmanager_url``."""
    secret: SecretStr | None = None
    """HMAC key that signs every button's meaning (proposal, decision, digest of the action): a
    click can be neither forged nor repointed at another proposal. Required when enabled."""
    expiry_s: float = Field(900.0, gt=0)
    """Seconds a proposal may be approved; later clicks are refused and the card says expired."""
    timeout_s: float = Field(10.0, gt=0)
    """Deadline of one write call (dry run or apply)."""
    verify_s: float = Field(120.0, gt=0)
    """Seconds after applying to watch the rollout, pod, node or silence before posting the outcome."""
    verify_poll_s: float = Field(2.0, gt=0)
    """Seconds between two looks while verifying."""
    groups: dict[str, list[str]] = Field(default_factory=dict)
    """Approver groups by name (``[actions.groups] sre = ["U0123", "U0456"]``), named in policies as
    ``@sre``."""
    policies: list[ActionPolicySettings] = Field(default_factory=list)
    """Per-channel approval policies, first match wins; a channel no policy matches may see cards
    but nobody may approve them."""
    offer_from_answers: bool = True
    """After an answer, offer a card for each ``kubectl`` command in it that is a catalog action
    (rollout restart / undo, scale, delete pod, cordon, uncordon) on a target its evidence names,
    in a channel whose policy names an approver. The investigation's ``propose_action`` calls are
    offered whatever this says (they are offered only where someone may approve, too)."""
    max_offers: int = Field(2, ge=0, le=5)
    """Most cards offered after one answer: its investigation's proposals first, then its commands."""

    @model_validator(mode="after")
    def _secret_when_enabled(self) -> ActionsSettings:
        if self.enabled and self.secret is None:
            raise ValueError("actions.secret is required when actions are enabled (it signs every button)")
        for policy in self.policies:
            for entry in policy.approvers:
                if entry.startswith("@") and entry[1:] not in self.groups:
                    raise ValueError(f"actions.policies: approver {entry!r} names no group in actions.groups")
        return self


class RunbookSettings(ConfigSection):
    """Runbooks as context for alert summaries and ``/rca`` on an alert."""

    enabled: bool = False
    """Fetch the runbook of the alerts an answer is about and add it as context."""
    folder: Path | None = None
    """Local Markdown runbooks: ``<folder>/<alertname>.md``; relative ``runbook_url`` annotations and
    ``file:`` URLs are read from here too (never from outside it)."""
    base_url: str | None = None
    """Runbooks by alert name over HTTP: ``{alertname}`` / ``{alertname_lower}`` are filled in, or
    ``/<alertname>.md`` is appended; relative ``runbook_url`` annotations are resolved against it."""
    timeout_s: float = Field(3.0, gt=0)
    """Deadline of one runbook fetch in seconds."""
    max_bytes: int = Field(65_536, ge=1024)
    """Most bytes read of one runbook; a longer one is cut (the cut is marked in the context)."""
    max_runbooks: int = Field(2, ge=1)
    """Most runbooks added to one answer (one per alert name)."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Hosts runbook URLs may point at (empty: any host); others are refused with a note."""
    bearer_token: SecretStr | None = None
    """Bearer token sent with HTTP runbook fetches (a private wiki), if needed."""


def _lane_targets(**seconds: float) -> dict[Lane, float | None]:
    return {Lane(name): value for name, value in seconds.items()}


class LaneBudget(ConfigSection):
    """One lane's investigation budget (``[investigate.lanes.<lane>]``)."""

    max_steps: int = Field(4, ge=0, le=50)
    """Tool calls an investigation may make (0: no loop in this lane); the step after the last
    offers no tools, so the model must answer."""
    max_tool_tokens: int = Field(1500, ge=0)
    """Tokens of tool output the calls may add to the transcript, all together; once spent, the
    answer is asked for."""
    wall_s: float = Field(20.0, gt=0)
    """Seconds the tool steps may take together (model decisions and tool calls); once past, the
    answer is written from what was found."""


def _lane_budgets() -> dict[Lane, LaneBudget]:
    return {
        Lane.URGENT: LaneBudget(max_steps=2, max_tool_tokens=600, wall_s=8.0),
        Lane.NORMAL: LaneBudget(max_steps=4, max_tool_tokens=1500, wall_s=20.0),
        Lane.BACKGROUND: LaneBudget(max_steps=6, max_tool_tokens=3000, wall_s=60.0),
    }


class InvestigateSettings(ConfigSection):
    """The investigation loop (``bot/investigate.py``): after the gathered context (step 0), the
    model may call read-only tools (``bot/tools/``) until it answers, within its lane's budget."""

    enabled: bool = False
    """Run the loop at all (needs an engine that constrains output: ``llamacpp``, ``vllm`` or
    ``openai``; the transformers CPU engine answers without it)."""
    scenarios: list[str] = Field(
        default_factory=lambda: ["root_cause", "chat", "change_review", "alert_summary"]
    )
    """Scenarios that investigate (the off switch per scenario: leave one out)."""
    lanes: dict[Lane, LaneBudget] = Field(default_factory=_lane_budgets)
    """Budget per lane; the urgent lane's is small by default (someone is waiting)."""
    max_output_tokens: int = Field(400, ge=32)
    """Tokens one tool call's output may bring (cut by whole lines, with a note of what was cut)."""
    decision_max_tokens: int = Field(320, ge=16)
    """Tokens one tool call may take to write when an offered tool's schema leaves a string or list
    unbounded. Bounded schemas (every built-in tool) get the token ceiling of their longest call
    instead, so a well-formed call is never cut."""
    tool_timeout_s: float = Field(5.0, gt=0)
    """Seconds one tool call may take."""
    root_cause_block: bool = True
    """After the answer, one more constrained step writes the root cause as entities and claims
    with step references (stored with the request row, shown as short citations)."""

    @model_validator(mode="after")
    def _every_lane(self) -> InvestigateSettings:
        self.lanes = {**_lane_budgets(), **self.lanes}
        return self

    def budget(self, scenario: str, lane: Lane) -> LaneBudget | None:
        """The budget of ``scenario`` in ``lane``, or ``None`` when it does not investigate."""
        if not self.enabled or scenario not in self.scenarios:
            return None
        budget = self.lanes[lane]
        return budget if budget.max_steps > 0 else None


class SloSettings(ConfigSection):
    """The SLO guard (``bot/slo.py``): rolling P99 TTFT per lane against targets; on a breach it
    warns once and tightens the background lane step by step, and undoes it step by step on recovery."""

    enabled: bool = True
    """Watch TTFT and act on breaches (off: nothing is tuned and no warning is posted)."""
    ttft_p99_target_s: dict[Lane, float | None] = Field(
        default_factory=lambda: _lane_targets(urgent=2.0, normal=2.0)
    )
    """P99 TTFT target per lane in seconds. The background lane has none by default: it waits by
    design, and tightening it could never bring its own TTFT back under a target."""
    window_s: float = Field(120.0, gt=0)
    """Seconds of answers the rolling P99 covers."""
    min_samples: int = Field(20, ge=1)
    """Answers a lane needs in the window before its P99 is judged (fewer: neither breach nor alarm)."""
    evaluate_interval_s: float = Field(5.0, gt=0)
    """Seconds between two evaluations of the windows."""
    step_interval_s: float = Field(30.0, ge=0)
    """Least seconds between two tightening steps while the breach lasts (gives a step time to work)."""
    recover_ratio: float = Field(0.8, gt=0, le=1)
    """A lane counts as recovered when its P99 is at most this share of its target (hysteresis, so a
    P99 hovering at the target does not flap)."""
    recover_hold_s: float = Field(60.0, ge=0)
    """Seconds every lane must stay recovered before one step is undone (and again for the next)."""
    background_max_in_flight_steps: list[int] = Field(default_factory=lambda: [32, 16, 4])
    """Background lane in-flight limit at each tightening step (never above its configured limit)."""
    background_max_tokens_steps: list[int] = Field(default_factory=lambda: [256, 128, 64])
    """Background answers' max_tokens cap at each tightening step (same number of steps as above)."""
    ops_channel: str | None = None
    """Where the breach warning and the recovery note go, as ``platform:channel`` (``slack:C0OPS``);
    unset: logged and counted only."""
    warning_cooldown_s: float = Field(900.0, ge=0)
    """After a warning, no new one for this many seconds even if the guard recovered and breached
    again meanwhile (a flapping P99 posts one warning, not one per flap)."""
    kv_cache_watermark: float | None = Field(None, gt=0, le=1)
    """Optional (unset: off): when KV-cache use stays at or above this share for ``kv_cache_hold_s``,
    lower the normal and background lanes' in-flight limits to ``kv_cache_max_in_flight``."""
    kv_cache_hold_s: float = Field(30.0, ge=0)
    """Seconds KV-cache use must stay above (or, to undo, below) the watermark before acting."""
    kv_cache_max_in_flight: dict[Lane, int] = Field(
        default_factory=lambda: {Lane.NORMAL: 32, Lane.BACKGROUND: 16}
    )
    """In-flight limits while KV-cache use is over the watermark (never above the configured ones)."""

    @model_validator(mode="after")
    def _consistent(self) -> SloSettings:
        steps, caps = self.background_max_in_flight_steps, self.background_max_tokens_steps
        if not steps or len(steps) != len(caps):
            raise ValueError(
                "background_max_in_flight_steps and background_max_tokens_steps need the same number "
                f"of steps (at least one), got {len(steps)} and {len(caps)}"
            )
        for name, values in (
            ("background_max_in_flight_steps", steps),
            ("background_max_tokens_steps", caps),
        ):
            if any(v < 1 for v in values) or values != sorted(values, reverse=True):
                raise ValueError(
                    f"{name} must be positive and never grow from one step to the next: {values}"
                )
        if self.ops_channel is not None:
            platform, _, channel = self.ops_channel.partition(":")
            if not platform or not channel:
                raise ValueError(
                    f"ops_channel {self.ops_channel!r} is not 'platform:channel' (e.g. 'slack:C0OPS')"
                )
        return self


INSTANCE_LABELS: frozenset[str] = frozenset(
    {
        "instance",
        "exported_instance",
        "pod",
        "pod_name",
        "exported_pod",
        "kubernetes_pod_name",
        "pod_ip",
        "pod_uid",
        "node",
        "nodename",
        "node_name",
        "kubernetes_node",
        "hostname",
        "host",
        "host_ip",
        "ip",
        "address",
        "container_id",
        "id",
        "uid",
        "image_id",
        "replica",
        "prometheus_replica",
        "__replica__",
    }
)
"""Labels that name *which one* of many alike things fired (a pod, a node, a scrape target)."""


class AnalyzeSettings(ConfigSection):
    """Batch analysis (``opsbot analyze``, and ``POST /analyze`` in a running bot)."""

    enabled: bool = False
    """Serve ``POST /analyze`` in ``opsbot run``: batch analyses inside the running bot, in the
    background lane (never ahead of urgent or normal answers)."""
    bearer_token: SecretStr | None = None
    """Bearer token ``POST /analyze`` and ``GET /analyze/...`` require (unset: none)."""
    out_dir: Path | None = None
    """Folder in-bot analyses write to, one sub-folder per job (unset: ``analyze`` in ``data_dir``)."""
    max_in_flight: int = Field(64, ge=1)
    """In the bot: batch items handed to the background lane at once (a little above the lane's
    ``admission.max_in_flight`` keeps it busy without filling its queue)."""
    offline_max_num_seqs: int = Field(256, ge=1)
    """Standalone on vLLM: requests the offline engine decodes together (static batching; vLLM runs
    fewer at once where the KV cache holds fewer)."""
    max_tokens: int | None = Field(None, ge=1)
    """Answer tokens per group (unset: the scenario's ``max_tokens``)."""
    max_groups: int = Field(200, ge=1)
    """Groups summarised per analysis, largest first; the rest are listed in the report unsummarised."""
    max_group_lines: int = Field(40, ge=1)
    """Records listed in one group's prompt (spread over its time span; the token budget may cut more)."""
    instance_labels: list[str] = Field(default_factory=lambda: sorted(INSTANCE_LABELS))
    """Labels naming which one of many alike things fired (pod, instance, node ...): alerts that differ
    only in these are one group."""


class Settings(BaseSettings):
    """Every setting of opsbot."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        extra="forbid",
        use_attribute_docstrings=True,
        validate_default=True,
    )

    data_dir: Path = Field(default_factory=default_data_dir)
    """Folder for the default SQLite database, the default model (SmolLM2 GGUF, `models/`) and the
    generated test model."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Logging level."""
    log_json: bool = False
    """Log one JSON object per line (for log shippers) instead of text."""
    log_file: Path | None = None
    """File the log is appended to instead of stderr. Unset: stderr, except in ``opsbot chat``,
    which writes ``opsbot-chat.log`` in ``data_dir`` so the screen holds only the conversation, and in
    ``opsbot eval`` / ``analyze``, which write ``eval.log`` / ``analyze.log`` beside their report and
    show only warnings on the terminal (``--debug`` puts the log, at DEBUG, back on stderr)."""
    event_loop: Literal["auto", "uvloop", "asyncio"] = "auto"
    """The event loop every command runs on: ``auto`` is uvloop where it is installed (Linux and
    macOS, with opsbot), else asyncio's; ``uvloop`` insists on it; ``asyncio`` keeps the standard
    loop (for a profiler that wants Python frames). See ``bot/event_loop.py``."""
    workers: int = Field(1, ge=1, le=10)
    """Bot processes behind the one engine in ``opsbot run``: above 1, this process hosts the engine
    (and its admission lanes) and N worker processes run the chat adapters and the pipeline, each
    on its own core (see ``bot/workers.py``). Slack Socket Mode spreads events over the workers'
    connections (Slack allows 10 per app), Mattermost channels are split by a hash of their id,
    and worker 1 serves HTTP (Slack HTTP mode, Alertmanager, health, metrics)."""
    engine: EngineConfig = Field(default_factory=EngineConfig)
    """Inference engine."""
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)
    """Lane admission control."""
    prompt: PromptSettings = Field(default_factory=PromptSettings)
    """System prompt and budgets."""
    engines: dict[str, EngineConfig] = Field(default_factory=dict)
    """More engines in this process by name, each a full engine configuration like ``[engine]``
    (which is the engine named ``default``), e.g. ``[engines.int4] model = "/models/awq"
    gpu_memory_utilization = 0.3``; ``[scenarios.alert_summary] engine = "int4"`` sends a scenario
    to one. vLLM engines share the GPU by ``gpu_memory_utilization`` (at most 0.95 together per GPU;
    every engine starts at GPU 0, a tensor-parallel one spans GPUs 0 to N-1)."""
    scenarios: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per-scenario sampling overrides, e.g. ``[scenarios.root_cause] max_tokens = 768``, and the
    engine that answers it (``engine = "NAME"``, a ``[engines.NAME]`` block; unset: ``default``)."""
    store: StoreSettings = Field(default_factory=StoreSettings)
    """Database."""
    http: HttpSettings = Field(default_factory=HttpSettings)
    """HTTP server."""
    slack: SlackSettings = Field(default_factory=SlackSettings)
    """Slack."""
    mattermost: MattermostSettings = Field(default_factory=MattermostSettings)
    """Mattermost."""
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)
    """Kubernetes context."""
    prometheus: PrometheusSettings = Field(default_factory=PrometheusSettings)
    """Prometheus context."""
    alertmanager: AlertmanagerSettings = Field(default_factory=AlertmanagerSettings)
    """Alertmanager receiver."""
    context: ContextSettings = Field(default_factory=ContextSettings)
    """Context gathering."""
    slo: SloSettings = Field(default_factory=SloSettings)
    """SLO guard."""
    analyze: AnalyzeSettings = Field(default_factory=AnalyzeSettings)
    """Batch analysis."""
    clusters: dict[str, ClusterSettings] = Field(default_factory=dict)
    """More clusters by name, each with its own providers, timeouts and cache, e.g.
    ``[clusters.eu-west.kubernetes] enabled = true context = "eu-west-1"``."""
    scope: ScopeSettings = Field(default_factory=ScopeSettings)
    """Per-channel cluster scope."""
    runbooks: RunbookSettings = Field(default_factory=RunbookSettings)
    """Runbooks as alert context."""
    thread: ThreadSettings = Field(default_factory=ThreadSettings)
    """The chat thread as context."""
    answer: AnswerSettings = Field(default_factory=AnswerSettings)
    """Answers in flight (the watchdog)."""
    investigate: InvestigateSettings = Field(default_factory=InvestigateSettings)
    """The investigation loop (tool calls after the gathered context)."""
    actions: ActionsSettings = Field(default_factory=ActionsSettings)
    """Approval-gated actions (separate write credentials, per-channel approvers)."""

    @model_validator(mode="after")
    def _clusters_and_scopes_agree(self) -> Settings:
        check_clusters_and_scopes(self)
        return self

    @model_validator(mode="after")
    def _engines_agree(self) -> Settings:
        check_engines(self)
        return self

    @model_validator(mode="after")
    def _scenarios_valid(self) -> Settings:
        # Checked here, at load: a bad [scenarios.X] field must not wait for the model to load.
        from inference.scenarios import ScenarioRegistry

        ScenarioRegistry(self.sampling_overrides())
        return self

    def engine_configs(self) -> dict[str, EngineConfig]:
        """Every engine by name: ``default`` (``[engine]``) first, then the ``[engines.NAME]`` blocks."""
        return {DEFAULT_ENGINE: self.engine, **self.engines}

    def scenario_engines(self) -> dict[str, str]:
        """The engine name of each scenario that names one (``[scenarios.X] engine``); the rest go to
        ``default``."""
        return {
            name: str(fields[ENGINE_KEY]) for name, fields in self.scenarios.items() if ENGINE_KEY in fields
        }

    def sampling_overrides(self) -> dict[str, dict[str, Any]]:
        """``[scenarios]`` without the ``engine`` keys: the sampling overrides ``ScenarioRegistry`` takes."""
        return {
            name: {key: value for key, value in fields.items() if key != ENGINE_KEY}
            for name, fields in self.scenarios.items()
        }

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = Path(os.environ.get(CONFIG_FILE_ENV) or DEFAULT_CONFIG_FILE)
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=path))

    @property
    def store_url(self) -> str:
        """The effective database URL."""
        return self.store.url or f"sqlite+aiosqlite:///{self.data_dir / 'opsbot.db'}"

    def masked(self) -> dict[str, Any]:
        """The effective configuration as plain data, secrets replaced by ``**********``."""
        data: dict[str, Any] = self.model_dump(mode="json")
        data["store"]["url"] = mask_url(self.store_url)
        return data


ENGINE_KEY = "engine"
"""The ``[scenarios.X]`` key that names the scenario's engine (not a sampling field)."""
GPU_MEMORY_BUDGET = 0.95
"""Most ``gpu_memory_utilization`` that the vLLM engines of one process may take together on one GPU
(the rest is the CUDA context and allocator slack of each engine)."""


def check_engines(settings: Settings) -> None:
    """Raise ``ValueError`` (one line, naming the key) when the engines and the scenarios' ``engine``
    keys disagree, or the vLLM engines' memory fractions add up to more than one GPU holds."""
    if DEFAULT_ENGINE in settings.engines:
        raise ValueError(
            f"[engines.{DEFAULT_ENGINE}]: the name {DEFAULT_ENGINE!r} is the [engine] section's engine; "
            "configure it there, or give this engine another name"
        )
    known = settings.engine_configs()
    for scenario, fields in settings.scenarios.items():
        if ENGINE_KEY not in fields:
            continue
        name = fields[ENGINE_KEY]
        if not isinstance(name, str) or name not in known:
            raise ValueError(
                f"scenarios.{scenario}.engine: no engine named {name!r} (known: {', '.join(known)}); "
                f"add an [engines.{name}] block or name one of these"
            )
    # Only engines that may run on vLLM hold GPU memory ("auto" is vLLM wherever a GPU is).
    on_gpu = {name: c for name, c in known.items() if c.backend in ("vllm", "auto")}
    if len(on_gpu) < 2:
        return
    for gpu in range(max(c.tensor_parallel_size for c in on_gpu.values())):
        sharing = {name: c for name, c in on_gpu.items() if c.tensor_parallel_size > gpu}
        total = sum(c.gpu_memory_utilization for c in sharing.values())
        if len(sharing) > 1 and total > GPU_MEMORY_BUDGET + 1e-9:
            shares = ", ".join(f"{name} {c.gpu_memory_utilization:g}" for name, c in sharing.items())
            raise ValueError(
                f"engines sharing GPU {gpu} ask for {total:g} of its memory together ({shares}): lower "
                f"their gpu_memory_utilization so the sum is at most {GPU_MEMORY_BUDGET:g}"
            )


def cluster_namespaces(settings: Settings) -> dict[str, list[str]]:
    """Every cluster's name and configured namespaces (empty: all), the default cluster first."""
    default = settings.context.default_cluster
    named = {name: c.kubernetes.namespaces for name, c in settings.clusters.items()}
    if default in named:
        return {default: named.pop(default), **named}
    return {default: settings.kubernetes.namespaces, **named}


def check_clusters_and_scopes(settings: Settings) -> None:
    """Raise ``ValueError`` (one line, naming the key) when clusters and channel scopes disagree."""
    default = settings.context.default_cluster
    if default in settings.clusters and (settings.kubernetes.enabled or settings.prometheus.enabled):
        raise ValueError(
            f"context.default_cluster {default!r} is also a [clusters.{default}] entry while [kubernetes] "
            "or [prometheus] is enabled: rename one, or disable the top-level sections"
        )
    known = cluster_namespaces(settings)
    words: dict[str, str] = {}
    aliases = {default: settings.context.default_cluster_aliases}
    aliases.update({name: c.aliases for name, c in settings.clusters.items() if name != default})
    for name, more in aliases.items():
        for word in (name, *more):
            if words.setdefault(word.lower(), name) != name:
                raise ValueError(
                    f"cluster name or alias {word!r} names both {words[word.lower()]} and {name}"
                )
    for index, scope in enumerate(settings.scope.channels):
        where = f"scope.channels[{index}]"
        for cluster in scope.clusters or [default]:
            if cluster not in known:
                raise ValueError(f"{where}: unknown cluster {cluster!r} (known: {', '.join(known)})")
            allowed = known[cluster]
            if scope.namespaces and allowed and not set(scope.namespaces) & set(allowed):
                raise ValueError(
                    f"{where}: none of namespaces {', '.join(scope.namespaces)} is in cluster {cluster}'s "
                    f"kubernetes.namespaces ({', '.join(allowed)})"
                )


ASYNC_DRIVERS = {
    "postgres": "postgresql+asyncpg",
    "postgresql": "postgresql+asyncpg",
    "sqlite": "sqlite+aiosqlite",
}
"""URL schemes without a driver, and the async driver opsbot's store talks through instead."""


def with_loop(settings: Settings, enabled: bool | None) -> Settings:
    """``settings`` with the investigation loop on or off (``None``: as configured); the
    ``--loop`` / ``--no-loop`` of ``opsbot eval`` and ``opsbot chat``."""
    if enabled is None:
        return settings
    return settings.model_copy(
        update={"investigate": settings.investigate.model_copy(update={"enabled": enabled})}
    )


def with_async_driver(url: str) -> str:
    """``url`` with the store's async driver: ``postgres://u@h/db`` -> ``postgresql+asyncpg://u@h/db``
    (noted for the start-up log); a URL that names a driver, or a scheme opsbot does not know, is
    returned as it is (the store then says what is wrong with it)."""
    scheme, sep, rest = url.partition("://")
    driver = ASYNC_DRIVERS.get(scheme.lower()) if sep else None
    if driver is None:
        return url
    fixed = f"{driver}://{rest}"
    _deprecations[
        f"config: store.url {scheme}://... has no async driver: using {driver}:// (write it so to "
        "silence this note)"
    ] = None
    return fixed


def mask_url(url: str) -> str:
    """``scheme://user:secret@host`` with the password replaced (for logs and ``config show``)."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a SQLAlchemy URL: mask anything between ':' and '@'
        import re

        return re.sub(r"(//[^:/@]+:)[^@]+@", r"\1***@", url)


def load_settings(**overrides: Any) -> Settings:
    """Read the configuration; raise :class:`ConfigError` with one readable line on a problem."""
    path = Path(os.environ.get(CONFIG_FILE_ENV) or DEFAULT_CONFIG_FILE)
    if os.environ.get(CONFIG_FILE_ENV) and not path.is_file():
        raise ConfigError(f"{CONFIG_FILE_ENV}={path}: no such file. Fix: point it at an existing opsbot.toml")
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, path)) from None
    except ValueError as exc:  # TOML syntax errors surface as ValueError subclasses
        raise ConfigError(f"{path}: cannot parse: {exc}. Fix: correct the TOML syntax") from None


def _describe(exc: ValidationError, path: Path) -> str:
    """One line naming the key, where its value came from (the environment variable that set it, or
    the file), and the fix there."""
    err = exc.errors()[0]
    parts = [str(p) for p in err["loc"] if p != "__root__"]
    loc = ".".join(parts)
    env = env_name(parts)
    from_env = _set_in_env(parts)
    got = err.get("input")
    got_text = "" if isinstance(got, dict) or got is None else f" (got {str(got)[:60]!r})"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        near = _closest(parts)
        hint = f"; did you mean {env_name(near.split('.')) if from_env else near}?" if near else ""
        if from_env:
            return (
                f"config error: {from_env} is set, but {loc} is no setting{hint} "
                f"Fix: rename or unset {from_env}"
            )
        return (
            f"config error at {loc} in {path}: no such setting{hint} Fix: remove it or correct its "
            "spelling (`opsbot config show` lists every key)"
        )
    if not loc:  # a check across sections: its message names the keys
        fix = f"correct those keys in {path} or their OPSBOT_ variables"
    elif from_env:
        fix = f"correct the environment variable {from_env} (or unset it to use {path})"
    else:
        fix = f"set {loc} in {path} or {env}"
    more = f" (and {len(exc.errors()) - 1} more problem(s))" if len(exc.errors()) > 1 else ""
    where = f" (from {from_env})" if from_env else ""
    return f"config error at {loc or 'top level'}{where}: {msg}{got_text}. Fix: {fix}{more}"


def env_name(parts: Sequence[str]) -> str:
    """The environment variable of a setting: ``("engine", "model")`` -> ``OPSBOT_ENGINE__MODEL``."""
    return ENV_PREFIX + "__".join(p.upper() for p in parts)


def _set_in_env(parts: Sequence[str]) -> str | None:
    """The environment variable that set the value at ``parts`` (or a section above it, as JSON)."""
    for depth in range(len(parts), 0, -1):
        name = env_name(parts[:depth])
        if any(key.upper() == name for key in os.environ):
            return next(key for key in os.environ if key.upper() == name)
    return None


def setting_keys() -> list[str]:
    """Every setting's dotted key (``engine.model``), sections included (``engine``)."""
    keys: list[str] = []

    def walk(model: type[BaseModel], prefix: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            keys.append(".".join((*prefix, name)))
            if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
                walk(info.annotation, (*prefix, name))

    walk(Settings, ())
    return keys


def _closest(parts: Sequence[str]) -> str | None:
    """The known key nearest to the misspelt ``parts`` (same section), for a "did you mean"."""
    import difflib

    wanted = ".".join(parts)
    found = difflib.get_close_matches(wanted, setting_keys(), n=1, cutoff=0.75)
    return found[0] if found else None


NOT_SETTINGS = frozenset(
    {CONFIG_FILE_ENV, "OPSBOT_SUPERVISED", "OPSBOT_WORKER", "OPSBOT_BRIDGE", "OPSBOT_TEST_PG_URL"}
)
"""``OPSBOT_`` variables that are not settings (the config file's path, process roles, tests)."""
_FREE_FORM = ("scenarios", "engines", "clusters")
"""Settings whose keys below them are names chosen by the user (``OPSBOT_SCENARIOS__X__...``)."""


def unknown_env_notes() -> list[str]:
    """One line per ``OPSBOT_`` environment variable that sets nothing (a misspelt top-level name is
    otherwise silently ignored), with the nearest real variable."""
    import difflib

    keys = setting_keys()
    known = {env_name(key.split(".")): key for key in keys}
    # Below a leaf are a mapping's own keys (``OPSBOT_PROMETHEUS__QUERIES__NAME``); below a section, typos.
    leaves = [env_name(k.split(".")) + "__" for k in keys if not any(o.startswith(k + ".") for o in keys)]
    notes = []
    for name in sorted(os.environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known or upper in NOT_SETTINGS:
            continue
        if any(upper.startswith(env_name([free]) + "__") for free in _FREE_FORM) or any(
            upper.startswith(leaf) for leaf in leaves
        ):
            continue
        near = difflib.get_close_matches(upper, list(known), n=1, cutoff=0.75)
        hint = f"; did you mean {near[0]} ({known[near[0]]})?" if near else ""
        notes.append(f"config: the environment variable {name} is no opsbot setting and is ignored{hint}")
    return notes


def reference_markdown() -> str:
    """A Markdown table of every setting: key, environment variable, default, description."""
    rows = ["| key | environment variable | default | description |", "|---|---|---|---|"]

    def walk(model: type[BaseModel], defaults: BaseModel | None, prefix: tuple[str, ...]) -> None:
        for name, info in model.model_fields.items():
            ann = info.annotation
            path = (*prefix, name)
            if defaults is not None and hasattr(defaults, name):
                default: Any = getattr(defaults, name)
            elif info.default_factory is not None:
                default = info.default_factory()  # type: ignore[call-arg]
            else:
                default = info.default
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                # A section's own defaults (``[store.retry]`` retries for ever, ``[slack.retry]`` not).
                walk(ann, default if isinstance(default, BaseModel) else None, path)
                continue
            if name == "data_dir":
                default = "$XDG_DATA_HOME/opsbot or ~/.local/share/opsbot"
            elif isinstance(default, dict):
                default = {str(k): v for k, v in default.items()}  # lane keys as their names
            shown = (
                "required when enabled"
                if default is None and "required" in (info.description or "")
                else ("unset" if default is None else f"`{default}`")
            )
            doc = " ".join((info.description or "").split()).replace("|", "\\|").replace("``", "`")
            env = ENV_PREFIX + "__".join(p.upper() for p in path)
            rows.append(f"| `{'.'.join(path)}` | `{env}` | {shown} | {doc} |")

    walk(Settings, None, ())
    return "\n".join(rows)
