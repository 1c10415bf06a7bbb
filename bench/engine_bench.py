"""Engine benchmark: opsbot's engine layer against raw vLLM ``AsyncLLM``, same GPU, same run.

For each configuration (``bf16``, ``fp8`` = online FP8 from the bf16 checkpoint) two engines are
started one after the other with identical vLLM arguments (``inference.vllm_engine.engine_args_kwargs``):

- ``opsbot``: ``AdmittedEngine(VllmEngine)``: the path the bot uses (token ids from the chat
  template, warm-up of the shared system prompt at start, lanes, admission control);
- ``raw``: ``AsyncLLM.from_engine_args`` driven directly, fed the very same token ids, warmed up
  with the same system prompt, lanes passed only as vLLM priorities.

Workloads (as ``/work/shared/gpu/probe_vllm.py``): ~1470-token shared system prompt + ~300-token
user text, 200 output tokens (ignore_eos, greedy): single request with a cold and with a warm
system prompt, bursts of 8 / 32 / 64 concurrent requests (urgent lane), and urgent-under-load:
56 long background requests (500 tokens), 0.3 s later 8 short urgent ones (64 tokens). The
urgent test runs once per admission variant on the opsbot engine (``none`` = lanes as vLLM
priorities only), and once on raw vLLM with priorities.

Usage (on the GPU machine, vLLM importable)::

    python bench/engine_bench.py --configs bf16,fp8 --out bench/results/engine_bench.json

``--dry-run`` builds the prompts and prints the plan without vLLM (works on CPU).
Results: a JSON file (written after every engine, so a timeout keeps what finished) and a
markdown table next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import logging
import os
import platform
import random
import shlex
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inference.admission import AdmissionConfig, AdmittedEngine  # noqa: E402
from inference.config import EngineConfig  # noqa: E402
from inference.engine import (  # noqa: E402
    ChatMessage,
    Engine,
    GenerationRequest,
    GenerationResult,
    Lane,
    SamplingSettings,
    TextDelta,
)
from inference.vllm_engine import VllmEngine, engine_args_kwargs  # noqa: E402

logger = logging.getLogger("engine_bench")

# The probe's vocabulary, so prompts have the probe's token counts.
WORDS = [
    *("pod", "crashloopbackoff", "namespace", "production", "restart", "oom", "memory", "cpu"),
    *("latency", "p99", "database", "connection", "pool", "alert", "firing"),
]
BURSTS = (8, 32, 64)

VARIANTS: dict[str, AdmissionConfig | None] = {
    # Lanes only as vLLM priorities: what the engine layer alone gives.
    "none": None,
    # The shipped defaults.
    "default": AdmissionConfig(),
    # Looser and tighter background prefill pacing, to show the trade-off.
    "bg-prefill-2": AdmissionConfig(max_prefilling={Lane.NORMAL: 8, Lane.BACKGROUND: 2}),
    "bg-prefill-4": AdmissionConfig(max_prefilling={Lane.NORMAL: 8, Lane.BACKGROUND: 4}),
    # The background in-flight cap of the first run (48 < 56 requests): a second wave.
    "bg-cap-48": AdmissionConfig(max_in_flight={Lane.URGENT: 64, Lane.NORMAL: 56, Lane.BACKGROUND: 48}),
}


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
    system: str = field(repr=False, default="")
    repeats: int = 1
    """Times each burst runs (fresh prompts each time); results pool them and keep each p99."""


def build_workload(tokenizer: Any, seed: int = 0, repeats: int = 1) -> Workload:
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
        system=system,
        repeats=repeats,
    )
    # Further repeats get fresh user texts (drawn after everything else, so the first repeat is
    # the same workload as a single-repeat run): a repeated prompt would be served from cache.
    for n in BURSTS:
        workload.bursts[n] += [ids(text(250)) for _ in range(n * (repeats - 1))]
    return workload


# --- one request through either layer ------------------------------------------------------------


class Client:
    """Sends one request and measures it with the benchmark's own clock (same for both layers)."""

    name = "abstract"

    async def one(self, ids: list[int], max_tokens: int, lane: Lane) -> dict[str, Any]:
        raise NotImplementedError


