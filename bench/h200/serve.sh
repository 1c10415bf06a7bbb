# Source me on the H200 (after env.sh): `vllm serve` of $MODEL on this GPU for the remote-server
# design (opsbot's engine.backend = "openai"), with the engine arguments the in-process runs use,
# treated alike (issue 40): the same stream interval as opsbot's engine (engine.stream_interval, 8)
# and, once healthy, the same incident-shaped warm-up (bench/serve_warmup.py runs the in-process
# engine's own warm_incident_shapes over HTTP). Before issue 40 it had neither.
#   serve_start LOG   starts it in its own session (the API server and its engine core stop
#                     together), waits up to 180 s for /health, then warms it; returns 1 with the
#                     log's tail if it did not come up
#   serve_stop        SIGTERM to its session, SIGKILL after 20 s
# SERVE_MAX_LEN sets --max-model-len (default 4096, as the in-process runs of issue 10).
SERVE_PORT=18931
SERVE_URL=http://127.0.0.1:$SERVE_PORT
SERVE_NAME=opsbot-8b
serve_healthy() {
  python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' \
    "$SERVE_URL/health" 2> /dev/null
}
serve_start() {
  local log=$1 t0
  t0=$(date +%s)
  setsid python3 -m vllm.entrypoints.openai.api_server --model "$MODEL" --served-model-name $SERVE_NAME \
    --load-format dummy --dtype bfloat16 --max-model-len "${SERVE_MAX_LEN:-4096}" --gpu-memory-utilization 0.85 \
    --max-num-seqs 64 --max-num-batched-tokens 8192 --scheduling-policy priority --enable-prefix-caching \
    --stream-interval 8 --structured-outputs-config '{"backend": "xgrammar", "disable_any_whitespace": true}' \
    --enable-prompt-tokens-details --host 127.0.0.1 --port $SERVE_PORT > "$log" 2>&1 &
  SERVE_PID=$!
  for _ in $(seq 1 180); do
    serve_healthy && break
    kill -0 $SERVE_PID 2> /dev/null || break
    sleep 1
  done
  if serve_healthy; then
    echo "vllm serve healthy after $(( $(date +%s) - t0 )) s"
    # a failed warm-up does not cancel the run: its files are then named -unwarmed (not alike)
    SERVE_TAG=
    python3 bench/serve_warmup.py --base-url "$SERVE_URL" --model-name $SERVE_NAME --model "$MODEL" \
      --engine-arg max_num_seqs=64 --engine-arg scheduling_policy=priority 2>&1 | tail -3
    [ "${PIPESTATUS[0]}" = 0 ] || { SERVE_TAG=-unwarmed; echo "warm-up FAILED: this run is not alike"; }
    return 0
  fi
  echo "vllm serve did not come up; its log:"; tail -30 "$log"
  return 1
}
serve_stop() {
  kill -TERM -- -"$SERVE_PID" 2> /dev/null
  for _ in $(seq 1 20); do kill -0 "$SERVE_PID" 2> /dev/null || break; sleep 1; done
  kill -KILL -- -"$SERVE_PID" 2> /dev/null
}
