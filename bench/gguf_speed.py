"""Prompt and decode speed of the same model in several GGUF quantizations, on llama.cpp (CPU).

Why it exists: the default model ships as Q4_1, and llama.cpp has no fast prompt (matrix-matrix)
kernels for Q4_1 on x86, while it has them for Q8_0. This measures what that costs, on the same
prompt, the same threads and the same llama.cpp settings as opsbot's engine (extra buffers as
``engine.llamacpp_extra_buffers = "auto"`` resolves them), alternating the files episode by episode
so that a busy moment of a shared machine falls on both.

Per file and episode: the prompt evaluated from an empty cache (TTFT of a ``--prompt-tokens`` prompt,
SmolLM2's chat template around a built-in incident's context), then ``--decode`` tokens decoded one
at a time (ms/token). Every episode is kept; the summary gives the median and the worst.

Usage::

    python bench/gguf_speed.py --out bench/results/gguf_speed-$(date +%F)-cpu \\
        Q4_1=path/to/SmolLM2-135M-Instruct.Q4_1.gguf Q8_0=path/to/SmolLM2-135M-Instruct.Q8_0.gguf
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from run_meta import package_versions, run_meta  # noqa: E402

from bot.eval.cases import load_cases  # noqa: E402
from inference.llamacpp_engine import _model_params, use_extra_buffers  # noqa: E402


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def prompt_ids(llama: Any, tokens: int) -> list[int]:
    """A chat prompt of about ``tokens`` tokens: the system prompt and a built-in case's data."""
    from bot.prompts import DEFAULT_SYSTEM_PROMPT

    cases = load_cases([ROOT / "bot" / "eval" / "cases"])
    text = "\n".join(json.dumps(case.cluster)[:4000] for case in cases if case.cluster)
    ids = llama.tokenize(text.encode(), add_bos=False)[: max(0, tokens - 200)]
    body = llama.detokenize(ids).decode("utf-8", "replace")
    chat = (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{body}\n"
        "Why is the pod failing?<|im_end|>\n<|im_start|>assistant\n"
    )
    return llama.tokenize(chat.encode(), add_bos=False, special=True)[:tokens]


def episode(llama: Any, prompt: list[int], decode: int) -> dict[str, float]:
    llama.reset()
    started = time.perf_counter()
    llama.eval(prompt)
    prefill_s = time.perf_counter() - started
    token = int(llama._scores[-1].argmax())
    started = time.perf_counter()
    for _ in range(decode):
        llama.eval([token])
        token = int(llama._scores[-1].argmax())
    return {
        "prompt_s": round(prefill_s, 3),
        "decode_ms_per_token": round((time.perf_counter() - started) * 1e3 / decode, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", nargs="+", help="LABEL=path.gguf, two or more")
    parser.add_argument("--out", type=Path, required=True, help="path prefix of the .json and .md results")
    parser.add_argument("--episodes", type=int, default=5, help="episodes per file (alternating)")
    parser.add_argument("--prompt-tokens", type=int, default=1320, help="prompt length in tokens")
    parser.add_argument("--decode", type=int, default=40, help="tokens decoded after the prompt")
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp threads")
    args = parser.parse_args()
    import llama_cpp

    models: dict[str, Any] = {}
    for spec in args.files:
        label, _, path = spec.partition("=")
        with _model_params(llama_cpp, extra_buffers=use_extra_buffers("auto")):
            models[label] = llama_cpp.Llama(
                model_path=path, n_ctx=4096, n_batch=512, n_threads=args.threads,
                n_threads_batch=args.threads, verbose=False,
            )  # fmt: skip
    first = next(iter(models.values()))
    prompt = prompt_ids(first, args.prompt_tokens)
    for llama in models.values():  # warm-up: page the weights in, size the buffers
        episode(llama, prompt[:64], 4)
    rows: dict[str, list[dict[str, float]]] = {label: [] for label in models}
    for n in range(args.episodes):
        for label, llama in models.items():
            rows[label].append(episode(llama, prompt, args.decode))
        say(f"episode {n + 1}/{args.episodes}: " + ", ".join(f"{k} {v[-1]}" for k, v in rows.items()))
    summary = {
        label: {
            "prompt_s_median": statistics.median(r["prompt_s"] for r in eps),
            "prompt_s_worst": max(r["prompt_s"] for r in eps),
            "decode_ms_median": statistics.median(r["decode_ms_per_token"] for r in eps),
            "decode_ms_worst": max(r["decode_ms_per_token"] for r in eps),
        }
        for label, eps in rows.items()
    }
    meta = run_meta(sys.argv)
    report = {
        "meta": meta, "versions": package_versions(), "prompt_tokens": len(prompt), "decode": args.decode,
        "threads": args.threads, "episodes": rows, "summary": summary,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    lines = [f"# gguf_speed — {', '.join(models)}", ""]
    lines += [f"- {k}: {v}" for k, v in meta.items()]
    lines += [f"- prompt {len(prompt)} tokens from an empty cache, then {args.decode} tokens decoded; "
              f"{args.threads} threads; {args.episodes} episodes per file, alternating", ""]  # fmt: skip
    lines += [
        "| file | prompt s, median / worst | decode ms/token, median / worst | episodes (prompt s) |",
        "|---|---|---|---|",
    ]
    for label, s in summary.items():
        eps = " ".join(str(r["prompt_s"]) for r in rows[label])
        lines.append(
            f"| {label} | {s['prompt_s_median']} / {s['prompt_s_worst']} | "
            f"{s['decode_ms_median']} / {s['decode_ms_worst']} | {eps} |"
        )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    say(f"results: {args.out.with_suffix('.md')} {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
