"""What of a model's answer may be shown, stored or replayed: the one owner of answer cleaning.

A small model copies the prompt it was given: the fence markers of :mod:`bot.prompts`
(``<<<DATA id=…>>>``, ``<<<END DATA id=…>>>``), the scenario's task line, the question, the data.
Four defences, each in one place:

- :data:`STOP_SEQUENCES`, added to every request's stop list (:func:`with_fence_stops`), so an
  engine ends the answer where an opening fence marker would begin: what follows is the prompt's
  data copied back (every engine honours ``stop``). A closing marker is no stop: SmolLM2 on
  llama.cpp starts most answers with ``<<<END DATA id=…>>`` and then answers (bench/results/
  eval-smollm2-2026-12-01.json); stopping there would leave nothing. The cleaning removes it.
- :func:`clean_answer`, applied to every text shown (streamed or final), stored as a thread turn,
  written by ``opsbot analyze`` or read back as history: whatever fence markup the stops missed
  (a marker the model misspelt, history stored by an older opsbot) is removed.
- :func:`echo_verdict`, by which the bot, ``opsbot analyze`` and ``opsbot eval`` tell an answer
  that is empty after cleaning, or only repeats its prompt, from one of its own; :func:`without_echo`
  keeps the eval's scorer from crediting a name that the answer only copied from the question.
- :func:`ask_again` (up to :data:`ASK_AGAIN` times) for an answer the verdict fails: the next draw may
  not write what the last one copied (its phrases become bad words); while an answer streams,
  :class:`EchoGuard` keeps a copy off the screen. What still fails counts as failed.
"""

from __future__ import annotations

import functools
import re
from dataclasses import replace

from inference.engine import SamplingSettings

STOP_SEQUENCES: tuple[str, ...] = ("<<<DATA", "<<< DATA")
"""Where an answer ends: the start of an opening fence marker (a model copying its prompt's data).
Not ``<<<`` alone, which a shell here-string in a suggested command may need, and not the closing
marker (see the module doc)."""

EMPTY = "empty"
"""Verdict: nothing left once fence markup is removed."""
ECHO = "echoed the prompt"
"""Verdict: the answer is (almost) all text copied from its prompt."""

# A fence marker, whole or cut short, as the prompt writes it or as a model misspells it: three
# angle brackets (or the defused ‹‹‹ of bot.prompts.defuse), an optional END, DATA, and what follows
# up to the closing brackets or the end of the line; with two brackets only when the tag follows
# (``cat <<DATA`` / ``<<END`` here-documents in a suggested command stay). Every form begins with
# two brackets: the lookahead lets the scan skip all other positions at once (a whole prompt is read
# per answer by the echo rules: 4.0 -> 0.65 ms for 28 KB).
_MARKER = re.compile(
    r"(?=[<‹]{2})(?:"
    r"(?:<{3,}|‹{3,})[ \t]*/?[ \t]*(?:END[ \t]*)?DATA\b[^\n<>‹›]*(?:>+|›+)?"
    r"|(?:<{2}|‹{2})[ \t]*(?:END[ \t]*)?DATA[ \t]+id=[^\n<>‹›]*(?:>+|›+)?"
    r"|(?:<{3,}|‹{3,})[ \t]*END[ \t]+id=[^\n<>‹›]*(?:>+|›+)?"
    r")",
    re.IGNORECASE,
)
# What a marker leaves behind when a model breaks it up: a line of nothing but angle brackets, a
# bare ``id=9f2c4e1a>>>`` (a here-string's ``<<<`` inside a command is left alone).
_DEBRIS = re.compile(
    r"^[ \t]*(?:<{3,}|>{3,}|‹{3,}|›{3,})[ \t]*$"
    r"|\bid=[0-9a-f]{8}(?:[ \t]+label=\"[^\"\n]*\")?[ \t]*(?:>+|›+)",
    re.IGNORECASE | re.MULTILINE,
)
_BLANK_RUNS = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_WORD = re.compile(r"[\w][\w.:/%-]*")
_RUN = 4
"""Words in a row an answer must share with its prompt for them to count as copied (a shared name
or term is shorter; a copied line, or a paraphrase that keeps the prompt's phrases, is not)."""
_ECHO_SHARE = 0.7
"""An answer whose words lie at least this share in copied runs is an echo."""
_QUESTION_RUN = 6
"""A run of at least this many words copied from the question is an echo of it."""


