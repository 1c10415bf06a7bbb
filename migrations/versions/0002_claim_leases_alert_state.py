"""claim leases and alert state: who answers an event and until when; what an alert group fires

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

``opsbot_processed_events`` rows become claims with a lease: the replica answering an event
(``owner``) renews ``lease_until`` while the answer streams, so a replica killed mid-answer leaves
an expired lease that another replica (or the restarted one) finds and notes as interrupted in the
thread (``channel``, ``thread_id``), writing the request row (``request_id``, ``scenario``,
``lane``). ``state``: ``answering`` (leased), ``done``, ``interrupted``; rows from before this
revision are ``done``.

``opsbot_alert_threads.firing`` keeps the fingerprints firing at the group's last notification
(JSON list), so a partial resolve or a re-fire is told apart on any replica and after a restart.
Written out by hand, self-contained, like 0001.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("opsbot_processed_events") as batch:
        batch.add_column(sa.Column("state", sa.String(16), nullable=False, server_default="done"))
        batch.add_column(sa.Column("owner", sa.String(64), nullable=True))
        batch.add_column(sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("request_id", sa.String(128), nullable=True))
        batch.add_column(sa.Column("channel", sa.String(255), nullable=True))
        batch.add_column(sa.Column("thread_id", sa.String(255), nullable=True))
        batch.add_column(sa.Column("user", sa.String(255), nullable=True))
        batch.add_column(sa.Column("scenario", sa.String(64), nullable=True))
        batch.add_column(sa.Column("lane", sa.String(32), nullable=True))
    # The sweeper's query: leased claims whose lease ran out.
    op.create_index(
        "ix_opsbot_processed_events_state_lease", "opsbot_processed_events", ["state", "lease_until"]
    )
    with op.batch_alter_table("opsbot_alert_threads") as batch:
        batch.add_column(sa.Column("firing", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("opsbot_alert_threads") as batch:
        batch.drop_column("firing")
    op.drop_index("ix_opsbot_processed_events_state_lease", table_name="opsbot_processed_events")
    with op.batch_alter_table("opsbot_processed_events") as batch:
        for name in (
            "lane",
            "scenario",
            "user",
            "thread_id",
            "channel",
            "request_id",
            "lease_until",
            "owner",
            "state",
        ):
            batch.drop_column(name)
