"""``opsbot audit`` as an operator runs it (a real process on a real SQLite file)."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from bot.actions.audit import ActionAudit, ProposalRecord
from bot.actions.catalog import ActionSpec
from bot.config import StoreSettings
from bot.store import Store
from bot.store.records import utcnow

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.timeout(120)


def opsbot(args: list[str], db: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    env.update(
        {
            "OPSBOT_STORE__URL": f"sqlite+aiosqlite:///{db}",
            "OPSBOT_LOG_LEVEL": "WARNING",
            "PYTHONPATH": str(REPO),
            "COLUMNS": "160",
            "NO_COLOR": "1",
        }
    )
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", *args],
        cwd=db.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )


async def test_audit_lists_and_exports_who_approved_what(tmp_path: Path) -> None:
    db = tmp_path / "opsbot.db"
    store = await Store.open(f"sqlite+aiosqlite:///{db}", StoreSettings())
    audit = ActionAudit(store)
    now = utcnow()
    for pid, spec in (
        (
            "p-restart",
            ActionSpec("rollout_restart", {"kind": "deployment", "namespace": "shop", "name": "api"}),
        ),
        ("p-cordon", ActionSpec("cordon", {"kind": "node", "name": "worker-1"})),
    ):
        await audit.add(
            ProposalRecord(
                id=pid,
                platform="slack",
                channel="C1",
                thread_id="1.1",
                action=spec.action,
                target=spec.target,
                spec=spec.canonical(),
                digest=spec.digest(),
                evidence=json.dumps(["pods stuck on old config"]),
                diff="+ restartedAt",
                summary="restart",
                risk="medium",
                asked_by="U0ASKER",
                proposed_by="command",
                state="proposed",
                created_at=now,
                expires_at=now + timedelta(minutes=15),
            )
        )
    await audit.log("p-restart", "refused", "slack", "U0STRANGER", "not an approver")
    assert await audit.claim("p-restart", "U0APPROVER", "approve", "slack")
    await audit.finish("p-restart", ok=True, result="applied", apply_ms=41.0, platform="slack")
    assert await audit.claim("p-cordon", "U0APPROVER", "reject", "slack")
    await store.close()

    listed = opsbot(["audit", "list", "--since", "1h"], db)
    assert listed.returncode == 0, listed.stderr
    assert "rollout_restart deployment/api -n shop" in listed.stdout and "U0APPROVER" in listed.stdout
    assert "2 proposal(s)" in listed.stdout
    only = opsbot(["audit", "list", "--state", "rejected"], db)
    assert "cordon node/worker-1" in only.stdout and "rollout_restart" not in only.stdout

    exported = opsbot(["audit", "export", "--format", "json"], db)
    rows = {r["id"]: r for r in json.loads(exported.stdout)}
    trail = [(e["event"], e["user"]) for e in rows["p-restart"]["events"]]
    assert trail == [
        ("proposed", "U0ASKER"),
        ("refused", "U0STRANGER"),
        ("approved", "U0APPROVER"),
        ("applied", None),
    ]
    assert rows["p-restart"]["diff"] == "+ restartedAt" and rows["p-restart"]["apply_ms"] == 41.0
    out = tmp_path / "audit.csv"
    assert opsbot(["audit", "export", "--format", "csv", "--out", str(out)], db).returncode == 0
    parsed = {r["id"]: r for r in csv.DictReader(io.StringIO(out.read_text()))}
    assert parsed["p-cordon"]["state"] == "rejected" and parsed["p-cordon"]["decided_by"] == "U0APPROVER"
