"""The investigation loop: after the gathered context (step 0), the model calls tools until it answers.

One investigation, for a scenario and lane whose budget allows it (``[investigate]``)::

    step 0   the pipeline's prompt: system prompt, fenced context, question (as without the loop),
             with the tool catalogue and the budget appended to the system prompt (where chat
             templates put OpenAI ``tools``): one prefix for every investigation with the same
             tools and lane, so the prefix cache holds it and step 1 prefills only the context
    step n   one decision under the tools' schema (constrained decoding: llama.cpp grammar, vLLM
             structured outputs, the server's ``tools``): a call, or ``final_answer``
             -> the call runs through the tool box (offered? repeated? in scope? timeout, redaction,
             output cap) -> its output is appended as a fenced, numbered, untrusted user turn
    answer   once the model says ``final_answer``, or the steps, tool tokens or wall clock are
             spent, or the window is full: one more user turn asks for the answer with citations
             [n] of the steps, and offers no tools (the pipeline streams it like any answer)

Cache-friendly by construction: the transcript is only ever appended to, and nothing volatile (a
time, a counter) sits in the system prompt or an earlier turn, so every step's prompt is the last
step's prompt plus its output plus the new turn: a prefix-cache hit on every engine (the records
show it: ``cached_tokens`` of step n against ``prompt_tokens`` of step n-1).

Safety: the tools, their schemas, the scope and the budgets are fixed before step 1 from
configuration and the channel's scope; tool outputs are data in fences. Text in a log line that
reads like an instruction can change neither; at most it steers which offered tool is called next
within the scope.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from bot import metrics
from bot.config import InvestigateSettings, LaneBudget, Settings
from bot.context.alertmanager_api import AlertmanagerApi
from bot.context.base import ContextBundle
from bot.context.gatherer import ContextGatherer
from bot.progress import waiting_for_engine
from bot.prompts import defuse, fence
from bot.store import StepRecord, ThreadMessage
from bot.tools.actions import PROPOSE_ACTION
from bot.tools.base import ProposedAction, object_name
from bot.tools.registry import ToolBox, ToolRegistry, ToolResult
from bot.types import StepUpdate
from inference.engine import (
    ChatMessage,
    ChatTokenizer,
    Engine,
    EngineDeadError,
    EngineGenerateError,
    GenerationRequest,
    GenerationResult,
    Lane,
    SamplingSettings,
    ToolSpec,
)
from inference.structured import complete_prefix, token_ceiling
from inference.tool_calls import (
    DECISION_OPENINGS,
    FINAL_ANSWER,
    ToolCall,
    ToolCallError,
    decision_schema,
    final_answer_spec,
    parse_decision,
)

logger = logging.getLogger(__name__)

ANSWER_TURN = (
    "No more tool calls. Now write the answer to the message above from the data: the gathered data "
    "is step [0], each tool result is the step with its number. Put the step numbers that support a "
    "claim after it, like [0] or [2]. If the evidence does not settle the cause, say it is "
    "inconclusive and what to check next. End with one line `Root cause: <kind> <namespace>/<name>` "
    "naming the failing object."
)
"""The last user turn of an investigation: no tools, cite the steps, inconclusive is an answer."""

ANSWER_BAD_WORDS: tuple[str, ...] = (*DECISION_OPENINGS, "<kind>", "<namespace>", "<name>")
"""What an investigation's answer may not write: another tool call, or :data:`ANSWER_TURN`'s
placeholders (a small model copied the template line itself: SmolLM2 in ``opsbot chat --demo``
answered ``<kind> <namespace> <name>``)."""

ROOT_CAUSE_TURN = (
    "Write the root cause of the answer above as JSON: the failing objects (kind, namespace, name) and "
    "up to three short claims, each with the step numbers that support it."
)
"""The user turn of the root-cause block (a constrained step after the answer)."""

_ROOT_CAUSE_MAX_TOKENS = 640
"""Room for the longest block the schema allows (its strings and lists are bounded), so a block is
never cut off mid-JSON."""

_KINDS = ["Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Node", "Service",
          "PersistentVolumeClaim", "PersistentVolume", "Namespace", "HorizontalPodAutoscaler", "ConfigMap",
          "Secret", "Ingress", "Other"]  # fmt: skip


StepSink = Callable[[StepUpdate], Awaitable[None]]
"""Where live step updates go (the reply's checklist / task cards; the terminal's step lines)."""


@dataclass(slots=True)
class Investigation:
    """A finished loop: the transcript to answer from, and its steps."""

    messages: list[ChatMessage]
    token_ids: list[int]
    steps: list[StepRecord] = field(default_factory=list)
    stop: str = "answer"
    """Why the calls ended: ``answer`` (the model chose to), ``steps``, ``tool_tokens``, ``wall``,
    ``window``, ``unparsed``, ``engine`` (the engine cannot constrain or failed)."""
    tools: tuple[str, ...] = ()
    """The tools offered (fixed before step 1)."""
    scope_cluster: str = ""
    specs: tuple[ToolSpec, ...] = ()
    """The offered tools' specs (their exact schemas), for a replay."""
    outputs: list[dict[str, Any]] = field(default_factory=list)
    """Every call's redacted output as the model read it (name, arguments, status, text, source,
    summary), for a replay."""
    proposals: list[ProposedAction] = field(default_factory=list)
    """Fixes the model proposed (``propose_action``), in order: cards after the answer."""

    answer_bad_words: ClassVar[tuple[str, ...]] = ANSWER_BAD_WORDS
    """Bad words of the answer written from this transcript."""

    def replay_record(self) -> dict[str, Any]:
        """What replays this investigation without a cluster (:mod:`bot.tools.recorded`)."""
        return {
            "tools": [
                {"name": s.name, "description": s.description, "parameters": dict(s.parameters)}
                for s in self.specs
            ],
            "calls": list(self.outputs),
        }

    @property
    def calls(self) -> list[StepRecord]:
        """The tool decisions (not the answer)."""
        return [s for s in self.steps if s.kind == "call"]

    def parsed_calls(self) -> int:
        """Decisions that parsed and named an offered tool (``final_answer`` included)."""
        return sum(1 for s in self.calls if s.status != "unparsed")


