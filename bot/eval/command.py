"""``opsbot eval`` and ``opsbot feedback export``: the command-line side of :mod:`bot.eval`.

``opsbot eval [CASES ...] --out DIR [--engine-config FILE.toml] [--case ID ...] [--max-tokens N]
[--evidence-only]``
starts the configured engine once (or the one ``--engine-config`` describes: a TOML file with
``[engine]`` and optionally ``[admission]``, ``[scenarios.*]``, ``[prompt]`` tables, laid over the
normal settings), runs every case, prints one progress line per case and a summary line, and
writes ``DIR/report.json`` and ``DIR/report.md``. The request rows go to ``DIR/eval.db`` (SQLite),
never into the bot's own database. ``--evidence-only`` builds every prompt with the engine's
tokenizer but asks the engine for no answer: only evidence recall is measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from rich.console import Console

from bot.config import ConfigError, Settings, with_loop
from bot.eval.cases import BUILTIN_CASES, CaseError, EvalCase, load_cases
from bot.eval.feedback import export_lines
from bot.eval.report import build_report, case_line, render_markdown, summary_line
from bot.eval.runner import EvalRunner, PromptTap, scenario_overrides

EXIT_USAGE = 2
_OVERRIDABLE = ("engine", "admission", "scenarios", "prompt")


def apply_engine_config(settings: Settings, path: Path) -> Settings:
    """``settings`` with the tables of the TOML file ``path`` laid over them (:class:`ConfigError`
    for a missing file, bad TOML, an unknown table or an invalid value)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"--engine-config {path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--engine-config {path}: cannot parse: {exc}") from None
    unknown = sorted(set(data) - set(_OVERRIDABLE))
    if unknown:
        raise ConfigError(
            f"--engine-config {path}: unknown table(s) {', '.join(unknown)}; "
            f"it may set {', '.join(_OVERRIDABLE)}"
        )
    update: dict[str, Any] = {}
    for name, values in data.items():
        current = getattr(settings, name)
        try:
            if isinstance(current, BaseModel):
                update[name] = type(current).model_validate({**current.model_dump(), **values})
            else:  # [scenarios.<name>] tables: per-scenario sampling overrides
                update[name] = {**current, **values}
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join([name, *(str(p) for p in err["loc"])])
            raise ConfigError(f"--engine-config {path}: {where}: {err['msg']}") from None
    return settings.model_copy(update=update)


def _chosen_cases(paths: list[Path], chosen: list[str] | None) -> list[EvalCase]:
    """The cases in ``paths``, only those ``--case`` names when it is given; :class:`CaseError`
    for a file that does not parse or a named case that is not there."""
    cases = load_cases(paths)
    if not chosen:
        return cases
    known = {c.id for c in cases}
    missing = [c for c in chosen if c not in known]
    if missing:
        raise CaseError(
            f"no case {', '.join(missing)} in {', '.join(map(str, paths))} "
            f"(there are {len(cases)}: {', '.join(sorted(known))[:400]})"
        )
    return [c for c in cases if c.id in set(chosen)]


