"""The actions' rows in the store: one per proposal (whose ``state`` is the apply-once claim) and
an append-only trail of events (proposed, refused, approved, rejected, applied, failed, verified),
plus what ``opsbot audit`` lists and exports.

Every statement here runs at once (:meth:`Store.write_now`), never through the write buffer: a
decision has to be known before anything is applied, and when the database cannot be reached an
approval fails closed (refused, nothing applied) instead of being remembered in memory.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, insert, select, update
from sqlalchemy.engine import Connection

from bot.metrics import ACTION_EVENTS
from bot.store import Store
from bot.store.models import ActionEventRow, ActionRow
from bot.store.records import utcnow

_ACTIONS: Table = ActionRow.__table__  # type: ignore[assignment]
_EVENTS: Table = ActionEventRow.__table__  # type: ignore[assignment]


@dataclass
class ProposalRecord:
    """One proposal as stored (the columns of ``opsbot_actions``)."""

    id: str
    platform: str
    channel: str
    thread_id: str | None
    action: str
    target: str
    spec: str
    digest: str
    evidence: str
    diff: str
    summary: str
    risk: str
    asked_by: str | None
    proposed_by: str
    state: str
    created_at: datetime
    expires_at: datetime
    card_id: str | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    applied_at: datetime | None = None
    apply_ms: float | None = None
    result: str | None = None
    verified: str | None = None

    @property
    def evidence_lines(self) -> list[str]:
        """The cited evidence."""
        data = json.loads(self.evidence or "[]")
        return [str(line) for line in data] if isinstance(data, list) else []


@dataclass
class ActionEvent:
    """One line of the audit trail."""

    proposal_id: str
    at: datetime
    event: str
    platform: str | None
    user: str | None
    detail: str | None


class ActionAudit:
    """Proposals and their trail, in the bot's store."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def add(self, record: ProposalRecord) -> None:
        """Store a new proposal and its ``proposed`` event (one transaction)."""
        values = asdict(record)

        def work(conn: Connection) -> None:
            conn.execute(insert(_ACTIONS).values(**values))
            conn.execute(
                insert(_EVENTS).values(
                    **_event(record.id, "proposed", record.platform, record.asked_by, record.summary)
                )
            )

        await self.store.write_now(work)

    async def set_card(self, proposal_id: str, card_id: str) -> None:
        """Remember the card's post id (to edit it when the action is decided)."""
        stmt = update(_ACTIONS).where(_ACTIONS.c.id == proposal_id).values(card_id=card_id)
        await self.store.write_now(lambda conn: conn.execute(stmt))

    async def get(self, proposal_id: str) -> ProposalRecord | None:
        """The proposal, or ``None``."""
        rows = await self.store.read_now(select(_ACTIONS).where(_ACTIONS.c.id == proposal_id))
        return _record(rows[0]) if rows else None

    async def claim(self, proposal_id: str, user: str, decision: str, platform: str) -> bool:
        """Decide a proposal: True for the one call (of every replica and retry) whose UPDATE moved
        it from ``proposed`` before it expired; the event is written in the same transaction."""
        now = utcnow()
        state = "approving" if decision == "approve" else "rejected"
        stmt = (
            update(_ACTIONS)
            .where(
                and_(
                    _ACTIONS.c.id == proposal_id, _ACTIONS.c.state == "proposed", _ACTIONS.c.expires_at > now
                )
            )
            .values(state=state, decided_by=user, decided_at=now)
        )
        event = _event(proposal_id, "approved" if decision == "approve" else "rejected", platform, user, None)

        def work(conn: Connection) -> bool:
            if int(conn.execute(stmt).rowcount) != 1:
                return False
            conn.execute(insert(_EVENTS).values(**event))
            return True

        return await self.store.write_now(work)

    async def expire(self, proposal_id: str) -> bool:
        """Mark a proposal past its time as ``expired`` (once)."""
        stmt = (
            update(_ACTIONS)
            .where(and_(_ACTIONS.c.id == proposal_id, _ACTIONS.c.state == "proposed"))
            .values(state="expired")
        )
        return await self.store.write_now(lambda conn: int(conn.execute(stmt).rowcount) == 1)

    async def overdue(self, limit: int = 100) -> list[ProposalRecord]:
        """Proposals still ``proposed`` after their expiry (for the expiry sweep)."""
        stmt = (
            select(_ACTIONS)
            .where(and_(_ACTIONS.c.state == "proposed", _ACTIONS.c.expires_at <= utcnow()))
            .limit(limit)
        )
        return [_record(row) for row in await self.store.read_now(stmt)]

    async def finish(
        self, proposal_id: str, *, ok: bool, result: str, apply_ms: float, platform: str
    ) -> None:
        """Record the apply's outcome (``applied`` or ``failed``) and its event."""
        now = utcnow()
        state = "applied" if ok else "failed"
        stmt = (
            update(_ACTIONS)
            .where(_ACTIONS.c.id == proposal_id)
            .values(state=state, result=result, apply_ms=apply_ms, applied_at=now if ok else None)
        )
        event = _event(proposal_id, state, platform, None, result)

        def work(conn: Connection) -> None:
            conn.execute(stmt)
            conn.execute(insert(_EVENTS).values(**event))

        await self.store.write_now(work)

    async def verified(self, proposal_id: str, outcome: str, platform: str) -> None:
        """Record what verification saw."""
        stmt = update(_ACTIONS).where(_ACTIONS.c.id == proposal_id).values(verified=outcome)
        event = _event(proposal_id, "verified", platform, None, outcome)

        def work(conn: Connection) -> None:
            conn.execute(stmt)
            conn.execute(insert(_EVENTS).values(**event))

        await self.store.write_now(work)

    async def log(self, proposal_id: str, event: str, platform: str, user: str | None, detail: str) -> None:
        """Append one event (a refused click, say) to the trail."""
        values = _event(proposal_id[:64], event, platform, user, detail)
        await self.store.write_now(lambda conn: conn.execute(insert(_EVENTS).values(**values)))

    async def proposals(self, since: datetime | None = None, limit: int = 1000) -> list[ProposalRecord]:
        """Proposals, newest first."""
        stmt = select(_ACTIONS).order_by(_ACTIONS.c.created_at.desc()).limit(limit)
        if since is not None:
            stmt = stmt.where(_ACTIONS.c.created_at >= since)
        return [_record(row) for row in await self.store.read_now(stmt)]

    async def events(
        self, proposal_id: str | None = None, since: datetime | None = None
    ) -> list[ActionEvent]:
        """The trail, oldest first."""
        stmt = select(_EVENTS).order_by(_EVENTS.c.at, _EVENTS.c.id)
        if proposal_id is not None:
            stmt = stmt.where(_EVENTS.c.proposal_id == proposal_id)
        if since is not None:
            stmt = stmt.where(_EVENTS.c.at >= since)
        rows = await self.store.read_now(stmt)
        return [ActionEvent(r.proposal_id, r.at, r.event, r.platform, r.user, r.detail) for r in rows]


