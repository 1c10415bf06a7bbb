"""Offline test models: a locally trained tokenizer plus a Llama config, built without any model hub.

``tiny`` is a few-MB ``LlamaForCausalLM`` with random weights (fixed seed) for the CPU engine, CI
and ``opsbot chat`` without a configured model: answers are gibberish, but every code path
(chat template, streaming, timings, token counts) is real. ``8b`` and ``70b`` hold only
``config.json`` and the tokenizer with Llama-3-8B / Llama-3-70B dimensions, for vLLM's
``load_format="dummy"`` on a GPU (random weights, real shapes, real speed). With ``quant`` =
``awq`` or ``gptq`` their ``config.json`` also carries a 4-bit, group-size-128
``quantization_config`` that vLLM accepts, so dummy loading builds the INT4 layers and runs
vLLM's INT4 kernels (Marlin / Machete where it picks them) on random packed weights.

The tokenizer is a byte-level BPE trained on the Python standard library's sources (every machine
has them) with a Llama-3-style chat template, as ``/work/shared/gpu/make_tokenizer.py`` does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

logger = logging.getLogger(__name__)

TEST_MODEL_VERSION = "2"
"""Bumped whenever the output of :func:`build_test_model` changes, so cached builds are redone."""

MARKER_FILE = ".opsbot-test-model.json"
"""Written last into a finished model folder; its presence means the build completed."""

ModelSize = Literal["tiny", "8b", "70b"]
Quant = Literal["awq", "gptq"]

QUANTIZATION_CONFIGS: dict[str, dict[str, Any]] = {
    # AutoAWQ's GEMM checkpoints: 4-bit, zero point, groups of 128 (vLLM: awq_marlin / machete).
    "awq": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
    # AutoGPTQ / GPTQModel checkpoints without act-order: symmetric 4-bit, groups of 128 (gptq_marlin).
    "gptq": {
        "quant_method": "gptq",
        "bits": 4,
        "group_size": 128,
        "desc_act": False,
        "sym": True,
        "damp_percent": 0.01,
        "true_sequential": True,
        "static_groups": False,
        "checkpoint_format": "gptq",
        # Which linear layers of a block are quantized, as GPTQModel writes it. Without it vLLM
        # (0.26, AutoGPTQConfig.maybe_update_config) looks for packed tensors in the checkpoint's
        # safetensors; a dummy checkpoint has none, so every layer stayed 16-bit (seen on the
        # H200: 13.49 GiB of weights, bf16's speed).
        "modules_in_block_to_quantize": [
            ["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"],
            ["self_attn.o_proj"],
            ["mlp.up_proj", "mlp.gate_proj"],
            ["mlp.down_proj"],
        ],
    },
}
"""The ``quantization_config`` written for each ``quant`` (the formats quant.py detects)."""

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|eot_id|>"
PAD_TOKEN = "<|end_of_text|>"
# Order fixes the ids: bos=0, end_of_text=1, start_header=2, end_header=3, eot=4 (as the vLLM probe).
SPECIAL_TOKENS = (BOS_TOKEN, PAD_TOKEN, "<|start_header_id|>", "<|end_header_id|>", EOS_TOKEN)

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

_SPECS: dict[str, dict[str, Any]] = {
    # A few seconds to train, a few MB on disk; 4 heads of 16 dims keep attention shapes realistic.
    "tiny": {
        "vocab": 4096,
        "files": 40,
        "max_len": 2048,
        "config": {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "rope_theta": 10000.0,
        },
    },
    # Llama-3-70B dimensions with the same 32k vocabulary: 69.5 B parameters, 139 GB in bf16 (two
    # H200s with tensor parallelism, or one in INT4).
    "70b": {
        "vocab": 32000,
        "files": 3000,
        "max_len": 8192,
        "config": {
            "hidden_size": 8192,
            "intermediate_size": 28672,
            "num_hidden_layers": 80,
            "num_attention_heads": 64,
            "num_key_value_heads": 8,
            "rope_theta": 500000.0,
        },
    },
    # Llama-3-8B dimensions with a 32k vocabulary: 7.24 B parameters, 14.5 GB in bf16.
    "8b": {
        "vocab": 32000,
        "files": 3000,
        "max_len": 8192,
        "config": {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "rope_theta": 500000.0,
        },
    },
}


def is_test_model(path: Path, size: ModelSize | None = None, quant: Quant | None = None) -> bool:
    """Whether ``path`` is a finished test model of this version (and of ``size`` and ``quant``,
    when ``size`` is given)."""
    try:
        marker = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(marker, dict) or marker.get("version") != TEST_MODEL_VERSION:
        return False
    return size is None or (marker.get("size") == size and marker.get("quant") == quant)


def build_test_model(
    dest: Path,
    size: ModelSize,
    *,
    quant: Quant | None = None,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Build the offline test model ``size`` (``quant``: INT4 config for ``8b`` / ``70b``) into
    ``dest`` and return ``dest``.

    A finished model of the same version, size and quantization already at ``dest`` is reused as
    is. The build happens in a temporary sibling folder that is renamed into place, so an
    interrupted build never leaves a half model behind. ``dest`` must not be a non-empty folder
    that is not a test model (raises :class:`FileExistsError` rather than overwrite someone's files).
    """
    if size not in _SPECS:
        raise ValueError(f"unknown test model size {size!r}; choose 'tiny' or '8b' (or '70b' for two GPUs)")
    if quant is not None and (quant not in QUANTIZATION_CONFIGS or size == "tiny"):
        known = ", ".join(QUANTIZATION_CONFIGS)
        raise ValueError(f"quant {quant!r}: use one of {known}, and only with the config-only sizes 8b / 70b")
    dest = Path(dest)
    say = progress or (lambda line: logger.info("%s", line))
    if is_test_model(dest, size, quant):
        say(f"test model ({size}{'-' + quant if quant else ''}) already built at {dest}")
        return dest
    if dest.exists() and not _replaceable(dest):
        raise FileExistsError(f"{dest} exists and is not an opsbot test model; choose an empty or new folder")
    dest.parent.mkdir(parents=True, exist_ok=True)
    spec = _SPECS[size]
    started = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.building-", dir=dest.parent))
    try:
        vocab_size = _write_tokenizer(tmp, spec, say)
        if size == "tiny":
            _write_tiny_weights(tmp, spec, vocab_size, say)
        else:
            _write_config_only(tmp, size, spec, vocab_size, quant, say)
        marker = {"version": TEST_MODEL_VERSION, "size": size, "quant": quant, "vocab_size": vocab_size}
        (tmp / MARKER_FILE).write_text(json.dumps(marker) + "\n", encoding="utf-8")
        # mkdtemp makes a private folder; a model is read by other users (container, CI cache).
        tmp.chmod(0o755)
        for child in tmp.iterdir():
            child.chmod(0o644)
        _move_into_place(tmp, dest, size, quant)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    say(f"test model ({size}) ready at {dest} in {time.perf_counter() - started:.1f} s")
    return dest


