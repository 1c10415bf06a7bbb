"""Evidence recall: did each decisive fact of a case reach the prompt, and which source supplied it.

A case's decisive facts are its expected objects and numbers (``expect.objects`` / ``expect.numbers``,
each a list of alternatives): the answer can only name them if the prompt showed them. Each fact is
looked up in turn in

1. the prompt: ``in_prompt``, with the labels of the fenced blocks that hold it (``Kubernetes: Log
   tail of ...``; ``question`` when only the chat message itself holds it);
2. the context the gatherer returned, before the budget fitted it: ``cut`` (a budget miss);
3. the state the case's own servers served (objects, logs, series, alerts): ``not_gathered`` (a
   gathering miss: the fact was there to be found);
4. nowhere: ``not_served`` (the case asks for a fact its own state does not hold: fix the case). A
   number counts as served when its digits are (``187%`` where the state says ``187``).

A case is recalled when every fact is ``in_prompt``. Its miss is the worst of its facts
(``not_served`` > ``not_gathered`` > ``cut``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from bot.context.prometheus import format_value
from bot.eval.cases import Expectation
from bot.eval.kube_api import KubernetesSnapshotServer
from bot.eval.prom_api import PrometheusSnapshotServer
from bot.eval.scorer import contains_number, contains_word

IN_PROMPT = "in_prompt"
CUT = "cut"
NOT_GATHERED = "not_gathered"
NOT_SERVED = "not_served"
_WORST = (NOT_SERVED, NOT_GATHERED, CUT)

QUESTION = "question"
"""The source of a fact that only the chat message (the question or alert text) carried."""

_FENCE = re.compile(r'<<<DATA id=(\w+) label="([^"\n]*)">>>\n(.*?)\n<<<END DATA id=\1>>>', re.DOTALL)
_QUESTION_LABELS = ("chat message", "earlier chat message")


@dataclass(slots=True)
class FactEvidence:
    """Where one decisive fact was found."""

    kind: str
    """``objects`` or ``numbers``."""
    wanted: list[str]
    """The fact's alternatives, as the case writes them."""
    status: str
    """``in_prompt``, ``cut``, ``not_gathered`` or ``not_served`` (see the module doc)."""
    found: str | None = None
    """The alternative found (in the prompt, or where the status says)."""
    sources: list[str] = field(default_factory=list)
    """Labels of the prompt's blocks that hold it, data sources first (``question`` last)."""

    @property
    def source(self) -> str | None:
        """The block that supplied it: the first data source, else ``question``."""
        return self.sources[0] if self.sources else None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready form."""
        return {
            "kind": self.kind,
            "wanted": self.wanted,
            "status": self.status,
            "found": self.found,
            "source": self.source,
            "sources": self.sources,
        }


def blocks(prompt: str) -> list[tuple[str, str]]:
    """The fenced blocks of ``prompt`` as (label, body), in order."""
    return [(m.group(2), m.group(3)) for m in _FENCE.finditer(prompt)]


def _holds(text: str, term: str, number: bool) -> bool:
    return contains_number(text, term) if number else contains_word(text, term)


def _first(options: Sequence[str], text: str, number: bool) -> str | None:
    return next((o for o in options if _holds(text, o, number)), None)


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def _served(term: str, served: str, number: bool) -> bool:
    """Whether the served state holds ``term``: as written, or (a number in a form opsbot writes,
    ``187%`` or ``restarts 12``, whose state says ``averageUtilization: 187``) every number in it."""
    if _holds(served, term, number):
        return True
    numbers = _NUMBER.findall(term)
    return bool(numbers) and all(contains_number(served, n) for n in numbers)


def trace(
    expect: Expectation, prompt: str, gathered: str | None = None, served: str | None = None
) -> list[FactEvidence]:
    """Each decisive fact of ``expect`` traced through ``prompt`` (the whole prompt text, fences
    included), ``gathered`` (every section the gatherer returned, before the budget) and ``served``
    (the case's served state as text; ``None``: unknown, e.g. a replayed request)."""
    labelled = blocks(prompt)
    out: list[FactEvidence] = []
    for kind, entries in (("objects", expect.objects), ("numbers", expect.numbers)):
        number = kind == "numbers"
        for options in entries:
            found = _first(options, prompt, number)
            if found is not None:
                sources = [
                    label
                    for label, body in labelled
                    if label not in _QUESTION_LABELS and _first(options, body, number) is not None
                ]
                asked = [body for label, body in labelled if label in _QUESTION_LABELS]
                if any(_first(options, body, number) for body in asked):
                    sources.append(QUESTION)
                # Outside every block: the task text or the scope line (rare, and still in the prompt).
                out.append(FactEvidence(kind, list(options), IN_PROMPT, found, sources or ["prompt"]))
                continue
            if gathered is not None and (hit := _first(options, gathered, number)) is not None:
                out.append(FactEvidence(kind, list(options), CUT, hit))
                continue
            hit = (
                next((o for o in options if _served(o, served, number)), None) if served is not None else None
            )
            if hit is not None or served is None:
                out.append(FactEvidence(kind, list(options), NOT_GATHERED, hit))
            else:
                out.append(FactEvidence(kind, list(options), NOT_SERVED))
    return out


def recalled(facts: Sequence[FactEvidence]) -> bool | None:
    """Every fact reached the prompt (``None``: the case names no decisive fact)."""
    return all(f.status == IN_PROMPT for f in facts) if facts else None


def miss(facts: Sequence[FactEvidence]) -> str | None:
    """The worst miss among ``facts`` (``None``: all reached the prompt)."""
    statuses = {f.status for f in facts}
    return next((s for s in _WORST if s in statuses), None)


def served_text(kube: KubernetesSnapshotServer | None, prom: PrometheusSnapshotServer | None) -> str:
    """What a case's servers serve, as text: the objects and logs, and the series with each value
    also in the forms opsbot writes them (``512.0 MiB``, ``230 ms``, ``4.2%``), since a summary's
    number is only in the state in its raw form."""
    parts = []
    if kube is not None:
        parts.append(kube.state_text())
    if prom is not None:
        parts.append(prom.state_text())
        for series in prom.series:
            parts.append(" ".join(format_value(v, u) for v in series.values for u in _UNITS))
    return "\n".join(parts)


_UNITS = ("bytes", "seconds", "ratio", "cores", "")
