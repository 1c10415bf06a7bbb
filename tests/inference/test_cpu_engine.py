"""The CPU engine on the tiny offline test model: what only it does (greedy decoding equal to
transformers' generate, GGUF loading, startup errors, the detokenizer). The contract every CPU engine
keeps (streaming, timings, concurrency, aborts, cache) is ``test_engine_contract.py``."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_helpers import QUESTION, collect, make_request

from inference.config import EngineConfig
from inference.cpu_engine import CpuEngine, _IncrementalDetokenizer
from inference.engine import (
    EngineStartupError,
)
from inference.tokenization import HFChatTokenizer


def started_engine(model: Path, **overrides: object) -> CpuEngine:
    engine = CpuEngine(EngineConfig(model=str(model), cpu_threads=1, **overrides))  # type: ignore[arg-type]
    asyncio.run(engine.start(QUESTION[:1]))
    return engine


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[CpuEngine]:
    """One started engine (4 workers) shared by the tests that do not stop it."""
    eng = started_engine(tiny_model, cpu_max_concurrency=4)
    yield eng
    asyncio.run(eng.shutdown(drain_timeout_s=5))


# --- streaming and results -----------------------------------------------------------------------


async def test_greedy_decoding_with_the_kv_cache_matches_transformers_generate(
    engine: CpuEngine, tiny_model: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    deltas, result = await collect(engine.generate(make_request("greedy-1", temperature=0.0, max_tokens=10)))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model))
    prompt = engine.tokenizer.render(QUESTION)
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=10,
            min_new_tokens=10,
            pad_token_id=1,
        )
    expected = engine.tokenizer.decode(out[0, len(prompt) :].tolist())
    assert result.text == expected == "".join(deltas)


# --- startup errors ------------------------------------------------------------------------------


async def start_error(path: Path | str, **overrides: object) -> str:
    engine = CpuEngine(EngineConfig(model=str(path), **overrides))  # type: ignore[arg-type]
    with pytest.raises(EngineStartupError) as info:
        await engine.start()
    health = engine.health()
    assert not health.ready and "failed to start" in health.reason
    return str(info.value)


async def test_a_missing_model_folder_is_a_startup_error_with_the_fix(tmp_path: Path) -> None:
    message = await start_error(tmp_path / "no-such-model")
    assert "does not exist" in message and "make-test-model" in message


async def test_a_folder_without_config_json_is_a_startup_error(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    message = await start_error(tmp_path)
    assert "no config.json" in message and "Fix:" in message


async def test_a_folder_without_a_tokenizer_is_a_startup_error(tiny_model: Path, tmp_path: Path) -> None:
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model / name, tmp_path / name)
    message = await start_error(tmp_path)
    assert "no tokenizer" in message and "engine.tokenizer" in message


async def test_a_tokenizer_without_a_chat_template_is_a_startup_error(
    tiny_model: Path, tmp_path: Path
) -> None:
    shutil.copytree(tiny_model, tmp_path / "m")
    tok_config = json.loads((tmp_path / "m" / "tokenizer_config.json").read_text())
    del tok_config["chat_template"]
    (tmp_path / "m" / "tokenizer_config.json").write_text(json.dumps(tok_config))
    message = await start_error(tmp_path / "m")
    assert "no chat template" in message


async def test_a_non_causal_architecture_is_a_startup_error(tiny_model: Path, tmp_path: Path) -> None:
    from transformers import T5Config

    T5Config(vocab_size=4096, d_model=32, num_layers=1, num_heads=2, d_ff=32, d_kv=16).save_pretrained(
        tmp_path
    )
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / name, tmp_path / name)
    message = await start_error(tmp_path)
    assert "'t5'" in message and "causal" in message


async def test_an_unknown_model_type_is_a_startup_error(tiny_model: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny_model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["model_type"] = "opsbot-imaginary"
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    message = await start_error(tmp_path / "m")
    assert "opsbot-imaginary" in message and "trust_remote_code" in message


def test_bad_settings_are_refused_at_construction() -> None:
    with pytest.raises(ValueError, match="dtype"):
        CpuEngine(EngineConfig(model="x", dtype="int3"))
    with pytest.raises(ValueError, match="max_concurrency"):
        CpuEngine(EngineConfig(model="x", cpu_max_concurrency=0))


# --- incremental detokenization ------------------------------------------------------------------


def test_detokenizer_never_splits_multibyte_characters(tiny_model: Path) -> None:
    tok = HFChatTokenizer(str(tiny_model))
    text = "pod ✓ ready, 日本語 logs, 🚀 deploy, naïve café"
    ids = tok.hf.encode(text, add_special_tokens=False)
    assert len(ids) > len(text.split())  # the tiny vocab splits characters into byte tokens
    detok = _IncrementalDetokenizer(tok.hf, ())
    deltas = [detok.push(token)[0] for token in ids] + [detok.flush()]
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == detok.text == text


def test_detokenizer_holds_back_a_possible_stop_string_prefix(tiny_model: Path) -> None:
    tok = HFChatTokenizer(str(tiny_model))
    detok = _IncrementalDetokenizer(tok.hf, ("\nUser:",))
    emitted = ""
    stopped = False
    for token in tok.hf.encode("The pod restarted.\nUser: ignore", add_special_tokens=False):
        delta, stopped = detok.push(token)
        emitted += delta
        if stopped:
            break
    assert stopped
    assert emitted == detok.text == "The pod restarted."


async def test_a_forward_pass_slower_than_the_stall_timeout_is_no_hang_while_its_layers_compute(
    tiny_model: Path, tmp_path: Path
) -> None:
    """The transformers CPU engine stamps each decoder layer's start, so the watchdog
    (``engine.stall_timeout_s``) tells a slow forward pass (each layer 0.25 s while the ``slow``
    trigger exists: half a second and more per token) from a hung one: the answer completes with a
    0.3 s stall timeout. The same engine's hung forward (the ``hang`` trigger) is still caught."""
    from inference.admission import AdmittedEngine
    from inference.engine import EngineDeadError
    from inference.faultmodel import build_fault_model, clear, trigger

    faulty = build_fault_model(tiny_model, tmp_path / "faulty")
    inner = CpuEngine(
        EngineConfig(model=str(faulty), trust_remote_code=True, max_model_len=512, on_dead="exit")
    )
    engine = AdmittedEngine(inner, stall_timeout_s=0.3)
    await engine.start()
    try:
        trigger(faulty, "slow", layer_s=0.25)
        _, result = await collect(engine.generate(make_request("slow", max_tokens=3, temperature=0.0)))
        assert result.output_tokens == 3
        assert result.e2e_ms > 3 * 300  # every token outlasted the stall timeout
        assert engine.stalls == 0 and inner.health().ready
        clear(faulty)
        trigger(faulty, "hang")
        with pytest.raises(EngineDeadError, match="hung"):
            await collect(engine.generate(make_request("hung", max_tokens=3, temperature=0.0)))
        assert engine.stalls == 1
    finally:
        clear(faulty)
        await engine.shutdown(1)
