"""Constrained JSON outputs: how many tokens one may take, and what a cut one still says.

A schema-constrained decode (llama.cpp grammar, vLLM structured outputs) is well-formed by
construction only if it is allowed to finish. Two helpers keep that promise honest:

* :func:`token_ceiling` bounds the tokens an instance of a closed schema can take, so a request's
  ``max_tokens`` never cuts a valid object (a small model writing ``"1.1.1.1..."`` one token per
  character still fits). Every token the grammar admits writes at least one character, so the
  longest instance's length in characters bounds its tokens; one character unit of a string counts
  as one token (an escape such as ``\\u00e9`` may take more: :func:`complete_prefix` covers that).
* :func:`complete_prefix` reads a cut output (``finish_reason == "length"``, a backend that does
  not constrain): the longest prefix that ends after a whole member or array element, closed. A
  half-written value is dropped, never guessed: a name cut to ``api-7f`` would name the wrong thing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_SPACE = 1
"""llama.cpp's JSON-schema grammar allows one optional space between tokens of JSON (``" "?``)."""

_UNBOUNDED_INTEGER = 20
"""Characters of an integer without bounds (the grammar allows at most 16 digits and a sign)."""

_NUMBER = 32
"""Characters of a JSON number (digits, fraction, exponent) in the grammar's longest form."""


def token_ceiling(schema: Mapping[str, Any]) -> int | None:
    """Tokens enough for any instance of ``schema`` plus the end-of-sequence token, or ``None`` when
    the schema leaves something unbounded (a string without ``maxLength``, an array without
    ``maxItems``, an open object, a ``$ref``)."""
    chars = _max_chars(schema)
    return None if chars is None else chars + 1


def _max_chars(schema: Mapping[str, Any]) -> int | None:
    """The longest instance of ``schema`` in characters, spaces included (``None``: unbounded)."""
    if "const" in schema:
        return len(json.dumps(schema["const"])) + _SPACE
    if "enum" in schema:
        return max(len(json.dumps(v)) for v in schema["enum"]) + _SPACE
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [_max_chars(option) for option in schema[key]]
            return None if any(o is None for o in options) else max(o for o in options if o is not None)
    kind = schema.get("type")
    if kind == "object":
        return _object_chars(schema)
    if kind == "array":
        items, most = schema.get("items"), schema.get("maxItems")
        if most is None:
            return None
        if most == 0:
            return 2 + _SPACE
        item = _max_chars(items) if isinstance(items, Mapping) else None
        # "[" space item ("," space item)* "]" space
        return None if item is None else 1 + _SPACE + most * item + (most - 1) * (1 + _SPACE) + 1 + _SPACE
    if kind == "string":
        most = schema.get("maxLength")
        return None if most is None else most + 2 + _SPACE
    if kind == "integer":
        bounds = [schema[k] for k in ("minimum", "maximum") if isinstance(schema.get(k), int)]
        if len(bounds) < 2:
            return _UNBOUNDED_INTEGER + _SPACE
        return max(len(str(b)) for b in bounds) + _SPACE
    if kind == "number":
        return _NUMBER + _SPACE
    if kind == "boolean":
        return len("false") + _SPACE
    if kind == "null":
        return len("null") + _SPACE
    return None


def _object_chars(schema: Mapping[str, Any]) -> int | None:
    """``"{" space ("key" space ":" space value ("," space ...)*)? "}" space``, all members present."""
    if schema.get("additionalProperties", True) is not False:
        return None
    members = []
    for key, value in (schema.get("properties") or {}).items():
        chars = _max_chars(value) if isinstance(value, Mapping) else None
        if chars is None:
            return None
        members.append(len(json.dumps(key)) + _SPACE + 1 + _SPACE + chars)
    separators = max(0, len(members) - 1) * (1 + _SPACE)
    return 1 + _SPACE + sum(members) + separators + 1 + _SPACE


def complete_prefix(text: str) -> Any | None:
    """The value of the longest prefix of ``text`` that ends after a whole member or array element,
    with its open brackets closed (``None``: no whole member or element to keep). Whole text that
    parses is returned as it is."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    closers: list[str] = []
    cuts: list[tuple[int, str]] = []  # (end of kept text, closers then) at every safe point
    in_string = escaped = False
    for at, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
            continue
        if char == '"':
            in_string = True
        elif char in "{[":
            closers.append("}" if char == "{" else "]")  # not a cut: the container has just begun
        elif char in "}]":
            if not closers:
                break
            closers.pop()
            cuts.append((at + 1, "".join(reversed(closers))))
        elif char == "," and closers:
            cuts.append((at, "".join(reversed(closers))))  # everything before the comma is whole
    for end, closing in reversed(cuts):
        try:
            return json.loads(text[:end] + closing)
        except ValueError:
            continue  # e.g. a member's key kept without its value: try the cut before
    return None
