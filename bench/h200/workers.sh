#!/usr/bin/env bash
# Issue 10 on the H200 (after stage.sh unpack): one process against an engine host with N bot workers
# (`workers = N`), the same bench, model, engine arguments and patterns as e2e.sh, and raw AsyncLLM
# fed the very prompt ids of the one-process run. Patterns: a warm-up burst of 8, two bursts of 64
# over 16 channels and two incident episodes (56 long follow-ups, then 8 urgent /rca), every
# episode kept. Each step restarts the bot (a fresh engine): a bare machine's first vLLM start took
# 256 s, later ones about a minute, so run it as two calls:
#   STEPS="1 2" bench/h200/workers.sh   -> $OUT/e2e-workers1.{json,md}, $OUT/e2e-raw-workers1.{json,md}
#   STEPS="4" bench/h200/workers.sh     -> $OUT/e2e-workers4.{json,md,png}   (any N: STEPS="8")
# Issue 40: RUN=k names this run's files (e2e-workers4-run2.json, ...): three runs of the same
# steps, each on fresh engines, are what bench/episodes.py takes (median and worst per episode).
# usage: [RUN=k] STEPS="1 2 4 ..." bench/h200/workers.sh [extra e2e_bench.py args]
#   a number is a bot run with that many workers; "raw" (or 2 right after 1) is raw AsyncLLM fed
#   the prompt ids of the bot run just before it (STEPS="4 raw": the 4-worker run and its baseline);
#   "openaiN" is the remote-server design: the same bot with N workers and engine.backend = "openai"
#   against `vllm serve` of the same model and engine arguments (bench/h200/serve.sh), after the
#   in-process runs have freed the GPU (STEPS="4 raw openai4")
set -uo pipefail
source bench/h200/env.sh || exit $?
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
MODEL=$OPSBOT_TEST_MODELS/8b-v2
[ -f "$MODEL/config.json" ] || python3 -m bot.cli make-test-model "$MODEL" --size 8b || exit 3
t0=$(date +%s)
common=(--platforms slack-socket --patterns burst8,burst64,burst64,incident,incident --channels 16
        --budgets off --answer-tokens 200 --rca-tokens 64 --model "$MODEL" --dump-prompts --idle-s 1
        --pause-s 0.5 --start-timeout-s 420 --pattern-timeout-s 45 --workdir /tmp)
vllm=(--engine vllm --engine-arg load_format=dummy --engine-arg gpu_memory_utilization=0.85
      --engine-arg max_num_seqs=64 --engine-arg max_num_batched_tokens=8192
      --engine-arg scheduling_policy=priority --engine-arg dtype=bfloat16)
run() {  # run LIMIT_S NAME ARGS...
  local limit=$1 name=$2; shift 2
  echo "=== $name (t+$(( $(date +%s) - t0 )) s) ==="
  timeout -k 40 "$limit" python3 bench/e2e_bench.py "$@" --out "$OUT/$name.json" 2>&1 \
    | grep -v "Passing raw prompts to InputProcessor is deprecated" | gzip > "$OUT/$name.log.gz"
  local rc=${PIPESTATUS[0]}
  echo "$name: exit status $rc"; zcat "$OUT/$name.log.gz" | tail -c 3000
  rm -f "$OUT/$name.png"  # the device tool brings back few files: the JSON redraws it
  return "$rc"
}
status=0
tag=${RUN:+-run$RUN}
prev=
for s in ${STEPS:-1 2}; do
  # every step starts its own engine: wait until the last one's engine core gave its memory back
  python3 -c 'import sys; sys.path.insert(0, "bench"); from run_meta import wait_for_gpu_memory as w; w(0.9, 90)'
  if [ "$s" = raw ] || { [ "$s" = 2 ] && [ "$prev" = 1 ]; }; then
    run 150 "e2e-raw-workers$prev$tag" --raw-replay "$OUT/e2e-workers$prev$tag.json" || status=1
  elif [[ $s == openai* ]]; then
    source bench/h200/serve.sh
    if serve_start "$OUT/vllm-serve$tag.log"; then
      run 300 "e2e-openai-workers${s#openai}$tag$SERVE_TAG" "${common[@]}" --workers "${s#openai}" --engine openai \
        --base-url "$SERVE_URL" --served-model-name $SERVE_NAME "$@" || status=1
    else
      status=1
    fi
    serve_stop
    gzip -f "$OUT/vllm-serve$tag.log"
  else
    run 480 "e2e-workers$s$tag" "${common[@]}" "${vllm[@]}" --workers "$s" "$@" || status=1
  fi
  prev=$s
done
for f in "$OUT"/*.json; do gzip -f "$f"; done  # at most 8 files come back: json.gz and md per run,
tar -C "$OUT" -cf "$OUT/e2e-logs.tar" $(cd "$OUT" && ls *.log.gz) && rm -f "$OUT"/*.log.gz  # one tar of logs
exit "$status"
