"""Forged, tampered, replayed and expired Approve clicks, the same for both platforms: what the
actions tests and ``bench/actions_bench.py`` throw at opsbot. Each attempt must be refused and
nothing applied."""

from __future__ import annotations

import hashlib
import hmac
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Attempt:
    """One click to send: the button value, who clicks, where, and how the request is made."""

    kind: str
    """``forged_user``, ``tampered``, ``malformed``, ``wrong_channel``, ``replayed``, ``expired``,
    ``unsigned``."""
    value: str
    user: str
    channel: str
    transport: str = "signed"
    """``signed`` (a genuine platform request) or, on Slack, ``bad_secret`` / ``stale`` / ``no_headers``;
    on Mattermost, ``direct`` (someone POSTing to /mattermost/actions themselves)."""


def _flip(text: str, rng: random.Random) -> str:
    if not text:
        return "0"
    i = rng.randrange(len(text))
    return text[:i] + ("0" if text[i] != "0" else "1") + text[i + 1 :]


def attempts(
    *,
    live_approve: str,
    live_reject: str,
    other_id: str,
    applied_approve: str,
    expired_approve: str,
    approver: str,
    channel: str,
    other_channel: str,
    unsigned_transports: tuple[str, ...],
    count: int,
    seed: int = 41,
) -> list[Attempt]:
    """``count`` attempts against a live proposal (its approve / reject values), an applied one and
    an expired one, by an approver (``approver``) where the attack needs one."""
    rng = random.Random(seed)
    live_id, _, live_sig = live_approve.split(":")
    _, _, reject_sig = live_reject.split(":")
    # look-alikes of the approver (case, spaces, a character short): none of them is the approver
    strangers = [
        s
        for s in ("U0STRANGER", approver.upper(), approver.lower(), approver + " ", approver[:-1])
        if s != approver
    ]
    makers = [
        lambda: Attempt(
            "forged_user", live_approve, rng.choice(strangers[:2] + [f"U{rng.randrange(10**8):08d}"]), channel
        ),
        lambda: Attempt("tampered", f"{live_id}:approve:{reject_sig}", approver, channel),
        lambda: Attempt("tampered", f"{live_id}:approve:{_flip(live_sig, rng)}", approver, channel),
        lambda: Attempt("tampered", f"{other_id}:approve:{live_sig}", approver, channel),
        lambda: Attempt("tampered", f"{_flip(live_id, rng)}:approve:{live_sig}", approver, channel),
        lambda: Attempt(
            "tampered",
            f"{live_id}:approve:"
            + hmac.new(b"guessed-secret", live_id.encode(), hashlib.sha256).hexdigest()[:32],
            approver,
            channel,
        ),
        lambda: Attempt("tampered", f"{live_id}:approve:", approver, channel),
        lambda: Attempt(
            "malformed",
            rng.choice(
                [
                    live_id,
                    f"{live_approve}:x",
                    "",
                    ":" * 5,
                    "' OR 1=1 --",
                    "é" * 300,
                    f"{live_id}:APPROVE:{live_sig}",
                    "x" * 2000,
                ]
            ),
            approver,
            channel,
        ),
        lambda: Attempt("wrong_channel", live_approve, approver, other_channel),
        lambda: Attempt("replayed", applied_approve, approver, channel),
        lambda: Attempt("expired", expired_approve, approver, channel),
        lambda: Attempt("unsigned", live_approve, approver, channel, rng.choice(unsigned_transports)),
    ]
    return [makers[i % len(makers)]() for i in range(count)]
