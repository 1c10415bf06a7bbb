"""Investigation loop benchmark on CPU: SmolLM2-135M through llama.cpp, the eval's built-in incidents.

Per case: the case's Kubernetes and Prometheus APIs start in-process (``bot.eval``), opsbot's own
gatherer reads them (step 0), then :class:`bot.investigate.Investigator` runs up to ``--steps``
grammar-constrained tool decisions and the answer (streamed like the bot's, ``--answer-tokens``).
Measured per step: prompt, cached and output tokens, cached tokens as a share of the previous
step's prompt (the prefix-cache claim), TTFT, decode time, tool latency; per case: whether every
decision parsed and named an offered tool, the stop reason, the loop's wall time and the time until
the answer is complete (the "N-step investigation answered" figure).

The loop's own wall budget is lifted (``--wall-s``): this measures how long the steps take, not
where a lane's budget would cut them. The machine's load average is recorded before and after: on
a shared machine it explains slow numbers.

Usage::

    python bench/investigate_bench.py --out bench/results/investigate_bench-$(date +%F)-cpu
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run_meta import package_versions, run_meta  # noqa: E402

from bot.config import InvestigateSettings, KubernetesSettings, LaneBudget, PrometheusSettings, Settings  # noqa: E402
from bot.context.gatherer import ContextGatherer  # noqa: E402
from bot.default_model import ensure_default_gguf  # noqa: E402
from bot.eval.cases import load_cases  # noqa: E402
from bot.investigate import Investigator  # noqa: E402
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder  # noqa: E402
from bot.tools.registry import ToolRegistry  # noqa: E402
from inference.config import EngineConfig  # noqa: E402
from inference.engine import GenerationRequest, GenerationResult, Lane, SamplingSettings, TextDelta  # noqa: E402
from inference.llamacpp_engine import LlamaCppEngine  # noqa: E402

DEFAULT_CASES = (
    "oom-worker,imagepull-typo,exec-not-found,config-missing-secret,unschedulable-memory,"
    "memory-leak-rising,oom-with-distractor,cert-expired,liveness-probe-timeout,volume-mount-failed,"
    "hop-rollout-memory-limit,alert-crashlooping"
)
WINDOW = 8192


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def run_case(
    case: Any, engine: LlamaCppEngine, prompts: PromptBuilder, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    kube, prom = case.kubernetes_server(), case.prometheus_server()
    if kube is not None:
        await kube.start()
    if prom is not None:
        await prom.start()
    settings = Settings(
        kubernetes=KubernetesSettings(
            enabled=kube is not None,
            kubeconfig=kube.write_kubeconfig(workdir / f"{case.id}.kubeconfig", context="eval")
            if kube
            else None,
            context="eval",
        ),
        prometheus=PrometheusSettings(
            enabled=prom is not None, url=prom.url if prom else "http://127.0.0.1:9"
        ),
    )
    gatherer = ContextGatherer.from_settings(settings)
    try:
        question = case.question or "summarise this alert"
        t0 = time.perf_counter()
        bundle = await gatherer.gather(question, scenario="root_cause")
        gather_ms = (time.perf_counter() - t0) * 1000
        budget = LaneBudget(max_steps=args.steps, max_tool_tokens=args.tool_tokens, wall_s=args.wall_s)
        loop = Investigator(
            ToolRegistry(gatherer),
            InvestigateSettings(enabled=True, lanes={Lane.NORMAL: budget}, root_cause_block=False),
        )
        sampling = SamplingSettings(max_tokens=args.answer_tokens, temperature=0.0, seed=1)
        plan = prompts.build(
            scenario="root_cause",
            question=question,
            asker="bench",
            context=bundle,
            max_tokens=args.answer_tokens,  # step 0 as without the loop, as the pipeline builds it
        )
        t1 = time.perf_counter()
        found = await loop.run(
            engine=engine,
            tokenizer=engine.tokenizer,
            request_id=f"bench-{case.id}",
            scenario="root_cause",
            lane=Lane.NORMAL,
            sampling=sampling,
            messages=plan.messages,
            window=WINDOW,
            bundle=bundle,
        )
        loop_s = time.perf_counter() - t1
        assert found is not None
        answer = await final_answer(engine, found, sampling, f"bench-{case.id}-answer")
        answered_s = time.perf_counter() - t1
    finally:
        await gatherer.close()
        if prom is not None:
            await prom.stop()
        if kube is not None:
            await kube.stop()
    steps = step_rows(found, answer)
    return {
        "case": case.id,
        "gather_ms": round(gather_ms, 1),
        "step0_prompt_tokens": plan.prompt_tokens,
        "calls": len(found.calls),
        "calls_parsed": found.parsed_calls(),
        "stop": found.stop,
        "loop_s": round(loop_s, 3),
        "answered_s": round(answered_s, 3),
        "steps": steps,
    }


def write_results(out: Path, report: dict[str, Any], text: str) -> None:
    """``out``.json (the whole report) and ``out``.md (``text``), and where they are."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(text)
    say(f"results: {out.with_suffix('.md')} {out.with_suffix('.json')}")


