"""Episode by episode: the P50 / P99 of event -> first token visible in each e2e_bench.py run, and
raw AsyncLLM's TTFT on the very same requests, first episode with first, second with second.

e2e_bench.py pools a pattern's episodes (two bursts of 64 are one row of 128); a pattern repeated
in ``--patterns`` is several episodes, and the first after a start is the one users meet after a
deploy. This splits each pattern's requests, in sending order, into its episodes and puts the runs
side by side (the raw replay matched to a bot run's requests by their sequence number).

    python bench/episodes.py bench/results/e2e_bench-2026-12-04-h200-run6-workers4.json.gz \
        --raw bench/results/e2e_bench-2026-12-04-h200-run6-raw-workers4.json.gz \
        --also remote=bench/results/e2e_bench-2026-12-04-h200-run6-openai-workers4.json.gz
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path
from typing import Any

from e2e_bench import pct, read_result


def episodes(run: dict[str, Any]) -> list[tuple[str, str, int, list[dict[str, Any]]]]:
    """(pattern, kind, episode number from 1, requests) for every episode of one platform run.

    A pattern run k times has k equal shares of its requests in sending order (an incident's
    seeds, pattern ``incident-seed``, belong to the incident episodes)."""
    runs = Counter(p["pattern"] for p in run.get("patterns", []))
    by_pattern: dict[str, list[dict[str, Any]]] = {}
    for request in sorted(run["requests"], key=lambda r: r["seq"]):
        by_pattern.setdefault(request["pattern"], []).append(request)
    out = []
    for pattern, requests in by_pattern.items():
        k = runs.get(pattern) or runs.get(pattern.split("-")[0]) or 1
        share = len(requests) // k
        for index in range(k):
            chunk = requests[index * share : (index + 1) * share]
            kinds = sorted({r["kind"] for r in chunk})
            for kind in ("all", *kinds) if len(kinds) > 1 else ("all",):
                mine = chunk if kind == "all" else [r for r in chunk if r["kind"] == kind]
                out.append((pattern, kind, index + 1, mine))
    return out


def _cell(values: list[float]) -> str:
    if not values:
        return "–"
    return f"{pct(values, 50):.0f} / {pct(values, 99):.0f}"


def main() -> None:
    """Print one Markdown table: each episode's P50 / P99 per run, and P99 ratios against raw."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bot", type=Path, help="e2e_bench.py result of the bot (JSON or .json.gz)")
    p.add_argument("--raw", type=Path, help="the --raw-replay result made from that bot run")
    p.add_argument(
        "--also", action="append", default=[], metavar="NAME=PATH", help="another bot run (same patterns)"
    )
    args = p.parse_args()
    bot = read_result(args.bot)["runs"][0]
    others = [
        (name, read_result(Path(path))["runs"][0]) for name, path in (a.split("=", 1) for a in args.also)
    ]
    raw = {r["seq"]: r for r in read_result(args.raw)["raw"]} if args.raw else {}
    other_eps = [{(pt, k, i): reqs for pt, k, i, reqs in episodes(run)} for _, run in others]
    names = ["opsbot", *(name for name, _ in others)]
    head = ["pattern", "kind", "episode", "n", *names] + (
        ["raw TTFT", *(f"{n} / raw P99" for n in names)] if raw else []
    )
    print("P50 / P99 ms, event -> first token visible (raw: AsyncLLM's TTFT on the same prompt ids)\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for pattern, kind, index, requests in episodes(bot):
        firsts = [[r["first_token_ms"] for r in requests if r.get("first_token_ms") is not None]]
        for eps in other_eps:
            mine = eps.get((pattern, kind, index), [])
            firsts.append([r["first_token_ms"] for r in mine if r.get("first_token_ms") is not None])
        cells = [pattern, kind, str(index), str(len(requests)), *(_cell(v) for v in firsts)]
        if raw:
            ttft = [raw[r["seq"]]["ttft"] for r in requests if r["seq"] in raw]
            raw_p99 = pct(ttft, 99) if ttft else None
            cells.append(_cell(ttft))
            for values in firsts:
                ratio = pct(values, 99) / raw_p99 if values and raw_p99 else None
                cells.append("–" if ratio is None else f"{ratio:.2f}x")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