class OpsbotClient(Client):
    name = "opsbot"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def one(self, ids: list[int], max_tokens: int, lane: Lane) -> dict[str, Any]:
        req = GenerationRequest(
            request_id=uuid.uuid4().hex,
            scenario="bench",
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


async def urgent_under_load(client: Client, wl: Workload) -> dict[str, Any]:
    t0 = time.perf_counter()
    bg = [asyncio.create_task(client.one(ids, 500, Lane.BACKGROUND)) for ids in wl.background]
    await asyncio.sleep(0.3)
    urgent = await asyncio.gather(*[client.one(ids, 64, Lane.URGENT) for ids in wl.urgent])
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


async def run_workloads(client: Client, wl: Workload, *, cache_fracs: list[float]) -> dict[str, Any]:
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


async def bench_opsbot(cfg: EngineConfig, wl: Workload, variants: list[str]) -> dict[str, Any]:
    engine = VllmEngine(cfg)
    await engine.start([ChatMessage("system", wl.system)])
    assert engine.warmup_prompt_tokens == wl.system_tokens, (engine.warmup_prompt_tokens, wl.system_tokens)
    out: dict[str, Any] = {
        "layer": "opsbot",
        "startup_s": round(engine.startup_s or 0.0, 1),
        "quantization": engine.quantization.describe() if engine.quantization else None,
    }
    fracs: list[float] = []
    try:
        out.update(await run_workloads(OpsbotClient(AdmittedEngine(engine)), wl, cache_fracs=fracs))
        # Burst of 64 in the normal lane: shows what the normal lane's prefill pacing costs.
        normal = OpsbotClient(AdmittedEngine(engine))
        outs = await asyncio.gather(*[normal.one(ids, 200, Lane.NORMAL) for ids in wl.bursts[64]])
        out["burst64_normal_lane"] = summarize(outs)
        out["urgent_under_load"] = {}
        for name in variants:
            adm = VARIANTS[name]
            client = OpsbotClient(engine if adm is None else AdmittedEngine(engine, adm))
            out["urgent_under_load"][name] = await urgent_under_load(client, wl)
            logger.info("opsbot urgent-under-load %s: %s", name, out["urgent_under_load"][name])
        stats = engine.stats()
        out["engine_stats"] = {
            "prefix_cache_hit_rate": stats.prefix_cache_hit_rate,
            "preemptions": stats.preemptions,
            "kv_cache_usage": stats.kv_cache_usage,
        }
    finally:
        await engine.shutdown(drain_timeout_s=5)
    out["system_prompt_cached_min"] = round(min(fracs), 4)
    out["system_prompt_cached_mean"] = round(statistics.mean(fracs), 4)
    return out


async def bench_raw(cfg: EngineConfig, quantization: str | None, wl: Workload) -> dict[str, Any]:
    from vllm import SamplingParams, TokensPrompt
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    t0 = time.perf_counter()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_args_kwargs(cfg, quantization)))
    # The same warm-up the opsbot engine does: the system prompt once, one token.
    sp = SamplingParams(max_tokens=1, temperature=0.0, output_kind=RequestOutputKind.DELTA)
    async for _ in llm.generate(TokensPrompt(prompt_token_ids=wl.warmup_ids), sp, request_id="warmup"):
        pass
    out: dict[str, Any] = {"layer": "raw", "startup_s": round(time.perf_counter() - t0, 1)}
    fracs: list[float] = []
    try:
        client = RawClient(llm, priority=cfg.scheduling_policy == "priority")
        out.update(await run_workloads(client, wl, cache_fracs=fracs))
        out["urgent_under_load"] = {"raw-priority": await urgent_under_load(client, wl)}
        logger.info("raw urgent-under-load: %s", out["urgent_under_load"])
    finally:
        llm.shutdown()
    out["system_prompt_cached_min"] = round(min(fracs), 4)
    out["system_prompt_cached_mean"] = round(statistics.mean(fracs), 4)
    return out


# --- report --------------------------------------------------------------------------------------


