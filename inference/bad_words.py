"""Words an answer may not write, as vLLM's ``bad_words`` sampling parameter means them, for the
engines that decode token by token themselves (llama.cpp, the CPU engine).

vLLM's rule (``vllm.v1.sample.logits_processor``, ``SamplingParams.bad_words``): each word is
tokenized as written and with one leading space (a word inside a sentence is usually its
space-prefixed form); a one-token word is never generated; a longer one never gets its last token
once the answer's latest tokens are all of its others. So the word can never be completed, while
its beginning may still be written (then something else follows). Only the answer's own tokens are
matched, not the prompt's. The same rule here keeps every engine's answer to one setting alike.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


class BadWordSequences:
    """The token sequences of a set of bad words, and which tokens they forbid after an output."""

    def __init__(self, words: Iterable[str], encode: Callable[[str], Sequence[int]]) -> None:
        """``encode``: text to token ids with the model's tokenizer, no special tokens added."""
        sequences: set[tuple[int, ...]] = set()
        for word in words:
            if not word.strip():
                continue
            for variant in (word, " " + word.lstrip()):
                ids = tuple(int(t) for t in encode(variant))
                if ids:
                    sequences.add(ids)
        self._always = sorted({s[0] for s in sequences if len(s) == 1})
        self._after: dict[tuple[int, ...], set[int]] = {}
        for ids in sequences:
            if len(ids) > 1:
                self._after.setdefault(ids[:-1], set()).add(ids[-1])
        self._lengths = sorted({len(prefix) for prefix in self._after})

    def __bool__(self) -> bool:
        return bool(self._always or self._after)

    def banned(self, output: Sequence[int]) -> list[int]:
        """Token ids that may not come next after ``output`` (the answer's tokens so far)."""
        found = set(self._always)
        for length in self._lengths:
            if length > len(output):
                break
            found |= self._after.get(tuple(int(t) for t in output[-length:]), set())
        return sorted(found)
