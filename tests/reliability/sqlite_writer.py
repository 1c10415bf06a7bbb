"""One writer process of the SQLite test: ``python sqlite_writer.py <url> <name> <count>``.

Writes ``count`` answers' worth through the real :class:`bot.store.Store` (claim, request row, user
and assistant turns, a feedback vote), then prints one JSON line: what it wrote and every log record
at WARNING or above.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from bot.config import StoreSettings
from bot.store import RequestRecord, Store


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")


async def main(url: str, name: str, count: int) -> None:
    collect = Collect()
    logging.getLogger().addHandler(collect)
    logging.getLogger().setLevel(logging.INFO)
    store = await Store.open(url, StoreSettings(), upgrade=False)
    won = 0
    for i in range(count):
        event = f"{name}-{i}"
        # Both writers claim the same events too: exactly one of them wins each.
        won += await store.claim_event("slack", event)
        won += await store.claim_event("slack", f"shared-{i}")
        rid = f"{name}-{i:04d}"
        await store.record_request(
            RequestRecord(rid, "slack", "C1", f"T{i % 20}", "U1", "chat", "interactive", "ok", ttft_ms=1.0)
        )
        await store.append_message("slack", "C1", f"T{i % 20}", "user", f"question {i}", request_id=rid)
        await store.append_message("slack", "C1", f"T{i % 20}", "assistant", f"answer {i}", request_id=rid)
        await store.record_feedback(rid, "slack", "U1", 1)
        if i % 10 == 0:
            await store.thread_history("slack", "C1", f"T{i % 20}")
            await asyncio.sleep(0)
    await store.close(flush_timeout_s=60)
    print(json.dumps({"name": name, "claims_won": won, "dropped": store.dropped, "logs": collect.lines}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
