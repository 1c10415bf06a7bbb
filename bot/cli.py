"""The ``opsbot`` command: run, chat, stats, db, make-test-model, config show, analyze, eval, feedback
export, version.

Every expected failure (bad configuration, unreachable database, missing model, unknown flag)
ends with one line on stderr and a non-zero exit code, never a traceback; ``--debug`` shows it.
``--debug``, ``--version`` and ``--config FILE`` are understood anywhere on the command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from rich.console import Console

from bot import __version__, event_loop
from bot.config import CONFIG_FILE_ENV, ConfigError, Settings, load_settings, with_loop
from inference.scenarios import ALERT_SUMMARY, CHANGE_REVIEW, ROOT_CAUSE, TIMELINE

if TYPE_CHECKING:  # the demo pulls in the eval's cases and servers: only `chat --demo` loads it
    from bot.eval.demo import Demo

logger = logging.getLogger("opsbot")

EXIT_USAGE = 2
EXIT_FAILURE = 1

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
BATCH_SCENARIOS = [ALERT_SUMMARY, ROOT_CAUSE, CHANGE_REVIEW, TIMELINE]


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as a single line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_duration(text: str) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``7d``, ``2w`` as a timedelta."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30m, 1h or 7d")
    return timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])


Moment = timedelta | datetime
"""A point in time on the command line: a duration ago, or a time (UTC unless it says otherwise)."""


def parse_moment(text: str) -> Moment:
    """``1h`` (that long ago) or ``2026-11-29T09:00`` / ``2026-11-29 09:00+01:00`` (naive is UTC)."""
    with contextlib.suppress(argparse.ArgumentTypeError):
        return parse_duration(text)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a duration like 30m, 1h or 7d nor a time like 2026-11-29T09:00"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def resolve_moment(moment: Moment, now: datetime) -> datetime:
    """The time ``moment`` names, durations counted back from ``now``."""
    return now - moment if isinstance(moment, timedelta) else moment


def parse_dimensions(text: str) -> tuple[str, ...]:
    """``scenario,lane`` as a tuple of known ``--by`` dimensions (no repeats)."""
    from bot.stats import DIMENSIONS

    names = tuple(part.strip() for part in text.split(",") if part.strip())
    unknown = [n for n in names if n not in DIMENSIONS]
    if not names or unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: group by one or more of {', '.join(DIMENSIONS)}, comma-separated, each once"
        )
    return names


GlobalFlags = tuple[bool, bool, str | None]
"""``--debug``, ``--version`` and ``--config FILE`` as found anywhere on a command line."""


def split_global_flags(argv: Sequence[str]) -> tuple[list[str], GlobalFlags]:
    """``argv`` without the flags every command takes wherever they stand (``opsbot chat --debug``,
    ``opsbot --config x.toml run``), and their values; a ``--config`` without its file is left in
    for the parser to report."""
    rest: list[str] = []
    debug = version = False
    config: str | None = None
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--debug":
            debug = True
        elif arg == "--version":
            version = True
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        elif arg == "--config" and i + 1 < len(args) and not args[i + 1].startswith("-"):
            config = args[i + 1]
            i += 1
        else:
            rest.append(arg)
        i += 1
    return rest, (debug, version, config)


def build_parser() -> OneLineParser:
    """The command-line grammar."""
    parser = OneLineParser(prog="opsbot", description="ChatOps incident assistant with an in-process LLM.")
    # Taken from anywhere on the line before parsing (split_global_flags); listed here for --help.
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs (on stderr)")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument(
        "--config",
        metavar="FILE",
        help=f"the configuration file (default: ${CONFIG_FILE_ENV} or opsbot.toml)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    _add_service_commands(sub)
    _add_stats_command(sub)
    _add_admin_commands(sub)
    _add_analyze_command(sub)
    _add_eval_commands(sub)
    _add_audit_command(sub)
    sub.add_parser("version", help="print the version")
    return parser


def _add_service_commands(sub: argparse._SubParsersAction[OneLineParser]) -> None:
    """run, chat: the bot itself (chat-platform adapters or this terminal)."""
    sub.add_parser("run", help="run the configured chat adapters and the HTTP server")
    chat = sub.add_parser(
        "chat", help="talk to opsbot in this terminal (full pipeline, one thread per session)"
    )
    chat.add_argument(
        "--demo",
        nargs="?",
        const="",
        metavar="CASE",
        help="a built-in incident served by in-process Kubernetes and Prometheus APIs, no cluster "
        "needed (CASE: an `opsbot eval` case id; default: a worker that is OOMKilled)",
    )
    chat.add_argument(
        "--loop",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="investigate with tools after the context (default: on with --demo, else [investigate] enabled)",
    )


def _add_stats_command(sub: argparse._SubParsersAction[OneLineParser]) -> None:
    """stats: latency percentiles and plots from the store."""
    stats = sub.add_parser(
        "stats", help="latency percentiles, errors, prefix-cache reuse, TTFT histogram, plots"
    )
    stats.add_argument(
        "--since",
        type=parse_moment,
        default=timedelta(hours=24),
        help="start: a duration ago (30m, 1h, 7d) or a UTC time (2026-11-29T09:00); default 24h",
    )
    stats.add_argument("--until", type=parse_moment, default=None, help="end, as --since; default now")
    stats.add_argument(
        "--by",
        type=parse_dimensions,
        default=("scenario", "platform"),
        help="group by one or more of scenario, lane, platform, channel, model (comma-separated; "
        "default scenario,platform)",
    )
    shape = stats.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="print JSON instead of a table")
    shape.add_argument("--csv", action="store_true", help="print CSV (one row per group) instead of a table")
    stats.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw TTFT and TPOT P50 / P99 over time per scenario",
    )


def _add_admin_commands(sub: argparse._SubParsersAction[OneLineParser]) -> None:
    """db, make-test-model, config: the database schema, offline models, the settings."""
    db = sub.add_parser("db", help="database migrations")
    db_sub = db.add_subparsers(dest="db_command", metavar="ACTION", parser_class=OneLineParser)
    db_sub.required = True
    db_sub.add_parser("upgrade", help="migrate to the newest schema")
    down = db_sub.add_parser("downgrade", help="migrate down to a revision ('base' drops everything)")
    down.add_argument("revision")
    db_sub.add_parser("current", help="print the current schema revision")
    model = sub.add_parser("make-test-model", help="build an offline test model (random weights)")
    model.add_argument("dir", type=Path)
    model.add_argument("--size", choices=["tiny", "8b", "70b"], default="tiny")
    model.add_argument(
        "--quant",
        choices=["awq", "gptq"],
        help="8b / 70b only: a 4-bit AWQ or GPTQ config for vLLM dummy weights",
    )
    config = sub.add_parser("config", help="configuration")
    config_sub = config.add_subparsers(dest="config_command", metavar="ACTION", parser_class=OneLineParser)
    config_sub.required = True
    show = config_sub.add_parser("show", help="print the effective configuration, secrets masked")
    show.add_argument("--json", action="store_true", help="JSON instead of TOML")


def _add_analyze_command(sub: argparse._SubParsersAction[OneLineParser]) -> None:
    """analyze: a shift's alerts, events or logs summarised in a batch."""
    analyze = sub.add_parser(
        "analyze", help="batch analysis of alerts, Kubernetes events or logs: grouped summaries and a report"
    )
    analyze.add_argument(
        "input",
        type=Path,
        help="Alertmanager JSON, JSONL of alerts or Kubernetes events, or a folder of logs",
    )
    analyze.add_argument("--scenario", choices=BATCH_SCENARIOS, default=BATCH_SCENARIOS[0])
    analyze.add_argument(
        "--out",
        type=Path,
        required=True,
        help="output folder; running again with it resumes (skips done items)",
    )
    analyze.add_argument("--since", type=_when, help="ISO 8601 time or a duration back from now (8h)")
    analyze.add_argument("--until", type=_when, help="ISO 8601 time or a duration back from now")
    analyze.add_argument("--post", metavar="PLATFORM:CHANNEL", help="post the summary there, in a thread")
    analyze.add_argument("--format", choices=["auto", "json", "jsonl", "logs"], default="auto")
    analyze.add_argument("--max-tokens", type=int, help="answer tokens per group (default: the scenario's)")
    analyze.add_argument("--max-groups", type=int, help="groups summarised, largest first (default 200)")


