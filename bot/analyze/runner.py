"""Running a batch: executors (how items reach an engine) and the runner (what every item leaves).

Two executors, one contract (``run(items, sampling, done, stop)``):

- :class:`OfflineExecutor`: vLLM's offline engine (:mod:`inference.vllm_batch`) over the whole set
  at once, static batching at the widest batch the KV cache holds. ``opsbot analyze`` uses it on a
  GPU when no bot is running: nothing else waits, so nothing is held back.
- :class:`EngineExecutor`: any :class:`~inference.engine.Engine` through its normal interface, a
  bounded number of items at once, in the background lane. That is the CPU engine standalone, and
  inside a running bot the bot's own admitted engine: admission holds background work while urgent
  work waits or prefills, so a batch never delays ``/rca`` answers or alert summaries.

The :class:`BatchRunner` skips items already in ``results.jsonl``, and for every item that ran it
appends the result the moment it completes (``results.jsonl``), writes its request row through the
store (scenario ``batch``, lane ``background``) and advances the progress bar. ``stop`` (Ctrl-C)
ends the run early: finished items stay, running ones are aborted and recorded as ``aborted``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from bot.analyze.progress import ProgressSink
from bot.analyze.results import ItemResult, ResultLog
from bot.analyze.work import WorkItem
from bot.answer_clean import ASK_AGAIN, ask_again, clean_answer, echo_verdict
from bot.config import RetrySettings
from bot.redact import redact
from bot.retry import RetriesExhausted, RetryBudget
from bot.routing import BATCH_SCENARIO, lane_for
from bot.store import RequestRecord, Store
from bot.types import MessageKind
from inference.engine import (
    Engine,
    EngineDeadError,
    EngineGenerateError,
    EngineOverloadedError,
    GenerationRequest,
    GenerationResult,
    RequestAbortedError,
    RequestTimeoutError,
    SamplingSettings,
)

if TYPE_CHECKING:  # the offline engine pulls in vLLM's helpers; only its type is needed here
    from inference.vllm_batch import OfflineBatchEngine

logger = logging.getLogger(__name__)

Done = Callable[[WorkItem, GenerationResult | None, str | None, str], Coroutine[Any, Any, None]]
"""``done(item, result, error, status)``: an item's request ended (``status`` as a request row's)."""
RequestIds = Callable[[WorkItem], str]

OVERLOADED_RETRY = RetrySettings(max_retries=5, initial_s=1.0, max_s=32.0)
"""How an item the admission queue refused is offered again (a full lane is a wait, not a failure):
up to 5 more times, backing off from about 1 s, under the one retry policy (:mod:`bot.retry`)."""


class Executor(abc.ABC):
    """How the items of a batch reach an engine."""

    mode: str = "abstract"

    @abc.abstractmethod
    async def run(
        self, items: Sequence[WorkItem], sampling: SamplingSettings, done: Done, stop: asyncio.Event
    ) -> None:
        """Generate every item (calling ``done`` once for each one that was started) until all ran or
        ``stop`` is set."""


def _status_of(exc: EngineGenerateError | EngineDeadError) -> str:
    if isinstance(exc, RequestTimeoutError):
        return "timeout"
    if isinstance(exc, EngineDeadError):
        return "engine_dead"
    if isinstance(exc, EngineOverloadedError):
        return "overloaded"
    if isinstance(exc, RequestAbortedError):
        return "aborted"
    return "error"


class EngineExecutor(Executor):
    """Items through :meth:`Engine.generate`, at most ``concurrency`` at once, in the batch lane."""

    mode = "engine"

    def __init__(self, engine: Engine, concurrency: int, request_id: RequestIds) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.engine = engine
        self.concurrency = concurrency
        self.request_id = request_id

    async def run(
        self, items: Sequence[WorkItem], sampling: SamplingSettings, done: Done, stop: asyncio.Event
    ) -> None:
        queue: Iterator[WorkItem] = iter(items)
        dead = asyncio.Event()

        async def worker() -> None:
            for item in queue:
                if stop.is_set() or dead.is_set():
                    return
                await self._one(item, sampling, done, stop, dead)

        workers = [asyncio.create_task(worker()) for _ in range(min(self.concurrency, len(items)))]
        everyone: asyncio.Future[list[None]] = asyncio.gather(*workers)
        everyone.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved, even when stopped
        stopper = asyncio.create_task(_first_of(stop, dead))
        ran_out = False
        try:
            await asyncio.wait([everyone, stopper], return_when=asyncio.FIRST_COMPLETED)  # type: ignore[type-var]
            ran_out = everyone.done()
        finally:
            stopper.cancel()
            for task in workers:
                task.cancel()  # an item still generating is aborted in the engine (closing its stream)
            await asyncio.gather(*workers, return_exceptions=True)
        if ran_out:
            everyone.result()  # a worker's unexpected error surfaces here

    async def _one(
        self, item: WorkItem, sampling: SamplingSettings, done: Done, stop: asyncio.Event, dead: asyncio.Event
    ) -> None:
        request = GenerationRequest(
            request_id=self.request_id(item),
            scenario=item.scenario,
            lane=lane_for(MessageKind.BATCH, item.scenario),
            sampling=sampling,
            prompt_token_ids=item.token_ids,
        )
        retry = RetryBudget(OVERLOADED_RETRY)
        asked_again = 0
        while True:
            try:
                result = await _generate(self.engine, request)
            except asyncio.CancelledError:
                # Interrupted while generating: the request still gets its row.
                with contextlib.suppress(Exception):
                    await asyncio.shield(done(item, None, "stopped before it finished", "aborted"))
                raise
            except EngineOverloadedError as exc:
                try:
                    delay = retry.after_failure(str(exc))
                except RetriesExhausted:
                    delay = None
                if delay is not None and not stop.is_set():
                    logger.info("batch item %s waits %.1f s: %s", request.request_id, delay, exc)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), delay)
                    if not stop.is_set():
                        continue
                await done(item, None, str(exc), "overloaded")
                return
            except (EngineGenerateError, EngineDeadError) as exc:
                if isinstance(exc, EngineDeadError):
                    dead.set()  # every later item would fail the same way: stop and say so
                await done(item, None, str(exc), _status_of(exc))
                return
            if asked_again < ASK_AGAIN and not stop.is_set() and echo_verdict(result.text, item.prompt):
                asked_again += 1
                logger.info("batch item %s copied its prompt back: asked again", request.request_id)
                request = replace(
                    request,
                    request_id=f"{self.request_id(item)}-again{asked_again}",
                    sampling=ask_again(request.sampling, result.text, item.prompt, asked_again),
                )
                continue
            await done(item, result, None, "ok")
            return


async def _generate(engine: Engine, request: GenerationRequest) -> GenerationResult:
    """The final result of one request (its text deltas are not needed: nobody watches them)."""
    result: GenerationResult | None = None
    stream = engine.generate(request)
    try:
        async for event in stream:
            if isinstance(event, GenerationResult):
                result = event
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()
    if result is None:
        raise EngineGenerateError(f"request {request.request_id} ended without a result")
    return result


async def _first_of(*events: asyncio.Event) -> None:
    waits = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()


class OfflineExecutor(Executor):
    """The whole set through vLLM's offline engine at once (static batching), off the event loop."""

    mode = "offline"

    def __init__(self, batch: OfflineBatchEngine, request_id: RequestIds) -> None:
        self.batch = batch
        self.request_id = request_id

    async def run(
        self, items: Sequence[WorkItem], sampling: SamplingSettings, done: Done, stop: asyncio.Event
    ) -> None:
        loop = asyncio.get_running_loop()
        by_id = {self.request_id(item): item for item in items}
        requests = [
            GenerationRequest(
                request_id=rid,
                scenario=item.scenario,
                lane=lane_for(MessageKind.BATCH, item.scenario),
                sampling=sampling,
                prompt_token_ids=item.token_ids,
            )
            for rid, item in by_id.items()
        ]
        halt = threading.Event()
        handed: list[Future[None]] = []

        def on_done(rid: str, result: GenerationResult | None, error: str | None) -> None:
            # Called from the engine's thread: the bookkeeping (file, store, progress) runs on the loop.
            status = "ok" if result is not None else ("aborted" if halt.is_set() else "error")
            handed.append(asyncio.run_coroutine_threadsafe(done(by_id[rid], result, error, status), loop))

        async def relay_stop() -> None:
            await stop.wait()
            halt.set()

        relay = asyncio.create_task(relay_stop())
        try:
            stats = await asyncio.to_thread(self.batch.run, requests, on_done, halt)
        finally:
            relay.cancel()
            await asyncio.gather(*(asyncio.wrap_future(f) for f in list(handed)), return_exceptions=True)
        logger.info(
            "offline batch: %d submitted, %d finished, %d failed, %d stopped, %.1f s",
            stats.submitted,
            stats.finished,
            stats.failed,
            stats.aborted,
            stats.wall_s,
        )


