"""Concurrent investigations on one engine: N at once, each a fixed number of constrained tool calls
with fixed-size outputs, then the answer (issue 38's GPU figure: 16 six-step investigations).

The engine is any opsbot engine, from an ``[engine]`` TOML as ``opsbot eval --engine-config`` takes
it: in-process vLLM (the dummy 8B), the ``openai`` backend against ``vllm serve`` (token ids: the
decision's schema is the server's structured output, the same grammar), llama.cpp on a CPU. Both
sides of a comparison get the same cases, shape, warm-up and rounds.

Per investigation: step 0 is a built-in eval case's context, gathered by opsbot's own gatherer from
the case's in-process Kubernetes and Prometheus APIs before any timing starts; then
``bot.investigate``'s loop runs with a bench tool box:

- the decision schema is the real registry's tools for the case's scope, with every string argument
  bounded to ``--max-string`` characters (random weights write each string to its ``maxLength``:
  253-character names; SmolLM2's real calls were 68 tokens at the median) and no final answer
  before the last step, so every investigation makes exactly ``--steps`` calls (the same shape on
  both sides, whatever the random weights pick);
- each call returns ``--output-tokens`` tokens of the case's own gathered context (another slice
  each step), as a tool output would.

Every round (an episode: ``--concurrency`` investigations started together) is kept; the report
gives per round and pooled the investigation wall time (loop + answer) P50 / P99 / max, per-step
TTFT P50 / P99, the decisions that parsed and named an offered tool, and the steps whose cached
prompt tokens are at least 90 % of the previous step's prompt; the worst round beside the pool.

Usage::

    python bench/investigate_load.py --engine-config vllm-8b.toml --out $OUT/investigate-vllm
    python bench/investigate_load.py --engine-config serve-8b.toml --out $OUT/investigate-openai
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from investigate_bench import final_answer, step_rows, write_results  # noqa: E402
from run_meta import package_versions, run_meta  # noqa: E402

from bot.config import KubernetesSettings, LaneBudget, PrometheusSettings, Settings  # noqa: E402
from bot.context.gatherer import ContextGatherer  # noqa: E402
from bot.engine_factory import build_engine, pick_backend, resolve_model  # noqa: E402
from bot.eval.cases import load_cases  # noqa: E402
from bot.eval.command import BUILTIN_CASES, apply_engine_config  # noqa: E402
from bot.investigate import _Loop  # noqa: E402  # the loop itself, with the bench's tool box
from bot.prompts import PromptBuilder, load_system_prompt  # noqa: E402
from bot.tools.registry import ToolRegistry, ToolResult  # noqa: E402
from inference.engine import (  # noqa: E402
    ChatMessage,
    Engine,
    Lane,
    SamplingSettings,
    ToolSpec,
)
from inference.structured import token_ceiling  # noqa: E402
from inference.tool_calls import ToolCall, decision_schema  # noqa: E402


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def bounded(schema: Any, max_string: int) -> Any:
    """``schema`` with every string's ``maxLength`` at most ``max_string`` (enums stay as they are)."""
    if isinstance(schema, dict):
        out = {k: bounded(v, max_string) for k, v in schema.items()}
        if out.get("type") == "string" and "enum" not in out:
            out["maxLength"] = min(int(out.get("maxLength", max_string)), max_string)
            out["minLength"] = min(int(out.get("minLength", 0)), out["maxLength"])
        return out
    if isinstance(schema, list):
        return [bounded(v, max_string) for v in schema]
    return schema


class BenchBox:
    """The tools of one case's scope (bounded strings) answering every call with the next
    ``output_tokens`` tokens of the case's gathered context."""

    def __init__(self, specs: tuple[ToolSpec, ...], lines: list[str], output_tokens: int, count: Any) -> None:
        self.specs = specs
        self.lines = lines or ["(no context)"]
        self.output_tokens = output_tokens
        self.count = count
        self.calls = 0

    async def call(self, call: ToolCall, max_tokens: int | None = None) -> ToolResult:
        cap = self.output_tokens if max_tokens is None else min(self.output_tokens, max_tokens)
        start = (self.calls * 7) % len(self.lines)
        self.calls += 1
        taken: list[str] = []
        for i in range(len(self.lines) * 2):
            line = self.lines[(start + i) % len(self.lines)]
            if self.count("\n".join([*taken, line])) > cap:
                break
            taken.append(line)
        text = "\n".join(taken)
        return ToolResult(call, "ok", text, source="bench", output_tokens=self.count(text))


