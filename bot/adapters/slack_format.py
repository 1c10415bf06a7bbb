"""Model Markdown -> Slack mrkdwn, and the Block Kit of a finished answer.

Slack's mrkdwn is not Markdown: ``*bold*``, ``_italic_``, ``~strike~``, ``<url|text>`` links,
no headings, and ``&``, ``<``, ``>`` must be escaped as HTML entities outside of link syntax.
Code (fenced and inline) is kept verbatim apart from that escaping. A single ``*x*`` is left alone:
it is Markdown italic but also how our own notices (and Slack) write bold, so it stays bold.
"""

from __future__ import annotations

import re
from typing import Any

from bot.adapters.streaming import format_footer_line
from bot.types import FinalAnswer

SECTION_TEXT_LIMIT = 3000
"""Characters in one section block's text."""
MESSAGE_TEXT_LIMIT = 40_000
"""Characters in a message's top-level ``text``."""
MAX_BLOCKS = 50
"""Blocks in one message."""
CONTEXT_TEXT_LIMIT = 2000
"""Characters in one context block element (kept well under Slack's limit)."""

FEEDBACK_UP = "opsbot_feedback_up"
FEEDBACK_DOWN = "opsbot_feedback_down"
"""``action_id`` prefixes of the 👍 / 👎 buttons; the request id follows after a ``:``."""

_FENCE = re.compile(r"^(\s*)```\s*([\w+-]*)\s*$")
_INLINE_CODE = re.compile(r"(`[^`\n]+`)")
_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s]+|mailto:[^)\s]+)\)")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_STRIKE = re.compile(r"~~(?=\S)(.+?)(?<=\S)~~")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.+?)\s*#*\s*$")
_BULLET = re.compile(r"^(\s*)[-*+]\s+(.*)$")
_RULE = re.compile(r"^\s{0,3}([-*_])(\s*\1){2,}\s*$")
_BOLD_MARK = "\x00B\x00"


def escape(text: str) -> str:
    """Escape the three characters Slack treats as control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def markdown_to_mrkdwn(text: str) -> str:
    """Convert the model's Markdown to Slack mrkdwn (code blocks, bold, lists, links, escaping)."""
    out: list[str] = []
    in_code = False
    for line in text.split("\n"):
        fence = _FENCE.match(line)
        if fence:
            # Slack ignores the language tag and would print it as code: drop it
            out.append("```")
            in_code = not in_code
            continue
        if in_code:
            out.append(escape(line))
            continue
        out.append(_inline_line(line))
    return "\n".join(out)


def _inline_line(line: str) -> str:
    if _RULE.match(line):
        return "―――"
    heading = _HEADING.match(line)
    if heading:
        return f"*{_inline(heading.group(1))}*"
    bullet = _BULLET.match(line)
    if bullet:
        indent = "    " * (len(bullet.group(1).expandtabs(4)) // 2)
        return f"{indent}• {_inline(bullet.group(2))}"
    if line.lstrip().startswith(">"):
        # a Markdown quote is also a Slack quote: keep the marker unescaped
        stripped = line.lstrip()[1:].lstrip()
        return "> " + _inline(stripped)
    return _inline(line)


def _inline(text: str) -> str:
    # inline code is verbatim (escaped only); everything between is formatted
    parts = _INLINE_CODE.split(text)
    return "".join(escape(p) if i % 2 else _format_span(p) for i, p in enumerate(parts))


def _format_span(text: str) -> str:
    links: list[str] = []

    def _link(m: re.Match[str]) -> str:
        # inside <...> Slack still wants & escaped; | and > would end the link early
        url = m.group(2).replace("&", "&amp;").replace("|", "%7C").replace(">", "%3E").replace("<", "%3C")
        links.append(f"<{url}|{escape(m.group(1)).replace('|', '¦')}>")
        return f"\x00L{len(links) - 1}\x00"

    text = _LINK.sub(_link, text)
    text = escape(text)
    text = _BOLD.sub(lambda m: f"{_BOLD_MARK}{m.group(1) or m.group(2)}{_BOLD_MARK}", text)
    text = _STRIKE.sub(r"~\1~", text)
    text = text.replace(_BOLD_MARK, "*")
    return re.sub(r"\x00L(\d+)\x00", lambda m: links[int(m.group(1))], text)


def text_sections(mrkdwn: str) -> list[dict[str, Any]]:
    """Section blocks for ``mrkdwn`` (each at most :data:`SECTION_TEXT_LIMIT` characters)."""
    from bot.adapters.streaming import split_text

    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": piece}}
        for piece in split_text(mrkdwn, SECTION_TEXT_LIMIT)
        if piece.strip()
    ]


def footer_blocks(answer: FinalAnswer) -> list[dict[str, Any]]:
    """Context block (sources, left out, timings) and, unless turned off, 👍 / 👎 buttons."""
    blocks: list[dict[str, Any]] = [
        {
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": escape(format_footer_line(answer))[:CONTEXT_TEXT_LIMIT]}],
        }
    ]
    if answer.feedback and answer.error is None:
        blocks.append(
            {
                "type": "actions",
                "block_id": "feedback",
                "elements": [
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "👍", "emoji": True},
                        "action_id": f"{FEEDBACK_UP}:{answer.request_id}",
                        "value": "1",
                    },
                    {
                        "type": "button",
                        "text": {"type": "plain_text", "text": "👎", "emoji": True},
                        "action_id": f"{FEEDBACK_DOWN}:{answer.request_id}",
                        "value": "-1",
                    },
                ],
            }
        )
    return blocks


def answer_blocks(mrkdwn: str, answer: FinalAnswer | None) -> list[dict[str, Any]]:
    """Blocks of one message of an answer; ``answer`` set: it is the last one and gets the footer."""
    blocks = text_sections(mrkdwn)
    if answer is not None:
        blocks += footer_blocks(answer)
    return blocks[:MAX_BLOCKS]


def fallback_text(mrkdwn: str) -> str:
    """Top-level ``text`` (notifications, screen readers), within Slack's limit."""
    if len(mrkdwn) <= MESSAGE_TEXT_LIMIT:
        return mrkdwn
    return mrkdwn[: MESSAGE_TEXT_LIMIT - 1] + "…"