def _add_eval_commands(sub: argparse._SubParsersAction[OneLineParser]) -> None:
    """eval, feedback: incident cases scored; rated answers exported as cases."""
    ev = sub.add_parser(
        "eval", help="run incident cases through the whole pipeline and score the answers (JSON + Markdown)"
    )
    ev.add_argument(
        "cases",
        nargs="*",
        type=Path,
        help="case files or folders (*.yaml, feedback *.jsonl); default: the built-in cases",
    )
    ev.add_argument("--out", type=Path, required=True, help="folder for report.json, report.md and eval.db")
    ev.add_argument(
        "--engine-config",
        type=Path,
        metavar="FILE.toml",
        help="[engine] (and [admission], [scenarios.*], [prompt]) tables laid over the settings",
    )
    ev.add_argument("--case", action="append", metavar="ID", help="run only this case (repeatable)")
    ev.add_argument("--max-tokens", type=int, help="answer tokens per case (default: the scenario's)")
    ev.add_argument(
        "--loop",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the investigation loop (tool calls after the context) on or off for every case "
        "(default: [investigate] enabled)",
    )
    ev.add_argument(
        "--evidence-only",
        action="store_true",
        help="gather and build every prompt, trace the decisive facts, generate no answer "
        "(only evidence recall is measured; fast on any machine)",
    )
    feedback = sub.add_parser("feedback", help="answers people rated")
    feedback_sub = feedback.add_subparsers(
        dest="feedback_command", metavar="ACTION", parser_class=OneLineParser
    )
    feedback_sub.required = True
    export = feedback_sub.add_parser(
        "export", help="rated answers as JSONL eval cases (opsbot eval runs them)"
    )
    export.add_argument("--out", default="-", help="JSONL file to write (default: stdout)")
    export.add_argument(
        "--since", type=parse_moment, default=timedelta(days=30), help="as for stats; default 30d"
    )
    export.add_argument("--until", type=parse_moment, default=None, help="end, as --since; default now")
    export.add_argument(
        "--rating", choices=["all", "up", "down"], default="all", help="liked, disliked or all rated answers"
    )


