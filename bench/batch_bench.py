"""Batch-analysis benchmark: the offline path against the interactive path, and the urgent lane
while a batch runs inside the bot, in one run on one GPU.

1. **Items.** ``--alerts`` realistic alerts of one shift (``bench/gen_alerts.py``) are read and grouped
   as ``opsbot analyze`` does: ``grouped`` is one item per group (what the product runs), ``each``
   one item per alert (grouping off: the throughput workload, 1,000 requests).
2. **Offline path**, per item set: what ``opsbot analyze`` runs standalone. On vLLM, the offline
   engine (``inference.vllm_batch``: ``LLM`` with every request queued at once, static batching at
   ``--offline-max-num-seqs``) through the batch runner; on the CPU engine, the engine interface with
   bounded concurrency.
3. **Interactive path**, the same items through ``AsyncLLM`` (opsbot's ``VllmEngine``), all submitted
   at once with the bot's batch width (``max_num_seqs``).
4. **Inside the bot**: the bot's admitted engine and the real pipeline (SQLite store). Urgent ``/rca``
   questions arrive every ``--urgent-interval`` s, first with the bot idle, then while the ``each``
   batch runs in the background lane; urgent TTFT p50 / p99 / max of both, and the batch's own
   items/s inside the bot.

Reported per path: items, wall s, items/s, output tokens/s, total tokens/s (prompt + output), item
TTFT p50 / p99 (for a static batch it includes the wait for a batch slot). Answers are
``--max-tokens`` long (64), greedy, ``ignore_eos``, so both paths generate the same token counts.

Usage on the H200 (vLLM importable, 8B-shaped dummy model, about 3 minutes with a warm compile
cache; a fresh machine compiles each engine once more, 2-3 minutes longer)::

    python bench/batch_bench.py --out bench/results/batch_bench.json

``--dry-run`` builds the items and prints the plan (no engine; CPU is enough). ``--engine cpu``
runs everything on the CPU engine and the tiny test model (a correctness smoke test, not a
measurement). Results: a JSON file (rewritten after every phase, so a timeout keeps what finished)
and a Markdown table beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import io
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from gen_alerts import generate_alerts  # noqa: E402
from run_meta import run_meta  # noqa: E402

from bot.adapters.console import ConsoleAdapter  # noqa: E402
from bot.analyze.grouping import group_records  # noqa: E402
from bot.analyze.progress import LogProgress  # noqa: E402
from bot.analyze.readers import read_bytes  # noqa: E402
from bot.analyze.records import Group  # noqa: E402
from bot.analyze.results import ResultLog  # noqa: E402
from bot.analyze.runner import BatchRunner, EngineExecutor, Executor, OfflineExecutor, RunSummary  # noqa: E402
from bot.analyze.work import WorkItem, plan_work  # noqa: E402
from bot.app import submit_to  # noqa: E402
from bot.config import StoreSettings  # noqa: E402
from bot.pipeline import Pipeline  # noqa: E402
from bot.prompts import DEFAULT_SYSTEM_PROMPT, PromptBuilder  # noqa: E402
from bot.store import Store  # noqa: E402
from inference.admission import AdmissionConfig, AdmittedEngine  # noqa: E402
from inference.config import EngineConfig  # noqa: E402
from inference.engine import ChatMessage, Engine, SamplingSettings  # noqa: E402
from inference.scenarios import ScenarioRegistry  # noqa: E402

logger = logging.getLogger("batch_bench")

URGENT_QUESTIONS = (
    "why is payments-api crashlooping since the rollout?",
    "what is wrong with checkout-api latency?",
    "why are orders-worker pods OOMKilled?",
    "why is the ledger-db replica lagging?",
)


def pct(values: Sequence[float], p: float) -> float | None:
    """Linear-interpolated percentile (as engine_bench computes it)."""
    s = sorted(values)
    if not s:
        return None
    k = (len(s) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(s) - 1)
    return round(s[f] + (s[c] - s[f]) * (k - f), 1)


# --- items ---------------------------------------------------------------------------------------


def build_items(
    builder: PromptBuilder, n_alerts: int, max_tokens: int, seed: int
) -> tuple[dict[str, list[WorkItem]], dict[str, Any]]:
    """The ``grouped`` and ``each`` item sets, and facts about them."""
    alerts = generate_alerts(n_alerts, seed=seed)
    read = read_bytes(json.dumps(alerts).encode(), "shift.json")
    grouping = group_records(read.records)
    grouped = plan_work(grouping.groups, "alert_summary", builder, max_tokens, max_groups=None)
    singles = [
        Group(key=f"alert-{i}", kind=r.kind, name=r.name, labels=dict(r.labels), records=[r])
        for i, r in enumerate(read.records)
    ]
    each = plan_work(singles, "alert_summary", builder, max_tokens, max_groups=None)
    sets = {"grouped": grouped.items, "each": each.items}
    facts = {
        "alerts": len(read.records),
        "groups": len(grouping.groups),
        "savings": grouped.savings.as_json(),
        "prompt_tokens": {
            name: {
                "mean": round(sum(i.prompt_tokens for i in items) / len(items), 1),
                "max": max(i.prompt_tokens for i in items),
                "total": sum(i.prompt_tokens for i in items),
            }
            for name, items in sets.items()
        },
    }
    return sets, facts


def sampling(max_tokens: int) -> SamplingSettings:
    """Fixed-length greedy answers: both paths generate exactly the same number of tokens."""
    return SamplingSettings(
        temperature=0.0, top_p=1.0, max_tokens=max_tokens, repetition_penalty=1.0, ignore_eos=True
    )


async def run_set(
    name: str, items: list[WorkItem], executor: Executor, max_tokens: int, tmp: Path
) -> dict[str, Any]:
    """One item set through one executor with the batch runner (a fresh results file)."""
    out = tmp / f"{executor.mode}-{name}-{time.monotonic_ns()}"
    runner = BatchRunner(
        results=ResultLog(out), store=None, run_id="bench", model="bench", progress=LogProgress(every_s=10)
    )
    summary = await runner.run(items, executor, sampling(max_tokens), asyncio.Event())
    return describe(name, summary, runner, items)


def describe(name: str, summary: RunSummary, runner: BatchRunner, items: list[WorkItem]) -> dict[str, Any]:
    done = list(runner.finished.values())
    prompt = sum(r.prompt_tokens for r in done)
    output = sum(r.output_tokens for r in done)
    wall = summary.wall_s
    return {
        "items": name,
        "n": len(items),
        "finished": summary.finished,
        "failed": summary.failed,
        "wall_s": round(wall, 2),
        "items_per_s": round(summary.finished / wall, 2) if wall else None,
        "output_tokens_per_s": round(output / wall, 1) if wall else None,
        "total_tokens_per_s": round((prompt + output) / wall, 1) if wall else None,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "cached_tokens": sum(r.cached_tokens for r in done),
        "item_ttft_p50_ms": pct([r.ttft_ms for r in done if r.ttft_ms is not None], 50),
        "item_ttft_p99_ms": pct([r.ttft_ms for r in done if r.ttft_ms is not None], 99),
    }


# --- engines -------------------------------------------------------------------------------------


def engine_config(args: argparse.Namespace, model: Path) -> EngineConfig:
    if args.engine == "cpu":
        return EngineConfig(
            backend="cpu", model=str(model), max_model_len=2048, cpu_max_concurrency=4, request_timeout_s=None
        )
    return EngineConfig(
        backend="vllm",
        model=str(model),
        load_format="dummy",
        dtype="bfloat16",
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=4096,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        enforce_eager=args.enforce_eager,
        request_timeout_s=None,
    )


def model_folder(args: argparse.Namespace) -> Path:
    from inference.testmodel import TEST_MODEL_VERSION, build_test_model

    if args.model:
        return Path(args.model)
    base = Path(args.model_dir) if args.model_dir else ROOT / ".pytest_cache" / "opsbot-models"
    size = "tiny" if args.engine == "cpu" else "8b"
    return build_test_model(base / f"{size}-v{TEST_MODEL_VERSION}", size)


def interactive_engine(cfg: EngineConfig) -> Engine:
    if cfg.backend == "cpu":
        from inference.cpu_engine import CpuEngine

        return CpuEngine(cfg)
    from inference.vllm_engine import VllmEngine

    return VllmEngine(cfg)


async def offline_phase(
    args: argparse.Namespace,
    cfg: EngineConfig,
    sets: dict[str, list[WorkItem]],
    system_ids: list[int],
    tmp: Path,
) -> dict[str, Any]:
    """Every item set through the offline path (see the module doc)."""
    out: dict[str, Any] = {"runs": []}
    if cfg.backend == "cpu":
        engine = AdmittedEngine(interactive_engine(cfg), AdmissionConfig())
        await engine.start([ChatMessage("system", DEFAULT_SYSTEM_PROMPT)])
        try:
            executor: Executor = EngineExecutor(engine, cfg.cpu_max_concurrency, _request_id)
            out["mode"] = f"cpu engine, {cfg.cpu_max_concurrency} at once"
            for name, items in sets.items():
                out["runs"].append(await run_set(name, items, executor, args.max_tokens, tmp))
        finally:
            await engine.shutdown(5)
        return out
    from inference.vllm_batch import OfflineBatchEngine

    batch = OfflineBatchEngine(cfg, max_num_seqs=args.offline_max_num_seqs)
    t0 = time.perf_counter()
    await asyncio.to_thread(batch.start, system_ids)
    out["startup_s"] = round(time.perf_counter() - t0, 1)
    out["kv_capacity_tokens"] = batch.kv_capacity_tokens
    out["mode"] = f"vLLM LLM, static batching, max_num_seqs {args.offline_max_num_seqs}"
    try:
        executor = OfflineExecutor(batch, _request_id)
        for name, items in sets.items():
            per_item = sum(i.prompt_tokens for i in items) / len(items) + args.max_tokens
            run = await run_set(name, items, executor, args.max_tokens, tmp)
            run["batch_width"] = min(len(items), batch.batch_width(per_item))
            out["runs"].append(run)
    finally:
        await asyncio.to_thread(batch.shutdown)
        await gpu_memory_back(cfg.gpu_memory_utilization)
    return out


async def gpu_memory_back(fraction: float, timeout_s: float = 60.0) -> None:
    """Wait until the offline engine's memory is free again (the next engine checks free memory)."""
    from inference.vllm_engine import VllmEngine

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        facts = VllmEngine._gpu_facts(1)
        if not facts or facts[0]["free"] >= fraction * facts[0]["total"]:
            return
        await asyncio.sleep(0.5)
    logger.warning("GPU memory not free %.0f s after the offline engine stopped", timeout_s)


