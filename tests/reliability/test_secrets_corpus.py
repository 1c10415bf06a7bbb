"""The redaction corpus (tests/redaction/corpus/): every planted secret is removed, every benign
text comes back unchanged, reported per kind.

The corpus is realistic ops text (shell history, kubeconfigs, manifests, Helm values, logs,
connection strings, CI output) written by ``tests/redaction/make_corpus.py`` from a fixed seed; the
committed files must be exactly what the generator writes, so nobody edits one without the other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

from bot.redact import REDACTED, redact

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "redaction" / "corpus"


def load(name: str) -> list[dict]:
    with open(CORPUS / name, encoding="utf-8") as rows:
        return [json.loads(line) for line in rows if line.strip()]


SECRETS = load("secrets.jsonl")
BENIGN = load("benign.jsonl")


def per_kind_report() -> tuple[list[tuple[str, int, int, int]], list[tuple[str, int, int]], list[str]]:
    """(kind, entries, secrets, leaked) for the secret corpus, (kind, entries, false positives) for
    the benign one, and one line per failure (what leaked or what changed)."""
    secret_rows: dict[str, list[int]] = {}
    failures: list[str] = []
    for row in SECRETS:
        out = redact(row["text"], where="corpus")
        counts = secret_rows.setdefault(row["kind"], [0, 0, 0])
        counts[0] += 1
        counts[1] += len(row["secrets"])
        leaked = [s for s in row["secrets"] if s in out]
        counts[2] += len(leaked)
        if leaked:
            failures.append(f"LEAK {row['kind']}: {leaked[0][:24]!r} in {out[:160]!r}")
    benign_rows: dict[str, list[int]] = {}
    for row in BENIGN:
        out = redact(row["text"], where="corpus")
        counts = benign_rows.setdefault(row["kind"], [0, 0])
        counts[0] += 1
        if out != row["text"]:
            counts[1] += 1
            failures.append(f"FALSE POSITIVE {row['kind']}: {row['text'][:120]!r} -> {out[:120]!r}")
    return (
        [(kind, *counts) for kind, counts in sorted(secret_rows.items())],
        [(kind, *counts) for kind, counts in sorted(benign_rows.items())],
        failures,
    )


def table(secret_rows: list[tuple[str, int, int, int]], benign_rows: list[tuple[str, int, int]]) -> str:
    lines = ["| kind | entries | secrets | leaked |", "|---|---|---|---|"]
    lines += [f"| {k} | {e} | {s} | {leaked} |" for k, e, s, leaked in secret_rows]
    lines += ["", "| benign kind | entries | false positives |", "|---|---|---|"]
    lines += [f"| {k} | {e} | {fp} |" for k, e, fp in benign_rows]
    return "\n".join(lines)


def test_the_corpus_holds_at_least_300_secrets_of_25_kinds_and_150_benign_texts():
    kinds = Counter(row["kind"] for row in SECRETS)
    assert sum(len(row["secrets"]) for row in SECRETS) >= 300
    assert len(kinds) >= 25
    assert len(BENIGN) >= 150
    # every planted value really is in its text, so a "leak" check cannot pass vacuously
    assert all(s in row["text"] for row in SECRETS for s in row["secrets"])
    assert not any(REDACTED in row["text"] for row in SECRETS + BENIGN)


def test_no_secret_leaks_and_no_benign_text_changes_per_kind():
    secret_rows, benign_rows, failures = per_kind_report()
    leaks = sum(row[3] for row in secret_rows)
    false_positives = sum(row[2] for row in benign_rows)
    assert leaks == 0 and false_positives == 0, (
        f"{leaks} leaks, {false_positives} false positives\n{table(secret_rows, benign_rows)}\n"
        + "\n".join(failures[:30])
    )


def test_redacting_twice_changes_nothing_more():
    # The store redacts again what the pipeline already redacted: that must be a no-op.
    for row in SECRETS + BENIGN:
        once = redact(row["text"])
        assert redact(once) == once, row["text"][:200]


def test_the_committed_corpus_is_what_the_generator_writes(tmp_path: Path):
    script = ROOT / "tests" / "redaction" / "make_corpus.py"
    copy = tmp_path / "make_corpus.py"
    copy.write_text(script.read_text(encoding="utf-8"), encoding="utf-8")
    subprocess.run([sys.executable, str(copy)], check=True, capture_output=True, cwd=tmp_path)
    for name in ("secrets.jsonl", "benign.jsonl"):
        assert (tmp_path / "corpus" / name).read_bytes() == (CORPUS / name).read_bytes(), name


def _corpus_texts() -> list[str]:
    texts = [row["text"] for row in SECRETS + BENIGN]
    # (?i) rules match any case: the shortcut must hold for shouted and mixed-case text too
    return texts + [t.upper() for t in texts] + [t.swapcase() for t in texts]


def test_every_match_of_a_rule_with_a_shortcut_holds_one_of_its_strings() -> None:
    """A rule is skipped on ASCII text holding none of its strings (bot.redact._NEEDS): that is only
    right if each of its matches holds one, checked on every corpus text in three cases."""
    from bot.redact import _NEEDS, _RULES

    assert len(_NEEDS) >= 20, "the shortcuts were lost (a rule's pattern text changed?)"
    for kind, pattern, _ in _RULES:
        needs = _NEEDS.get(pattern)
        if needs is None:
            continue
        for text in _corpus_texts():
            for match in pattern.finditer(text):
                found = match.group(0).lower()
                assert any(n in found for n in needs), f"{kind}: {match.group(0)!r} holds none of {needs}"


def test_the_shortcuts_change_no_redaction(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The same text and the same counts per kind with and without the shortcuts."""
    from bot import redact as module

    texts = _corpus_texts()
    fast = [module.count_secrets_by_kind(t) for t in texts]
    monkeypatch.setattr(module, "_NEEDS", {})
    slow = [module.count_secrets_by_kind(t) for t in texts]
    assert fast == slow
