#!/usr/bin/env bash
# The whole H200 sequence of issue 10 as one job, after stage.sh 00, 01, 02 (run it through
# background.sh so that it outlives each 600 s device call and the machine never idles between
# steps). Runs from a copy of the tree in /tmp/seq (a later call re-sends the working tree under
# the running job), each step into its own folder, packed as $OUT/<step>.tar when it ends (the
# device tool brings back at most 8 files):
#   workers  STEPS="4 raw" workers.sh: the bot with 4 workers on in-process vLLM, raw AsyncLLM on
#            its very prompt ids
#   gpu      the whole `pytest -m gpu` in one run (gpu_tests.sh)
#   openai   STEPS="openai4" workers.sh: the same bot, engine.backend = "openai" -> vllm serve
#   capNM    issue 40's capacity on this host's cores for N and M workers (cap12, cap48; the
#            synthetic engine, no GPU): bench/capacity.sh, one round, rising 60 s Poisson rates
#   fairK    issue 40's run K (K = 1, 2, 3, ...): RUN=K STEPS="4 raw openai4" workers.sh, the
#            in-process bot, raw AsyncLLM on its prompt ids and the remote-server design (warmed
#            alike, stream interval 8), each on a fresh engine; interleaved so that a session that
#            runs out of device time still has like-for-like runs of all three
# usage: bash bench/h200/background.sh start seq bash bench/h200/sequence.sh [STEP...]
#        (default: fair1 fair2 fair3), then `background.sh wait seq 560` call after call
#        (issue 10's steps: workers gpu openai)
set -uo pipefail
rm -rf /tmp/seq && mkdir -p /tmp/seq
tar -cf - --exclude=./.gpu --exclude=./.whl . | tar -xf - -C /tmp/seq
cd /tmp/seq || exit 3
source bench/h200/env.sh || exit $?  # the capacity steps start e2e_bench.py themselves
status=0
for step in "${@:-fair1 fair2 fair3}"; do
  for s in $step; do
    echo "=== step $s ($(date -u +%H:%M:%S) UTC) ==="
    mkdir -p "$OUT/$s"
    case $s in
      workers) OUT=$OUT/$s STEPS="4 raw" bash bench/h200/workers.sh || status=1 ;;
      gpu) OUT=$OUT/$s bash bench/h200/gpu_tests.sh || status=1 ;;
      openai) OUT=$OUT/$s STEPS="openai4" bash bench/h200/workers.sh || status=1 ;;
      fair[0-9]*) OUT=$OUT/$s RUN=${s#fair} STEPS="4 raw openai4" bash bench/h200/workers.sh || status=1 ;;
      cap*) # capacity on this host's cores (synthetic engine, no GPU): cap12 = 1 and 2 workers
        w=${s#cap}; RATES_W1=${RATES_W1:-60,90,120,160,200,250} RATES_W2=${RATES_W2:-120,180,240,320,400} \
          RATES_W4=${RATES_W4:-240,360,480,640,800} RATES_W8=${RATES_W8:-480,720,960,1280} \
          PROFILE_RATE=${PROFILE_RATE:-} bash bench/capacity.sh "$OUT/$s/e2e-capacity" "$(echo "$w" | sed 's/./& /g')" 1 \
          || status=1
        for f in "$OUT/$s"/*.png; do rm -f "$f"; done ;;
      *) echo "unknown step $s (fairK, capNM, workers, gpu, openai)"; rmdir "$OUT/$s"; status=2; continue ;;
    esac
    tar -C "$OUT" -cf "$OUT/$s.tar.tmp" "$s" && mv "$OUT/$s.tar.tmp" "$OUT/$s.tar" && rm -rf "${OUT:?}/$s"
  done
done
exit "$status"
