"""The one flow every question takes, from an adapter's ``IncomingMessage`` to a stored answer.

claim the event (de-duplication) -> commands (help / status) -> scenario and lane -> placeholder
in the thread -> thread history + cluster context (concurrently) -> prompt (token ids) -> engine
stream -> throttled edits -> final answer with footer -> thread turns and one request row stored.

Every failure ends as a short message in the thread and a request row with its status: the user
never meets silence, and the store never misses a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from bot import metrics
from bot.adapters.base import ChatAdapter, ReplyStream
from bot.adapters.streaming import ReplyDeliveryError
from bot.context.base import ContextBundle
from bot.context.redact import redact
from bot.prompts import PromptBuilder
from bot.store import RequestRecord, Store, ThreadMessage
from bot.store.records import percentile
from bot.types import FinalAnswer, IncomingMessage, MessageKind
from inference.engine import (
    Engine,
    EngineDeadError,
    EngineGenerateError,
    EngineOverloadedError,
    GenerationRequest,
    GenerationResult,
    Lane,
    RequestAbortedError,
    TextDelta,
)
from inference.scenarios import ALERT_SUMMARY, CHANGE_REVIEW, CHAT, ROOT_CAUSE, ScenarioRegistry

if TYPE_CHECKING:  # the gatherer pulls in the cluster clients; the pipeline only calls it
    from bot.context.gatherer import ContextGatherer

logger = logging.getLogger(__name__)

_CHANGE_WORDS = ("rollout", "roll out", "deploy", "release", "change review", "review the change", "diff")
_CAUSE_WORDS = ("root cause", "why is", "why are", "why did", "rca", "what caused", "crashloop", "failing")
_UPDATE_EVERY_S = 0.05  # redact + hand partial text to the adapter at most this often

ENGINE_DEAD_TEXT = (
    ":warning: The model engine is down right now and is being restarted. "
    "Your question was not answered; please ask again in a minute."
)
OVERLOADED_TEXT = ":hourglass: opsbot is overloaded right now ({detail}). Please try again shortly."
FAILED_TEXT = ":warning: Generating the answer failed: {detail}"
TIMEOUT_TEXT = ":warning: The answer took longer than {seconds:.0f} s and was stopped."


@dataclass(slots=True)
class PipelineConfig:
    """The pipeline's knobs (from ``bot.config``)."""

    request_timeout_s: float = 300.0
    model_name: str = ""


def pick_scenario(message: IncomingMessage) -> str:
    """The scenario for ``message``: forced, by kind, then by what the text asks for."""
    if message.scenario:
        return message.scenario
    if message.kind is MessageKind.ALERT:
        return ALERT_SUMMARY
    text = message.text.lower()
    if any(w in text for w in _CHANGE_WORDS):
        return CHANGE_REVIEW
    if message.kind is MessageKind.COMMAND or any(w in text for w in _CAUSE_WORDS):
        return ROOT_CAUSE
    return CHAT


def pick_lane(message: IncomingMessage) -> Lane:
    """Urgent for ``/rca`` and alerts, background for thread follow-ups, normal otherwise."""
    if message.kind in (MessageKind.COMMAND, MessageKind.ALERT):
        return Lane.URGENT
    if message.kind is MessageKind.FOLLOWUP:
        return Lane.BACKGROUND
    return Lane.NORMAL