class FixedLoop(_Loop):
    """The loop with no final answer on offer: it makes ``max_steps`` calls, then the answer."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.specs = self.box.specs
        schema = decision_schema(self.specs)
        self.schema = json.dumps(schema)
        self.decision_tokens = token_ceiling(schema) or self.settings.decision_max_tokens


class Prepared:
    """One case made ready before timing: its step-0 messages, tools and context lines."""

    def __init__(
        self, case_id: str, messages: list[ChatMessage], specs: tuple[ToolSpec, ...], lines: list[str]
    ):
        self.case_id, self.messages, self.specs, self.lines = case_id, messages, specs, lines


async def prepare(
    case: Any, settings: Settings, prompts: PromptBuilder, args: argparse.Namespace, workdir: Path
) -> Prepared:
    kube, prom = case.kubernetes_server(), case.prometheus_server()
    if kube is not None:
        await kube.start()
    if prom is not None:
        await prom.start()
    local = settings.model_copy(
        update={
            "kubernetes": KubernetesSettings(
                enabled=kube is not None,
                kubeconfig=kube.write_kubeconfig(workdir / f"{case.id}.kubeconfig", context="eval")
                if kube
                else None,
                context="eval",
            ),
            "prometheus": PrometheusSettings(
                enabled=prom is not None, url=prom.url if prom else "http://127.0.0.1:9"
            ),
        }
    )
    gatherer = ContextGatherer.from_settings(local)
    try:
        question = case.question or "summarise this alert"
        bundle = await gatherer.gather(question, scenario="root_cause")
        registry = ToolRegistry(gatherer)
        scope = registry.scope_for(bundle)
        box = registry.box(scope, max_output_tokens=args.output_tokens, count=prompts.tokenizer.count)
        specs = tuple(
            ToolSpec(s.name, s.description, bounded(copy.deepcopy(dict(s.parameters)), args.max_string))
            for s in box.specs
        )
        plan = prompts.build(
            scenario="root_cause",
            question=question,
            asker="bench",
            context=bundle,
            max_tokens=args.answer_tokens,
        )
        await registry.close()
    finally:
        await gatherer.close()
        if prom is not None:
            await prom.stop()
        if kube is not None:
            await kube.stop()
    lines = [line for line in plan.messages[-1].content.splitlines() if line.strip()]
    return Prepared(case.id, list(plan.messages), specs, lines)


async def investigate(
    item: Prepared, engine: Engine, settings: Settings, args: argparse.Namespace, rid: str
) -> dict[str, Any]:
    budget = LaneBudget(max_steps=args.steps, max_tool_tokens=args.steps * args.output_tokens, wall_s=600.0)
    box = BenchBox(item.specs, item.lines, args.output_tokens, engine.tokenizer.count)
    sampling = SamplingSettings(max_tokens=args.answer_tokens, temperature=0.0, seed=1)
    window = settings.engine.max_model_len
    t0 = time.perf_counter()
    loop = FixedLoop(
        settings.investigate, budget, box, engine, engine.tokenizer, rid, Lane.NORMAL, sampling, window, None
    )
    found = await loop.run(list(item.messages), "eval")
    answer = await final_answer(engine, found, sampling, f"{rid}-answer")
    wall_s = time.perf_counter() - t0
    steps = step_rows(found, answer)
    return {
        "case": item.case_id,
        "calls": len(found.calls),
        "calls_parsed": found.parsed_calls(),
        "stop": found.stop,
        "wall_s": round(wall_s, 3),
        "steps": steps,
    }


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; ``None`` when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)], 3)


def summary(results: list[dict[str, Any]]) -> dict[str, Any]:
    walls = [r["wall_s"] for r in results]
    ttfts = [s["ttft_ms"] for r in results for s in r["steps"] if s["ttft_ms"] is not None]
    later = [s["ttft_ms"] for r in results for s in r["steps"][1:] if s["ttft_ms"] is not None]
    fractions = [
        s["cached_of_previous"] for r in results for s in r["steps"] if s["cached_of_previous"] is not None
    ]
    stops: dict[str, int] = {}
    for r in results:
        stops[r["stop"]] = stops.get(r["stop"], 0) + 1
    return {
        "investigations": len(results),
        "stops": stops,
        "full": sum(r["calls"] == r.get("wanted", r["calls"]) for r in results),
        "calls": sum(r["calls"] for r in results),
        "calls_parsed": sum(r["calls_parsed"] for r in results),
        "wall_s_p50": pct(walls, 50),
        "wall_s_p99": pct(walls, 99),
        "wall_s_max": max(walls, default=None),
        "step_ttft_ms_p50": pct(ttfts, 50),
        "step_ttft_ms_p99": pct(ttfts, 99),
        "cached_step_ttft_ms_p99": pct(later, 99),
        "cached_compared": len(fractions),
        "cached_at_or_over_90": sum(f >= 0.9 for f in fractions),
        "cached_min": min(fractions, default=None),
        "decision_tokens_p50": pct([s["output_tokens"] for r in results for s in r["steps"][:-1]], 50),
    }


def markdown(report: dict[str, Any]) -> str:
    meta = report["meta"]
    lines = [
        f"# investigate_load — {report['engine']}",
        "",
        f"- date: {meta['date']}; commit {meta.get('commit', 'unknown')}",
        f"- command: `{meta['command']}`",
        f"- hardware: {meta['gpu']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        f"- shape: {report['concurrency']} investigations at once x {report['rounds']} rounds, "
        f"{report['steps']} constrained calls each (strings at most {report['max_string']} characters), "
        f"{report['output_tokens']}-token tool outputs, {report['answer_tokens']}-token answer; "
        f"warm-up: {report['warmup']}",
        "",
        "| round | investigations (how they stopped) | calls parsed | wall P50 / P99 / max s | "
        "step TTFT P50 / P99 ms | cached steps TTFT P99 ms | cached >= 90 % of previous | "
        "decision tokens P50 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in [
        *((str(i + 1), r) for i, r in enumerate(report["rounds_summary"])),
        ("pooled", report["pooled"]),
    ]:
        stopped = ", ".join(f"{k} {v}" for k, v in sorted(s["stops"].items()))
        lines.append(
            f"| {name} | {s['investigations']} ({stopped}) | "
            f"{s['calls_parsed']}/{s['calls']} | "
            f"{s['wall_s_p50']} / {s['wall_s_p99']} / {s['wall_s_max']} | {s['step_ttft_ms_p50']} / "
            f"{s['step_ttft_ms_p99']} | {s['cached_step_ttft_ms_p99']} | {s['cached_at_or_over_90']}/"
            f"{s['cached_compared']} (min {s['cached_min']}) | {s['decision_tokens_p50']} |"
        )
    worst = max(report["rounds_summary"], key=lambda s: s["wall_s_p99"] or 0)
    lines += [
        "",
        f"Worst round: wall P99 {worst['wall_s_p99']} s, step TTFT P99 {worst['step_ttft_ms_p99']} ms.",
    ]
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="path prefix of the .json and .md results")
    parser.add_argument(
        "--engine-config", type=Path, help="[engine] (and [admission]) TOML, as opsbot eval takes"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="investigations started together")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (episodes), each on other cases")
    parser.add_argument("--steps", type=int, default=6, help="constrained tool calls per investigation")
    parser.add_argument("--output-tokens", type=int, default=300, help="tokens of each tool output")
    parser.add_argument("--answer-tokens", type=int, default=64, help="tokens of the answer")
    parser.add_argument("--max-string", type=int, default=24, help="characters at most in a string argument")
    parser.add_argument(
        "--warmup", type=int, default=1, help="warm-up investigations (one at a time) before round 1"
    )
    args = parser.parse_args()
    settings = Settings()
    if args.engine_config is not None:
        settings = apply_engine_config(settings, args.engine_config)
    model = resolve_model(settings, progress=say)
    system_prompt = load_system_prompt(settings.prompt.system_prompt, settings.prompt.system_prompt_file)
    backend = pick_backend(settings, model)
    engine = build_engine(settings, model)
    t0 = time.perf_counter()
    await engine.start(warmup_messages=[ChatMessage("system", system_prompt)])
    say(f"engine {backend} ({model}) ready in {time.perf_counter() - t0:.1f} s")
    prompts = PromptBuilder(
        engine.tokenizer,
        system_prompt=system_prompt,
        max_model_len=settings.engine.max_model_len,
        context_share=settings.prompt.context_share,
        history_share=settings.prompt.history_share,
    )
    cases = load_cases([BUILTIN_CASES])
    wanted = args.concurrency * args.rounds + args.warmup
    chosen = [cases[i % len(cases)] for i in range(wanted)]
    prepared: list[Prepared] = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, case in enumerate(chosen, 1):
            prepared.append(await prepare(case, settings, prompts, args, Path(tmp)))
            if index % 8 == 0 or index == len(chosen):
                say(f"step 0 gathered for {index}/{len(chosen)} cases")
    try:
        for i in range(args.warmup):
            r = await investigate(prepared[i], engine, settings, args, f"warm-{i}")
            say(f"warm-up {i + 1}/{args.warmup}: {r['calls']} calls, {r['wall_s']:.1f} s")
        rounds: list[list[dict[str, Any]]] = []
        for n in range(args.rounds):
            batch = prepared[args.warmup + n * args.concurrency : args.warmup + (n + 1) * args.concurrency]
            got = await asyncio.gather(
                *(
                    investigate(p, engine, settings, args, f"r{n}-{j}-{p.case_id}")
                    for j, p in enumerate(batch)
                )
            )
            for r in got:
                r["wanted"] = args.steps
            rounds.append(list(got))
            s = summary(list(got))
            say(
                f"round {n + 1}/{args.rounds}: {s['calls_parsed']}/{s['calls']} parsed, wall P50/P99 "
                f"{s['wall_s_p50']}/{s['wall_s_p99']} s, step TTFT P99 {s['step_ttft_ms_p99']} ms, cached "
                f"{s['cached_at_or_over_90']}/{s['cached_compared']}"
            )
    finally:
        await engine.shutdown(drain_timeout_s=5.0)
    report = {
        "meta": run_meta(sys.argv),
        "engine": f"{backend} {model}",
        "versions": package_versions("vllm", "llama_cpp", "torch", "bot"),
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "steps": args.steps,
        "output_tokens": args.output_tokens,
        "answer_tokens": args.answer_tokens,
        "max_string": args.max_string,
        "warmup": f"the engine's own start-up warm-up, then {args.warmup} investigation(s) one at a time",
        "rounds_summary": [summary(r) for r in rounds],
        "pooled": summary([r for rs in rounds for r in rs]),
        "investigations": rounds,
    }
    write_results(args.out, report, markdown(report))


if __name__ == "__main__":
    asyncio.run(main())
