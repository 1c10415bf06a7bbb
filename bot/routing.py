"""Which scenario a message is, and which lane it is admitted through: decided here, once.

The scenario comes from one ordered list of rules (:data:`SCENARIO_RULES`): a forced scenario
(alerts, ``/rca summary``), then what the words ask for. Order matters and is deliberate: a *why*
question is a root-cause question even when it names a deploy ("why is checkout-api returning
503s since the last deploy?"), while an explicit request to review a change is a change review.

The lane comes from one table, kind × scenario (:data:`LANES`), which ``/rca help`` and the README
show (:func:`lane_table_markdown`): someone waiting on an incident (``/rca``, an alert) is urgent,
a mention or DM is normal, a thread follow-up may wait behind both, and a batch analysis runs in
the background lane too, never ahead of anyone waiting.
"""

from __future__ import annotations

import re

from bot.types import IncomingMessage, MessageKind
from inference.engine import Lane
from inference.scenarios import (
    ALERT_SUMMARY,
    CHANGE_REVIEW,
    CHAT,
    POSTMORTEM,
    ROOT_CAUSE,
    THREAD_SUMMARY,
    TIMELINE,
)

_REVIEW_REQUEST = re.compile(
    r"^\s*(?:please\s+|pls\s+|can you\s+|could you\s+)?review\b"
    r"|\bchange review\b|\breview (?:the|this|my|our) (?:change|diff|rollout|deploy|deployment|release|pr)\b"
    r"|\bsafe to (?:deploy|ship|roll out|release|merge)\b",
    re.IGNORECASE,
)
_CAUSE = re.compile(
    r"\bwhy\b|\broot[ -]?cause\b|\bwhat (?:caused|happened|broke|is wrong|'s wrong)\b|\brca\b"
    r"|\bcrash ?loop|\bfailing\b|\bfails?\b|\bfailed\b|\bdown\b|\boutage\b|\berrors?\b|\b5\d\d\b"
    r"|\boom(?:killed)?\b|\bimagepullbackoff\b|\bnot (?:ready|responding|working|starting)\b"
    r"|\bslow\b|\blatency\b|\btim(?:ing|ed) out\b|\btimeouts?\b|\bstuck\b|\bbroken\b|\bpaging\b",
    re.IGNORECASE,
)
_CHANGE = re.compile(
    r"\brollouts?\b|\broll(?:ed|ing)? (?:out|back)\b|\bdeploy(?:s|ed|ing|ment)?\b|\brelease[sd]?\b"
    r"|\bdiff\b|\bwhat changed\b|\bchanges?\b|\bupgrade[sd]?\b|\bhelm\b|\brevisions?\b",
    re.IGNORECASE,
)

_ASK = r"^\s*(?:please\s+|pls\s+|can you\s+|could you\s+)?"
_POSTMORTEM = re.compile(
    _ASK + r"(?:post-?mortem|incident report|retro(?:spective)?)\b"
    r"|\b(?:draft|write|prepare|create|start)\s+(?:a\s+|the\s+|an\s+)?"
    r"(?:post-?mortem|incident report|retro(?:spective)?)\b",
    re.IGNORECASE,
)
_SUMMARY = re.compile(
    # the whole ask is a catch-up ("summary", "tl;dr?", "recap of this thread", "summary <link>"),
    # or it names the thread: "summarise the alert" is not a catch-up of the thread
    _ASK + r"(?:summari[sz]e|summary|recap|tl;?\s?dr|catch\s+(?:me\s+|us\s+)?up)"
    r"(?:\s+(?:of\s+)?(?:this|the)\s+(?:thread|incident|discussion|conversation|channel))?"
    r"\s*(?:[?.!:]|<?https?://\S+>?)?\s*$"
    r"|\b(?:summari[sz]e|recap)\s+(?:this|the)\s+(?:thread|incident|discussion|conversation)\b"
    r"|\bcatch\s+(?:me|us)\s+up\b",
    re.IGNORECASE,
)

