# Source me on the H200 after stage.sh unpack: vLLM bundle first, the bot's wheels after it, then the repo.
if [ ! -d /tmp/site/vllm ]; then
  echo "no vLLM bundle in /tmp/site: run bench/h200/stage.sh 00, 01, 02, unpack first (the machine was wiped?)" >&2
  return 3 2>/dev/null || exit 3
fi
export PYTHONPATH=/tmp/site:/tmp/site2:$PWD
export PYTHONUNBUFFERED=1
export OPSBOT_TEST_MODELS=$PWD/.pytest_cache/opsbot-models
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p "${OUT:-/tmp/out}"
# The commit the copied tree is (it has no .git): the caller passes it, every result names it.
[ -n "${OPSBOT_GIT_COMMIT:-}" ] || echo "OPSBOT_GIT_COMMIT is not set: results will say commit unknown" >&2
