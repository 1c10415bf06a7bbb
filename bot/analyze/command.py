"""``opsbot analyze``: a batch analysis standalone, no bot running.

On a GPU (``engine.backend`` resolves to ``vllm``) every item goes through vLLM's offline engine at
once (static batching, :class:`~bot.analyze.runner.OfflineExecutor`); on the CPU engine items run
through the normal engine interface a few at a time (:class:`~bot.analyze.runner.EngineExecutor`),
slowly. The engine is only started when something is left to do.

The first Ctrl-C stops the run: finished items are kept, running ones are aborted, the report is
written from what is done, and the exit status is 130; a re-run with the same ``--out`` carries on.
A second Ctrl-C ends the process at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from bot.analyze.job import JobSpec, Prepared, execute, finish, prepare
from bot.analyze.post import PostingAdapter, parse_target, post_summary
from bot.analyze.progress import progress_for
from bot.analyze.readers import describe_bad_lines, read_path
from bot.analyze.report import ReportFiles, summarised_text
from bot.analyze.results import ResultLog, run_id
from bot.analyze.runner import BatchRunner, EngineExecutor, Executor, OfflineExecutor, RunSummary
from bot.config import AnalyzeSettings, Settings
from bot.engine_factory import build_engine, pick_backend, resolve_model
from bot.prompts import PromptBuilder, load_system_prompt
from bot.store import Store
from inference.engine import ChatMessage, ChatTokenizer, Engine
from inference.scenarios import ScenarioRegistry

logger = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130


async def run_analyze(settings: Settings, args: argparse.Namespace, *, out: Console, err: Console) -> int:
    """The command (see the module doc); returns the exit status."""
    target = parse_target(args.post) if args.post else None
    cfg = settings.analyze
    spec = _job_spec(args, cfg)
    read = await asyncio.to_thread(read_path, Path(args.input), args.format)
    for line in describe_bad_lines(read.bad_lines):
        err.print(f"[yellow]skipped[/yellow] {line}", highlight=False, markup=True, soft_wrap=True)
    if not read.records:
        err.print(f"opsbot: error: no records could be read from {args.input}", markup=False, soft_wrap=True)
        return 1
    progress_line = lambda line: err.print(f"[dim]{line}[/dim]", highlight=False, soft_wrap=True)  # noqa: E731
    model = resolve_model(settings, progress=progress_line)
    backend = pick_backend(settings, model)
    system_prompt = load_system_prompt(settings.prompt.system_prompt, settings.prompt.system_prompt_file)
    offline = None
    engine: Engine | None = None

    async def start_engine() -> Engine:
        err.print(f"[dim]starting the {backend} engine ({model}) ...[/dim]", highlight=False, soft_wrap=True)
        started = build_engine(settings, model)
        await started.start(warmup_messages=[ChatMessage("system", system_prompt)])
        return started

    if backend == "vllm":
        from inference.vllm_batch import OfflineBatchEngine

        offline = OfflineBatchEngine(
            settings.engine.model_copy(update={"model": model}), max_num_seqs=cfg.offline_max_num_seqs
        )
        tokenizer: ChatTokenizer = await asyncio.to_thread(lambda: offline.tokenizer)
    elif backend == "cpu" or settings.engine.tokenizer:
        from inference.tokenization import HFChatTokenizer

        tokenizer = await asyncio.to_thread(
            HFChatTokenizer,
            settings.engine.tokenizer or model,
            trust_remote_code=settings.engine.trust_remote_code,
        )
    else:  # a model server without a local tokenizer: the server renders and counts
        engine = await start_engine()
        tokenizer = engine.tokenizer
    store: Store | None = None
    restore: Callable[[], None] = lambda: None  # noqa: E731
    try:
        builder = PromptBuilder(
            tokenizer,
            system_prompt=system_prompt,
            max_model_len=settings.engine.max_model_len,
            context_share=settings.prompt.context_share,
            history_share=settings.prompt.history_share,
        )
        prepared = await asyncio.to_thread(
            prepare, spec, read, builder, ScenarioRegistry(settings.sampling_overrides())
        )
        _say_plan(prepared, err)
        store = await Store.open(settings.store_url, settings.store, upgrade=settings.store.auto_upgrade)
        stop = asyncio.Event()
        runner = BatchRunner(
            results=ResultLog(spec.out_dir),
            store=store,
            run_id=run_id(spec.out_dir, {"input": str(args.input), "scenario": spec.scenario}),
            model=model,
            progress=progress_for(err),
            channel=target[1] if target else None,
        )

        async def make_executor() -> Executor:
            nonlocal engine
            if offline is not None:
                err.print(
                    f"[dim]starting the vLLM offline engine ({model}) ...[/dim]",
                    highlight=False,
                    soft_wrap=True,
                )
                warmup = tokenizer.render([ChatMessage("system", system_prompt)], add_generation_prompt=False)
                await asyncio.to_thread(offline.start, warmup)
                return OfflineExecutor(offline, runner.request_id)
            if engine is None:
                engine = await start_engine()
            # The CPU engine decodes a few at once; a model server takes as many as a bot would send.
            width = settings.engine.cpu_max_concurrency if backend == "cpu" else cfg.max_in_flight
            return EngineExecutor(engine, width, runner.request_id)

        restore = _first_interrupt_stops(stop, err)
        summary = await execute(prepared, runner, make_executor, stop)
        report, files = await asyncio.to_thread(finish, prepared, runner, summary, model)
        if target is not None and not summary.interrupted:
            await _post(settings, target, store, report, str(files.markdown), err)
    finally:
        restore()
        if offline is not None:
            await asyncio.to_thread(offline.shutdown)
        if engine is not None:
            await engine.shutdown(drain_timeout_s=5.0)
        if store is not None:
            await store.close()
    return _say_outcome(summary, report, files, out=out, err=err)


async def _post(
    settings: Settings, target: tuple[str, str], store: Store, report: dict[str, Any], path: str, err: Console
) -> None:
    """Post the report's summary into a new thread of ``target`` (platform, channel)."""
    async with PostingAdapter(settings, target[0], store) as adapter:
        thread = await post_summary(adapter, target[1], report, report_path=path)
    where = f"{target[0]}:{target[1]}"
    err.print(f"[dim]summary posted to {where} (thread {thread})[/dim]", highlight=False, soft_wrap=True)


