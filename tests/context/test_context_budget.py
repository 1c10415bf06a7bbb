"""fit_to_budget: most relevant first, cut by whole lines from the right end, every cut noted."""

from __future__ import annotations

from collections.abc import Sequence

from bot.context.base import ContextBundle, ContextSection
from bot.context.budget import SECTION_OVERHEAD_TOKENS, fit_to_budget, section_tokens
from inference.engine import ChatMessage, ChatTokenizer


class WordTokenizer(ChatTokenizer):
    """One token per whitespace-separated word: easy to reason about in asserts."""

    def count(self, text: str) -> int:
        return len(text.split())

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        raise NotImplementedError

    def decode(self, token_ids: Sequence[int]) -> str:
        raise NotImplementedError


def _bundle(*sections: ContextSection) -> ContextBundle:
    return ContextBundle(sections=list(sections), notes=[], elapsed_ms=0.0)


def _log(lines: int, priority: int = 30) -> ContextSection:
    return ContextSection(
        source="Kubernetes",
        title="Log tail of payments/api/app",
        body="\n".join(f"line{i} word" for i in range(lines)),
        priority=priority,
        unit="older log lines of payments/api/app",
        drop_from="start",
    )


def test_sections_that_fit_are_kept_whole_in_priority_order():
    a = ContextSection("K", "pods", "one two", priority=10)
    b = ContextSection("P", "alerts", "three", priority=0)
    kept, left_out = fit_to_budget(_bundle(a, b), WordTokenizer(), 1000)
    assert kept == [b, a]
    assert left_out == []


def test_a_log_tail_is_cut_from_its_oldest_lines_and_the_cut_is_noted():
    tokenizer = WordTokenizer()
    log = _log(100)
    budget = SECTION_OVERHEAD_TOKENS + 5 + 2 * 40  # title (5 words) + 40 lines of 2 words
    kept, left_out = fit_to_budget(_bundle(log), tokenizer, budget)
    lines = kept[0].body.splitlines()
    assert len(lines) == 40
    assert lines[-1] == "line99 word" and lines[0] == "line60 word"
    assert left_out == ["60 older log lines of payments/api/app"]
    assert section_tokens(kept[0], tokenizer) <= budget


def test_a_list_ordered_by_relevance_loses_its_last_lines_first():
    pods = ContextSection("K", "Pods", "\n".join(f"pod-{i} bad" for i in range(10)), 10, "more pods", "end")
    kept, left_out = fit_to_budget(_bundle(pods), WordTokenizer(), SECTION_OVERHEAD_TOKENS + 1 + 6)
    assert kept[0].body.splitlines() == ["pod-0 bad", "pod-1 bad", "pod-2 bad"]
    assert left_out == ["7 more pods"]


def test_a_section_that_may_not_be_cut_is_left_out_whole_and_less_relevant_ones_still_fit():
    whole = ContextSection("K", "Overview", "a b c d e f g h", priority=5, drop_from="none")
    small = ContextSection("K", "Nodes", "ok", priority=40)
    kept, left_out = fit_to_budget(_bundle(whole, small), WordTokenizer(), SECTION_OVERHEAD_TOKENS + 5)
    assert kept == [small]
    assert left_out == ["Overview (1 lines)"]


def test_the_budget_is_measured_with_the_models_own_tokenizer(tiny_model):
    from inference.tokenization import HFChatTokenizer

    tokenizer = HFChatTokenizer(str(tiny_model))
    log = _log(400)
    budget = 600
    kept, left_out = fit_to_budget(_bundle(log), tokenizer, budget)
    assert section_tokens(kept[0], tokenizer) <= budget
    assert kept[0].body.splitlines()[-1] == "line399 word"
    assert left_out and left_out[0].endswith("older log lines of payments/api/app")


def _ranked(
    title: str, priority: int, lines: list[tuple[str, int]], drop_from: str = "end"
) -> ContextSection:
    from bot.context.base import ranked_section

    return ranked_section(
        source="K", title=title, lines=lines, priority=priority, unit=f"{title} lines", drop_from=drop_from
    )  # type: ignore[arg-type]


def test_the_decisive_lines_of_every_section_are_kept_before_anything_lower_ranked():
    pods = _ranked("Pods", 10, [("pod-0 crash", 0), *((f"pod-{i} other", 3) for i in range(1, 40))])
    log = _ranked(
        "Log",
        30,
        [*((f"info {i} x", 3) for i in range(50)), ("Caused by: db gone", 0), ("tail x", 2)],
        "start",
    )
    room = 2 * (SECTION_OVERHEAD_TOKENS + 1) + 2 + 4 + 2 + 6
    kept, left_out = fit_to_budget(_bundle(log, pods), WordTokenizer(), room)
    bodies = {s.title: s.body.splitlines() for s in kept}
    assert bodies["Pods"][0] == "pod-0 crash" and "Caused by: db gone" in bodies["Log"]
    assert "tail x" in bodies["Log"] and len(bodies["Pods"]) < 5  # rank 2 before any rank 3
    assert [s.title for s in kept] == ["Pods", "Log"]  # still in priority order
    assert any(note.endswith("Pods lines") for note in left_out) and any("Log lines" in n for n in left_out)


def test_repeats_are_folded_before_anything_is_cut():
    from bot.context.budget import fold

    log = _ranked("Log", 30, [("same", 2), ("same", 2), ("same", 0), ("other", 3)], "start")
    (folded,) = fold([log])
    assert folded.lines() == ["same [x3]", "other"] and folded.line_ranks() == [0, 3]
    twin = _ranked("Log of b", 32, [("same", 2), ("same", 2), ("same", 0), ("other", 3)], "start")
    (merged,) = fold([log, twin])
    assert merged.title == "Log; same as Log of b"
    shared = _ranked("Metrics", 22, [("error_rate 5%", 1), ("cpu 2", 2)])
    derived = _ranked("Derived", 19, [("error_rate 5%", 0)])
    out = fold([shared, derived])
    assert [s.lines() for s in out] == [["cpu 2"], ["error_rate 5%"]]  # kept where it ranks best
