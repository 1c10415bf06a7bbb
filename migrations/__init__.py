"""opsbot's Alembic migrations (run them with ``opsbot db upgrade`` or :mod:`bot.store.migrate`)."""
