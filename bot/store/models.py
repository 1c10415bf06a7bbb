"""SQLAlchemy 2 declarative models: the schema the Alembic migrations in ``migrations/`` create.

Table names carry an ``opsbot_`` prefix so the bot can share a PostgreSQL database with other
applications. Constraint names follow one naming convention so later batch migrations on SQLite
can address them by name.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend.

    SQLite has no timezone type: values are stored as naive UTC and come back with ``tzinfo=UTC``,
    so comparisons and arithmetic behave the same as on PostgreSQL's ``timestamptz``.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:  # naive values are taken to be UTC already
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    """Declarative base of every opsbot table."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RequestRow(Base):
    """One inference request (see :class:`bot.store.RequestRecord`)."""

    __tablename__ = "opsbot_requests"
    __table_args__ = (Index("ix_opsbot_requests_scenario_platform", "scenario", "platform"),)

    # The request id is the key so a retried batch whose commit was acknowledged late upserts
    # instead of duplicating the row.
    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    platform: Mapped[str] = mapped_column(String(32))
    channel: Mapped[str | None] = mapped_column(String(255))
    thread_id: Mapped[str | None] = mapped_column(String(255))
    user: Mapped[str | None] = mapped_column(String(255))
    scenario: Mapped[str] = mapped_column(String(64))
    lane: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    model: Mapped[str | None] = mapped_column(String(255))
    engine: Mapped[str | None] = mapped_column(String(64))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    queue_ms: Mapped[float | None] = mapped_column(Float)
    context_ms: Mapped[float | None] = mapped_column(Float)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    tpot_ms: Mapped[float | None] = mapped_column(Float)
    e2e_ms: Mapped[float | None] = mapped_column(Float)
    post_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # JSON (bot.replay), Text rather than JSON so SQLite and PostgreSQL store it alike.
    replay_inputs: Mapped[str | None] = mapped_column(Text)
    # JSON (bot.investigate: entities and claims with step references), Text for both backends.
    root_cause: Mapped[str | None] = mapped_column(Text)


class InvestigationStepRow(Base):
    """One model step of an investigation (see :class:`bot.store.records.StepRecord`)."""

    __tablename__ = "opsbot_investigation_steps"

    request_id: Mapped[str] = mapped_column(
        String(128), ForeignKey("opsbot_requests.request_id", ondelete="CASCADE"), primary_key=True
    )
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(32))
    tool: Mapped[str | None] = mapped_column(String(64))
    arguments: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    output_tokens: Mapped[int] = mapped_column(Integer, default=0)
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    decode_ms: Mapped[float | None] = mapped_column(Float)
    tool_ms: Mapped[float | None] = mapped_column(Float)
    tool_tokens: Mapped[int] = mapped_column(Integer, default=0)
    summary: Mapped[str | None] = mapped_column(Text)
    source: Mapped[str | None] = mapped_column(String(255))


