"""Running cases: each one through the whole pipeline, on the configured engine, scored.

Per case: the case's Kubernetes API and Prometheus API servers start on free ports; a copy of the
settings points a fresh :class:`~bot.context.gatherer.ContextGatherer` at them (a replayed request
gets its stored bundle instead); one message (a mention, or an Alertmanager notification) goes
through :meth:`Pipeline.handle <bot.pipeline.Pipeline.handle>` into a :class:`CaptureAdapter`; the
prompt the engine was given is read from a :class:`PromptTap`; the answer is scored against the
prompt's own text (:mod:`bot.eval.scorer`). One engine serves every case, started once.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.adapters.base import ChatAdapter, MessageSink, ReplyStream
from bot.config import KubernetesSettings, PrometheusSettings, RunbookSettings, ScopeSettings, Settings
from bot.context.alertmanager import describe
from bot.context.base import ContextBundle
from bot.context.gatherer import ContextGatherer
from bot.context.scope import ChannelRef
from bot.eval.cases import EvalCase
from bot.eval.evidence import FactEvidence, served_text, trace
from bot.eval.scorer import Score, missing_from_context, root_cause_score, score
from bot.investigate import Investigator, build_investigator
from bot.pipeline import Pipeline
from bot.prompts import PromptBuilder
from bot.replay import bundle_from_dict
from bot.store import StepRecord, Store
from bot.tools.recorded import recorded_registry
from bot.types import FinalAnswer, IncomingMessage, MessageKind, SourceNote
from inference.engine import (
    ChatMessage,
    Engine,
    GenerationEvent,
    GenerationRequest,
    GenerationResult,
    WrappedEngine,
)
from inference.scenarios import ALERT_SUMMARY, ScenarioRegistry

logger = logging.getLogger(__name__)

PLATFORM = "eval"


class PromptTap(WrappedEngine):
    """The configured engine, with the prompt of every request kept (the eval reads what reached it);
    with ``answer=False`` the engine is never asked (``--evidence-only``): every answer is empty."""

    def __init__(self, inner: Engine, *, answer: bool = True) -> None:
        super().__init__(inner)
        self.prompts: dict[str, list[ChatMessage]] = {}
        self.answer = answer

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationEvent]:  # type: ignore[override]
        self.prompts[request.request_id] = list(request.messages or [])
        if not self.answer:
            prompt_tokens = len(request.prompt_token_ids or [])
            yield GenerationResult(request.request_id, "", "length", prompt_tokens, 0, 0, 0.0, 0.0, None, 0.0)
            return
        async for event in self.inner.generate(request):
            yield event


class CaptureReply(ReplyStream):
    """Keeps the streamed text and the final answer instead of posting them."""

    def __init__(self, thread_id: str) -> None:
        self._thread_id = thread_id
        self.updates = 0
        self.final: FinalAnswer | None = None
        self.sources: list[SourceNote] = []

    @property
    def thread_id(self) -> str:
        return self._thread_id

    async def show_sources(self, sources: Sequence[SourceNote]) -> None:
        self.sources = list(sources)

    async def update(self, text: str) -> None:
        self.updates += 1
        if text and self.first_visible_at is None:
            self.first_visible_at = time.perf_counter()

    async def finish(self, answer: FinalAnswer) -> None:
        if self.first_visible_at is None:
            self.first_visible_at = time.perf_counter()
        self.final = answer


class CaptureAdapter(ChatAdapter):
    """A chat platform that keeps every reply and notice (the eval's adapter)."""

    platform = PLATFORM

    def __init__(self) -> None:
        self.replies: dict[str, CaptureReply] = {}
        self.notices: dict[str, list[str]] = {}

    async def start(self, submit: MessageSink) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def open_reply(self, message: IncomingMessage) -> ReplyStream:
        reply = CaptureReply(message.thread_id or f"eval-{message.request_id}")
        self.replies[message.request_id] = reply
        return reply

    async def send_notice(self, message: IncomingMessage, text: str, *, ephemeral: bool = False) -> None:
        self.notices.setdefault(message.request_id, []).append(text)


class TappedGatherer(ContextGatherer):
    """A gatherer that keeps every bundle it returns (the context before the budget fitted it)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bundles: list[ContextBundle] = []

    async def gather(
        self,
        question: str,
        *,
        scenario: str,
        alert: Mapping[str, Any] | None = None,
        channel: ChannelRef | None = None,
    ) -> ContextBundle:
        bundle = await super().gather(question, scenario=scenario, alert=alert, channel=channel)
        self.bundles.append(bundle)
        return bundle


class ReplayGatherer(ContextGatherer):
    """Gives every question the stored bundle of a replayed request instead of asking a cluster."""

    def __init__(self, bundle: ContextBundle) -> None:
        super().__init__()
        self.bundle = bundle

    async def gather(
        self,
        question: str,
        *,
        scenario: str,
        alert: Mapping[str, Any] | None = None,
        channel: ChannelRef | None = None,
    ) -> ContextBundle:
        return self.bundle


@dataclass(slots=True)
class CaseResult:
    """One case's outcome: the answer, its score, its latencies."""

    case_id: str
    title: str
    source: str
    scenario: str | None
    status: str
    """The request row's status (``ok``, ``timeout``, ``error`` ...), ``not_answered`` when the
    pipeline answered with a notice only, ``case_error`` when the case's servers failed."""
    answer: str = ""
    error: str | None = None
    score: Score | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    """Every draw's tokens (the request row's count)."""
    draws: int = 1
    """How many times the model was asked (above 1: the answer was empty or copied its prompt, and
    was asked again)."""
    context_chars: int = 0
    """Length of the prompt's user turn (context, question and task), in characters."""
    sources: list[str] = field(default_factory=list)
    """What each context source gave (``Kubernetes ok``, ``Prometheus failed``)."""
    not_in_context: list[str] = field(default_factory=list)
    """Expected objects or numbers the prompt never showed (why: ``evidence``)."""
    evidence: list[FactEvidence] = field(default_factory=list)
    """Each decisive fact: whether it reached the prompt, from which source, or where it was lost."""
    request_id: str = ""
    prompt: str = ""
    """The prompt's last user turn (kept in the JSON report for reading a case)."""
    loop: dict[str, Any] | None = None
    """With the investigation loop on: its steps (tokens, cached fraction of the previous step's
    prompt, TTFT, tool, status), how many calls parsed, the stop reason, the root-cause block and
    its entity score (:func:`bot.eval.scorer.root_cause_score`); ``None`` with the loop off."""


ProgressFn = Callable[[int, int, CaseResult], None]


class EvalRunner:
    """Runs cases one at a time through one pipeline's parts (engine, store, prompts, scenarios)."""

    def __init__(
        self,
        settings: Settings,
        *,
        engine: PromptTap,
        store: Store,
        prompts: PromptBuilder,
        scenarios: ScenarioRegistry,
        model_name: str,
        run_id: str,
        workdir: Path | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.store = store
        self.prompts = prompts
        self.scenarios = scenarios
        self.model_name = model_name
        self.run_id = run_id
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="opsbot-eval-"))

    async def run(self, cases: Sequence[EvalCase], progress: ProgressFn | None = None) -> list[CaseResult]:
        """Every case in order; ``progress(index, total, result)`` after each."""
        results = []
        for index, case in enumerate(cases, 1):
            result = await self.run_case(case)
            results.append(result)
            if progress is not None:
                progress(index, len(cases), result)
        return results

    async def run_case(self, case: EvalCase) -> CaseResult:
        """One case through the pipeline, scored (never raises for a per-case problem)."""
        kube = case.kubernetes_server()
        prom = case.prometheus_server()
        gatherer: ContextGatherer | None = None
        try:
            if kube is not None:
                await kube.start()
            if prom is not None:
                await prom.start()
            gatherer = self._gatherer(case, kube, prom)
            served = served_text(kube, prom) if case.replay is None else None
            return await self._answer(case, gatherer, served)
        except Exception as exc:  # a case's own servers or state failed: report it, run the rest
            logger.exception("eval case %s failed to run", case.id)
            return CaseResult(case.id, case.title, case.source, case.scenario, "case_error", error=str(exc))
        finally:
            if gatherer is not None:
                await gatherer.close()
            if prom is not None:
                await prom.stop()
            if kube is not None:
                await kube.stop()

    def _gatherer(self, case: EvalCase, kube: Any, prom: Any) -> ContextGatherer:
        if case.replay is not None:
            return ReplayGatherer(
                bundle_from_dict({"sections": case.replay.sections, "notes": case.replay.notes})
            )
        return TappedGatherer.from_settings(
            served_settings(self.settings, kube, prom, self.workdir / case.id)
        )

    async def _answer(self, case: EvalCase, gatherer: ContextGatherer, served: str | None) -> CaseResult:
        pipeline = Pipeline(
            engine=self.engine,
            store=self.store,
            prompts=self.prompts,
            scenarios=self.scenarios,
            context=gatherer,
            model_name=self.model_name,
            thread=self.settings.thread,
            answer=self.settings.answer,  # the watchdog's stall_s as configured (a slow CPU needs more)
            investigator=self._investigator(case, gatherer),
        )
        adapter = CaptureAdapter()
        message = await self._message(case)
        started = datetime.now(UTC) - timedelta(seconds=1)
        await pipeline.handle(message, adapter)
        # The row as the pipeline wrote it (still buffered or already in the eval's database).
        rows = await self.store.requests_between(started)
        record = next((r for r in rows if r.request_id == message.request_id), None)
        reply = adapter.replies.get(message.request_id)
        final = reply.final if reply is not None else None
        prompt_messages = self.engine.prompts.get(message.request_id, [])
        prompt = prompt_messages[-1].content if prompt_messages else ""
        result = CaseResult(
            case_id=case.id,
            title=case.title,
            source=case.source,
            scenario=record.scenario if record else case.scenario,
            status=record.status if record else "not_answered",
            request_id=message.request_id,
            prompt=prompt,
            context_chars=len(prompt),
            sources=[f"{n.name} {n.status}" for n in (reply.sources if reply else [])],
        )
        # The whole prompt counts as context: the system prompt names no objects, the question may.
        context = "\n".join(m.content for m in prompt_messages)
        result.evidence = trace(case.expect, context, _gathered(gatherer), served)
        result.not_in_context = missing_from_context(case.expect, context)
        if record is None or final is None:
            result.error = " / ".join(adapter.notices.get(message.request_id, [])) or "no answer"
            return result
        result.answer = final.text if final.error is None else ""
        result.error = final.error
        result.ttft_ms = record.ttft_ms
        result.e2e_ms = record.e2e_ms
        result.tpot_ms = record.tpot_ms
        result.prompt_tokens = record.prompt_tokens
        result.output_tokens = record.output_tokens
        result.draws = final.draws
        result.score = score(
            result.answer, case.expect, context, question=message.text, failure=final.failure
        )
        if self.settings.investigate.enabled:
            steps = [
                st for st in await self.store.steps_between(started) if st.request_id == message.request_id
            ]
            result.loop = loop_summary(steps, record.root_cause, case.expect.root_cause)
        return result

    def _investigator(self, case: EvalCase, gatherer: ContextGatherer) -> Investigator | None:
        """The loop when it is on: a replayed case's with the recorded tools (no cluster asked)."""
        recording = case.replay.investigation if case.replay is not None else None
        if recording is not None and self.settings.investigate.enabled:
            return Investigator(recorded_registry(gatherer, recording), self.settings.investigate)
        return build_investigator(self.settings, gatherer)

    async def _message(self, case: EvalCase) -> IncomingMessage:
        case_key = f"{self.run_id}-{case.id}"
        thread_id = None
        replay = case.replay
        if replay is not None and replay.history:
            # The turns it saw, as a thread of the eval's store: the pipeline reads them back itself.
            thread_id = f"replay-{case_key}"
            for turn in replay.history:
                await self.store.append_message(
                    PLATFORM,
                    PLATFORM,
                    thread_id,
                    "assistant" if turn.get("role") == "assistant" else "user",
                    str(turn.get("content", "")),
                    user=turn.get("user"),
                )
        if case.alert is not None:
            return IncomingMessage(
                platform=PLATFORM,
                event_id=case_key,
                channel=PLATFORM,
                user="alertmanager",
                user_name="Alertmanager",
                text=describe(case.alert),
                kind=MessageKind.ALERT,
                thread_id=thread_id,
                scenario=ALERT_SUMMARY,
                extra={"alert": case.alert},
            )
        assert case.question is not None
        asker = replay.asker if replay is not None and replay.asker else "eval"
        return IncomingMessage(
            platform=PLATFORM,
            event_id=case_key,
            channel=PLATFORM,
            user=asker,
            user_name=asker,
            text=case.question,
            kind=MessageKind.MENTION,
            thread_id=thread_id,
            message_id=f"{case_key}-q" if thread_id else None,
            scenario=case.scenario,
        )