ASK_AGAIN = 2
"""Times an answer that is empty once cleaned, or only copies its prompt back (:func:`echo_verdict`),
is asked again (:func:`ask_again`) before it counts as failed: by the bot in a thread and by
``opsbot analyze`` (not vLLM's offline batch, which keeps its one draw). Each draw may no longer
write what any earlier one copied. With SmolLM2 on a 40-alert shift (13 groups, 3 runs each), once
left 2 groups failed, twice 1; another seed alone, 7
(``bench/results/answer-hygiene-2026-12-06b-ask-again.md``)."""


def ask_again(
    sampling: SamplingSettings, answer: str, prompt: str | PromptText, attempt: int
) -> SamplingSettings:
    """The sampling for draw ``attempt`` (1, 2, ...) of a request whose last ``answer`` failed
    :func:`echo_verdict`: another seed (when one was fixed), and what the answer copied from
    ``prompt`` added to the bad words (:func:`copied_phrases`). Another seed alone wrote a summary for
    3 of 16 echoed analyze items with SmolLM2: the prompt, not the draw, makes it copy."""
    seed = None if sampling.seed is None else sampling.seed + attempt
    copied = tuple(p for p in copied_phrases(answer, prompt) if p not in sampling.bad_words)
    return replace(sampling, seed=seed, bad_words=(*sampling.bad_words, *copied))


def with_fence_stops(sampling: SamplingSettings) -> SamplingSettings:
    """``sampling`` with :data:`STOP_SEQUENCES` in its stop list (configured stops are kept) and as
    bad words: an answer may not open with the markup (SmolLM2 opened 10 of 18 eval answers that
    way, which the stop then left empty), and later it ends there."""
    stop = (*sampling.stop, *(s for s in STOP_SEQUENCES if s not in sampling.stop))
    bad = (*sampling.bad_words, *(s for s in STOP_SEQUENCES if s not in sampling.bad_words))
    if stop == sampling.stop and bad == sampling.bad_words:
        return sampling
    return replace(sampling, stop=stop, bad_words=bad)


def clean_answer(text: str, task: str = "") -> str:
    """``text`` without fence markup: markers (whole, cut short or misspelt) and their debris are
    removed, the blank lines they leave folded; the ends are stripped. With ``task`` (the last user
    turn of its prompt), an opening copy of that turn's first words goes too (:func:`_task_echo`).
    Idempotent."""
    if "<<" not in text and ">>>" not in text and "‹‹" not in text and "id=" not in text:
        cleaned = text.strip()
    else:
        cleaned = _DEBRIS.sub("", _MARKER.sub("", text))
        cleaned = "\n".join(line.rstrip() for line in cleaned.splitlines())
        cleaned = _BLANK_RUNS.sub("\n\n", cleaned).strip()
    if task:
        copied, _ = _task_echo(cleaned, task)
        cleaned = cleaned[copied:].lstrip()
    return cleaned


_UNFINISHED_MARKER = re.compile(r"(?:<{2,}|‹{2,})[^\n<>‹›]*$")
"""A marker the stream has begun but not finished ("<<<END DAT"): no cleaning rule can know it yet."""


def clean_partial(text: str, task: str = "") -> str:
    """:func:`clean_answer` for an answer still streaming: a marker begun at its end is held back
    too (the next delta completes it and the cleaning removes it; a here-string stays once a word
    follows it), and so is an opening that so far only repeats ``task`` (it may be an echo)."""
    cleaned = _UNFINISHED_MARKER.sub("", clean_answer(text, task))
    if task and _task_echo(cleaned, task)[1]:
        return ""
    return cleaned