def _request_id(item: WorkItem) -> str:
    return f"bench-{item.id[:16]}-{time.monotonic_ns()}"


async def urgent_pattern(
    pipeline: Pipeline, adapter: ConsoleAdapter, n: int, interval_s: float, tag: str
) -> list[str]:
    """``n`` urgent /rca questions, one every ``interval_s`` s, each answered in full; their request ids."""
    tasks = []
    ids = []
    for index in range(n):
        message = adapter.to_message(
            f"/rca {URGENT_QUESTIONS[index % len(URGENT_QUESTIONS)]} ({tag} {index})"
        )
        ids.append(message.request_id)
        tasks.append(pipeline.submit(message, adapter))
        await asyncio.sleep(interval_s)
    await asyncio.gather(*tasks)
    return ids


async def urgent_ttft(store: Store, request_ids: list[str]) -> dict[str, Any]:
    from sqlalchemy import select

    from bot.store.models import RequestRow

    deadline = time.monotonic() + 30
    while store.buffered and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(RequestRow.ttft_ms, RequestRow.status, RequestRow.lane).where(
                    RequestRow.request_id.in_(request_ids)
                )
            )
        ).all()
    ttft = [float(r.ttft_ms) for r in rows if r.ttft_ms is not None]
    return {
        "n": len(rows),
        "ok": sum(1 for r in rows if r.status == "ok"),
        "lanes": sorted({r.lane for r in rows}),
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p99_ms": pct(ttft, 99),
        "ttft_max_ms": round(max(ttft), 1) if ttft else None,
    }