def build_investigator(settings: Settings, gatherer: ContextGatherer) -> Investigator | None:
    """The loop of ``settings.investigate`` over ``gatherer``'s clients (``None`` when it is off)."""
    if not settings.investigate.enabled:
        return None
    alertmanager = AlertmanagerApi(settings.alertmanager) if settings.alertmanager.api_url else None
    return Investigator(ToolRegistry(gatherer, alertmanager=alertmanager), settings.investigate)


class Investigator:
    """Runs investigations with one tool registry and the ``[investigate]`` settings."""

    def __init__(self, registry: ToolRegistry, settings: InvestigateSettings) -> None:
        self.registry = registry
        self.settings = settings

    async def close(self) -> None:
        """Close the clients the tools own beyond the gatherer's (Alertmanager's API)."""
        await self.registry.close()

    def budget(self, scenario: str, lane: Lane) -> LaneBudget | None:
        """The budget of ``scenario`` in ``lane`` (``None``: it answers without the loop)."""
        return self.settings.budget(scenario, lane)

    async def run(
        self,
        *,
        engine: Engine,
        tokenizer: ChatTokenizer,
        request_id: str,
        scenario: str,
        lane: Lane,
        sampling: SamplingSettings,
        messages: Sequence[ChatMessage],
        window: int,
        bundle: ContextBundle | None,
        history: Sequence[ThreadMessage] = (),
        on_step: StepSink | None = None,
        may_propose: bool = False,
    ) -> Investigation | None:
        """The loop for one request from step 0's ``messages``; ``None`` when it has no budget or no
        tool is available in its scope (then the pipeline answers from step 0 alone).
        ``may_propose``: the channel takes proposals, so ``propose_action`` is offered."""
        budget = self.budget(scenario, lane)
        if budget is None:
            return None
        scope = self.registry.scope_for(bundle, history, may_propose=may_propose)
        box = self.registry.box(
            scope,
            max_output_tokens=self.settings.max_output_tokens,
            count=tokenizer.count,
            timeout_s=self.settings.tool_timeout_s,
        )
        if not box.specs:
            return None
        loop = _Loop(
            self.settings, budget, box, engine, tokenizer, request_id, lane, sampling, window, on_step
        )
        return await loop.run(list(messages), scope.clusters[0].name if scope.clusters else "")

    async def root_cause(
        self,
        *,
        engine: Engine,
        investigation: Investigation,
        answer: str,
        request_id: str,
        lane: Lane,
        sampling: SamplingSettings,
    ) -> dict[str, Any] | None:
        """The root-cause block of ``answer`` (one constrained step on the transcript: entities and
        claims with step references), or ``None`` when off or the engine failed."""
        if not self.settings.root_cause_block:
            return None
        last = len(investigation.calls)
        schema = root_cause_schema(last)
        messages = [
            *investigation.messages,
            ChatMessage("assistant", answer),
            ChatMessage("user", ROOT_CAUSE_TURN),
        ]
        step = StepRecord(index=last + 2, kind="root_cause", status="ok")
        try:
            text, result = await _generate(
                engine,
                GenerationRequest(
                    request_id=f"{request_id}-rc",
                    scenario="investigate",
                    lane=lane,
                    sampling=SamplingSettings(
                        temperature=0.0,
                        top_p=1.0,
                        # room for the longest block: a block is never cut by the budget
                        max_tokens=token_ceiling(schema) or 320,
                        seed=sampling.seed,
                        json_schema=json.dumps(schema),
                    ),
                    messages=messages,
                    prompt_token_ids=engine.tokenizer.render(messages),
                ),
            )
        except (EngineGenerateError, EngineDeadError) as exc:
            logger.warning("request %s: root-cause block failed: %s", request_id, exc)
            step.status = "error"
            investigation.steps.append(step)
            return None
        _timings(step, result)
        investigation.steps.append(step)
        block = read_root_cause(text, last, investigation.scope_cluster)
        if block is None:
            step.status = "unparsed"
            step.summary = f"unparsed root-cause block ({result.finish_reason}): {text[-160:]!r}"
            logger.warning("request %s: root-cause block unparsed: %s", request_id, step.summary)
        elif result.finish_reason == "length":
            step.summary = f"cut at {result.output_tokens} tokens: whole entries kept"
        return block


