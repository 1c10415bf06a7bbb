"""The write buffer: rows wait in memory and a background task writes them in batches.

Callers never wait on the database. When it is unreachable, the batch at the head of the queue
stays there (in order) and is retried under ``store.retry`` (:mod:`bot.retry`: backoff with jitter,
for ever); nothing queued is lost. Only a full queue drops rows (the new ones: what already fit
is kept), and every drop is counted in ``opsbot_store_dropped_rows_total`` and logged with the kind of row.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from bot import metrics
from bot.config import StoreSettings
from bot.event_loop import stop_task
from bot.retry import RetryBudget
from bot.store.db import describe_cause, is_row_error
from bot.store.records import AlertThread, RequestRecord, utcnow

logger = logging.getLogger(__name__)

BATCH_SIZE = 500
"""Most rows written in one transaction."""
_DROP_LOG_INTERVAL_S = 5.0
"""During a long overflow, drops of one kind are summed into one WARNING line this often."""
_FAILURE_LOG_INTERVAL_S = 30.0
"""During a long outage, failed write attempts are logged at WARNING at most this often."""


@dataclass
class PendingMessage:
    """A thread message waiting to be written (``message_id`` makes the insert idempotent)."""

    platform: str
    channel: str
    thread_id: str
    role: str
    content: str
    user: str | None
    request_id: str | None
    created_at: datetime = field(default_factory=utcnow)
    message_id: str = field(default_factory=lambda: str(uuid.uuid4()))


@dataclass
class PendingFeedback:
    """A vote waiting to be written."""

    request_id: str
    platform: str
    user: str | None
    value: int
    created_at: datetime = field(default_factory=utcnow)


@dataclass
class PendingClaim:
    """An event claimed in-process during an outage, written later so other replicas see it."""

    platform: str
    event_id: str
    created_at: datetime = field(default_factory=utcnow)


@dataclass
class PendingRelease:
    """The end of this process's lease on an event, written once the database is back (until then
    no other replica may take the claim for a dead one's)."""

    platform: str
    event_id: str
    owner: str


PendingRow = RequestRecord | PendingMessage | AlertThread | PendingFeedback | PendingClaim | PendingRelease

_KINDS: dict[type, str] = {
    RequestRecord: "request",
    PendingMessage: "message",
    AlertThread: "alert_thread",
    PendingFeedback: "feedback",
    PendingClaim: "event_claim",
    PendingRelease: "claim_release",
}


def row_kind(row: PendingRow) -> str:
    """The kind of a pending row, as logs name it."""
    return _KINDS[type(row)]


