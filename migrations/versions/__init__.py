"""Alembic revision scripts (a package so that they install with opsbot)."""
