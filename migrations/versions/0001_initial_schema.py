"""initial schema: requests, threads and messages, processed events, alert threads, feedback

Revision ID: 0001
Revises:
Create Date: 2026-11-29

Written out by hand (not imported from ``bot.store.models``) so this revision stays what it was
when the models change later.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, nullable: bool = False) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "opsbot_requests",
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("platform", sa.String(32), nullable=False),
        sa.Column("channel", sa.String(255), nullable=True),
        sa.Column("thread_id", sa.String(255), nullable=True),
        sa.Column("user", sa.String(255), nullable=True),
        sa.Column("scenario", sa.String(64), nullable=False),
        sa.Column("lane", sa.String(32), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("model", sa.String(255), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("queue_ms", sa.Float(), nullable=True),
        sa.Column("context_ms", sa.Float(), nullable=True),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("tpot_ms", sa.Float(), nullable=True),
        sa.Column("e2e_ms", sa.Float(), nullable=True),
        sa.Column("post_ms", sa.Float(), nullable=True),
        _ts("created_at"),
        _ts("finished_at", nullable=True),
        sa.PrimaryKeyConstraint("request_id", name="pk_opsbot_requests"),
    )
    op.create_index("ix_opsbot_requests_created_at", "opsbot_requests", ["created_at"])
    op.create_index("ix_opsbot_requests_scenario_platform", "opsbot_requests", ["scenario", "platform"])

    op.create_table(
        "opsbot_threads",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("platform", sa.String(32), nullable=False),
        sa.Column("channel", sa.String(255), nullable=False),
        sa.Column("thread_id", sa.String(255), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name="pk_opsbot_threads"),
        sa.UniqueConstraint(
            "platform", "channel", "thread_id", name="uq_opsbot_threads_platform_channel_thread_id"
        ),
    )
    op.create_table(
        "opsbot_thread_messages",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("message_id", sa.String(36), nullable=False),
        sa.Column("thread_pk", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("user", sa.String(255), nullable=True),
        sa.Column("request_id", sa.String(128), nullable=True),
        _ts("created_at"),
        sa.ForeignKeyConstraint(
            ["thread_pk"],
            ["opsbot_threads.id"],
            name="fk_opsbot_thread_messages_thread_pk_opsbot_threads",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_opsbot_thread_messages"),
        sa.UniqueConstraint("message_id", name="uq_opsbot_thread_messages_message_id"),
    )
    op.create_index(
        "ix_opsbot_thread_messages_thread_created", "opsbot_thread_messages", ["thread_pk", "created_at"]
    )

    op.create_table(
        "opsbot_processed_events",
        sa.Column("platform", sa.String(32), nullable=False),
        sa.Column("event_id", sa.String(255), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("platform", "event_id", name="pk_opsbot_processed_events"),
    )
    op.create_index("ix_opsbot_processed_events_created_at", "opsbot_processed_events", ["created_at"])

    op.create_table(
        "opsbot_alert_threads",
        sa.Column("group_key", sa.String(512), nullable=False),
        sa.Column("platform", sa.String(32), nullable=False),
        sa.Column("channel", sa.String(255), nullable=False),
        sa.Column("thread_id", sa.String(255), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        _ts("updated_at"),
        sa.PrimaryKeyConstraint("group_key", name="pk_opsbot_alert_threads"),
    )

    op.create_table(
        "opsbot_feedback",
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("platform", sa.String(32), nullable=False),
        sa.Column("user", sa.String(255), nullable=False),
        sa.Column("value", sa.Integer(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("request_id", "platform", "user", name="pk_opsbot_feedback"),
    )


def downgrade() -> None:
    op.drop_table("opsbot_feedback")
    op.drop_table("opsbot_alert_threads")
    op.drop_index("ix_opsbot_processed_events_created_at", table_name="opsbot_processed_events")
    op.drop_table("opsbot_processed_events")
    op.drop_index("ix_opsbot_thread_messages_thread_created", table_name="opsbot_thread_messages")
    op.drop_table("opsbot_thread_messages")
    op.drop_table("opsbot_threads")
    op.drop_index("ix_opsbot_requests_scenario_platform", table_name="opsbot_requests")
    op.drop_index("ix_opsbot_requests_created_at", table_name="opsbot_requests")
    op.drop_table("opsbot_requests")
