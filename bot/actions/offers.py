"""After an answer: the fixes to offer as cards, and offering them.

Two sources, in this order, at most ``actions.max_offers`` cards in all, each action once:

1. the investigation's ``propose_action`` calls (:class:`~bot.tools.base.ProposedAction`), their
   card's *why* the model's line and the steps it cites;
2. with ``actions.offer_from_answers``, the ``kubectl`` commands of the answer that are catalog
   actions on a target its evidence names (:mod:`bot.actions.suggest`).

Every offer goes through :meth:`ActionService.propose` like a person's ``/rca propose``: the
channel's policy, the server-side dry run, the audit row, the card; nothing is applied until a
person approves. Offers are made only where someone may approve (``takes_proposals``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from bot.actions.catalog import ActionSpec
from bot.actions.service import ActionService, ThreadRef
from bot.actions.suggest import named_in, suggested_actions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Offer:
    """One card to offer: the action, its *why* lines, and who it comes from (``investigation`` or
    ``answer``: the audit row's ``proposed_by``)."""

    spec: ActionSpec
    evidence: list[str]
    proposed_by: str


def answer_offers(
    answer: str,
    *,
    evidence: Sequence[str],
    namespaces: Sequence[str],
    most: int,
) -> list[Offer]:
    """The offers of the ``kubectl`` commands in ``answer`` (targets named in ``evidence``, within
    ``namespaces``; empty: any)."""
    return [
        Offer(s.spec, [f"suggested in opsbot's answer: `{s.command}`"], "answer")
        for s in suggested_actions(answer, known=named_in(evidence), namespaces=namespaces, most=most)
    ]


async def offer(actions: ActionService, thread: ThreadRef, offers: Sequence[Offer]) -> list[str]:
    """Propose each of ``offers`` in ``thread`` (each action once) until ``max_offers`` cards are made; the
    notes for the thread: why a proposal of the investigation was not offered (a command read from
    the answer that fails its dry run is only logged: the answer may have named it in passing)."""
    notes: list[str] = []
    seen: set[str] = set()
    made = 0
    for item in offers:
        if made >= actions.settings.max_offers:
            break
        if item.spec.digest() in seen:
            continue
        seen.add(item.spec.digest())
        proposal = await actions.propose(item.spec, item.evidence, thread, proposed_by=item.proposed_by)
        if proposal.refused is None:
            made += 1
            continue
        logger.info("offer of %s (%s) not made: %s", item.spec.describe(), item.proposed_by, proposal.refused)
        if item.proposed_by == "investigation":
            notes.append(
                f"opsbot proposed *{item.spec.describe()}*, but no card was made: {proposal.refused}"
            )
    return notes
