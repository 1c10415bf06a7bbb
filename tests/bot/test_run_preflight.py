"""``opsbot run`` finds what a user can get wrong before the model loads: a taken HTTP port, a Slack
or Mattermost token the platform refuses. Each fails in one line naming the key and the fix.

The model is set to a path that does not exist: had the engine started first, the error would be
about the model. The platforms are the fake Slack and Mattermost servers (tests/fakes), which
refuse a token they did not issue as the real ones do (``invalid_auth``, HTTP 401).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
from pathlib import Path

from fakes.mattermost_server import FakeMattermost
from fakes.slack_server import FakeSlack

REPO = Path(__file__).resolve().parents[2]


async def run_opsbot(tmp_path: Path, env: dict[str, str]) -> tuple[int, str]:
    """``opsbot run`` as a process (the test's event loop keeps serving the fakes meanwhile)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    base.update(
        {
            "XDG_DATA_HOME": str(tmp_path / "xdg"),
            "PYTHONPATH": str(REPO),
            "NO_COLOR": "1",
            "COLUMNS": "300",
            "OPSBOT_ENGINE__MODEL": str(tmp_path / "no-such-model.gguf"),
            "OPSBOT_HTTP__HOST": "127.0.0.1",
            "OPSBOT_HTTP__PORT": "0",
            **env,
        }
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot.cli",
        "run",
        cwd=tmp_path,
        env=base,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 120)
    return proc.returncode or 0, err.decode()


def error_line(stderr: str) -> str:
    (line,) = [x for x in stderr.splitlines() if x.startswith("opsbot: error:")]
    assert "Traceback" not in stderr and "no-such-model" not in stderr
    return line


async def test_a_taken_http_port_fails_before_the_model_loads(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        code, stderr = await run_opsbot(tmp_path, {"OPSBOT_HTTP__PORT": str(port)})
    assert code == 1
    line = error_line(stderr)
    assert f"http.port {port} on 127.0.0.1 cannot be bound" in line and "OPSBOT_HTTP__PORT" in line


async def test_a_refused_slack_bot_token_fails_before_the_model_loads(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        code, stderr = await run_opsbot(
            tmp_path,
            {
                "OPSBOT_SLACK__ENABLED": "true",
                "OPSBOT_SLACK__BOT_TOKEN": "xoxb-not-the-bot-token",
                "OPSBOT_SLACK__APP_TOKEN": slack.app_token,
                "OPSBOT_SLACK__API_BASE_URL": slack.api_url,
            },
        )
        called = [c.method for c in slack.calls]
    assert code == 1
    line = error_line(stderr)
    assert "slack.bot_token (OPSBOT_SLACK__BOT_TOKEN) was refused by Slack's auth.test" in line
    assert "invalid_auth" in line and "Fix:" in line
    assert called == ["auth.test"]


async def test_a_refused_slack_app_token_is_named_as_the_app_token(tmp_path: Path) -> None:
    async with FakeSlack() as slack:
        code, stderr = await run_opsbot(
            tmp_path,
            {
                "OPSBOT_SLACK__ENABLED": "true",
                "OPSBOT_SLACK__BOT_TOKEN": slack.bot_token,
                "OPSBOT_SLACK__APP_TOKEN": "xapp-1-not-the-app-token",
                "OPSBOT_SLACK__API_BASE_URL": slack.api_url,
            },
        )
    assert code == 1
    assert "slack.app_token (OPSBOT_SLACK__APP_TOKEN) was refused by Slack's apps.connections.open" in (
        error_line(stderr)
    )


async def test_a_refused_mattermost_token_fails_before_the_model_loads(tmp_path: Path) -> None:
    async with FakeMattermost() as mm:
        code, stderr = await run_opsbot(
            tmp_path,
            {
                "OPSBOT_MATTERMOST__ENABLED": "true",
                "OPSBOT_MATTERMOST__URL": mm.host,
                "OPSBOT_MATTERMOST__SCHEME": "http",
                "OPSBOT_MATTERMOST__PORT": str(mm.port),
                "OPSBOT_MATTERMOST__TOKEN": "not-the-bot-token",
            },
        )
    assert code == 1
    line = error_line(stderr)
    assert "mattermost.token (OPSBOT_MATTERMOST__TOKEN) was refused by http://127.0.0.1:" in line
    assert "Fix:" in line
