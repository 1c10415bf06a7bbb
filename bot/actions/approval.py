"""Who may approve what, and how a button proves what it means.

The policy (``[[actions.policies]]``) is read per channel, first match wins, and checked at click
time against the platform's own identity of the clicker (Slack's ``user.id`` from a signed request
or the authenticated Socket Mode link; Mattermost's ``user_id``, which the Mattermost server itself
fills in when it forwards the click). No policy, or an empty ``approvers`` list, means nobody.

Every button carries ``proposal:decision:signature``, the signature an HMAC (``actions.secret``)
over the proposal id, the decision and the digest of the action stored with the proposal: a
forged, repointed or edited button fails the check before the store is even asked. Whether the
click may still act (not decided yet, not expired) is the store's claim (:mod:`bot.actions.audit`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
from dataclasses import dataclass

from bot.actions.catalog import ActionSpec
from bot.config import ActionPolicySettings, ActionsSettings

DECISIONS = ("approve", "reject")
ASKER = "asker"


def signature(secret: str, proposal_id: str, decision: str, digest: str) -> str:
    """HMAC-SHA256 of one button's meaning (hex, 32 characters)."""
    message = f"{proposal_id}:{decision}:{digest}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()[:32]


def button_value(secret: str, proposal_id: str, decision: str, digest: str) -> str:
    """What a button sends back: ``proposal:decision:signature``."""
    return f"{proposal_id}:{decision}:{signature(secret, proposal_id, decision, digest)}"


@dataclass(frozen=True)
class Click:
    """One Approve / Reject click, platform-neutral."""

    platform: str
    value: str
    """The button's value as it arrived (unverified)."""
    user: str
    """The clicker's platform user id, as the platform vouched for it."""
    channel: str
    user_name: str | None = None

    def parts(self) -> tuple[str, str, str] | None:
        """``(proposal id, decision, signature)``, or ``None`` for a value of another shape."""
        pieces = self.value.split(":")
        if len(pieces) != 3 or pieces[1] not in DECISIONS or not pieces[0] or len(pieces[0]) > 64:
            return None
        return pieces[0], pieces[1], pieces[2]


def valid_signature(secret: str, proposal_id: str, decision: str, digest: str, sig: str) -> bool:
    """True when ``sig`` is the signature of this proposal's ``decision`` (constant time)."""
    return hmac.compare_digest(sig.encode(), signature(secret, proposal_id, decision, digest).encode())


class ApprovalPolicy:
    """``[actions]`` policies and groups."""

    def __init__(self, settings: ActionsSettings) -> None:
        self.settings = settings

    @property
    def needs_channel_names(self) -> bool:
        """True when a policy matches channels by name (the adapter must look names up)."""
        return any(m.startswith("#") for p in self.settings.policies for m in p.match)

    def policy_for(self, platform: str, channel: str, name: str | None) -> ActionPolicySettings | None:
        """The first policy matching the channel, or ``None``."""
        for policy in self.settings.policies:
            if policy.platform is not None and policy.platform != platform:
                continue
            for entry in policy.match:
                if entry.startswith("#"):
                    if name and fnmatch.fnmatchcase(name.lower().lstrip("#"), entry[1:].lower()):
                        return policy
                elif entry == channel:
                    return policy
        return None

    def proposal_refusal(self, spec: ActionSpec, policy: ActionPolicySettings | None) -> str | None:
        """Why ``spec`` may not even be proposed in a channel with ``policy`` (``None``: it may)."""
        if policy is None:
            return None  # the card is shown; nobody may approve it (approvers() is empty)
        if policy.actions and spec.action not in policy.actions:
            return f"`{spec.action}` is not allowed in this channel (allowed: {', '.join(policy.actions)})"
        if policy.namespaces:
            if spec.namespace is None and spec.is_kubernetes:
                return "cluster-scoped actions (nodes) are not allowed in this channel"
            if spec.namespace is not None and spec.namespace not in policy.namespaces:
                return (
                    f"namespace `{spec.namespace}` is outside this channel's ({', '.join(policy.namespaces)})"
                )
        return None

    def approvers(self, policy: ActionPolicySettings | None, asked_by: str | None) -> set[str]:
        """Every user id that may approve under ``policy`` (``asker`` and ``@groups`` resolved)."""
        if policy is None:
            return set()
        users: set[str] = set()
        for entry in policy.approvers:
            if entry == ASKER:
                if asked_by:
                    users.add(asked_by)
            elif entry.startswith("@"):
                users.update(self.settings.groups.get(entry[1:], []))
            else:
                users.add(entry)
        return users

    def describe(self, policy: ActionPolicySettings | None, asked_by: str | None) -> str:
        """Who may approve, for the card (``asker``, ``@sre``, ids)."""
        if policy is None or not policy.approvers:
            return "nobody in this channel (no approval policy names anyone)"
        return ", ".join(f"the asker ({asked_by})" if e == ASKER else e for e in policy.approvers)
