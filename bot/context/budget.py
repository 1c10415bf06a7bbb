"""Fit gathered context into the prompt's token budget, most relevant first.

Sections are taken in priority order. One that fits is kept whole; one that does not is cut by
whole lines from the side its ``drop_from`` names (a log tail loses its oldest lines, an event list
its oldest events), or left out entirely when even its title does not fit or it may not be cut.
Every cut becomes a note for the answer's footer ("40 older events in payments").
"""

from __future__ import annotations

import logging
from dataclasses import replace

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


def fit_to_budget(
    bundle: ContextBundle, tokenizer: ChatTokenizer, max_tokens: int
) -> tuple[list[ContextSection], list[str]]:
    """The sections of ``bundle`` that fit in ``max_tokens`` (in priority order, cut by whole lines
    where needed) and a note for everything left out (``"40 older events in payments"``)."""
    kept: list[ContextSection] = []
    left_out: list[str] = []
    remaining = max_tokens
    ordered = sorted(enumerate(bundle.sections), key=lambda pair: (pair[1].priority, pair[0]))
    for _, section in ordered:
        cost = section_tokens(section, tokenizer)
        if cost <= remaining:
            kept.append(section)
            remaining -= cost
            continue
        cut = _cut(section, tokenizer, remaining)
        if cut is None:
            left_out.append(_whole_note(section))
            continue
        trimmed, dropped = cut
        kept.append(trimmed)
        remaining -= section_tokens(trimmed, tokenizer)
        left_out.append(f"{dropped} {section.unit}")
    if left_out:
        logger.debug("context budget %d tokens: left out %s", max_tokens, "; ".join(left_out))
    return kept, left_out


def _whole_note(section: ContextSection) -> str:
    lines = len(section.lines())
    what = section.unit if section.drop_from != "none" else "lines"
    return f"{section.title} ({lines} {what})" if lines else section.title


def _cut(section: ContextSection, tokenizer: ChatTokenizer, budget: int) -> tuple[ContextSection, int] | None:
    """``section`` with as few lines removed as makes it fit, and how many were removed; ``None``
    when it may not be cut or not even one line fits."""
    lines = section.lines()
    if section.drop_from == "none" or len(lines) < 2:
        return None

    def with_lines(count: int) -> ContextSection:
        chosen = lines[len(lines) - count :] if section.drop_from == "start" else lines[:count]
        return replace(section, body="\n".join(chosen))

    # Binary search the most lines that fit: cost grows with the number of lines kept.
    low, high = 0, len(lines) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if section_tokens(with_lines(middle), tokenizer) <= budget:
            low = middle
        else:
            high = middle - 1
    if low == 0:
        return None
    return with_lines(low), len(lines) - low
