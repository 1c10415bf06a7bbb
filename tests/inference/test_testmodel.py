"""The offline test-model builder: loadable by transformers, a working chat template, reuse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inference.engine import ChatMessage
from inference.testmodel import (
    CHAT_TEMPLATE,
    MARKER_FILE,
    TEST_MODEL_VERSION,
    build_test_model,
    is_test_model,
)
from inference.tokenization import HFChatTokenizer


def test_tiny_model_loads_with_transformers_and_vocab_sizes_agree(tiny_model: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    tok = HFChatTokenizer(str(tiny_model))
    config = json.loads((tiny_model / "config.json").read_text())
    assert config["vocab_size"] == len(tok.hf) == model.get_input_embeddings().weight.shape[0]
    assert config["bos_token_id"] == tok.hf.bos_token_id == 0
    assert config["eos_token_id"] == tok.eos_token_id == tok.hf.convert_tokens_to_ids("<|eot_id|>")
    assert (tiny_model / "model.safetensors").stat().st_size < 10_000_000
    assert (tiny_model / "generation_config.json").is_file()


def test_tiny_model_chat_template_renders_llama3_headers(tiny_model: Path) -> None:
    tok = HFChatTokenizer(str(tiny_model))
    ids = tok.render([ChatMessage("system", "be brief"), ChatMessage("user", "why is the pod down?")])
    text = tok.hf.decode(ids, skip_special_tokens=False)
    assert text == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nwhy is the pod down?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert tok.hf.chat_template == CHAT_TEMPLATE
    assert tok.count("why is the pod down?") > 0
    assert tok.decode(tok.hf.encode("kubectl get pods", add_special_tokens=False)) == "kubectl get pods"


def test_a_finished_model_is_reused_and_reports_progress(tiny_model: Path) -> None:
    lines: list[str] = []
    before = (tiny_model / "model.safetensors").stat().st_mtime_ns
    assert build_test_model(tiny_model, "tiny", progress=lines.append) == tiny_model
    assert (tiny_model / "model.safetensors").stat().st_mtime_ns == before
    assert lines == [f"test model (tiny) already built at {tiny_model}"]
    marker = json.loads((tiny_model / MARKER_FILE).read_text())
    assert marker["version"] == TEST_MODEL_VERSION and marker["size"] == "tiny"
    assert is_test_model(tiny_model, "tiny") and not is_test_model(tiny_model, "8b")


def test_a_folder_with_other_files_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not an opsbot test model"):
        build_test_model(tmp_path, "tiny")
    assert (tmp_path / "precious.txt").read_text() == "keep me"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"]


def test_unknown_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'tiny' or '8b'"):
        build_test_model(tmp_path / "m", "huge")  # type: ignore[arg-type]


@pytest.mark.slow
def test_8b_model_has_llama3_8b_dimensions_and_the_tokenizers_vocab(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from transformers import AutoConfig

    cache = Path(request.config.rootpath) / ".pytest_cache" / "opsbot-models"
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        cache = tmp_path_factory.mktemp("opsbot-models")
    path = build_test_model(cache / f"8b-v{TEST_MODEL_VERSION}", "8b")
    assert not list(path.glob("*.safetensors"))
    raw = json.loads((path / "config.json").read_text())
    assert raw["torch_dtype"] == "bfloat16" and raw["rope_theta"] == 500000.0
    config = AutoConfig.from_pretrained(str(path))
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (4096, 14336, 32)
    assert (config.num_attention_heads, config.num_key_value_heads) == (32, 8)
    assert config.max_position_embeddings == 8192
    tok = HFChatTokenizer(str(path))
    assert config.vocab_size == len(tok.hf) == 32000
    assert config.eos_token_id == tok.eos_token_id


def test_an_older_test_model_is_replaced_whole(tmp_path: Path) -> None:
    dest = tmp_path / "model"
    dest.mkdir()
    (dest / MARKER_FILE).write_text(json.dumps({"version": "0", "size": "tiny"}))
    (dest / "stale.bin").write_bytes(b"old")
    lines: list[str] = []
    build_test_model(dest, "tiny", progress=lines.append)
    assert is_test_model(dest, "tiny")
    assert not (dest / "stale.bin").exists()
    # The tokenizer is trained once per process and copied after: either line proves it was written.
    assert any(
        "training a byte-level BPE tokenizer" in line or "reusing the byte-level BPE tokenizer" in line
        for line in lines
    )
    assert (dest / "tokenizer.json").is_file()
    assert lines[-1].startswith("test model (tiny) ready at")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp or old folders left


@pytest.mark.parametrize("quant", ["awq", "gptq"])
def test_int4_8b_configs_are_detected_as_4_bit_with_groups_of_128(
    quant: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from inference.quant import detect_quantization, resolve_quantization

    cache = Path(request.config.rootpath) / ".pytest_cache" / "opsbot-models"
    cache.mkdir(parents=True, exist_ok=True)
    path = build_test_model(cache / f"8b-{quant}-v{TEST_MODEL_VERSION}", "8b", quant=quant)  # type: ignore[arg-type]
    assert is_test_model(path, "8b", quant) and not is_test_model(path, "8b")  # type: ignore[arg-type]
    raw = json.loads((path / "config.json").read_text())
    qc = raw["quantization_config"]
    assert qc["quant_method"] == quant and qc["bits"] == 4 and qc["group_size"] == 128
    assert raw["torch_dtype"] == "float16" and raw["hidden_size"] == 4096
    if quant == "gptq":
        # Dummy weights leave vLLM no packed tensors to find the quantized layers by: the config
        # must name every linear layer of a Llama block, or they all load as 16-bit.
        named = {m for group in qc["modules_in_block_to_quantize"] for m in group}
        linear = {f"self_attn.{p}_proj" for p in "qkvo"} | {f"mlp.{p}_proj" for p in ("gate", "up", "down")}
        assert named == linear
    info = detect_quantization(path)
    assert (info.method, info.bits) == (quant, 4)
    assert resolve_quantization(path, None).method == quant  # vLLM reads the checkpoint's own format


def test_quant_is_refused_for_the_tiny_model_and_unknown_formats(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="config-only sizes"):
        build_test_model(tmp_path / "t", "tiny", quant="awq")
    with pytest.raises(ValueError, match="awq, gptq"):
        build_test_model(tmp_path / "t", "8b", quant="int3")  # type: ignore[arg-type]


def test_the_70b_config_has_llama3_70b_dimensions(tmp_path: Path) -> None:
    from inference.testmodel import _SPECS

    dims = _SPECS["70b"]["config"]
    assert (dims["hidden_size"], dims["intermediate_size"], dims["num_hidden_layers"]) == (8192, 28672, 80)
    assert (dims["num_attention_heads"], dims["num_key_value_heads"]) == (64, 8)
