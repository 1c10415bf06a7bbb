"""replay inputs: the request row keeps what replays its answer (redacted context, prompt inputs)

Revision ID: 0003
Revises: 0001
Create Date: 2026-12-01

One nullable Text column (JSON, see ``bot.replay``): rows written before it stay valid and
are simply not replayable. Batch mode so SQLite, which cannot drop a column in place on older
versions, downgrades too.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("opsbot_requests") as batch:
        batch.add_column(sa.Column("replay_inputs", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("opsbot_requests") as batch:
        batch.drop_column("replay_inputs")
