#!/usr/bin/env bash
# GPU tests on the H200 (after stage.sh 02). Writes $OUT/gpu_tests.txt; exits with pytest's status.
# usage: bench/h200/gpu_tests.sh [pytest args, default: tests/gpu]
set -uo pipefail
source bench/h200/env.sh || exit $?
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
PYTHONPATH=$PWD/tests:${PYTHONPATH:-} python3 -m pytest -m gpu --confcutdir=tests/gpu -p no:cacheprovider -q -rA --durations=15 "${@:-tests/gpu}" 2>&1 \
  | tee "$OUT/gpu_tests.txt"
status=${PIPESTATUS[0]}
echo "pytest -m gpu exit status: $status" | tee -a "$OUT/gpu_tests.txt"
exit "$status"