async def interactive_and_bot_phase(
    args: argparse.Namespace,
    cfg: EngineConfig,
    sets: dict[str, list[WorkItem]],
    tmp: Path,
    report: dict[str, Any],
    save: Any,
) -> None:
    """The interactive path, then the urgent lane idle and beside a batch inside the bot, on one engine."""
    inner = interactive_engine(cfg)
    t0 = time.perf_counter()
    await inner.start([ChatMessage("system", DEFAULT_SYSTEM_PROMPT)])
    phase: dict[str, Any] = {"startup_s": round(time.perf_counter() - t0, 1), "runs": []}
    report["interactive"] = phase
    try:
        everything = EngineExecutor(inner, max(len(items) for items in sets.values()), _request_id)
        phase["mode"] = f"{inner.backend} engine (AsyncLLM on vLLM), every item submitted at once"
        for name, items in sets.items():
            phase["runs"].append(await run_set(name, items, everything, args.max_tokens, tmp))
            save()
        report["in_bot"] = await bot_phase(args, cfg, inner, sets["each"], tmp)
        save()
    finally:
        await inner.shutdown(10)


async def bot_phase(
    args: argparse.Namespace, cfg: EngineConfig, inner: Engine, batch_items: list[WorkItem], tmp: Path
) -> dict[str, Any]:
    """Urgent TTFT with the bot idle, then with the batch running in its background lane."""
    engine = AdmittedEngine(inner, AdmissionConfig(), request_timeout_s=None)
    store = await Store.open(f"sqlite+aiosqlite:///{tmp / 'bench.db'}", StoreSettings())
    prompts = PromptBuilder(
        engine.tokenizer,
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=cfg.max_model_len,
        context_share=0.45,
        history_share=0.2,
    )
    scenarios = ScenarioRegistry(
        {"root_cause": {"max_tokens": args.max_tokens}, "chat": {"max_tokens": args.max_tokens}}
    )
    pipeline = Pipeline(engine=engine, store=store, prompts=prompts, scenarios=scenarios, model_name="bench")
    adapter = ConsoleAdapter(stdin=io.StringIO(""), stdout=io.StringIO())
    await adapter.start(submit_to(pipeline, adapter))
    out: dict[str, Any] = {"urgent_interval_s": args.urgent_interval, "urgent_n": args.urgent}
    try:
        idle_ids = await urgent_pattern(pipeline, adapter, args.urgent, args.urgent_interval, "idle")
        out["urgent_idle"] = await urgent_ttft(store, idle_ids)

        runner = BatchRunner(
            results=ResultLog(tmp / "in-bot"),
            store=store,
            run_id="inbot",
            model="bench",
            progress=LogProgress(10),
        )
        executor = EngineExecutor(engine, args.in_bot_max_in_flight, runner.request_id)
        stop = asyncio.Event()
        batch = asyncio.create_task(runner.run(batch_items, executor, sampling(args.max_tokens), stop))
        # Urgent questions start once the batch fills the engine (its first answers are out).
        deadline = time.monotonic() + 120
        while len(runner.finished) < 1 and not batch.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        busy_ids = await urgent_pattern(pipeline, adapter, args.urgent, args.urgent_interval, "busy")
        out["batch_running_when_urgent_ended"] = not batch.done()
        out["urgent_with_batch"] = await urgent_ttft(store, busy_ids)
        summary = await batch
        out["batch"] = describe("each", summary, runner, batch_items)
        idle, busy = out["urgent_idle"]["ttft_p99_ms"], out["urgent_with_batch"]["ttft_p99_ms"]
        out["urgent_p99_ratio_batch_to_idle"] = round(busy / idle, 2) if idle and busy else None
    finally:
        await pipeline.drain(10)
        await store.close()
    return out


