"""Where redaction rules are tried: a pattern tried only where one of its keywords stands, or where
a secret name starts, instead of at every position of the text (:class:`Anchored`), and the
positions it needs, found once per text and shared by every rule of a pass.

``bot.redact`` builds its rules on these; nothing here decides what is a secret (that is
:mod:`bot.redact_words`) or replaces anything.
"""

from __future__ import annotations

import bisect
import functools
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from bot.redact_words import SECRET_HINTS, is_secret_name


class Matcher(Protocol):
    """What a rule's pattern must do: a compiled regular expression, or an :class:`Anchored` one."""

    @property
    def pattern(self) -> str: ...

    def finditer(self, string: str) -> Iterator[re.Match[str]]: ...

    def sub(self, repl: Callable[[re.Match[str]], str], string: str) -> str: ...


class Anchored:
    """A pattern tried only where one of its keywords stands, not at every position of the text.

    An alternation of many words (the prose keywords of twenty languages, every secret-like stem
    a name can hold) costs the regular-expression engine a try of each word at each position;
    finding each word with ``str.find`` and matching only there costs a small part of that. A
    match starts at a keyword (``keywords``), or with ``names`` at one of the starts of a secret
    name that :func:`secret_name_starts` lists (the variants ``names`` names; with ``follow``,
    only names whose next character, past quotes and spaces, is one of it): a rule whose
    replacement only hides the value of a secret name needs to try nowhere else. With ``tail``,
    the keyword itself is checked here and only the rest is matched (the first pattern for
    keywords in Latin letters, which must stand as whole words, the second for other scripts).
    tests/reliability/test_secrets_corpus.py checks that the anchored scan misses no replacement
    of the plain one on any corpus text.
    """

    def __init__(
        self,
        regex: re.Pattern[str],
        keywords: Iterable[str],
        *,
        names: str = "",
        follow: str = "",
        tail: tuple[re.Pattern[str], re.Pattern[str]] | None = None,
    ) -> None:
        self.regex = regex
        self.keywords = tuple(sorted({k.lower() for k in keywords}, key=lambda k: (-len(k), k)))
        self.names = names
        self.follow = follow
        self.tail = tail

    @property
    def pattern(self) -> str:
        """The regular expression's text (the shortcut table reads it)."""
        return self.regex.pattern

    def _starts(self, text: str, lowered: str) -> list[tuple[int, str]]:
        if self.names:
            return _name_starts_for(text, lowered, self.names, self.follow)
        longest: dict[int, str] = {}
        for at, keyword in keyword_positions(lowered, self.keywords):
            if len(keyword) > len(longest.get(at, "")):
                longest[at] = keyword
        # at one position only the longest keyword (a shorter one there is a part of its word)
        return sorted(longest.items())

    def finditer(self, string: str) -> Iterator[re.Match[str]]:
        """The matches a plain scan finds that start at a keyword (or its name's start)."""
        lowered = lowercased(string)
        if len(lowered) != len(string):  # lowercasing moved offsets (rare letters): scan all
            yield from self.regex.finditer(string)
            return
        end = 0
        for start, keyword in self._starts(string, lowered):
            if start < end:
                continue
            if self.tail is None:
                match = self.regex.match(string, start)
            elif (
                keyword.isascii() and start and (string[start - 1].isalnum() or string[start - 1] in "_-:/.$")
            ):
                continue  # a Latin keyword inside a longer word or path is no keyword
            else:
                match = self.tail[0 if keyword.isascii() else 1].match(string, start + len(keyword))
            if match is not None and match.end() > start:
                end = match.end()
                yield match

    def sub(self, repl: Callable[[re.Match[str]], str], string: str) -> str:
        """``string`` with every match replaced by ``repl(match)``."""
        out, last = [], 0
        for match in self.finditer(string):
            out.append(string[last : match.start()])
            out.append(repl(match))
            last = match.end()
        if not out:
            return string
        out.append(string[last:])
        return "".join(out)


_NAME_RUN = re.compile(r"[A-Za-z0-9_.\-/]+")
"""What a name is made of (with its path-like prefixes: "payments-db/password", "db.password")."""


