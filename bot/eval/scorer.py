"""Scoring one answer against its case: object named, reason named, numbers exact, hallucinated objects.

- **object named** / **reason named**: every ``expect.objects`` / ``expect.reasons`` entry has one of
  its alternatives in the answer (case-insensitive, as a whole word: ``api`` is not found inside
  ``rapid`` nor inside ``api-7f9c8d6b5-x2x9q``).
- **numbers exact**: every ``expect.numbers`` entry appears as written (``512Mi``, ``137``,
  ``97.3%``), not as part of a longer number (``137`` is not found in ``1370`` or ``13.7``).
- **hallucinated**: names in the answer shaped like Kubernetes objects (generated pod names such as
  ``api-7f9c8d6b5-x2x9q``, ordinal names such as ``cache-0`` / ``worker-3``, and names after a kind
  word, ``pod foo-bar`` or ``deployment/foo-bar``) that the prompt never showed. A heuristic: it
  misses invented one-word names (``deployment api``) and may count a hyphenated word that happens
  to follow a kind word; the report lists every name it counted so a reader can judge.

A check with no expectation (a replayed 👎 answer without one) is ``None``: not passed, not failed.

An answer that is empty once fence markup is removed, or only repeats its prompt
(:func:`bot.answer_clean.echo_verdict`), is failed whatever it contains (``failure`` says why); in
any answer, the words it copied from the question are not its own: a name found only there is not
credited (:func:`bot.answer_clean.without_echo`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.answer_clean import echo_verdict, without_echo
from bot.eval.cases import Expectation

_POD_LIKE = re.compile(
    r"(?<![A-Za-z0-9_.-])[a-z][a-z0-9]*(?:-[a-z0-9]+)*-[a-z0-9]{5,10}-[a-z0-9]{5}(?![A-Za-z0-9_-])"
)
_ORDINAL = re.compile(
    r"(?<![A-Za-z0-9_./-])[a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*-\d{1,3}(?![A-Za-z0-9_.-]*[A-Za-z0-9_])"
)
_KIND_NAME = re.compile(
    r"\b(?:pods?|deployments?|statefulsets?|daemonsets?|replicasets?|nodes?|services?|jobs?|cronjobs?)"
    r"(?:/|\s+)[`'\"*]*([a-z][a-z0-9.-]*[a-z0-9])",
    re.IGNORECASE,
)
_NOT_OBJECTS = re.compile(
    r"^(?:utf|sha|x86|arm|amd|iso|rfc|http|https|h|ipv|base|int|fp|bf|q|top|step|phase|part|option|tier|"
    r"level|covid|p|k8s|v|version|cgroup|gen)-\d+$"
)


@dataclass(slots=True)
class Check:
    """One expectation entry and the alternative the answer contained (``None``: none of them)."""

    wanted: list[str]
    found: str | None

    @property
    def ok(self) -> bool:
        """The answer contained one of the alternatives."""
        return self.found is not None


@dataclass(slots=True)
class Score:
    """How one answer did (see the module doc)."""

    objects: list[Check] = field(default_factory=list)
    reasons: list[Check] = field(default_factory=list)
    numbers: list[Check] = field(default_factory=list)
    hallucinated: list[str] = field(default_factory=list)
    """Object-like names in the answer that the prompt did not contain, each once."""
    failure: str | None = None
    """Why the answer is no answer (``empty``, ``echoed the prompt``); ``None`` for a real one."""

    @staticmethod
    def _all(checks: Sequence[Check]) -> bool | None:
        return all(c.ok for c in checks) if checks else None

    @property
    def object_named(self) -> bool | None:
        """Every expected object named (``None``: nothing expected)."""
        return self._all(self.objects)

    @property
    def reason_named(self) -> bool | None:
        """Every expected reason named."""
        return self._all(self.reasons)

    @property
    def numbers_exact(self) -> bool | None:
        """Every expected number quoted exactly."""
        return self._all(self.numbers)

    @property
    def passed(self) -> bool | None:
        """Object, reason and numbers all right and nothing hallucinated (``None``: no expectation)."""
        checks = [v for v in (self.object_named, self.reason_named, self.numbers_exact) if v is not None]
        if not checks:
            return None if self.failure is None else False
        return all(checks) and not self.hallucinated and self.failure is None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "object_named": self.object_named,
            "reason_named": self.reason_named,
            "numbers_exact": self.numbers_exact,
            "numbers_found": sum(c.ok for c in self.numbers),
            "numbers_expected": len(self.numbers),
            "hallucinated": self.hallucinated,
            "passed": self.passed,
            "failure": self.failure,
            "checks": {
                kind: [{"wanted": c.wanted, "found": c.found} for c in getattr(self, kind)]
                for kind in ("objects", "reasons", "numbers")
            },
        }


def _word(term: str) -> re.Pattern[str]:
    """``term`` as a whole word: no letter, digit, ``_`` or ``-`` glued to either end."""
    before = r"(?<![A-Za-z0-9_-])" if term[:1].isalnum() else ""
    after = r"(?![A-Za-z0-9_-])" if term[-1:].isalnum() else ""
    return re.compile(before + re.escape(term) + after, re.IGNORECASE)


def _number(term: str) -> re.Pattern[str]:
    """``term`` as a whole number: not inside a longer number (``137`` in ``1370``, ``13.7``)."""
    before = r"(?<![0-9.,])" if term[:1].isdigit() else ""
    after = r"(?![0-9]|[.,][0-9])" if term[-1:].isdigit() else r"(?![A-Za-z])"
    return re.compile(before + re.escape(term) + after, re.IGNORECASE)


def contains_word(text: str, term: str) -> bool:
    """Whether ``text`` holds ``term`` as a whole word (case-insensitive)."""
    return _word(term).search(text) is not None


def contains_number(text: str, term: str) -> bool:
    """Whether ``text`` holds ``term`` as a whole number, exactly as written."""
    return _number(term).search(text) is not None


def _first(options: Sequence[str], text: str, number: bool = False) -> str | None:
    test = contains_number if number else contains_word
    return next((o for o in options if test(text, o)), None)


def object_names(text: str) -> list[str]:
    """Names in ``text`` shaped like Kubernetes objects (see the module doc), each once, in order."""
    found: dict[str, None] = {}
    for match in _POD_LIKE.finditer(text):
        found[match.group(0)] = None
    for match in _ORDINAL.finditer(text):
        found[match.group(0)] = None
    for match in _KIND_NAME.finditer(text):
        name = match.group(1).rstrip(".")
        if "-" in name or any(ch.isdigit() for ch in name):
            found[name.lower()] = None
    return [name for name in found if not _NOT_OBJECTS.match(name.lower())]


def hallucinated_objects(answer: str, context: str) -> list[str]:
    """Object-like names of ``answer`` that ``context`` (the whole prompt) does not contain."""
    tail = answer.rstrip().rstrip(".,;:)`'\"*").lower()
    out = []
    for name in object_names(answer):
        if contains_word(context, name):
            continue
        # A name cut short by the answer's token limit (the answer ends in it) is not an invention.
        if tail.endswith(name) and re.search(rf"(?<![\w-]){re.escape(name)}", context, re.IGNORECASE):
            continue
        out.append(name)
    return out


def score(
    answer: str, expect: Expectation, context: str, question: str = "", failure: str | None = None
) -> Score:
    """Score ``answer`` against ``expect``; ``context`` is what the prompt showed the model (the whole
    prompt), ``question`` what was asked (see the module doc for both). ``failure``: the bot's own
    verdict on the model's text (it then replied with an error, not that text); otherwise the answer
    is judged here."""
    failure = failure or echo_verdict(answer, context)
    own = "" if failure is not None else without_echo(answer, question)
    return Score(
        objects=[Check(options, _first(options, own)) for options in expect.objects],
        reasons=[Check(options, _first(options, own)) for options in expect.reasons],
        numbers=[Check(options, _first(options, own, number=True)) for options in expect.numbers],
        hallucinated=hallucinated_objects(answer, context),
        failure=failure,
    )


def missing_from_context(expect: Expectation, context: str) -> list[str]:
    """Expected objects and numbers the prompt did not show (a case that asks the impossible)."""
    missing = [
        " / ".join(options)
        for options in expect.objects
        if not any(contains_word(context, o) for o in options)
    ]
    missing += [
        " / ".join(options)
        for options in expect.numbers
        if not any(contains_number(context, o) for o in options)
    ]
    return missing


def _entity(text: str) -> tuple[str, str, str]:
    """``[Kind] [namespace/]name`` as (kind, namespace, name), lowercased (missing parts empty)."""
    kind, _, rest = text.strip().rpartition(" ")
    namespace, _, name = rest.rpartition("/")
    return kind.lower(), namespace.lower(), name.lower()


def _names(expected: Sequence[str], named: dict[str, object]) -> bool:
    """Whether the named entity is one of ``expected``'s alternatives (a part the expectation leaves
    out matches anything)."""
    got = (
        str(named.get("kind") or "").lower(),
        str(named.get("namespace") or "").lower(),
        str(named.get("name") or "").lower(),
    )
    for option in expected:
        kind, namespace, name = _entity(option)
        if name == got[2] and (not namespace or namespace == got[1]) and (not kind or kind == got[0]):
            return True
    return False


def root_cause_score(named: Sequence[dict[str, object]], expected: Sequence[Sequence[str]]) -> float | None:
    """The ITBench-AA style entity score: when every expected entity is among ``named``, the
    precision of ``named`` (the share of named entities that are expected); else 0. ``None``: the
    case expects no entity."""
    if not expected:
        return None
    entities = [e for e in named if isinstance(e, dict)]
    if not entities or not all(any(_names(options, e) for e in entities) for options in expected):
        return 0.0
    hits = sum(1 for e in entities if any(_names(options, e) for options in expected))
    return hits / len(entities)
