"""request rows name the engine that answered (one engine per scenario, ``[engines.NAME]``)

Revision ID: 0004
Revises: 0001
Create Date: 2026-12-01

Rows written before this revision keep ``engine`` NULL: they were all answered by the one engine
there was, which ``opsbot stats --by engine`` shows as ``-``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # batch mode: SQLite rebuilds the table, PostgreSQL alters it in place
    with op.batch_alter_table("opsbot_requests") as batch:
        batch.add_column(sa.Column("engine", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("opsbot_requests") as batch:
        batch.drop_column("engine")