class WriteBuffer:
    """Bounded FIFO of rows drained by one background task.

    ``write`` must write a whole batch in one transaction and be idempotent (a batch whose commit
    succeeded but whose acknowledgement was lost is written again). ``probe`` checks that the
    database answers; it runs with backoff while the store is down and nothing is queued.
    """

    def __init__(
        self,
        settings: StoreSettings,
        write: Callable[[list[PendingRow]], Awaitable[None]],
        probe: Callable[[], Awaitable[None]],
        *,
        batch_size: int = BATCH_SIZE,
    ) -> None:
        self._settings = settings
        self._write = write
        self._probe = probe
        self._batch_size = batch_size
        self._queue: deque[PendingRow] = deque()
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._up = True
        self._dropped = 0
        self._write_failures = 0
        self._drops_since_log: dict[str, int] = {}
        self._last_drop_log: dict[str, float] = {}

    # -- state -----------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Rows waiting to be written."""
        return len(self._queue)

    @property
    def dropped(self) -> int:
        """Rows this buffer refused because it was full (or closed)."""
        return self._dropped

    @property
    def write_failures(self) -> int:
        """Failed write attempts so far."""
        return self._write_failures

    @property
    def up(self) -> bool:
        """False from a failed database call until the next successful one."""
        return self._up

    def set_up(self, up: bool) -> None:
        """Record the outcome of a database call made outside the buffer (reads, claims, pings)."""
        if up != self._up:
            self._up = up
            self._wake.set()  # a down store with an empty queue starts probing
        metrics.STORE_UP.set(1 if up else 0)

    def pending(self) -> list[PendingRow]:
        """A snapshot of the queued rows, oldest first (reads merge them with what the DB has)."""
        return list(self._queue)

    # -- producer side -----------------------------------------------------------------------
    def put(self, row: PendingRow) -> bool:
        """Queue a row without waiting; False (counted and logged) when the buffer is full or closed."""
        if self._closed or len(self._queue) >= self._settings.buffer_size:
            self._drop(row)
            return False
        self._queue.append(row)
        self._idle.clear()
        self._wake.set()
        metrics.STORE_ROWS_BUFFERED.inc()
        metrics.STORE_BUFFERED.set(len(self._queue))
        return True

    def _drop(self, row: PendingRow) -> None:
        kind = row_kind(row)
        self._dropped += 1
        metrics.STORE_DROPPED.inc()
        self._drops_since_log[kind] = self._drops_since_log.get(kind, 0) + 1
        now = time.monotonic()
        # A long outage under load drops many rows: one line per kind every few seconds says
        # the same as one line per row.
        if now - self._last_drop_log.get(kind, -_DROP_LOG_INTERVAL_S) >= _DROP_LOG_INTERVAL_S:
            logger.warning(
                "store write buffer %s (%d rows): dropped %d %s row(s) (%d rows dropped in total)",
                "closed" if self._closed else "full",
                len(self._queue),
                self._drops_since_log[kind],
                kind,
                self._dropped,
            )
            self._drops_since_log[kind] = 0
            self._last_drop_log[kind] = now

    # -- consumer side -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the background writer (needs a running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="opsbot-store-writer")

    async def close(self, timeout_s: float) -> int:
        """Keep writing for up to ``timeout_s``, stop the writer, return how many rows were left."""
        self._closed = True
        if self._task is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    while self._queue:
                        await self._idle.wait()
            await stop_task(self._task)
            self._task = None
        metrics.STORE_BUFFERED.set(len(self._queue))
        return len(self._queue)

    async def _run(self) -> None:
        # Buffered rows are never given up: the policy's max_retries is ignored here (only its
        # backoff is used), since dropping them is what the buffer exists to avoid.
        budget = RetryBudget(self._settings.retry.model_copy(update={"max_retries": None}))
        last_warning = 0.0
        while True:
            if not self._queue:
                self._idle.set()
                if self._up:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                # Down with nothing to write: probe so reads and claims use the database again.
                await asyncio.sleep(budget.after_failure("store probe"))
                try:
                    await self._probe()
                except Exception as error:
                    logger.debug("store probe failed: %s", describe_cause(error))
                else:
                    budget.reset()
                    logger.info("database reachable again")
                    self.set_up(True)
                continue
            batch = list(itertools.islice(self._queue, self._batch_size))
            try:
                await self._write_batch(batch)
            except Exception as error:
                self._write_failures += 1
                metrics.STORE_WRITE_FAILURES.inc()
                delay = budget.after_failure("store write")
                attempt = budget.failures
                # Every attempt at DEBUG, but at WARNING only now and then: a long outage
                # should not flood the log with one line per retry.
                now = time.monotonic()
                level = logging.DEBUG
                if attempt == 1 or now - last_warning >= _FAILURE_LOG_INTERVAL_S:
                    level, last_warning = logging.WARNING, now
                logger.log(
                    level,
                    "store write of %d rows failed (attempt %d, %d rows buffered), retrying in %.2fs: %s",
                    len(batch),
                    attempt,
                    len(self._queue),
                    delay,
                    describe_cause(error),
                )
                self.set_up(False)
                await asyncio.sleep(delay)
                continue
            if budget.failures:
                logger.info(
                    "database reachable again after %d failed attempts; writing buffered rows",
                    budget.failures,
                )
            budget.reset()
            self.set_up(True)

    async def _write_batch(self, batch: list[PendingRow]) -> None:
        try:
            await self._write(batch)
        except Exception as error:
            if not is_row_error(error):
                raise  # transient: the batch stays at the head and is retried
            # The database refuses some row's data: one bad row must not hold back the rest
            # forever, so write them one by one and skip only the refused ones.
            for row in batch:
                try:
                    await self._write([row])
                except Exception as row_error:
                    if not is_row_error(row_error):
                        raise
                    self._skip(row, row_error)
                self._pop(1)
            return
        self._pop(len(batch))

    def _skip(self, row: PendingRow, error: BaseException) -> None:
        """Log and count a row the database refuses outright (retrying it could never succeed)."""
        self._dropped += 1
        metrics.STORE_DROPPED.inc()
        logger.error("store dropped a %s row the database refuses: %s", row_kind(row), describe_cause(error))

    def _pop(self, count: int) -> None:
        # Only this task removes rows and producers only append, so the head is still the batch.
        for _ in range(count):
            self._queue.popleft()
        metrics.STORE_BUFFERED.set(len(self._queue))
