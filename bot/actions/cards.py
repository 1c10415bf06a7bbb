"""A proposal as a card: what, why (the cited evidence), the dry run's diff, the risk, who may
approve, until when, and the Approve / Reject buttons. One neutral :class:`Card`, two renderings:
Slack Block Kit (``section`` + ``actions`` blocks with two ``button`` elements) and Mattermost
message attachments with interactive ``actions`` (``integration.url`` + ``context``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

SLACK_ACTION_PREFIX = "opsbot_action_"
"""``action_id`` prefix of the Approve / Reject buttons on Slack (``opsbot_action_approve``)."""
MATTERMOST_CONTEXT_ACTION = "opsbot_action"
"""``context.action`` of the buttons on Mattermost (the feedback buttons say ``feedback``)."""
_DIFF_CHARS = 2500  # Slack's section text holds 3000 characters; the rest of the card needs room


@dataclass
class Card:
    """Everything a card shows, platform-neutral."""

    proposal_id: str
    title: str
    evidence: list[str]
    diff: str
    summary: str
    risk: str
    approvers: str
    expires_at: datetime
    approve_value: str = ""
    reject_value: str = ""
    state: str = "proposed"
    """``proposed`` (buttons shown) or the decided state's line (no buttons)."""
    notes: list[str] = field(default_factory=list)

    def text(self) -> str:
        """The whole card as Markdown (the fallback text, Mattermost's attachment text)."""
        diff = self.diff if len(self.diff) <= _DIFF_CHARS else self.diff[:_DIFF_CHARS] + "\n… (cut)"
        why = "\n".join(f"• {quiet(line)}" for line in self.evidence) or "• (no evidence cited)"
        lines = [
            f"*Proposed action:* {self.title}",
            f"*Why:*\n{why}",
            f"*Dry run (server-side, nothing changed yet):* {self.summary}",
            f"```\n{diff or '(no change)'}\n```",
            f"*Risk:* {self.risk}",
            f"*Who may approve:* {self.approvers} · expires {self.expires_at.strftime('%H:%M UTC')}"
            f" · proposal `{self.proposal_id}`",
        ]
        if self.state != "proposed":
            lines.append(self.state)
        lines.extend(self.notes)
        return "\n".join(lines)


_MENTION = re.compile(r"<([!@#])|(?<![\w.])@(channel|here|all|everyone)\b", re.IGNORECASE)


def quiet(text: str) -> str:
    """``text`` that pings nobody: Slack's ``<!channel>`` / ``<@U…>`` / ``<#C…>`` and Mattermost's
    ``@channel`` / ``@here`` / ``@all`` broken by a zero-width space (evidence lines quote the
    model, a log line or a person, never meant to notify)."""
    return _MENTION.sub(lambda m: f"<\u200b{m.group(1)}" if m.group(1) else f"@\u200b{m.group(2)}", text)


def slack_blocks(card: Card) -> list[dict[str, Any]]:
    """Block Kit blocks: the card as mrkdwn sections, then the buttons while it is undecided."""
    blocks: list[dict[str, Any]] = []
    for chunk in _chunks(card.text(), 2900):
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": chunk}})
    if card.state == "proposed":
        blocks.append(
            {
                "type": "actions",
                "block_id": f"opsbot_action:{card.proposal_id}",
                "elements": [
                    {
                        "type": "button",
                        "action_id": SLACK_ACTION_PREFIX + "approve",
                        "text": {"type": "plain_text", "text": "Approve"},
                        "style": "primary",
                        "value": card.approve_value,
                        "confirm": {
                            "title": {"type": "plain_text", "text": "Apply this action?"},
                            "text": {"type": "mrkdwn", "text": card.title[:300]},
                            "confirm": {"type": "plain_text", "text": "Apply"},
                            "deny": {"type": "plain_text", "text": "Cancel"},
                        },
                    },
                    {
                        "type": "button",
                        "action_id": SLACK_ACTION_PREFIX + "reject",
                        "text": {"type": "plain_text", "text": "Reject"},
                        "style": "danger",
                        "value": card.reject_value,
                    },
                ],
            }
        )
    return blocks


def mattermost_props(card: Card, url: str | None) -> dict[str, Any]:
    """Post props: one attachment with the card's text and, while undecided, the two buttons
    (their ``integration.context`` never reaches clients: the server strips it)."""
    attachment: dict[str, Any] = {
        "text": card.text(),
        "color": "#d97706" if card.state == "proposed" else "#6b7280",
    }
    if card.state == "proposed" and url:
        attachment["actions"] = [
            {
                "id": f"opsbotapprove{card.proposal_id[:12]}",
                "name": "Approve",
                "type": "button",
                "style": "good",
                "integration": {
                    "url": url,
                    "context": {"action": MATTERMOST_CONTEXT_ACTION, "value": card.approve_value},
                },
            },
            {
                "id": f"opsbotreject{card.proposal_id[:12]}",
                "name": "Reject",
                "type": "button",
                "style": "danger",
                "integration": {
                    "url": url,
                    "context": {"action": MATTERMOST_CONTEXT_ACTION, "value": card.reject_value},
                },
            },
        ]
    return {"attachments": [attachment]}


def _chunks(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]