MIN_TOOL_OUTPUT = 128
"""Fewest tokens of tool output worth a step: with less room left, the calls end (``window``)."""
TURN_OVERHEAD = 96
"""Tokens of the turn around a tool output (its step number, fences, the budget line)."""


class _Loop:
    """One investigation's state (see the module docstring)."""

    def __init__(
        self,
        settings: InvestigateSettings,
        budget: LaneBudget,
        box: ToolBox,
        engine: Engine,
        tokenizer: ChatTokenizer,
        request_id: str,
        lane: Lane,
        sampling: SamplingSettings,
        window: int,
        on_step: StepSink | None,
    ) -> None:
        self.settings = settings
        self.budget = budget
        self.box = box
        self.engine = engine
        self.tokenizer = tokenizer
        self.request_id = request_id
        self.lane = lane
        self.sampling = sampling
        self.window = window
        self.on_step = on_step
        self.specs: tuple[ToolSpec, ...] = (*box.specs, final_answer_spec())
        schema = decision_schema(self.specs)
        self.schema = json.dumps(schema)
        # Room for the longest call the schema admits: a cut call is never run, so a cut is a lost step.
        self.decision_tokens = token_ceiling(schema) or settings.decision_max_tokens
        self.tag = secrets.token_hex(4)

    async def _show(self, update: StepUpdate) -> None:
        if self.on_step is None:
            return
        try:
            await self.on_step(update)
        except Exception:  # the live view is a courtesy: a platform failure must not stop the loop
            logger.warning("request %s: step update not shown", self.request_id, exc_info=True)

    async def run(self, messages: list[ChatMessage], cluster: str) -> Investigation:
        tools = catalogue(self.specs, self.budget)
        if messages and messages[0].role == "system":
            messages[0] = ChatMessage("system", messages[0].content + "\n\n" + tools)
        else:
            messages.insert(0, ChatMessage("system", tools))
        found = Investigation(
            messages, [], tools=tuple(s.name for s in self.box.specs), scope_cluster=cluster
        )
        found.specs = self.box.specs
        deadline = time.monotonic() + self.budget.wall_s
        tool_tokens = 0
        repeats = 0
        found.stop = "steps"
        for index in range(1, self.budget.max_steps + 1):
            if time.monotonic() >= deadline:
                found.stop = "wall"
                break
            if tool_tokens >= self.budget.max_tool_tokens:
                found.stop = "tool_tokens"
                break
            ids = self.tokenizer.render(messages)
            # The window left once the answer's own tokens are set aside: a decision must fit
            # whole, and its output at least a few lines (each output is capped to what is left).
            room = self.window - len(ids) - self.sampling.max_tokens
            if room < self.decision_tokens + MIN_TOOL_OUTPUT + TURN_OVERHEAD:
                found.stop = "window"
                break
            step = StepRecord(index=index, kind="call", status="unparsed")
            try:
                text, result = await asyncio.wait_for(
                    _generate(self.engine, self._decision(index, messages, ids)),
                    max(0.1, deadline - time.monotonic()),
                )
            except TimeoutError:
                found.stop = "wall"
                break
            except (EngineGenerateError, EngineDeadError) as exc:
                logger.warning("request %s: investigation step %d: %s", self.request_id, index, exc)
                found.stop = "engine"
                break
            _timings(step, result)
            found.steps.append(step)
            try:
                call = parse_decision(text, self.specs)
            except ToolCallError as exc:
                step.summary = f"unparsed call: {exc}"[:300]
                found.stop = "unparsed"
                break
            step.tool, step.arguments = call.name, json.dumps(call.arguments, sort_keys=True)
            messages.append(ChatMessage("assistant", text))
            if call.is_final:
                step.status = "final"
                found.stop = "answer"
                break
            title = describe_call(call)
            await self._show(StepUpdate(index, "pending", title))
            try:
                left = room - result.output_tokens - TURN_OVERHEAD
                outcome = await asyncio.wait_for(
                    self.box.call(call, max_tokens=left), max(0.1, deadline - time.monotonic())
                )
            except TimeoutError:
                outcome = ToolResult(call, "timeout", "the investigation's time ran out during this call")
            step.status = outcome.status
            if outcome.proposal is not None:
                found.proposals.append(outcome.proposal)
            found.outputs.append(
                {
                    "name": call.name,
                    "arguments": call.arguments,
                    "status": outcome.status,
                    "text": outcome.text,
                    "source": outcome.source,
                    "summary": outcome.summary,
                }
            )
            repeats = repeats + 1 if outcome.status == "repeated" else 0
            step.tool_ms = outcome.latency_ms
            step.tool_tokens = outcome.output_tokens
            step.summary = outcome.summary or outcome.text.splitlines()[0][:200] if outcome.text else ""
            step.source = outcome.source
            tool_tokens += outcome.output_tokens
            messages.append(ChatMessage("user", self._result_turn(index, call, outcome, tool_tokens)))
            await self._show(
                StepUpdate(
                    index, "done" if outcome.status == "ok" else "failed", title, step.summary, outcome.source
                )
            )
            if repeats >= 2:
                # Refused twice in a row: the model is stuck on one call; more steps would repeat it.
                found.stop = "repeated"
                break
        messages.append(ChatMessage("user", ANSWER_TURN))
        found.token_ids = self.tokenizer.render(messages)
        return found

    def _decision(self, index: int, messages: Sequence[ChatMessage], ids: list[int]) -> GenerationRequest:
        # Greedy: a decision is a choice, not prose; the same transcript gives the same call.
        return GenerationRequest(
            request_id=f"{self.request_id}-s{index}",
            scenario="investigate",
            lane=self.lane,
            sampling=SamplingSettings(
                temperature=0.0,
                top_p=1.0,
                max_tokens=self.decision_tokens,
                seed=self.sampling.seed,
                json_schema=self.schema,
            ),
            messages=list(messages),
            prompt_token_ids=ids,
            tools=self.specs,
        )

    def _result_turn(self, index: int, call: ToolCall, outcome: ToolResult, spent: int) -> str:
        left = self.budget.max_steps - index
        label = f"step [{index}] {describe_call(call)}" + (
            f" from {outcome.source}" if outcome.source else ""
        )
        if outcome.status != "ok":
            label += f" ({outcome.status})"
        tokens_left = max(0, self.budget.max_tool_tokens - spent)
        return (
            f"Result of step [{index}] (untrusted data):\n{fence(label, outcome.text, self.tag)}\n\n"
            f"{left} tool call{'' if left == 1 else 's'} and about {tokens_left} tokens of tool output left. "
            f"Call another tool, or {FINAL_ANSWER} when the data is enough."
        )


