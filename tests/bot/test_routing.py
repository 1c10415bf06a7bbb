"""Scenario and lane are decided once (bot/routing.py): a table of real questions."""

from __future__ import annotations

import pytest

from bot.routing import LANES, lane_table_markdown, pick_lane, pick_scenario
from bot.types import IncomingMessage, MessageKind
from inference.engine import Lane


def msg(text: str, kind: MessageKind = MessageKind.MENTION, scenario: str | None = None) -> IncomingMessage:
    return IncomingMessage(
        platform="p", event_id="e", channel="c", user="u", text=text, kind=kind, scenario=scenario
    )


QUESTIONS = [
    # a *why* question is a root-cause question, even when it names a deploy
    ("why is checkout-api returning 503s since the last deploy?", "root_cause"),
    ("Why did payments-db fail over at 03:10?", "root_cause"),
    ("what caused the spike in 5xx on the ingress?", "root_cause"),
    ("api-gateway is crashlooping in production, root cause?", "root_cause"),
    ("which pods are failing in production?", "root_cause"),
    ("orders-worker keeps getting OOMKilled", "root_cause"),
    ("image pull errors on the new nodes: ImagePullBackOff everywhere", "root_cause"),
    ("search is slow for EU users", "root_cause"),
    ("the rollout of cart-service is stuck at 2/5 pods", "root_cause"),
    # an explicit request to review a change is a change review
    ("please review the rollout of payments-api v2.3.1", "change_review"),
    ("review this deploy: helm upgrade of ingress-nginx to 4.11", "change_review"),
    ("is it safe to deploy billing v5 now?", "change_review"),
    ("what changed in the payments namespace in the last hour?", "change_review"),
    ("show me the last rollouts of checkout", "change_review"),
    ("which revision of api-gateway is live?", "change_review"),
    # a catch-up on the thread, and a postmortem draft
    ("summarize", "thread_summary"),
    ("can you summarise this thread for the new on-call?", "thread_summary"),
    ("catch me up: what happened with payments-db?", "thread_summary"),
    ("tl;dr?", "thread_summary"),
    ("postmortem", "postmortem"),
    ("please draft a postmortem for this outage", "postmortem"),
    ("write the incident report", "postmortem"),
    ("summary https://chat.example.com/ops/pl/abc", "thread_summary"),
    ("why is the summary job failing?", "root_cause"),  # "summary" as a word is not a catch-up
    ("summarise the alert", "chat"),  # about the alert, not a catch-up of the thread
    # everything else is a conversation
    ("hello opsbot", "chat"),
    ("how many replicas does api-gateway run?", "chat"),
    ("thanks, that helped", "chat"),
]


@pytest.mark.parametrize(("text", "scenario"), QUESTIONS)
def test_real_questions_get_the_scenario_an_engineer_means(text: str, scenario: str) -> None:
    assert pick_scenario(msg(text)) == scenario


def test_kind_and_forced_scenarios_come_first() -> None:
    assert pick_scenario(msg("anything", MessageKind.ALERT)) == "alert_summary"
    assert pick_scenario(msg("please review the rollout", scenario="root_cause")) == "root_cause"
    assert pick_scenario(msg("db", MessageKind.COMMAND)) == "root_cause"  # a bare /rca topic
    assert pick_scenario(msg("review the deploy of api", MessageKind.COMMAND)) == "change_review"


def test_the_lane_table_covers_every_kind_and_scenario_and_is_what_help_shows() -> None:
    for kind in MessageKind:
        assert set(LANES[kind]) == {
            "alert_summary",
            "root_cause",
            "change_review",
            "timeline",
            "chat",
            "thread_summary",
            "postmortem",
        }
    assert pick_lane(msg("why?", MessageKind.COMMAND)) is Lane.URGENT
    assert pick_lane(msg("why?", MessageKind.ALERT)) is Lane.URGENT
    assert pick_lane(msg("why?", MessageKind.MENTION)) is Lane.NORMAL
    assert pick_lane(msg("why?", MessageKind.DIRECT)) is Lane.NORMAL
    assert pick_lane(msg("why?", MessageKind.FOLLOWUP)) is Lane.BACKGROUND
    assert all(lane is Lane.BACKGROUND for lane in LANES[MessageKind.BATCH].values())
    # Someone catching up waits like any asker; a postmortem never goes ahead of live incidents.
    assert pick_lane(msg("summary", MessageKind.COMMAND)) is Lane.URGENT
    assert pick_lane(msg("summarize", MessageKind.MENTION)) is Lane.NORMAL
    assert pick_lane(msg("postmortem", MessageKind.COMMAND)) is Lane.NORMAL
    assert pick_lane(msg("draft a postmortem", MessageKind.MENTION)) is Lane.BACKGROUND
    table = lane_table_markdown()
    assert "| `/rca` command | urgent | urgent | urgent | urgent | urgent | urgent | normal |" in table
    assert "| thread follow-up | background |" in table
    assert "| batch analysis (`opsbot analyze`, `POST /analyze`) | background |" in table
