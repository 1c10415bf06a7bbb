"""Replay inputs: what a request row keeps so its answer can be produced again (``opsbot eval``).

The row's ``replay_inputs`` column holds one JSON document: the question (redacted, as the pipeline
answered it), asker, scenario, the answer's token limit, a hash of the system prompt, the stored
thread turns it saw and the redacted context bundle (every section with its source, title, body, line ranks,
priority and how the budget may cut it, the footer's source notes and the scope). The bundle is kept
whole, before the prompt budget cut it, so a replay on a model with a larger window sees all of it;
bodies beyond :data:`MAX_CONTEXT_CHARS` in total are cut (the document says how many characters).

``opsbot feedback export`` turns rated rows into eval cases from this document.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from bot.context.base import ContextBundle, ContextSection, UsedScope
from bot.redact import redact
from bot.store.records import ThreadMessage
from bot.types import SourceNote

FORMAT_VERSION = 1
MAX_CONTEXT_CHARS = 200_000
"""Most characters of section bodies one row keeps (a long log tail is cut from its start)."""


def system_prompt_hash(system_prompt: str) -> str:
    """SHA-256 of the system prompt (a replay under another system prompt is not the same request)."""
    return hashlib.sha256(system_prompt.encode()).hexdigest()


def bundle_to_dict(bundle: ContextBundle | None) -> dict[str, Any]:
    """A JSON-ready copy of ``bundle`` (bodies redacted once more: nothing unredacted is stored)."""
    if bundle is None:
        return {"sections": [], "notes": [], "scope": [], "scope_notes": [], "scoped": False}
    room = MAX_CONTEXT_CHARS
    sections = []
    cut = 0
    for s in bundle.sections:
        body = redact(s.body)
        ranks = s.line_ranks()
        if len(body) > room:
            cut += len(body) - room
            body = body[len(body) - room :] if s.drop_from == "start" else body[:room]
            kept = len(body.splitlines())
            ranks = ranks[len(ranks) - kept :] if s.drop_from == "start" else ranks[:kept]
        room -= len(body)
        sections.append(
            {
                "source": s.source,
                "title": s.title,
                "body": body,
                "priority": s.priority,
                "unit": s.unit,
                "drop_from": s.drop_from,
                # The budget keeps lines by rank: a replay must rank them as the answer did.
                "ranks": ranks,
            }
        )
    out: dict[str, Any] = {
        "sections": sections,
        "notes": [
            {"name": n.name, "status": n.status, "detail": redact(n.detail), "links": list(n.links)}
            for n in bundle.notes
        ],
        "scope": [
            {"cluster": u.cluster, "namespaces": list(u.namespaces) if u.namespaces is not None else None}
            for u in bundle.scope
        ],
        "scope_notes": list(bundle.scope_notes),
        "scoped": bundle.scoped,
    }
    if cut:
        out["cut_chars"] = cut
    return out


def bundle_from_dict(data: dict[str, Any]) -> ContextBundle:
    """The bundle :func:`bundle_to_dict` wrote."""
    sections = [
        ContextSection(
            source=str(s["source"]),
            title=str(s["title"]),
            body=str(s["body"]),
            priority=int(s.get("priority", 50)),
            unit=str(s.get("unit", "lines")),
            drop_from=s.get("drop_from", "start")
            if s.get("drop_from") in ("start", "end", "none")
            else "start",
            ranks=tuple(int(r) for r in s["ranks"]) if isinstance(s.get("ranks"), list) else None,
        )
        for s in data.get("sections") or []
    ]
    notes = [
        SourceNote(str(n["name"]), str(n["status"]), str(n.get("detail", "")), list(n.get("links") or []))
        for n in data.get("notes") or []
    ]
    scope = [
        UsedScope(str(u["cluster"]), tuple(u["namespaces"]) if u.get("namespaces") is not None else None)
        for u in data.get("scope") or []
    ]
    return ContextBundle(
        sections=sections,
        notes=notes,
        elapsed_ms=0.0,
        scope=scope,
        scope_notes=[str(n) for n in data.get("scope_notes") or []],
        scoped=bool(data.get("scoped", False)),
    )


def encode(
    *,
    question: str,
    asker: str | None,
    scenario: str,
    max_tokens: int,
    system_prompt: str,
    history: Sequence[ThreadMessage],
    bundle: ContextBundle | None,
) -> str:
    """The ``replay_inputs`` JSON of one request (see the module doc)."""
    return json.dumps(
        {
            "version": FORMAT_VERSION,
            "question": redact(question),
            "asker": asker,
            "scenario": scenario,
            "max_tokens": max_tokens,
            "system_prompt_sha256": system_prompt_hash(system_prompt),
            "history": [{"role": m.role, "content": redact(m.content), "user": m.user} for m in history],
            "context": bundle_to_dict(bundle),
        },
        ensure_ascii=False,
    )


def decode(text: str) -> dict[str, Any]:
    """The document :func:`encode` wrote; ``ValueError`` for anything else."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
        raise ValueError(f"replay inputs of an unknown format (version {data.get('version')!r})")
    return data


def with_investigation(text: str, recording: dict[str, Any]) -> str:
    """``text`` (replay inputs) with an investigation's offered tools and recorded call outputs
    (already redacted; :meth:`bot.investigate.Investigation.replay_record`) added."""
    data = decode(text)
    data["investigation"] = recording
    return json.dumps(data, ensure_ascii=False)
