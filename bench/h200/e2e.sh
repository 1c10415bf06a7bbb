#!/usr/bin/env bash
# Issue 10 on the H200 (after stage.sh unpack): the whole bot end to end, one engine after another on
# the one GPU, 8B-class dummy model (.pytest_cache/opsbot-models/8b-v2), fake Slack (Socket Mode),
# budgets off, bursts of 8 / 32 / 64 over 16 channels (1 in 4 a /rca) and the incident pattern
# (56 long follow-ups streaming, then 8 urgent /rca):
#   1. opsbot + in-process vLLM, bf16                   -> $OUT/e2e-vllm-bf16.{json,md,png}
#   2. raw AsyncLLM fed the very prompt ids of step 1   -> $OUT/e2e-raw-bf16.{json,md}
#   3. opsbot + in-process vLLM, FP8 (online)           -> $OUT/e2e-vllm-fp8.{json,md,png}
#   4. opsbot (engine.backend = "openai") -> vllm serve, bf16  -> $OUT/e2e-openai-bf16.{json,md,png}
# Each step has its own deadline. On a bare machine vLLM's first start of a configuration took
# 256 s to ready (2026-12-03: engine init 162 s, 26 s of it compiling, then opsbot's warm-ups), so
# the bot may take 420 s to start and a bot step 480 s in all. With vLLM's compile cache warm (the
# GPU tests ran) all four take about 6-8 minutes; on a fresh machine bf16 and FP8 each compile
# first (2-3 minutes more), so run them as two calls: STEPS="1 2" bench/h200/e2e.sh, then
# STEPS="3 4" bench/h200/e2e.sh.
# usage: [STEPS="1 2"] bench/h200/e2e.sh [extra e2e_bench.py args for the bot steps]
#   STEPS picks steps (default all four; step 2 needs step 1's JSON in the same $OUT)
set -uo pipefail
source bench/h200/env.sh || exit $?
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
MODEL=$OPSBOT_TEST_MODELS/8b-v2
if [ ! -f "$MODEL/config.json" ]; then
  python3 -m bot.cli make-test-model "$MODEL" --size 8b || exit 3
fi
t0=$(date +%s)
step() { echo "=== $1 (t+$(( $(date +%s) - t0 )) s) ==="; }
common=(--platforms slack-socket --patterns burst8,burst32,burst64,incident --channels 16 --budgets off
        --answer-tokens 200 --rca-tokens 64 --model "$MODEL" --dump-prompts --idle-s 1 --pause-s 0.5
        --start-timeout-s 420 --pattern-timeout-s 45 --workdir /tmp)
vllm=(--engine vllm --engine-arg load_format=dummy --engine-arg gpu_memory_utilization=0.85
      --engine-arg max_num_seqs=64 --engine-arg max_num_batched_tokens=8192 --engine-arg scheduling_policy=priority)
run() {  # run LIMIT_S NAME ARGS...: one e2e_bench.py invocation, its log in $OUT
  local limit=$1 name=$2; shift 2
  timeout -k 40 "$limit" python3 bench/e2e_bench.py "$@" --out "$OUT/$name.json" 2>&1 \
    | grep -v "Passing raw prompts to InputProcessor is deprecated" | tee "$OUT/$name.log" | tail -c 20000
  local rc=${PIPESTATUS[0]}
  echo "$name: exit status $rc"
  return "$rc"
}
status=0
want() { [[ " ${STEPS:-1 2 3 4} " == *" $1 "* ]]; }
want 1 && step "1/4 opsbot + vLLM bf16"
want 1 && { run 480 e2e-vllm-bf16 "${common[@]}" "${vllm[@]}" --engine-arg dtype=bfloat16 "$@" || status=1; }
want 2 && step "2/4 raw AsyncLLM, the same prompt token ids"
if want 2 && [ -f "$OUT/e2e-vllm-bf16.json" ]; then
  run 150 e2e-raw-bf16 --raw-replay "$OUT/e2e-vllm-bf16.json" || status=1
fi
want 3 && step "3/4 opsbot + vLLM FP8"
want 3 && { run 480 e2e-vllm-fp8 "${common[@]}" "${vllm[@]}" --engine-arg dtype=bfloat16 \
  --engine-arg quantization=fp8 "$@" || status=1; }
if want 4; then
step "4/4 opsbot (openai backend) -> vllm serve bf16"
source bench/h200/serve.sh
if serve_start "$OUT/vllm-serve.log"; then
  run 150 e2e-openai-bf16 "${common[@]}" --engine openai --base-url "$SERVE_URL" \
    --served-model-name $SERVE_NAME "$@" || status=1
else
  status=1
fi
serve_stop
fi
step "done"
for f in e2e-vllm-bf16 e2e-raw-bf16 e2e-vllm-fp8 e2e-openai-bf16; do
  [ -f "$OUT/$f.md" ] && { echo "--- $f.md"; cat "$OUT/$f.md"; }
done
exit "$status"
