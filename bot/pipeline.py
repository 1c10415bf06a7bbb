"""The one flow every question takes, from an adapter's ``IncomingMessage`` to a stored answer.

submit (the pipeline owns the message from here) -> claim the event (de-duplication) -> access
policy -> commands (help / status) -> scenario and lane (:mod:`bot.routing`) -> sign of life and
placeholder in the thread, and meanwhile, for an answer that starts its thread, thread history +
cluster context (concurrently) -> prompt (token ids) -> engine submit (asked in a thread: these
three after the placeholder, which the thread read-back leaves out) -> the sources line, then
throttled edits as the engine streams -> final answer with footer -> thread turns and one request
row stored.

Every failure ends as a short message in the thread and a request row with its status: the user
never meets silence, and the store never misses a request. Statuses, one per branch of the error
trees (``inference.engine`` and :mod:`bot.errors`): ``ok``, ``timeout``, ``aborted``,
``overloaded``, ``engine_dead``, ``error`` (the engine could not answer), ``undelivered`` /
``throttled`` (the platform refused or kept failing), ``stalled`` (the answer watchdog,
:mod:`bot.progress`: nothing moved for ``answer.stall_s``).

The pipeline is the one owner of work in flight: adapters and the Alertmanager receiver hand every
accepted message to :meth:`Pipeline.submit`, and shutdown waits for all of it in one place
(:meth:`Pipeline.drain`, one deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bot import metrics, postmortem, replay
from bot.access import Author
from bot.adapters.base import ChatAdapter, ReplyStream
from bot.answer_clean import (
    ASK_AGAIN,
    EMPTY,
    EchoGuard,
    PromptText,
    ask_again,
    clean_answer,
    clean_partial,
    echo_verdict,
    with_fence_stops,
)
from bot.config import AnswerSettings, ThreadSettings
from bot.context.alertmanager import thread_reference
from bot.context.base import ContextBundle
from bot.context.scope import ChannelRef
from bot.context.thread import thread_context, thread_failed
from bot.errors import AnswerStalled, PlatformError
from bot.postmortem import DraftProgress
from bot.progress import AnswerWatch, waiting_for_engine
from bot.prompts import WHOLE_THREAD_SCENARIOS, PromptBuilder, PromptPlan
from bot.redact import count_secrets, redact
from bot.routing import lane_table_markdown, pick_lane, pick_scenario
from bot.store import RequestRecord, Store, ThreadMessage
from bot.store.records import Claim, StepRecord, percentile
from bot.types import (
    FinalAnswer,
    IncomingMessage,
    MessageKind,
    StepUpdate,
    ThreadPost,
    ThreadRead,
    clean_text,
    steps_text,
)
from bot.urgency import UrgentFirst, UrgentHold
from inference.context import request_scope
from inference.engine import (
    Engine,
    EngineDeadError,
    EngineGenerateError,
    EngineOverloadedError,
    EngineStats,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    Lane,
    RequestAbortedError,
    RequestTimeoutError,
    TextDelta,
)
from inference.engine_set import EngineSet
from inference.scenarios import POSTMORTEM, ScenarioRegistry

if TYPE_CHECKING:  # the gatherer pulls in the cluster clients; the pipeline only calls it
    from bot.actions.service import ActionService
    from bot.context.gatherer import ContextGatherer
    from bot.investigate import Investigation, Investigator
    from bot.slo import SloGuard

logger = logging.getLogger(__name__)

_UPDATE_EVERY_S = 0.2
"""Partial text is redacted and handed to the reply at most this often (the first words at once).
Platforms show it at most once per edit interval (1 s by default); redacting the growing text on
every engine delta was a fifth of the event loop's CPU in bench/e2e_bench.py's profile."""
_FIRST_WORDS_CHARS = 200
"""Partial text shorter than this goes to the reply on every delta until something is visible."""
_Gathered = tuple[list[ThreadMessage], ContextBundle | None, float | None]
"""What :meth:`Pipeline._gather` returns: stored turns, cluster context, context time in ms."""
CANCEL_GRACE_S = 5.0
"""Seconds an answer stopped by shutdown gets to post its note and write its row."""

ENGINE_DEAD_TEXT = (
    ":warning: The model engine is down right now and is being restarted. "
    "Your question was not answered; please ask again in a minute."
)
OVERLOADED_TEXT = ":hourglass: opsbot is overloaded right now ({detail}). Please try again shortly."
FAILED_TEXT = ":warning: Generating the answer failed: {detail}"
TIMEOUT_TEXT = ":warning: The answer took longer than {seconds:.0f} s and was stopped."
PLACEHOLDER_FAILED_TEXT = ":warning: opsbot could not post its answer in this channel: {detail}"
NO_THREAD_TEXT = (
    ":thread: A {what} needs a thread: mention me in the incident's thread (`@opsbot summarize`, "
    "`@opsbot postmortem`), or give a link to a message of the thread in this channel "
    "(`/rca summary <link>`)."
)
SHUTDOWN_TEXT = (
    ":warning: opsbot is restarting and stopped before this answer was complete; please ask again."
)
STALLED_TEXT = (
    ":warning: opsbot stopped this answer: it made no progress for {seconds:.0f} s (the chat "
    "platform or opsbot itself is stuck; the operators' logs say more). Please ask again."
)
EMPTY_ANSWER_TEXT = (
    ":warning: {model} gave no answer: it only copied its prompt back (markup or instructions). "
    "A larger model answers (engine.model; the README recommends one per machine)."
)
UNDELIVERED_TEXT = ":warning: opsbot could not post its whole answer here: {detail}"
ACTIONS_OFF_TEXT = (
    ":no_entry: Actions are turned off for this opsbot (`[actions] enabled`); nothing was proposed."
)
_PROPOSE = re.compile(r"^\s*propose\b\s*", re.IGNORECASE)
"""``propose ...`` (a command's words, or a mention's): a proposed action, not a question."""
FAILURE_NOTE_WAIT_S = 10.0
"""Seconds the note about a stalled or undelivered answer may take (the platform may be what failed)."""


class Pipeline:
    """Answers questions: owns the flow and the work in flight, not the platforms, engine or database."""

    def __init__(
        self,
        *,
        engine: Engine,
        store: Store,
        prompts: PromptBuilder,
        scenarios: ScenarioRegistry,
        context: ContextGatherer | None = None,
        model_name: str = "",
        slo: SloGuard | None = None,
        thread: ThreadSettings | None = None,
        prompts_by_engine: Mapping[str, PromptBuilder] | None = None,
        model_names: Mapping[str, str] | None = None,
        urgent_first: UrgentFirst | None = None,
        answer: AnswerSettings | None = None,
        investigator: Investigator | None = None,
        actions: ActionService | None = None,
    ) -> None:
        self.engine = engine
        self.engines = engine if isinstance(engine, EngineSet) else EngineSet.single(engine)
        """The engines by name and which scenario each answers (one engine: a set of one)."""
        self.store = store
        self.prompts = prompts
        self.prompts_by_engine = dict(prompts_by_engine or {})
        """Each named engine's prompt builder (its tokenizer and context window); ``prompts`` else."""
        self.scenarios = scenarios
        self.context = context
        self.model_name = model_name
        self.model_names = dict(model_names or {})
        """Each named engine's model, for the request rows; ``model_name`` else."""
        self.slo = slo
        """The SLO guard every answer's TTFT is reported to (``None``: off)."""
        self.started = time.monotonic()
        self.thread = thread or ThreadSettings()
        """How the chat thread is read back as context (``[thread]``)."""
        self.urgent_first = urgent_first or UrgentFirst()
        """Urgent answers first on this event loop, before the engine (``bot.urgency``)."""
        self.answer = answer or AnswerSettings()
        """Answers in flight (``[answer]``: the watchdog)."""
        self.investigator = investigator
        """The investigation loop (``[investigate]``: tool calls after the context); ``None``: off."""
        self.actions = actions
        """Approval-gated actions (``[actions]``): ``propose ...`` makes a card (``None``: off)."""
        self._tasks: set[asyncio.Task[None]] = set()

    # -- work in flight ----------------------------------------------------------------------
    def submit(self, message: IncomingMessage, adapter: ChatAdapter) -> asyncio.Task[None]:
        """Take ``message`` (already acknowledged by its adapter) and answer it in a task owned here.

        The task runs as request ``message.request_id`` (:meth:`handle` sets it, once: every log
        line the answer writes carries it).
        """
        return self.track(self.handle(message, adapter), f"answer-{message.request_id}")

    def track(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run ``work`` (an inbound receiver's processing) as work in flight that :meth:`drain` waits for."""
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:  # handle() catches its own
            logger.error("work in flight %s failed", task.get_name(), exc_info=task.exception())

    @property
    def in_flight(self) -> int:
        """Messages submitted and not yet answered."""
        return len(self._tasks)

    async def drain(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for every submitted message; cancel the rest (each still gets a
        note in its thread and its request row). Returns how many were cancelled."""
        if not self._tasks:
            return 0
        logger.info("shutdown: waiting up to %.0f s for %d answer(s) in flight", timeout_s, len(self._tasks))
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            logger.warning(
                "shutdown: %d answer(s) still running after %.0f s were stopped", len(pending), timeout_s
            )
            # A stopped answer posts a short note in its thread and writes its row: give it a moment.
            _, stuck = await asyncio.wait(pending, timeout=CANCEL_GRACE_S)
            if stuck:
                logger.warning("shutdown: %d stopped answer(s) could not post their note in time", len(stuck))
        return len(pending)

    async def handle(self, message: IncomingMessage, adapter: ChatAdapter) -> None:
        """Answer ``message`` through ``adapter`` now; never raises for a per-message problem."""
        with request_scope(message.request_id):
            message.text = redact(message.text)
            scenario = pick_scenario(message)
            lane = pick_lane(message, scenario)
            hold = self.urgent_first.hold(lane)
            try:
                await self.urgent_first.step_aside(lane)
                await self._handle(message, adapter, scenario, lane, hold)
            finally:
                if hold is not None:
                    hold.release()

    async def _handle(
        self,
        message: IncomingMessage,
        adapter: ChatAdapter,
        scenario: str,
        lane: Lane,
        hold: UrgentHold | None,
    ) -> None:
        """:meth:`handle` after its urgent-first checkpoint: claim, access, commands, the answer."""
        # The claim is leased to this replica while it answers: if it dies mid-answer, another
        # replica notes the answer as interrupted in its thread (bot.claims).
        lease = Claim(
            message.platform,
            message.event_id,
            request_id=message.request_id,
            channel=message.channel,
            thread_id=_claimed_thread(message),
            user=message.user,
            scenario=scenario,
            lane=lane.value,
        )
        if not await self.store.claim_event(message.platform, message.event_id, lease):
            metrics.EVENTS_DUPLICATE.labels(message.platform).inc()
            logger.info("duplicate event %s:%s dropped", message.platform, message.event_id)
            message.settle_first_word(None)
            return
        try:
            # Access and command words are decided here only; a refusal or a command's text may
            # ride on the command's own response (``IncomingMessage.first_word``).
            if await self._refused(message, adapter):
                return
            if message.kind is MessageKind.COMMAND and await self._command(message, adapter):
                return
            if _PROPOSE.match(message.text) and message.kind is not MessageKind.ALERT:
                await self._propose(message, adapter)
                return
            if message.kind in _ASKED and message.text.strip().lower() == "status":
                # "@opsbot status": answered in the thread, where whoever asked is looking
                await adapter.send_notice(message, await self.status_text())
                return
            message.settle_first_word(None)  # an answer is on its way
            await self._answer(message, adapter, scenario, lane, hold)
        except Exception:  # last line of defence: log it, the adapter's loop must go on
            logger.exception("unexpected failure answering %s:%s", message.platform, message.event_id)
        finally:
            message.settle_first_word(None)
            await self.store.release_claim(message.platform, message.event_id)

    async def _refused(self, message: IncomingMessage, adapter: ChatAdapter) -> bool:
        """Apply the platform's access policy; a refused asker gets one ephemeral note (none for a
        thread follow-up: people who may not ask keep talking in the thread undisturbed)."""
        if message.kind is MessageKind.ALERT:
            return False  # alert targets are configured by an admin
        refusal = adapter.access.refusal_for(message) if adapter.access is not None else None
        if refusal is None:
            return False
        logger.info(
            "refused (%s): %s:%s channel=%s user=%s",
            refusal.rule,
            message.platform,
            message.event_id,
            message.channel,
            message.user,
        )
        if message.kind is not MessageKind.FOLLOWUP:
            await adapter.send_notice(message, refusal.text, ephemeral=True)
        return True

    # -- commands ----------------------------------------------------------------------------
    async def _command(self, message: IncomingMessage, adapter: ChatAdapter) -> bool:
        word = message.text.strip().lower()
        if word in ("", "help", "-h", "--help"):
            await adapter.send_notice(message, self.help_text(), ephemeral=True)
            return True
        if word == "status":
            await adapter.send_notice(message, await self.status_text(), ephemeral=True)
            return True
        return False

    async def _propose(self, message: IncomingMessage, adapter: ChatAdapter) -> None:
        """``propose <action>``: a card with the action's dry run, for a person to approve (never
        applied here). The reply (usage, a refusal, where the card is) only the asker sees."""
        if self.actions is None:
            await adapter.send_notice(message, ACTIONS_OFF_TEXT, ephemeral=True)
            return
        from bot.actions.catalog import ActionError, parse_command
        from bot.actions.service import ThreadRef

        words = _PROPOSE.sub("", message.text, count=1)
        try:
            spec = parse_command(words)
        except ActionError as exc:
            await adapter.send_notice(message, f":grey_question: {exc}", ephemeral=True)
            return
        thread = None if message.kind is MessageKind.COMMAND else (message.thread_id or message.message_id)
        evidence = [f"asked for by {message.user_name or message.user}: `propose {words.strip()}`"]
        proposal = await self.actions.propose(
            spec, evidence, ThreadRef(message.platform, message.channel, thread, message.user)
        )
        if proposal.refused is not None:
            await adapter.send_notice(message, proposal.refused, ephemeral=True)
        else:
            await adapter.send_notice(
                message,
                f":clipboard: Proposed *{spec.describe()}*: the card waits for approval.",
                ephemeral=True,
            )

    def help_text(self) -> str:
        """Usage of ``/rca`` and of mentions, with the lane table, for ``/rca help``."""
        return (
            "*opsbot* — incident assistant (reads the cluster, never changes it)\n"
            "• `/rca <question, alert, pod or service>` — root-cause analysis in a new thread\n"
            "• `/rca status` — model, queue per lane, KV-cache use, TTFT of the last hour\n"
            "• `/rca propose restart deployment/NAME -n NS` (also rollback, scale, delete pod, cordon, "
            "uncordon, silence, expire) — a card with the dry run; a person approves, opsbot applies\n"
            "• `/rca help` — this message\n"
            "• @-mention me with a question, or DM me; reply in my threads to follow up "
            "without mentioning me again\n"
            "• Ask *why* for a root-cause analysis; ask me to *review* a rollout or deploy for a "
            "change review.\n"
            "• In an incident thread: `@opsbot summarize` for a catch-up, `@opsbot postmortem` for a "
            "postmortem draft (a Markdown file); `/rca summary <link>` / `/rca postmortem <link>` "
            "with a link to a message of the thread.\n"
            "Who waits for whom (lanes, urgent first):\n" + lane_table_markdown()
        )

    async def status_text(self) -> str:
        """One status block: model, quantization, health, uptime, queue per lane, KV cache, prefix-cache
        reuse and TTFT p50 / p99 (last hour), the SLO state, the store. With several engines
        (``[engines.NAME]``), one line per engine: its model, the scenarios it answers, its health,
        queues, KV cache and TTFT."""
        stats = self.engine.stats()
        health = self.engine.health()
        now = datetime.now(UTC)
        recent = await self.store.requests_between(now - timedelta(hours=1), now)
        prompt_tokens = sum(r.prompt_tokens for r in recent if r.status == "ok")
        cached_tokens = sum(r.cached_tokens for r in recent if r.status == "ok")
        hit = "n/a" if stats.prefix_cache_hit_rate is None else f"{stats.prefix_cache_hit_rate * 100:.1f} %"
        state = "ready" if health.ready else f"NOT READY ({health.reason})"
        uptime = format_duration(time.monotonic() - self.started)
        reuse = (
            f"{cached_tokens / prompt_tokens * 100:.1f} % of {prompt_tokens} prompt tokens"
            if prompt_tokens
            else "no answers yet"
        )
        tail = [
            self.slo.describe() if self.slo is not None else "SLO guard: off",
            f"Store: {'up' if await self.store.ping() else 'DOWN'}, "
            f"{self.store.buffered} rows buffered, {self.store.dropped} dropped",
        ]
        if len(self.engines.names) == 1:
            quant = f"quantization {stats.quantization or 'none'}"
            return "\n".join(
                [
                    f"*opsbot status* — engine {stats.backend}, model `{stats.model}`, {quant}: {state}, "
                    f"up {uptime}",
                    f"Queue: {_lanes_text(stats)}",
                    f"KV cache in use: {_kv_text(stats)}; prefix-cache reuse last hour: {reuse} "
                    f"(engine hit rate {hit})",
                    _ttft_line([r.ttft_ms for r in recent]),
                    *tail,
                ]
            )
        lines = [f"*opsbot status* — {len(self.engines.names)} engines: {state}, up {uptime}"]
        for name, engine in self.engines.items():
            own, ok = engine.stats(), engine.health()
            answers = ", ".join(self.engines.scenarios_of(name))
            if name == self.engines.default:
                answers = f"{answers} and every other scenario" if answers else "every scenario not routed"
            ttft = [r.ttft_ms for r in recent if r.engine == name]
            ready = "ready" if ok.ready else f"NOT READY ({ok.reason or 'starting'})"
            lines.append(
                f"• engine `{name}` — {own.backend}, model `{own.model}`, quantization "
                f"{own.quantization or 'none'}, answers {answers}: "
                f"{ready}\n"
                f"  Queue: {_lanes_text(own)}; KV cache in use: {_kv_text(own)}; {_ttft_line(ttft)}"
            )
        lines.append(f"Prefix-cache reuse last hour: {reuse} (mean engine hit rate {hit})")
        return "\n".join([*lines, *tail])

    # -- answering ---------------------------------------------------------------------------
    async def _answer(
        self,
        message: IncomingMessage,
        adapter: ChatAdapter,
        scenario: str,
        lane: Lane,
        hold: UrgentHold | None = None,
    ) -> None:
        """Answer ``message`` as ``scenario`` in ``lane`` (both picked once, in :meth:`handle`)."""
        # Asked in an existing thread (before the reply may start one): then it is read back.
        in_thread = bool(message.thread_id) and message.thread_id != message.message_id
        if scenario in WHOLE_THREAD_SCENARIOS and not in_thread:
            in_thread = await self._follow_link(message, adapter)
        if scenario in WHOLE_THREAD_SCENARIOS and not in_thread:
            await adapter.send_notice(
                message, NO_THREAD_TEXT.format(what=scenario.replace("_", " ")), ephemeral=True
            )
            return
        record = self._new_record(message, scenario, lane)
        reply: ReplyStream | None = None
        # Nothing waits on the platform that need not: for an answer that starts its thread, the
        # cluster context is gathered, the prompt built and the request handed to the engine while
        # the sign of life and the placeholder are posted (in that order: the reaction is the
        # first thing the asker sees). Only the first words wait for the placeholder; the engine
        # does not (bench/e2e_bench.py measures event -> engine submit).
        early: asyncio.Task[_Prepared] | None = None
        steps = StepRelay()  # an investigation's steps, shown once the reply exists
        if not in_thread:  # nothing before the engine depends on the reply's thread yet
            early = asyncio.create_task(
                self._prepare(message, "", scenario, lane, record, adapter, None, steps)
            )
        prepared: _Prepared | None = None
        try:
            async with AnswerWatch(self.answer.stall_s):
                await adapter.acknowledge(message)  # never raises
                try:
                    reply = await adapter.open_reply(message)
                except PlatformError as exc:
                    metrics.REPLIES_FAILED.labels(message.platform).inc()
                    logger.error("cannot post the placeholder: %s", exc)
                    record.status, record.error = exc.request_status, f"placeholder: {exc}"[:500]
                    # Best effort: the asker at least learns why (a command's response URL often
                    # still works).
                    with contextlib.suppress(Exception):
                        await adapter.send_notice(
                            message, PLACEHOLDER_FAILED_TEXT.format(detail=exc), ephemeral=True
                        )
                    return
                record.thread_id = reply.thread_id
                await steps.attach(reply)
                # From now on messages in the reply's thread are follow-ups, on every worker.
                moved = reply.thread_id != _claimed_thread(message)  # a /rca starts its own thread
                self.store.mark_replied(
                    message.platform,
                    message.event_id,
                    message.channel,
                    reply.thread_id,
                    moved=moved,
                    since=message.posted_at,
                )
                if early is not None:
                    # Gathering and the investigation's steps are bounded by their own deadlines
                    # (context.timeout_s, the lane's wall_s): their time is not a stall.
                    with waiting_for_engine():
                        prepared = await early
                else:  # asked in a thread: read back without the placeholder just posted there
                    own = tuple(reply.posted_ids())
                    with waiting_for_engine():
                        prepared = await self._prepare(
                            message, reply.thread_id, scenario, lane, record, adapter, own, steps
                        )
                await self._answer_into(message, reply, scenario, record, adapter, prepared, hold)
        except AnswerStalled as exc:
            await self._stalled(message, adapter, reply, record, exc)
        except asyncio.CancelledError:
            if prepared is not None and prepared.delivered:
                raise  # the answer is in the thread already: only what follows it was cut short
            # Shutdown stopped this answer: say so in the thread, keep the row, let the cancel go on.
            record.status, record.error = "aborted", "stopped by shutdown"
            if reply is not None:
                note = asyncio.ensure_future(adapter.send_notice(_in_thread(message, reply), SHUTDOWN_TEXT))
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(note), CANCEL_GRACE_S)
            raise
        finally:
            _discard(early, prepared)  # an engine request nobody will read is aborted
            await self._finish_record(record, message)
            await adapter.conclude(message, ok=record.status == "ok")

    def _new_record(self, message: IncomingMessage, scenario: str, lane: Lane) -> RequestRecord:
        """The request row an answer fills in as it goes (status ``ok`` until something fails)."""
        engine_name = self.engines.name_for(scenario)
        logger.info(
            "%s/%s %s lane=%s engine=%s", message.platform, message.channel, scenario, lane.value, engine_name
        )
        return RequestRecord(
            request_id=message.request_id,
            platform=message.platform,
            channel=message.channel,
            thread_id=message.thread_id,
            user=message.user,
            scenario=scenario,
            lane=lane.value,
            status="ok",
            model=self.model_names.get(engine_name) or self.model_name,
            engine=engine_name,
        )

    async def _stalled(
        self,
        message: IncomingMessage,
        adapter: ChatAdapter,
        reply: ReplyStream | None,
        record: RequestRecord,
        exc: AnswerStalled,
    ) -> None:
        """The watchdog gave the answer up: stop its reply, count and log it, and tell the asker in
        the thread where the platform still takes a note."""
        metrics.ANSWERS_STALLED.labels(message.platform).inc()
        logger.error("answer stopped by the watchdog: %s", exc)
        record.status, record.error = exc.request_status, str(exc)[:500]
        if reply is not None:
            reply.abandon()
        await self._note(message, adapter, reply, STALLED_TEXT.format(seconds=self.answer.stall_s or 0))

    async def _note(
        self, message: IncomingMessage, adapter: ChatAdapter, reply: ReplyStream | None, text: str
    ) -> None:
        """Best effort: tell the asker in the answer's thread why it failed, within
        ``FAILURE_NOTE_WAIT_S`` (the platform may be what failed)."""
        where = _in_thread(message, reply) if reply is not None else message
        try:
            await asyncio.wait_for(adapter.send_notice(where, text), FAILURE_NOTE_WAIT_S)
        except (PlatformError, TimeoutError) as failed:
            logger.warning("the failure note could not be posted: %s", failed)

    async def _prepare(
        self,
        message: IncomingMessage,
        thread_id: str,
        scenario: str,
        lane: Lane,
        record: RequestRecord,
        adapter: ChatAdapter,
        own: Sequence[str] | None,
        steps: StepRelay | None = None,
    ) -> _Prepared:
        """Everything before the first word: thread history and cluster context (:meth:`_gather`),
        the prompt, and the request submitted to the scenario's engine (its events buffered in a
        :class:`_StartedStream` until the reply reads them)."""
        sampling = with_fence_stops(self.scenarios.get(scenario))
        engine_name, engine = self.engines.engine_for(scenario)
        prompts = self.prompts_by_engine.get(engine_name, self.prompts)
        history, bundle, context_ms = await self._gather(message, thread_id, scenario, lane, adapter, own)
        prepared = _Prepared(
            history=history, bundle=bundle, context_ms=context_ms, prompts=prompts, steps=steps
        )
        await self.urgent_first.step_aside(lane)  # the prompt's tokenization is CPU work
        investigator = self.investigator
        loop_on = investigator is not None and investigator.budget(scenario, lane) is not None
        try:
            plan = prompts.build(
                scenario=scenario,
                question=message.text,
                asker=message.user_name or message.user,
                history=history,
                context=bundle,
                # Step 0 is the prompt the answer would have without the loop (its context keeps
                # its share of the window); the loop's steps use what is left after it.
                max_tokens=sampling.max_tokens,
            )
        except (EngineGenerateError, EngineDeadError) as exc:
            # The model server's own tokenizer (engine.backend = "openai") fails like the engine.
            prepared.error = _engine_failure(exc, record)
            logger.warning("%s", record.error)
            return prepared
        prepared.plan = plan
        messages, token_ids = plan.messages, plan.token_ids
        if investigator is not None and loop_on:
            found = await investigator.run(
                engine=engine,
                tokenizer=prompts.tokenizer,
                request_id=message.request_id,
                scenario=scenario,
                lane=lane,
                sampling=sampling,
                messages=plan.messages,
                window=prompts.max_model_len,
                bundle=bundle,
                history=history,
                on_step=steps,
                may_propose=self.actions is not None
                and await self.actions.takes_proposals(message.platform, message.channel, message.user),
            )
            if found is not None:
                prepared.investigation = found
                messages, token_ids = found.messages, found.token_ids
                sampling = replace(sampling, bad_words=(*sampling.bad_words, *found.answer_bad_words))
        record.prompt_tokens = len(token_ids)
        prepared.task = messages[-1].content if messages and messages[-1].role == "user" else ""
        prepared.engine = engine
        prepared.request = GenerationRequest(
            request_id=message.request_id,
            scenario=scenario,
            lane=lane,
            sampling=sampling,
            prompt_token_ids=token_ids,
            messages=messages,  # for a remote server that takes chat messages, not ids
        )
        prepared.events = _StartedStream(engine.generate(prepared.request))
        return prepared

    async def _answer_into(
        self,
        message: IncomingMessage,
        reply: ReplyStream,
        scenario: str,
        record: RequestRecord,
        adapter: ChatAdapter,
        prepared: _Prepared,
        hold: UrgentHold | None = None,
    ) -> None:
        sampling = self.scenarios.get(scenario)
        history, bundle, plan = prepared.history, prepared.bundle, prepared.plan
        record.context_ms = prepared.context_ms
        record.replay_inputs = replay.encode(  # what `opsbot feedback export` replays this answer from
            question=message.text,
            asker=message.user_name or message.user,
            scenario=scenario,
            max_tokens=sampling.max_tokens,
            system_prompt=prepared.prompts.system_prompt,
            history=history,
            bundle=bundle,
        )
        # Shown while the engine already has the request; awaited before the first text edit.
        sources = asyncio.create_task(reply.show_sources(bundle.notes if bundle else []))
        text, result, error = "", None, prepared.error
        attempt = 0  # draws asked again (bot.answer_clean.ASK_AGAIN)
        if prepared.events is not None:
            # A postmortem streams its progress, not its text: the draft arrives as a file.
            stream = DraftProgress(reply) if scenario == POSTMORTEM else reply
            checklist = steps_text(prepared.steps.updates) if prepared.steps is not None else ""
            prefix = checklist + "\n\n" if checklist and reply.steps_in_text else ""
            text, result, error = await self._generate(
                message.request_id,
                prepared.events,
                stream,
                record,
                sources,
                hold,
                prefix,
                prepared.task,
                EchoGuard(prepared.prompt_text()),
            )
            while attempt < ASK_AGAIN and (again := prepared.ask_again(result, error, text, attempt + 1)):
                attempt += 1
                assert prepared.engine is not None
                logger.info("%s: the answer was empty or copied its prompt: asked again", again.request_id)
                # The row keeps the first draw's wait and first token (when the asker first saw
                # words) and counts every draw's tokens; the rest describes the answer kept.
                first = (record.queue_ms, record.ttft_ms, record.output_tokens or 0)
                prepared.events = _StartedStream(prepared.engine.generate(again))
                text, result, error = await self._generate(
                    again.request_id,
                    prepared.events,
                    stream,
                    record,
                    None,
                    hold,
                    prefix,
                    prepared.task,
                    EchoGuard(prepared.prompt_text()),
                )
                record.queue_ms, record.ttft_ms = first[0], first[1]
                if result is not None:
                    record.output_tokens = first[2] + result.output_tokens
        await sources
        failure = prepared.failure(result, error, text)
        if failure is not None:
            # Still nothing of its own after asking again (a small model copying its prompt): say
            # so, as a failed answer (no turn stored, no feedback buttons; opsbot eval counts it).
            error = EMPTY_ANSWER_TEXT.format(model=record.model or "the model")
            record.error = (
                "the answer was empty once fence markup and copied instructions were removed"
                if failure == EMPTY
                else f"the answer only copied its prompt back, asked {1 + attempt} times"
            )
        shown = text
        if prepared.investigation is not None:
            shown = await self._conclude_investigation(message, record, prepared, text, result, error)
        if scenario == POSTMORTEM and error is None and text:
            shown = await postmortem.deliver(
                adapter, message.channel, reply.thread_id, text, message.channel_name
            )
        # End-to-end time, measured once: from the adapter taking the event to the answer complete.
        record.e2e_ms = (time.perf_counter() - message.received_perf) * 1000
        answer = FinalAnswer(
            request_id=message.request_id,
            text=error or shown,
            sources=list(bundle.notes) if bundle else [],
            left_out=plan.left_out if plan else [],
            ttft_ms=result.ttft_ms if result else None,
            tpot_ms=result.tpot_ms if result else None,
            total_ms=record.e2e_ms,
            output_tokens=result.output_tokens if result else None,
            draws=1 + attempt,
            error=error,
            failure=failure,
            feedback=error is None,
            scope=bundle.scope_text() if bundle else None,
        )
        post_started = time.perf_counter()
        try:
            await reply.finish(answer)
            prepared.delivered = True
        except PlatformError as exc:
            metrics.REPLIES_FAILED.labels(message.platform).inc()
            logger.error("reply could not be posted: %s", exc)
            record.status, record.error = exc.request_status, f"post: {exc}"[:500]
            await self._note(message, adapter, reply, UNDELIVERED_TEXT.format(detail=exc))
        record.post_ms = (time.perf_counter() - post_started) * 1000
        if reply.first_visible_at is not None:
            metrics.FIRST_VISIBLE.labels(record.scenario, record.lane, record.platform).observe(
                reply.first_visible_at - message.received_perf
            )

        thread = (message.platform, message.channel, reply.thread_id)
        await self.store.append_message(
            *thread, "user", message.text, user=message.user, request_id=message.request_id
        )
        if error is None:
            # The whole answer (a postmortem's draft, not the note about its file) is the turn.
            await self.store.append_message(*thread, "assistant", text, request_id=message.request_id)
            if self.actions is not None and scenario != POSTMORTEM:
                try:
                    await self._offer_actions(message, adapter, reply, prepared, text)
                except Exception:  # a card that cannot be offered costs the card, never the answer
                    logger.exception("request %s: offering actions failed", message.request_id)

    async def _offer_actions(
        self,
        message: IncomingMessage,
        adapter: ChatAdapter,
        reply: ReplyStream,
        prepared: _Prepared,
        text: str,
    ) -> None:
        """Cards for the fixes the answer proposes (:mod:`bot.actions.offers`), where someone may
        approve them; a proposal of the investigation that could not be offered gets a note."""
        from bot.actions.offers import Offer, answer_offers, offer
        from bot.actions.service import ThreadRef
        from bot.investigate import proposal_evidence

        actions = self.actions
        assert actions is not None
        if not await actions.takes_proposals(message.platform, message.channel, message.user):
            return
        found, bundle = prepared.investigation, prepared.bundle
        offers = (
            [Offer(p.spec, proposal_evidence(found, p), "investigation") for p in found.proposals]
            if found is not None
            else []
        )
        if actions.settings.offer_from_answers:
            evidence = [message.text, *(s.body for s in (bundle.sections if bundle else []))]
            evidence += [str(o.get("text", "")) for o in (found.outputs if found else [])]
            offers += answer_offers(
                text,
                evidence=evidence,
                namespaces=_namespaces(bundle),
                most=actions.settings.max_offers,
            )
        if not offers:
            return
        thread = ThreadRef(message.platform, message.channel, reply.thread_id, message.user)
        for note in await offer(actions, thread, offers):
            await self._note(message, adapter, reply, f":warning: {note}")

    async def _conclude_investigation(
        self,
        message: IncomingMessage,
        record: RequestRecord,
        prepared: _Prepared,
        text: str,
        result: GenerationResult | None,
        error: str | None,
    ) -> str:
        """An investigation's answer: its step recorded, the root-cause block written (one more
        constrained step) and stored with the row, and the answer shown with its citation line
        and the steps it cites. Returns the text to show."""
        from bot.investigate import citation_line, observe

        found = prepared.investigation
        assert found is not None and self.investigator is not None
        lane = Lane(record.lane)
        answer = StepRecord(
            index=len(found.calls) + 1, kind="answer", status="ok" if error is None else "error"
        )
        if result is not None:
            answer.prompt_tokens, answer.cached_tokens = result.prompt_tokens, result.cached_tokens
            answer.output_tokens, answer.ttft_ms = result.output_tokens, result.ttft_ms
            if result.ttft_ms is not None:
                answer.decode_ms = max(0.0, result.e2e_ms - result.ttft_ms)
        found.steps.append(answer)
        shown = text
        if error is None and text:
            _, engine = self.engines.engine_for(record.scenario)
            block = await self.investigator.root_cause(
                engine=engine,
                investigation=found,
                answer=text,
                request_id=message.request_id,
                lane=lane,
                sampling=self.scenarios.get(record.scenario),
            )
            legend = [
                u.line() for u in (prepared.steps.updates if prepared.steps else []) if u.state != "pending"
            ]
            tail = []
            if block is not None:
                record.root_cause = redact(json.dumps(block, sort_keys=True), where="store")
                tail.append(citation_line(block))
            if legend:
                tail.append("Steps: [0] gathered context · " + " · ".join(_legend(legend)))
            if tail:
                shown = text + "\n\n" + redact("\n".join(tail))
        record.steps = found.steps
        if record.replay_inputs is not None:  # `opsbot feedback export` replays the calls too
            record.replay_inputs = replay.with_investigation(record.replay_inputs, found.replay_record())
        observe(found, record.scenario, lane)
        return shown

    async def _gather(
        self,
        message: IncomingMessage,
        thread_id: str,
        scenario: str,
        lane: Lane,
        adapter: ChatAdapter,
        own: Sequence[str] | None = None,
    ) -> _Gathered:
        """Thread history, the thread as the platform has it (``own``: asked in an existing thread,
        the answer's own message ids to leave out; ``None``: not read) and cluster context,
        concurrently."""
        history_task = None
        # Asked outside a thread (a top-level mention, a /rca: the answer starts the thread), there
        # are no stored turns and no alert behind it: no store reads (two queries per answer).
        asked_in_thread = own is not None
        if message.kind is MessageKind.FOLLOWUP or asked_in_thread:
            history_task = asyncio.create_task(
                self.store.thread_history(message.platform, message.channel, thread_id)
            )
        whole = scenario in WHOLE_THREAD_SCENARIOS
        thread_task = None
        if self.thread.enabled and own is not None:
            thread_task = asyncio.create_task(self._read_thread(message, adapter, thread_id))
        bundle: ContextBundle | None = None
        context_ms: float | None = None
        if self.context is not None:
            t0 = time.perf_counter()
            alert = message.extra.get("alert")
            if not isinstance(alert, dict) and asked_in_thread:
                # Asked in an alert's thread: the group's alert names pick its runbook and metrics.
                found = await self.store.alert_thread_at(message.platform, message.channel, thread_id)
                alert = thread_reference(found.group_key) if found is not None else None
            bundle = await self.context.gather(
                message.text,
                scenario=scenario,
                alert=alert if isinstance(alert, dict) else None,
                channel=await self._channel_ref(message, adapter),
            )
            context_ms = (time.perf_counter() - t0) * 1000
            metrics.CONTEXT.labels(scenario, lane.value, message.platform).observe(context_ms / 1000)
        history = await history_task if history_task else []
        # Turns stored before answers were cleaned may hold fence markup: never replay it.
        history = [
            replace(turn, content=clean_answer(turn.content)) if turn.role == "assistant" else turn
            for turn in history
        ]
        read = await thread_task if thread_task else None
        if read is not None:
            await self.urgent_first.step_aside(lane)  # the thread's posts are parsed and redacted
            bundle = bundle or ContextBundle(sections=[], notes=[], elapsed_ms=0.0)
            if isinstance(read, str):
                bundle.notes.append(thread_failed(read))
            else:
                read_back = thread_context(
                    read,
                    answering=message.message_id,
                    stored=history,
                    whole=whole,
                    keep_bot=lambda post: self._keeps_bot(adapter, post),
                    max_chars=self.thread.max_message_chars,
                    exclude=own or (),
                )
                bundle.sections.extend(read_back.sections)
                bundle.notes.append(read_back.note)
        return history, bundle, context_ms

    async def _follow_link(self, message: IncomingMessage, adapter: ChatAdapter) -> bool:
        """Whether ``message`` (``/rca summary <link>``) links to a thread of its channel, which then
        becomes the thread the answer goes into."""
        try:
            linked = await adapter.thread_from_link(message.text, message.channel)
        except PlatformError as exc:  # the linked post cannot be looked up: as if no link
            logger.warning("thread link in %s could not be followed: %s", message.channel, exc)
            linked = None
        if linked is None:
            return False
        message.thread_id = linked
        return True

    async def _read_thread(
        self, message: IncomingMessage, adapter: ChatAdapter, thread_id: str
    ) -> ThreadRead | str | None:
        """The thread from the platform, or the reason it could not be read (``None``: no thread)."""
        try:
            return await asyncio.wait_for(
                adapter.read_thread(
                    message.channel,
                    thread_id,
                    limit=self.thread.max_messages,
                    page_size=self.thread.page_size,
                ),
                self.thread.timeout_s,
            )
        except TimeoutError:
            return f"reading the thread took longer than {self.thread.timeout_s:g} s"
        except PlatformError as exc:
            return f"the thread could not be read: {exc}"

    def _keeps_bot(self, adapter: ChatAdapter, post: ThreadPost) -> bool:
        """The bot policy for a bot's message read back from a thread: kept only when the bot is in
        the platform's ``allowed_bots`` (no policy, as in the terminal: never)."""
        if adapter.access is None:
            return False
        return not adapter.access.ignores_bot(Author(True, post.bot_ids, post.bot_names, "thread message"))

    async def _channel_ref(self, message: IncomingMessage, adapter: ChatAdapter) -> ChannelRef:
        """Where ``message`` was asked, with the channel's name when a channel scope matches names
        and the event did not carry it (the adapter looks it up)."""
        name = message.channel_name
        if name is None and self.context is not None and self.context.scopes.needs_channel_names:
            try:
                name = await adapter.channel_name(message.channel)
            except PlatformError as exc:  # no name: id-based scopes still apply
                logger.warning("channel name of %s unknown: %s", message.channel, exc)
        return ChannelRef(message.platform, message.channel, name)

    async def _generate(
        self,
        request_id: str,
        events: _StartedStream,
        reply: ReplyStream,
        record: RequestRecord,
        before_text: asyncio.Future[None] | None = None,
        hold: UrgentHold | None = None,
        prefix: str = "",
        task: str = "",
        guard: EchoGuard | None = None,
    ) -> tuple[str, GenerationResult | None, str | None]:
        """Run the engine's stream (already submitted by :meth:`_prepare`) into ``reply``; returns
        (text, result, user-facing error).

        ``before_text`` (the sources line being shown) is awaited before the first text edit, so
        the reply's posts keep their order while the engine already works. An urgent answer's
        ``hold`` is released once its first words are visible; a non-urgent answer's edits step
        aside while urgent answers are on their way (``bot.urgency``). While all of the answer so far
        only copies its prompt, ``guard`` keeps it off the screen (it may be asked again).

        The request deadline is the engine layer's (``AdmittedEngine``): it raises
        :class:`RequestTimeoutError`, mapped here like every other branch of the engine's tree.
        """
        text = ""
        result: GenerationResult | None = None
        error: str | None = None
        last_update = 0.0
        lane = Lane(record.lane)
        try:
            async for event in events:
                if isinstance(event, TextDelta):
                    text += event.text
                    now = time.perf_counter()
                    # Until the first words are visible every delta is handed over (the text is
                    # short, and the platform may be waiting for a whole word); then 5 a second,
                    # but only while the reply's next edit is that close: the passes for edits the
                    # platform's interval would never send were 40-47% of the redaction work.
                    first = reply.first_visible_at is None and len(text) < _FIRST_WORDS_CHARS
                    due = now - last_update >= _UPDATE_EVERY_S
                    if first or (due and reply.seconds_to_next_edit() <= _UPDATE_EVERY_S):
                        if before_text is not None:
                            await before_text
                            before_text = None
                        await self.urgent_first.step_aside(lane)
                        last_update = time.perf_counter()
                        shown = clean_partial(text, task)
                        if guard is not None and guard.holds(shown):
                            shown = ""
                        # Not counted in the redaction metric: the final text is, once.
                        await reply.update(prefix + count_secrets(shown)[0])
                        if hold is not None and reply.first_visible_at is not None:
                            hold.release()
                elif isinstance(event, GenerationResult):
                    result = event
        except (EngineGenerateError, EngineDeadError) as exc:
            error = _engine_failure(exc, record)
        finally:
            events.close()
        if error is not None:
            record.error = record.error or error
            logger.warning("%s", record.error)
        if result is not None:
            text = result.text
            record.cached_tokens = result.cached_tokens
            record.output_tokens = result.output_tokens
            record.prompt_tokens = result.prompt_tokens or record.prompt_tokens
            record.queue_ms = result.queue_ms
            record.ttft_ms = result.ttft_ms
            record.tpot_ms = result.tpot_ms
        # One text for the thread, the postmortem file and the stored turn: fence markup the stops
        # missed is removed, and what no store or platform takes (NUL, lone surrogates: a random
        # model emits them) is replaced, here once.
        return clean_text(redact(clean_answer(text, task))), result, error

    async def _finish_record(self, record: RequestRecord, message: IncomingMessage) -> None:
        if record.e2e_ms is None:  # ended before an answer was complete: time to the failure
            record.e2e_ms = (time.perf_counter() - message.received_perf) * 1000
        record.finished_at = datetime.now(UTC)
        self._observe(record)
        await self.store.record_request(record)

    def _observe(self, record: RequestRecord) -> None:
        metrics.count_request(record.platform, record.scenario, record.lane, record.status)
        labels = (record.scenario, record.lane, record.platform)
        if record.queue_ms is not None:
            metrics.QUEUE.labels(*labels).observe(record.queue_ms / 1000)
        if record.ttft_ms is not None:
            metrics.TTFT.labels(*labels).observe(record.ttft_ms / 1000)
        if record.tpot_ms is not None:
            metrics.TPOT.labels(*labels).observe(record.tpot_ms / 1000)
        if record.e2e_ms is not None:
            metrics.E2E.labels(*labels).observe(record.e2e_ms / 1000)
        if record.prompt_tokens and record.status == "ok":
            metrics.CACHED_PROMPT_FRACTION.observe(record.cached_tokens / record.prompt_tokens)
            metrics.PROMPT_TOKENS.labels(*labels).inc(record.prompt_tokens)
            metrics.CACHED_PROMPT_TOKENS.labels(*labels).inc(record.cached_tokens)
        if record.output_tokens:
            metrics.OUTPUT_TOKENS.labels(*labels).inc(record.output_tokens)
        if self.slo is not None:
            if record.ttft_ms is not None:
                self.slo.observe(record.lane, record.ttft_ms / 1000)
            elif record.status in ("timeout", "overloaded") and record.e2e_ms is not None:
                # No first token at all: the wait the asker had is a lower bound of its TTFT.
                self.slo.observe(record.lane, record.e2e_ms / 1000)


def _legend(lines: Sequence[str]) -> list[str]:
    """Checklist lines shortened for the answer's legend (the mark and the detail left out)."""
    out = []
    for line in lines:
        body = line.split(" ", 1)[1] if " " in line else line
        out.append(body.split(" — ", 1)[0])
    return out


def _lanes_text(stats: EngineStats) -> str:
    return ", ".join(
        f"{lane.value} {stats.waiting_by_lane.get(lane.value, 0)} waiting / "
        f"{stats.running_by_lane.get(lane.value, 0)} running"
        for lane in Lane
    )


def _kv_text(stats: EngineStats) -> str:
    return "n/a" if stats.kv_cache_usage is None else f"{stats.kv_cache_usage * 100:.1f} %"


def _ttft_line(values: Sequence[float | None]) -> str:
    ttft = sorted(v for v in values if v is not None)
    if not ttft:
        return "TTFT last hour: no answers yet"
    return (
        f"TTFT last hour: p50 {(percentile(ttft, 50) or 0) / 1000:.2f} s, "
        f"p99 {(percentile(ttft, 99) or 0) / 1000:.2f} s "
        f"({len(ttft)} answer{'' if len(ttft) == 1 else 's'})"
    )


_ASKED = (MessageKind.MENTION, MessageKind.DIRECT)
"""Kinds whose whole text ``status`` is a question for the status block, not for the model."""


def format_duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2 h 05 min``, ``3 d 4 h``: an uptime a person reads at a glance."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def _engine_failure(exc: EngineGenerateError | EngineDeadError, record: RequestRecord) -> str:
    """The user-facing text for a branch of the engine's error tree; sets the row's status."""
    if isinstance(exc, RequestTimeoutError):
        record.status = "timeout"
        error = TIMEOUT_TEXT.format(seconds=exc.seconds)
    elif isinstance(exc, EngineDeadError):
        record.status = "engine_dead"
        error = ENGINE_DEAD_TEXT
        record.error = f"engine dead: {exc}"[:500]
    elif isinstance(exc, EngineOverloadedError):
        record.status = "overloaded"
        error = OVERLOADED_TEXT.format(detail=exc)
    elif isinstance(exc, RequestAbortedError):
        record.status = "aborted"
        error = FAILED_TEXT.format(detail=f"the request was stopped ({exc})")
    else:
        record.status = "error"
        error = FAILED_TEXT.format(detail=exc)
    record.error = record.error or error
    return error


def _claimed_thread(message: IncomingMessage) -> str | None:
    """The thread an event's claim names: where its answer goes unless the reply starts a new one."""
    return message.thread_id or message.message_id


def _in_thread(message: IncomingMessage, reply: ReplyStream) -> IncomingMessage:
    """``message`` pointed at the thread its answer lives in (for a note after the answer began)."""
    message.thread_id = reply.thread_id
    return message


def _namespaces(bundle: ContextBundle | None) -> list[str]:
    """The namespaces an answer's context read (empty: any, or no cluster was read)."""
    used = bundle.scope if bundle is not None else []
    if not used or any(u.namespaces is None for u in used):
        return []
    return sorted({n for u in used for n in u.namespaces or ()})


@dataclass
class _Prepared:
    """What :meth:`Pipeline._prepare` hands to the reply: the context, the prompt, and the
    engine's events (``None`` when the prompt could not be built: then ``error`` says why)."""

    history: list[ThreadMessage]
    bundle: ContextBundle | None
    context_ms: float | None
    prompts: PromptBuilder
    plan: PromptPlan | None = None
    events: _StartedStream | None = None
    error: str | None = None
    investigation: Investigation | None = None
    """The loop's transcript and steps (``None``: answered from step 0 alone)."""
    steps: StepRelay | None = None
    task: str = ""
    """The prompt's last user turn: an answer that opens by copying it loses the copy."""
    engine: Engine | None = None
    request: GenerationRequest | None = None
    """The answer's latest request (:meth:`ask_again` derives the next draw's from it)."""
    delivered: bool = False
    """The final answer is posted: a shutdown after it adds no note to the thread."""
    _prompt: PromptText | None = None

    def failure(self, result: GenerationResult | None, error: str | None, text: str) -> str | None:
        """Why the last draw is no answer (:func:`bot.answer_clean.echo_verdict`: ``empty``, or
        ``echoed the prompt``), ``text`` being what is left of it once cleaned; ``None`` for an
        answer, a request that failed otherwise, or one that generated nothing (an evidence-only
        eval)."""
        if error is not None or result is None or not result.output_tokens or self.request is None:
            return None
        if not text.strip():
            return EMPTY
        return echo_verdict(result.text, self.prompt_text())

    def ask_again(
        self, result: GenerationResult | None, error: str | None, text: str, attempt: int
    ) -> GenerationRequest | None:
        """The request for draw ``attempt`` when the last draw is no answer (:meth:`failure`): the
        same prompt, the sampling of :func:`bot.answer_clean.ask_again`; ``None`` for an answer."""
        request = self.request
        if request is None or result is None or self.failure(result, error, text) is None:
            return None
        self.request = replace(
            request,
            request_id=f"{request.request_id.removesuffix(f'-again{attempt - 1}')}-again{attempt}",
            sampling=ask_again(request.sampling, result.text, self.prompt_text(), attempt),
        )
        return self.request

    def prompt_text(self) -> PromptText:
        """Every message of the answer's prompt, as the model saw them, read once for every draw's
        guard, verdict and copied phrases (the draws share the prompt)."""
        if self._prompt is None:
            messages = (self.request.messages if self.request else None) or ()
            self._prompt = PromptText("\n".join(m.content for m in messages))
        return self._prompt


class StepRelay:
    """Live step updates of an investigation: kept until the reply exists (the loop may start while
    the placeholder is being posted), then shown on it as they come (:meth:`ReplyStream.show_step`)."""

    def __init__(self) -> None:
        self.updates: list[StepUpdate] = []
        self._reply: ReplyStream | None = None

    async def __call__(self, update: StepUpdate) -> None:
        """Keep ``update`` and show it when the reply is there."""
        self.updates.append(update)
        if self._reply is not None:
            await self._reply.show_step(update, steps_text(self.updates))

    async def attach(self, reply: ReplyStream) -> None:
        """The reply is open: show what was kept, then every update as it comes."""
        self._reply = reply
        if self.updates:
            await reply.show_step(self.updates[-1], steps_text(self.updates))


class _StartedStream:
    """An engine stream submitted at once and read later: a task pulls its events into a queue
    (the engine never waits for the chat platform), and :meth:`close` aborts it (closing the
    engine's stream is its abort)."""

    def __init__(self, stream: AsyncIterator[GenerationEvent]) -> None:
        self._stream = stream
        self._events: asyncio.Queue[GenerationEvent | BaseException | None] = asyncio.Queue()
        self._pump = asyncio.create_task(self._pull(), name="engine-stream")

    async def _pull(self) -> None:
        try:
            async for event in self._stream:
                self._events.put_nowait(event)
            self._events.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # handed to the reader, raised where it reads
            self._events.put_nowait(exc)
        finally:
            with contextlib.suppress(Exception):
                await self._stream.aclose()  # type: ignore[attr-defined]

    def __aiter__(self) -> _StartedStream:
        return self

    async def __anext__(self) -> GenerationEvent:
        item = await self._events.get()
        if item is None:
            self._events.put_nowait(None)  # the end stays the end
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stop reading: an engine request still running is aborted (idempotent)."""
        self._pump.cancel()


def _discard(early: asyncio.Task[_Prepared] | None, prepared: _Prepared | None) -> None:
    """Abort the engine request of an answer that ended before its reply read it (the
    placeholder failed, shutdown): a prepare still running is cancelled, a finished one's stream
    closed."""
    if prepared is None and early is not None and early.done() and not early.cancelled():
        if early.exception() is None:
            prepared = early.result()
    elif early is not None and not early.done():
        early.cancel()
    if prepared is not None and prepared.events is not None:
        prepared.events.close()
