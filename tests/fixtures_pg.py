"""PostgreSQL fixtures: a fresh, empty database per test on the server at ``OPSBOT_TEST_PG_URL``.

Each test gets its own database (``CREATE DATABASE opsbot_t_<random>``), dropped afterwards, so
tests running in parallel never see each other's rows or migrations. When the server cannot be
reached the test is skipped, except with ``CI=true``, where that is a failure.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
from sqlalchemy.engine import URL, make_url

PG_URL_ENV = "OPSBOT_TEST_PG_URL"
DEFAULT_PG_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


def pg_base_url() -> URL:
    """The server URL the tests use (SQLAlchemy form, ``postgresql+asyncpg://...``)."""
    return make_url(os.environ.get(PG_URL_ENV) or DEFAULT_PG_URL)


async def _admin(url: URL) -> asyncpg.Connection:
    return await asyncpg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username,
        password=url.password,
        database=url.database,
        timeout=5,
    )


@pytest.fixture
async def pg_url() -> AsyncIterator[str]:
    """URL (``postgresql+asyncpg://...``) of a new empty database, dropped after the test."""
    base = pg_base_url()
    try:
        admin = await _admin(base)
    except (OSError, asyncpg.PostgresError, TimeoutError) as error:
        message = (
            f"PostgreSQL at {base.render_as_string(hide_password=True)} unreachable "
            f"({type(error).__name__}): "
            "start a server there (trust auth, database `test`) or point OPSBOT_TEST_PG_URL at one"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    name = f"opsbot_t_{uuid.uuid4().hex[:12]}"
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        admin = await _admin(base)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