SCENARIO_RULES: tuple[tuple[str, str], ...] = (
    ("forced by the adapter (alerts, /rca summary ...)", "the forced scenario"),
    ("an Alertmanager notification", ALERT_SUMMARY),
    ("asks for a postmortem draft ('/rca postmortem', 'draft a postmortem')", POSTMORTEM),
    ("asks to catch up on the thread ('/rca summary', 'summarize', 'catch me up')", THREAD_SUMMARY),
    ("asks to review a change ('review the rollout', 'safe to deploy?')", CHANGE_REVIEW),
    ("asks why / for a cause, or names a failure ('why', 'root cause', 'failing', '503')", ROOT_CAUSE),
    ("mentions a change ('rollout', 'deploy', 'what changed')", CHANGE_REVIEW),
    ("a /rca command", ROOT_CAUSE),
    ("anything else", CHAT),
)
"""The scenario rules in the order :func:`pick_scenario` applies them (for help texts)."""


def pick_scenario(message: IncomingMessage) -> str:
    """The scenario of ``message``, by :data:`SCENARIO_RULES` (first match wins)."""
    if message.scenario:
        return message.scenario
    if message.kind is MessageKind.ALERT:
        return ALERT_SUMMARY
    text = message.text
    if _POSTMORTEM.search(text):
        return POSTMORTEM
    if _SUMMARY.search(text):
        return THREAD_SUMMARY
    if _REVIEW_REQUEST.search(text):
        return CHANGE_REVIEW
    if _CAUSE.search(text):
        return ROOT_CAUSE
    if _CHANGE.search(text):
        return CHANGE_REVIEW
    if message.kind is MessageKind.COMMAND:
        return ROOT_CAUSE
    return CHAT


_BY_KIND: dict[MessageKind, Lane] = {
    MessageKind.ALERT: Lane.URGENT,
    MessageKind.COMMAND: Lane.URGENT,
    MessageKind.MENTION: Lane.NORMAL,
    MessageKind.DIRECT: Lane.NORMAL,
    MessageKind.FOLLOWUP: Lane.BACKGROUND,
    MessageKind.BATCH: Lane.BACKGROUND,
}

LANES: dict[MessageKind, dict[str, Lane]] = {
    kind: {
        **dict.fromkeys((ALERT_SUMMARY, ROOT_CAUSE, CHANGE_REVIEW, TIMELINE, CHAT, THREAD_SUMMARY), lane),
        # A postmortem is written after the fire: never ahead of live incident work.
        POSTMORTEM: Lane.NORMAL if kind is MessageKind.COMMAND else Lane.BACKGROUND,
    }
    for kind, lane in _BY_KIND.items()
}
"""Lane per (message kind, scenario). Mostly the kind decides (who is waiting, and how urgently):
someone catching up on an incident waits like any asker. A postmortem draft is long and not
urgent: ``/rca postmortem`` is normal, any other ask background."""


BATCH_SCENARIO = "batch"
"""The scenario request rows of batch-analysis items are filed under (``opsbot stats`` shows them
apart); each item is sampled with its analysis scenario's preset and admitted by :data:`LANES`'
batch row."""


def pick_lane(message: IncomingMessage, scenario: str | None = None) -> Lane:
    """The lane of ``message`` answered as ``scenario`` (default: :func:`pick_scenario`'s), from
    :data:`LANES`; a scenario the table does not list goes by the message's kind."""
    return lane_for(message.kind, scenario or pick_scenario(message))


def lane_for(kind: MessageKind, scenario: str) -> Lane:
    """The lane of work of ``kind`` answered as ``scenario``, from :data:`LANES` (a scenario the table
    does not list goes by the kind)."""
    return LANES[kind].get(scenario, _BY_KIND[kind])


def lane_table_markdown() -> str:
    """:data:`LANES` as a Markdown table (``/rca help`` and the README show it)."""
    scenarios = list(next(iter(LANES.values())))
    rows = [
        "| asked by | " + " | ".join(f"`{s}`" for s in scenarios) + " |",
        "|---" * (len(scenarios) + 1) + "|",
    ]
    names = {
        MessageKind.ALERT: "Alertmanager notification",
        MessageKind.COMMAND: "`/rca` command",
        MessageKind.MENTION: "@-mention",
        MessageKind.DIRECT: "direct message",
        MessageKind.FOLLOWUP: "thread follow-up",
        MessageKind.BATCH: "batch analysis (`opsbot analyze`, `POST /analyze`)",
    }
    for kind, lanes in LANES.items():
        rows.append(f"| {names[kind]} | " + " | ".join(lanes[s].value for s in scenarios) + " |")
    return "\n".join(rows)
