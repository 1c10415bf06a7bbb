"""The Store: everything opsbot keeps, behind one small async API.

Writes (requests, thread messages, alert threads, feedback) go through the :class:`WriteBuffer`
and never wait on the database. Reads used on the reply path degrade instead of failing while
the database is down: :meth:`Store.claim_event` falls back to an in-process set, thread reads
return what is still buffered. Statistics reads raise :class:`StoreError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import sqlalchemy
from sqlalchemy import Table, and_, bindparam, delete, func, or_, select, text, tuple_, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import AsyncEngine

from bot import metrics
from bot.config import StoreSettings, mask_url
from bot.event_loop import stop_task
from bot.redact import redact
from bot.store import migrate
from bot.store.buffer import (
    PendingClaim,
    PendingFeedback,
    PendingMessage,
    PendingRelease,
    PendingRow,
    WriteBuffer,
)
from bot.store.db import (
    SqliteWriter,
    StoreError,
    check_connection,
    create_engine,
    describe_cause,
    sqlite_writer,
    unreachable,
)
from bot.store.models import (
    AlertThreadRow,
    FeedbackRow,
    InvestigationStepRow,
    ProcessedEventRow,
    RequestRow,
    ThreadMessageRow,
    ThreadRow,
)
from bot.store.records import (
    AlertThread,
    Claim,
    LatencyStats,
    RatedRequest,
    RequestRecord,
    StepRecord,
    ThreadMessage,
    percentiles,
    utcnow,
)
from bot.types import clean_text

logger = logging.getLogger(__name__)

T = TypeVar("T")

EVENT_RETENTION = timedelta(days=7)
"""Processed-event keys older than this are pruned (platforms stop retrying within minutes)."""
_PRUNE_INTERVAL_S = 3600.0
_LOCAL_CLAIMS = 10_000
"""Recent event keys remembered in-process, for de-duplication while the database is down."""

_CLAIMS_PER_STATEMENT = 200
"""Claims in one INSERT at most (14 bound values each: far below SQLite's variable limit)."""

_REQUESTS: Table = RequestRow.__table__  # type: ignore[assignment]
_THREADS: Table = ThreadRow.__table__  # type: ignore[assignment]
_MESSAGES: Table = ThreadMessageRow.__table__  # type: ignore[assignment]
_EVENTS: Table = ProcessedEventRow.__table__  # type: ignore[assignment]
_ALERTS: Table = AlertThreadRow.__table__  # type: ignore[assignment]
_CLAIM_COLUMNS = tuple(column.name for column in _EVENTS.columns)
"""Every claim row names every column: rows of one multi-row INSERT must have the same keys."""
_FEEDBACK: Table = FeedbackRow.__table__  # type: ignore[assignment]
_STEPS: Table = InvestigationStepRow.__table__  # type: ignore[assignment]
_NOT_COLUMNS = frozenset({"steps"})
"""Record fields that are not columns of their row (a request's steps have their own table)."""
_RELEASE = (
    update(_EVENTS)
    .where(
        _EVENTS.c.platform == bindparam("r_platform"),
        _EVENTS.c.event_id == bindparam("r_event"),
        _EVENTS.c.owner == bindparam("r_owner"),
        _EVENTS.c.state == "answering",
    )
    .values(state="done", lease_until=None)
)
"""Ends one lease (answered): built once and run for a whole batch of releases as one executemany."""


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}
"""Each row dataclass's field names, looked up once."""


def _step_values(request_id: str, step: StepRecord) -> dict[str, Any]:
    """One step's row values (``index`` is the ``step`` column; text cleaned for PostgreSQL)."""
    return {
        "request_id": request_id,
        "step": step.index,
        "kind": step.kind,
        "status": step.status,
        "tool": step.tool,
        "arguments": clean_text(step.arguments) if step.arguments else step.arguments,
        "prompt_tokens": step.prompt_tokens,
        "cached_tokens": step.cached_tokens,
        "output_tokens": step.output_tokens,
        "ttft_ms": step.ttft_ms,
        "decode_ms": step.decode_ms,
        "tool_ms": step.tool_ms,
        "tool_tokens": step.tool_tokens,
        "summary": clean_text(step.summary),
        "source": clean_text(step.source)[:255],
    }


def _row_values(row: Any) -> dict[str, Any]:
    """A dataclass row's fields as statement values: a shallow copy (``asdict`` deep-copies every
    value, 2% of the event loop's time under a burst; rows are not changed once queued)."""
    names = _FIELD_NAMES.get(type(row))
    if names is None:
        names = _FIELD_NAMES[type(row)] = tuple(f.name for f in fields(row) if f.name not in _NOT_COLUMNS)
    return {name: getattr(row, name) for name in names}


async def _in_batches(waiting: list[T], write: Callable[[list[T]], Awaitable[None]]) -> None:
    """Hand what ``waiting`` holds to ``write`` in batches until it is empty. What joins within one
    event-loop turn (a burst's claims, its replies) shares a batch: one statement, one transaction."""
    while waiting:
        await asyncio.sleep(0)  # the rest of this loop turn's callers join the batch
        batch = waiting[:_CLAIMS_PER_STATEMENT]
        del waiting[: len(batch)]
        await write(batch)


