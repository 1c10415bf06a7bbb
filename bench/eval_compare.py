"""Put several ``opsbot eval`` reports side by side: one JSON and one Markdown file.

Each input is a ``report.json`` written by ``opsbot eval`` (one engine, one model, the same cases);
the output keeps every run's date, hardware, versions, engine and exact command, the totals of each
run next to each other and a per-case table (object / reason / numbers / hallucinated per run).

    python3 bench/eval_compare.py LABEL=DIR/report.json [LABEL=...] --out bench/results/eval-NAME-DATE \
        [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_NONE = {"hits": 0, "of": 0}


def _frac(rate: dict[str, int]) -> str:
    return f"{rate['hits']}/{rate['of']}"


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value:,.0f}"


def _mark(value: bool | None) -> str:
    return "–" if value is None else ("✓" if value else "✗")


def compare(runs: dict[str, dict[str, Any]], argv: list[str], note: str | None) -> tuple[dict[str, Any], str]:
    """The combined JSON document and its Markdown rendering."""
    first = next(iter(runs.values()))
    combined: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        # The note is printed below the header; the command names it without repeating it.
        "command": shlex.join(
            ["python3", "bench/eval_compare.py", *("NOTE" if a == note else a for a in argv)]
        ),
        "note": note,
        "runs": {
            label: {
                k: r[k] for k in ("date", "command", "hardware", "versions", "engine", "wall_s", "totals")
            }
            | {
                "cases": [
                    {
                        k: c.get(k)
                        for k in (
                            "id",
                            "status",
                            "score",
                            "not_in_context",
                            "evidence",
                            "ttft_ms",
                            "tpot_ms",
                            "e2e_ms",
                            "prompt_tokens",
                            "output_tokens",
                            "answer",
                        )
                    }
                    for c in r["cases"]
                ]
            }
            for label, r in runs.items()
        },
    }
    labels = list(runs)
    lines = [
        "# opsbot eval: "
        + " vs ".join(f"{r['engine']['model_name']} on {label}" for label, r in runs.items()),
        "",
        f"- compared: {combined['date']} with `{combined['command']}`",
        f"- hardware: {first['hardware']['cpu']}, {first['hardware']['cores']} cores, "
        f"{first['hardware']['memory_gib']} GiB, {first['hardware']['gpu'] or 'no GPU'}",
    ]
    for label, r in runs.items():
        versions = ", ".join(f"{k} {v}" for k, v in r["versions"].items())
        lines.append(f"- **{label}**: {r['date']}, `{r['command']}`; {versions}; wall {r['wall_s']} s")
    if note:
        lines += ["", note]
    lines += ["", "## Totals", "", "| measure | " + " | ".join(labels) + " |", "|---|" + "---|" * len(labels)]
    rows = [
        ("answered", lambda t: f"{t['answered']}/{t['cases']}"),
        ("evidence recall (decisive facts in the prompt)", lambda t: _frac(t.get("evidence_recall", _NONE))),
        ("gathering misses", lambda t: str(len(t.get("gathering_misses", [])))),
        ("budget misses", lambda t: str(len(t.get("budget_misses", [])))),
        ("failing object named", lambda t: _frac(t["object_named"])),
        ("reason named", lambda t: _frac(t["reason_named"])),
        ("all numbers exact (cases)", lambda t: _frac(t["numbers_exact"])),
        ("numbers exact (single numbers)", lambda t: f"{t['numbers_found']}/{t['numbers_expected']}"),
        (
            "hallucinated objects (cases)",
            lambda t: f"{t['hallucinated_objects']} ({t['cases_with_hallucination']})",
        ),
        ("passed", lambda t: _frac(t["passed"])),
        ("TTFT p50 / p90 ms", lambda t: f"{_ms(t['ttft_ms']['p50'])} / {_ms(t['ttft_ms']['p90'])}"),
        ("end-to-end p50 / p90 ms", lambda t: f"{_ms(t['e2e_ms']['p50'])} / {_ms(t['e2e_ms']['p90'])}"),
        ("output tokens", lambda t: str(t["output_tokens"])),
    ]
    for name, cell in rows:
        lines.append(f"| {name} | " + " | ".join(cell(runs[label]["totals"]) for label in labels) + " |")
    lines += [
        "",
        "## Per case (ev: decisive facts in the prompt; object / reason / numbers / hallucinated; e2e ms)",
        "",
        "| case | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    by_label = {label: {c["id"]: c for c in r["cases"]} for label, r in runs.items()}
    for case_id in [c["id"] for c in first["cases"]]:
        cells = []
        for label in labels:
            c = by_label[label].get(case_id)
            if c is None or c["score"] is None:
                cells.append(c["status"] if c else "–")
                continue
            s = c["score"]
            halluc = len(s["hallucinated"])
            facts = c.get("evidence") or []
            hits = sum(f["status"] == "in_prompt" for f in facts)
            cells.append(
                f"ev {hits}/{len(facts)}; "
                f"{_mark(s['object_named'])} {_mark(s['reason_named'])} "
                f"{s['numbers_found']}/{s['numbers_expected']} h{halluc}; {_ms(c['e2e_ms'])}"
            )
        lines.append(f"| {case_id} | " + " | ".join(cells) + " |")
    return combined, "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", help="LABEL=path/to/report.json")
    parser.add_argument("--out", required=True, type=Path, help="output path without extension")
    parser.add_argument("--note", help="a paragraph for the Markdown file")
    args = parser.parse_args(argv)
    runs = {}
    for spec in args.reports:
        label, sep, path = spec.partition("=")
        if not sep:
            parser.error(f"{spec!r}: give LABEL=path/to/report.json")
        runs[label] = json.loads(Path(path).read_text())
    combined, markdown = compare(runs, argv, args.note)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(combined, indent=2, ensure_ascii=False) + "\n")
    args.out.with_suffix(".md").write_text(markdown)
    print(f"wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
