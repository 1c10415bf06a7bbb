#!/usr/bin/env bash
# GPU tests on the H200 (after stage.sh unpack). Writes $OUT/gpu_tests.txt; exits with pytest's status.
# usage: bench/h200/gpu_tests.sh [pytest args, default: tests/gpu]
set -uo pipefail
source bench/h200/env.sh || exit $?
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
# The same header as every other result (issue 40): date, commit (OPSBOT_GIT_COMMIT: the tree here
# has no .git), host, GPU, versions and the exact command.
python3 -c 'import json, sys; sys.path.insert(0, "bench"); from run_meta import run_meta
print("\n".join(f"# {k}: {v}" for k, v in run_meta(sys.argv[1:]).items()))' \
  bench/h200/gpu_tests.sh "$@" | tee "$OUT/gpu_tests.txt"
PYTHONPATH=$PWD/tests:${PYTHONPATH:-} python3 -m pytest -m gpu --confcutdir=tests/gpu -p no:cacheprovider -q -rA --durations=15 "${@:-tests/gpu}" 2>&1 \
  | tee -a "$OUT/gpu_tests.txt"
status=${PIPESTATUS[0]}
echo "pytest -m gpu exit status: $status" | tee -a "$OUT/gpu_tests.txt"
exit "$status"
