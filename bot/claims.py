"""Claims across replicas: the leases an answering replica keeps on its events, and the sweeper that
notes the answers of a replica that died mid-answer.

Every replica receives every event (Slack retries and several Socket Mode connections, every
Mattermost websocket, the same Alertmanager webhook); the store's claim (one INSERT the primary key
lets succeed once) picks the one that answers. That claim is leased (``store.claim_lease_s``):
:class:`ClaimSweeper` renews every lease of its process every quarter of the lease (one UPDATE,
however many answers run), and the pipeline releases a claim when its answer ends, however it ends
(queued with the request row). A replica killed with SIGKILL (OOM, node loss) renews and releases
nothing: its leases run out, and the sweeper of any replica still running (or of the restarted one,
which is a new owner) takes each claim over (an UPDATE only one replica wins), posts
:data:`INTERRUPTED_TEXT` in the answer's thread and writes the request row with status
``interrupted``, within about 1.25 leases of the kill.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from bot.event_loop import stop_task
from bot.store import RequestRecord, Store, StoreError
from bot.store.records import Claim, utcnow

logger = logging.getLogger(__name__)

INTERRUPTED_TEXT = (
    ":warning: opsbot stopped before this answer was complete (the replica answering it went away). "
    "Please ask again."
)


class ThreadPoster(Protocol):
    """The part of a chat adapter the sweeper uses."""

    platform: str

    async def post_to_channel(self, channel: str, text: str, thread_id: str | None = None) -> str:
        """Post a plain message (into ``thread_id``'s thread); returns its id."""


class ClaimSweeper:
    """Renews this process's leases; finds other processes' leases that ran out and notes their
    answers as interrupted (one replica per answer)."""

    def __init__(self, store: Store, adapters: Mapping[str, ThreadPoster]) -> None:
        self.store = store
        self.adapters = dict(adapters)
        self.interval_s = store.claim_lease_s / 4
        """Seconds between two renewals and sweeps: a quarter of the lease."""
        self.noted = 0
        """Interrupted answers this process noted."""
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Sweep in the background (needs a running loop)."""
        self._task = asyncio.create_task(self._sweep_forever(), name="opsbot-claim-sweeper")

    async def stop(self) -> None:
        """Stop sweeping (shutdown)."""
        await stop_task(self._task)
        self._task = None

    async def _sweep_forever(self) -> None:
        while True:
            try:
                await self.store.renew_leases()
                await self.sweep()
            except StoreError as exc:  # the database is down: the leases wait for it
                logger.debug("claim sweep skipped: %s", exc)
            except Exception:
                logger.exception("claim sweep failed")
            await asyncio.sleep(self.interval_s)

    async def sweep(self) -> int:
        """One pass: note every expired claim of a platform this process serves; how many it noted.

        Raises :class:`StoreError` when the database cannot be read.
        """
        noted = 0
        for claim in await self.store.expired_claims():
            adapter = self.adapters.get(claim.platform)
            if adapter is None or not claim.channel:
                continue  # another replica serves that platform (or nothing was posted anywhere)
            if not await self.store.take_over_claim(claim):
                continue  # another sweeper won it, or its owner renewed just now
            await self._note(claim, adapter)
            noted += 1
        self.noted += noted
        return noted

    async def _note(self, claim: Claim, adapter: ThreadPoster) -> None:
        logger.warning(
            "answer %s (%s:%s) was interrupted: the lease of %s ran out at %s; noting it in %s/%s",
            claim.request_id,
            claim.platform,
            claim.event_id,
            claim.owner,
            claim.lease_until.isoformat() if claim.lease_until else "?",
            claim.channel,
            claim.thread_id,
        )
        assert claim.channel is not None
        try:
            await adapter.post_to_channel(claim.channel, INTERRUPTED_TEXT, claim.thread_id)
        except Exception as exc:  # the row is still written: the request is not lost
            logger.error("could not note the interrupted answer %s: %s", claim.request_id, exc)
        if claim.request_id:
            await self.store.record_request(
                RequestRecord(
                    request_id=claim.request_id,
                    platform=claim.platform,
                    channel=claim.channel,
                    thread_id=claim.thread_id,
                    user=claim.user,
                    scenario=claim.scenario or "unknown",
                    lane=claim.lane or "unknown",
                    status="interrupted",
                    error=f"replica {claim.owner} went away mid-answer (lease ran out)"[:500],
                    finished_at=utcnow(),
                )
            )
