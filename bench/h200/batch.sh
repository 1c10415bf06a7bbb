#!/usr/bin/env bash
# Issue 15 on the H200: offline batch (vllm.LLM, static batching) vs the interactive path
# (AsyncLLM, all at once) for a generated shift of 1,000 alerts, and the urgent lane's TTFT
# while a batch runs inside the bot vs idle. Writes $OUT/batch_bench.{json,md}.  (~3-5 min)
set -uo pipefail
source bench/h200/env.sh || exit $?
python3 bench/batch_bench.py --model-dir .pytest_cache/opsbot-models --out "$OUT/batch_bench.json" "$@" 2>&1 \
  | grep -v "Passing raw prompts to InputProcessor is deprecated" | tee "$OUT/batch_bench.log" | tail -c 100000
exit "${PIPESTATUS[0]}"
