"""Cluster context: Kubernetes, Prometheus and Alertmanager facts for the prompt, within a deadline,
redacted and fitted into a token budget.

Public API: :class:`ContextGatherer` (``from_settings`` / ``gather`` / ``close``),
:class:`ContextSection`, :class:`ContextBundle`, :func:`fit_to_budget`, :func:`redact`,
:class:`RedactingFilter` and :class:`AlertmanagerReceiver` (``POST /alertmanager``).
"""

from bot.context.alertmanager import AlertmanagerReceiver
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
from bot.context.redact import RedactingFilter, redact

__all__ = [
    "AlertmanagerReceiver",
    "ContextBundle",
    "ContextGatherer",
    "ContextProvider",
    "ContextRequest",
    "ContextSection",
    "Entities",
    "ProviderResult",
    "ProviderStatus",
    "RedactingFilter",
    "fit_to_budget",
    "redact",
]
