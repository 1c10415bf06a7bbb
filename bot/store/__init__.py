"""opsbot's storage: requests, conversation threads, de-duplication keys, alert threads, feedback.

Open with :meth:`Store.open` (SQLite or PostgreSQL URL); schema migrations are in
:mod:`bot.store.migrate`.
"""

from bot.store.db import StoreError
from bot.store.records import (
    AlertThread,
    LatencyStats,
    Percentiles,
    RatedRequest,
    RequestRecord,
    StepRecord,
    ThreadMessage,
)
from bot.store.repository import Store

__all__ = [
    "AlertThread",
    "LatencyStats",
    "Percentiles",
    "RatedRequest",
    "RequestRecord",
    "StepRecord",
    "Store",
    "StoreError",
    "ThreadMessage",
]
