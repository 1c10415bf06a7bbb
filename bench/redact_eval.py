"""Coverage, false positives and speed of a secret detector on the redaction corpora.

    python bench/redact_eval.py                         # bot.redact on every corpus
    python bench/redact_eval.py --detector detect-secrets --out bench/results
    python bench/redact_eval.py --failures tune         # what the tune half still lets through

Corpora (tests/redaction/corpus/): ``secrets`` / ``benign`` (the first corpus) and the forms corpus
in two halves, ``forms-tune-*`` (rules may be tuned on it) and ``forms-test-*`` (only measured).

Per corpus: secrets leaked *verbatim* (the whole value is still in the output), leaked *in part*
(not whole, but a piece of it of at least max(6, a quarter of its length) characters that the rest
of the text does not hold), and benign texts *changed*. Detectors:

- ``opsbot``: ``bot.redact.redact``;
- ``detect-secrets``: Yelp's detect-secrets (every plugin, default filters, its line scanner); what
  it reports on a line is replaced, the way a redactor built on it would. Needs
  ``pip install detect-secrets`` (not a project dependency: measured, not kept).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "redaction" / "corpus"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_meta import cpu_model, git_commit, package_versions, run_meta, write_results  # noqa: E402

CORPORA = {
    "first": ("secrets.jsonl", "benign.jsonl"),
    "forms-tune": ("forms-tune-secrets.jsonl", "forms-tune-benign.jsonl"),
    "forms-test": ("forms-test-secrets.jsonl", "forms-test-benign.jsonl"),
}


def load(name: str) -> list[dict[str, object]]:
    """The rows of one corpus file."""
    with open(CORPUS / name, encoding="utf-8") as rows:
        return [json.loads(line) for line in rows if line.strip()]


def leak_of(secret: str, text: str, out: str) -> str | None:
    """``"verbatim"``, ``"part"`` or ``None``: how much of ``secret`` (planted in ``text``) is in ``out``."""
    if secret in out:
        return "verbatim"
    rest = text.replace(secret, "\0")
    width = min(len(secret), max(6, len(secret) // 4))
    for start in range(len(secret) - width + 1):
        piece = secret[start : start + width]
        if piece in out and piece not in rest:
            return "part"
    return None


def opsbot() -> Callable[[str], str]:
    """``bot.redact.redact`` (the module on the path)."""
    from bot.redact import redact

    return redact


def detect_secrets() -> Callable[[str], str]:
    """A redactor built on detect-secrets: every value its plugins report on a line is replaced."""
    from detect_secrets.core.scan import scan_line
    from detect_secrets.settings import default_settings

    def redact(text: str) -> str:
        with default_settings():
            values = {s.secret_value for line in text.splitlines() for s in scan_line(line) if s.secret_value}
        for value in sorted(values, key=len, reverse=True):
            text = text.replace(value, "[REDACTED]")
        return text

    return redact


DETECTORS = {"opsbot": opsbot, "detect-secrets": detect_secrets}


def evaluate(
    redact: Callable[[str], str], failures: str | None, corpora: list[str] | None = None
) -> dict[str, dict[str, object]]:
    """Per corpus (all, or those named): secrets, leaked verbatim / in part, benign texts, changed,
    microseconds per text; with ``failures``, each leak and change in that corpus is printed."""
    report: dict[str, dict[str, object]] = {}
    for corpus, (secret_file, benign_file) in CORPORA.items():
        if corpora is not None and corpus not in corpora:
            continue
        secrets, benign = load(secret_file), load(benign_file)
        verbatim = part = changed = 0
        kinds: dict[str, int] = {}
        started = time.perf_counter()
        outs = [redact(str(row["text"])) for row in secrets]
        benign_outs = [redact(str(row["text"])) for row in benign]
        elapsed = time.perf_counter() - started
        for row, out in zip(secrets, outs, strict=True):
            for secret in row["secrets"]:  # type: ignore[attr-defined]
                leak = leak_of(secret, str(row["text"]), out)
                if leak is None:
                    continue
                verbatim += leak == "verbatim"
                part += leak == "part"
                kinds[str(row["kind"])] = kinds.get(str(row["kind"]), 0) + 1
                if failures == corpus:
                    print(f"LEAK {leak} {row['kind']}/{row.get('form')}: {secret[:30]!r} in {out[:300]!r}")
        for row, out in zip(benign, benign_outs, strict=True):
            if out != row["text"]:
                changed += 1
                kinds["benign:" + str(row["kind"])] = kinds.get("benign:" + str(row["kind"]), 0) + 1
                if failures == corpus:
                    print(
                        f"CHANGED {row['kind']}/{row.get('form')}: {str(row['text'])[:200]!r}"
                        f" -> {out[:200]!r}"
                    )
        report[corpus] = {
            "secrets": sum(len(row["secrets"]) for row in secrets),  # type: ignore[arg-type]
            "kinds": len({row["kind"] for row in secrets}),
            "leaked_verbatim": verbatim,
            "leaked_in_part": part,
            "benign": len(benign),
            "benign_changed": changed,
            "us_per_text": elapsed / (len(secrets) + len(benign)) * 1e6,
            "failures_by_kind": dict(sorted(kinds.items())),
        }
    return report


def main(argv: list[str] | None = None) -> int:
    """Evaluate one detector; print a table; with ``--out``, write ``redact_eval-DATE-LABEL.{json,md}``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--detector", choices=sorted(DETECTORS), default="opsbot")
    parser.add_argument("--label", help="name of this run in the output files (default: the detector)")
    parser.add_argument(
        "--failures", choices=sorted(CORPORA), help="print each leak and change in this corpus"
    )
    parser.add_argument("--out", type=Path, help="folder for the result files (none: print only)")
    args = parser.parse_args(argv)
    report = evaluate(DETECTORS[args.detector](), args.failures)
    meta = run_meta([sys.argv[0], *(argv if argv is not None else sys.argv[1:])])
    meta.update(package_versions("bot", "detect_secrets"))
    meta["commit"] = git_commit(ROOT)
    meta["cpu"] = cpu_model()
    label = args.label or args.detector
    lines = [
        f"# redact_eval {label}",
        "",
        *(f"- {key}: {value}" for key, value in meta.items()),
        "",
        "| corpus | secrets | kinds | leaked verbatim | leaked in part | benign | benign changed"
        " | us per text |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {name} | {r['secrets']} | {r['kinds']} | {r['leaked_verbatim']} | {r['leaked_in_part']} "
            f"| {r['benign']} | {r['benign_changed']} | {r['us_per_text']:.0f} |"
            for name, r in report.items()
        ),
        "",
        *(f"- {name} failures by kind: {r['failures_by_kind']}" for name, r in report.items()),
    ]
    print("\n".join(lines))
    if args.out:
        write_results(
            args.out / f"redact_eval-{meta['date'][:10]}-{label}", {"meta": meta, "report": report}, lines
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
