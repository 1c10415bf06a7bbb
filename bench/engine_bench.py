"""Engine benchmark: opsbot's engine layer against raw vLLM ``AsyncLLM``, same GPU, same run.

Every (configuration, layer, warm-up) gets **its own fresh engine**, and every episode measured
on it is kept, so the comparison is always like with like: the first urgent-under-load episode
after a start with the first, later (steady) episodes with later ones.

- configurations (``--configs``): ``bf16``; ``fp8`` (online FP8 from the bf16 checkpoint);
  ``awq`` / ``gptq`` (4-bit dummy checkpoints from ``make-test-model --quant``); each with an
  optional ``+kvfp8`` suffix for an FP8 KV cache (``bf16+kvfp8``); INT4 runs fp16 activations
  unless ``+bf16`` says bf16 (``awq+bf16+kvfp8``: vLLM 0.26's FP8 attention wants bf16 output);
- layers (``--layers``): ``opsbot`` = ``AdmittedEngine(VllmEngine)``, the path the bot uses;
  ``raw`` = ``AsyncLLM.from_engine_args`` with the same arguments
  (``inference.vllm_engine.engine_args_kwargs``), fed the very same token ids, lanes passed only
  as vLLM priorities;
- warm-ups (``--warmups``): ``system`` (the shared system prompt once, as both did until now) and
  ``incident`` (that plus ``inference.vllm_engine.warm_incident_shapes``: a full batch decoding
  while new prompts prefill), applied alike to both layers.

Workloads on each fresh engine, in this order: ``episodes`` (``--episodes`` urgent-under-load
episodes back to back: 56 x 500-token background requests, 0.3 s later 8 x 64-token urgent ones),
``single`` (cold and warm system prompt), ``bursts`` (8 / 32 / 64 concurrent urgent requests,
``--burst-repeats`` times each). The ``pressure`` workload (``--pressure``) runs on engines of its
own with a KV cache of ``--pressure-blocks`` blocks: Poisson background arrivals with 2k-token
contexts (the shared system prompt + ~600 tokens of their own: no two alike, so the prefix cache
cannot hide the pressure) beside Poisson urgent questions (also each its own), for raw vLLM with
priorities, opsbot's default admission and opsbot with the KV watermark; it reports urgent TTFT,
background tokens/s, preemptions and the peak KV use.

Prompts: ~1470-token shared system prompt + ~300-token user text, 200 output tokens (ignore_eos,
greedy), as ``/work/shared/gpu/probe_vllm.py``.

Usage (on the GPU machine, vLLM importable)::

    python bench/engine_bench.py --configs bf16 --layers opsbot,raw --warmups system,incident \
        --episodes 4 --out bench/results/engine_bench.json

``--dry-run`` builds the prompts and prints the plan without vLLM (works on CPU).
Results: a JSON file (rewritten after every engine, so a timeout keeps what finished) and a
Markdown report next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from run_meta import run_meta  # noqa: E402
from run_meta import wait_for_gpu_memory as wait_for_gpu_memory_sync  # noqa: E402

from inference.admission import AdmittedEngine  # noqa: E402
from inference.config import AdmissionConfig, EngineConfig  # noqa: E402
from inference.engine import (  # noqa: E402
    ChatMessage,
    Engine,
    GenerationRequest,
    GenerationResult,
    Lane,
    SamplingSettings,
    TextDelta,
)
from inference.engine_set import EngineSet  # noqa: E402
from inference.scenarios import ALERT_SUMMARY, ROOT_CAUSE  # noqa: E402
from inference.vllm_engine import (  # noqa: E402
    VllmEngine,
    engine_args_kwargs,
    warm_incident_shapes,
)
from inference.vllm_engine import _stat_logger_factory as stat_logger_factory  # noqa: E402
from inference.vllm_engine import _StatsSink as StatsSink  # noqa: E402

logger = logging.getLogger("engine_bench")

# The probe's vocabulary, so prompts have the probe's token counts.
WORDS = [
    *("pod", "crashloopbackoff", "namespace", "production", "restart", "oom", "memory", "cpu"),
    *("latency", "p99", "database", "connection", "pool", "alert", "firing"),
]
BURSTS = (8, 32, 64)

CONFIG_NAMES = ("bf16", "fp8", "awq", "gptq")
"""Weight formats; each may take the ``+kvfp8`` suffix (FP8 KV cache), INT4 also ``+bf16``."""
CONFIG_SUFFIXES = ("kvfp8", "bf16")
"""``kvfp8``: FP8 KV cache; ``bf16``: bf16 activations for an INT4 format (fp16 otherwise)."""
KV_WATERMARK = 0.85
"""The KV watermark the pressure workload's third variant uses."""


