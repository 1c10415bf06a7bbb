#!/usr/bin/env bash
# Issue 40, capacity: the highest sustained mention rate per number of bot processes. For each
# round and each worker count (alternated, so a noisy neighbour hits every setting alike), one
# e2e_bench.py run on the synthetic engine: Poisson mentions at rising rates, SECONDS each
# (default 60), ending at the first rate whose event -> engine submit P99 is over 25 ms or that
# loses or duplicates a request (--sweep-stop). Then one cProfile of the steady state (the host's
# and every worker's event loop) at PROFILE_RATE with the first worker count.
# usage: bench/capacity.sh OUT_PREFIX [WORKERS="1 2"] [ROUNDS=2] [RATES=10,20,30,45,60,80,100]
#   env: SECONDS_PER_RATE (60), PROFILE_RATE (unset: no profile), PY (python3), EXTRA (more args),
#        RATES_W<N> (rates for N workers instead of RATES: more processes start higher)
# e.g. bench/capacity.sh bench/results/e2e_bench-2026-12-05-cpu-capacity "1 2" 2
set -uo pipefail
prefix=${1:?usage: capacity.sh OUT_PREFIX [WORKERS] [ROUNDS] [RATES]}
workers=${2:-1 2}
rounds=${3:-2}
rates=${4:-10,20,30,45,60,80,100}
py=${PY:-python3}
model=${MODEL:-.pytest_cache/opsbot-models/8b-v2}
[ -f "$model/config.json" ] || $py -m bot.cli make-test-model "$model" --size 8b || exit 3
common=(--engine synthetic --model "$model" --platforms slack-socket --patterns none --channels 16
        --answer-tokens 200 --rca-tokens 64 --tokens-per-s 150 --idle-s 3 --pause-s 2
        --sweep "$rates" --sweep-seconds "${SECONDS_PER_RATE:-60}" --sweep-submit-p99-ms 25 --sweep-stop)
status=0
for round in $(seq 1 "$rounds"); do
  for w in $workers; do
    echo "=== round $round, workers $w ($(date -u +%H:%M:%S) UTC) ==="
    own=RATES_W$w
    $py bench/e2e_bench.py "${common[@]}" --sweep "${!own:-$rates}" --workers "$w" ${EXTRA:-} \
      --out "$prefix-w$w-r$round.json" 2>&1 \
      | grep -E "sustained|ready in|answered, .* sent, +[0-9]*0\.[0-9] s|Highest|\*\*" || status=1
    gzip -f "$prefix-w$w-r$round.json"
  done
done
if [ -n "${PROFILE_RATE:-}" ]; then
  w=${workers%% *}
  echo "=== profile: workers $w at $PROFILE_RATE/s ($(date -u +%H:%M:%S) UTC) ==="
  $py bench/e2e_bench.py "${common[@]}" --sweep "$PROFILE_RATE" --workers "$w" --profile "$prefix-profile" \
    --out "$prefix-profile.json" 2>&1 | grep -E "sustained|Highest" || status=1
  gzip -f "$prefix-profile.json"
  # the top costs as text beside the result (the binary profiles stay out of git)
  for f in "$prefix-profile".slack-socket*; do
    [[ $f == *.txt ]] && continue
    $py -c 'import pstats, sys
for order in ("tottime", "cumulative"):
    print(f"=== {sys.argv[1]}: top 40 by {order} (cProfile of the event loop thread, thread CPU time)")
    pstats.Stats(sys.argv[1], stream=sys.stdout).strip_dirs().sort_stats(order).print_stats(40)' "$f" > "$f.txt" \
      && rm -f "$f"
  done
fi
exit "$status"