def _event(
    proposal_id: str, event: str, platform: str | None, user: str | None, detail: str | None
) -> dict[str, Any]:
    # counted when the row is made: a transaction that then fails is rare enough to overcount
    ACTION_EVENTS.labels(platform or "unknown", event).inc()
    return {
        "proposal_id": proposal_id,
        "at": utcnow(),
        "event": event,
        "platform": platform,
        "user": user,
        "detail": (detail or "")[:4000] or None,
    }


_COLUMNS = [f.name for f in fields(ProposalRecord)]


def _record(row: Any) -> ProposalRecord:
    return ProposalRecord(**{name: getattr(row, name) for name in _COLUMNS})


def export_rows(records: Sequence[ProposalRecord], events: Sequence[ActionEvent]) -> list[dict[str, Any]]:
    """Each proposal as plain data with its trail (what ``opsbot audit export`` writes)."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_id.setdefault(e.proposal_id, []).append(
            {
                "at": e.at.isoformat(),
                "event": e.event,
                "platform": e.platform,
                "user": e.user,
                "detail": e.detail,
            }
        )
    out = []
    for r in records:
        data = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(r).items()}
        data["evidence"] = r.evidence_lines
        data["events"] = by_id.get(r.id, [])
        out.append(data)
    return out


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    """One CSV line per proposal (events flattened to ``time event user`` lines in one cell)."""
    buf = io.StringIO()
    columns = [c for c in _COLUMNS if c not in ("spec",)] + ["events"]
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        flat = dict(row)
        flat["evidence"] = " | ".join(row.get("evidence", []))
        flat["events"] = " | ".join(
            f"{e['at']} {e['event']} {e['user'] or ''}".strip() for e in row.get("events", [])
        )
        writer.writerow(flat)
    return buf.getvalue()