def pct(xs: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (as the probe computes it)."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * p / 100
    f = int(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


@dataclass
class Workload:
    """Token ids of every prompt, built once and fed to both engines."""

    system_tokens: int
    warmup_ids: list[int]
    cold_ids: list[int]
    warm_ids: list[int]
    hello_ids: list[int]
    bursts: dict[int, list[list[int]]]
    background: list[list[int]]
    urgent: list[list[int]]
    pressure_background: list[list[int]] = field(default_factory=list)
    """~2k-token prompts (the system prompt + ~600 unique tokens) for the pressure workload, one
    per arrival (a repeated prompt would be served from the prefix cache and take no KV)."""
    pressure_urgent: list[list[int]] = field(default_factory=list)
    """The pressure workload's urgent questions, one per arrival."""
    vocab_size: int = 32000
    system: str = field(repr=False, default="")
    repeats: int = 1
    """Times each burst runs (fresh prompts each time); results pool them and keep each p99."""
    episode_prompts: list[tuple[list[list[int]], list[list[int]]]] = field(default_factory=list)
    """(background, urgent) prompts of each urgent-under-load episode after the first. Fresh user
    texts each time: with the same prompts, later episodes are served from the prefix cache and
    measure a cache hit, not an incident (seen on the H200, 2026-12-01: raw vLLM 347 ms in the first
    episode, 45 ms in repeats of the same prompts)."""

    def episode(self, k: int) -> tuple[list[list[int]], list[list[int]]]:
        """The prompts of episode ``k`` (0-based): the first is ``background`` / ``urgent``."""
        return (self.background, self.urgent) if k == 0 else self.episode_prompts[k - 1]


def build_workload(
    tokenizer: Any,
    seed: int = 0,
    repeats: int = 1,
    episodes: int = 1,
    same_episode_prompts: bool = False,
    pressure_prompts: tuple[int, int] = (64, 8),
) -> Workload:
    """Every prompt of the run; ``pressure_prompts``: (background, urgent) prompts of the pressure
    workload, at least one per expected arrival."""
    rnd = random.Random(seed)

    def text(n: int) -> str:
        return " ".join(rnd.choice(WORDS) for _ in range(n))

    system = "You are an SRE assistant. " + text(900)
    cold_system = "You are an on-call database assistant. " + text(900)

    def ids(user: str, sys_text: str = system) -> list[int]:
        return list(tokenizer.render([ChatMessage("system", sys_text), ChatMessage("user", user)]))

    workload = Workload(
        system_tokens=len(tokenizer.render([ChatMessage("system", system)], add_generation_prompt=False)),
        warmup_ids=list(tokenizer.render([ChatMessage("system", system)], add_generation_prompt=False)),
        cold_ids=ids(text(250), cold_system),
        warm_ids=ids(text(250)),
        hello_ids=list(tokenizer.render([ChatMessage("user", "hello " + text(20))])),
        bursts={n: [ids(text(250)) for _ in range(n)] for n in BURSTS},
        background=[ids(text(250)) for _ in range(56)],
        urgent=[ids(text(100)) for _ in range(8)],
        pressure_background=[ids(text(420)) for _ in range(64)],
        vocab_size=len(tokenizer.hf),
        system=system,
        repeats=repeats,
    )
    # Further repeats get fresh user texts (drawn after everything else, so the first repeat is
    # the same workload as a single-repeat run): a repeated prompt would be served from cache.
    for n in BURSTS:
        workload.bursts[n] += [ids(text(250)) for _ in range(n * (repeats - 1))]
    for _ in range(episodes - 1):
        if same_episode_prompts:
            workload.episode_prompts.append((workload.background, workload.urgent))
        else:
            fresh_background = [ids(text(250)) for _ in range(56)]
            workload.episode_prompts.append((fresh_background, [ids(text(100)) for _ in range(8)]))
    # Drawn last, so every other prompt stays that of earlier runs with the same seed.
    workload.pressure_background += [ids(text(420)) for _ in range(max(0, pressure_prompts[0] - 64))]
    workload.pressure_urgent = [ids(text(100)) for _ in range(pressure_prompts[1])]
    return workload


# --- one request through either layer ------------------------------------------------------------


class Client:
    """Sends one request and measures it with the benchmark's own clock (same for both layers)."""

    name = "abstract"

    async def one(self, ids: list[int], max_tokens: int, lane: Lane) -> dict[str, Any]:
        raise NotImplementedError


class OpsbotClient(Client):
    name = "opsbot"

    def __init__(self, engine: Engine, scenarios: dict[Lane, str] | None = None) -> None:
        self.engine = engine
        self.scenarios = scenarios or {}
        """The scenario each lane's requests carry (an ``EngineSet`` routes by it); else ``bench``."""

    async def one(self, ids: list[int], max_tokens: int, lane: Lane) -> dict[str, Any]:
        req = GenerationRequest(
            request_id=uuid.uuid4().hex,
            scenario=self.scenarios.get(lane, "bench"),
            lane=lane,
            sampling=SamplingSettings(
                temperature=0.0, top_p=1.0, max_tokens=max_tokens, repetition_penalty=1.0, ignore_eos=True
            ),
            prompt_token_ids=ids,
        )
        t0 = time.perf_counter()
        first: float | None = None
        result: GenerationResult | None = None
        async for event in self.engine.generate(req):
            if isinstance(event, TextDelta):
                if first is None:
                    first = time.perf_counter()
            else:
                result = event
        t1 = time.perf_counter()
        assert result is not None and first is not None
        n = result.output_tokens
        return {
            "ttft": (first - t0) * 1e3,
            "tpot": (t1 - first) * 1e3 / max(n - 1, 1),
            "e2e": (t1 - t0) * 1e3,
            "n": n,
            "cached": result.cached_tokens,
            "engine_ttft": result.ttft_ms,
            "engine_queue": result.queue_ms,
        }


class RawClient(Client):
    name = "raw"

    def __init__(self, llm: Any, priority: bool) -> None:
        from vllm import SamplingParams, TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        self.llm = llm
        self.priority = priority
        self.SamplingParams = SamplingParams
        self.TokensPrompt = TokensPrompt
        self.delta = RequestOutputKind.DELTA

    async def one(self, ids: list[int], max_tokens: int, lane: Lane) -> dict[str, Any]:
        sp = self.SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            top_p=1.0,
            repetition_penalty=1.0,
            ignore_eos=True,
            output_kind=self.delta,
        )
        prio = lane.vllm_priority if self.priority else 0
        t0 = time.perf_counter()
        first: float | None = None
        n = 0
        cached = 0
        async for out in self.llm.generate(
            self.TokensPrompt(prompt_token_ids=ids), sp, request_id=uuid.uuid4().hex, priority=prio
        ):
            if out.outputs and out.outputs[0].token_ids:
                if first is None:
                    first = time.perf_counter()
                n += len(out.outputs[0].token_ids)
            if out.num_cached_tokens is not None:
                cached = out.num_cached_tokens
        t1 = time.perf_counter()
        assert first is not None
        return {
            "ttft": (first - t0) * 1e3,
            "tpot": (t1 - first) * 1e3 / max(n - 1, 1),
            "e2e": (t1 - t0) * 1e3,
            "n": n,
            "cached": cached,
        }


# --- workloads -----------------------------------------------------------------------------------


def summarize(outs: list[dict[str, Any]], wall_s: float | None = None) -> dict[str, Any]:
    ttft = [o["ttft"] for o in outs]
    tpot = [o["tpot"] for o in outs]
    e2e = [o["e2e"] for o in outs]
    tokens = sum(o["n"] for o in outs)
    wall = wall_s if wall_s is not None else max(e2e) / 1e3
    return {
        "n": len(outs),
        "ttft_p50": round(pct(ttft, 50), 1),
        "ttft_p99": round(pct(ttft, 99), 1),
        "ttft_max": round(max(ttft), 1),
        "tpot_p50": round(pct(tpot, 50), 2),
        "tpot_p99": round(pct(tpot, 99), 2),
        "e2e_p99": round(pct(e2e, 99), 1),
        "tok_s": round(tokens / wall, 1),
        "cached_mean": round(statistics.mean(o["cached"] for o in outs), 1),
    }


async def urgent_under_load(client: Client, wl: Workload, k: int = 0) -> dict[str, Any]:
    """Episode ``k``: 56 long background answers streaming, then 8 short urgent questions."""
    background_ids, urgent_ids = wl.episode(k)
    t0 = time.perf_counter()
    bg = [asyncio.create_task(client.one(ids, 500, Lane.BACKGROUND)) for ids in background_ids]
    await asyncio.sleep(0.3)
    urgent = await asyncio.gather(*[client.one(ids, 64, Lane.URGENT) for ids in urgent_ids])
    background = await asyncio.gather(*bg)
    wall = time.perf_counter() - t0
    u = summarize(urgent)
    b = summarize(background)
    total_tokens = sum(o["n"] for o in urgent) + sum(o["n"] for o in background)
    return {
        "urgent_ttft_p50": u["ttft_p50"],
        "urgent_ttft_p99": u["ttft_p99"],
        "urgent_ttft_max": u["ttft_max"],
        "urgent_tpot_p50": u["tpot_p50"],
        "urgent_e2e_p99": u["e2e_p99"],
        "background_ttft_p50": b["ttft_p50"],
        "background_ttft_p99": b["ttft_p99"],
        "background_e2e_p99": b["e2e_p99"],
        "total_tok_s": round(total_tokens / wall, 1),
        "wall_s": round(wall, 2),
    }


async def single_and_bursts(client: Client, wl: Workload, *, cache_fracs: list[float]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    await client.one(wl.hello_ids, 8, Lane.NORMAL)
    cold = await client.one(wl.cold_ids, 200, Lane.URGENT)
    warm = await client.one(wl.warm_ids, 200, Lane.URGENT)
    cache_fracs.append(min(warm["cached"], wl.system_tokens) / wl.system_tokens)
    res["single_cold"] = {k: round(v, 2) if isinstance(v, float) else v for k, v in cold.items()}
    res["single_warm"] = {k: round(v, 2) if isinstance(v, float) else v for k, v in warm.items()}
    for n in BURSTS:
        pooled: list[dict[str, Any]] = []
        walls: list[float] = []
        p99s: list[float] = []
        for rep in range(wl.repeats):
            batch = wl.bursts[n][rep * n : (rep + 1) * n]
            outs = await asyncio.gather(*[client.one(ids, 200, Lane.URGENT) for ids in batch])
            cache_fracs.extend(min(o["cached"], wl.system_tokens) / wl.system_tokens for o in outs)
            pooled += outs
            walls.append(max(o["e2e"] for o in outs) / 1e3)
            p99s.append(summarize(outs)["ttft_p99"])
        res[f"burst{n}"] = summarize(pooled, wall_s=sum(walls))
        res[f"burst{n}"]["ttft_p99_each"] = p99s
    return res


async def pressure(client: Client, wl: Workload, args: argparse.Namespace, seed: int = 1) -> dict[str, Any]:
    """Poisson background arrivals with 2k-token contexts beside Poisson urgent questions. Each
    stream draws from its own generator, so every policy meets the same arrival schedule (one
    shared generator interleaved the draws by timing: 11 vs 19 urgent arrivals, H200 2026-12-01)."""
    duration = args.pressure_seconds
    bg_tasks: list[asyncio.Task[dict[str, Any]]] = []
    urgent_tasks: list[asyncio.Task[dict[str, Any]]] = []
    t0 = time.perf_counter()

    async def arrivals(
        rnd: random.Random, rate: float, make: Any, into: list[asyncio.Task[dict[str, Any]]]
    ) -> None:
        while time.perf_counter() - t0 < duration:
            await asyncio.sleep(rnd.expovariate(rate))
            into.append(asyncio.create_task(make()))

    k = [0, 0]

    def background() -> Any:
        k[0] += 1
        return client.one(wl.pressure_background[k[0] % len(wl.pressure_background)], 256, Lane.BACKGROUND)

    def urgent() -> Any:
        k[1] += 1
        return client.one(wl.pressure_urgent[k[1] % len(wl.pressure_urgent)], 64, Lane.URGENT)

    await asyncio.gather(
        arrivals(random.Random(seed), args.pressure_bg_rate, background, bg_tasks),
        arrivals(random.Random(seed + 1), args.pressure_urgent_rate, urgent, urgent_tasks),
    )
    bg = await asyncio.gather(*bg_tasks)
    ur = await asyncio.gather(*urgent_tasks)
    wall = time.perf_counter() - t0
    u, b = summarize(ur), summarize(bg)
    return {
        "urgent_n": u["n"],
        "urgent_ttft_p50": u["ttft_p50"],
        "urgent_ttft_p99": u["ttft_p99"],
        "urgent_ttft_max": u["ttft_max"],
        "background_n": b["n"],
        "background_ttft_p50": b["ttft_p50"],
        "background_ttft_p99": b["ttft_p99"],
        "background_tok_s": round(sum(o["n"] for o in bg) / wall, 1),
        "wall_s": round(wall, 2),
    }


# --- engines ---------------------------------------------------------------------------------------


def model_folder(models: dict[str, Path], weights: str) -> Path:
    """The checkpoint folder of weight format ``weights``: AWQ and GPTQ have their own, bf16 and
    FP8 (quantized online) share the bf16 one."""
    return models[weights if weights in ("awq", "gptq") else "8b"]


def engine_config(
    args: argparse.Namespace, name: str, models: dict[str, Path], *, warmup: str, blocks: int | None = None
) -> EngineConfig:
    """The engine configuration of ``name`` (``bf16``, ``fp8``, ``awq``, ``gptq``, optional
    ``+kvfp8``, INT4 also ``+bf16``)."""
    weights, *suffixes = name.split("+")
    int4 = weights in ("awq", "gptq")
    if (
        weights not in CONFIG_NAMES
        or any(x not in CONFIG_SUFFIXES for x in suffixes)
        or ("bf16" in suffixes and not int4)
    ):
        raise SystemExit(
            f"unknown configuration {name!r}: use {', '.join(CONFIG_NAMES)} with an optional +kvfp8 "
            "(awq and gptq also +bf16)"
        )
    extra: dict[str, Any] = {}
    if blocks is not None:
        extra["num_gpu_blocks_override"] = blocks
    return EngineConfig(
        model=str(model_folder(models, weights)),
        load_format="dummy",
        dtype="float16" if int4 and "bf16" not in suffixes else "bfloat16",
        quantization="fp8" if weights == "fp8" else None,
        kv_cache_dtype="fp8" if "kvfp8" in suffixes else "auto",
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=4096,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        enable_prefix_caching=True,
        scheduling_policy="priority",
        request_timeout_s=None,
        incident_warmup=warmup == "incident",
        extra_engine_args=extra,
    )


INT4_GROUP = 128
"""Group size of the AWQ / GPTQ test checkpoints (``make-test-model --quant``)."""


def weight_bytes(model_dir: Path, weights: str) -> int:
    """Bytes of weights one decode step reads, from the checkpoint's shapes and ``weights`` format
    (``bf16``, ``fp8``, ``awq``, ``gptq``): the linear layers in that format (INT4: packed 4-bit
    values plus an fp16 scale and a 4-bit zero point per group of 128), embeddings, the output
    head and the norms in 16 bits, as vLLM keeps them. Dummy weights have no file to measure."""
    c = json.loads((model_dir / "config.json").read_text())
    hidden, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    head_dim = hidden // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * head_dim
    linear = layers * (hidden * (hidden + 2 * kv) + hidden * hidden + 3 * hidden * inter)
    per_param = {
        "bf16": 2.0,
        "fp8": 1.0,
        "awq": 0.5 + (2 + 0.5) / INT4_GROUP,
        "gptq": 0.5 + (2 + 0.5) / INT4_GROUP,
    }[weights]
    heads = 1 if c.get("tie_word_embeddings") else 2
    sixteen_bit = heads * c["vocab_size"] * hidden + (2 * layers + 1) * hidden
    return int(linear * per_param + sixteen_bit * 2)


_BANDWIDTH_PROBE = r"""
import json, torch
n = 4 << 30  # 4 GiB each way: far beyond every cache
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3):
    b.copy_(a)
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    b.copy_(a)
end.record(); torch.cuda.synchronize()
seconds = start.elapsed_time(end) / 1000
print(json.dumps({"hbm_gb_s": round(2 * n * 20 / seconds / 1e9, 1), "device": torch.cuda.get_device_name()}))
"""


def measure_hbm_bandwidth() -> dict[str, Any]:
    """Device-to-device copy bandwidth (read + write bytes per second) of 4 GiB buffers, measured
    in a child process so this process never holds a CUDA context beside the engines."""
    import subprocess

    try:
        done = subprocess.run(
            [sys.executable, "-c", _BANDWIDTH_PROBE], capture_output=True, text=True, timeout=120, check=True
        )
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as exc:
        logger.warning("HBM bandwidth not measured: %s", exc)
        return {"error": f"{type(exc).__name__}: {exc}"}


async def wait_for_gpu_memory(fraction: float) -> None:
    """:func:`run_meta.wait_for_gpu_memory` off the event loop."""
    await asyncio.to_thread(wait_for_gpu_memory_sync, fraction)


def bandwidth_floor(name: str, models: dict[str, Path], hbm: dict[str, Any]) -> dict[str, Any]:
    """Weight bytes of configuration ``name`` and its single-stream TPOT floor: one decode step
    must read every weight once, so TPOT >= weight bytes / measured HBM bandwidth."""
    weights = name.partition("+")[0]
    folder = model_folder(models, weights)
    size = weight_bytes(folder, weights)
    out: dict[str, Any] = {"weight_gb": round(size / 1e9, 2)}
    if hbm.get("hbm_gb_s"):
        out["tpot_floor_ms"] = round(size / (hbm["hbm_gb_s"] * 1e9) * 1000, 2)
    return out


def kv_capacity_tokens(llm: Any, block_size: int) -> int | None:
    """KV-cache capacity in tokens, as the engine core sized it."""
    try:
        blocks = llm.vllm_config.cache_config.num_gpu_blocks
    except AttributeError:
        return None
    return int(blocks) * block_size if blocks else None


class OpsbotEngine:
    """A fresh ``VllmEngine`` behind admission, started with the bot's warm-up."""

    def __init__(self, cfg: EngineConfig, wl: Workload) -> None:
        self.cfg, self.wl = cfg, wl
        self.engine = VllmEngine(cfg)

    async def __aenter__(self) -> OpsbotEngine:
        await wait_for_gpu_memory(self.cfg.gpu_memory_utilization + 0.02)
        await self.engine.start([ChatMessage("system", self.wl.system)])
        assert self.engine.warmup_prompt_tokens == self.wl.system_tokens
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.engine.shutdown(drain_timeout_s=5)

    def client(self, admission: AdmissionConfig | None = None) -> Client:
        return OpsbotClient(AdmittedEngine(self.engine, admission or AdmissionConfig()))

    def facts(self) -> dict[str, Any]:
        return vllm_facts(self.engine, self.cfg)

    def kv_usage(self) -> float | None:
        """The KV cache's fill (0-1) at vLLM's last step."""
        return self.engine.stats().kv_cache_usage


def vllm_facts(engine: VllmEngine, cfg: EngineConfig) -> dict[str, Any]:
    """Startup time, quantization, KV capacity, prefix-cache hit rate and preemptions of ``engine``."""
    stats = engine.stats()
    return {
        "startup_s": round(engine.startup_s or 0.0, 1),
        "quantization": engine.quantization.describe() if engine.quantization else None,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "kv_capacity_tokens": kv_capacity_tokens(engine._llm, cfg.block_size),
        "prefix_cache_hit_rate": stats.prefix_cache_hit_rate,
        "preemptions": stats.preemptions,
    }


class RawEngine:
    """A fresh raw ``AsyncLLM`` with the same arguments, warmed up alike (system prompt; and the
    same incident-shaped warm-up when the opsbot side has it)."""

    def __init__(self, cfg: EngineConfig, wl: Workload, quantization: str | None) -> None:
        self.cfg, self.wl, self.quantization = cfg, wl, quantization
        self.sink = StatsSink()
        self.llm: Any = None
        self.startup_s = 0.0

    async def __aenter__(self) -> RawEngine:
        from vllm import SamplingParams, TokensPrompt
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        await wait_for_gpu_memory(self.cfg.gpu_memory_utilization + 0.02)
        t0 = time.perf_counter()
        args = AsyncEngineArgs(**engine_args_kwargs(self.cfg, self.quantization))
        # The same stat logger as the opsbot engine: equal per-step cost, and preemption counts.
        self.llm = AsyncLLM.from_engine_args(args, stat_loggers=[stat_logger_factory(self.sink)])
        sp = SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.DELTA)
        async for _ in self.llm.generate(
            TokensPrompt(prompt_token_ids=self.wl.warmup_ids), sp, request_id="warmup"
        ):
            pass
        if self.cfg.incident_warmup:
            await warm_incident_shapes(self.llm, self.wl.warmup_ids, self.cfg, vocab_size=self.wl.vocab_size)
        self.startup_s = time.perf_counter() - t0
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.llm.shutdown()

    def client(self, admission: AdmissionConfig | None = None) -> Client:
        return RawClient(self.llm, priority=self.cfg.scheduling_policy == "priority")

    def facts(self) -> dict[str, Any]:
        return {
            "startup_s": round(self.startup_s, 1),
            "kv_capacity_tokens": kv_capacity_tokens(self.llm, self.cfg.block_size),
            "prefix_cache_hit_rate": self.sink.prefix_cache_hit_rate,
            "preemptions": self.sink.preemptions,
        }

    def kv_usage(self) -> float | None:
        """The KV cache's fill (0-1) at vLLM's last step."""
        return self.sink.kv_cache_usage


def open_engine(layer: str, cfg: EngineConfig, wl: Workload) -> OpsbotEngine | RawEngine:
    return OpsbotEngine(cfg, wl) if layer == "opsbot" else RawEngine(cfg, wl, cfg.quantization)


async def bench_engine(
    layer: str, cfg: EngineConfig, wl: Workload, args: argparse.Namespace
) -> dict[str, Any]:
    """All standard workloads on one fresh engine; every episode kept."""
    out: dict[str, Any] = {"layer": layer}
    fracs: list[float] = []
    async with open_engine(layer, cfg, wl) as eng:
        client = eng.client()
        episodes = []
        for k in range(args.episodes):
            ep = await urgent_under_load(client, wl, k)
            ep["episode"] = k + 1
            episodes.append(ep)
            logger.info("%s episode %d: urgent TTFT p99 %.1f ms", layer, k + 1, ep["urgent_ttft_p99"])
        out["episodes"] = episodes
        if "single" in args.workloads or "bursts" in args.workloads:
            out.update(await single_and_bursts(client, wl, cache_fracs=fracs))
        out.update(eng.facts())
    if fracs:
        out["system_prompt_cached_min"] = round(min(fracs), 4)
        out["system_prompt_cached_mean"] = round(statistics.mean(fracs), 4)
    return out


async def watch_peak(read: Any, peak: list[float], every_s: float = 0.02) -> None:
    """Keep the highest value ``read()`` returns (``None`` counts as 0) in ``peak[0]`` until cancelled."""
    while True:
        peak[0] = max(peak[0], read() or 0.0)
        await asyncio.sleep(every_s)


async def bench_pressure(cfg: EngineConfig, wl: Workload, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The pressure workload under three policies, each on its own fresh engine."""
    runs = []
    for label, layer, admission in (
        ("raw vLLM, priorities", "raw", None),
        ("opsbot, default admission", "opsbot", AdmissionConfig()),
        (
            f"opsbot, KV watermark {KV_WATERMARK}",
            "opsbot",
            AdmissionConfig(background_kv_watermark=KV_WATERMARK),
        ),
    ):
        async with open_engine(layer, cfg, wl) as eng:
            before = eng.facts()["preemptions"] or 0  # the warm-up's own are not the workload's
            peak = [0.0]
            watcher = asyncio.create_task(watch_peak(eng.kv_usage, peak))
            try:
                run = await pressure(eng.client(admission), wl, args)
            finally:
                watcher.cancel()
            facts = eng.facts()
            run.update({"policy": label, "layer": layer, **facts})
            run["preemptions"] = (facts["preemptions"] or 0) - before
            run["kv_cache_usage_peak"] = round(peak[0], 3)
            run["kv_blocks"] = args.pressure_blocks
        logger.info("pressure %s: %s", label, run)
        runs.append(run)
    return runs


async def bench_split(args: argparse.Namespace, models: dict[str, Path], wl: Workload) -> dict[str, Any]:
    """One engine per scenario (the source's advice) against one engine with lanes, same GPU, same
    workload: long root-cause answers stream while short alert summaries arrive. Both setups run
    through ``inference.engine_set.EngineSet``, the bot's own engine set: each engine behind its own
    admission controller, requests routed by their scenario (urgent = ``alert_summary``, the rest
    ``root_cause``), engines started one after another.

    ``two_engines``: a root-cause engine (``--split-rca``, e.g. bf16) at ``--split-rca-mem`` of the
    GPU as the set's default, and an alert-summary engine (``--split-summary``, e.g. awq) at
    ``--split-summary-mem`` that ``alert_summary`` is routed to. ``one_engine``: ``--split-rca``
    alone at the sum of both shares, opsbot's lanes carrying both scenarios.
    """
    out: dict[str, Any] = {}
    total = args.split_summary_mem + args.split_rca_mem
    one_cfg = engine_config(args, args.split_rca, models, warmup="incident").model_copy(
        update={"gpu_memory_utilization": total}
    )
    await wait_for_gpu_memory(total + 0.02)
    one = VllmEngine(one_cfg)
    engines = EngineSet.single(AdmittedEngine(one, AdmissionConfig()))
    await engines.start([ChatMessage("system", wl.system)])
    try:
        client = OpsbotClient(engines, scenarios=SPLIT_SCENARIOS)
        out["one_engine"] = [await urgent_under_load(client, wl, k) for k in range(args.episodes)]
        out["one_engine_facts"] = {"default": vllm_facts(one, one_cfg)}
    finally:
        await engines.shutdown(drain_timeout_s=5)
    summary_cfg = engine_config(args, args.split_summary, models, warmup="incident").model_copy(
        update={"gpu_memory_utilization": args.split_summary_mem}
    )
    rca_cfg = engine_config(args, args.split_rca, models, warmup="incident").model_copy(
        update={"gpu_memory_utilization": args.split_rca_mem}
    )
    await wait_for_gpu_memory(total + 0.02)
    rca, summary = VllmEngine(rca_cfg), VllmEngine(summary_cfg)
    engines = EngineSet(
        {
            "default": AdmittedEngine(rca, AdmissionConfig()),
            "summary": AdmittedEngine(summary, AdmissionConfig()),
        },
        {ALERT_SUMMARY: "summary"},
    )
    await engines.start([ChatMessage("system", wl.system)])
    try:
        client = OpsbotClient(engines, scenarios=SPLIT_SCENARIOS)
        out["two_engines"] = [await urgent_under_load(client, wl, k) for k in range(args.episodes)]
        out["two_engines_facts"] = {
            "default": vllm_facts(rca, rca_cfg),
            "summary": vllm_facts(summary, summary_cfg),
        }
    finally:
        await engines.shutdown(drain_timeout_s=5)
    out["setups"] = {
        "one_engine": {"default": f"{args.split_rca} at {total:g} of the GPU, every scenario"},
        "two_engines": {
            "default": f"{args.split_rca} at {args.split_rca_mem:g} of the GPU, {ROOT_CAUSE}",
            "summary": f"{args.split_summary} at {args.split_summary_mem:g} of the GPU, {ALERT_SUMMARY}",
        },
    }
    out["compare"] = split_compare(out)
    return out


SPLIT_SCENARIOS = {Lane.URGENT: ALERT_SUMMARY, Lane.NORMAL: ROOT_CAUSE, Lane.BACKGROUND: ROOT_CAUSE}
"""The split workload's scenario per lane: urgent questions are alert summaries, the long
background answers root-cause analyses."""


def split_compare(split: dict[str, Any]) -> dict[str, Any]:
    """Two engines against one, first episode with first and steady (median of the 2nd and later)
    with steady: urgent TTFT P99 and total tokens/s, as two / one ratios."""
    verdict: dict[str, Any] = {}
    one, two = split.get("one_engine") or [], split.get("two_engines") or []
    if not one or not two:
        return verdict
    phases = ["first", *(["steady"] if len(one) > 1 and len(two) > 1 else [])]
    for key in ("urgent_ttft_p99", "total_tok_s"):
        for phase in phases:
            xs, ys = [float(e[key]) for e in one], [float(e[key]) for e in two]
            a, b = (
                (xs[0], ys[0]) if phase == "first" else (statistics.median(xs[1:]), statistics.median(ys[1:]))
            )
            verdict[f"{key}_{phase}"] = {
                "one_engine": a,
                "two_engines": b,
                "two_over_one": round(b / a, 3) if a else None,
            }
    return verdict


# --- report --------------------------------------------------------------------------------------


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """opsbot against raw, per configuration and warm-up: bursts, and episodes first vs first and
    steady (median of the 2nd and later) vs steady."""
    verdicts: dict[str, Any] = {}
    for key in sorted({(r["config"], r["warmup"]) for r in runs}):
        ops = next((r for r in runs if (r["config"], r["warmup"]) == key and r["layer"] == "opsbot"), None)
        raw = next((r for r in runs if (r["config"], r["warmup"]) == key and r["layer"] == "raw"), None)
        v: dict[str, Any] = {}
        for side, run in (("opsbot", ops), ("raw", raw)):
            if run and run.get("episodes"):
                p99 = [e["urgent_ttft_p99"] for e in run["episodes"]]
                v[f"{side}_urgent_p99_first"] = p99[0]
                v[f"{side}_urgent_p99_steady"] = (
                    round(statistics.median(p99[1:]), 1) if len(p99) > 1 else None
                )
        if ops and raw and "burst64" in ops and "burst64" in raw:
            for n in BURSTS:
                o, r = ops[f"burst{n}"], raw[f"burst{n}"]
                v[f"burst{n}_ttft_p99_ratio"] = round(o["ttft_p99"] / r["ttft_p99"], 3)
                v[f"burst{n}_tok_s_ratio"] = round(o["tok_s"] / r["tok_s"], 3)
        verdicts[f"{key[0]} / warm-up {key[1]}"] = v
    return verdicts


def meta_header(meta_info: dict[str, Any]) -> list[str]:
    """The Markdown lines that say when, where, with what and how a result was made."""
    names = ("vllm", "torch", "transformers", "python")
    versions = ", ".join(f"{k} {meta_info[k]}" for k in names if k in meta_info)
    where = meta_info.get("gpu", meta_info.get("host", "?"))
    return [
        f"Run {meta_info.get('date', '?')} on {where} ({versions}).",
        f"Command: `{meta_info.get('command', '?')}`",
        "",
    ]


def table(report: dict[str, Any]) -> str:
    runs = [r for r in report["runs"] if "error" not in r]
    lines = [
        *meta_header(report.get("meta", {})),
        f"HBM bandwidth (device copy, read + write): {report.get('hbm', {}).get('hbm_gb_s', '?')} GB/s; "
        "TPOT floor = weight bytes / that bandwidth.",
        "",
        "| config | warm-up | layer | startup s | weights GB | KV tokens | single TTFT cold / warm ms | "
        "TPOT ms | TPOT floor ms (x) | burst 8 / 32 / 64 TTFT p99 ms | burst 64 tok/s | "
        "sys prompt cached (min) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "burst64" not in r:
            continue
        lines.append(
            f"| {r['config']} | {r['warmup']} | {r['layer']} | {r['startup_s']} | {r.get('weight_gb')} | "
            f"{r.get('kv_capacity_tokens')} | "
            f"{r['single_cold']['ttft']} / {r['single_warm']['ttft']} | {r['single_warm']['tpot']} | "
            f"{r.get('tpot_floor_ms')} ({r.get('tpot_over_floor')}) | "
            f"{r['burst8']['ttft_p99']} / {r['burst32']['ttft_p99']} / {r['burst64']['ttft_p99']} | "
            f"{r['burst64']['tok_s']} | {r.get('system_prompt_cached_min', float('nan')):.3f} |"
        )
    lines += [
        "",
        "Urgent under load, every episode on each fresh engine (56 x 500-token background, then 8 x 64-token "
        "urgent; opsbot with its default admission, raw vLLM with priorities):",
        "",
        "| config | warm-up | layer | episode | urgent TTFT p50 / p99 ms | urgent TPOT ms | "
        "background TTFT p99 ms | total tok/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        for e in r.get("episodes", []):
            lines.append(
                f"| {r['config']} | {r['warmup']} | {r['layer']} | {e['episode']} | {e['urgent_ttft_p50']} / "
                f"{e['urgent_ttft_p99']} | {e['urgent_tpot_p50']} | {e['background_ttft_p99']} | "
                f"{e['total_tok_s']} |"
            )
    if report.get("pressure"):
        lines += [
            "",
            "Pressure (Poisson background arrivals with 2k-token contexts beside Poisson urgent questions, "
            "small KV cache):",
            "",
            "| policy | KV tokens | urgent n | urgent TTFT p50 / p99 / max ms | background n | "
            "background TTFT p99 ms | background tok/s | preemptions | peak KV use |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for p in report["pressure"]:
            lines.append(
                f"| {p['policy']} | {p.get('kv_capacity_tokens')} | {p['urgent_n']} | "
                f"{p['urgent_ttft_p50']} / "
                f"{p['urgent_ttft_p99']} / {p['urgent_ttft_max']} | {p['background_n']} | "
                f"{p['background_ttft_p99']} | {p['background_tok_s']} | {p.get('preemptions')} | "
                f"{p.get('kv_cache_usage_peak', '')} |"
            )
    if report.get("split"):
        split = report["split"]
        lines += [
            "",
            "One engine per scenario vs one engine with lanes (urgent = alert summaries, background = "
            "root-cause answers):",
            "",
            "| setup | episode | urgent TTFT p50 / p99 ms | background TTFT p99 ms | total tok/s |",
            "|---|---|---|---|---|",
        ]
        for setup in ("one_engine", "two_engines"):
            for k, e in enumerate(split.get(setup, []), start=1):
                lines.append(
                    f"| {setup.replace('_', ' ')} | {k} | {e['urgent_ttft_p50']} / {e['urgent_ttft_p99']} | "
                    f"{e['background_ttft_p99']} | {e['total_tok_s']} |"
                )
        lines += [
            "",
            "Two engines / one engine (first episode with first, steady with steady):",
            "",
            "```json",
        ]
        lines.append(json.dumps(split.get("compare", {}), indent=2))
        lines.append("```")
    lines += ["", "Comparisons (first episode with first, steady with steady):", "", "```json"]
    lines.append(json.dumps(report.get("compare", {}), indent=2))
    lines.append("```")
    return "\n".join(lines)


def model_folders(args: argparse.Namespace) -> dict[str, Path]:
    from inference.testmodel import TEST_MODEL_VERSION, build_test_model

    base = Path(args.model_dir) if args.model_dir else ROOT / ".pytest_cache" / "opsbot-models"
    folders = {"8b": build_test_model(base / f"8b-v{TEST_MODEL_VERSION}", "8b")}
    wanted = [
        *args.configs.split(","),
        args.pressure,
        *((args.split_summary, args.split_rca) if args.split else ()),
    ]
    for quant in ("awq", "gptq"):
        if any(c.partition("+")[0] == quant for c in wanted if c):
            folders[quant] = build_test_model(base / f"8b-{quant}-v{TEST_MODEL_VERSION}", "8b", quant=quant)  # type: ignore[arg-type]
    return folders


def pressure_prompt_counts(args: argparse.Namespace) -> tuple[int, int]:
    """(background, urgent) prompts the pressure workload needs: its expected arrivals with room
    for Poisson's spread (none without ``--pressure``)."""
    if not args.pressure:
        return (64, 1)

    def enough(rate: float) -> int:
        return int(rate * args.pressure_seconds * 1.5) + 16

    return (enough(args.pressure_bg_rate), enough(args.pressure_urgent_rate))


async def main_async(args: argparse.Namespace) -> int:
    from inference.tokenization import HFChatTokenizer

    models = model_folders(args)
    tokenizer = HFChatTokenizer(str(models["8b"]))
    wl = build_workload(
        tokenizer,
        repeats=args.burst_repeats,
        episodes=args.episodes,
        same_episode_prompts=args.same_episode_prompts,
        pressure_prompts=pressure_prompt_counts(args),
    )
    configs = [c for c in args.configs.split(",") if c]
    layers = [x for x in args.layers.split(",") if x]
    warmups = [w for w in args.warmups.split(",") if w]
    args.workloads = {w for w in args.workloads.split(",") if w}
    logger.info(
        "workload: system prompt %d tokens, burst prompt %d tokens, pressure context %d tokens",
        wl.system_tokens,
        len(wl.bursts[8][0]),
        len(wl.pressure_background[0]),
    )
    report: dict[str, Any] = {
        "meta": run_meta(sys.argv),
        "workload": {"system_prompt_tokens": wl.system_tokens},
        "runs": [],
    }
    out = Path(args.out)
    plan = [(c, w, layer) for c in configs for w in warmups for layer in layers]
    if args.dry_run:
        print(json.dumps({"plan": plan, "pressure": args.pressure, **report}, indent=2))
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    report["hbm"] = measure_hbm_bandwidth() if configs else {}
    logger.info("HBM bandwidth: %s", report["hbm"])

    def save() -> None:
        report["compare"] = compare([r for r in report["runs"] if "error" not in r])
        out.write_text(json.dumps(report, indent=2) + "\n")
        out.with_suffix(".md").write_text(table(report) + "\n")

    for k, (name, warmup, layer) in enumerate(plan, start=1):
        logger.info("=== engine %d of %d: %s / warm-up %s / %s ===", k, len(plan), name, warmup, layer)
        cfg = engine_config(args, name, models, warmup=warmup)
        try:
            run = await bench_engine(layer, cfg, wl, args)
        except Exception as exc:  # keep the other engines' numbers
            logger.exception("%s / %s / %s failed", name, warmup, layer)
            run = {"layer": layer, "error": f"{type(exc).__name__}: {exc}"}
        run.update({"config": name, "warmup": warmup, **bandwidth_floor(name, models, report["hbm"])})
        if run.get("tpot_floor_ms") and run.get("single_warm", {}).get("tpot"):
            run["tpot_over_floor"] = round(run["single_warm"]["tpot"] / run["tpot_floor_ms"], 2)
        report["runs"].append(run)
        save()
    if args.split:
        try:
            report["split"] = await bench_split(args, models, wl)
        except Exception as exc:
            logger.exception("split failed")
            report["split_error"] = f"{type(exc).__name__}: {exc}"
        save()
    if args.pressure:
        cfg = engine_config(args, args.pressure, models, warmup="incident", blocks=args.pressure_blocks)
        try:
            report["pressure"] = await bench_pressure(cfg, wl, args)
        except Exception as exc:
            logger.exception("pressure failed")
            report["pressure_error"] = f"{type(exc).__name__}: {exc}"
        save()
    print(table(report))
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--configs",
        default="bf16",
        help="comma list of bf16, fp8, awq, gptq (each optionally +kvfp8; awq and gptq also +bf16)",
    )
    p.add_argument("--layers", default="opsbot,raw", help="comma list of opsbot, raw")
    p.add_argument("--warmups", default="system,incident", help="comma list of system, incident")
    p.add_argument(
        "--workloads", default="single,bursts", help="besides the episodes: single, bursts (or none)"
    )
    p.add_argument("--episodes", type=int, default=4, help="urgent-under-load episodes per fresh engine")
    p.add_argument(
        "--same-episode-prompts",
        action="store_true",
        help="repeat the first episode's prompts (later episodes hit the prefix cache: the old behaviour)",
    )
    p.add_argument(
        "--pressure", default="", help="run the pressure workload on this configuration (e.g. bf16)"
    )
    p.add_argument(
        "--pressure-blocks", type=int, default=5000, help="KV-cache blocks for the pressure engines"
    )
    p.add_argument(
        "--pressure-seconds", type=float, default=20.0, help="arrival window of the pressure workload"
    )
    p.add_argument("--pressure-bg-rate", type=float, default=12.0, help="background arrivals per second")
    p.add_argument("--pressure-urgent-rate", type=float, default=1.0, help="urgent arrivals per second")
    p.add_argument(
        "--model-dir", help="folder for the test model folders (default: .pytest_cache/opsbot-models)"
    )
    p.add_argument("--split", action="store_true", help="one engine per scenario vs one engine with lanes")
    p.add_argument("--split-summary", default="awq", help="the alert-summary engine's configuration")
    p.add_argument("--split-rca", default="bf16", help="the root-cause engine's configuration")
    p.add_argument("--split-summary-mem", type=float, default=0.3, help="GPU memory share, summary engine")
    p.add_argument("--split-rca-mem", type=float, default=0.55, help="GPU memory share, root-cause engine")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--burst-repeats", type=int, default=1, help="run each burst N times with fresh prompts")
    p.add_argument(
        "--out",
        default=str(ROOT / "bench" / "results" / f"engine_bench-{dt.date.today().isoformat()}.json"),
        help="JSON result path (a .md report is written beside it)",
    )
    p.add_argument("--dry-run", action="store_true", help="build the workload and print the plan; no vLLM")
    return p.parse_args(argv)


def main() -> int:
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(main_async(parse_args()))


if __name__ == "__main__":
    sys.exit(main())