def secret_name_starts(text: str, lowered: str) -> list[tuple[int, str, str]]:
    """Where the names that :func:`_named_value` may hide the value of (a secret name, ``*auth``,
    ``pass``) start, found from the secret-like stems (:data:`bot.redact_words.SECRET_HINTS`) and
    remembered for the last text: (position, variant), the variant ``n`` for the name itself,
    ``q`` for each of the quotes, backslashes or brackets right before it, ``w`` for the spaces
    and list dash before it, ``l`` for the start of its line; and the characters after the name
    past quotes and spaces, then past line ends too ("=", ":", "\\n", ...). Sorted by position."""
    with _cache_lock:
        if _last_lowered[1] is lowered and _NAMES_KEY in _last_names:
            return _last_names[_NAMES_KEY]
    hints = sorted(at for at, _ in keyword_positions(lowered, SECRET_HINTS))
    spans: set[tuple[int, int]] = set()
    if hints:
        names = [m.span() for m in _NAME_RUN.finditer(text)]
        firsts = [start for start, _ in names]
        for at in hints:  # the name each stem stands in
            index = bisect.bisect_right(firsts, at) - 1
            if index >= 0 and names[index][1] > at:
                spans.add(names[index])
    starts: set[tuple[int, str, str]] = set()
    size = len(text)
    for span_start, span_end in spans:
        pieces = _secret_pieces(text[span_start:span_end])
        if not pieces:
            continue
        after = span_end
        while after < size and text[after] in "\"'\\ \t":
            after += 1
        follow = text[after] if after < size else ""
        while after < size and text[after] in "\"'\\ \t\r\n":  # and past line ends (\s* in a pattern)
            after += 1
        follow += text[after] if after < size else ""
        line = text.rfind("\n", 0, span_start) + 1
        for offset in pieces:
            start = span_start + offset
            starts.add((start, "n", follow))
            before = start
            while before and text[before - 1] in "\"'\\<[":
                before -= 1
                starts.add((before, "q", follow))  # each: a pattern may start at a quote or a bracket
            before = start
            while before and text[before - 1] in " \t-":
                before -= 1
            starts.add((before, "w", follow))
            starts.add((line, "l", follow))
    found = sorted(starts)
    with _cache_lock:
        if _last_lowered[1] is lowered:
            _last_names[_NAMES_KEY] = found
    return found


def _name_starts_for(text: str, lowered: str, variants: str, follow: str) -> list[tuple[int, str]]:
    """The starts of :func:`secret_name_starts` of the given variants and next characters, as
    an anchored rule tries them (remembered for the last text: rules share these)."""
    key = ("\0names", variants, follow)
    with _cache_lock:
        if _last_lowered[1] is lowered and key in _last_positions:
            return _last_positions[key]
    found = sorted(
        {
            (at, "")
            for at, variant, after in secret_name_starts(text, lowered)
            if variant in variants and (not follow or any(ch in follow for ch in after))
        }
    )
    with _cache_lock:
        if _last_lowered[1] is lowered:
            _last_positions[key] = found
    return found


@functools.lru_cache(maxsize=4096)
def _secret_pieces(whole: str) -> tuple[int, ...]:
    """Offsets in the name run ``whole`` where a name :func:`_named_value` may hide the value of
    starts: the run itself, and what follows each "/" or "." in it ("payments-db/password")."""
    offsets = [0] + [i + 1 for i, ch in enumerate(whole) if ch in "/."]
    found = []
    for offset in offsets:
        name = whole[offset:].strip("-.")
        low = name.lower()
        if is_secret_name(name) or low.endswith("auth") or low == "pass":
            found.append(offset)
    return tuple(found)


_NAMES_KEY = ("\0names",)
"""The key the secret-name starts are remembered under (beside keyword sets)."""


_last_lowered: list[str] = ["", ""]
_last_positions: dict[tuple[str, ...], list[tuple[int, str]]] = {}
_last_names: dict[tuple[str, ...], list[tuple[int, str, str]]] = {}
"""Per keyword set (and :data:`_NAMES_KEY`), the positions found in the last text lowercased."""
_cache_lock = threading.Lock()


def lowercased(text: str) -> str:
    """``text.lower()``, remembered for the last text (every anchored rule of a pass asks)."""
    with _cache_lock:
        if _last_lowered[0] is not text:
            _last_lowered[:] = [text, text.lower()]
            _last_positions.clear()
            _last_names.clear()
        return _last_lowered[1]


def keyword_positions(lowered: str, keywords: tuple[str, ...]) -> list[tuple[int, str]]:
    """(position, keyword) of each of ``keywords`` in ``lowered`` (remembered for the last text:
    several anchored rules share one keyword set)."""
    with _cache_lock:
        if _last_lowered[1] is lowered and keywords in _last_positions:
            return _last_positions[keywords]
    positions = []
    for keyword in keywords:
        at = lowered.find(keyword)
        while at >= 0:
            positions.append((at, keyword))
            at = lowered.find(keyword, at + 1)
    with _cache_lock:
        if _last_lowered[1] is lowered:
            _last_positions[keywords] = positions
    return positions
