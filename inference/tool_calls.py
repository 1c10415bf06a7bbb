"""Tool calls in one shape for every backend: the decision schema, its parsing, the OpenAI form.

A step of an investigation offers tools (:class:`~inference.engine.ToolSpec`); the model answers
with exactly one decision, the JSON text ``{"name": "<tool>", "arguments": {...}}``, where the
name ``final_answer`` (no arguments) means "enough evidence: answer now". The in-process engines
decode it under :func:`decision_schema` (a llama.cpp grammar, vLLM structured outputs), so the text
is well-formed by construction even from a 135M model; a remote OpenAI-compatible server gets
:func:`openai_tools` and its tool-call parser's answer is turned back into the same text
(:func:`decision_text`). :func:`parse_decision` reads it on the bot's side.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inference.engine import ToolSpec

FINAL_ANSWER = "final_answer"
"""The pseudo-tool that ends the tool calls: the next step writes the answer."""

DECISION_OPENINGS: tuple[str, ...] = ('{"name"', '{ "name"')
"""How a decision's text begins. The answer after an investigation gets them as bad words: a small
model that wrote calls for every step keeps writing one where the answer belongs."""

_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


class ToolCallError(ValueError):
    """A decision that is not one well-formed call of an offered tool (the message says why)."""


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed decision: the tool's name and its arguments."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def is_final(self) -> bool:
        """True for :data:`FINAL_ANSWER`."""
        return self.name == FINAL_ANSWER

    def key(self) -> str:
        """Canonical text of the call (sorted keys): equal calls have equal keys (loop detection)."""
        return json.dumps({"name": self.name, "arguments": self.arguments}, sort_keys=True)


def final_answer_spec() -> ToolSpec:
    """The :data:`FINAL_ANSWER` pseudo-tool, offered beside the real ones."""
    return ToolSpec(FINAL_ANSWER, "Stop calling tools: the evidence is enough to answer.", _NO_ARGUMENTS)


def decision_schema(tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """The JSON Schema of one decision among ``tools`` (each a ``name`` constant with its arguments'
    schema; closed objects, so a grammar has nothing to guess)."""
    options = [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": dict(tool.parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in tools
    ]
    return options[0] if len(options) == 1 else {"anyOf": options}


def decision_text(name: str, arguments: str | Mapping[str, Any] | None) -> str:
    """The decision text of a call a server's tool-call parser returned (``arguments`` as the JSON
    text the OpenAI API carries, or already parsed)."""
    if isinstance(arguments, str):
        try:
            parsed: Any = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            parsed = arguments  # kept as text: parse_decision reports it
    else:
        parsed = dict(arguments or {})
    return json.dumps({"name": name, "arguments": parsed})


def openai_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    """``tools`` as the OpenAI chat API's ``tools`` parameter (the final-answer pseudo-tool left out:
    a server's model answers in text when it calls nothing)."""
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)},
        }
        for t in tools
        if t.name != FINAL_ANSWER
    ]


def parse_decision(text: str, tools: Sequence[ToolSpec]) -> ToolCall:
    """The call ``text`` makes; :class:`ToolCallError` when it is not JSON, names no offered tool, or
    its arguments are not an object with the tool's required keys."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ToolCallError(f"not JSON: {text[:120]!r}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        raise ToolCallError(f'not a call ({{"name": ..., "arguments": ...}}): {text[:120]!r}')
    offered = {t.name: t for t in tools}
    name = data["name"]
    if name not in offered:
        raise ToolCallError(f"{name!r} is not one of the offered tools ({', '.join(offered)})")
    arguments = data.get("arguments", {})
    if not isinstance(arguments, dict):
        raise ToolCallError(f"the arguments of {name} are not an object")
    required = offered[name].parameters.get("required") or []
    missing = [key for key in required if key not in arguments]
    if missing:
        raise ToolCallError(f"{name} needs {', '.join(missing)}")
    return ToolCall(name, arguments)