def served_settings(base: Settings, kube: Any, prom: Any, stem: Path) -> Settings:
    """``base`` with its context sources pointed at a case's started servers, and nothing else
    (no other cluster, scope or runbook): ``kube`` through a kubeconfig written at
    ``stem.kubeconfig``, ``prom`` by URL; a source the case has no server for is off."""
    update: dict[str, Any] = {
        "clusters": {},
        "scope": ScopeSettings(),
        "runbooks": RunbookSettings(),
        "kubernetes": KubernetesSettings(),
        "prometheus": PrometheusSettings(),
    }
    if kube is not None:
        config = kube.write_kubeconfig(stem.with_name(f"{stem.name}.kubeconfig"), context="eval")
        update["kubernetes"] = base.kubernetes.model_copy(
            update={
                "enabled": True,
                "kubeconfig": config,
                "context": "eval",
                "namespaces": [],
                "label_selector": None,
            }
        )
    if prom is not None:
        update["prometheus"] = base.prometheus.model_copy(
            update={"enabled": True, "url": prom.url, "bearer_token": None}
        )
    return base.model_copy(update=update)


def loop_summary(
    steps: Sequence[StepRecord], root_cause: str | None, expected: Sequence[Sequence[str]]
) -> dict[str, Any]:
    """One case's investigation for the report: its steps with each one's cached prompt tokens as a
    share of the previous step's prompt, the calls that parsed, and the root-cause entity score."""
    rows = []
    previous = 0
    for step in steps:
        rows.append(
            {
                "step": step.index,
                "kind": step.kind,
                "tool": step.tool,
                "arguments": step.arguments,
                "status": step.status,
                "prompt_tokens": step.prompt_tokens,
                "cached_tokens": step.cached_tokens,
                "output_tokens": step.output_tokens,
                "cached_of_previous": round(step.cached_tokens / previous, 4) if previous else None,
                "ttft_ms": step.ttft_ms,
                "decode_ms": step.decode_ms,
                "tool_ms": step.tool_ms,
                "tool_tokens": step.tool_tokens,
            }
        )
        previous = step.prompt_tokens or previous
    calls = [s for s in steps if s.kind == "call"]
    block = json.loads(root_cause) if root_cause else None
    named = block.get("root_cause", []) if isinstance(block, dict) else []
    return {
        "steps": rows,
        "calls": len(calls),
        "calls_parsed": sum(1 for s in calls if s.status != "unparsed"),
        "tool_calls": sum(1 for s in calls if s.status not in ("unparsed", "final")),
        "prompt_tokens": sum(s.prompt_tokens for s in steps),
        "cached_tokens": sum(s.cached_tokens for s in steps),
        "output_tokens": sum(s.output_tokens for s in steps),
        "root_cause": block,
        "root_cause_score": root_cause_score(named, expected),
    }


def _gathered(gatherer: ContextGatherer) -> str:
    """Every section the gatherer returned, before the budget fitted them, as one text."""
    if isinstance(gatherer, TappedGatherer):
        bundles = gatherer.bundles
    elif isinstance(gatherer, ReplayGatherer):
        bundles = [gatherer.bundle]
    else:
        bundles = []
    return "\n".join(f"{s.title}\n{s.body}" for b in bundles for s in b.sections)


def scenario_overrides(settings: Settings, max_tokens: int | None) -> dict[str, dict[str, Any]]:
    """The configured scenario overrides, with every scenario's answer capped at ``max_tokens``."""
    overrides = settings.sampling_overrides()  # without the `engine` keys (eval runs one engine)
    if max_tokens is not None:
        for name in ScenarioRegistry(overrides).names:
            overrides.setdefault(name, {})["max_tokens"] = max_tokens
    return overrides