async def final_answer(
    engine: Any, found: Any, sampling: SamplingSettings, request_id: str
) -> GenerationResult:
    """The answer after the loop ``found`` (its transcript as the pipeline sends it), streamed whole."""
    answer: GenerationResult | None = None
    async for event in engine.generate(
        GenerationRequest(
            request_id,
            "root_cause",
            Lane.NORMAL,
            sampling,
            messages=found.messages,
            prompt_token_ids=found.token_ids,
        )
    ):
        if isinstance(event, GenerationResult):
            answer = event
        elif not isinstance(event, TextDelta):
            raise TypeError(event)
    assert answer is not None, f"{request_id}: no result"
    return answer


def step_rows(found: Any, answer: GenerationResult | None) -> list[dict[str, Any]]:
    """One row per step of ``found`` (an :class:`bot.investigate.Investigation`) and one for the
    answer: tokens, the cached share of the previous step's prompt, TTFT, decode and tool time."""
    steps: list[dict[str, Any]] = []
    previous = 0
    for step in found.steps:
        steps.append(
            {
                "step": step.index,
                "tool": step.tool,
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
        previous = step.prompt_tokens
    assert answer is not None
    steps.append(
        {
            "step": len(found.calls) + 1,
            "tool": None,
            "status": "answer",
            "prompt_tokens": answer.prompt_tokens,
            "cached_tokens": answer.cached_tokens,
            "output_tokens": answer.output_tokens,
            "cached_of_previous": round(answer.cached_tokens / previous, 4) if previous else None,
            "ttft_ms": answer.ttft_ms,
            "decode_ms": None if answer.ttft_ms is None else answer.e2e_ms - answer.ttft_ms,
            "tool_ms": None,
            "tool_tokens": 0,
        }
    )
    return steps


def markdown(report: dict[str, Any]) -> str:
    meta, totals = report["meta"], report["totals"]
    lines = [
        "# investigate_bench — SmolLM2-135M (llama.cpp) on CPU",
        "",
        f"- date: {meta['date']}; commit {report['commit']}",
        f"- command: `{meta['command']}`",
        f"- hardware: {meta['gpu']}; llama.cpp threads {report['threads']}; load average before / after: "
        f"{report['load_before']} / {report['load_after']} (a shared machine: other work ran beside it)",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "",
        "| measure | result |",
        "|---|---|",
        f"| decisions that parse and name an offered tool | {totals['calls_parsed']}/{totals['calls']} |",
        f"| steps with cached tokens ≥ 90 % of the previous step's prompt | "
        f"{totals['cached_at_or_over_90']}/{totals['cached_compared']} (min {totals['cached_min']}) |",
        f"| loop wall time per case, median / max | {totals['loop_s_median']} s / {totals['loop_s_max']} s |",
        f"| investigation answered (loop + answer), median / max | {totals['answered_s_median']} s / "
        f"{totals['answered_s_max']} s |",
        f"| cases that ran {report['steps']} tool calls: answered in, median | "
        f"{totals['full_answered_s_median']} s over {totals['full_cases']} cases |",
        f"| step TTFT, median (after step 1: a cached prefix) | {totals['step_ttft_ms_median']} ms |",
        "",
        "| case | calls (parsed) | stop | loop s | answered s | cached of previous, per step |",
        "|---|---|---|---|---|---|",
    ]
    for case in report["cases"]:
        fractions = " ".join(
            f"{s['cached_of_previous']:.3f}" for s in case["steps"] if s["cached_of_previous"] is not None
        )
        lines.append(
            f"| {case['case']} | {case['calls']} ({case['calls_parsed']}) | {case['stop']} | "
            f"{case['loop_s']} | {case['answered_s']} | {fractions} |"
        )
    return "\n".join(lines) + "\n"


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[len(ordered) // 2], 3)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, required=True, help="path prefix of the .json and .md results")
    parser.add_argument("--cases", default=DEFAULT_CASES, help="comma-separated eval case ids")
    parser.add_argument("--steps", type=int, default=4, help="tool calls at most per investigation")
    parser.add_argument("--tool-tokens", type=int, default=1500, help="tool-output tokens per investigation")
    parser.add_argument(
        "--wall-s", type=float, default=600.0, help="the loop's wall budget (lifted by default)"
    )
    parser.add_argument("--answer-tokens", type=int, default=64, help="answer tokens")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()
    load_before = os.getloadavg()
    wanted = [c for c in args.cases.split(",") if c]
    cases = [c for c in load_cases([ROOT / "bot" / "eval" / "cases"]) if c.id in wanted]
    gguf = ensure_default_gguf(ROOT / ".pytest_cache" / "opsbot-models")
    engine = LlamaCppEngine(
        EngineConfig(model=str(gguf), cpu_max_concurrency=1, cpu_threads=args.threads, max_model_len=WINDOW)
    )
    prompts = PromptBuilder(
        None,  # type: ignore[arg-type]  # set once the engine (and its tokenizer) started
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=WINDOW,
        context_share=0.45,
        history_share=0.2,
    )
    await engine.start(prompts.system_messages())
    prompts.tokenizer = engine.tokenizer
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for index, case in enumerate(cases, 1):
            result = await run_case(case, engine, prompts, args, Path(tmp))
            results.append(result)
            say(
                f"[{index}/{len(cases)}] {case.id}: {result['calls']} calls "
                f"({result['calls_parsed']} parsed), stop {result['stop']}, loop {result['loop_s']:.1f} s, "
                f"answered {result['answered_s']:.1f} s"
            )
    await engine.shutdown(2.0)
    fractions = [
        s["cached_of_previous"] for r in results for s in r["steps"] if s["cached_of_previous"] is not None
    ]
    full = [r for r in results if r["calls"] >= args.steps]
    later_ttft = [s["ttft_ms"] for r in results for s in r["steps"][1:] if s["ttft_ms"] is not None]
    report = {
        "meta": run_meta(sys.argv),
        "commit": subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "versions": package_versions("llama_cpp", "bot"),
        "threads": args.threads,
        "steps": args.steps,
        "load_before": [round(x, 2) for x in load_before],
        "load_after": [round(x, 2) for x in os.getloadavg()],
        "totals": {
            "calls": sum(r["calls"] for r in results),
            "calls_parsed": sum(r["calls_parsed"] for r in results),
            "cached_compared": len(fractions),
            "cached_at_or_over_90": sum(f >= 0.9 for f in fractions),
            "cached_min": min(fractions) if fractions else None,
            "loop_s_median": median([r["loop_s"] for r in results]),
            "loop_s_max": max((r["loop_s"] for r in results), default=None),
            "answered_s_median": median([r["answered_s"] for r in results]),
            "answered_s_max": max((r["answered_s"] for r in results), default=None),
            "full_cases": len(full),
            "full_answered_s_median": median([r["answered_s"] for r in full]),
            "step_ttft_ms_median": median(later_ttft),
        },
        "cases": results,
    }
    write_results(args.out, report, markdown(report))


if __name__ == "__main__":
    asyncio.run(main())
