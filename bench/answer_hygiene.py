"""Answers with prompt markup or prompt echo, counted over an ``opsbot eval`` and an ``opsbot analyze``
output folder (issue 39's measure: 0 after the fix).

For every answer kept by the run (eval: ``report.json``'s ``answer``, what the thread showed;
analyze: ``results.jsonl``'s ``text``, what the report prints), three counts:

- **markup**: fence markup of ``bot.prompts`` in the text as kept (``<<<``, ``>>>``, ``DATA id=``,
  ``END DATA``, the defused ``‹‹‹`` / ``›››``);
- **echo**: :func:`bot.answer_clean.echo_verdict` against the prompt (eval: the system prompt and the
  case's user turn from the report; analyze: the system prompt, the scenario's task and question and
  the group's data rebuilt from the input) says ``echoed the prompt``;
- **empty**: nothing left once markup is removed.

    python bench/answer_hygiene.py --eval /tmp/eval-out --analyze /tmp/analyze-out \\
        --analyze-input alerts.json --label before --out bench/results/answer-hygiene-before.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.analyze.grouping import group_records  # noqa: E402
from bot.analyze.readers import read_path  # noqa: E402
from bot.analyze.work import _QUESTIONS, describe_group  # noqa: E402
from bot.answer_clean import ECHO, EMPTY, echo_verdict  # noqa: E402
from bot.prompts import DEFAULT_SYSTEM_PROMPT, SCENARIO_TASKS  # noqa: E402

MARKUP = re.compile(r"<<<|>>>|‹‹‹|›››|\bDATA id=|END DATA", re.IGNORECASE)


def classify(text: str, prompt: str) -> dict[str, bool]:
    """The three counts of one answer."""
    verdict = echo_verdict(text, prompt)
    return {"markup": bool(MARKUP.search(text)), "echo": verdict == ECHO, "empty": verdict == EMPTY}


def eval_answers(folder: Path) -> list[dict[str, Any]]:
    report = json.loads((folder / "report.json").read_text())
    out = []
    for case in report["cases"]:
        if case["status"] != "ok":  # no answer at all (engine failure): not a text to judge
            out.append({"id": case["id"], "status": case["status"], "skipped": True})
            continue
        prompt = DEFAULT_SYSTEM_PROMPT + "\n" + (case.get("prompt") or "")
        out.append({"id": case["id"], "status": "ok", **classify(case["answer"] or "", prompt)})
    return out


def analyze_answers(folder: Path, input_path: Path) -> list[dict[str, Any]]:
    groups = {g.key: g for g in group_records(read_path(input_path, "auto").records).groups}
    out = []
    for line in (folder / "results.jsonl").read_text().splitlines():
        item = json.loads(line)
        group = groups.get(item["group"])
        data = describe_group(group) if group is not None else ""
        title = group.title if group is not None else ""
        prompt = "\n".join(
            (
                DEFAULT_SYSTEM_PROMPT,
                SCENARIO_TASKS[item["scenario"]],
                title,
                _QUESTIONS[item["scenario"]],
                data,
            )
        )
        out.append({"id": item["group"][:40], "status": "ok", **classify(item["text"], prompt)})
    return out


def totals(rows: list[dict[str, Any]]) -> dict[str, int]:
    judged = [r for r in rows if not r.get("skipped")]
    return {
        "answers": len(judged),
        "not_answered": len(rows) - len(judged),
        "markup": sum(r["markup"] for r in judged),
        "echo": sum(r["echo"] for r in judged),
        "empty": sum(r["empty"] for r in judged),
        "markup_or_echo": sum(r["markup"] or r["echo"] for r in judged),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--eval", type=Path, help="an opsbot eval --out folder")
    parser.add_argument("--analyze", type=Path, help="an opsbot analyze --out folder")
    parser.add_argument("--analyze-input", type=Path, help="the input that analyze read")
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args()
    result: dict[str, Any] = {"label": args.label}
    if args.eval:
        rows = eval_answers(args.eval)
        result["eval"] = {"totals": totals(rows), "answers": rows}
    if args.analyze:
        rows = analyze_answers(args.analyze, args.analyze_input)
        result["analyze"] = {"totals": totals(rows), "answers": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for kind in ("eval", "analyze"):
        if kind in result:
            print(f"{args.label} {kind}: {json.dumps(result[kind]['totals'])}")


if __name__ == "__main__":
    main()
