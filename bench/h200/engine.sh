#!/usr/bin/env bash
# Engine benchmarks on the H200 (after stage.sh unpack). Each step writes JSON + Markdown into $OUT.
# usage: bench/h200/engine.sh episodes|pressure|split|matrix [extra engine_bench.py args]
#   episodes  issue 10: opsbot vs raw vLLM, each on its own fresh engine, system vs incident
#             warm-up, every urgent-under-load episode kept; single + bursts too      (~6 min)
#   pressure  issue 10/14: Poisson 2k-token background beside urgent, every prompt its own, a KV
#             cache of 960 blocks (the system prompt + two bursts of 8 background answers):
#             raw priorities vs opsbot admission vs admission + KV watermark            (~5 min)
#   split     issue 14: one engine per scenario as the source advises (AWQ-INT4 summaries at 0.3 +
#             8-bit FP8 root cause at 0.55 of the GPU, through inference.engine_set.EngineSet)
#             vs one FP8 engine with lanes at 0.85; urgent TTFT P99 and total tok/s  (~6 min)
#   matrix    issue 14: fp8, awq, gptq and FP8 KV cache variants on the opsbot layer   (~8 min)
set -uo pipefail
source bench/h200/env.sh || exit $?
step=${1:?usage: engine.sh episodes|pressure|split|matrix}
shift
case "$step" in
  episodes) args=(--configs bf16 --layers opsbot,raw --warmups system,incident --episodes 4) ;;
  pressure) args=(--configs "" --pressure bf16 --pressure-seconds 15 --pressure-blocks 960) ;;
  split)    args=(--configs "" --split --split-rca fp8 --episodes 3) ;;
  matrix)   args=(--configs fp8,awq,gptq,bf16+kvfp8,awq+kvfp8 --layers opsbot --warmups incident
                  --episodes 2) ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
python3 bench/engine_bench.py "${args[@]}" "$@" --out "$OUT/engine_bench-$step.json" 2>&1 \
  | grep -v "Passing raw prompts to InputProcessor is deprecated" | tee "$OUT/engine_bench-$step.log" | tail -c 200000
exit "${PIPESTATUS[0]}"