def compare(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Targets per configuration: overhead vs raw, urgent TTFT, cache, startup."""
    verdicts: dict[str, Any] = {}
    for config in sorted({r["config"] for r in runs}):
        ops = next((r for r in runs if r["config"] == config and r["layer"] == "opsbot"), None)
        raw = next((r for r in runs if r["config"] == config and r["layer"] == "raw"), None)
        v: dict[str, Any] = {}
        if ops and raw:
            for n in BURSTS:
                o, r = ops[f"burst{n}"], raw[f"burst{n}"]
                v[f"burst{n}"] = {
                    "ttft_p99_ratio": round(o["ttft_p99"] / r["ttft_p99"], 3),
                    # Median over repeats of each burst's own p99: robust to one noisy burst.
                    "ttft_p99_median_ratio": round(
                        statistics.median(o.get("ttft_p99_each", [o["ttft_p99"]]))
                        / statistics.median(r.get("ttft_p99_each", [r["ttft_p99"]])),
                        3,
                    ),
                    "tok_s_ratio": round(o["tok_s"] / r["tok_s"], 3),
                    "within_5pct": o["ttft_p99"] <= 1.05 * r["ttft_p99"] and o["tok_s"] >= 0.95 * r["tok_s"],
                }
            raw_u = raw["urgent_under_load"]["raw-priority"]
            v["urgent"] = {}
            for name, u in ops.get("urgent_under_load", {}).items():
                v["urgent"][name] = {
                    "urgent_ttft_p99": u["urgent_ttft_p99"],
                    "raw_urgent_ttft_p99": raw_u["urgent_ttft_p99"],
                    "tok_s_ratio_vs_raw": round(u["total_tok_s"] / raw_u["total_tok_s"], 3),
                    "meets_100ms": u["urgent_ttft_p99"] <= 100.0,
                    "tok_s_down_at_most_10pct": u["total_tok_s"] >= 0.90 * raw_u["total_tok_s"],
                }
        if ops:
            v["system_prompt_cached_min"] = ops["system_prompt_cached_min"]
            v["cache_target_95pct"] = ops["system_prompt_cached_min"] >= 0.95
            v["startup_s"] = ops["startup_s"]
            v["startup_target_60s"] = ops["startup_s"] <= 60.0
        verdicts[config] = v
    return verdicts


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| config | layer | startup s | single TTFT cold / warm ms | TPOT ms | burst 8 TTFT p99 | "
        "burst 32 TTFT p99 | burst 64 TTFT p50 / p99 | burst 64 tok/s | sys prompt cached (min) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        if "burst64" not in r:
            continue
        lines.append(
            f"| {r['config']} | {r['layer']} | {r['startup_s']} | {r['single_cold']['ttft']} / "
            f"{r['single_warm']['ttft']} | {r['single_warm']['tpot']} | {r['burst8']['ttft_p99']} | "
            f"{r['burst32']['ttft_p99']} | {r['burst64']['ttft_p50']} / {r['burst64']['ttft_p99']} | "
            f"{r['burst64']['tok_s']} | {r['system_prompt_cached_min']:.3f} |"
        )
    lines += [
        "",
        "Urgent under load (56 x 500-token background, then 8 x 64-token urgent):",
        "",
        "| config | layer | admission | urgent TTFT p50 / p99 / max ms | background TTFT p50 / p99 ms | "
        "total tok/s | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        for name, u in r.get("urgent_under_load", {}).items():
            lines.append(
                f"| {r['config']} | {r['layer']} | {name} | {u['urgent_ttft_p50']} / "
                f"{u['urgent_ttft_p99']} / {u['urgent_ttft_max']} | "
                f"{u['background_ttft_p50']} / {u['background_ttft_p99']} | "
                f"{u['total_tok_s']} | {u['wall_s']} |"
            )
    return "\n".join(lines)


def meta(argv: list[str]) -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": "python " + " ".join(shlex.quote(a) for a in argv),
        "python": platform.python_version(),
        "host": platform.node(),
    }
    try:
        info["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        ).stdout.strip()
    except OSError as exc:
        info["gpu"] = f"unknown ({exc})"
    for mod in ("vllm", "torch", "transformers"):
        try:
            info[mod] = __import__(mod).__version__
        except Exception as exc:  # noqa: BLE001 - report, do not fail the run
            info[mod] = f"unavailable ({type(exc).__name__})"
    return info


def engine_config(args: argparse.Namespace, model: Path, name: str) -> EngineConfig:
    return EngineConfig(
        model=str(model),
        load_format="dummy",
        dtype="bfloat16",
        quantization="fp8" if name == "fp8" else None,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_model_len=4096,
        max_num_seqs=64,
        max_num_batched_tokens=8192,
        enable_prefix_caching=True,
        scheduling_policy="priority",
        request_timeout_s=None,
    )


async def main_async(args: argparse.Namespace) -> int:
    from inference.testmodel import TEST_MODEL_VERSION, build_test_model
    from inference.tokenization import HFChatTokenizer

    model = (
        Path(args.model_dir)
        if args.model_dir
        else ROOT / ".pytest_cache" / "opsbot-models" / f"8b-v{TEST_MODEL_VERSION}"
    )
    build_test_model(model, "8b")
    tokenizer = HFChatTokenizer(str(model))
    wl = build_workload(tokenizer, repeats=args.burst_repeats)
    configs = [c for c in args.configs.split(",") if c]
    layers = [x for x in args.layers.split(",") if x]
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown admission variant(s) {unknown}; known: {sorted(VARIANTS)}")
    logger.info(
        "workload: system prompt %d tokens, burst prompt %d tokens, background %d, urgent %d",
        wl.system_tokens,
        len(wl.bursts[8][0]),
        len(wl.background[0]),
        len(wl.urgent[0]),
    )
    report: dict[str, Any] = {
        "meta": meta(sys.argv),
        "workload": {"system_prompt_tokens": wl.system_tokens},
        "runs": [],
    }
    out = Path(args.out)
    if args.dry_run:
        print(
            json.dumps(
                {"plan": {"configs": configs, "layers": layers, "variants": variants}, **report}, indent=2
            )
        )
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in configs:
        cfg = engine_config(args, model, name)
        for layer in layers:
            logger.info("=== %s / %s ===", name, layer)
            try:
                if layer == "opsbot":
                    run = await bench_opsbot(cfg, wl, variants)
                else:
                    run = await bench_raw(cfg, cfg.quantization, wl)
            except Exception as exc:  # keep the other runs' numbers
                logger.exception("%s / %s failed", name, layer)
                run = {"layer": layer, "error": f"{type(exc).__name__}: {exc}"}
            run["config"] = name
            report["runs"].append(run)
            report["targets"] = compare([r for r in report["runs"] if "error" not in r])
            out.write_text(json.dumps(report, indent=2) + "\n")
    md = table([r for r in report["runs"] if "error" not in r])
    out.with_suffix(".md").write_text(md + "\n")
    print(md)
    print(json.dumps(report["targets"], indent=2))
    return 0


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--configs", default="bf16,fp8", help="comma list of bf16, fp8 (default: both)")
    p.add_argument("--layers", default="opsbot,raw", help="comma list of opsbot, raw (default: both)")
    p.add_argument(
        "--variants",
        default="none,default,bg-prefill-2,bg-prefill-4,bg-cap-48",
        help=f"admission variants for urgent-under-load on the opsbot engine ({', '.join(VARIANTS)})",
    )
    p.add_argument(
        "--model-dir", help="8B-shaped model folder (default: build the test model into .pytest_cache)"
    )
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument(
        "--burst-repeats",
        type=int,
        default=1,
        help="run each burst N times with fresh prompts (pooled + each p99)",
    )
    p.add_argument(
        "--out",
        default=str(ROOT / "bench" / "results" / f"engine_bench-{dt.date.today().isoformat()}.json"),
        help="JSON result path (a .md table is written beside it)",
    )
    p.add_argument("--dry-run", action="store_true", help="build the workload and print the plan; no vLLM")
    return p.parse_args(argv)


def main() -> int:
    logging.basicConfig(level=os.environ.get("LOG_LEVEL", "INFO"), format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(main_async(parse_args()))


if __name__ == "__main__":
    sys.exit(main())
