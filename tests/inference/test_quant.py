"""Quantization detection on model folders the tests write (no torch, no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inference.quant import (
    QuantizationError,
    QuantizationInfo,
    check_gpu_support,
    detect_quantization,
    resolve_quantization,
)


def write_model(tmp_path: Path, config: dict[str, Any], **side_files: dict[str, Any]) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **config}))
    for name, content in side_files.items():
        (folder / f"{name}.json").write_text(json.dumps(content))
    return folder


def test_awq_is_read_from_quantization_config(tmp_path: Path) -> None:
    folder = write_model(
        tmp_path,
        {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}},
    )
    info = detect_quantization(folder)
    assert (info.method, info.bits, info.source) == ("awq", 4, "config.json:quantization_config")
    assert "group size 128" in info.describe()


def test_gptq_is_read_from_an_autogptq_quantize_config_without_quant_method(tmp_path: Path) -> None:
    folder = write_model(
        tmp_path, {"torch_dtype": "float16"}, quantize_config={"bits": 4, "group_size": 128, "desc_act": True}
    )
    info = detect_quantization(folder)
    assert (info.method, info.bits, info.source) == ("gptq", 4, "quantize_config.json")


def test_autoawq_quant_config_with_w_bit_is_awq(tmp_path: Path) -> None:
    folder = write_model(tmp_path, {}, quant_config={"w_bit": 4, "q_group_size": 128, "zero_point": True})
    info = detect_quantization(folder)
    assert (info.method, info.bits, info.source) == ("awq", 4, "quant_config.json")


def test_fp8_checkpoint_is_eight_bit(tmp_path: Path) -> None:
    folder = write_model(
        tmp_path, {"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    )
    info = detect_quantization(folder)
    assert (info.method, info.bits) == ("fp8", 8)


def test_compressed_tensors_bits_come_from_the_weight_config_group(tmp_path: Path) -> None:
    qc = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}, "targets": ["Linear"]}},
    }
    info = detect_quantization(write_model(tmp_path, {"quantization_config": qc}))
    assert (info.method, info.bits) == ("compressed-tensors", 4)
    assert "pack-quantized" in info.detail


@pytest.mark.parametrize(("flag", "bits"), [("load_in_4bit", 4), ("load_in_8bit", 8)])
def test_bitsandbytes_bits_follow_the_load_flag(tmp_path: Path, flag: str, bits: int) -> None:
    folder = write_model(tmp_path, {"quantization_config": {"quant_method": "bitsandbytes", flag: True}})
    info = detect_quantization(folder)
    assert (info.method, info.bits) == ("bitsandbytes", bits)


def test_unquantized_bf16_folder_reports_sixteen_bits_and_no_method(tmp_path: Path) -> None:
    info = detect_quantization(write_model(tmp_path, {"torch_dtype": "bfloat16"}))
    assert info == QuantizationInfo(None, 16, "config.json:torch_dtype", detail="bfloat16")


def test_a_config_without_dtype_is_unquantized_and_refuses_offline_formats(tmp_path: Path) -> None:
    folder = write_model(tmp_path, {"hidden_size": 64})
    info = detect_quantization(folder)
    assert (info.method, info.source) == (None, "config.json")
    with pytest.raises(QuantizationError, match="quantized offline"):
        resolve_quantization(folder, "awq")


def test_a_hub_id_is_unknown_and_an_override_is_trusted() -> None:
    assert detect_quantization("org/model-id").source == "unknown"
    info = resolve_quantization("org/model-id", "awq")
    assert (info.method, info.source) == ("awq", "override")


def test_fp8_override_on_bf16_weights_is_online_quantization(tmp_path: Path) -> None:
    info = resolve_quantization(write_model(tmp_path, {"torch_dtype": "bfloat16"}), "fp8")
    assert (info.method, info.bits, info.online) == ("fp8", 8, True)
    assert "online" in info.describe()


def test_override_naming_a_kernel_of_the_detected_format_is_kept(tmp_path: Path) -> None:
    folder = write_model(tmp_path, {"quantization_config": {"quant_method": "awq", "bits": 4}})
    assert resolve_quantization(folder, "awq_marlin").method == "awq_marlin"
    assert resolve_quantization(folder, None).method == "awq"


def test_override_that_contradicts_the_checkpoint_names_both_and_the_fix(tmp_path: Path) -> None:
    folder = write_model(tmp_path, {"quantization_config": {"quant_method": "awq", "bits": 4}})
    with pytest.raises(QuantizationError, match=r"'gptq'.*awq.*Fix: unset engine.quantization"):
        resolve_quantization(folder, "gptq")


def test_offline_format_requested_on_unquantized_weights_is_refused(tmp_path: Path) -> None:
    folder = write_model(tmp_path, {"torch_dtype": "bfloat16"})
    with pytest.raises(QuantizationError, match="quantized offline"):
        resolve_quantization(folder, "awq")


def test_unreadable_config_is_a_clear_error(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text("{not json")
    with pytest.raises(QuantizationError, match="cannot read"):
        detect_quantization(folder)


def test_gpu_support_refuses_awq_on_an_old_gpu_and_accepts_fp8_on_hopper() -> None:
    awq = QuantizationInfo("awq", 4, "config.json:quantization_config")
    assert check_gpu_support(awq, (7, 0)) is not None
    assert check_gpu_support(QuantizationInfo("fp8", 8, "override", online=True), (9, 0)) is None
    assert check_gpu_support(QuantizationInfo(None, 16, "config.json:torch_dtype"), (6, 0)) is None
