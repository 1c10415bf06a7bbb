"""claims are looked up by thread: a follow-up in a thread opsbot is answering in, on any replica

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03

``Store.is_bot_thread`` asks whether any replica (or bot worker) has taken a question in a thread;
the claim row names the thread from the moment the question is taken, long before the answer's
thread turns are written.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_opsbot_processed_events_thread",
        "opsbot_processed_events",
        ["platform", "channel", "thread_id"],
    )


def downgrade() -> None:
    op.drop_index("ix_opsbot_processed_events_thread", table_name="opsbot_processed_events")
