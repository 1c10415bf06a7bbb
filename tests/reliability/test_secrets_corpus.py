"""The redaction corpora (tests/redaction/corpus/): every planted secret is removed, every benign
text comes back unchanged, reported per kind.

The first corpus is realistic ops text (shell history, kubeconfigs, manifests, Helm values, logs,
connection strings, CI output) written by ``tests/redaction/make_corpus.py``; the forms corpus
(``make_forms_corpus.py``) holds secrets in forms the first lacks (vendor tokens beyond the best
known, prose in many languages, XML, SQL, struct dumps, argument lists, secret managers' output)
and benign look-alikes (placeholders, ids near secret words), in a tune and a test half measured
by ``bench/redact_eval.py``. Both come from fixed seeds; the committed files must be exactly what
the generators write, so nobody edits one without the other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bot.redact import REDACTED, redact

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "tests" / "redaction" / "corpus"
sys.path.insert(0, str(ROOT / "bench"))
import redact_eval  # noqa: E402


def load(name: str) -> list[dict]:
    with open(CORPUS / name, encoding="utf-8") as rows:
        return [json.loads(line) for line in rows if line.strip()]


SECRETS = load("secrets.jsonl")
BENIGN = load("benign.jsonl")
FORMS = {
    half: (load(f"forms-{half}-secrets.jsonl"), load(f"forms-{half}-benign.jsonl"))
    for half in ("tune", "test")
}


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


def test_the_forms_corpus_holds_600_secrets_in_new_forms_and_200_look_alikes_in_two_halves():
    secrets = [row for half in FORMS.values() for row in half[0]]
    benign = [row for half in FORMS.values() for row in half[1]]
    assert sum(len(row["secrets"]) for row in secrets) >= 600 and len(benign) >= 200
    assert len({row["kind"] for row in secrets}) >= 60
    for secret_rows, benign_rows in FORMS.values():  # each half has every kind and most forms
        assert sum(len(row["secrets"]) for row in secret_rows) >= 300 and len(benign_rows) >= 100
    tune_forms = {(row["kind"], row["form"]) for row in FORMS["tune"][0] + FORMS["tune"][1]}
    test_forms = {(row["kind"], row["form"]) for row in FORMS["test"][0] + FORMS["test"][1]}
    assert not tune_forms & test_forms, "a form in both halves: the test half would not be held out"
    assert all(s in row["text"] for row in secrets for s in row["secrets"])
    assert not any(REDACTED in row["text"] for row in secrets + benign)


@pytest.mark.parametrize("half", ["forms-tune", "forms-test"])
def test_no_secret_of_the_forms_corpus_leaks_even_in_part_and_at_most_2_percent_of_benign_change(half):
    report = redact_eval.evaluate(redact, None, corpora=[half])[half]
    assert report["leaked_verbatim"] == 0 and report["leaked_in_part"] == 0, report["failures_by_kind"]
    assert report["benign_changed"] <= 0.02 * report["benign"], report["failures_by_kind"]


def test_a_leak_in_part_is_told_from_a_piece_the_rest_of_the_text_holds():
    secret = "Xk9#mPq2!vLr8sT4"
    assert redact_eval.leak_of(secret, f"pw {secret}", f"pw {secret}") == "verbatim"
    assert redact_eval.leak_of(secret, f"pw {secret}", f"pw {REDACTED}!vLr8sT4") == "part"
    assert redact_eval.leak_of(secret, f"pw {secret}", f"pw {REDACTED}") is None
    # a piece that stands elsewhere in the text (a shared prefix) is not a leak
    assert redact_eval.leak_of("prefix-abc123", "prefix-x prefix-abc123", "prefix-x [REDACTED]") is None


def test_redacting_twice_changes_nothing_more():
    # The store redacts again what the pipeline already redacted: that must be a no-op.
    for row in SECRETS + BENIGN + [row for half in FORMS.values() for row in half[0] + half[1]]:
        once = redact(row["text"])
        assert redact(once) == once, row["text"][:200]


@pytest.mark.parametrize(
    ("generator", "names"),
    [
        ("make_corpus.py", ["secrets.jsonl", "benign.jsonl"]),
        (
            "make_forms_corpus.py",
            [f"forms-{h}-{k}.jsonl" for h in ("tune", "test") for k in ("secrets", "benign")],
        ),
    ],
)
def test_the_committed_corpus_is_what_the_generator_writes(tmp_path: Path, generator: str, names: list[str]):
    script = ROOT / "tests" / "redaction" / generator
    copy = tmp_path / generator
    copy.write_text(script.read_text(encoding="utf-8"), encoding="utf-8")
    subprocess.run([sys.executable, str(copy)], check=True, capture_output=True, cwd=tmp_path)
    for name in names:
        assert (tmp_path / "corpus" / name).read_bytes() == (CORPUS / name).read_bytes(), name


def _corpus_texts() -> list[str]:
    forms = [row for half in FORMS.values() for row in half[0] + half[1]]
    texts = [row["text"] for row in SECRETS + BENIGN + forms]
    # (?i) rules match any case: the shortcut must hold for shouted and mixed-case text too
    return texts + [t.upper() for t in texts] + [t.swapcase() for t in texts]


def test_every_match_of_a_rule_with_a_shortcut_holds_one_of_its_strings() -> None:
    """A rule is skipped on ASCII text holding none of its strings (bot.redact._NEEDS): that is only
    right if each of its matches holds one, checked on every corpus text in three cases."""
    from bot.redact import _NEEDS, _RULES

    assert len(_NEEDS) >= 20, "the shortcuts were lost (a rule's pattern text changed?)"
    assert len(_NEEDS) >= 40, "the shortcuts of the rules declared with _gated were lost"
    for kind, pattern, _ in _RULES:
        needs = _NEEDS.get(pattern)
        if needs is None:
            continue
        for text in _corpus_texts():
            for match in pattern.finditer(text):
                found = match.group(0).lower()
                assert any(n in found for n in needs), f"{kind}: {match.group(0)!r} holds none of {needs}"


def test_the_shortcuts_change_no_redaction(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The same text and the same counts per kind with and without the shortcuts (the strings a
    rule's every match holds, and the secret-like word a rule needs in the text)."""
    from bot import redact as module

    texts = _corpus_texts()
    fast = [module.count_secrets_by_kind(t) for t in texts]
    assert len(module._WORD_GATED) >= 20
    monkeypatch.setattr(module, "_NEEDS", {})
    monkeypatch.setattr(module, "_WORD_GATED", set())
    slow = [module.count_secrets_by_kind(t) for t in texts]
    assert fast == slow