def _job_spec(args: argparse.Namespace, cfg: AnalyzeSettings) -> JobSpec:
    """The job the command line and ``[analyze]`` describe."""
    return JobSpec(
        input_name=Path(args.input).name or str(args.input),
        scenario=args.scenario,
        out_dir=Path(args.out),
        since=args.since,
        until=args.until,
        max_tokens=args.max_tokens or cfg.max_tokens,
        max_groups=args.max_groups or cfg.max_groups,
        max_group_lines=cfg.max_group_lines,
        instance_labels=cfg.instance_labels,
    )


def _say_outcome(
    summary: RunSummary, report: dict[str, Any], files: ReportFiles, *, out: Console, err: Console
) -> int:
    """What this run did, where the report is, and the exit status (interrupted, failed items, ok)."""
    totals = report["totals"]
    out.print(
        f"{summary.finished} items this run ({summary.items_per_s:.2f} items/s, "
        f"{summary.output_tokens_per_s:.0f} output tokens/s, {summary.wall_s:.1f} s), "
        f"{summary.skipped} already done; {summarised_text(totals)}",
        highlight=False,
        soft_wrap=True,
    )
    log = files.markdown.parent / "analyze.log"
    where = f"  (log: {log})" if log.exists() else ""
    out.print(f"report: {files.markdown}  {files.json}  {files.png}{where}", highlight=False, soft_wrap=True)
    if summary.interrupted:
        err.print(
            f"interrupted: {summary.finished + summary.skipped} of {summary.total} items are done and kept; "
            "run the same command again to finish the rest",
            highlight=False,
            soft_wrap=True,
        )
        return EXIT_INTERRUPTED
    if summary.failed:
        err.print(
            f"{summary.failed} items failed (see the log); run again to retry them",
            highlight=False,
            soft_wrap=True,
        )
        return 1
    return 0


def _say_plan(prepared: Prepared, err: Console) -> None:
    s, g = prepared.plan.savings, prepared.grouping
    err.print(
        f"{len(prepared.read.records)} records read ({len(prepared.read.bad_lines)} bad lines skipped, "
        f"{prepared.outside_window} outside the window, {g.repeats_merged} repeats merged): "
        f"{s.items} items in {len(g.groups)} groups; grouping saves {s.items_saved} requests and "
        f"{s.tokens_saved:,} prompt tokens ({s.tokens_grouped:,} instead of {s.tokens_each:,})",
        highlight=False,
        soft_wrap=True,
    )
    if prepared.plan.not_planned:
        err.print(
            f"{len(prepared.plan.not_planned)} smaller groups beyond --max-groups are listed unsummarised",
            highlight=False,
            soft_wrap=True,
        )


def _first_interrupt_stops(stop: asyncio.Event, err: Console) -> Callable[[], None]:
    """SIGINT sets ``stop`` the first time (a graceful stop) and interrupts the second time."""
    loop = asyncio.get_running_loop()

    def first() -> None:
        err.print(
            "stopping: finished items are kept (Ctrl-C again to quit at once)",
            highlight=False,
            soft_wrap=True,
        )
        stop.set()
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGINT)  # the next Ctrl-C is Python's own

    try:
        loop.add_signal_handler(signal.SIGINT, first)
    except (NotImplementedError, RuntimeError):  # not the main thread, or no signals here
        return lambda: None

    def restore() -> None:
        with contextlib.suppress(Exception):
            loop.remove_signal_handler(signal.SIGINT)

    return restore