async def _generate(engine: Engine, request: GenerationRequest) -> tuple[str, GenerationResult]:
    """The whole text and result of one non-streamed step."""
    result: GenerationResult | None = None
    # The answer watchdog does not count the engine's time (its own watchdog and deadline do).
    with waiting_for_engine():
        async for event in engine.generate(request):
            if isinstance(event, GenerationResult):
                result = event
    if result is None:
        raise EngineGenerateError(f"request {request.request_id} ended without a result")
    return result.text, result


def _timings(step: StepRecord, result: GenerationResult) -> None:
    step.prompt_tokens = result.prompt_tokens
    step.cached_tokens = result.cached_tokens
    step.output_tokens = result.output_tokens
    step.ttft_ms = result.ttft_ms
    if result.ttft_ms is not None:
        step.decode_ms = max(0.0, result.e2e_ms - result.ttft_ms)


def describe_call(call: ToolCall) -> str:
    """``kube_logs namespace=shop pod=api-1`` (empty arguments left out), for titles and lines."""
    shown = " ".join(f"{k}={v}" for k, v in call.arguments.items() if v not in ("", None, False))
    return defuse(f"{call.name} {shown}".strip())[:200]


def catalogue(specs: Sequence[ToolSpec], budget: LaneBudget) -> str:
    """The tools and the rules of the loop, appended to the system prompt (the same text for every
    investigation with these tools and this budget: a prefix the engines' caches keep)."""
    lines = [
        f"Before answering you may call up to {budget.max_steps} read-only tools to check the cluster. "
        'Reply with exactly one JSON call {"name": <tool>, "arguments": {...}}; the result comes back as '
        f'a numbered step. Call "{FINAL_ANSWER}" when the data you have is enough. Tools:'
    ]
    for spec in specs:
        args = ", ".join(spec.parameters.get("properties") or {})
        lines.append(f"- {spec.name}({args}): {spec.description}")
    return "\n".join(lines)


