"""The start banner of ``opsbot chat``: which model answers (and whether it is a toy), which context
sources are on and whether each answered a health check, where the log goes.

A new user's first question is "what am I talking to?": a 135M-parameter model without a cluster
gives fluent, invented answers, and nothing else on the screen says so.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bot.context.base import ContextProvider

TOY_BELOW_B = 1.0
"""Models with fewer parameters than this (billions) are called toys: fluent, often wrong."""
CHECK_TIMEOUT_S = 3.0
"""Seconds one source's health check may take at start."""
_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s*([MB])(?![a-z])", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class SourceCheck:
    """One context source at start: its name, where it lives, and why it did not answer (``None``:
    it answered)."""

    name: str
    target: str
    problem: str | None

    @property
    def line(self) -> str:
        """``Kubernetes ✓ answered (https://127.0.0.1:6443)`` or ``Prometheus ✗ cannot reach ...``."""
        if self.problem is None:
            return f"{self.name} ✓ answered ({self.target})"
        return f"{self.name} ✗ {self.problem}"


def model_size_b(model: str) -> float | None:
    """The parameter count a model's name states, in billions (``SmolLM2-135M`` -> 0.135,
    ``Llama-3.1-8B-Instruct`` -> 8.0); ``None`` when the name does not say."""
    found = _SIZE.findall(Path(model).name) or _SIZE.findall(model)
    if not found:
        return None
    number, unit = found[-1]
    return float(number) / (1000 if unit.upper() == "M" else 1)


def model_line(model: str, backend: str, *, random_weights: bool = False) -> str:
    """``model: SmolLM2-135M-Instruct.Q8_0.gguf on llamacpp — a 135M-parameter toy ...``."""
    name = Path(model).name if Path(model).exists() else model
    line = f"model: {name} on {backend}"
    if random_weights:
        return line + " — the offline test model (random weights): answers are gibberish; set engine.model"
    size = model_size_b(model)
    if size is not None and size < TOY_BELOW_B:
        shown = f"{size * 1000:.0f}M" if size < 1 else f"{size:g}B"
        return (
            f"{line} — a {shown}-parameter toy for trying opsbot: fluent, often wrong. For real answers "
            "set engine.model (README: recommended models)"
        )
    return line


async def check_sources(providers: Sequence[ContextProvider]) -> list[SourceCheck]:
    """Every provider's health check at once, each within :data:`CHECK_TIMEOUT_S`."""

    async def one(provider: ContextProvider) -> SourceCheck:
        try:
            problem = await asyncio.wait_for(provider.check(), CHECK_TIMEOUT_S)
        except TimeoutError:
            problem = f"no answer within {CHECK_TIMEOUT_S:g} s"
        return SourceCheck(provider.name, provider.target, problem)

    return list(await asyncio.gather(*(one(p) for p in providers)))


def sources_line(checks: Sequence[SourceCheck], *, demo: bool = False) -> str:
    """``sources: Kubernetes ✓ answered (...), Prometheus ✗ ...``, or what to do when none is on."""
    if not checks:
        hint = "" if demo else "; try `opsbot chat --demo` for a built-in incident"
        return (
            "sources: none on (kubernetes.enabled, prometheus.enabled): answers have no cluster facts" + hint
        )
    return "sources: " + ", ".join(c.line for c in checks)
