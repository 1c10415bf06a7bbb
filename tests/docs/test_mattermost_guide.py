"""docs/mattermost.md names only settings opsbot reads and the paths it really serves."""

from __future__ import annotations

import re
from pathlib import Path

from bot.adapters.mattermost import ACTIONS_PATH, COMMAND_PATH
from bot.config import MattermostSettings

GUIDE = (Path(__file__).resolve().parents[2] / "docs" / "mattermost.md").read_text()


def test_every_environment_variable_in_the_guide_is_a_mattermost_setting() -> None:
    named = set(re.findall(r"OPSBOT_MATTERMOST__([A-Z_]+)", GUIDE))
    assert {"ENABLED", "URL", "TOKEN", "SLASH_COMMAND_TOKEN", "PUBLIC_URL", "ACTION_SECRET"} <= named
    for field in named:
        assert field.lower() in MattermostSettings.model_fields, f"docs/mattermost.md names {field}"


def test_every_toml_key_in_the_guide_is_a_mattermost_setting() -> None:
    (block,) = re.findall(r"```toml\n\[mattermost\]\n(.*?)```", GUIDE, re.S)
    for key in re.findall(r"^(\w+) =", block, re.M):
        assert key in MattermostSettings.model_fields


def test_the_slash_command_url_is_the_path_opsbot_serves() -> None:
    assert f"https://opsbot.example.com{COMMAND_PATH}`" in GUIDE
    # the buttons post to public_url + ACTIONS_PATH; the guide tells people to make that reachable
    assert ACTIONS_PATH.startswith("/mattermost/") and "public_url" in GUIDE


def test_the_url_setting_is_described_as_the_host_alone() -> None:
    # opsbot builds scheme://url:port/basepath itself; a URL with a scheme would break every call
    assert "host only, no https://" in GUIDE
    assert MattermostSettings.model_fields["url"].description.startswith("Server host name (no scheme)")
