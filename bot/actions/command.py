"""``opsbot audit``: the actions' audit trail, listed as a table or exported as JSON / CSV.

``opsbot audit list [--since 7d] [--state applied]`` prints one line per proposal (when, where,
what, who asked, who decided, state, apply time); ``opsbot audit export --format json|csv
[--out FILE]`` writes every proposal with its diff, evidence and whole trail (every click, refused
ones included, with who clicked and why it was refused).
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bot.actions.audit import ActionAudit, export_rows, to_csv
from bot.config import Settings
from bot.store import Store


async def run_audit(settings: Settings, args: argparse.Namespace, *, out: Console) -> int:
    """List or export the audit trail of ``args.since`` (a duration ago or a time)."""
    since = args.since
    if isinstance(since, timedelta):
        since = datetime.now(UTC) - since
    store = await Store.open(settings.store_url, settings.store, upgrade=settings.store.auto_upgrade)
    try:
        audit = ActionAudit(store)
        records = await audit.proposals(since=since, limit=args.limit)
        if getattr(args, "state", None):
            records = [r for r in records if r.state == args.state]
        if args.audit_command == "list":
            table = Table("created (UTC)", "where", "action", "asked by", "decided by", "state", "apply ms")
            for r in records:
                table.add_row(
                    r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                    f"{r.platform}:{r.channel}",
                    f"{r.action} {r.target}",
                    r.asked_by or "",
                    r.decided_by or "",
                    r.state,
                    f"{r.apply_ms:.0f}" if r.apply_ms is not None else "",
                )
            out.print(table)
            out.print(f"{len(records)} proposal(s) since {since:%Y-%m-%d %H:%M} UTC")
            return 0
        ids = {r.id for r in records}
        events = [e for e in await audit.events(since=since) if e.proposal_id in ids]
        rows = export_rows(records, events)
        text = json.dumps(rows, indent=2) + "\n" if args.format == "json" else to_csv(rows)
        if args.out == "-":
            out.file.write(text)
        else:
            Path(args.out).write_text(text)
        return 0
    finally:
        await store.close()
