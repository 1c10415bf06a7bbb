"""``opsbot feedback export``: rated answers as eval cases (JSONL that ``opsbot eval`` runs).

Each line is one request someone voted on, with what replays it (its stored, redacted context
bundle, question, scenario and thread turns: ``replay_inputs`` of the request row), the answer as
it was given and the votes. For an answer liked on balance, ``expect`` holds its grounded facts:
the object names it gave that the context shows, the known failure reasons it named and the
numbers it quoted that the context shows: a replay must say them again. An answer disliked on
balance gets an empty ``expect`` (what was wrong is for a person to write down): its replay is
still scored for hallucinated objects and latency. Review the file before treating it as truth.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from bot.eval.cases import Expectation
from bot.eval.scorer import contains_number, contains_word, object_names
from bot.replay import decode
from bot.store.records import RatedRequest

KNOWN_REASONS = (
    "OOMKilled",
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "CreateContainerConfigError",
    "Unschedulable",
    "Insufficient memory",
    "Insufficient cpu",
    "Evicted",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NotReady",
    "Readiness probe failed",
    "Liveness probe failed",
    "ProgressDeadlineExceeded",
    "FailedMount",
    "connection refused",
    "connection pool",
    "too many connections",
    "certificate has expired",
    "DeadlineExceeded",
    "rollback",
)
"""Failure reasons a liked answer's ``expect.reasons`` is drawn from (as Kubernetes and logs spell them)."""

_NUMBER = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:%|Mi|Gi|Ki|MiB|GiB|ms|s|m)?(?![\w.])")
_NAMESPACED = re.compile(r"\b[a-z0-9][a-z0-9-]*/([a-z0-9][a-z0-9.-]*[a-z0-9])\b")


def context_text(context: Mapping[str, Any]) -> str:
    """The section bodies and titles of a stored bundle, as one text."""
    return "\n".join(f"{s.get('title', '')}\n{s.get('body', '')}" for s in context.get("sections") or [])


def grounded_expectation(answer: str, context: str) -> Expectation:
    """The facts of ``answer`` that ``context`` backs (see the module doc)."""
    objects = [n for n in object_names(answer) if contains_word(context, n)]
    for match in _NAMESPACED.finditer(context):  # one-word objects: payments/api named as "api"
        name = match.group(1)
        if name not in objects and len(name) > 2 and contains_word(answer, name):
            objects.append(name)
    reasons = [r for r in KNOWN_REASONS if contains_word(answer, r)]
    numbers: list[str] = []
    for match in _NUMBER.finditer(answer):
        value = match.group(0)
        significant = len(value.rstrip("%smiKGB")) >= 2 or not value.isdigit()
        if significant and value not in numbers and contains_number(context, value):
            numbers.append(value)
    return Expectation(
        objects=[[o] for o in objects], reasons=[[r] for r in reasons], numbers=[[n] for n in numbers]
    )


def export_lines(rated: Iterable[RatedRequest], rating: str = "all") -> tuple[list[str], int]:
    """JSONL lines for ``rated`` (``rating``: ``up``, ``down`` or ``all``) and how many could not be
    exported (no replay inputs: written before they were kept, or ended before the prompt)."""
    lines: list[str] = []
    skipped = 0
    for item in rated:
        if rating == "up" and item.rating <= 0 or rating == "down" and item.rating >= 0:
            continue
        if item.replay_inputs is None:
            skipped += 1
            continue
        try:
            inputs = decode(item.replay_inputs)
        except ValueError:
            skipped += 1
            continue
        context = inputs.get("context") or {}
        answer = item.answer or ""
        liked = item.rating > 0
        expect = grounded_expectation(answer, context_text(context)) if liked and answer else Expectation()
        when = f"{item.created_at:%Y-%m-%d %H:%M} UTC"
        sign = "+" if item.rating > 0 else ""
        case = {
            "id": f"feedback-{item.request_id}".lower(),
            "title": f"{item.scenario} answer rated {sign}{item.rating} on {when}",
            "source": "feedback",
            "request_id": item.request_id,
            "scenario": inputs.get("scenario") or item.scenario,
            "question": inputs.get("question") or "",
            "asker": inputs.get("asker"),
            "context": context,
            "history": inputs.get("history") or [],
            "reference_answer": answer,
            "feedback": item.rating,
            "model": item.model,
            "created_at": item.created_at.isoformat(timespec="seconds"),
            "expect": expect.as_dict(),
        }
        if inputs.get("investigation"):  # the tools offered and the calls' recorded outputs
            case["investigation"] = inputs["investigation"]
        lines.append(json.dumps(case, ensure_ascii=False))
    return lines, skipped