def _add_audit_command(sub: argparse._SubParsersAction[OneLineParser]) -> None:
    """audit: the approval-gated actions' trail."""
    audit = sub.add_parser("audit", help="proposed actions: who approved what, when, with what result")
    audit_sub = audit.add_subparsers(dest="audit_command", metavar="ACTION", parser_class=OneLineParser)
    audit_sub.required = True
    for name, text in (("list", "one line per proposal"), ("export", "every proposal with its trail")):
        one = audit_sub.add_parser(name, help=text)
        one.add_argument(
            "--since", type=parse_moment, default=timedelta(days=30), help="as for stats; default 30d"
        )
        one.add_argument(
            "--state", choices=["proposed", "approving", "applied", "failed", "rejected", "expired"]
        )
        one.add_argument("--limit", type=int, default=10_000, help="most proposals (newest first)")
        if name == "export":
            one.add_argument("--format", choices=["json", "csv"], default="json")
            one.add_argument("--out", default="-", help="file to write (default: stdout)")


def _when(text: str) -> datetime:
    from bot.analyze.readers import parse_when

    try:
        return parse_when(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``opsbot`` console script."""
    given = list(sys.argv[1:] if argv is None else argv)
    rest, (debug, version, config) = split_global_flags(given)
    if version:
        Console(highlight=False).print(f"opsbot {__version__}")
        return 0
    if config is not None:
        if not Path(config).is_file():
            sys.stderr.write(
                f"opsbot: --config {config}: no such file. Fix: give the path of an opsbot.toml\n"
            )
            return EXIT_USAGE
        # Through the environment, so a supervised or worker process started from here reads it too.
        os.environ[CONFIG_FILE_ENV] = config
    args = build_parser().parse_args(rest)
    args.debug = debug
    args.argv = given
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        return _dispatch(args, err)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if args.debug:
            raise
        err.print(f"opsbot: error: {_one_line(exc)}", markup=False)
        return EXIT_FAILURE


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if text else type(exc).__name__


def _dispatch(args: argparse.Namespace, err: Console) -> int:
    out = Console(highlight=False)
    if args.command == "version":
        out.print(f"opsbot {__version__}")
        return 0
    if args.command == "make-test-model":
        from inference.testmodel import build_test_model

        path = build_test_model(
            args.dir, args.size, quant=args.quant, progress=lambda line: err.print(f"[dim]{line}[/dim]")
        )
        out.print(f"test model ({args.size}{'-' + args.quant if args.quant else ''}) ready in {path}")
        return 0
    try:
        settings = load_settings()
    except ConfigError as exc:
        err.print(f"opsbot: {exc}", markup=False)
        return EXIT_USAGE
    _setup_logging(settings, debug=args.debug, command=args.command, out_dir=getattr(args, "out", None))
    try:
        event_loop.resolve(settings.event_loop)  # before any coroutine exists to leave un-awaited
    except event_loop.EventLoopUnavailable as exc:
        err.print(f"opsbot: {exc}", markup=False)
        return EXIT_USAGE
    if args.command == "config":
        return _config_show(settings, as_json=args.json, out=out)
    if args.command == "db":
        return event_loop.run(_db(settings, args, out), settings.event_loop)
    if args.command == "stats":
        return event_loop.run(_stats(settings, args, out=out, err=err), settings.event_loop)
    if args.command == "chat":
        loop = args.loop if args.loop is not None or args.demo is None else True
        return event_loop.run(
            _chat(with_loop(settings, loop), args.demo, err, debug=args.debug), settings.event_loop
        )
    if args.command == "run":
        from bot import workers

        if workers.worker_slot() is not None:
            return event_loop.run(workers.run_worker(settings, _worker_progress(err)), settings.event_loop)
        if _needs_supervisor(settings):
            from bot.supervisor import supervise

            return supervise([sys.executable, "-m", "bot.cli", *args.argv])
        return event_loop.run(_run(settings, err), settings.event_loop)
    if args.command == "eval":
        from bot.eval.command import run_eval

        return event_loop.run(run_eval(settings, args, out=out, err=err), settings.event_loop)
    if args.command == "feedback":
        from bot.eval.command import export_feedback

        return event_loop.run(export_feedback(settings, args, out=out, err=err), settings.event_loop)
    if args.command == "audit":
        from bot.actions.command import run_audit

        return event_loop.run(run_audit(settings, args, out=out), settings.event_loop)
    if args.command == "analyze":
        from bot.analyze.command import run_analyze

        return event_loop.run(run_analyze(settings, args, out=out, err=err), settings.event_loop)
    raise AssertionError(args.command)  # argparse only lets known commands through


def _needs_supervisor(settings: Settings) -> bool:
    """``opsbot run`` with a vLLM engine (any of ``[engine]`` and ``[engines.NAME]``) runs under
    :mod:`bot.supervisor`, so its engine processes never outlive it (unless it already is the
    supervised child)."""
    import os

    from bot.engine_factory import pick_backend
    from bot.supervisor import SUPERVISED_ENV

    on_vllm = any(pick_backend(settings, engine=name) == "vllm" for name in settings.engine_configs())
    return not os.environ.get(SUPERVISED_ENV) and on_vllm


def _worker_progress(err: Console) -> Callable[[str], None]:
    """Start-up lines of a worker, named as such (the host's and every worker's share stderr)."""
    from bot import workers

    slot = workers.worker_slot()
    assert slot is not None
    name = f"worker {slot[0] + 1}/{slot[1]}"
    return lambda line: err.print(f"[dim]{name}: {line}[/dim]", highlight=False)


def chat_log_path(settings: Settings) -> Path:
    """Where ``opsbot chat`` writes its log (``log_file``, else ``opsbot-chat.log`` in ``data_dir``)."""
    return settings.log_file or settings.data_dir / "opsbot-chat.log"


def _setup_logging(settings: Settings, *, debug: bool, command: str, out_dir: object = None) -> None:
    from bot.config import deprecation_notes, unknown_env_notes
    from bot.logs import setup_logging

    terminal_level = None
    if debug:
        path = None  # --debug: everything, on stderr, wherever it would have gone
    elif command == "chat":
        path = chat_log_path(settings)  # the terminal holds the conversation
    elif command in ("eval", "analyze") and isinstance(out_dir, str | Path):
        # The terminal holds the progress (a line per case, a bar); the log goes beside the
        # report, and warnings still show.
        path, terminal_level = settings.log_file or Path(out_dir) / f"{command}.log", "WARNING"
    else:
        path = settings.log_file
    setup_logging(
        "DEBUG" if debug else settings.log_level,
        as_json=settings.log_json,
        path=path,
        terminal_level=terminal_level,
    )
    for note in deprecation_notes() + unknown_env_notes():
        logger.warning("%s", note)


def _config_show(settings: Settings, *, as_json: bool, out: Console) -> int:
    from bot.config_show import show_toml

    if as_json:
        out.print_json(json.dumps(settings.masked()))
        return 0
    # Plain print: rich would wrap long lines, and a wrapped line is no longer TOML.
    sys.stdout.write(show_toml(settings))
    return 0


async def _db(settings: Settings, args: argparse.Namespace, out: Console) -> int:
    from bot.store import migrate

    url = settings.store_url
    if args.db_command == "upgrade":
        rev = await migrate.upgrade(url, settings.store)
        out.print(f"database at revision {rev}")
    elif args.db_command == "downgrade":
        rev = await migrate.downgrade(url, args.revision, settings.store)
        out.print(f"database at revision {rev or 'base'}")
    else:
        out.print(str(await migrate.current(url, settings.store) or "base (empty database)"))
    return 0


async def _stats(settings: Settings, args: argparse.Namespace, *, out: Console, err: Console) -> int:
    from bot.stats import build_report, render_csv, render_json, render_text
    from bot.store import Store

    now = datetime.now(UTC)
    since = resolve_moment(args.since, now)
    until = resolve_moment(args.until, now) if args.until is not None else now
    if since >= until:
        err.print(
            f"opsbot: error: --since ({since:%Y-%m-%d %H:%M:%S} UTC) must be before --until "
            f"({until:%Y-%m-%d %H:%M:%S} UTC)",
            markup=False,
        )
        return EXIT_USAGE
    if err.is_terminal:  # a long window over a big database takes a moment; say what is happening
        err.print(f"[dim]reading requests from {settings.masked()['store']['url']} ...[/dim]")
    store = await Store.open(settings.store_url, settings.store, upgrade=settings.store.auto_upgrade)
    try:
        records = await store.requests_between(since, until)
        steps = await store.steps_between(since, until)
    finally:
        await store.close()
    report = build_report(records, since, until, args.by, steps)
    if args.json:
        print(json.dumps(render_json(report), indent=2))
    elif args.csv:
        sys.stdout.write(render_csv(report))
    else:
        print(render_text(report))
    if args.plot is not None:
        from bot.plots import PLOT_SIZE_PX, plot_latency
        from inference.engine import Lane

        target = settings.slo.ttft_p99_target_s.get(Lane.URGENT)
        plot_latency(records, args.plot, since, until, ttft_target_s=target)
        err.print(f"wrote {args.plot} ({PLOT_SIZE_PX[0]} x {PLOT_SIZE_PX[1]} px)", markup=False)
    return 0


async def _chat(settings: Settings, demo_case: str | None, err: Console, *, debug: bool = False) -> int:
    """``opsbot chat``, or with ``--demo`` a built-in incident's chat (:mod:`bot.eval.demo`)."""
    if demo_case is None:
        return await _chat_session(settings, err, debug=debug)
    from bot.eval.cases import CaseError
    from bot.eval.demo import DEFAULT_CASE, demo

    try:
        async with demo(settings, demo_case or DEFAULT_CASE) as running:
            return await _chat_session(running.settings, err, demo=running, debug=debug)
    except CaseError as exc:
        err.print(f"opsbot: {exc}", markup=False)
        return EXIT_USAGE


async def _chat_session(
    settings: Settings, err: Console, demo: Demo | None = None, *, debug: bool = False
) -> int:
    """The REPL: start-up on one status line, the banner, then the conversation."""
    from bot.adapters.console import ConsoleAdapter
    from bot.app import OpsBot, submit_to
    from bot.banner import check_sources, model_line, sources_line
    from inference.testmodel import is_test_model

    # Start-up says what it does on one line that each step replaces (a spinner on a terminal).
    with err.status("starting opsbot ...") as status:

        def progress(line: str) -> None:
            status.update(line)
            logger.info("%s", line)  # the log keeps what the status line showed

        bot = OpsBot(settings, progress=progress)
        try:
            pipeline = await bot.start_core()
            status.update("checking the context sources ...")
            checks = await check_sources(bot.context.providers if bot.context else [])
        except BaseException:
            await bot.shutdown()
            raise
    try:
        model = bot.models.get(pipeline.engines.default, "")
        backend = pipeline.engine.stats().backend
        lines = [
            f"[bold]opsbot {__version__} chat[/bold]",
            model_line(model, backend, random_weights=is_test_model(Path(model), "tiny")),
            sources_line(checks, demo=demo is not None),
            "log: on this screen (--debug)"
            if debug
            else f"log: {chat_log_path(settings)} (--debug: on this screen)",
        ]
        if demo is not None:
            lines.append(f"demo incident: {demo.case.title} (built-in case {demo.case.id}; nothing is real)")
        lines.append("ask a question; follow-ups keep the thread; /rca <question>, /rca status, /quit")
        for line in lines:
            err.print(line, highlight=False, markup=line.startswith("[bold]"))
        adapter = ConsoleAdapter(history_file=settings.data_dir / "chat_history")
        await adapter.start(submit_to(pipeline, adapter))
        if demo is not None:
            await adapter.ask(demo.question)
        await adapter.repl()
    finally:
        await bot.shutdown()
    return 0


async def _run(settings: Settings, err: Console) -> int:
    from bot.adapters.base import ChatAdapter
    from bot.adapters.registry import build_adapters
    from bot.app import OpsBot

    def progress(line: str) -> None:
        err.print(f"[dim]{line}[/dim]", highlight=False)

    if settings.workers > 1:
        from bot.workers import run_engine_host

        return await run_engine_host(settings, progress)
    bot = OpsBot(settings, progress=progress)
    bot.install_signal_handlers()
    adapters: list[ChatAdapter] = []

    async def preflight() -> None:
        # What a user can get wrong fails now, in a second, not after the model has loaded.
        bot.reserve_http()
        assert bot.store is not None
        adapters.extend(build_adapters(settings, bot.store))
        checked: list[ChatAdapter] = []
        try:
            for adapter in adapters:
                progress(f"checking the {adapter.platform} credentials ...")
                await adapter.preflight()
                checked.append(adapter)
        except BaseException:
            for adapter in checked:  # their sessions are open; nothing else will close them
                await adapter.close()
            raise

    try:
        await bot.start_core(before_engine=preflight)
        if bot.stop_requested:  # SIGTERM while the engine loaded: no platform connections to undo
            return bot.exit_code
        if not adapters:
            err.print(
                "no chat platform enabled (slack.enabled / mattermost.enabled): serving HTTP only; "
                "try `opsbot chat` for the terminal"
            )
        await bot.start_service(adapters)
        await bot.wait()
    finally:
        await bot.shutdown()
    return bot.exit_code


if __name__ == "__main__":  # AsyncLLM spawns its engine core: the entry point needs this guard
    sys.exit(main())
