"""approval-gated actions: one row per proposal (its state is the apply-once claim) and an audit
trail of every proposal, click, decision, apply and verification

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "opsbot_actions",
        sa.Column("id", sa.String(36), nullable=False),
        sa.Column("platform", sa.String(32), nullable=False),
        sa.Column("channel", sa.String(255), nullable=False),
        sa.Column("thread_id", sa.String(255), nullable=True),
        sa.Column("card_id", sa.String(255), nullable=True),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(512), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("evidence", sa.Text(), nullable=False),
        sa.Column("diff", sa.Text(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("risk", sa.Text(), nullable=False),
        sa.Column("asked_by", sa.String(255), nullable=True),
        sa.Column("proposed_by", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_by", sa.String(255), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("applied_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("apply_ms", sa.Float(), nullable=True),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("verified", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_opsbot_actions"),
    )
    op.create_index("ix_opsbot_actions_created_at", "opsbot_actions", ["created_at"])
    op.create_index("ix_opsbot_actions_state_expires", "opsbot_actions", ["state", "expires_at"])
    op.create_table(
        "opsbot_action_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("proposal_id", sa.String(64), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("platform", sa.String(32), nullable=True),
        sa.Column("user", sa.String(255), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_opsbot_action_events"),
    )
    op.create_index("ix_opsbot_action_events_proposal_id", "opsbot_action_events", ["proposal_id"])
    op.create_index("ix_opsbot_action_events_at", "opsbot_action_events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_opsbot_action_events_at", table_name="opsbot_action_events")
    op.drop_index("ix_opsbot_action_events_proposal_id", table_name="opsbot_action_events")
    op.drop_table("opsbot_action_events")
    op.drop_index("ix_opsbot_actions_state_expires", table_name="opsbot_actions")
    op.drop_index("ix_opsbot_actions_created_at", table_name="opsbot_actions")
    op.drop_table("opsbot_actions")