def test_every_secret_name_and_ascii_prose_keyword_holds_a_secret_hint() -> None:
    """Rules needing a secret-like word are skipped on ASCII text holding none of SECRET_HINTS:
    right only if every name is_secret_name accepts, and every ASCII prose keyword, holds one."""
    import re

    from bot.redact import is_secret_name
    from bot.redact_words import PROSE_WORDS, SECRET_HINTS

    names = set()
    for text in _corpus_texts():
        names.update(re.findall(r"[A-Za-z_][\w.\-/]*", text))
        names.update(
            m.group(1)
            for m in re.finditer(r"^[ \t]*([A-Z][\w-]*(?: [A-Z0-9][\w-]*){1,3})[ \t]*:", text, re.M)
        )
    secret = [name for name in names if is_secret_name(name)]
    assert len(secret) >= 100
    for name in secret:
        assert any(hint in name.lower() for hint in SECRET_HINTS), name
    for word in PROSE_WORDS:
        assert not word.isascii() or any(hint in word for hint in SECRET_HINTS), word


def test_anchored_rules_miss_no_replacement_their_plain_scan_makes() -> None:
    """A rule tried only at keywords or secret names (bot.redact_scan.Anchored) must replace wherever
    its pattern, scanned over the whole text, replaces (it may find more: a plain scan's match of
    a longer non-secret name can swallow a secret one behind it): every corpus text, three cases."""
    from bot.redact import _RULES
    from bot.redact_scan import Anchored

    anchored = [(kind, rule, replace) for kind, rule, replace in _RULES if isinstance(rule, Anchored)]
    assert len(anchored) >= 15
    for kind, rule, replace in anchored:
        for text in _corpus_texts():
            plain = [m.span() for m in rule.regex.finditer(text) if replace(m) != m.group(0)]
            if not plain:
                continue
            found = [m.span() for m in rule.finditer(text) if replace(m) != m.group(0)]
            for start, end in plain:
                assert any(s < end and start < e for s, e in found), (
                    kind,
                    rule.pattern[:60],
                    text[start:end],
                )