# --- report --------------------------------------------------------------------------------------


def table(report: dict[str, Any]) -> str:
    m = report["meta"]
    lines = [
        f"# Batch benchmark {m['date']}",
        "",
        f"`{m['command']}`",
        "",
        f"Hardware: {m.get('gpu') or 'no GPU'}, host {m.get('host')}; versions: python {m.get('python')}, "
        f"vllm {m.get('vllm')}, torch {m.get('torch')}, transformers {m.get('transformers')}.",
        "",
    ]
    items = report.get("items", {})
    if items:
        s = items["savings"]
        lines.append(
            f"{items['alerts']} alerts in {items['groups']} groups; grouping saves {s['items_saved']} "
            f"requests and {s['prompt_tokens_saved']:,} prompt tokens "
            f"({s['prompt_tokens_grouped']:,} instead of {s['prompt_tokens_each']:,})."
        )
        lines.append("")
    lines += [
        "| path | items | n | wall s | items/s | output tok/s | total tok/s | item TTFT p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for path in ("offline", "interactive"):
        for run in report.get(path, {}).get("runs", []):
            lines.append(
                f"| {path} | {run['items']} | {run['n']} | {run['wall_s']} | {run['items_per_s']} | "
                f"{run['output_tokens_per_s']} | {run['total_tokens_per_s']} | "
                f"{run['item_ttft_p50_ms']} / {run['item_ttft_p99_ms']} |"
            )
    bot = report.get("in_bot")
    if bot:
        lines += [
            "",
            "| urgent /rca inside the bot | n | TTFT p50 ms | TTFT p99 ms | TTFT max ms |",
            "|---|---|---|---|---|",
        ]
        for key, label in (
            ("urgent_idle", "bot idle"),
            ("urgent_with_batch", "batch in the background lane"),
        ):
            u = bot[key]
            lines.append(
                f"| {label} | {u['n']} | {u['ttft_p50_ms']} | {u['ttft_p99_ms']} | {u['ttft_max_ms']} |"
            )
        b = bot["batch"]
        lines += [
            "",
            f"Urgent p99 with the batch / idle: {bot['urgent_p99_ratio_batch_to_idle']}; the batch inside "
            f"the bot: {b['finished']} items in {b['wall_s']} s ({b['items_per_s']} items/s, "
            f"{b['output_tokens_per_s']} output tok/s); still running when the urgent questions ended: "
            f"{bot['batch_running_when_urgent_ended']}.",
        ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    from inference.tokenization import HFChatTokenizer

    model = model_folder(args)
    cfg = engine_config(args, model)
    tokenizer = HFChatTokenizer(str(model))
    builder = PromptBuilder(
        tokenizer,
        system_prompt=DEFAULT_SYSTEM_PROMPT,
        max_model_len=cfg.max_model_len,
        context_share=0.45,
        history_share=0.2,
    )
    t0 = time.perf_counter()
    sets, facts = build_items(builder, args.alerts, args.max_tokens, args.seed)
    facts["build_s"] = round(time.perf_counter() - t0, 1)
    wanted = [s for s in args.items.split(",") if s]
    sets = {name: items for name, items in sets.items() if name in wanted or name == "each"}
    report: dict[str, Any] = {
        "meta": run_meta(sys.argv),
        "engine": cfg.model_dump(mode="json", include={"backend", "model", "max_model_len", "max_num_seqs"}),
        "max_tokens": args.max_tokens,
        "items": facts,
    }
    if args.dry_run:
        measured_sets = ", ".join(f"{k} ({len(v)} items)" for k, v in sets.items() if k in wanted)
        plan = {
            "offline": f"{args.engine}: {measured_sets}",
            "interactive": "the same items, every one submitted at once",
            "in_bot": f"{args.urgent} urgent questions idle, then beside the each batch "
            f"({len(sets['each'])} items)",
        }
        print(json.dumps({"plan": plan, **report}, indent=2))
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(report, indent=2) + "\n")
        out.with_suffix(".md").write_text(table(report) + "\n")

    system_ids = tokenizer.render([ChatMessage("system", DEFAULT_SYSTEM_PROMPT)], add_generation_prompt=False)
    measured = {name: items for name, items in sets.items() if name in wanted}
    with tempfile.TemporaryDirectory(prefix="batch-bench-") as scratch:
        tmp = Path(scratch)
        t_total = time.perf_counter()
        if "offline" in args.paths:
            try:
                report["offline"] = await offline_phase(args, cfg, measured, system_ids, tmp)
            except Exception as exc:  # keep the other phases' numbers
                logger.exception("offline phase failed")
                report["offline"] = {"error": f"{type(exc).__name__}: {exc}"}
            save()
        if "interactive" in args.paths:
            try:
                await interactive_and_bot_phase(
                    args, cfg, sets if "each" in sets else measured, tmp, report, save
                )
            except Exception as exc:
                logger.exception("interactive / in-bot phase failed")
                report["interactive_error"] = f"{type(exc).__name__}: {exc}"
        report["total_s"] = round(time.perf_counter() - t_total, 1)
        save()
    print(table(report))
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--engine", choices=("vllm", "cpu"), default="vllm", help="cpu: smoke test on the tiny model"
    )
    p.add_argument(
        "--model", help="model folder (default: the 8B-shaped test model, or tiny with --engine cpu)"
    )
    p.add_argument(
        "--model-dir", help="folder for the test model folders (default: .pytest_cache/opsbot-models)"
    )
    p.add_argument("--alerts", type=int, default=1000, help="alerts of the generated shift")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=64, help="answer tokens per item (fixed length)")
    p.add_argument("--items", default="grouped,each", help="item sets to measure: grouped, each")
    p.add_argument(
        "--paths", default="offline,interactive", help="offline, interactive (interactive includes in-bot)"
    )
    p.add_argument("--offline-max-num-seqs", type=int, default=256, help="the offline engine's batch width")
    p.add_argument(
        "--in-bot-max-in-flight", type=int, default=64, help="batch items handed to the bot's lane at once"
    )
    p.add_argument("--urgent", type=int, default=32, help="urgent /rca questions per phase")
    p.add_argument("--urgent-interval", type=float, default=0.25, help="seconds between urgent questions")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument(
        "--enforce-eager", action="store_true", help="no CUDA graphs (faster start, slower decode)"
    )
    p.add_argument(
        "--out",
        default=str(ROOT / "bench" / "results" / f"batch_bench-{dt.date.today().isoformat()}.json"),
        help="JSON result path (a .md table is written beside it)",
    )
    p.add_argument("--dry-run", action="store_true", help="build the items and print the plan; no engine")
    return p.parse_args(argv)


def main() -> int:
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        return asyncio.run(main_async(parse_args()))
    return 130


if __name__ == "__main__":  # the offline engine and AsyncLLM spawn engine-core processes
    sys.exit(main())