async def run_eval(settings: Settings, args: argparse.Namespace, *, out: Console, err: Console) -> int:
    """The ``opsbot eval`` command (see the module doc); returns the exit status."""
    from bot.engine_factory import build_engine, pick_backend, resolve_model
    from bot.prompts import PromptBuilder, load_system_prompt
    from bot.store import Store
    from inference.engine import ChatMessage
    from inference.scenarios import ScenarioRegistry

    def say(line: str) -> None:
        err.print(f"[dim]{line}[/dim]", highlight=False, soft_wrap=True)

    if args.engine_config is not None:
        settings = apply_engine_config(settings, args.engine_config)
    # --loop / --no-loop: the same cases and model with the loop on or off
    settings = with_loop(settings, getattr(args, "loop", None))
    paths = list(args.cases) or [BUILTIN_CASES]
    try:
        cases = _chosen_cases(paths, args.case)
    except CaseError as exc:
        err.print(f"opsbot: error: {exc}", markup=False, soft_wrap=True)
        return EXIT_USAGE
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    model = resolve_model(settings, progress=say)
    backend = pick_backend(settings, model)
    system_prompt = load_system_prompt(settings.prompt.system_prompt, settings.prompt.system_prompt_file)
    say(f"{len(cases)} cases from {', '.join(map(str, paths))}; starting the {backend} engine ({model}) ...")
    engine = PromptTap(build_engine(settings, model), answer=not getattr(args, "evidence_only", False))
    store: Store | None = None
    try:
        await engine.start(warmup_messages=[ChatMessage("system", system_prompt)])
        say(f"engine ready in {time.perf_counter() - t0:.1f} s")
        store = await Store.open(f"sqlite+aiosqlite:///{out_dir / 'eval.db'}", settings.store)
        prompts = PromptBuilder(
            engine.tokenizer,
            system_prompt=system_prompt,
            max_model_len=settings.engine.max_model_len,
            context_share=settings.prompt.context_share,
            history_share=settings.prompt.history_share,
        )
        runner = EvalRunner(
            settings,
            engine=engine,
            store=store,
            prompts=prompts,
            scenarios=ScenarioRegistry(scenario_overrides(settings, args.max_tokens)),
            model_name=model,
            run_id=started.strftime("%Y%m%dT%H%M%S"),
            workdir=out_dir,
        )
        results = await runner.run(
            cases,
            progress=lambda i, n, r: err.print(
                case_line(i, n, r, evidence_only=not engine.answer), markup=False, soft_wrap=True
            ),
        )
        stats = engine.stats()
    finally:
        await engine.shutdown(drain_timeout_s=5.0)
        if store is not None:
            await store.close()
    engine_info = {
        "backend": stats.backend or backend,
        "model": model,
        # A model folder or GGUF file is named by its last part; a hub-style id stays whole.
        "model_name": Path(model).name if Path(model).exists() else (stats.model or model),
        "quantization": stats.quantization,
        "max_model_len": settings.engine.max_model_len,
        "max_tokens": args.max_tokens,
        "evidence_only": bool(getattr(args, "evidence_only", False)),
        "investigate": settings.investigate.enabled,
    }
    report = build_report(
        results,
        started=started,
        wall_s=time.perf_counter() - t0,
        engine=engine_info,
        case_paths=[str(p) for p in paths],
        argv=getattr(args, "argv", sys.argv[1:]),
    )
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    (out_dir / "report.md").write_text(render_markdown(report))
    out.print(summary_line(report), markup=False, highlight=False, soft_wrap=True)
    log = out_dir / "eval.log"
    where = f"  (log: {log})" if log.exists() else ""
    out.print(
        f"report: {out_dir / 'report.md'}  {out_dir / 'report.json'}{where}",
        markup=False,
        soft_wrap=True,
    )
    failed = [r.case_id for r in results if r.status == "case_error"]
    if failed:
        err.print(f"{len(failed)} case(s) could not run: {', '.join(failed)}", markup=False, soft_wrap=True)
        return 1
    return 0


async def export_feedback(settings: Settings, args: argparse.Namespace, *, out: Console, err: Console) -> int:
    """The ``opsbot feedback export`` command: rated answers as JSONL eval cases."""
    from bot.store import Store

    now = datetime.now(UTC)
    since = now - args.since if not isinstance(args.since, datetime) else args.since
    until = (
        None
        if args.until is None
        else (now - args.until if not isinstance(args.until, datetime) else args.until)
    )
    store = await Store.open(settings.store_url, settings.store, upgrade=settings.store.auto_upgrade)
    try:
        rated = await store.rated_requests(since, until)
    finally:
        await store.close()
    lines, skipped = export_lines(rated, args.rating)
    text = "".join(line + "\n" for line in lines)
    if str(args.out) == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text, encoding="utf-8")
    where = "stdout" if str(args.out) == "-" else str(args.out)
    err.print(
        f"wrote {len(lines)} rated answers to {where} ({len(rated)} rated in the window"
        + (f", {skipped} without replay inputs skipped" if skipped else "")
        + "); run them with: opsbot eval "
        + ("FILE.jsonl" if where == "stdout" else where)
        + " --out DIR",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
    return 0
