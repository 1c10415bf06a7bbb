"""A new user's first hour with the ``opsbot`` command (issue 39): flags anywhere, ``config show`` as
TOML that says where each value came from, errors that point at the place to fix, ``postgres://``
accepted, and ``chat --demo`` answering a built-in incident from its sources with a quiet screen.
Each runs the command as a user does: a real process, real files."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, run


def test_debug_version_and_config_are_understood_anywhere_on_the_line(tmp_path: Path) -> None:
    (tmp_path / "mine.toml").write_text('log_level = "WARNING"\n')
    for args in (["--version"], ["stats", "--version"], ["config", "show", "--version"]):
        proc = run(args, tmp_path)
        assert proc.returncode == 0 and proc.stdout.startswith("opsbot "), args
    for args in (
        ["--config", "mine.toml", "config", "show"],
        ["config", "show", "--config", "mine.toml"],
        ["config", "--config=mine.toml", "show", "--debug"],
    ):
        proc = run(args, tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert 'log_level = "WARNING"  # file mine.toml' in proc.stdout, args
    assert_one_line_error(run(["chat", "--config", "nowhere.toml"], tmp_path), "--config nowhere.toml")


def test_config_show_is_valid_toml_that_says_where_each_value_came_from(tmp_path: Path) -> None:
    (tmp_path / "opsbot.toml").write_text("[engine]\nmax_model_len = 2048\n[prompt]\ncontext_share = 0.4\n")
    proc = run(
        ["config", "show"],
        tmp_path,
        env={"OPSBOT_LOG_LEVEL": "DEBUG", "OPSBOT_SLACK__BOT_TOKEN": "xoxb-secret-value"},
    )
    assert proc.returncode == 0, proc.stderr
    data = tomllib.loads(proc.stdout)  # valid TOML, every section a table
    assert data["engine"]["max_model_len"] == 2048 and data["log_level"] == "DEBUG"
    assert data["slack"]["bot_token"] == "**********" and "secret-value" not in proc.stdout
    lines = proc.stdout.splitlines()
    assert "max_model_len = 2048  # file opsbot.toml" in lines
    assert "context_share = 0.4  # file opsbot.toml" in lines
    assert 'log_level = "DEBUG"  # env OPSBOT_LOG_LEVEL' in lines
    assert "max_num_seqs = 64  # default" in lines
    assert "# model is unset  # default" in lines  # TOML has no null: unset values are comments
    (model,) = [line for line in lines if line.startswith("# model that will load:")]
    assert "SmolLM2-135M-Instruct" in model and "toy" in model and "engine.model" in model
    assert all(len(line) < 400 or line.startswith("#") or "[" in line for line in lines)


def test_an_env_var_typo_points_at_the_env_var_and_its_right_name(tmp_path: Path) -> None:
    proc = run(["config", "show"], tmp_path, env={"OPSBOT_ENGINE__MODLE": "/models/x.gguf"})
    assert_one_line_error(proc, "OPSBOT_ENGINE__MODLE", "did you mean OPSBOT_ENGINE__MODEL?")
    assert "opsbot.toml" not in proc.stderr
    # A misspelt top-level variable would be silently ignored: it is named, with the real one.
    proc = run(["config", "show"], tmp_path, env={"OPSBOT_LOGLEVEL": "DEBUG"})
    assert proc.returncode == 0
    assert "OPSBOT_LOGLEVEL is no opsbot setting" in proc.stderr and "OPSBOT_LOG_LEVEL" in proc.stderr
    # A bad value from the environment names that variable as the place to fix it.
    proc = run(["config", "show"], tmp_path, env={"OPSBOT_HTTP__PORT": "eighty"})
    assert_one_line_error(proc, "http.port (from OPSBOT_HTTP__PORT)", "correct the environment variable")


def test_a_file_typo_points_at_the_file_and_its_right_name(tmp_path: Path) -> None:
    (tmp_path / "opsbot.toml").write_text("[engine]\nmodle = 'x'\n")
    proc = run(["config", "show"], tmp_path)
    assert_one_line_error(proc, "engine.modle in opsbot.toml", "did you mean engine.model?")


def test_a_postgres_url_without_a_driver_is_taken_with_asyncpg_and_said_so(tmp_path: Path) -> None:
    proc = run(["config", "show"], tmp_path, env={"OPSBOT_STORE__URL": "postgres://ops:pw@db.example/opsbot"})
    assert proc.returncode == 0, proc.stderr
    assert tomllib.loads(proc.stdout)["store"]["url"] == "postgresql+asyncpg://ops:***@db.example/opsbot"
    assert "postgres://... has no async driver: using postgresql+asyncpg://" in proc.stderr


@pytest.mark.slow
def test_chat_demo_answers_a_built_in_incident_from_its_sources_on_a_quiet_screen(
    tmp_path: Path, smollm2_gguf: Path
) -> None:
    env = {
        "OPSBOT_ENGINE__MODEL": str(smollm2_gguf),
        "OPSBOT_SCENARIOS": json.dumps({name: {"max_tokens": 48} for name in ("root_cause", "chat")}),
    }
    proc = run(["chat", "--demo"], tmp_path, env=env, stdin="/quit\n", timeout=400)
    assert proc.returncode == 0, proc.stderr
    # The banner: the model named as the toy it is, each source and its health check, the log.
    assert (
        "SmolLM2-135M-Instruct.Q8_0.gguf on llamacpp" in proc.stderr and "135M-parameter toy" in proc.stderr
    )
    assert "sources: Kubernetes ✓ answered (http://127.0.0.1:" in proc.stderr
    assert "Prometheus ✓ answered (http://127.0.0.1:" in proc.stderr
    assert "demo incident: A batch worker is OOMKilled" in proc.stderr
    # The case's question is asked at once, and answered from the served cluster.
    assert "opsbot> why does worker-6d5f7c9b8-kq2lp in payments keep restarting?" in proc.stdout
    assert "context: Kubernetes ✓ · Prometheus ✓" in proc.stdout
    assert "sources: Kubernetes, Prometheus" in proc.stdout and "first token" in proc.stdout
    # The demo investigates (the root-cause block under the answer; each tool call a live line and
    # a legend entry; the toy may also answer at once, as the served case's clock moves its prompt),
    # and its step 0 is the context the answer would have without the loop: the OOM's log lines are
    # not left out.
    assert "Root cause" in proc.stdout
    if "Steps: [0] gathered context" in proc.stdout:
        assert proc.stdout.count("[1] `") >= 2  # its live line, then the legend
    assert "previous container" not in proc.stdout.partition("left out:")[2]
    # No log line on the screen, no fence markup in the answer; the log is in its file.
    screen = proc.stdout + proc.stderr
    assert " INFO " not in screen and " WARNING " not in screen and "<<<" not in proc.stdout
    assert "bot.pipeline" in (tmp_path / "xdg" / "opsbot" / "opsbot-chat.log").read_text()


def test_an_unknown_demo_case_names_the_ones_there_are(tmp_path: Path) -> None:
    proc = run(["chat", "--demo", "no-such-case"], tmp_path)
    assert proc.returncode == 2
    assert "--demo no-such-case: no such built-in case" in proc.stderr and "oom-worker" in proc.stderr


def test_a_scenario_field_from_the_environment_is_typed_or_named_at_load(tmp_path: Path) -> None:
    from inference.scenarios import ScenarioRegistry

    assert ScenarioRegistry({"chat": {"max_tokens": "48", "stop": '["\\n\\n"]'}}).get("chat").max_tokens == 48
    proc = run(["config", "show"], tmp_path, env={"OPSBOT_SCENARIOS__ROOT_CAUSE__MAX_TOKENS": "lots"})
    assert_one_line_error(proc, "scenarios.root_cause.max_tokens: 'lots' is not a whole number")