def _replaceable(dest: Path) -> bool:
    # Only an empty folder or an older / other-size test model of ours may be replaced.
    if not dest.is_dir():
        return False
    return not any(dest.iterdir()) or (dest / MARKER_FILE).is_file()


def _move_into_place(tmp: Path, dest: Path, size: ModelSize, quant: Quant | None) -> None:
    if dest.exists():
        # Rename the old one aside first so dest is never a mix of two builds.
        old = dest.with_name(f".{dest.name}.old-{uuid.uuid4().hex[:8]}")
        with contextlib.suppress(FileNotFoundError):
            dest.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    try:
        tmp.rename(dest)
    except OSError:
        # Another process finished the same build first (parallel test workers): use theirs.
        if not is_test_model(dest, size, quant):
            raise


def _training_files(limit: int) -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        files.append(str(path))
        if len(files) >= limit:
            break
    if not files:
        raise RuntimeError(f"no Python sources under {stdlib} to train the test tokenizer on")
    return files


_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_trained: dict[tuple[int, int], tuple[Path, int]] = {}
"""Tokenizers trained in this process, by (vocab, files): the 8b / 70b / INT4 variants share one
(training is deterministic, so a copy is the same file; it saves ~30 s a variant on 2 cores)."""


def _write_tokenizer(out: Path, spec: dict[str, Any], say: Callable[[str], None]) -> int:
    key = (int(spec["vocab"]), int(spec["files"]))
    done = _trained.get(key)
    if done is not None and all((done[0] / name).is_file() for name in _TOKENIZER_FILES):
        for name in _TOKENIZER_FILES:
            shutil.copyfile(done[0] / name, out / name)
        say(f"reusing the byte-level BPE tokenizer (vocab {spec['vocab']}) trained earlier in this run")
        return done[1]
    vocab_size = _train_tokenizer(out, spec, say)
    keep = Path(tempfile.mkdtemp(prefix="opsbot-tokenizer-"))
    for name in _TOKENIZER_FILES:
        shutil.copyfile(out / name, keep / name)
    _trained[key] = (keep, vocab_size)
    return vocab_size


