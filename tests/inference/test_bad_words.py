"""Bad words as vLLM means them (``inference.bad_words``), for the engines that decode themselves:
a word is never completed, its beginning may be written, and it is matched as written and with one
leading space. The engines' own tests run the rule on a real model (test_llamacpp_engine.py)."""

from __future__ import annotations

from inference.bad_words import BadWordSequences

VOCAB = {"<<<": 1, "DATA": 2, " DATA": 3, "pod": 4, " pod": 5, "=": 6, "api": 7, "x": 9, " ": 10, " <<<": 11}


def encode(text: str) -> list[int]:
    """A greedy longest-match tokenizer over ``VOCAB`` (what a BPE tokenizer does for these words)."""
    ids, at = [], 0
    while at < len(text):
        piece = max((p for p in VOCAB if text.startswith(p, at)), key=len)
        ids.append(VOCAB[piece])
        at += len(piece)
    return ids


def test_a_word_is_never_completed_but_may_be_begun() -> None:
    bad = BadWordSequences(["<<<DATA", "pod=api"], encode)
    assert bad.banned([]) == []  # nothing begun: every first token is allowed
    assert bad.banned([9, 1]) == [2]  # after "<<<", "DATA" may not follow
    assert bad.banned([9, 11]) == [2]  # nor after " <<<": the word inside a sentence
    assert bad.banned([4, 6]) == [7]  # "pod=" may not go on with "api"
    assert bad.banned([5, 6]) == [7]  # nor " pod=" (" pod" is one token)
    assert bad.banned([4, 9]) == []  # the beginning was left: nothing to forbid


def test_a_one_token_word_is_never_written_and_no_words_forbid_nothing() -> None:
    bad = BadWordSequences(["x", "  "], encode)
    assert bad.banned([]) == [9] and bad.banned([4, 6, 7]) == [9]
    assert not BadWordSequences([], encode) and BadWordSequences([], encode).banned([1, 2]) == []