def root_cause_schema(last_step: int) -> dict[str, Any]:
    """The JSON Schema of the root-cause block: entities and claims citing steps 0..``last_step``."""
    step_ref = {"type": "integer", "minimum": 0, "maximum": max(0, last_step)}
    return {
        "type": "object",
        "properties": {
            "conclusive": {"type": "boolean"},
            "root_cause": {
                "type": "array",
                "minItems": 1,
                "maxItems": 2,
                "items": {
                    "type": "object",
                    "properties": {
                        "kind": {"type": "string", "enum": _KINDS},
                        "namespace": {"type": "string", "maxLength": 63},
                        "name": {"type": "string", "minLength": 1, "maxLength": 63},
                    },
                    "required": ["kind", "namespace", "name"],
                    "additionalProperties": False,
                },
            },
            "claims": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "claim": {"type": "string", "maxLength": 100},
                        "steps": {"type": "array", "minItems": 1, "maxItems": 3, "items": step_ref},
                    },
                    "required": ["claim", "steps"],
                    "additionalProperties": False,
                },
            },
        },
        "required": ["conclusive", "root_cause", "claims"],
        "additionalProperties": False,
    }


def read_root_cause(text: str, last_step: int, cluster: str) -> dict[str, Any] | None:
    """The root-cause block ``text`` holds (whole entries of a cut one kept), or ``None`` when it
    names no whole entity. Entities get ``cluster``; claims keep only steps 0..``last_step``."""
    block = complete_prefix(text)
    if not isinstance(block, dict):
        return None
    entities = [
        e
        for e in block.get("root_cause") or []
        if isinstance(e, dict)
        and all(isinstance(e.get(k), str) and e[k] for k in ("kind", "name"))
        and isinstance(e.get("namespace"), str)  # empty for a node or another cluster-wide kind
    ]
    if not entities:
        return None
    for entity in entities:
        entity.setdefault("cluster", cluster)
        # Once here, so the citation line, the stored block and the eval's entity score agree.
        entity["name"] = object_name(entity["name"], entity["namespace"], entity["kind"])
    claims = []
    for claim in block.get("claims") or []:
        if not isinstance(claim, dict) or not isinstance(claim.get("claim"), str):
            continue
        # llama-cpp-python's schema converter does not enforce an integer's maximum: a reference to
        # a step that never ran is dropped here, so every citation points at a real step.
        claim["steps"] = [n for n in claim.get("steps") or [] if isinstance(n, int) and 0 <= n <= last_step]
        claims.append(claim)
    return {"conclusive": block.get("conclusive") is True, "root_cause": entities, "claims": claims}