_TASK_RUN = 6
"""Words an answer must copy from the start of its last user turn to count as echoing it."""
_TASK_CHARS = 1000
"""Characters of the last user turn compared (an answer copying more is cut at the last sentence
end within them; the turn can hold a whole prompt's data, read on every streamed update)."""
_PUNCTUATION = re.compile(r"[\s.:,;!?\-`*_>]*")


def _task_echo(answer: str, task: str) -> tuple[int, bool]:
    """``(characters of answer's opening copy of task, whether all of answer so far is such a
    copy)``: the opening run of ``answer``'s words that equals ``task``'s first words, counted only
    at :data:`_TASK_RUN` words or more, and cut at the last sentence or line end inside it (the
    answer's own first word may happen to be the turn's next one). SmolLM2 opens answers with
    "No more tool calls. Now write the answer ...": the investigation's last turn."""
    task_words = _words(task[:_TASK_CHARS])
    words = list(_WORD.finditer(answer))
    matched = 0
    cut = (0, 0)  # (words, characters) of the copy up to its last sentence end
    for index, match in enumerate(words):
        word = match.group(0).lower().strip(".:,;")
        if matched >= len(task_words) or word != task_words[matched]:
            break
        matched += 1
        gap = answer[match.end() : words[index + 1].start() if index + 1 < len(words) else len(answer)]
        if any(mark in match.group(0)[-1:] + gap for mark in ".:!?\n"):
            cut = (matched, match.end())
    end = words[matched - 1].end() if matched else 0
    whole = answer[end:].strip() == ""
    if matched < _TASK_RUN:
        return 0, whole and matched < len(task_words)
    copied = cut[1] if cut[0] >= _TASK_RUN else end
    after = _PUNCTUATION.match(answer, copied)
    return (after.end() if after else copied), whole


def _words(text: str) -> list[str]:
    return [w.lower().strip(".:,;") for w in _WORD.findall(text)]


def _shingles(words: list[str], size: int) -> set[tuple[str, ...]]:
    return {tuple(words[i : i + size]) for i in range(max(0, len(words) - size + 1))}


def echo_verdict(answer: str, prompt: str | PromptText) -> str | None:
    """Why ``answer`` counts as failed: :data:`EMPTY` (nothing left after :func:`clean_answer`),
    :data:`ECHO` (its words are mostly copied runs of ``prompt``, the whole prompt as the model saw
    it), or ``None`` for an answer of its own."""
    words = _words(clean_answer(answer))
    if not words:
        return EMPTY
    return ECHO if _read(prompt).copies(words) else None


class PromptText:
    """A prompt as the echo rules read it: its words and its runs of :data:`_RUN` words, read once
    (at first use) however often it is asked: by :class:`EchoGuard` on every draw, the verdict and
    :func:`copied_phrases`. Reading a prompt of a few thousand words takes milliseconds of the event
    loop: one request reads its prompt once."""

    def __init__(self, prompt: str) -> None:
        self.text = prompt

    @functools.cached_property
    def words(self) -> list[str]:
        return _words(clean_answer(self.text))

    @functools.cached_property
    def runs(self) -> set[tuple[str, ...]]:
        return _shingles(self.words, _RUN)

    def copies(self, words: list[str]) -> bool:
        """Whether ``words`` (an answer's, not empty) are an echo: mostly copied runs, or, too few
        for a run, copied whole."""
        if len(words) < _RUN:
            return _contains_run(self.words, words)
        return sum(self.copied(words)) / len(words) >= _ECHO_SHARE

    def copied(self, words: list[str]) -> list[bool]:
        """For each of ``words``: whether it lies in a run of at least :data:`_RUN` of them that the
        prompt holds too. Counting words rather than runs catches a copy the model broke up with
        a word of its own ("The cluster data gathered ... was: 7 alert firings of ...") as well."""
        copied = [False] * len(words)
        for i in range(len(words) - _RUN + 1):
            if tuple(words[i : i + _RUN]) in self.runs:
                copied[i : i + _RUN] = [True] * _RUN
        return copied