class Pipeline:
    """Answers questions: owns the flow, not the platforms, the engine or the database."""

    def __init__(
        self,
        *,
        engine: Engine,
        store: Store,
        prompts: PromptBuilder,
        scenarios: ScenarioRegistry,
        context: ContextGatherer | None = None,
        config: PipelineConfig | None = None,
    ) -> None:
        self.engine = engine
        self.store = store
        self.prompts = prompts
        self.scenarios = scenarios
        self.context = context
        self.config = config or PipelineConfig()
        self._tasks: set[asyncio.Task[None]] = set()

    # -- entry points ------------------------------------------------------------------------
    def submit(self, message: IncomingMessage, adapter: ChatAdapter) -> asyncio.Task[None]:
        """Handle ``message`` in the background (adapters ack first, then call this)."""
        task = asyncio.create_task(self.handle(message, adapter), name=f"handle-{message.event_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def drain(self, timeout_s: float) -> None:
        """Wait for submitted messages to finish, up to ``timeout_s``; cancel what is left."""
        if not self._tasks:
            return
        _, pending = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in pending:
            task.cancel()
        if pending:
            logger.warning("shutdown: %d answers still running were cancelled", len(pending))
            await asyncio.gather(*pending, return_exceptions=True)

    async def handle(self, message: IncomingMessage, adapter: ChatAdapter) -> None:
        """Answer ``message`` through ``adapter``; never raises for a per-message problem."""
        message.text = redact(message.text)
        if not await self.store.claim_event(message.platform, message.event_id):
            metrics.EVENTS_DUPLICATE.labels(message.platform).inc()
            logger.info("duplicate event %s:%s dropped", message.platform, message.event_id)
            return
        try:
            if message.kind is MessageKind.COMMAND and await self._command(message, adapter):
                return
            await self._answer(message, adapter)
        except Exception:  # last line of defence: log it, the adapter's loop must go on
            logger.exception("unexpected failure answering %s:%s", message.platform, message.event_id)

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

    def help_text(self) -> str:
        """Usage of ``/rca`` and of mentions, for ``/rca help``."""
        return (
            "*opsbot* — incident assistant (reads the cluster, never changes it)\n"
            "• `/rca <question, alert, pod or service>` — root-cause analysis in a new thread "
            "(urgent lane)\n"
            "• `/rca status` — model, queue per lane, KV-cache use, TTFT of the last hour\n"
            "• `/rca help` — this message\n"
            "• @-mention me with a question, or DM me; reply in my threads to follow up "
            "without mentioning me again\n"
            "• Mention *review*, *rollout* or *deploy* for a change review."
        )

    async def status_text(self) -> str:
        """One status block: model, health, queue per lane, KV cache, TTFT p50 / p99 (last hour)."""
        stats = self.engine.stats()
        health = self.engine.health()
        ttft = sorted(await self.store.recent_ttft(datetime.now(UTC) - timedelta(hours=1)))
        lanes = ", ".join(
            f"{lane.value} {stats.waiting_by_lane.get(lane.value, 0)} waiting / "
            f"{stats.running_by_lane.get(lane.value, 0)} running"
            for lane in Lane
        )
        kv = "n/a" if stats.kv_cache_usage is None else f"{stats.kv_cache_usage * 100:.1f} %"
        hit = "n/a" if stats.prefix_cache_hit_rate is None else f"{stats.prefix_cache_hit_rate * 100:.1f} %"
        if ttft:
            ttft_line = (
                f"TTFT last hour: p50 {(percentile(ttft, 50) or 0) / 1000:.2f} s, "
                f"p99 {(percentile(ttft, 99) or 0) / 1000:.2f} s "
                f"({len(ttft)} answer{'' if len(ttft) == 1 else 's'})"
            )
        else:
            ttft_line = "TTFT last hour: no answers yet"
        state = "ready" if health.ready else f"NOT READY ({health.reason})"
        quant = f", quantization {stats.quantization}" if stats.quantization else ""
        return "\n".join(
            [
                f"*opsbot status* — engine {stats.backend}, model `{stats.model}`{quant}: {state}",
                f"Queue: {lanes}",
                f"KV cache in use: {kv}; prefix-cache hit rate: {hit}",
                ttft_line,
                f"Store: {'up' if await self.store.ping() else 'DOWN'}, "
                f"{self.store.buffered} rows buffered, {self.store.dropped} dropped",
            ]
        )

    # -- answering ---------------------------------------------------------------------------
    async def _answer(self, message: IncomingMessage, adapter: ChatAdapter) -> None:
        started = time.perf_counter()
        request_id = uuid.uuid4().hex[:16]
        scenario = pick_scenario(message)
        lane = pick_lane(message)
        sampling = self.scenarios.get(scenario)
        log = {"request_id": request_id, "platform": message.platform, "channel": message.channel}
        record = RequestRecord(
            request_id=request_id,
            platform=message.platform,
            channel=message.channel,
            thread_id=message.thread_id,
            user=message.user,
            scenario=scenario,
            lane=lane.value,
            status="ok",
            model=self.config.model_name,
        )
        logger.info(
            "request %s: %s/%s %s lane=%s",
            request_id,
            message.platform,
            message.channel,
            scenario,
            lane.value,
            extra=log,
        )

        try:
            reply = await adapter.open_reply(message)
        except Exception as exc:
            metrics.REPLIES_FAILED.labels(message.platform).inc()
            logger.error("request %s: cannot post the placeholder: %s", request_id, exc, extra=log)
            record.status, record.error = "error", f"placeholder: {exc}"[:500]
            await self._finish_record(record, started)
            return
        record.thread_id = reply.thread_id

        history, bundle, context_ms = await self._gather(message, reply.thread_id, scenario)
        record.context_ms = context_ms
        plan = self.prompts.build(
            scenario=scenario,
            question=message.text,
            asker=message.user_name or message.user,
            history=history,
            context=bundle,
            max_tokens=sampling.max_tokens,
        )
        record.prompt_tokens = plan.prompt_tokens
        request = GenerationRequest(
            request_id=request_id,
            scenario=scenario,
            lane=lane,
            sampling=sampling,
            prompt_token_ids=plan.token_ids,
        )
        text, result, error = await self._generate(request, reply, record)
        answer = FinalAnswer(
            request_id=request_id,
            text=error or text,
            sources=list(bundle.notes) if bundle else [],
            left_out=plan.left_out,
            ttft_ms=result.ttft_ms if result else None,
            tpot_ms=result.tpot_ms if result else None,
            total_ms=(time.perf_counter() - started) * 1000,
            output_tokens=result.output_tokens if result else None,
            error=error,
            feedback=error is None,
        )
        post_started = time.perf_counter()
        try:
            await reply.finish(answer)
        except ReplyDeliveryError as exc:
            metrics.REPLIES_FAILED.labels(message.platform).inc()
            logger.error("request %s: reply could not be posted: %s", request_id, exc, extra=log)
            record.status, record.error = "error", f"post: {exc}"[:500]
        record.post_ms = (time.perf_counter() - post_started) * 1000

        thread = (message.platform, message.channel, reply.thread_id)
        await self.store.append_message(
            *thread, "user", message.text, user=message.user, request_id=request_id
        )
        if error is None:
            await self.store.append_message(*thread, "assistant", answer.text, request_id=request_id)
        await self._finish_record(record, started)

    async def _gather(
        self, message: IncomingMessage, thread_id: str, scenario: str
    ) -> tuple[list[ThreadMessage], ContextBundle | None, float | None]:
        """Thread history and cluster context, fetched concurrently."""
        history_task = None
        if message.kind is MessageKind.FOLLOWUP or message.thread_id:
            history_task = asyncio.create_task(
                self.store.thread_history(message.platform, message.channel, thread_id)
            )
        bundle: ContextBundle | None = None
        context_ms: float | None = None
        if self.context is not None:
            t0 = time.perf_counter()
            alert = message.extra.get("alert")
            bundle = await self.context.gather(
                message.text, scenario=scenario, alert=alert if isinstance(alert, dict) else None
            )
            context_ms = (time.perf_counter() - t0) * 1000
            metrics.CONTEXT.observe(context_ms / 1000)
        history = await history_task if history_task else []
        return history, bundle, context_ms

    async def _generate(
        self, request: GenerationRequest, reply: ReplyStream, record: RequestRecord
    ) -> tuple[str, GenerationResult | None, str | None]:
        """Run the engine stream into ``reply``; returns (text, result, user-facing error)."""
        text = ""
        result: GenerationResult | None = None
        error: str | None = None
        last_update = 0.0
        stream = self.engine.generate(request)
        try:
            async with asyncio.timeout(self.config.request_timeout_s):
                async for event in stream:
                    if isinstance(event, TextDelta):
                        text += event.text
                        now = time.perf_counter()
                        if now - last_update >= _UPDATE_EVERY_S:
                            last_update = now
                            await reply.update(redact(text))
                    elif isinstance(event, GenerationResult):
                        result = event
        except TimeoutError:
            record.status = "aborted"
            error = TIMEOUT_TEXT.format(seconds=self.config.request_timeout_s)
        except EngineDeadError as exc:
            record.status = "error"
            error = ENGINE_DEAD_TEXT
            record.error = f"engine dead: {exc}"[:500]
        except EngineOverloadedError as exc:
            record.status = "overloaded"
            error = OVERLOADED_TEXT.format(detail=exc)
        except RequestAbortedError as exc:
            record.status = "aborted"
            error = FAILED_TEXT.format(detail=f"the request was stopped ({exc})")
        except EngineGenerateError as exc:
            record.status = "error"
            error = FAILED_TEXT.format(detail=exc)
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]
        if error is not None:
            record.error = record.error or error
            logger.warning("request %s: %s", request.request_id, record.error)
        if result is not None:
            text = result.text
            record.cached_tokens = result.cached_tokens
            record.output_tokens = result.output_tokens
            record.prompt_tokens = result.prompt_tokens or record.prompt_tokens
            record.queue_ms = result.queue_ms
            record.ttft_ms = result.ttft_ms
            record.tpot_ms = result.tpot_ms
            self._observe(request, result)
        return redact(text), result, error

    def _observe(self, request: GenerationRequest, result: GenerationResult) -> None:
        lane = request.lane.value
        metrics.QUEUE.labels(lane).observe(result.queue_ms / 1000)
        if result.ttft_ms is not None:
            metrics.TTFT.labels(request.scenario, lane).observe(result.ttft_ms / 1000)
        if result.tpot_ms is not None:
            metrics.TPOT.labels(request.scenario).observe(result.tpot_ms / 1000)
        metrics.E2E.labels(request.scenario, lane).observe(result.e2e_ms / 1000)
        if result.prompt_tokens:
            metrics.CACHED_PROMPT_FRACTION.observe(result.cached_tokens / result.prompt_tokens)

    async def _finish_record(self, record: RequestRecord, started: float) -> None:
        record.e2e_ms = (time.perf_counter() - started) * 1000
        record.finished_at = datetime.now(UTC)
        metrics.REQUESTS.labels(record.platform, record.scenario, record.lane, record.status).inc()
        await self.store.record_request(record)
