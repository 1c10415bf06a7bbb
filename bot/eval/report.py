"""The eval report: JSON (everything, per case and in total), Markdown (for people), one summary line.

Both files carry the date, the hardware, the package versions, the engine and the exact command, so
a result can be compared with another run (INT4 against FP8 against bf16 on the same cases).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from bot import __version__
from bot.answer_clean import ECHO, EMPTY
from bot.eval import evidence
from bot.eval.runner import CaseResult
from bot.store.records import percentile

_PACKAGES = ("torch", "transformers", "llama-cpp-python", "gguf", "vllm")


def hardware() -> dict[str, Any]:
    """CPU model and cores, memory, GPU (when torch sees one)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    gpu = None
    if "torch" in sys.modules:  # only when an engine already loaded it: never import CUDA for this
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            gpu = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": memory_gib,
        "gpu": gpu,
        "os": f"{platform.system()} {platform.release()}",
    }


def versions() -> dict[str, str]:
    """opsbot, Python and the engine packages that are installed."""
    found = {"opsbot": __version__, "python": platform.python_version()}
    for name in _PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _rate(values: Sequence[bool | None]) -> dict[str, int]:
    judged = [v for v in values if v is not None]
    return {"hits": sum(judged), "of": len(judged)}


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)
    return {
        "p50": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "max": ordered[-1] if ordered else None,
    }


def totals(results: Sequence[CaseResult]) -> dict[str, Any]:
    """The totals of a run (rates count only the cases that have the expectation)."""
    scored = [r.score for r in results if r.score is not None]
    return {
        "cases": len(results),
        "answered": sum(r.status == "ok" for r in results),
        "object_named": _rate([s.object_named for s in scored]),
        "reason_named": _rate([s.reason_named for s in scored]),
        "numbers_exact": _rate([s.numbers_exact for s in scored]),
        "numbers_found": sum(sum(c.ok for c in s.numbers) for s in scored),
        "numbers_expected": sum(len(s.numbers) for s in scored),
        "hallucinated_objects": sum(len(s.hallucinated) for s in scored),
        "cases_with_hallucination": sum(bool(s.hallucinated) for s in scored),
        "passed": _rate([s.passed for s in scored]),
        "echoed": sum(s.failure == ECHO for s in scored),
        "empty": sum(s.failure == EMPTY for s in scored),
        "asked_again": sum(r.draws > 1 for r in results),
        "evidence_recall": _rate([evidence.recalled(r.evidence) for r in results]),
        "gathering_misses": _missed(results, evidence.NOT_GATHERED),
        "budget_misses": _missed(results, evidence.CUT),
        "fact_sources": _fact_sources(results),
        "invalid_cases": _missed(results, evidence.NOT_SERVED),
        "ttft_ms": _spread([r.ttft_ms for r in results if r.ttft_ms is not None]),
        "e2e_ms": _spread([r.e2e_ms for r in results if r.e2e_ms is not None]),
        "output_tokens": sum(r.output_tokens for r in results),
        "loop": loop_totals(results),
    }


def loop_totals(results: Sequence[CaseResult]) -> dict[str, Any] | None:
    """The investigation loop over a run (``None`` with the loop off): tool calls that parsed and
    named an offered tool, steps, each step's cached prompt tokens as a share of the previous step's
    prompt (min and mean), and the mean root-cause entity score of the cases that expect one."""
    loops = [r.loop for r in results if r.loop is not None]
    if not loops:
        return None
    fractions = [
        step["cached_of_previous"]
        for loop in loops
        for step in loop["steps"]
        if step["cached_of_previous"] is not None
    ]
    scores = [loop["root_cause_score"] for loop in loops if loop["root_cause_score"] is not None]
    return {
        "cases": len(loops),
        "calls": sum(loop["calls"] for loop in loops),
        "calls_parsed": sum(loop["calls_parsed"] for loop in loops),
        "tool_calls": sum(loop["tool_calls"] for loop in loops),
        "steps": sum(len(loop["steps"]) for loop in loops),
        "cached_of_previous_min": min(fractions) if fractions else None,
        "cached_of_previous_mean": round(sum(fractions) / len(fractions), 4) if fractions else None,
        "steps_at_or_over_90pct": sum(f >= 0.9 for f in fractions),
        "steps_compared": len(fractions),
        "root_cause_score_mean": round(sum(scores) / len(scores), 4) if scores else None,
        "root_cause_cases": len(scores),
    }


