"""The actions' one entry point: :meth:`ActionService.propose` (a person's ``/rca propose``, the
investigation loop's ``propose_action`` tool, a command an answer suggests) and
:meth:`ActionService.decide` (an Approve / Reject click, from either platform).

propose: check the spec against the catalog and the channel's policy -> server-side dry run with
the actions credentials -> a proposal row (its diff, evidence, risk, expiry) -> a card in the thread.
decide: the button's signature -> the proposal -> same channel, still undecided, not expired -> the
clicker is an approver under the channel's policy (at click time) -> the store's claim (one winner)
-> apply -> audit -> the card edited, the outcome in the thread -> verification in the background,
its outcome posted with the inverse action proposed where one exists.

Nothing here is reachable from the engine: the model's output can at most become an
:class:`ActionSpec` that a person then approves; the credentials live in
:class:`~bot.actions.kube_apply.KubeApply` and :class:`~bot.actions.silences.Silences` only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

from bot.actions.approval import ApprovalPolicy, Click, button_value, valid_signature
from bot.actions.audit import ActionAudit, ProposalRecord
from bot.actions.cards import Card
from bot.actions.catalog import RISK, ActionError, ActionSpec
from bot.actions.kube_apply import Applied, ApplyError, KubeApply
from bot.actions.silences import Silences
from bot.actions.verify import alerts_after, verify
from bot.config import ActionsSettings
from bot.errors import PlatformError
from bot.event_loop import stop_task
from bot.redact import redact
from bot.store import Store, StoreError
from bot.store.records import utcnow

logger = logging.getLogger(__name__)

REFUSED_TEXT = (
    ":no_entry: This button is not valid (it was not made by opsbot for this proposal). Nothing was done."
)
NOT_APPROVER_TEXT = ":no_entry: You may not decide this action: in this channel {who} may. Nothing was done."
DECIDED_TEXT = ":information_source: This proposal was already {state}{by}. Nothing more was done."
EXPIRED_TEXT = (
    ":hourglass: This proposal expired at {at}; propose it again if it is still needed. Nothing was done."
)
UNAVAILABLE_TEXT = (
    ":warning: opsbot cannot reach its database to record a decision, so nothing was done. Try again shortly."
)


class CardPoster(Protocol):
    """The part of a chat adapter actions use."""

    platform: str

    async def post_card(self, channel: str, thread_id: str | None, card: Card) -> str:
        """Post ``card`` (into ``thread_id``'s thread); its post id."""

    async def update_card(self, channel: str, card_id: str, card: Card) -> None:
        """Replace a posted card (decided: no buttons)."""

    async def post_to_channel(self, channel: str, text: str, thread_id: str | None = None) -> str:
        """Post a plain message."""

    async def channel_name(self, channel: str) -> str | None:
        """The channel's name."""


@dataclass(frozen=True)
class ThreadRef:
    """Where a proposal is made and for whom."""

    platform: str
    channel: str
    thread_id: str | None
    asked_by: str | None
    """The person the proposal was made for (the policy's ``asker``)."""


@dataclass
class Proposal:
    """What :meth:`ActionService.propose` made: the stored record and its card's post id, or the
    reason nothing was proposed."""

    spec: ActionSpec
    record: ProposalRecord | None = None
    card_id: str | None = None
    refused: str | None = None


class ActionService:
    """Proposals, decisions, applies and verification, for every platform of this process."""

    def __init__(self, settings: ActionsSettings, store: Store) -> None:
        if settings.secret is None:
            raise ValueError("actions.secret is required when actions are enabled")
        self.settings = settings
        self.audit = ActionAudit(store)
        self.policy = ApprovalPolicy(settings)
        self.kube = KubeApply(settings)
        self.silences = Silences(settings)
        self.adapters: dict[str, CardPoster] = {}
        self._secret = settings.secret.get_secret_value()
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def attach(self, adapters: Mapping[str, CardPoster]) -> None:
        """The adapters cards are posted through, by platform."""
        self.adapters.update(adapters)

    def start(self, interval_s: float = 30.0) -> None:
        """Sweep expired proposals in the background (needs a running loop): their cards lose
        their buttons and say so, even if nobody clicks again."""
        self._sweeper = asyncio.create_task(self._sweep_forever(interval_s), name="opsbot-actions-expiry")

    async def _sweep_forever(self, interval_s: float) -> None:
        while True:
            try:
                await self.sweep_expired()
            except StoreError as exc:
                logger.debug("expiry sweep skipped: %s", exc)
            except Exception:
                logger.exception("expiry sweep failed")
            await asyncio.sleep(interval_s)

    async def sweep_expired(self) -> int:
        """Mark every overdue proposal of an attached platform expired (one replica wins each) and
        edit its card; how many this call expired."""
        done = 0
        for record in await self.audit.overdue():
            if record.platform in self.adapters:
                before = record.state
                await self._expire(record)
                done += record.state != before
        return done

    async def close(self) -> None:
        """Stop the expiry sweep and verifications in flight; close the write clients."""
        await stop_task(self._sweeper)
        for task in list(self._tasks):
            await stop_task(task)
        await self.kube.close()
        await self.silences.close()

    async def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for verifications in flight (tests, shutdown)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    # -- propose ---------------------------------------------------------------------------
    async def takes_proposals(self, platform: str, channel: str, asked_by: str | None) -> bool:
        """Whether a proposal in ``channel`` could be approved by someone (its policy names an
        approver): only then does the model get ``propose_action`` or an answer get cards."""
        adapter = self.adapters.get(platform)
        if adapter is None:
            return False
        policy = self.policy.policy_for(platform, channel, await self._channel_name(adapter, channel))
        return bool(self.policy.approvers(policy, asked_by))

    async def propose(
        self, spec: ActionSpec, evidence: Sequence[str], thread: ThreadRef, *, proposed_by: str = "command"
    ) -> Proposal:
        """Dry-run ``spec`` and post its card in ``thread``; nothing is applied here, ever.

        Returns the proposal, or one with ``refused`` set (the channel's policy forbids it, the dry
        run failed, the platform is not attached); never raises for those.
        """
        adapter = self.adapters.get(thread.platform)
        if adapter is None:
            return Proposal(spec, refused=f"actions are not available on {thread.platform}")
        name = await self._channel_name(adapter, thread.channel)
        policy = self.policy.policy_for(thread.platform, thread.channel, name)
        refusal = self.policy.proposal_refusal(spec, policy)
        if refusal is not None:
            return Proposal(spec, refused=f":no_entry: {refusal}.")
        try:
            dry = await self._run(spec, dry_run=True)
        except ApplyError as exc:
            logger.info("proposal %s refused by its dry run: %s", spec.describe(), exc)
            return Proposal(spec, refused=f":warning: The dry run of *{spec.describe()}* failed: {exc}")
        now = utcnow()
        lines = [str(redact(line))[:500] for line in evidence][:10]
        record = ProposalRecord(
            id=uuid.uuid4().hex,
            platform=thread.platform,
            channel=thread.channel,
            thread_id=thread.thread_id,
            action=spec.action,
            target=spec.target,
            spec=spec.canonical(),
            digest=spec.digest(),
            evidence=json.dumps(lines),
            diff=str(redact(dry.diff)),
            summary=dry.summary,
            risk=RISK[spec.action],
            asked_by=thread.asked_by,
            proposed_by=proposed_by,
            state="proposed",
            created_at=now,
            expires_at=now + timedelta(seconds=self.settings.expiry_s),
        )
        try:
            await self.audit.add(record)
        except StoreError as exc:
            return Proposal(spec, refused=f":warning: The proposal could not be recorded (database): {exc}")
        card = self._card(record, self.policy.describe(policy, thread.asked_by))
        try:
            card_id = await adapter.post_card(thread.channel, thread.thread_id, card)
        except PlatformError as exc:
            await self.audit.log(record.id, "failed", thread.platform, None, f"card not posted: {exc}")
            return Proposal(spec, record, refused=f":warning: The card could not be posted: {exc}")
        record.card_id = card_id
        await self.audit.set_card(record.id, card_id)
        logger.info("proposed %s as %s in %s:%s", spec.describe(), record.id, thread.platform, thread.channel)
        return Proposal(spec, record, card_id)

    def _card(self, record: ProposalRecord, approvers: str) -> Card:
        spec = ActionSpec.from_json(record.spec)
        return Card(
            proposal_id=record.id,
            title=spec.describe(),
            evidence=record.evidence_lines,
            diff=record.diff,
            summary=record.summary,
            risk=record.risk,
            approvers=approvers,
            expires_at=record.expires_at,
            approve_value=button_value(self._secret, record.id, "approve", record.digest),
            reject_value=button_value(self._secret, record.id, "reject", record.digest),
        )

    async def _run(self, spec: ActionSpec, *, dry_run: bool) -> Applied:
        if spec.is_kubernetes:
            return await self.kube.run(spec, dry_run=dry_run)
        return await self.silences.run(spec, dry_run=dry_run)

    # -- decide ----------------------------------------------------------------------------
    async def decide(self, click: Click) -> str:
        """Act on one click if, and only if, it is a valid approval; the text for the clicker alone.

        Every refusal is written to the audit trail with the clicker's id and the reason.
        """
        received = time.perf_counter()
        parts = click.parts()
        if parts is None:
            return await self._refuse(click, "?", "malformed button value", REFUSED_TEXT)
        proposal_id, decision, sig = parts
        try:
            record = await self.audit.get(proposal_id)
        except StoreError:
            return UNAVAILABLE_TEXT
        if record is None:
            return await self._refuse(click, proposal_id, "unknown proposal", REFUSED_TEXT)
        if not valid_signature(self._secret, proposal_id, decision, record.digest, sig):
            return await self._refuse(click, proposal_id, "bad signature", REFUSED_TEXT)
        if (record.platform, record.channel) != (click.platform, click.channel):
            return await self._refuse(
                click, proposal_id, f"clicked in {click.platform}:{click.channel}", REFUSED_TEXT
            )
        if record.state != "proposed":
            by = f" by {record.decided_by}" if record.decided_by else ""
            return await self._refuse(
                click, proposal_id, f"already {record.state}", DECIDED_TEXT.format(state=record.state, by=by)
            )
        if record.expires_at <= utcnow():
            await self._expire(record)
            return await self._refuse(
                click, proposal_id, "expired", EXPIRED_TEXT.format(at=record.expires_at.strftime("%H:%M UTC"))
            )
        adapter = self.adapters.get(record.platform)
        name = await self._channel_name(adapter, record.channel) if adapter is not None else None
        policy = self.policy.policy_for(record.platform, record.channel, name)
        approvers = self.policy.approvers(policy, record.asked_by)
        # rejecting is also the asker's right: they may withdraw what was proposed for them
        allowed = click.user in approvers or (decision == "reject" and click.user == record.asked_by)
        if not allowed:
            who = self.policy.describe(policy, record.asked_by)
            return await self._refuse(
                click, proposal_id, "not an approver", NOT_APPROVER_TEXT.format(who=who)
            )
        try:
            won = await self.audit.claim(proposal_id, click.user, decision, click.platform)
        except StoreError:
            return UNAVAILABLE_TEXT
        if not won:
            return await self._refuse(
                click,
                proposal_id,
                "lost the claim (decided meanwhile)",
                DECIDED_TEXT.format(state="decided", by=""),
            )
        if decision == "reject":
            record.state, record.decided_by = "rejected", click.user
            await self._edit_card(record, f":x: *Rejected* by {_mention(click)}; nothing was applied.")
            return "Rejected: nothing was applied."
        return await self._apply(record, click, received)

    async def _apply(self, record: ProposalRecord, click: Click, received: float) -> str:
        spec = ActionSpec.from_json(record.spec)
        if spec.digest() != record.digest:  # the stored spec itself was altered
            await self.audit.finish(
                record.id,
                ok=False,
                result="stored spec does not match its digest",
                apply_ms=0.0,
                platform=click.platform,
            )
            return REFUSED_TEXT
        try:
            applied = await self._run(spec, dry_run=False)
        except (ApplyError, ActionError) as exc:
            ms = (time.perf_counter() - received) * 1000
            await self.audit.finish(
                record.id, ok=False, result=str(exc), apply_ms=ms, platform=click.platform
            )
            await self._edit_card(
                record, f":warning: *Approved* by {_mention(click)}, but applying failed: {exc}"
            )
            return f"Applying failed: {exc}"
        ms = (time.perf_counter() - received) * 1000
        await self.audit.finish(
            record.id, ok=True, result=applied.summary, apply_ms=ms, platform=click.platform
        )
        logger.info("applied %s (%s) approved by %s in %.0f ms", record.id, spec.describe(), click.user, ms)
        await self._edit_card(
            record, f":white_check_mark: *Approved* by {_mention(click)} and applied: {applied.summary}"
        )
        task = asyncio.create_task(self._verify(record, spec, applied), name=f"verify-{record.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return f"Applied: {applied.summary}. Watching it for up to {self.settings.verify_s:.0f} s."

    async def _verify(self, record: ProposalRecord, spec: ActionSpec, applied: Applied) -> None:
        silence_id = str((applied.after or {}).get("silenceID", "")) or None
        outcome = await verify(
            spec,
            self.kube,
            self.silences,
            window_s=self.settings.verify_s,
            poll_s=self.settings.verify_poll_s,
            silence_id=silence_id,
        )
        mark = ":white_check_mark:" if outcome.ok else ":warning:"
        text = f"{mark} *{spec.describe()}*: {outcome.text} ({outcome.waited_s:.0f} s after applying)."
        alerts = await alerts_after(spec, self.silences)
        if alerts is not None:
            text += f" Alertmanager: {alerts}."
        try:
            await self.audit.verified(record.id, text, record.platform)
        except StoreError as exc:
            logger.warning("verification of %s not recorded: %s", record.id, exc)
        adapter = self.adapters.get(record.platform)
        if adapter is None:
            return
        thread = record.thread_id or record.card_id
        try:
            await adapter.post_to_channel(record.channel, text, thread)
        except PlatformError as exc:
            logger.warning("verification outcome of %s not posted: %s", record.id, exc)
        if applied.inverse is not None:
            evidence = [f"undoes proposal {record.id} ({spec.describe()}), applied by {record.decided_by}"]
            ref = ThreadRef(record.platform, record.channel, thread, record.asked_by)
            await self.propose(applied.inverse, evidence, ref, proposed_by="inverse")

    async def _refuse(self, click: Click, proposal_id: str, reason: str, text: str) -> str:
        logger.warning(
            "action click refused (%s): proposal=%s platform=%s channel=%s user=%s",
            reason,
            proposal_id,
            click.platform,
            click.channel,
            click.user,
        )
        try:
            await self.audit.log(proposal_id, "refused", click.platform, click.user, reason)
        except StoreError as exc:
            logger.warning("refusal not recorded: %s", exc)
        return text

    async def _expire(self, record: ProposalRecord) -> None:
        try:
            if await self.audit.expire(record.id):
                record.state = "expired"
                await self._edit_card(
                    record, ":hourglass: *Expired*: nobody approved it in time; nothing was applied."
                )
        except StoreError as exc:
            logger.warning("expiry of %s not recorded: %s", record.id, exc)

    async def _edit_card(self, record: ProposalRecord, line: str) -> None:
        adapter = self.adapters.get(record.platform)
        if adapter is None or not record.card_id:
            return
        card = self._card(record, "")
        card.state = line
        try:
            await adapter.update_card(record.channel, record.card_id, card)
        except PlatformError as exc:
            logger.warning("card of %s not updated: %s", record.id, exc)

    async def _channel_name(self, adapter: CardPoster | None, channel: str) -> str | None:
        if adapter is None or not self.policy.needs_channel_names:
            return None
        try:
            return await adapter.channel_name(channel)
        except PlatformError as exc:
            logger.warning("channel name of %s unknown: %s", channel, exc)
            return None


def _mention(click: Click) -> str:
    return f"<@{click.user}>" if click.platform == "slack" else f"@{click.user_name or click.user}"