def _read(prompt: str | PromptText) -> PromptText:
    return prompt if isinstance(prompt, PromptText) else PromptText(prompt)


class EchoGuard:
    """Keeps a streaming answer off the screen while all of it so far only copies its prompt (the
    answer may be asked again: :func:`ask_again`), so that a copy is never shown, even for a moment
    or in a platform's stream that cannot take text back. It lets go for good at the first words
    that are the answer's own; an answer that copies to its end stays held, and the verdict on the
    whole answer (:func:`echo_verdict`) decides what happens to it."""

    def __init__(self, prompt: str | PromptText) -> None:
        self._prompt = _read(prompt)
        self._released = not self._prompt.text.strip()

    def holds(self, text: str) -> bool:
        """Whether ``text`` (the cleaned answer so far) is still held back."""
        if self._released:
            return False
        words = _words(text)
        if words and not text[-1:].isspace():  # the last word may still grow ("op" of "opsbot")
            words.pop()
        if words and not self._prompt.copies(words):
            self._released = True
        return not self._released


_PHRASE_WORDS = 4
"""Words of each copied phrase :func:`copied_phrases` names: enough to single out one line of the
prompt's data, few enough that the ban stops the copy early."""


def copied_phrases(answer: str, prompt: str | PromptText) -> tuple[str, ...]:
    """Where ``answer`` copies ``prompt``: the opening words (:data:`_PHRASE_WORDS`) of every run of
    at least :data:`_RUN` words that the prompt holds too, and of every line inside such a run,
    as the answer wrote them. Asked again with these as bad words (:func:`ask_again`), a model can
    no longer write the lines it copied back."""
    answer = clean_answer(answer)
    tokens = list(_WORD.finditer(answer))
    words = [m.group(0).lower().strip(".:,;") for m in tokens]
    copied = _read(prompt).copied(words)
    phrases: list[str] = []
    for i, match in enumerate(tokens):
        if not copied[i]:
            continue
        opens_run = i == 0 or not copied[i - 1]
        opens_line = i > 0 and "\n" in answer[tokens[i - 1].end() : match.start()]
        if not (opens_run or opens_line):
            continue
        end = i
        while end + 1 < len(tokens) and end + 1 - i < _PHRASE_WORDS and copied[end + 1]:
            end += 1
        phrase = answer[match.start() : tokens[end].end()]
        if end + 1 - i >= 2 and phrase not in phrases:
            phrases.append(phrase)
    return tuple(phrases)


def _contains_run(haystack: list[str], run: list[str]) -> bool:
    width = len(run)
    return any(haystack[i : i + width] == run for i in range(len(haystack) - width + 1))


def without_echo(answer: str, question: str) -> str:
    """``answer`` with what it copied from ``question`` blanked out: the whole question, and every
    run of at least six words of it. A name the answer shows only there is not the answer's own."""
    q_words = _words(question)
    if not q_words:
        return answer
    tokens = list(_WORD.finditer(answer))
    words = [m.group(0).lower().strip(".:,;") for m in tokens]
    need = min(len(q_words), _QUESTION_RUN)
    q_runs = _shingles(q_words, need)
    blank = [False] * len(words)
    for i in range(len(words) - need + 1):
        if tuple(words[i : i + need]) in q_runs:
            for j in range(i, i + need):
                blank[j] = True
    if not any(blank):
        return answer
    out, last = [], 0
    for match, gone in zip(tokens, blank, strict=True):
        if gone:
            out.append(answer[last : match.start()])
            last = match.end()
    out.append(answer[last:])
    return "".join(out)
