#!/usr/bin/env bash
# Issue 38 on the H200 (after stage.sh unpack; run it through background.sh): the investigation loop on
# the dummy 8B (bf16), constrained decoding on both sides, one engine after another on the one GPU:
#   1. in-process vLLM: 16 investigations at once x 3 rounds, 6 constrained calls each, 300-token
#      tool outputs (bench/investigate_load.py)                       -> $OUT/investigate-vllm.*
#   2. opsbot eval --loop on 6 built-in cases with the real tool schemas (every call parses and
#      names an offered tool? each step's cached share of the previous prompt)  -> $OUT/eval-vllm/
#   3. the same bench on the openai backend -> vllm serve (same engine arguments, stream interval
#      8, warmed alike by bench/serve_warmup.py; token ids, so the decision's schema is the
#      server's structured output)                                    -> $OUT/investigate-openai.*
# usage: [STEPS="1 2 3"] bash bench/h200/investigate.sh
set -uo pipefail
source bench/h200/env.sh || exit $?
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
MODEL=$OPSBOT_TEST_MODELS/8b-v2
if [ ! -f "$MODEL/config.json" ]; then
  python3 -m bot.cli make-test-model "$MODEL" --size 8b || exit 3
fi
want() { [[ " ${STEPS:-1 2 3} " == *" $1 "* ]]; }
t0=$(date +%s)
step() { echo "=== $1 (t+$(( $(date +%s) - t0 )) s) ==="; }
quiet() { grep -v "Passing raw prompts to InputProcessor is deprecated\| INFO "; }
cat > /tmp/investigate-vllm.toml <<TOML
[engine]
backend = "vllm"
model = "$MODEL"
load_format = "dummy"
dtype = "bfloat16"
max_model_len = 8192
gpu_memory_utilization = 0.85
max_num_seqs = 64
max_num_batched_tokens = 8192
scheduling_policy = "priority"
TOML
shape=(--concurrency 16 --rounds 3 --steps 6 --output-tokens 300 --answer-tokens 64 --max-string 24)
status=0
if want 1; then
  step "1/3 in-process vLLM bf16"
  timeout -k 30 560 python3 bench/investigate_load.py --engine-config /tmp/investigate-vllm.toml "${shape[@]}" \
    --out "$OUT/investigate-vllm" 2>&1 | quiet | tail -40
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if want 2; then
  step "2/3 opsbot eval --loop, 6 cases, in-process vLLM"
  timeout -k 30 560 python3 -m bot.cli eval --engine-config /tmp/investigate-vllm.toml --loop --max-tokens 32 \
    --out /tmp/eval-vllm $(for c in oom-worker imagepull-typo config-missing-secret cert-expired \
      hop-rollout-memory-limit alert-crashlooping; do echo --case $c; done) 2>&1 | quiet | tail -30
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
  mkdir -p "$OUT/eval-vllm" && cp /tmp/eval-vllm/report.md /tmp/eval-vllm/report.json "$OUT/eval-vllm/" 2> /dev/null
fi
if want 3; then
  step "3/3 openai backend -> vllm serve bf16"
  source bench/h200/serve.sh
  if SERVE_MAX_LEN=8192 serve_start "$OUT/vllm-serve.log"; then
    cat > /tmp/investigate-openai.toml <<TOML
[engine]
backend = "openai"
base_url = "$SERVE_URL"
served_model_name = "$SERVE_NAME"
model = "$MODEL"
max_model_len = 8192
TOML
    timeout -k 30 400 python3 bench/investigate_load.py --engine-config /tmp/investigate-openai.toml "${shape[@]}" \
      --out "$OUT/investigate-openai$SERVE_TAG" 2>&1 | quiet | tail -40
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
  else
    status=1
  fi
  serve_stop
  tail -c 3000 "$OUT/vllm-serve.log" > "$OUT/vllm-serve-tail.log" && rm -f "$OUT/vllm-serve.log"
fi
step "done"
for f in "$OUT"/investigate-*.md "$OUT"/eval-vllm/report.md; do [ -f "$f" ] && { echo "--- $f"; head -40 "$f"; }; done
exit "$status"
