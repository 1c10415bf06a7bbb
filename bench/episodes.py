"""Several runs, every episode: the fair table of issue 40 from ``e2e_bench.py`` results.

A *run* is one bench invocation (one fresh bot process, and on the GPU a fresh engine); an
*episode* is one pass of a pattern inside it (``--patterns burst8,burst64,burst64,incident,incident``
has two burst-64 episodes and two incident episodes per run). This prints and writes:

1. every episode of every run on its own: event -> first token visible P50 / P99, submit P99,
   lost / duplicated, CPU per request, and, with ``--raw``, raw AsyncLLM's TTFT P99 on the very
   same requests (matched by sequence number) and the ratio;
2. each episode across runs: the median and the worst P99 (and ratio);
3. the headline per pattern: the **worst episode across all runs**, with the median of the runs'
   pooled P99 beside it (never the pool alone: 128 pooled requests hide a bad burst of 64);
4. CPU per request pooled over every episode of a pattern, per run, median and worst.

P99 is by nearest rank (``e2e_bench.pct``): for 100 or fewer requests it is the slowest one.

    python bench/episodes.py RUN1.json.gz RUN2.json.gz RUN3.json.gz \
        --raw RAW1.json.gz --raw RAW2.json.gz --raw RAW3.json.gz \
        --also remote=OPENAI1.json.gz,OPENAI2.json.gz,OPENAI3.json.gz \
        --out bench/results/e2e_fair-2026-12-05-h200
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from e2e_bench import pct, read_result, summarize, with_episodes
from run_meta import source_commit

BENCH = Path(__file__).resolve().parent


def episode_rows(
    design: str, index: int, result: dict[str, Any], raw: dict[int, float]
) -> list[dict[str, Any]]:
    """One row per platform, pattern, episode (``pooled`` too) and kind of one result file."""
    out = []
    for run in result["runs"]:
        reqs = with_episodes(run)
        for row in summarize(run):
            sel = [
                r
                for r in reqs
                if r["pattern"] == row["pattern"]
                and row["episode"] in ("pooled", r["episode"])
                and row["kind"] in ("all", r["kind"])
            ]
            ttft = [raw[r["seq"]] for r in sel if r["seq"] in raw]
            raw_p99 = pct(ttft, 99)
            p99 = row["first_token_ms"]["p99"]
            out.append(
                {
                    "design": design,
                    "run": index,
                    "platform": row["platform"],
                    "pattern": row["pattern"],
                    "episode": row["episode"],
                    "episodes": row["episodes"],
                    "kind": row["kind"],
                    "n": row["n"],
                    "lost": row["lost"],
                    "duplicated": row["duplicated"],
                    "first_token_p50_ms": row["first_token_ms"]["p50"],
                    "first_token_p99_ms": p99,
                    "submit_p99_ms": row["submit_ms"]["p99"],
                    "cpu_ms_per_request": row.get("opsbot_cpu_ms_per_request"),
                    "requests_in_window": row.get("requests_in_window"),
                    "followups_streaming_at_urgent": row.get("followups_streaming_at_urgent"),
                    "raw_ttft_p99_ms": raw_p99,
                    "ratio": round(p99 / raw_p99, 3) if p99 is not None and raw_p99 else None,
                }
            )
    return out


def _stats(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """(median, worst = largest) of the values that are there."""
    xs = [v for v in values if v is not None]
    return (statistics.median(xs), max(xs)) if xs else (None, None)


def across_runs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per design, platform, pattern, episode and kind: median and worst over the runs."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        key = (r["design"], r["platform"], r["pattern"], r["episode"], r["kind"])
        groups.setdefault(key, []).append(r)
    out = []
    for (design, plat, pattern, episode, kind), mine in groups.items():
        p99_med, p99_worst = _stats([r["first_token_p99_ms"] for r in mine])
        ratio_med, ratio_worst = _stats([r["ratio"] for r in mine])
        out.append({
            "design": design, "platform": plat, "pattern": pattern, "episode": episode, "kind": kind,
            "runs": len(mine), "lost": sum(r["lost"] for r in mine),
            "duplicated": sum(r["duplicated"] for r in mine),
            "p99_median_ms": p99_med, "p99_worst_ms": p99_worst,
            "ratio_median": ratio_med, "ratio_worst": ratio_worst,
        })  # fmt: skip
    return out


def headline(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per design, platform, pattern and kind: the worst single episode across every run (its run,
    episode and ratio), beside the median over runs of the pooled P99 and the pooled CPU."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["design"], r["platform"], r["pattern"], r["kind"]), []).append(r)
    out = []
    for (design, plat, pattern, kind), mine in groups.items():
        episodes = [r for r in mine if r["episode"] != "pooled" and r["first_token_p99_ms"] is not None]
        pooled = [r for r in mine if r["episode"] == "pooled" or r["episodes"] == 1]
        if not episodes:
            continue
        worst = max(episodes, key=lambda r: r["first_token_p99_ms"])
        worst_ratio = max((r["ratio"] for r in episodes if r["ratio"] is not None), default=None)
        cpu_med, cpu_worst = _stats([r["cpu_ms_per_request"] for r in pooled])
        out.append({
            "design": design, "platform": plat, "pattern": pattern, "kind": kind,
            "runs": len({r["run"] for r in mine}), "episodes": len(episodes),
            "worst_p99_ms": worst["first_token_p99_ms"], "worst_run": worst["run"],
            "worst_episode": worst["episode"], "worst_ratio": worst_ratio,
            "pooled_p99_median_ms": _stats([r["first_token_p99_ms"] for r in pooled])[0],
            "episode_p99s_ms": [r["first_token_p99_ms"] for r in episodes],
            "ratios": [r["ratio"] for r in episodes],
            "lost": sum(r["lost"] for r in pooled), "duplicated": sum(r["duplicated"] for r in pooled),
            "cpu_ms_per_request_median": cpu_med, "cpu_ms_per_request_worst": cpu_worst,
        })  # fmt: skip
    return out


def _n(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _x(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# Every episode, {len(report['inputs'])} result files (issue 40)",
        "",
        f"- command: `{report['command']}` (bench/episodes.py at {report['commit']})",
        "- P99 by nearest rank: for 100 or fewer requests, the slowest one. Ratios: event -> first "
        "token visible P99 over raw AsyncLLM's TTFT P99 on the very same requests.",
        "",
        "Inputs (date, commit, hardware, versions, command):",
        "",
    ]
    for item in report["inputs"]:
        m = item["meta"]
        lines.append(
            f"- {item['design']} run {item['run']} `{item['path']}`: {m.get('date')}, commit "
            f"{m.get('commit', 'not recorded')}, {m.get('host')}, {m.get('cpu')}, "
            f"GPU {m.get('gpu') or 'none'}, "
            + ", ".join(f"{k} {v}" for k, v in (m.get("versions") or {}).items())
            + f"; `{m.get('command')}`"
            + (f"; raw `{item['raw']}`" if item.get("raw") else "")
        )
    lines += [
        "",
        "## Headline: the worst episode across runs",
        "",
        "| design | platform | pattern | kind | runs | episodes | **worst episode P99** (run, episode) "
        "| worst ratio | median pooled P99 | every episode's P99 | lost | dup | CPU ms/req median / worst |",
        "|---|---|---|---|---:|---:|---|---:|---:|---|---:|---:|---|",
    ]
    for h in report["headline"]:
        lines.append(
            f"| {h['design']} | {h['platform']} | {h['pattern']} | {h['kind']} | {h['runs']} "
            f"| {h['episodes']} | **{_n(h['worst_p99_ms'])}** ({h['worst_run']}, {h['worst_episode']}) "
            f"| {_x(h['worst_ratio'])} "
            f"| {_n(h['pooled_p99_median_ms'])} | {', '.join(_n(v) for v in h['episode_p99s_ms'])} "
            f"| {h['lost']} | {h['duplicated']} "
            f"| {_n(h['cpu_ms_per_request_median'], 2)} / {_n(h['cpu_ms_per_request_worst'], 2)} |"
        )
    lines += [
        "",
        "## Each episode across runs",
        "",
        "| design | platform | pattern | episode | kind | runs | P99 median | P99 worst | ratio median "
        "| ratio worst | lost | dup |",
        "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in report["across_runs"]:
        lines.append(
            f"| {a['design']} | {a['platform']} | {a['pattern']} | {a['episode']} | {a['kind']} "
            f"| {a['runs']} "
            f"| {_n(a['p99_median_ms'])} | {_n(a['p99_worst_ms'])} | {_x(a['ratio_median'])} "
            f"| {_x(a['ratio_worst'])} | {a['lost']} | {a['duplicated']} |"
        )
    lines += [
        "",
        "## Every episode of every run",
        "",
        "| design | run | platform | pattern | episode | kind | n | lost | dup | first token P50 / P99 "
        "| submit P99 | raw TTFT P99 | ratio | CPU ms/req (requests in window) "
        "| follow-ups streaming at urgent |",
        "|---|---:|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---:|",
    ]
    for r in report["episodes"]:
        cpu = r["cpu_ms_per_request"]
        cpu_cell = "" if cpu is None else f"{cpu:.2f} ({r['requests_in_window']})"
        streaming = r["followups_streaming_at_urgent"]
        lines.append(
            f"| {r['design']} | {r['run']} | {r['platform']} | {r['pattern']} | {r['episode']} | {r['kind']} "
            f"| {r['n']} | {r['lost']} | {r['duplicated']} "
            f"| {_n(r['first_token_p50_ms'])} / {_n(r['first_token_p99_ms'])} | {_n(r['submit_p99_ms'], 1)} "
            f"| {_n(r['raw_ttft_p99_ms'])} | {_x(r['ratio'])} | {cpu_cell} "
            f"| {'' if streaming is None else streaming} |"
        )
    return "\n".join(lines) + "\n"


def build(
    designs: Sequence[tuple[str, Sequence[Path]]], raws: dict[Path, Path], argv: Sequence[str]
) -> dict[str, Any]:
    """The whole report from (design, result files) pairs and each bot file's raw replay."""
    rows: list[dict[str, Any]] = []
    inputs = []
    for design, paths in designs:
        for index, path in enumerate(paths, 1):
            result = read_result(path)
            raw_path = raws.get(path)
            raw = {r["seq"]: r["ttft"] for r in read_result(raw_path)["raw"]} if raw_path else {}
            rows += episode_rows(design, index, result, raw)
            inputs.append({"design": design, "run": index, "path": str(path), "meta": result["meta"],
                           "raw": str(raw_path) if raw_path else None})  # fmt: skip
    return {
        "command": "python " + shlex.join(argv),
        "commit": source_commit(BENCH),
        "inputs": inputs,
        "headline": headline(rows),
        "across_runs": across_runs(rows),
        "episodes": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="e2e_bench.py results of the bot, one per run")
    p.add_argument(
        "--raw",
        action="append",
        default=[],
        type=Path,
        help="the --raw-replay of each run, in the same order",
    )
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="NAME=RUN[,RUN...]",
        help="another design's runs (e.g. remote=openai1.json.gz,openai2.json.gz)",
    )
    p.add_argument("--name", default="opsbot", help="the design name of the positional runs")
    p.add_argument("--out", type=Path, help="write OUT.md and OUT.json too")
    args = p.parse_args(argv[1:])
    if args.raw and len(args.raw) != len(args.runs):
        p.error(f"{len(args.raw)} --raw for {len(args.runs)} runs: give one per run, in order")
    designs: list[tuple[str, Sequence[Path]]] = [(args.name, args.runs)]
    for item in args.also:
        name, _, paths = item.partition("=")
        designs.append((name, [Path(x) for x in paths.split(",") if x]))
    report = build(designs, dict(zip(args.runs, args.raw, strict=False)), argv)
    text = markdown(report)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
