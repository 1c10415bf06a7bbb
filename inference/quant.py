"""Quantization: find out how a model folder's weights are stored, and what vLLM should be told.

A checkpoint says how it was quantized in one of two places:

- ``config.json`` -> ``quantization_config`` (transformers, AutoAWQ >= 0.2, GPTQModel,
  llm-compressor / ``compressed-tensors``, FP8 checkpoints, bitsandbytes), or
- ``quantize_config.json`` / ``quant_config.json`` beside it (older AutoGPTQ / AutoAWQ exports).

:func:`detect_quantization` reads them without torch or vLLM, so the CPU install and the
tests can use it. :func:`resolve_quantization` applies the configured override (``None`` means
"use what the folder says") and refuses combinations vLLM cannot load, with the fix in the
message. ``fp8`` on an unquantized bf16/fp16 checkpoint is *online* quantization: vLLM casts
the weights to FP8 at load time (per-tensor scales), which on Hopper halves weight memory and
decode time at a small accuracy cost.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.engine import EngineStartupError

logger = logging.getLogger(__name__)

# Canonical names are vLLM's ``quantization`` values for the checkpoint formats we know.
AWQ = "awq"
GPTQ = "gptq"
FP8 = "fp8"
COMPRESSED_TENSORS = "compressed-tensors"
BITSANDBYTES = "bitsandbytes"
KNOWN_METHODS = (AWQ, GPTQ, FP8, COMPRESSED_TENSORS, BITSANDBYTES)

# vLLM kernel variants that load the same checkpoint format (an override may name them).
_VARIANTS: dict[str, str] = {
    "awq_marlin": AWQ,
    "gptq_marlin": GPTQ,
    "gptq_marlin_24": GPTQ,
    "gptq_bitblas": GPTQ,
    "marlin": GPTQ,
    "compressed_tensors": COMPRESSED_TENSORS,
    "bnb": BITSANDBYTES,
}

# Formats vLLM can produce at load time from an unquantized checkpoint.
_ONLINE = frozenset({FP8, BITSANDBYTES})

# Lowest CUDA compute capability with a vLLM kernel for the format (sm_75 Turing, sm_80 Ampere).
# FP8 runs as a weight-only Marlin kernel on sm_80..sm_86 and natively (W8A8) from sm_89 on.
_MIN_CAPABILITY: dict[str, tuple[int, int]] = {
    AWQ: (7, 5),
    GPTQ: (6, 0),
    FP8: (8, 0),
    COMPRESSED_TENSORS: (7, 5),
    BITSANDBYTES: (7, 0),
}


class QuantizationError(EngineStartupError, ValueError):
    """The configured quantization cannot be used with this checkpoint or GPU; says the fix."""


@dataclass(frozen=True, slots=True)
class QuantizationInfo:
    """What the model folder holds and what vLLM is asked to do with it."""

    method: str | None
    """vLLM ``quantization`` value (``awq``, ``gptq``, ``fp8``, ``compressed-tensors``,
    ``bitsandbytes``, another name vLLM knows) or ``None`` for unquantized weights."""
    bits: int | None
    """Weight bits (4, 8, 16 for unquantized bf16/fp16, 32); ``None`` when the folder does not say."""
    source: str
    """Where it was found: ``config.json:quantization_config``, ``quantize_config.json``,
    ``quant_config.json``, ``config.json:torch_dtype``, ``override`` or ``unknown``."""
    online: bool = False
    """``True`` when vLLM quantizes unquantized weights at load time (e.g. fp8 from bf16)."""
    detail: str = ""
    """Extra facts worth a log line (group size, checkpoint format, load_in_4bit, ...)."""

    def describe(self) -> str:
        """One line for the startup log and ``/rca status``."""
        name = self.method or "none"
        bits = f"{self.bits}-bit" if self.bits else "bits unknown"
        parts = [f"{name} ({bits}", f"from {self.source}"]
        if self.online:
            parts.append("quantized online at load")
        if self.detail:
            parts.append(self.detail)
        return ", ".join(parts) + ")"


def canonical_method(name: str | None) -> str | None:
    """The checkpoint format a vLLM quantization name loads (``awq_marlin`` -> ``awq``)."""
    if name is None:
        return None
    key = name.strip().lower()
    if key in ("", "none"):
        return None
    return _VARIANTS.get(key, key)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise QuantizationError(f"cannot read {path}: {exc}. Fix: repair or remove the file") from exc
    return data if isinstance(data, dict) else None


def _dtype_bits(dtype: object) -> int | None:
    return {"bfloat16": 16, "float16": 16, "half": 16, "float32": 32, "float": 32}.get(str(dtype).lower())


def _compressed_tensors_bits(qc: Mapping[str, Any]) -> tuple[int | None, str]:
    groups = qc.get("config_groups") or {}
    bits: set[int] = set()
    kinds: set[str] = set()
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping):
                if isinstance(weights.get("num_bits"), int):
                    bits.add(int(weights["num_bits"]))
                if weights.get("type"):
                    kinds.add(str(weights["type"]))
    fmt = str(qc.get("format") or "")
    detail = ", ".join(x for x in (f"format {fmt}" if fmt else "", "/".join(sorted(kinds))) if x)
    return (min(bits) if bits else None), detail


def _from_quantization_config(qc: Mapping[str, Any]) -> tuple[str | None, int | None, str]:
    method = canonical_method(str(qc.get("quant_method") or "")) or None
    if method is None and ("load_in_4bit" in qc or "load_in_8bit" in qc):
        method = BITSANDBYTES
    if method == BITSANDBYTES:
        if qc.get("load_in_4bit"):
            return method, 4, f"load_in_4bit, {qc.get('bnb_4bit_quant_type', 'fp4')}"
        if qc.get("load_in_8bit"):
            return method, 8, "load_in_8bit"
        return method, None, ""
    if method == COMPRESSED_TENSORS:
        bits, detail = _compressed_tensors_bits(qc)
        return method, bits, detail
    if method == FP8:
        scheme = qc.get("activation_scheme")
        return method, 8, f"activation scheme {scheme}" if scheme else ""
    bits_value = qc.get("bits", qc.get("w_bit"))
    bits = int(bits_value) if isinstance(bits_value, int) else None
    group = qc.get("group_size", qc.get("q_group_size"))
    detail = f"group size {group}" if group is not None else ""
    if method == AWQ and qc.get("version"):
        detail = ", ".join(x for x in (detail, f"version {qc['version']}") if x)
    return method, bits, detail


def detect_quantization(model_dir: str | Path) -> QuantizationInfo:
    """Read the folder's quantization metadata; a hub id or a missing folder gives ``unknown``."""
    folder = Path(model_dir)
    if not folder.is_dir():
        return QuantizationInfo(method=None, bits=None, source="unknown", detail="not a local folder")
    config = _read_json(folder / "config.json") or {}
    qc = config.get("quantization_config")
    if isinstance(qc, Mapping) and qc:
        method, bits, detail = _from_quantization_config(qc)
        if method is not None:
            return QuantizationInfo(method, bits, "config.json:quantization_config", detail=detail)
    for name in ("quantize_config.json", "quant_config.json"):
        side = _read_json(folder / name)
        if not side:
            continue
        method, bits, detail = _from_quantization_config(side)
        if method is None:
            # AutoGPTQ's quantize_config.json has no quant_method; AutoAWQ's quant_config.json
            # says w_bit / zero_point instead of bits.
            method = AWQ if ("w_bit" in side or "zero_point" in side) else GPTQ
            _, bits, detail = _from_quantization_config({**side, "quant_method": method})
        return QuantizationInfo(method, bits, name, detail=detail)
    dtype = config.get("torch_dtype", config.get("dtype"))
    if dtype:
        return QuantizationInfo(None, _dtype_bits(dtype), "config.json:torch_dtype", detail=str(dtype))
    # A local config.json without quantization metadata or dtype: unquantized, width not stated.
    source = "config.json" if config else "unknown"
    return QuantizationInfo(None, None, source, detail="unquantized" if config else "no config.json")