class Store:
    """opsbot's storage (SQLite or PostgreSQL); create it with :meth:`open`, end it with :meth:`close`."""

    def __init__(
        self, engine: AsyncEngine, settings: StoreSettings, writer: SqliteWriter | None = None
    ) -> None:
        """Use :meth:`open`; this only wires the parts together (``writer``: where a SQLite file's
        write transactions run, see :meth:`_transact`)."""
        self._engine = engine
        self._writer = writer
        self._settings = settings
        self._dialect = engine.dialect.name
        self._where = mask_url(engine.url.render_as_string(hide_password=False))
        self._buffer = WriteBuffer(settings, self._write_batch, self._probe)
        self._local_claims: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._answering_threads: OrderedDict[tuple[str, str, str], float | None] = OrderedDict()
        """Threads this process has posted a reply in (recent ones), for :meth:`is_bot_thread`: the
        platform time of the earliest question answered there (``None``: unknown, as for a
        ``/rca``, whose thread begins with opsbot's own post)."""
        self._replies_waiting: list[tuple[str, str, str, str, bool]] = []
        """Claims to mark as replied (:meth:`mark_replied`): platform, event, channel, thread, moved."""
        self._reply_writer: asyncio.Future[None] | None = None
        self._claims_waiting: list[tuple[dict[str, Any], asyncio.Future[bool]]] = []
        """Claims for the next claim statement (:meth:`_claim`), with their callers' futures."""
        self._claim_writer: asyncio.Future[None] | None = None
        self._maintenance: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Future[Any]] = set()
        self.owner = f"{socket.gethostname()[:30]}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        """This process's name on the claims it leases (unique per start: a restarted replica is
        another owner, and finds its own earlier, dead claims like any other replica's)."""

    @classmethod
    async def open(cls, url: str, settings: StoreSettings, *, upgrade: bool = True) -> Store:
        """Connect to ``url``, migrate it to the newest schema unless ``upgrade`` is False, start the writer.

        Raises :class:`StoreError` (one line: masked URL and cause) when the database cannot be
        reached or migrated.
        """
        engine = create_engine(url, settings)
        if engine.dialect.name not in ("sqlite", "postgresql"):
            await engine.dispose()
            raise StoreError(
                f"unsupported database {mask_url(url)}: "
                "opsbot stores to sqlite+aiosqlite or postgresql+asyncpg URLs"
            )
        try:
            if upgrade:
                await migrate.upgrade_engine(engine)
            else:
                await check_connection(engine, settings.connect_timeout_s)
                async with engine.connect() as conn:
                    at = await conn.run_sync(migrate.revision_of)
                if at != migrate.head_revision():
                    logger.warning(
                        "database %s is at schema revision %s, this opsbot expects %s: "
                        "run `opsbot db upgrade`",
                        mask_url(url),
                        at or "none",
                        migrate.head_revision(),
                    )
        except BaseException:
            await engine.dispose()
            raise
        store = cls(engine, settings, sqlite_writer(engine, settings))
        store._buffer.start()
        store._maintenance = asyncio.get_running_loop().create_task(store._prune_forever())
        metrics.STORE_UP.set(1)
        logger.info("store open at %s", store._where)
        return store

    async def close(self, flush_timeout_s: float = 10.0) -> None:
        """Write what is buffered (for up to ``flush_timeout_s``), then release the database."""
        await stop_task(self._maintenance)
        if self._calls:  # database calls of cancelled callers finish and give their connection back
            await asyncio.wait(set(self._calls), timeout=self._settings.connect_timeout_s * 2)
        left = await self._buffer.close(flush_timeout_s)
        if left:
            logger.error(
                "store closed with %d buffered rows not written to %s (database unreachable for %.1fs)",
                left,
                self._where,
                flush_timeout_s,
            )
        if self._writer is not None:
            await self._writer.dispose()
        await self._engine.dispose()

    @property
    def buffered(self) -> int:
        """Rows waiting in memory to be written."""
        return self._buffer.size

    @property
    def dropped(self) -> int:
        """Rows lost because the write buffer was full."""
        return self._buffer.dropped

    @property
    def claim_lease_s(self) -> float:
        """Seconds a leased claim lasts unless renewed (``store.claim_lease_s``)."""
        return self._settings.claim_lease_s

    @property
    def engine(self) -> AsyncEngine:
        """The SQLAlchemy engine (for tests and maintenance scripts)."""
        return self._engine

    @property
    def write_engine(self) -> sqlalchemy.Engine:
        """The synchronous engine the store's write transactions run on (for tests: its events
        see every writing statement): the :class:`~bot.store.db.SqliteWriter`'s for a SQLite file,
        else :attr:`engine`'s."""
        return self._writer.engine if self._writer is not None else self._engine.sync_engine

    # -- health ----------------------------------------------------------------------------
    async def ping(self) -> bool:
        """True when the database answers ``SELECT 1`` within the connect timeout (readiness)."""
        try:
            await self._probe()
        except Exception as error:
            logger.debug("store ping failed: %s", describe_cause(error))
            self._buffer.set_up(False)
            return False
        self._buffer.set_up(True)
        return True

    async def _probe(self) -> None:
        async def probe() -> None:
            async with asyncio.timeout(self._settings.connect_timeout_s), self._engine.connect() as conn:
                await conn.execute(text("SELECT 1"))

        await self._call(probe())

    # -- de-duplication --------------------------------------------------------------------
    async def claim_event(self, platform: str, event_id: str, lease: Claim | None = None) -> bool:
        """True only for the first claim of ``(platform, event_id)``, across every replica.

        The claim is an INSERT that the table's primary key lets succeed once. With ``lease`` (an
        answer: its request id and where it goes) the claim is leased to this process for
        ``store.claim_lease_s`` (:meth:`renew_leases` keeps all of them; :meth:`release_claim` ends one).
        While the database is down, an in-process set decides (this replica keeps answering) and
        the claim is queued, unleased, so other replicas see it once the database is back.
        """
        key = (platform, event_id)
        if self._buffer.up:
            try:
                values: dict[str, Any] = dict.fromkeys(_CLAIM_COLUMNS)
                values.update(
                    platform=platform, event_id=event_id, created_at=utcnow(), state="done", replied=False
                )
                if lease is not None:
                    values.update(
                        state="answering",
                        owner=self.owner,
                        lease_until=utcnow() + timedelta(seconds=self._settings.claim_lease_s),
                        request_id=lease.request_id,
                        channel=lease.channel,
                        thread_id=lease.thread_id,
                        user=lease.user,
                        scenario=lease.scenario,
                        lane=lease.lane,
                    )
                won = await self._claim(values)
                self._remember(key)
                return won
            except Exception as error:
                self._read_failed("claim_event", error)
        if key in self._local_claims:
            return False
        self._remember(key)
        self._buffer.put(PendingClaim(platform, event_id))
        return True

    def mark_replied(
        self,
        platform: str,
        event_id: str,
        channel: str,
        thread_id: str,
        *,
        moved: bool,
        since: float | None = None,
    ) -> None:
        """The answer to the claimed event ``(platform, event_id)`` has posted its reply in
        ``thread_id`` (``moved``: a thread other than the one the claim names, as a ``/rca``
        starts its own): from now on messages there are follow-ups for opsbot, in this process at
        once and on every replica and bot worker once the claim row says so (:meth:`is_bot_thread`).

        Never waits: replies posted together (a burst) are marked in one transaction in the
        background, as claims are. A failed write leaves the thread to be recognised by its stored
        turns once the answer's rows are written.

        ``since``: the platform's time of the question answered (``IncomingMessage.posted_at``):
        posts of the thread from before it are not follow-ups, however late their turn comes
        (:meth:`is_bot_thread`); the earliest question's time is kept."""
        key = (platform, channel, thread_id)
        if key not in self._answering_threads:
            self._answering_threads[key] = since
        elif (known := self._answering_threads[key]) is not None:
            self._answering_threads[key] = None if since is None else min(known, since)
        self._answering_threads.move_to_end(key)
        while len(self._answering_threads) > _LOCAL_CLAIMS:
            self._answering_threads.popitem(last=False)
        if not self._buffer.up:
            return
        self._replies_waiting.append((platform, event_id, channel, thread_id, moved))
        if self._reply_writer is None or self._reply_writer.done():
            self._reply_writer = asyncio.ensure_future(
                _in_batches(self._replies_waiting, self._write_replied)
            )

    async def _write_replied(self, batch: list[tuple[str, str, str, str, bool]]) -> None:
        try:
            await self._call(self._mark_replied(batch))
        except Exception as error:
            logger.warning("%d claim(s) not marked as replied: %s", len(batch), describe_cause(error))

    async def _mark_replied(self, batch: list[tuple[str, str, str, str, bool]]) -> None:
        in_place: dict[str, list[str]] = {}
        for platform, event_id, _, _, moved in batch:
            if not moved:
                in_place.setdefault(platform, []).append(event_id)

        def mark(conn: Connection) -> None:
            for platform, event_ids in in_place.items():
                conn.execute(
                    update(_EVENTS)
                    .where(_EVENTS.c.platform == platform, _EVENTS.c.event_id.in_(event_ids))
                    .values(replied=True)
                )
            for platform, event_id, channel, thread_id, moved in batch:
                if moved:
                    conn.execute(
                        update(_EVENTS)
                        .where(_EVENTS.c.platform == platform, _EVENTS.c.event_id == event_id)
                        .values(replied=True, channel=channel, thread_id=thread_id)
                    )

        async with self._timeout():
            await self._transact(mark)

    async def _claim(self, values: dict[str, Any]) -> bool:
        """Whether the claim row ``values`` was inserted. Claims that arrive together (a burst of
        mentions) share one ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` in one transaction, one
        statement at a time: 64 claims of a burst as 64 transactions on SQLite took 150-220 ms for
        the last of them (each writer waiting out the others' write lock), as one ~10 ms."""
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._claims_waiting.append((values, future))
        if self._claim_writer is None or self._claim_writer.done():
            self._claim_writer = asyncio.ensure_future(_in_batches(self._claims_waiting, self._decide_claims))
        # A cancelled caller leaves the shared statement alone (its row may be inserted anyway:
        # then the event counts as taken, as with a single INSERT cancelled after it ran).
        return await asyncio.shield(future)

    async def _decide_claims(self, batch: list[tuple[dict[str, Any], asyncio.Future[bool]]]) -> None:
        try:
            won = await self._call(self._insert_claims([values for values, _ in batch]))
        except Exception as error:  # every claim of the batch falls back (claim_event)
            for _, future in batch:
                if not future.done():
                    future.set_exception(error)
            return
        for values, future in batch:
            key = (values["platform"], values["event_id"])
            if not future.done():
                future.set_result(key in won)
            won.discard(key)  # the same event twice in one batch: the first copy has it

    async def _insert_claims(self, rows: list[dict[str, Any]]) -> set[tuple[str, str]]:
        stmt = (
            self._insert(_EVENTS)
            .values(rows)
            .on_conflict_do_nothing(index_elements=["platform", "event_id"])
            .returning(_EVENTS.c.platform, _EVENTS.c.event_id)
        )

        def insert(conn: Connection) -> set[tuple[str, str]]:
            return {(str(platform), str(event_id)) for platform, event_id in conn.execute(stmt).all()}

        async with self._timeout():
            return await self._transact(insert)

    async def renew_leases(self) -> int:
        """Extend every lease this process holds by ``store.claim_lease_s`` from now, in one
        statement however many answers run; how many it renewed.

        Raises :class:`StoreError` when the database cannot be reached (the leases then run out
        unless a later renewal gets through).
        """
        stmt = (
            update(_EVENTS)
            .where(_EVENTS.c.owner == self.owner, _EVENTS.c.state == "answering")
            .values(lease_until=utcnow() + timedelta(seconds=self._settings.claim_lease_s))
        )
        try:
            return await self._call(self._execute(stmt))
        except Exception as error:
            raise unreachable(self._engine.url, error) from None

    async def release_claim(self, platform: str, event_id: str) -> None:
        """End this process's lease on an event (answered, or noted as stopped); never waits.

        Queued with the request row, so both land in one transaction: a replica killed before that
        write leaves an expired lease and no row, and another replica writes both.
        """
        self._buffer.put(PendingRelease(platform, event_id, self.owner))

    async def expired_claims(self, limit: int = 100) -> list[Claim]:
        """Other processes' leased claims whose lease ran out (their replica died mid-answer), oldest first.

        Raises :class:`StoreError` when the database cannot be read (the sweeper tries again later).
        """
        stmt = (
            select(_EVENTS)
            .where(
                _EVENTS.c.state == "answering",
                _EVENTS.c.lease_until < utcnow(),
                # This process's own answers are alive as long as it is.
                _EVENTS.c.owner != self.owner,
            )
            .order_by(_EVENTS.c.lease_until)
            .limit(limit)
        )

        try:
            rows = await self._call(self._all(stmt))
        except Exception as error:
            raise unreachable(self._engine.url, error) from None
        return [
            Claim(
                r.platform,
                r.event_id,
                r.request_id,
                r.channel,
                r.thread_id,
                r.user,
                r.scenario,
                r.lane,
                r.owner,
                r.lease_until,
            )
            for r in rows
        ]

    async def take_over_claim(self, claim: Claim) -> bool:
        """Mark an expired claim ``interrupted`` for this process; True for exactly one replica.

        The update only matches while the claim is still ``answering`` with its lease run out, so
        two sweepers never both note the same answer. Raises :class:`StoreError` when unreachable.
        """
        stmt = (
            update(_EVENTS)
            .where(
                _EVENTS.c.platform == claim.platform,
                _EVENTS.c.event_id == claim.event_id,
                _EVENTS.c.state == "answering",
                _EVENTS.c.lease_until < utcnow(),
            )
            .values(state="interrupted", owner=self.owner, lease_until=None)
        )
        try:
            return await self._call(self._execute(stmt)) == 1
        except Exception as error:
            raise unreachable(self._engine.url, error) from None

    def _remember(self, key: tuple[str, str]) -> None:
        self._local_claims[key] = None
        self._local_claims.move_to_end(key)
        while len(self._local_claims) > _LOCAL_CLAIMS:
            self._local_claims.popitem(last=False)

    async def prune_events(self, older_than: timedelta = EVENT_RETENTION) -> int:
        """Delete processed-event keys older than ``older_than``; return how many went."""
        return await self._call(
            self._execute(delete(_EVENTS).where(_EVENTS.c.created_at < utcnow() - older_than))
        )

    async def _prune_forever(self) -> None:
        while True:
            try:
                pruned = await self.prune_events()
            except Exception as error:
                logger.warning("pruning processed events failed: %s", describe_cause(error))
            else:
                logger.debug("pruned %d processed events", pruned)
            await asyncio.sleep(_PRUNE_INTERVAL_S)

    # -- buffered writes -------------------------------------------------------------------
    async def record_request(self, record: RequestRecord) -> None:
        """Queue one request row (never raises, never waits on the database)."""
        if record.error:  # error texts quote platform and engine messages
            record.error = clean_text(redact(record.error, where="store"))
        self._buffer.put(record)

    async def append_message(
        self,
        platform: str,
        channel: str,
        thread_id: str,
        role: str,
        content: str,
        *,
        user: str | None = None,
        request_id: str | None = None,
    ) -> None:
        """Queue one turn of a thread (``role``: ``user`` or ``assistant``).

        ``content`` is redacted here once more, whoever the caller: the last gate before a row (a
        count under ``opsbot_secrets_redacted_total{where="store"}`` means a caller forgot).
        """
        # clean_text: a model's answer may hold a NUL (PostgreSQL text refuses it) or a lone surrogate.
        content = redact(content, where="store")
        if isinstance(content, str):
            content = clean_text(content)
        self._buffer.put(PendingMessage(platform, channel, thread_id, role, content, user, request_id))

    async def save_alert_thread(self, thread: AlertThread) -> None:
        """Queue the thread that carries an alert group (a later save for the key replaces it)."""
        self._buffer.put(AlertThread(**asdict(thread)))

    async def open_alert_thread(self, thread: AlertThread) -> AlertThread | None:
        """Claim an alert group for this process: ``None`` when this call created the group's row
        (status ``opening``: post the header, then :meth:`update_alert_thread` with its thread id),
        else the row some replica already has (possibly still ``opening``). A row that stayed
        ``opening`` for longer than ``store.claim_lease_s`` is taken over (its replica died).

        One INSERT the primary key lets succeed once, so two replicas receiving the same webhook
        never both open a thread. While the database is down only this process's view decides.
        """
        if self._buffer.up:
            now = utcnow()
            values = {**_alert_values(thread), "status": "opening", "updated_at": now}
            stmt = self._insert(_ALERTS).values(**values)
            # A row left 'opening' longer than a lease belongs to a replica that died (or failed to
            # post) before the header was out: it is taken over, so the group is never stuck.
            stale = now - timedelta(seconds=self._settings.claim_lease_s)
            stmt = stmt.on_conflict_do_update(
                index_elements=["group_key"],
                set_={name: stmt.excluded[name] for name in values if name != "group_key"},
                where=and_(_ALERTS.c.status == "opening", _ALERTS.c.updated_at < stale),
            )
            try:
                if await self._call(self._execute(stmt)) == 1:
                    return None
            except Exception as error:
                self._read_failed("open_alert_thread", error)
            else:
                found = await self.get_alert_thread(thread.group_key)
                if found is not None:
                    return found
        found = await self.get_alert_thread(thread.group_key)
        if found is None:
            await self.save_alert_thread(AlertThread(**{**asdict(thread), "status": "opening"}))
        return found

    async def update_alert_thread(self, thread: AlertThread, *, expect: AlertThread | None = None) -> bool:
        """Write ``thread``'s thread id, status and firing set; with ``expect``, only if the stored
        status and firing set are still ``expect``'s (compare-and-set): True for exactly one of two
        replicas making the same change, so a resolve note is posted once.

        While the database is down the change is queued and this process's view decides (True).
        """
        if self._buffer.up:
            stmt = update(_ALERTS).where(_ALERTS.c.group_key == thread.group_key)
            if expect is not None:
                stmt = stmt.where(_ALERTS.c.status == expect.status)
                previous = _alert_values(expect)["firing"]
                stmt = stmt.where(
                    _ALERTS.c.firing.is_(None) if previous is None else _ALERTS.c.firing == previous
                )
            values = _alert_values(thread)
            stmt = stmt.values(
                thread_id=values["thread_id"],
                status=values["status"],
                firing=values["firing"],
                updated_at=utcnow(),
            )
            try:
                return await self._call(self._execute(stmt)) == 1
            except Exception as error:
                self._read_failed("update_alert_thread", error)
        await self.save_alert_thread(thread)
        return True

    async def record_feedback(self, request_id: str, platform: str, user: str | None, value: int) -> None:
        """Queue a vote (+1 / -1) on an answer; a user's second vote on it replaces the first."""
        self._buffer.put(PendingFeedback(request_id, platform, user, value))

    # -- direct statements (bot.actions: decisions that must be known now, never buffered) ----
    async def write_now(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` as one write transaction now, not through the buffer (an approval's claim
        must be decided before anything is applied). Raises :class:`StoreError` when the database
        cannot be used: a decision then fails closed."""
        try:
            return await self._call(self._timed(self._transact(work)))
        except StoreError:
            raise
        except Exception as error:
            raise unreachable(self._engine.url, error) from error

    async def read_now(self, stmt: Any) -> list[Any]:
        """Every row of a query; :class:`StoreError` when the database cannot be used."""
        try:
            return await self._call(self._all(stmt))
        except Exception as error:
            raise unreachable(self._engine.url, error) from error

    async def _timed(self, work: Awaitable[T]) -> T:
        async with self._timeout():
            return await work

    # -- thread reads ----------------------------------------------------------------------
    async def thread_history(
        self, platform: str, channel: str, thread_id: str, limit: int = 50
    ) -> list[ThreadMessage]:
        """The last ``limit`` turns of a thread, oldest first, including turns still buffered."""
        pending = [
            row
            for row in self._buffer.pending()
            if isinstance(row, PendingMessage)
            and (row.platform, row.channel, row.thread_id) == (platform, channel, thread_id)
        ]
        stored: list[tuple[str, ThreadMessage]] = []
        if self._buffer.up:
            try:
                rows = await self._call(
                    self._all(
                        select(
                            _MESSAGES.c.message_id,
                            _MESSAGES.c.role,
                            _MESSAGES.c.content,
                            _MESSAGES.c.user,
                            _MESSAGES.c.created_at,
                            _MESSAGES.c.request_id,
                        )
                        .join(_THREADS, _THREADS.c.id == _MESSAGES.c.thread_pk)
                        .where(self._thread_is(platform, channel, thread_id))
                        .order_by(_MESSAGES.c.created_at.desc(), _MESSAGES.c.id.desc())
                        .limit(limit)
                    )
                )
                stored = [
                    (r.message_id, ThreadMessage(r.role, r.content, r.user, r.created_at, r.request_id))
                    for r in reversed(rows)
                ]
            except Exception as error:
                self._read_failed("thread_history", error)
        else:
            logger.warning(
                "database down: thread %s/%s/%s history has only the %d buffered turns",
                platform,
                channel,
                thread_id,
                len(pending),
            )
        seen = {message_id for message_id, _ in stored}
        merged = [message for _, message in stored] + [
            ThreadMessage(p.role, p.content, p.user, p.created_at, p.request_id)
            for p in pending
            if p.message_id not in seen
        ]
        merged.sort(key=lambda m: m.created_at)  # stable: equal times keep stored-then-buffered order
        return merged[-limit:] if limit > 0 else []

    async def is_bot_thread(
        self, platform: str, channel: str, thread_id: str, posted_at: float | None = None
    ) -> bool:
        """True when opsbot has posted a reply in this thread, on any replica or bot worker (the
        claim is marked as soon as the reply is posted: :meth:`mark_replied`), or answered in it
        (an ``assistant`` turn is stored or buffered). Messages from before the reply (a question
        being asked, people talking) are not follow-ups. The turns alone came too late: a
        follow-up that reached another worker before the first answer's rows were written was
        ignored.

        ``posted_at`` (the platform's time of the message asking, ``IncomingMessage.posted_at``):
        a message posted before the question this process answers there is not a follow-up, also
        when its check ends after the reply was marked (a burst of posts in a thread: the reply
        to the mention among them can be marked while the checks of the posts before it still
        wait for the database). A reply marked by another worker or replica carries no time: the
        database says only that the thread is opsbot's."""
        key = (platform, channel, thread_id)
        if key in self._answering_threads:
            return not self._posted_before_question(key, posted_at)
        for row in self._buffer.pending():
            if (
                isinstance(row, PendingMessage)
                and row.role == "assistant"
                and (row.platform, row.channel, row.thread_id) == (platform, channel, thread_id)
            ):
                return True
        if not self._buffer.up:
            logger.warning(
                "database down: is_bot_thread(%s/%s/%s) sees only buffered turns",
                platform,
                channel,
                thread_id,
            )
            return False
        claimed = (
            select(_EVENTS.c.event_id)
            .where(
                _EVENTS.c.platform == platform,
                _EVENTS.c.channel == channel,
                _EVENTS.c.thread_id == thread_id,
                _EVENTS.c.replied.is_(True),
            )
            .limit(1)
        )
        answered = (
            select(_MESSAGES.c.id)
            .join(_THREADS, _THREADS.c.id == _MESSAGES.c.thread_pk)
            .where(self._thread_is(platform, channel, thread_id), _MESSAGES.c.role == "assistant")
            .limit(1)
        )
        try:
            hit = await self._call(self._first(select(or_(claimed.exists(), answered.exists()))))
        except Exception as error:
            self._read_failed("is_bot_thread", error)
            return False
        # Marked here while the read waited: the mark may be the very reply the read saw.
        return bool(hit is not None and hit[0]) and not self._posted_before_question(key, posted_at)

    def _posted_before_question(self, key: tuple[str, str, str], posted_at: float | None) -> bool:
        """Whether a message at ``posted_at`` came no later than the question this process
        answers in thread ``key`` (False where either time is unknown)."""
        since = self._answering_threads.get(key)
        return posted_at is not None and since is not None and posted_at <= since

    async def get_alert_thread(self, group_key: str) -> AlertThread | None:
        """The thread saved for an alert group (a buffered save wins: it is the newest)."""
        for row in reversed(self._buffer.pending()):
            if isinstance(row, AlertThread) and row.group_key == group_key:
                return AlertThread(**asdict(row))
        if not self._buffer.up:
            logger.warning("database down: no buffered thread for alert group %s", group_key)
            return None
        try:
            found = await self._call(self._first(select(_ALERTS).where(_ALERTS.c.group_key == group_key)))
        except Exception as error:
            self._read_failed("get_alert_thread", error)
            return None
        return None if found is None else _alert_thread(found)

    async def alert_thread_at(self, platform: str, channel: str, thread_id: str) -> AlertThread | None:
        """The alert thread that is this chat thread, if any (questions asked in an alert's thread)."""
        for row in reversed(self._buffer.pending()):
            if isinstance(row, AlertThread) and (row.platform, row.channel, row.thread_id) == (
                platform,
                channel,
                thread_id,
            ):
                return AlertThread(**asdict(row))
        if not self._buffer.up:
            return None
        try:
            found = await self._call(
                self._first(
                    select(_ALERTS).where(
                        _ALERTS.c.platform == platform,
                        _ALERTS.c.channel == channel,
                        _ALERTS.c.thread_id == thread_id,
                    )
                )
            )
        except Exception as error:
            self._read_failed("alert_thread_at", error)
            return None
        return None if found is None else _alert_thread(found)

    # -- statistics ------------------------------------------------------------------------
    async def latency_stats(self, since: datetime, until: datetime | None = None) -> list[LatencyStats]:
        """Per (scenario, platform): request count, errors (status not ``ok``) and P50/P90/P99 of
        TTFT, TPOT, queue and end-to-end ms, over requests created in ``[since, until)``.

        Percentiles are computed here over the rows of the window (same numbers on SQLite and
        PostgreSQL). Rows still buffered count too. Raises :class:`StoreError` if the database
        cannot be read.
        """
        columns = (
            _REQUESTS.c.request_id,
            _REQUESTS.c.scenario,
            _REQUESTS.c.platform,
            _REQUESTS.c.status,
            _REQUESTS.c.ttft_ms,
            _REQUESTS.c.tpot_ms,
            _REQUESTS.c.queue_ms,
            _REQUESTS.c.e2e_ms,
        )
        window = [_REQUESTS.c.created_at >= since]
        if until is not None:
            window.append(_REQUESTS.c.created_at < until)
        # Buffered rows first: a row the writer commits while the query runs is then either in
        # this snapshot or in the query's result, never in neither.
        pending = self._pending_requests(since, until)
        try:
            stored = await self._call(self._all(select(*columns).where(*window)))
        except Exception as error:
            raise unreachable(self._engine.url, error) from None
        rows: dict[str, tuple[str, str, str, float | None, float | None, float | None, float | None]] = {
            r.request_id: (r.scenario, r.platform, r.status, r.ttft_ms, r.tpot_ms, r.queue_ms, r.e2e_ms)
            for r in stored
        }
        for p in pending:
            rows[p.request_id] = (
                p.scenario,
                p.platform,
                p.status,
                p.ttft_ms,
                p.tpot_ms,
                p.queue_ms,
                p.e2e_ms,
            )
        groups: dict[
            tuple[str, str], list[tuple[str, float | None, float | None, float | None, float | None]]
        ] = {}
        for scenario, platform, *rest in rows.values():
            groups.setdefault((scenario, platform), []).append(tuple(rest))  # type: ignore[arg-type]
        result = []
        for (scenario, platform), members in sorted(groups.items()):
            by_status: dict[str, int] = {}
            for status, *_ in members:
                by_status[status] = by_status.get(status, 0) + 1

            def column(index: int, members: Sequence[tuple[Any, ...]] = members) -> list[float]:
                return [float(m[index]) for m in members if m[index] is not None]

            result.append(
                LatencyStats(
                    scenario=scenario,
                    platform=platform,
                    count=len(members),
                    errors=len(members) - by_status.get("ok", 0),
                    ttft_ms=percentiles(column(1)),
                    tpot_ms=percentiles(column(2)),
                    queue_ms=percentiles(column(3)),
                    e2e_ms=percentiles(column(4)),
                    by_status=dict(sorted(by_status.items())),
                )
            )
        return result

    async def recent_ttft(self, since: datetime) -> list[float]:
        """TTFT (ms) of every request created since ``since`` that has one (stored or buffered).

        While the database is down this is only the buffered requests (logged at WARNING).
        """
        pending = {
            p.request_id: p.ttft_ms for p in self._pending_requests(since, None) if p.ttft_ms is not None
        }
        stored: dict[str, float] = {}
        if self._buffer.up:
            try:
                rows = await self._call(
                    self._all(
                        select(_REQUESTS.c.request_id, _REQUESTS.c.ttft_ms).where(
                            _REQUESTS.c.created_at >= since, _REQUESTS.c.ttft_ms.is_not(None)
                        )
                    )
                )
                stored = {r.request_id: float(r.ttft_ms) for r in rows}
            except Exception as error:
                self._read_failed("recent_ttft", error)
        else:
            logger.warning("database down: recent_ttft covers only the %d buffered requests", len(pending))
        stored.update(pending)
        return list(stored.values())

    async def requests_between(self, since: datetime, until: datetime | None = None) -> list[RequestRecord]:
        """Every request created in ``[since, until)``, stored or still buffered, oldest first, for
        statistics (``opsbot stats``, ``/rca status``); ``error`` texts and replay inputs are left out
        (``None``).

        Raises :class:`StoreError` if the database cannot be read.
        """
        names = [
            f.name for f in fields(RequestRecord) if f.name not in ("error", "replay_inputs", *_NOT_COLUMNS)
        ]
        window = [_REQUESTS.c.created_at >= since]
        if until is not None:
            window.append(_REQUESTS.c.created_at < until)
        # Buffered rows first, as in latency_stats: a row committed meanwhile is then in one of both.
        pending = self._pending_requests(since, until)
        try:
            stored = await self._call(
                self._all(
                    select(*(_REQUESTS.c[name] for name in names))
                    .where(*window)
                    .order_by(_REQUESTS.c.created_at)
                )
            )
        except Exception as error:
            raise unreachable(self._engine.url, error) from None
        rows = {r.request_id: RequestRecord(**{name: getattr(r, name) for name in names}) for r in stored}
        for p in pending:
            rows[p.request_id] = RequestRecord(
                **{**asdict(p), "steps": list(p.steps), "error": None, "replay_inputs": None}
            )
        return sorted(rows.values(), key=lambda r: _aware(r.created_at))

    async def steps_between(self, since: datetime, until: datetime | None = None) -> list[StepRecord]:
        """The investigation steps of requests created in ``[since, until)``, stored or buffered, in
        request then step order (``opsbot stats``); ``request_id`` set on each.

        Raises :class:`StoreError` if the database cannot be read.
        """
        window = [_REQUESTS.c.created_at >= since]
        if until is not None:
            window.append(_REQUESTS.c.created_at < until)
        pending = {r.request_id: r for r in self._pending_requests(since, until) if r.steps}
        columns = [c for c in _STEPS.c if c.name != "step"]
        try:
            stored = await self._call(
                self._all(
                    select(_STEPS.c.step, *columns)
                    .join(_REQUESTS, _REQUESTS.c.request_id == _STEPS.c.request_id)
                    .where(*window)
                    .order_by(_REQUESTS.c.created_at, _STEPS.c.request_id, _STEPS.c.step)
                )
            )
        except Exception as error:
            raise unreachable(self._engine.url, error) from None
        steps = [
            StepRecord(index=r.step, **{c.name: getattr(r, c.name) for c in columns})
            for r in stored
            if r.request_id not in pending
        ]
        for request_id, record in pending.items():
            steps += [replace(step, request_id=request_id) for step in record.steps]
        return steps

    async def rated_requests(self, since: datetime, until: datetime | None = None) -> list[RatedRequest]:
        """Requests created in ``[since, until)`` that someone voted on, oldest first, with their
        replay inputs, answer text and votes (``opsbot feedback export``). Reads the database only
        (call after the votes were written). Raises :class:`StoreError` if it cannot be read."""
        window = [_REQUESTS.c.created_at >= since]
        if until is not None:
            window.append(_REQUESTS.c.created_at < until)
        answer = (
            select(_MESSAGES.c.content)
            .where(_MESSAGES.c.request_id == _REQUESTS.c.request_id, _MESSAGES.c.role == "assistant")
            .order_by(_MESSAGES.c.id.desc())
            .limit(1)
            .scalar_subquery()
        )
        try:
            async with self._timeout(), self._engine.connect() as conn:
                rows = (
                    await conn.execute(
                        select(
                            _REQUESTS.c.request_id,
                            _REQUESTS.c.scenario,
                            _REQUESTS.c.model,
                            _REQUESTS.c.status,
                            _REQUESTS.c.created_at,
                            _REQUESTS.c.replay_inputs,
                            answer.label("answer"),
                            _FEEDBACK.c.user,
                            _FEEDBACK.c.value,
                        )
                        .join(_FEEDBACK, _FEEDBACK.c.request_id == _REQUESTS.c.request_id)
                        .where(*window)
                        .order_by(_REQUESTS.c.created_at, _REQUESTS.c.request_id)
                    )
                ).all()
        except Exception as error:
            raise unreachable(self._engine.url, error) from None
        rated: dict[str, RatedRequest] = {}
        for r in rows:
            item = rated.get(r.request_id)
            if item is None:
                item = rated[r.request_id] = RatedRequest(
                    r.request_id, r.scenario, r.model, r.status, r.created_at, r.replay_inputs, r.answer
                )
            item.votes[r.user] = int(r.value)
        return list(rated.values())

    async def count_requests(self) -> int:
        """Request rows in the database (not counting buffered ones)."""
        async with self._engine.connect() as conn:
            return int(await conn.scalar(select(func.count()).select_from(_REQUESTS)) or 0)

    def _pending_requests(self, since: datetime, until: datetime | None) -> list[RequestRecord]:
        since = _aware(since)
        until = None if until is None else _aware(until)
        return [
            row
            for row in self._buffer.pending()
            if isinstance(row, RequestRecord)
            and _aware(row.created_at) >= since
            and (until is None or _aware(row.created_at) < until)
        ]

    # -- helpers ---------------------------------------------------------------------------
    async def _call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run one database call so that cancelling the caller never interrupts it half-way.

        A cancel that lands while a pooled connection is being used or given back (a shutdown
        cancelling an answer, then the answer's own timeout cancelling it again) makes SQLAlchemy
        throw the connection away; an aiosqlite connection thrown away that way is never closed (its
        close task stays pending and the garbage collector finalises the connection later). So the
        call runs in its own task, bounded by :meth:`_timeout`: the caller's cancel goes on at once,
        the call finishes on its own and returns its connection, and :meth:`close` waits for it.
        """
        task = asyncio.ensure_future(work)
        self._calls.add(task)
        task.add_done_callback(self._call_done)
        return await asyncio.shield(task)

    def _call_done(self, task: asyncio.Future[Any]) -> None:
        self._calls.discard(task)
        if not task.cancelled():
            task.exception()  # a cancelled caller never reads it: mark it retrieved

    async def _execute(self, stmt: Any) -> int:
        """Execute one writing statement in its own transaction; its row count."""
        async with self._timeout():
            return await self._transact(lambda conn: int(conn.execute(stmt).rowcount))

    async def _transact(self, work: Callable[[Connection], T]) -> T:
        """Run ``work`` (statements on a synchronous connection) as one write transaction.

        The one way the store writes. A SQLite file's transactions run whole on the
        :class:`~bot.store.db.SqliteWriter`'s thread, so SQLite's write lock is never held across
        event-loop turns (other bot processes on the file would wait that out); PostgreSQL's run on
        the async engine (``run_sync``: each statement awaited on this loop, no lock shared
        across processes beyond the rows a statement touches)."""
        if self._writer is not None:
            return await self._writer.run(work)
        async with self._engine.begin() as conn:
            return await conn.run_sync(work)

    async def _first(self, stmt: Any) -> Any:
        """The first row of a query, or ``None``."""
        async with self._timeout(), self._engine.connect() as conn:
            return (await conn.execute(stmt)).first()

    async def _all(self, stmt: Any) -> list[Any]:
        """Every row of a query."""
        async with self._timeout(), self._engine.connect() as conn:
            return list((await conn.execute(stmt)).all())

    def _timeout(self) -> asyncio.Timeout:
        # Connecting may take connect_timeout_s; the statement itself gets as long again.
        return asyncio.timeout(self._settings.connect_timeout_s * 2)

    def _read_failed(self, what: str, error: BaseException) -> None:
        logger.warning(
            "database %s unreachable during %s, using what is in memory: %s",
            self._where,
            what,
            describe_cause(error),
        )
        self._buffer.set_up(False)

    def _insert(self, table: Table) -> Any:
        """INSERT with ON CONFLICT support in the engine's dialect."""
        return pg_insert(table) if self._dialect == "postgresql" else sqlite_insert(table)

    @staticmethod
    def _thread_is(platform: str, channel: str, thread_id: str) -> Any:
        return and_(
            _THREADS.c.platform == platform, _THREADS.c.channel == channel, _THREADS.c.thread_id == thread_id
        )

    async def _write_batch(self, batch: list[PendingRow]) -> None:
        """Write a batch in one transaction; every statement is an upsert or insert-or-ignore."""
        requests: dict[str, RequestRecord] = {}
        messages: list[PendingMessage] = []
        claims: dict[tuple[str, str], PendingClaim] = {}
        releases: list[PendingRelease] = []
        alerts: dict[str, AlertThread] = {}
        feedback: dict[tuple[str, str, str], PendingFeedback] = {}
        # The last write of a key wins; PostgreSQL refuses one statement updating a row twice.
        for row in batch:
            if isinstance(row, RequestRecord):
                requests[row.request_id] = row
            elif isinstance(row, PendingMessage):
                messages.append(row)
            elif isinstance(row, PendingClaim):
                claims.setdefault((row.platform, row.event_id), row)
            elif isinstance(row, AlertThread):
                alerts[row.group_key] = row
            elif isinstance(row, PendingRelease):
                releases.append(row)
            else:
                feedback[(row.request_id, row.platform, row.user or "")] = row
        # Statement values are built here, on the event loop: the transaction itself only executes.
        request_values = [_row_values(r) for r in requests.values()]
        stepped = [r.request_id for r in requests.values() if r.steps]
        step_values = [_step_values(r.request_id, step) for r in requests.values() for step in r.steps]
        claim_values = [_row_values(c) for c in claims.values()]
        release_values = [
            {"r_platform": r.platform, "r_event": r.event_id, "r_owner": r.owner} for r in releases
        ]
        alert_values = [{**_alert_values(a), "updated_at": utcnow()} for a in alerts.values()]
        feedback_values = [{**asdict(f), "user": f.user or ""} for f in feedback.values()]

        def write(conn: Connection) -> None:
            if request_values:
                self._upsert(conn, _REQUESTS, request_values, ["request_id"])
            if stepped:  # a retried batch rewrites its steps: delete, then insert
                conn.execute(delete(_STEPS).where(_STEPS.c.request_id.in_(stepped)))
                conn.execute(self._insert(_STEPS), step_values)
            if claim_values:
                stmt = self._insert(_EVENTS).on_conflict_do_nothing(index_elements=["platform", "event_id"])
                conn.execute(stmt, claim_values)
            if release_values:  # one statement for the batch's releases (executemany)
                conn.execute(_RELEASE, release_values)
            if messages:
                self._write_messages(conn, messages)
            if alert_values:
                self._upsert(conn, _ALERTS, alert_values, ["group_key"])
            if feedback_values:
                self._upsert(conn, _FEEDBACK, feedback_values, ["request_id", "platform", "user"])

        await self._transact(write)

    def _upsert(self, conn: Connection, table: Table, values: list[dict[str, Any]], key: list[str]) -> None:
        stmt = self._insert(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=key,
            set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name not in key},
        )
        conn.execute(stmt, values)

    def _write_messages(self, conn: Connection, messages: list[PendingMessage]) -> None:
        keys = {(m.platform, m.channel, m.thread_id): m.created_at for m in reversed(messages)}
        conn.execute(
            self._insert(_THREADS).on_conflict_do_nothing(
                index_elements=["platform", "channel", "thread_id"]
            ),
            [
                {"platform": p, "channel": c, "thread_id": t, "created_at": at}
                for (p, c, t), at in keys.items()
            ],
        )
        found = conn.execute(
            select(_THREADS.c.id, _THREADS.c.platform, _THREADS.c.channel, _THREADS.c.thread_id).where(
                # one IN over (platform, channel, thread_id): its statement compiles once, however
                # many threads the batch holds (an OR of N conditions compiled anew per batch)
                tuple_(_THREADS.c.platform, _THREADS.c.channel, _THREADS.c.thread_id).in_(list(keys))
            )
        )
        ids = {(r.platform, r.channel, r.thread_id): r.id for r in found}
        conn.execute(
            self._insert(_MESSAGES).on_conflict_do_nothing(index_elements=["message_id"]),
            [
                {
                    "message_id": m.message_id,
                    "thread_pk": ids[(m.platform, m.channel, m.thread_id)],
                    "role": m.role,
                    "content": m.content,
                    "user": m.user,
                    "request_id": m.request_id,
                    "created_at": m.created_at,
                }
                for m in messages
            ],
        )


def _alert_values(thread: AlertThread) -> dict[str, Any]:
    """Column values of an alert thread (the firing set as a sorted JSON list, comparable as text)."""
    values = asdict(thread)
    values["firing"] = None if thread.firing is None else json.dumps(sorted(set(thread.firing)))
    return values


def _alert_thread(row: Any) -> AlertThread:
    firing = None
    if row.firing is not None:
        with contextlib.suppress(ValueError, TypeError):
            firing = [str(f) for f in json.loads(row.firing)]
    return AlertThread(row.group_key, row.platform, row.channel, row.thread_id, row.status, firing)


def _aware(moment: datetime) -> datetime:
    """Naive datetimes are taken as UTC (as the database columns take them)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment
