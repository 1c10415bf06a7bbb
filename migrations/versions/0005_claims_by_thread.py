"""claims say when their reply is posted, and are looked up by thread: a follow-up in a thread
opsbot is answering in is recognised on any replica or bot worker

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03

``Store.is_bot_thread`` asks whether any replica (or bot worker) has posted a reply in a thread;
the claim row says so (``replied``) as soon as the reply is posted, long before the answer's
thread turns are written. Rows written before this revision keep ``replied`` false: their threads
are recognised by their stored turns, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch mode: SQLite rebuilds the table, PostgreSQL alters it in place
    with op.batch_alter_table("opsbot_processed_events") as batch:
        batch.add_column(sa.Column("replied", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_index(
        "ix_opsbot_processed_events_thread",
        "opsbot_processed_events",
        ["platform", "channel", "thread_id"],
    )


def downgrade() -> None:
    op.drop_index("ix_opsbot_processed_events_thread", table_name="opsbot_processed_events")
    with op.batch_alter_table("opsbot_processed_events") as batch:
        batch.drop_column("replied")
