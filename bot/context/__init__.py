"""Cluster context: Kubernetes, Prometheus and Alertmanager facts for the prompt, within a deadline,
redacted and fitted into a token budget.

Public API: :class:`ContextGatherer` (``from_settings`` / ``gather`` / ``close``),
:class:`ContextSection`, :class:`ContextBundle` and :func:`fit_to_budget`. Redaction is its own
room (:mod:`bot.redact`); the Alertmanager webhook receiver is an inbound adapter
(:mod:`bot.adapters.alertmanager`).
"""

from bot.context.base import (
    ContextBundle,
    ContextProvider,
    ContextRequest,
    ContextSection,
    ProviderResult,
    ProviderStatus,
)
from bot.context.budget import fit_to_budget
from bot.context.entities import Entities
from bot.context.gatherer import ContextGatherer

__all__ = [
    "ContextBundle",
    "ContextGatherer",
    "ContextProvider",
    "ContextRequest",
    "ContextSection",
    "Entities",
    "ProviderResult",
    "ProviderStatus",
    "fit_to_budget",
]
