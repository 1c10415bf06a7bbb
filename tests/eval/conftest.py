"""Fixtures of the eval tests: an engine config for the tiny offline model and a clean environment."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def tiny_engine_config(tiny_model: Path, tmp_path: Path) -> Path:
    """``--engine-config`` file: the CPU engine on the tiny random-weight model."""
    path = tmp_path / "engine.toml"
    path.write_text(f'[engine]\nbackend = "cpu"\nmodel = "{tiny_model}"\nmax_model_len = 2048\n')
    return path


@pytest.fixture
def eval_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No config file, no OPSBOT_* settings from the caller's shell; data in a temp folder."""
    import os

    for name in list(os.environ):
        if name.startswith("OPSBOT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OPSBOT_CONFIG", "")
    monkeypatch.setenv("OPSBOT_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    return tmp_path
