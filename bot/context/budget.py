"""Fit gathered context into the prompt's token budget, the decisive lines first.

First, repeats are folded: a line repeated in a row within a section becomes one line with
``[xN]``, sections of one source with the same body become one (its title names the others), and a
line two sections of one source both hold stays only where it ranks best.
Then, when everything does not fit, lines are chosen by rank across all sections: every rank-0
line of every section (most relevant section first) before any rank-1 line, and so on
(:attr:`ContextSection.ranks`; a section without ranks gives all its lines ``rank``). Within a rank,
lines go in the order the section's ``drop_from`` says (a log keeps its newest lines, a list its
first); a section that may not be cut (``none``) is one unit. Kept lines stay in their section's
order; every section that lost lines, or was left out, becomes a note for the answer's footer
("40 older events in payments").
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from bot.context.base import ContextBundle, ContextSection
from inference.engine import ChatTokenizer

logger = logging.getLogger(__name__)

SECTION_OVERHEAD_TOKENS = 24
"""Tokens the prompt builder spends around each section (fence, label, source line)."""


def section_text(section: ContextSection) -> str:
    """The text of ``section`` as it is measured (title line, then the body)."""
    return f"{section.title}\n{section.body}"


def section_tokens(section: ContextSection, tokenizer: ChatTokenizer) -> int:
    """Tokens ``section`` takes in the prompt, fence included."""
    return tokenizer.count(section_text(section)) + SECTION_OVERHEAD_TOKENS


@dataclass(slots=True)
class _Unit:
    """Lines of one section that are kept or dropped together."""

    section: int
    lines: list[int]
    rank: int
    order: int
    cost: int


def fold(sections: list[ContextSection]) -> list[ContextSection]:
    """Repeats folded before anything is cut (see the module doc): sections of one source with the
    same body become one (the more relevant place and rank of each line); a line that two sections of
    one source both hold stays only where it ranks best."""
    out: list[ContextSection] = []
    by_body: dict[tuple[str, str], int] = {}
    for section in map(_fold_lines, sections):
        key = (section.source, section.body)
        if section.body and key in by_body:
            first = out[by_body[key]]
            ranks = tuple(min(a, b) for a, b in zip(first.line_ranks(), section.line_ranks(), strict=True))
            out[by_body[key]] = replace(
                first,
                title=f"{first.title}; same as {section.title}",
                priority=min(first.priority, section.priority),
                ranks=ranks,
            )
            continue
        by_body[key] = len(out)
        out.append(section)
    return _drop_repeated_lines(out)


def _drop_repeated_lines(sections: list[ContextSection]) -> list[ContextSection]:
    best: dict[tuple[str, str], tuple[int, int, int]] = {}
    for index, section in enumerate(sections):
        for line, rank in zip(section.lines(), section.line_ranks(), strict=True):
            where = (rank, section.priority, index)
            if line.strip() and where < best.get((section.source, line), (99, 99, 99)):
                best[(section.source, line)] = where
    out = []
    for index, section in enumerate(sections):
        pairs = list(zip(section.lines(), section.line_ranks(), strict=True))
        kept = [(ln, r) for ln, r in pairs if not ln.strip() or best[(section.source, ln)][2] == index]
        if len(kept) == len(pairs):
            out.append(section)
        elif kept:
            out.append(
                replace(section, body="\n".join(ln for ln, _ in kept), ranks=tuple(r for _, r in kept))
            )
    return out


def _fold_lines(section: ContextSection) -> ContextSection:
    lines, ranks = section.lines(), section.line_ranks()
    if len(lines) < 2 or all(a != b for a, b in zip(lines, lines[1:], strict=False)):
        return section
    kept: list[str] = []
    kept_ranks: list[int] = []
    i = 0
    while i < len(lines):
        j = i
        while j + 1 < len(lines) and lines[j + 1] == lines[i]:
            j += 1
        kept.append(lines[i] if j == i else f"{lines[i]} [x{j - i + 1}]")
        kept_ranks.append(min(ranks[i : j + 1]))
        i = j + 1
    return replace(section, body="\n".join(kept), ranks=tuple(kept_ranks))


def fit_to_budget(
    bundle: ContextBundle, tokenizer: ChatTokenizer, max_tokens: int
) -> tuple[list[ContextSection], list[str]]:
    """The sections of ``bundle`` that fit in ``max_tokens`` (in priority order, the lowest-ranked
    lines dropped where needed) and a note for everything left out (``"40 older events in payments"``)."""
    sections = fold(list(bundle.sections))
    ordered = [s for _, s in sorted(enumerate(sections), key=lambda pair: (pair[1].priority, pair[0]))]
    whole = [section_tokens(s, tokenizer) for s in ordered]
    if sum(whole) <= max_tokens:
        return ordered, []
    # What a line break costs this tokenizer (0 to a word counter, about 1 to a BPE vocabulary).
    newline = max(0, tokenizer.count("a\nb") - tokenizer.count("a") - tokenizer.count("b"))
    heads = [tokenizer.count(s.title) + newline + SECTION_OVERHEAD_TOKENS for s in ordered]
    units = [u for index, section in enumerate(ordered) for u in _units(index, section, tokenizer, newline)]
    units.sort(key=lambda u: (u.rank, u.section, u.order))
    remaining = max_tokens
    opened: set[int] = set()
    picked: list[_Unit] = []
    for unit in units:
        cost = unit.cost + (0 if unit.section in opened else heads[unit.section])
        if cost > remaining:
            continue
        remaining -= cost
        opened.add(unit.section)
        picked.append(unit)
    # Lines were priced one by one; a tokenizer may merge across them. Measure what was kept and
    # give back the last picked (the lowest ranked) until it truly fits.
    while picked:
        chosen: dict[int, set[int]] = {}
        for unit in picked:
            chosen.setdefault(unit.section, set()).update(unit.lines)
        kept, left_out = _assemble(ordered, chosen)
        if sum(section_tokens(s, tokenizer) for s in kept) <= max_tokens:
            break
        picked.pop()
    else:
        kept, left_out = [], [_whole_note(s) for s in ordered]
    if left_out:
        logger.debug("context budget %d tokens: left out %s", max_tokens, "; ".join(left_out))
    return kept, left_out


def _assemble(
    ordered: list[ContextSection], chosen: dict[int, set[int]]
) -> tuple[list[ContextSection], list[str]]:
    """The sections with the chosen lines (in their order), and a note for each cut or left out."""
    kept: list[ContextSection] = []
    left_out: list[str] = []
    for index, section in enumerate(ordered):
        lines = section.lines()
        taken = chosen.get(index, set())
        if not taken:
            left_out.append(_whole_note(section))
            continue
        if len(taken) == len(lines):
            kept.append(section)
            continue
        order = sorted(taken)
        ranks = section.line_ranks()
        kept.append(
            replace(
                section,
                body="\n".join(lines[i] for i in order),
                ranks=tuple(ranks[i] for i in order) if section.ranks is not None else None,
            )
        )
        left_out.append(f"{len(lines) - len(order)} {section.unit}")
    return kept, left_out


def _units(index: int, section: ContextSection, tokenizer: ChatTokenizer, newline: int) -> list[_Unit]:
    lines = section.lines()
    if not lines:
        return []
    ranks = section.line_ranks()
    if section.drop_from == "none" or len(lines) < 2:
        cost = tokenizer.count(section.body) + newline
        return [_Unit(index, list(range(len(lines))), min(ranks), 0, cost)]
    count = len(lines)
    return [
        _Unit(
            index,
            [i],
            ranks[i],
            # Within a rank: a chronological body keeps its newest lines, a list its first ones.
            count - i if section.drop_from == "start" else i,
            tokenizer.count(line) + newline,
        )
        for i, line in enumerate(lines)
    ]


def _whole_note(section: ContextSection) -> str:
    lines = len(section.lines())
    what = section.unit if section.drop_from != "none" else "lines"
    return f"{section.title} ({lines} {what})" if lines else section.title
