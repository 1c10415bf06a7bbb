"""The text splitter under hypothesis: every piece within the limit, the pieces rejoin to the
original, code fences balanced in each piece.

"Rejoin" is checked on the pieces themselves: each must be its added fence lines around a slice
of the original, the slices in order, and what lies between them whitespace only (the cut points).
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.adapters.streaming import Piece, split_pieces, split_text

FENCE = re.compile(r"^\s*```")
SPLIT = settings(max_examples=300, deadline=None)


def fence_lines(text: str) -> int:
    return sum(1 for line in text.split("\n") if FENCE.match(line))


def check_rejoin(text: str, pieces: list[Piece]) -> None:
    at = 0
    for piece in pieces:
        assert piece.text == piece.opener + text[piece.start : piece.end] + piece.closer
        assert piece.opener == "" or FENCE.match(piece.opener) and piece.opener.endswith("\n")
        assert piece.closer in ("", "\n```")
        assert piece.start >= at
        assert text[at : piece.start].strip() == "", (
            f"non-whitespace lost between pieces: {text[at : piece.start]!r}"
        )
        at = piece.end
    assert text[at:].strip() == "", f"non-whitespace lost at the end: {text[at:]!r}"
    # and so: the slices joined with the cut whitespace are the original text, exactly
    rebuilt, at = "", 0
    for piece in pieces:
        rebuilt += text[at : piece.start] + text[piece.start : piece.end]
        at = piece.end
    assert rebuilt + text[at:] == text


# Markdown an answer is made of: paragraphs, lists, long lines, code blocks (sometimes unclosed,
# sometimes indented), blank-line runs, unicode.
words = st.text(st.characters(codec="utf-8", exclude_characters="\n`"), min_size=1, max_size=40)
lines = st.one_of(
    st.lists(words, min_size=1, max_size=12).map(" ".join),
    words.map(lambda w: "- " + w),
    st.integers(50, 900).map(lambda n: "x" * n),  # a line longer than small limits
    st.just(""),
)
code_blocks = st.tuples(
    st.sampled_from(["```", "```bash", "```yaml", "  ```", "```python"]),
    st.lists(lines, max_size=40),
    st.sampled_from(["```", "  ```", None]),
).map(lambda t: "\n".join([t[0], *t[1], *([t[2]] if t[2] else [])]))
markdown = st.lists(
    st.one_of(lines, code_blocks, st.sampled_from(["", "\n\n\n"])), min_size=1, max_size=30
).map("\n".join)
limits = st.integers(min_value=40, max_value=1200)


@SPLIT
@given(text=markdown, limit=limits)
def test_markdown_pieces_fit_rejoin_and_keep_fences_balanced(text: str, limit: int) -> None:
    pieces = split_pieces(text, limit)
    assert pieces and all(len(p.text) <= limit for p in pieces)
    check_rejoin(text, pieces)
    assert split_text(text, limit) == [p.text for p in pieces]
    if len(pieces) > 1:
        assert all(p.text.strip() for p in pieces), "an empty message"
    open_at_end = fence_lines(text) % 2 == 1  # the text itself leaves its last code block open
    for index, piece in enumerate(pieces):
        if open_at_end and index == len(pieces) - 1:
            assert fence_lines(piece.text) % 2 == 1
        else:
            assert fence_lines(piece.text) % 2 == 0, f"unbalanced fences in piece {index}: {piece.text!r}"


@SPLIT
@given(text=st.text(max_size=3000), limit=st.integers(min_value=16, max_value=500))
def test_any_text_is_split_within_the_limit_and_rejoins(text: str, limit: int) -> None:
    pieces = split_pieces(text, limit)
    assert all(len(p.text) <= limit for p in pieces)
    check_rejoin(text, pieces)


def test_a_cut_code_block_repeats_its_fence_line_and_closes_each_piece() -> None:
    body = "\n".join(f"kubectl -n ns{i} get pods" for i in range(60))
    text = f"Intro.\n\n  ```bash\n{body}\n  ```\n\nOutro."
    pieces = split_pieces(text, 200)
    code = [p for p in pieces if "kubectl" in p.text]
    assert len(code) > 2
    assert code[0].opener == "" and code[0].closer == "\n```"
    assert all(p.opener == "  ```bash\n" for p in code[1:])
    assert code[-1].closer == "" and code[-1].text.endswith("\n  ```")
    check_rejoin(text, pieces)
