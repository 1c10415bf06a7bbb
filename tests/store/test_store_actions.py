"""The actions' rows: a proposal is decided by exactly one claim across replicas (two stores on one
database), never after it expired, and the audit trail exports as JSON and CSV."""

from __future__ import annotations

import asyncio
import csv
import io
import json
from datetime import timedelta

from bot.actions.audit import ActionAudit, ProposalRecord, export_rows, to_csv
from bot.actions.catalog import ActionSpec
from bot.config import StoreSettings
from bot.store import Store
from bot.store.records import utcnow


def _proposal(pid: str, expires_in_s: float = 600) -> ProposalRecord:
    spec = ActionSpec("cordon", {"kind": "node", "name": "worker-1"})
    now = utcnow()
    return ProposalRecord(
        id=pid,
        platform="slack",
        channel="C1",
        thread_id=None,
        action=spec.action,
        target=spec.target,
        spec=spec.canonical(),
        digest=spec.digest(),
        evidence=json.dumps(["disk 97%"]),
        diff="+ unschedulable",
        summary="spec.unschedulable = true",
        risk="low",
        asked_by="U1",
        proposed_by="command",
        state="proposed",
        created_at=now,
        expires_at=now + timedelta(seconds=expires_in_s),
    )


async def test_one_claim_wins_across_two_replicas_and_many_concurrent_clicks(
    store: Store, db_url: str, store_settings: StoreSettings
) -> None:
    other = await Store.open(db_url, store_settings)
    try:
        replicas = [ActionAudit(store), ActionAudit(other)]
        await replicas[0].add(_proposal("p1"))
        results = await asyncio.gather(
            *(replicas[i % 2].claim("p1", f"U{i}", "approve", "slack") for i in range(20))
        )
        assert sum(results) == 1
        record = await replicas[1].get("p1")
        assert record is not None and record.state == "approving"
        assert record.decided_by == f"U{results.index(True)}"
        events = [e.event for e in await replicas[0].events("p1")]
        assert events == ["proposed", "approved"]
    finally:
        await other.close()


async def test_an_expired_proposal_cannot_be_claimed(store: Store) -> None:
    audit = ActionAudit(store)
    await audit.add(_proposal("late", expires_in_s=-1))
    assert not await audit.claim("late", "U1", "approve", "slack")
    assert await audit.expire("late")
    record = await audit.get("late")
    assert record is not None and record.state == "expired" and record.decided_by is None


async def test_the_audit_exports_every_proposal_with_its_trail_as_json_and_csv(store: Store) -> None:
    audit = ActionAudit(store)
    await audit.add(_proposal("p2"))
    await audit.log("p2", "refused", "slack", "U666", "not an approver")
    assert await audit.claim("p2", "U1", "approve", "slack")
    await audit.finish("p2", ok=True, result="spec.unschedulable = true", apply_ms=12.5, platform="slack")
    rows = export_rows(await audit.proposals(), await audit.events())
    assert rows[0]["state"] == "applied" and rows[0]["apply_ms"] == 12.5
    assert [e["event"] for e in rows[0]["events"]] == ["proposed", "refused", "approved", "applied"]
    assert rows[0]["events"][1]["user"] == "U666"
    json.dumps(rows)  # plain data all the way down
    parsed = list(csv.DictReader(io.StringIO(to_csv(rows))))
    assert (
        parsed[0]["id"] == "p2" and parsed[0]["decided_by"] == "U1" and "refused U666" in parsed[0]["events"]
    )
