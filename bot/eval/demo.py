"""``opsbot chat --demo [CASE]``: a built-in incident to talk about, with no cluster of one's own.

The case's recorded cluster state and metrics are served by the eval's in-process Kubernetes and
Prometheus APIs (:mod:`bot.eval.kube_api`, :mod:`bot.eval.prom_api`) on free ports of 127.0.0.1;
the settings are pointed at them exactly as ``opsbot eval`` points them (and at a database of the
demo's own, so demo threads never mix with real ones). The chat then runs the whole pipeline as
usual: the first question is the case's own, so the first screen shows context gathered, its
sources, and an answer grounded in them.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bot.config import Settings
from bot.context.alertmanager import describe
from bot.eval.cases import BUILTIN_CASES, CaseError, EvalCase, load_cases
from bot.eval.runner import served_settings

DEFAULT_CASE = "oom-worker"
"""The incident ``--demo`` serves without a case id: small, and its cause is in the data."""


@dataclass(slots=True)
class Demo:
    """A running demo: its case, the settings pointed at the case's servers, the first question."""

    case: EvalCase
    settings: Settings
    question: str


def demo_cases() -> list[EvalCase]:
    """The built-in cases a demo can serve (those with a cluster state or metrics)."""
    return [c for c in load_cases([BUILTIN_CASES]) if c.cluster is not None or c.prometheus is not None]


def find_case(case_id: str) -> EvalCase:
    """The built-in case ``case_id``; :class:`CaseError` naming the ones there are."""
    cases = demo_cases()
    for case in cases:
        if case.id == case_id:
            return case
    known = ", ".join(c.id for c in cases)
    raise CaseError(f"--demo {case_id}: no such built-in case. Fix: pick one of {known}")


@contextlib.asynccontextmanager
async def demo(settings: Settings, case_id: str = DEFAULT_CASE) -> AsyncIterator[Demo]:
    """Serve case ``case_id`` and yield the settings that read it (see the module doc)."""
    case = find_case(case_id)
    kube = case.kubernetes_server()
    prom = case.prometheus_server()
    with tempfile.TemporaryDirectory(prefix="opsbot-demo-") as workdir:
        try:
            if kube is not None:
                await kube.start()
            if prom is not None:
                await prom.start()
            served = served_settings(settings, kube, prom, Path(workdir) / case.id)
            served = served.model_copy(
                update={
                    "store": settings.store.model_copy(
                        update={"url": f"sqlite+aiosqlite:///{Path(workdir) / 'demo.db'}"}
                    )
                }
            )
            question = case.question or describe(case.alert or {})
            yield Demo(case, served, question)
        finally:
            if prom is not None:
                await prom.stop()
            if kube is not None:
                await kube.stop()
