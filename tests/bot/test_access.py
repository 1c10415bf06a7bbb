"""One access policy for every platform (bot/access.py): channels, users, and DMs as a setting."""

from __future__ import annotations

import pytest

from bot.access import AccessPolicy
from bot.config import MattermostSettings, SlackSettings

PLATFORMS = [("slack", SlackSettings), ("mattermost", MattermostSettings)]


@pytest.mark.parametrize(("platform", "section"), PLATFORMS)
def test_dms_are_the_askers_own_space_by_default_on_every_platform(platform: str, section: type) -> None:
    policy = AccessPolicy(section(allowed_channels=["C-INC"]), platform)
    assert policy.refusal("D-1", "U1", direct=True) is None
    refused = policy.refusal("C-OTHER", "U1", direct=False)
    assert refused is not None and refused.rule == "channel"
    assert f"{platform}.allowed_channels" in refused.text and "not enabled" in refused.text


@pytest.mark.parametrize(("platform", "section"), PLATFORMS)
def test_the_dm_policy_is_one_setting_with_the_same_meaning_everywhere(platform: str, section: type) -> None:
    as_channel = AccessPolicy(section(allowed_channels=["C-INC"], direct_messages="as_channel"), platform)
    refused = as_channel.refusal("D-1", "U1", direct=True)
    assert refused is not None and refused.rule == "channel"
    assert (
        AccessPolicy(section(direct_messages="as_channel"), platform).refusal("D-1", "U1", direct=True)
        is None
    )
    deny = AccessPolicy(section(direct_messages="deny"), platform).refusal("D-1", "U1", direct=True)
    assert deny is not None and deny.rule == "direct_message" and f"{platform}.direct_messages" in deny.text


@pytest.mark.parametrize(("platform", "section"), PLATFORMS)
def test_the_user_list_applies_in_channels_and_dms_alike(platform: str, section: type) -> None:
    policy = AccessPolicy(section(allowed_users=["U-ONCALL"]), platform)
    for channel, direct in (("C-INC", False), ("D-1", True)):
        refused = policy.refusal(channel, "U-INTERN", direct=direct)
        assert refused is not None and refused.rule == "user" and f"{platform}.allowed_users" in refused.text
        assert policy.refusal(channel, "U-ONCALL", direct=direct) is None


def test_the_refusal_texts_differ_only_in_the_platform_name() -> None:
    slack = AccessPolicy(SlackSettings(allowed_channels=["A"]), "slack").refusal("B", "U", direct=False)
    mm = AccessPolicy(MattermostSettings(allowed_channels=["A"]), "mattermost").refusal(
        "B", "U", direct=False
    )
    assert slack is not None and mm is not None
    assert slack.text.replace("slack.", "mattermost.") == mm.text