def _missed(results: Sequence[CaseResult], kind: str) -> list[str]:
    """Cases whose worst evidence miss is ``kind``."""
    return [r.case_id for r in results if evidence.miss(r.evidence) == kind]


def _fact_sources(results: Sequence[CaseResult]) -> dict[str, int]:
    """How many decisive facts each source supplied (its block's source, before the colon)."""
    counts: dict[str, int] = {}
    for result in results:
        for fact in result.evidence:
            if fact.source is not None:
                source = fact.source.split(":", 1)[0]
                counts[source] = counts.get(source, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def case_dict(result: CaseResult) -> dict[str, Any]:
    """One case of the JSON report."""
    return {
        "id": result.case_id,
        "title": result.title,
        "source": result.source,
        "scenario": result.scenario,
        "status": result.status,
        "error": result.error,
        "score": result.score.as_dict() if result.score is not None else None,
        "not_in_context": result.not_in_context,
        "evidence_recalled": evidence.recalled(result.evidence),
        "evidence": [f.as_dict() for f in result.evidence],
        "ttft_ms": result.ttft_ms,
        "tpot_ms": result.tpot_ms,
        "e2e_ms": result.e2e_ms,
        "prompt_tokens": result.prompt_tokens,
        "output_tokens": result.output_tokens,
        "draws": result.draws,
        "sources": result.sources,
        "request_id": result.request_id,
        "answer": result.answer,
        "prompt": result.prompt,
        "loop": result.loop,
    }


def build_report(
    results: Sequence[CaseResult],
    *,
    started: datetime,
    wall_s: float,
    engine: Mapping[str, Any],
    case_paths: Sequence[str],
    argv: Sequence[str],
) -> dict[str, Any]:
    """The whole JSON report."""
    return {
        "date": started.isoformat(timespec="seconds"),
        "command": shlex.join(["opsbot", *argv]),
        "hardware": hardware(),
        "versions": versions(),
        "engine": dict(engine),
        "cases_from": list(case_paths),
        "wall_s": round(wall_s, 1),
        "totals": totals(results),
        "cases": [case_dict(r) for r in results],
    }


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f} ms"


def _mark(value: bool | None) -> str:
    return "n/a" if value is None else ("yes" if value else "no")


def _frac(rate: Mapping[str, int]) -> str:
    return f"{rate['hits']}/{rate['of']}"


def summary_line(report: Mapping[str, Any]) -> str:
    """``eval: 25 cases on cpu/model: object 3/25, reason 5/25, numbers 2/40 exact, ...``"""
    t, e = report["totals"], report["engine"]
    quant = f" ({e['quantization']})" if e.get("quantization") else ""
    if e.get("evidence_only"):
        return (
            f"eval: {t['cases']} cases, evidence only (prompts built with the "
            f"{e.get('backend')}/{e.get('model_name') or e.get('model')} tokenizer, no answers): evidence "
            f"recall {_frac(t['evidence_recall'])}; wall {report['wall_s']} s"
        )
    ttft = t["ttft_ms"]["p50"]
    e2e = t["e2e_ms"]["p50"]
    return (
        f"eval: {t['cases']} cases on {e.get('backend')}/{e.get('model_name') or e.get('model')}{quant}: "
        f"{t['answered']} answered, evidence recall {_frac(t['evidence_recall'])}, "
        f"object named {_frac(t['object_named'])}, "
        f"reason named {_frac(t['reason_named'])}, "
        f"numbers exact {t['numbers_found']}/{t['numbers_expected']}, "
        f"{t['hallucinated_objects']} hallucinated objects in {t['cases_with_hallucination']} cases, "
        f"passed {_frac(t['passed'])}{_failed_answers(t)}; TTFT p50 {_ms(ttft)}, e2e p50 {_ms(e2e)}, "
        f"wall {report['wall_s']} s"
    )