@dataclass(slots=True)
class RunSummary:
    """What one run did (numbers of items, tokens and seconds)."""

    mode: str
    total: int
    skipped: int
    """Items already finished by an earlier run."""
    finished: int = 0
    failed: int = 0
    aborted: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    interrupted: bool = False
    statuses: dict[str, int] | None = None

    @property
    def items_per_s(self) -> float:
        """Items finished by this run per second of it."""
        return self.finished / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens this run generated per second."""
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def as_json(self) -> dict[str, Any]:
        """For the JSON report."""
        return {
            "mode": self.mode,
            "items": self.total,
            "skipped_already_done": self.skipped,
            "finished": self.finished,
            "failed": self.failed,
            "aborted": self.aborted,
            "interrupted": self.interrupted,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "wall_s": round(self.wall_s, 3),
            "items_per_s": round(self.items_per_s, 3),
            "output_tokens_per_s": round(self.output_tokens_per_s, 1),
            "statuses": self.statuses or {},
        }


class BatchRunner:
    """Runs work items through an executor; keeps what each one leaves (see the module doc)."""

    def __init__(
        self,
        *,
        results: ResultLog,
        store: Store | None,
        run_id: str,
        model: str,
        progress: ProgressSink,
        platform: str = "analyze",
        channel: str | None = None,
    ) -> None:
        self.results = results
        self.store = store
        self.run_id = run_id
        self.model = model
        self.progress = progress
        self.platform = platform
        self.channel = channel
        self.finished: dict[str, ItemResult] = {}

    def request_id(self, item: WorkItem) -> str:
        """The id of ``item``'s request (and its row): the run id and the item id."""
        return f"batch-{self.run_id}-{item.id[:16]}"

    async def run(
        self, items: Sequence[WorkItem], executor: Executor, sampling: SamplingSettings, stop: asyncio.Event
    ) -> RunSummary:
        """Run every item not finished yet; returns what this run did."""
        wanted = {item.id for item in items}
        self.finished = {k: v for k, v in self.load_finished().items() if k in wanted}
        todo = [item for item in items if item.id not in self.finished]
        summary = RunSummary(
            mode=executor.mode, total=len(items), skipped=len(items) - len(todo), statuses={}
        )
        if self.store is not None:
            # Rows of items finished earlier again (an upsert by request id): a run killed before the
            # store's buffer was written loses no row.
            for earlier in self.finished.values():
                await self.store.record_request(earlier.to_record())
        if not todo:
            return summary
        self.progress.start(len(items), summary.skipped, f"analyze ({items[0].scenario}, {executor.mode})")
        t0 = time.perf_counter()

        async def done(
            item: WorkItem, result: GenerationResult | None, error: str | None, status: str
        ) -> None:
            await self._done(item, result, error, status, summary, executor.mode)

        try:
            await executor.run(todo, sampling, done, stop)
        finally:
            summary.wall_s = time.perf_counter() - t0
            summary.interrupted = stop.is_set() and summary.finished + summary.failed < len(todo)
            self.progress.finish()
            self.results.close()
        return summary

    def load_finished(self) -> dict[str, ItemResult]:
        """Items finished by earlier runs into this folder (unreadable lines are logged)."""
        done, bad = self.results.load()
        for line in bad:
            logger.warning("%s", line)
        return done

    async def _done(
        self,
        item: WorkItem,
        result: GenerationResult | None,
        error: str | None,
        status: str,
        summary: RunSummary,
        mode: str,
    ) -> None:
        now = datetime.now(UTC)
        rid = self.request_id(item)
        assert summary.statuses is not None
        summary.statuses[status] = summary.statuses.get(status, 0) + 1
        if result is not None:
            created = now - timedelta(milliseconds=result.e2e_ms)
            text = redact(clean_answer(result.text, item.task), where="batch")
            finished = ItemResult(
                id=item.id,
                group=item.group.key,
                scenario=item.scenario,
                request_id=rid,
                text=text,
                finish_reason=result.finish_reason,
                prompt_tokens=result.prompt_tokens or item.prompt_tokens,
                cached_tokens=result.cached_tokens,
                output_tokens=result.output_tokens,
                queue_ms=result.queue_ms,
                ttft_ms=result.ttft_ms,
                tpot_ms=result.tpot_ms,
                e2e_ms=result.e2e_ms,
                created_at=created.isoformat(),
                finished_at=now.isoformat(),
                model=self.model,
                mode=mode,
                platform=self.platform,
                channel=self.channel,
                left_out=item.left_out,
                # Judged on the text as the model wrote it: an answer that copied its whole last
                # turn is an echo, not the empty text its cleaning leaves.
                failure=echo_verdict(result.text, item.prompt),
            )
            self.results.append(finished)
            self.finished[item.id] = finished
            summary.finished += 1
            summary.prompt_tokens += finished.prompt_tokens
            summary.output_tokens += finished.output_tokens
            self.progress.advance()
            record = finished.to_record()
        else:
            if status == "aborted":
                summary.aborted += 1
            else:
                summary.failed += 1
                logger.warning("batch item %s (%s) failed: %s", rid, item.group.title, error)
            record = RequestRecord(
                request_id=rid,
                platform=self.platform,
                channel=self.channel,
                thread_id=None,
                user=None,
                scenario=BATCH_SCENARIO,
                lane=lane_for(MessageKind.BATCH, item.scenario).value,
                status=status,
                error=(error or status)[:500],
                model=self.model or None,
                prompt_tokens=item.prompt_tokens,
                finished_at=now,
            )
        if self.store is not None:
            await self.store.record_request(record)
