"""``[engines.NAME]`` and ``[scenarios.X] engine``: read from a real opsbot.toml, checked at load with
one-line errors (unknown engines, the reserved name, GPU memory fractions per GPU)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bot.config import ConfigError, load_settings
from inference.scenarios import ScenarioRegistry

TOML = """
[engine]
backend = "vllm"
model = "/models/fp8"
gpu_memory_utilization = 0.55

[engines.int4]
backend = "vllm"
model = "/models/awq"
quantization = "awq"
gpu_memory_utilization = 0.35
max_model_len = 2048

[scenarios.alert_summary]
engine = "int4"
max_tokens = 96

[scenarios.root_cause]
max_tokens = 768
"""


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in list(os.environ):
        if name.startswith("OPSBOT_"):
            monkeypatch.delenv(name)
    path = tmp_path / "opsbot.toml"
    monkeypatch.setenv("OPSBOT_CONFIG", str(path))
    return path


def test_engine_blocks_and_scenario_engines_are_read_from_the_toml_file(config_file: Path) -> None:
    config_file.write_text(TOML)
    settings = load_settings()
    engines = settings.engine_configs()
    assert list(engines) == ["default", "int4"]
    assert engines["int4"].quantization == "awq" and engines["int4"].max_model_len == 2048
    assert engines["default"].model == "/models/fp8"
    assert settings.scenario_engines() == {"alert_summary": "int4"}
    # The engine key is routing, not sampling: the registry gets the sampling fields only.
    registry = ScenarioRegistry(settings.sampling_overrides())
    assert registry.get("alert_summary").max_tokens == 96
    assert registry.get("root_cause").max_tokens == 768


def test_a_scenario_naming_an_engine_that_does_not_exist_is_a_config_error(config_file: Path) -> None:
    config_file.write_text(TOML.replace('engine = "int4"', 'engine = "int8"'))
    with pytest.raises(ConfigError) as info:
        load_settings()
    message = str(info.value)
    assert "scenarios.alert_summary.engine: no engine named 'int8' (known: default, int4)" in message
    assert "[engines.int8]" in message and "\n" not in message


def test_memory_fractions_over_095_on_one_gpu_are_a_config_error(config_file: Path) -> None:
    config_file.write_text(TOML.replace("gpu_memory_utilization = 0.35", "gpu_memory_utilization = 0.45"))
    with pytest.raises(ConfigError, match=r"engines sharing GPU 0 ask for 1 of its memory together "):
        load_settings()
    # 0.55 + 0.40 = 0.95: the most that may be shared.
    config_file.write_text(TOML.replace("gpu_memory_utilization = 0.35", "gpu_memory_utilization = 0.40"))
    assert load_settings().engines["int4"].gpu_memory_utilization == 0.40


def test_fractions_are_summed_per_gpu_a_tensor_parallel_engine_spanning_gpus_from_0(
    config_file: Path,
) -> None:
    # default on GPUs 0-1 at 0.55, int4 on GPU 0 at 0.35, a third on GPU 0 at 0.1: GPU 0 holds 1.0.
    extra = '\n[engines.small]\nbackend = "vllm"\nmodel = "/m"\ngpu_memory_utilization = 0.1\n'
    config_file.write_text(
        TOML.replace(
            "gpu_memory_utilization = 0.55", "gpu_memory_utilization = 0.55\ntensor_parallel_size = 2"
        )
        + extra
    )
    with pytest.raises(ConfigError, match=r"sharing GPU 0 ask for 1 .*default 0\.55, int4 0\.35, small 0\.1"):
        load_settings()
    # Only the default spans GPU 1, so a large share there alone is fine; GPU 0 is what counts.
    config_file.write_text(
        TOML.replace(
            "gpu_memory_utilization = 0.55", "gpu_memory_utilization = 0.6\ntensor_parallel_size = 2"
        )
    )
    assert load_settings().engine.tensor_parallel_size == 2


def test_cpu_and_remote_engines_hold_no_gpu_memory(config_file: Path) -> None:
    config_file.write_text(
        TOML.replace(
            'backend = "vllm"\nmodel = "/models/awq"', 'backend = "cpu"\nmodel = "/models/awq"'
        ).replace("gpu_memory_utilization = 0.35", "gpu_memory_utilization = 0.9")
    )
    assert load_settings().engines["int4"].backend == "cpu"


def test_the_name_default_is_the_engine_section_and_cannot_be_a_block(config_file: Path) -> None:
    config_file.write_text(TOML + '\n[engines.default]\nbackend = "cpu"\n')
    with pytest.raises(
        ConfigError, match=r"\[engines.default\]: the name 'default' is the \[engine\] section"
    ):
        load_settings()


def test_an_engine_block_is_a_full_engine_configuration_with_its_own_checks(config_file: Path) -> None:
    config_file.write_text(TOML.replace('quantization = "awq"', 'quantisation = "awq"'))
    with pytest.raises(ConfigError, match=r"config error at engines\.int4\.quantisation"):
        load_settings()
    config_file.write_text(
        TOML.replace('backend = "vllm"\nmodel = "/models/awq"', 'backend = "openai"\nmodel = "/models/awq"')
    )
    with pytest.raises(ConfigError, match=r"needs engine.base_url"):
        load_settings()