def proposal_evidence(investigation: Investigation, proposed: ProposedAction) -> list[str]:
    """The card's *why* for a proposal of ``investigation``: the model's line, then each step it
    cites as the step list shows it (``[2] kube_rollout shop/api: 3 revisions of api``; a cited
    proposal is no evidence and is left out)."""
    lines = [
        f"opsbot's investigation: {proposed.why}" if proposed.why else "proposed by opsbot's investigation"
    ]
    by_index = {s.index: s for s in investigation.calls}
    for n in proposed.steps:
        if n == 0:
            lines.append("[0] the context gathered before the first step")
        elif (step := by_index.get(n)) is not None and step.tool and step.tool != PROPOSE_ACTION:
            call = ToolCall(step.tool, json.loads(step.arguments or "{}"))
            lines.append(f"[{n}] {describe_call(call)}: {step.summary or step.status}")
    return lines


def citation_line(block: dict[str, Any]) -> str:
    """The short citation shown under an answer: ``Root cause: Deployment shop/api [1][3]``."""
    entities = [
        f"{e.get('kind')} {str(e['namespace']) + '/' if e.get('namespace') else ''}{e.get('name')}"
        for e in block.get("root_cause") or []
        if isinstance(e, dict)
    ]
    refs = sorted(
        {
            int(n)
            for claim in block.get("claims") or []
            if isinstance(claim, dict)
            for n in claim.get("steps") or []
            if isinstance(n, int)
        }
    )
    cited = "".join(f"[{n}]" for n in refs)
    verdict = "" if block.get("conclusive", True) else " (inconclusive)"
    return f"Root cause{verdict}: {', '.join(entities) or 'not named'} {cited}".rstrip()


def observe(investigation: Investigation, scenario: str, lane: Lane) -> None:
    """Count an investigation in ``/metrics``: steps, each step's TTFT and cache reuse."""
    metrics.INVESTIGATION_STEPS.labels(scenario, lane.value).observe(len(investigation.steps))
    previous: int | None = None
    for step in investigation.steps:
        if step.ttft_ms is not None:
            metrics.STEP_TTFT.labels(scenario, lane.value).observe(step.ttft_ms / 1000)
        if previous:
            metrics.STEP_CACHED_FRACTION.observe(min(1.0, step.cached_tokens / previous))
        previous = step.prompt_tokens or previous