def _failed_answers(t: Mapping[str, Any]) -> str:
    """`` (2 echoed the prompt, 1 empty)``: answers counted as failed whatever they named."""
    parts = []
    if t.get("echoed"):
        parts.append(f"{t['echoed']} echoed the prompt")
    if t.get("empty"):
        parts.append(f"{t['empty']} empty")
    return f" ({', '.join(parts)})" if parts else ""


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _loop_lines(loop: Mapping[str, Any] | None) -> list[str]:
    """The investigation loop's totals (nothing when the loop was off)."""
    if not loop:
        return []
    return [
        "## Investigation loop",
        "",
        "| measure | result |",
        "|---|---|",
        f"| decisions that parse and name an offered tool | {loop['calls_parsed']}/{loop['calls']} |",
        f"| tool calls run / model steps | {loop['tool_calls']} / {loop['steps']} |",
        f"| cached prompt tokens / previous step's prompt, min / mean | "
        f"{_pct(loop['cached_of_previous_min'])} / {_pct(loop['cached_of_previous_mean'])} |",
        f"| steps with ≥ 90 % cached | {loop['steps_at_or_over_90pct']}/{loop['steps_compared']} |",
        f"| root-cause entity score, mean (ITBench-AA style) | {loop['root_cause_score_mean']} over "
        f"{loop['root_cause_cases']} cases |",
        "",
    ]


