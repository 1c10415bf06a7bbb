"""investigations: one row per model step linked to its request, and the request's root-cause block

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05

``opsbot_investigation_steps`` holds each step of a tool-calling investigation (``bot/investigate.py``):
prompt, cached and output tokens, TTFT, decode time, the tool, its arguments, latency and output
size. Rows written before this revision have no steps and a NULL ``root_cause``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch mode: SQLite rebuilds the table, PostgreSQL alters it in place
    with op.batch_alter_table("opsbot_requests") as batch:
        batch.add_column(sa.Column("root_cause", sa.Text(), nullable=True))
    op.create_table(
        "opsbot_investigation_steps",
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("tool", sa.String(64), nullable=True),
        sa.Column("arguments", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("cached_tokens", sa.Integer(), nullable=False),
        sa.Column("output_tokens", sa.Integer(), nullable=False),
        sa.Column("ttft_ms", sa.Float(), nullable=True),
        sa.Column("decode_ms", sa.Float(), nullable=True),
        sa.Column("tool_ms", sa.Float(), nullable=True),
        sa.Column("tool_tokens", sa.Integer(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=True),
        sa.Column("source", sa.String(255), nullable=True),
        sa.ForeignKeyConstraint(
            ["request_id"],
            ["opsbot_requests.request_id"],
            name="fk_opsbot_investigation_steps_request_id_opsbot_requests",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("request_id", "step", name="pk_opsbot_investigation_steps"),
    )


def downgrade() -> None:
    op.drop_table("opsbot_investigation_steps")
    with op.batch_alter_table("opsbot_requests") as batch:
        batch.drop_column("root_cause")
