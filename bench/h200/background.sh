#!/usr/bin/env bash
# Run one long H200 job across several device calls (each call is capped at 600 s; a process in
# its own session outlives the call while the machine stays lent, see the device tool's README):
#   bench/h200/background.sh start NAME CMD...   starts CMD under setsid with OUT=/tmp/bg/NAME/out
#                                                 and returns at once (its log: /tmp/bg/NAME/log)
#   bench/h200/background.sh wait NAME [LIMIT_S]  follows the log until CMD ends or LIMIT_S pass
#                                                 (default 540); when it has ended, copies its
#                                                 out/ and log into $OUT and exits with CMD's status,
#                                                 else copies the finished out/*.tar and exits 75
#                                                 (call wait again, within 30 s)
# Example (the whole GPU suite as one pytest run):
#   bash bench/h200/stage.sh unpack && bash bench/h200/background.sh start gpu bash bench/h200/gpu_tests.sh \
#     && bash bench/h200/background.sh wait gpu 560
#   bash bench/h200/background.sh wait gpu 580
set -uo pipefail
action=${1:?usage: background.sh start NAME CMD... | wait NAME [LIMIT_S]}
name=${2:?job name}
dir=/tmp/bg/$name
case $action in
  start)
    shift 2
    mkdir -p "$dir/out"
    rm -f "$dir/rc"
    OUT=$dir/out setsid bash -c '"$@" > "$0/log" 2>&1; echo $? > "$0/rc"' "$dir" "$@" < /dev/null &
    echo "started $name (pid $!): $*"
    ;;
  wait)
    limit=${3:-540}
    t0=$(date +%s)
    shown=$(cat "$dir/shown" 2> /dev/null || echo 0)  # lines an earlier wait printed
    while [ ! -f "$dir/rc" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do
      sleep 5
      lines=$(wc -l < "$dir/log")
      [ "$lines" -gt "$shown" ] && sed -n "$((shown + 1)),${lines}p" "$dir/log" | cut -c1-300
      shown=$lines; echo "$shown" > "$dir/shown"
    done
    if [ ! -f "$dir/rc" ]; then
      # The steps it has finished come back now (sequence.sh writes each as one finished .tar), in
      # case the session's device time ends before the next wait.
      ls "$dir/out/"*.tar > /dev/null 2>&1 && cp "$dir/out/"*.tar "$OUT/"
      echo "$name still running after $(( $(date +%s) - t0 )) s: call 'background.sh wait $name' again"
      exit 75
    fi
    tail -n +"$((shown + 1))" "$dir/log" | cut -c1-300
    cp -r "$dir/out/." "$OUT/" && cp "$dir/log" "$OUT/$name.log"
    echo "$name ended with status $(cat "$dir/rc")"
    exit "$(cat "$dir/rc")"
    ;;
  *) echo "unknown action $action" >&2; exit 2 ;;
esac