def render_markdown(report: Mapping[str, Any]) -> str:
    """The Markdown report."""
    t, e, hw = report["totals"], report["engine"], report["hardware"]
    lines = [
        f"# opsbot eval — {e.get('model_name') or e.get('model')} on {e.get('backend')}",
        "",
        f"- date: {report['date']}",
        f"- command: `{report['command']}`",
        f"- hardware: {hw['cpu']}, {hw['cores']} cores, {hw['memory_gib']} GiB"
        + (f", GPU {hw['gpu']}" if hw.get("gpu") else ", no GPU"),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()),
        "- engine: " + ", ".join(f"{k} {v}" for k, v in e.items() if v not in (None, "")),
        f"- cases: {t['cases']} from {', '.join(report['cases_from'])}; wall time {report['wall_s']} s",
        "",
        "## Totals",
        "",
        "| measure | result |",
        "|---|---|",
        f"| answered (status ok) | {t['answered']}/{t['cases']} |",
        f"| evidence recall (every decisive fact in the prompt) | {_frac(t['evidence_recall'])} |",
        f"| gathering misses (in the served state, never gathered) | {_ids(t['gathering_misses'])} |",
        f"| budget misses (gathered, cut by the budget) | {_ids(t['budget_misses'])} |",
        "| facts by source | " + (", ".join(f"{k} {v}" for k, v in t["fact_sources"].items()) or "–") + " |",
        f"| failing object named | {_frac(t['object_named'])} |",
        f"| reason named | {_frac(t['reason_named'])} |",
        f"| numbers exact (cases with all right) | {_frac(t['numbers_exact'])} |",
        f"| numbers exact (single numbers) | {t['numbers_found']}/{t['numbers_expected']} |",
        f"| hallucinated objects | {t['hallucinated_objects']} in {t['cases_with_hallucination']} cases |",
        f"| passed (all of the above, no hallucination) | {_frac(t['passed'])} |",
        f"| failed answers: echoed the prompt / empty after cleaning | {t.get('echoed', 0)} / "
        f"{t.get('empty', 0)} |",
        f"| answers asked again (empty or copied at the first draw) | {t.get('asked_again', 0)} |",
        f"| TTFT p50 / p90 / max | {_ms(t['ttft_ms']['p50'])} / {_ms(t['ttft_ms']['p90'])} / "
        f"{_ms(t['ttft_ms']['max'])} |",
        f"| end-to-end p50 / p90 / max | {_ms(t['e2e_ms']['p50'])} / {_ms(t['e2e_ms']['p90'])} / "
        f"{_ms(t['e2e_ms']['max'])} |",
        f"| output tokens (every draw) | {t['output_tokens']} |",
        "",
    ]
    lines += _loop_lines(t.get("loop"))
    if t["invalid_cases"]:
        lines += [
            "Cases that expect a fact their own served state does not hold (fix the case): "
            + ", ".join(t["invalid_cases"]),
            "",
        ]
    lines += [
        "## Per case",
        "",
        "| case | scenario | status | evidence | object | reason | numbers | hallucinated | TTFT | e2e |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report["cases"]:
        s = c["score"] or {}
        numbers = f"{s['numbers_found']}/{s['numbers_expected']}" if s else "–"
        halluc = ", ".join(s.get("hallucinated") or []) or "–"
        lines.append(
            f"| {c['id']} | {c['scenario'] or '–'} | {c['status']} | {_evidence_cell(c['evidence'])} | "
            f"{_mark(s.get('object_named'))} | "
            f"{_mark(s.get('reason_named'))} | {numbers} | {_cell(halluc)} | {_ms(c['ttft_ms'])} | "
            f"{_ms(c['e2e_ms'])} |"
        )
    lines += ["", "## Answers", ""]
    for c in report["cases"]:
        s = c["score"] or {}
        missed = [
            " / ".join(check["wanted"])
            for kind in ("objects", "reasons", "numbers")
            for check in (s.get("checks") or {}).get(kind, [])
            if check["found"] is None
        ]
        lines.append(f"### {c['id']}: {c['title']}")
        lines.append("")
        if c["error"]:
            lines.append(f"- error: {_cell(c['error'])}")
        if missed:
            lines.append(f"- missing: {_cell('; '.join(missed))}")
        for fact in c["evidence"]:
            where = (
                f"from {', '.join(fact['sources'])}"
                if fact["status"] == evidence.IN_PROMPT
                else _MISS_TEXT[fact["status"]]
            )
            lines.append(f"- evidence {' / '.join(fact['wanted'])}: {_cell(where)}")
        answer = c["answer"] or ""
        excerpt = answer[:600] + (" …" if len(answer) > 600 else "")
        lines += ["", "> " + "\n> ".join(excerpt.splitlines() or ["(no answer)"]), ""]
    return "\n".join(lines) + "\n"


_MISS_TEXT = {
    evidence.CUT: "MISSED: gathered, cut by the budget",
    evidence.NOT_GATHERED: "MISSED: in the served state, never gathered",
    evidence.NOT_SERVED: "not in the served state either (case problem)",
}


def _ids(ids: Sequence[str]) -> str:
    return f"{len(ids)}: {', '.join(ids)}" if ids else "0"


def _evidence_cell(facts: Sequence[Mapping[str, Any]]) -> str:
    if not facts:
        return "–"
    hits = sum(f["status"] == evidence.IN_PROMPT for f in facts)
    return f"{hits}/{len(facts)}"


def case_line(index: int, total: int, result: CaseResult, *, evidence_only: bool = False) -> str:
    """The progress line of one finished case (``evidence_only``: no answer was asked for, so only
    the decisive facts and the prompt's size say anything)."""
    s = result.score
    if evidence_only and result.status == "ok":
        facts = [f.as_dict() for f in result.evidence]
        lost = [str(f["wanted"]) for f in facts if f["status"] != evidence.IN_PROMPT]
        missed = f" (missed: {'; '.join(lost)})"[:200] if lost else ""
        verdict = f"evidence {_evidence_cell(facts)}{missed}"
        return f"[{index}/{total}] {result.case_id}: {verdict} · prompt {result.prompt_tokens} tokens"
    if s is None:
        verdict = f"{result.status}: {result.error or 'no answer'}"[:160]
    elif s.failure is not None and result.status == "ok":
        verdict = f"FAILED ({s.failure})"
    else:
        verdict = (
            f"object {_mark(s.object_named)}, reason {_mark(s.reason_named)}, "
            f"numbers {sum(c.ok for c in s.numbers)}/{len(s.numbers)}, "
            f"evidence {_evidence_cell([f.as_dict() for f in result.evidence])}, "
            f"hallucinated {len(s.hallucinated)}"
        )
    latency = f"TTFT {_ms(result.ttft_ms)} · e2e {_ms(result.e2e_ms)}"
    return f"[{index}/{total}] {result.case_id}: {verdict} · {latency}"