def _train_tokenizer(out: Path, spec: dict[str, Any], say: Callable[[str], None]) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    files = _training_files(int(spec["files"]))
    say(f"training a byte-level BPE tokenizer (vocab {spec['vocab']}) on {len(files)} stdlib files")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[assignment]
    tok.decoder = decoders.ByteLevel()  # type: ignore[assignment]
    trainer = trainers.BpeTrainer(
        vocab_size=int(spec["vocab"]),
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    tok.save(str(out / "tokenizer.json"))
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "model_max_length": int(spec["max_len"]),
        "chat_template": CHAT_TEMPLATE,
    }
    _write_json(out / "tokenizer_config.json", tokenizer_config)
    _write_json(
        out / "special_tokens_map.json",
        {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN},
    )
    vocab_size = int(tok.get_vocab_size())
    for token in SPECIAL_TOKENS:
        if tok.token_to_id(token) != SPECIAL_TOKENS.index(token):
            raise RuntimeError(f"special token {token} did not get id {SPECIAL_TOKENS.index(token)}")
    return vocab_size


def _base_config(spec: dict[str, Any], vocab_size: int, dtype: str) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "bos_token_id": SPECIAL_TOKENS.index(BOS_TOKEN),
        "eos_token_id": SPECIAL_TOKENS.index(EOS_TOKEN),
        "pad_token_id": SPECIAL_TOKENS.index(PAD_TOKEN),
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": int(spec["max_len"]),
        "torch_dtype": dtype,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        **spec["config"],
    }


def _write_config_only(
    out: Path,
    size: str,
    spec: dict[str, Any],
    vocab_size: int,
    quant: Quant | None,
    say: Callable[[str], None],
) -> None:
    # Written by hand, field for field like the probe that was proven with vLLM 0.26.0 on the H200,
    # so the file does not depend on the transformers version installed here.
    kind = f", {quant.upper()} 4-bit" if quant else ""
    say(
        f"writing config.json (Llama-3-{size.upper()} dimensions{kind}, no weights: vLLM load_format='dummy')"
    )
    config = _base_config(spec, vocab_size, "float16" if quant else "bfloat16")
    if quant:
        # INT4 kernels compute in fp16 (AWQ / GPTQ checkpoints are fp16); vLLM casts as it must.
        config["quantization_config"] = dict(QUANTIZATION_CONFIGS[quant])
    _write_json(out / "config.json", config)
    _write_generation_config(out)


def _write_tiny_weights(out: Path, spec: dict[str, Any], vocab_size: int, say: Callable[[str], None]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    say("initialising random weights (seed 0)")
    fields = _base_config(spec, vocab_size, "float32")
    for key in ("architectures", "model_type", "torch_dtype"):
        fields.pop(key)
    config = LlamaConfig(**fields)
    config.architectures = ["LlamaForCausalLM"]
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)  # float32: the CPU default
    finally:
        # Building a model must not change the caller's random stream.
        torch.random.set_rng_state(generator_state)
    say("saving weights as safetensors")
    # save_file rather than save_pretrained: same file, without a progress bar on the CLI's stderr.
    from safetensors.torch import save_file

    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(out))
    _write_generation_config(out)


def _write_generation_config(out: Path) -> None:
    _write_json(
        out / "generation_config.json",
        {
            "bos_token_id": SPECIAL_TOKENS.index(BOS_TOKEN),
            "eos_token_id": [SPECIAL_TOKENS.index(EOS_TOKEN), SPECIAL_TOKENS.index(PAD_TOKEN)],
            "pad_token_id": SPECIAL_TOKENS.index(PAD_TOKEN),
            "do_sample": True,
            "temperature": 0.6,
            "top_p": 0.9,
        },
    )


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