def resolve_quantization(model_dir: str | Path, override: str | None = None) -> QuantizationInfo:
    """Detected format with ``override`` applied; :class:`QuantizationError` when they clash.

    - no override: what the folder says (``None`` for unquantized weights);
    - an override naming the folder's format or one of its kernels (``awq_marlin`` for ``awq``):
      that name is passed to vLLM;
    - ``fp8`` or ``bitsandbytes`` on unquantized weights: online quantization at load;
    - anything else on a quantized folder, or ``awq`` / ``gptq`` / ``compressed-tensors`` on
      unquantized weights: refused, because vLLM would fail later with a less clear message.
    """
    detected = detect_quantization(model_dir)
    if override is None or canonical_method(override) is None:
        return detected
    wanted = override.strip().lower()
    wanted_format = canonical_method(wanted)
    if detected.source == "unknown":
        # A hub id or an unreadable folder: trust the configuration, vLLM checks it at load.
        return QuantizationInfo(wanted, None, "override", detail="checkpoint format not checked")
    if detected.method is not None:
        if wanted_format == detected.method:
            return QuantizationInfo(wanted, detected.bits, "override", detail=detected.describe())
        raise QuantizationError(
            f"engine.quantization is {override!r} but the checkpoint in {model_dir} is "
            f"{detected.describe()}. Fix: unset engine.quantization (the format is detected), set it "
            f"to {detected.method!r}, or point engine.model at a {wanted_format} checkpoint"
        )
    if wanted_format in _ONLINE:
        bits = 8 if wanted_format == FP8 else 4
        return QuantizationInfo(
            wanted, bits, "override", online=True, detail=f"from {detected.detail or 'unquantized'} weights"
        )
    raise QuantizationError(
        f"engine.quantization is {override!r} but {model_dir} holds unquantized weights "
        f"({detected.detail or 'no quantization metadata'}); {wanted_format} needs a checkpoint "
        f"quantized offline. Fix: use an {wanted_format} checkpoint, or set engine.quantization to "
        "'fp8' to quantize these weights at load time (Hopper / Ada GPUs)"
    )


def check_gpu_support(info: QuantizationInfo, capability: tuple[int, int] | None) -> str | None:
    """``None`` when the GPU has kernels for ``info``; else the error text with the fix."""
    fmt = canonical_method(info.method)
    if fmt is None or capability is None:
        return None
    need = _MIN_CAPABILITY.get(fmt)
    if need is None or capability >= need:
        if fmt == FP8 and capability < (8, 9):
            logger.warning(
                "fp8 on compute capability %d.%d runs weight-only (Marlin); native FP8 needs 8.9+",
                *capability,
            )
        return None
    return (
        f"{info.describe()} needs a GPU of compute capability {need[0]}.{need[1]} or newer; this one is "
        f"{capability[0]}.{capability[1]}. Fix: use an unquantized (bf16/fp16) checkpoint and unset "
        "engine.quantization, or run on a newer GPU"
    )
