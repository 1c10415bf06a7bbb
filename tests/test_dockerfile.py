"""The Dockerfile's contract (Docker cannot build here, so it is read and checked)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bot.config import load_settings

DOCKERFILE = Path(__file__).resolve().parents[1] / "Dockerfile"


@pytest.fixture(scope="module")
def text() -> str:
    return DOCKERFILE.read_text()


def instructions(text: str, name: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", text)
    return [line.split(None, 1)[1] for line in joined.splitlines() if line.upper().startswith(name + " ")]


def test_base_image_is_cuda_capable(text: str) -> None:
    (base,) = instructions(text, "FROM")
    assert "nvidia/cuda" in base


def test_installs_the_vllm_extra(text: str) -> None:
    assert any(".[vllm]" in run for run in instructions(text, "RUN"))


def test_runs_as_a_non_root_user(text: str) -> None:
    users = instructions(text, "USER")
    assert users and users[-1].strip() not in ("root", "0")


def test_exposes_the_http_port_it_configures(text: str) -> None:
    (port,) = instructions(text, "EXPOSE")
    assert f"OPSBOT_HTTP__PORT={port.strip()}" in text


def test_healthcheck_probes_healthz(text: str) -> None:
    (check,) = instructions(text, "HEALTHCHECK")
    assert "/healthz" in check


def test_model_and_database_come_from_environment_variables_opsbot_understands(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    envs = dict(re.findall(r"(OPSBOT_[A-Z_]+)=(\S+)", re.sub(r"\\\n", " ", text)))
    assert "OPSBOT_ENGINE__MODEL" in envs and "OPSBOT_STORE__URL" in envs
    monkeypatch.delenv("OPSBOT_CONFIG", raising=False)
    for key, value in envs.items():
        monkeypatch.setenv(key, value)
    settings = load_settings()
    assert settings.engine.model == envs["OPSBOT_ENGINE__MODEL"]
    assert settings.store_url == envs["OPSBOT_STORE__URL"]


def test_entrypoint_runs_the_bot(text: str) -> None:
    assert '"opsbot"' in instructions(text, "ENTRYPOINT")[0]
    assert '"run"' in instructions(text, "CMD")[0]