class ThreadRow(Base):
    """A conversation thread on one platform (the key follow-up messages are looked up by)."""

    __tablename__ = "opsbot_threads"
    __table_args__ = (UniqueConstraint("platform", "channel", "thread_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    platform: Mapped[str] = mapped_column(String(32))
    channel: Mapped[str] = mapped_column(String(255))
    thread_id: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ThreadMessageRow(Base):
    """One turn of a thread, oldest first by (created_at, id)."""

    __tablename__ = "opsbot_thread_messages"
    __table_args__ = (Index("ix_opsbot_thread_messages_thread_created", "thread_pk", "created_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # Generated when the message is buffered: a retried batch inserts each message once.
    message_id: Mapped[str] = mapped_column(String(36), unique=True)
    thread_pk: Mapped[int] = mapped_column(ForeignKey("opsbot_threads.id", ondelete="CASCADE"))
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    user: Mapped[str | None] = mapped_column(String(255))
    request_id: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ProcessedEventRow(Base):
    """A chat event some replica has claimed; the primary key is what makes the claim exclusive.

    A claim for an answer carries a lease (``owner``, ``lease_until``) renewed while it streams; an
    expired ``answering`` lease is an answer whose replica died (:mod:`bot.claims`).
    """

    __tablename__ = "opsbot_processed_events"
    __table_args__ = (
        Index("ix_opsbot_processed_events_state_lease", "state", "lease_until"),
        Index("ix_opsbot_processed_events_thread", "platform", "channel", "thread_id"),
    )

    platform: Mapped[str] = mapped_column(String(32), primary_key=True)
    event_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    state: Mapped[str] = mapped_column(String(16), default="done", server_default="done")
    """``answering`` (leased), ``done`` or ``interrupted`` (noted by another replica)."""
    owner: Mapped[str | None] = mapped_column(String(64))
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    request_id: Mapped[str | None] = mapped_column(String(128))
    channel: Mapped[str | None] = mapped_column(String(255))
    thread_id: Mapped[str | None] = mapped_column(String(255))
    user: Mapped[str | None] = mapped_column(String(255))
    scenario: Mapped[str | None] = mapped_column(String(64))
    lane: Mapped[str | None] = mapped_column(String(32))
    replied: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """The answer's reply is posted in ``thread_id``: from then on, on every replica and bot
    worker, messages in that thread are follow-ups for opsbot (``Store.is_bot_thread``)."""


class AlertThreadRow(Base):
    """Alertmanager group key -> the thread its notifications go to."""

    __tablename__ = "opsbot_alert_threads"

    group_key: Mapped[str] = mapped_column(String(512), primary_key=True)
    platform: Mapped[str] = mapped_column(String(32))
    channel: Mapped[str] = mapped_column(String(255))
    thread_id: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(32))
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    firing: Mapped[str | None] = mapped_column(Text)
    """JSON list of the fingerprints firing at the group's last notification (any replica's)."""


class FeedbackRow(Base):
    """A user's vote on an answer; the key makes a second click replace the first.

    ``user`` is ``''`` when the platform did not say who clicked (a key column cannot be NULL).
    """

    __tablename__ = "opsbot_feedback"

    request_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    platform: Mapped[str] = mapped_column(String(32), primary_key=True)
    user: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ActionRow(Base):
    """One proposed action (:mod:`bot.actions`): what, why, the dry run's diff, and its fate.

    ``state`` is the claim: the one UPDATE from ``proposed`` that matches (not expired) decides it,
    so an action is applied at most once across double clicks, retries and replicas.
    """

    __tablename__ = "opsbot_actions"
    __table_args__ = (Index("ix_opsbot_actions_state_expires", "state", "expires_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    platform: Mapped[str] = mapped_column(String(32))
    channel: Mapped[str] = mapped_column(String(255))
    thread_id: Mapped[str | None] = mapped_column(String(255))
    card_id: Mapped[str | None] = mapped_column(String(255))
    """The card's post (Slack ``ts``, Mattermost post id), edited when the action is decided."""
    action: Mapped[str] = mapped_column(String(32))
    target: Mapped[str] = mapped_column(String(512))
    spec: Mapped[str] = mapped_column(Text)
    """Canonical JSON of the action (:meth:`bot.actions.catalog.ActionSpec.canonical`)."""
    digest: Mapped[str] = mapped_column(String(64))
    evidence: Mapped[str] = mapped_column(Text)
    """JSON list of the cited evidence lines."""
    diff: Mapped[str] = mapped_column(Text)
    summary: Mapped[str] = mapped_column(Text)
    risk: Mapped[str] = mapped_column(Text)
    asked_by: Mapped[str | None] = mapped_column(String(255))
    proposed_by: Mapped[str] = mapped_column(String(64))
    """``command`` (a person's ``/rca propose``) or ``model`` (the investigation loop's tool)."""
    state: Mapped[str] = mapped_column(String(16))
    """``proposed``, ``approving`` (claimed, being applied), ``applied``, ``failed``, ``rejected``,
    ``expired``."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)
    decided_by: Mapped[str | None] = mapped_column(String(255))
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    applied_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    apply_ms: Mapped[float | None] = mapped_column(Float)
    """Click received -> the API answered the apply."""
    result: Mapped[str | None] = mapped_column(Text)
    verified: Mapped[str | None] = mapped_column(Text)


class ActionEventRow(Base):
    """The audit trail: every proposal, click (refused ones too), decision, apply and verification."""

    __tablename__ = "opsbot_action_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    proposal_id: Mapped[str] = mapped_column(String(64), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    event: Mapped[str] = mapped_column(String(16))
    """``proposed``, ``refused``, ``approved``, ``rejected``, ``applied``, ``failed``, ``verified``."""
    platform: Mapped[str | None] = mapped_column(String(32))
    user: Mapped[str | None] = mapped_column(String(255))
    detail: Mapped[str | None] = mapped_column(Text)
