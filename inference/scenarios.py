"""Scenario presets: sampling settings per kind of question, overridable in configuration.

The defaults follow the product's source material: an alert summary is short and nearly
deterministic; a root-cause analysis may reason longer; a change review sits in between; a
thread catch-up stays close to what people wrote; a postmortem draft is the longest document.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from inference.engine import EngineError, SamplingSettings

ALERT_SUMMARY = "alert_summary"
ROOT_CAUSE = "root_cause"
CHANGE_REVIEW = "change_review"
CHAT = "chat"
TIMELINE = "timeline"
THREAD_SUMMARY = "thread_summary"
POSTMORTEM = "postmortem"

DEFAULT_PRESETS: dict[str, SamplingSettings] = {
    ALERT_SUMMARY: SamplingSettings(temperature=0.1, top_p=0.9, max_tokens=128, repetition_penalty=1.05),
    ROOT_CAUSE: SamplingSettings(temperature=0.3, top_p=0.95, max_tokens=512, repetition_penalty=1.1),
    CHANGE_REVIEW: SamplingSettings(temperature=0.2, top_p=0.9, max_tokens=256, repetition_penalty=1.05),
    # Follow-ups and plain questions: conversational, a little more room than a summary.
    CHAT: SamplingSettings(temperature=0.3, top_p=0.95, max_tokens=384, repetition_penalty=1.05),
    # Incident timelines (batch analysis): factual, chronological, one line per event.
    TIMELINE: SamplingSettings(temperature=0.1, top_p=0.9, max_tokens=384, repetition_penalty=1.05),
    # A catch-up restates what the thread says: close to the text, a screenful at most.
    THREAD_SUMMARY: SamplingSettings(temperature=0.2, top_p=0.9, max_tokens=512, repetition_penalty=1.05),
    # A postmortem draft is a document (timeline, impact, cause, follow-ups): the longest output.
    POSTMORTEM: SamplingSettings(temperature=0.3, top_p=0.95, max_tokens=1536, repetition_penalty=1.05),
}


class UnknownScenarioError(EngineError, ValueError):
    """A scenario name that is neither a preset nor configured."""


class ScenarioRegistry:
    """Sampling presets by name, with configuration overrides applied field by field."""

    def __init__(self, overrides: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self._presets = dict(DEFAULT_PRESETS)
        for name, fields in (overrides or {}).items():
            base = self._presets.get(name, SamplingSettings())
            try:
                typed = {key: _typed(name, key, value) for key, value in dict(fields).items()}
                self._presets[name] = replace(base, **typed)
            except TypeError as exc:
                allowed = ", ".join(SamplingSettings.__dataclass_fields__)
                raise UnknownScenarioError(f"scenario {name!r}: {exc}; allowed fields are {allowed}") from exc

    @property
    def names(self) -> list[str]:
        """Every known scenario name."""
        return sorted(self._presets)

    def get(self, name: str) -> SamplingSettings:
        """The sampling settings of ``name``; :class:`UnknownScenarioError` if there is none."""
        try:
            return self._presets[name]
        except KeyError:
            raise UnknownScenarioError(
                f"unknown scenario {name!r}; known scenarios: {', '.join(self.names)}"
            ) from None


_NUMBERS: dict[str, type[int] | type[float]] = {
    "temperature": float,
    "top_p": float,
    "repetition_penalty": float,
    "max_tokens": int,
    "seed": int,
}


def _typed(scenario: str, key: str, value: Any) -> Any:
    """``value`` as the field's type: an environment variable (``OPSBOT_SCENARIOS__CHAT__MAX_TOKENS=48``)
    gives text, which would otherwise reach the engine as ``"48"`` and fail every answer."""
    if not isinstance(value, str) or key not in (*_NUMBERS, "ignore_eos", "stop"):
        return value
    try:
        if key == "ignore_eos":
            return {"true": True, "false": False, "1": True, "0": False}[value.strip().lower()]
        if key == "stop":  # a JSON list, or one stop string
            parsed = json.loads(value) if value.lstrip().startswith("[") else [value]
            return tuple(str(s) for s in parsed)
        return _NUMBERS[key](value)
    except (KeyError, ValueError):
        kind = {"ignore_eos": "true or false", "stop": "a JSON list of strings"}.get(
            key, "a whole number" if _NUMBERS.get(key) is int else "a number"
        )
        raise UnknownScenarioError(f"scenarios.{scenario}.{key}: {value!r} is not {kind}") from None
