#!/usr/bin/env bash
# Issue 14 item 3: quality on real weights (SmolLM2-135M-Instruct) under vLLM, bf16 against online
# FP8, FP8 KV cache, the Q4_1 GGUF itself and in-flight bitsandbytes 4-bit.
# The GGUF (94 MiB) does not fit one run's carry (64 MiB): split it here first with
#   python bench/quality_bench.py split [--gguf FILE]     (writes .gguf/: 2 chunks + manifest)
#   pip download --no-deps gguf==0.19.0 -d .gguf          (transformers' GGUF reader, not in the bundle)
# then, on one warm machine (after stage.sh 00, 01, 02, unpack), three runs back to back:
#   bench/h200/quality.sh 00    carry .gguf/SmolLM2-135M-Instruct.Q4_1.gguf.00, .gguf/manifest.json
#                               and .gguf/gguf-0.19.0-py3-none-any.whl
#   bench/h200/quality.sh 01    carry .gguf/SmolLM2-135M-Instruct.Q4_1.gguf.01 and .gguf/manifest.json
#   bench/h200/quality.sh bnb   carry .gguf/bitsandbytes-*.whl (not in the vLLM bundle; 43 MB,
#                               pip download --no-deps --only-binary=:all: --python-version 3.12
#                               --platform manylinux_2_24_x86_64 bitsandbytes -d .gguf): for bnb4
#   bench/h200/quality.sh run   join + sha256 check, dequantize to bf16, measure       (~5 min)
#   bench/h200/quality.sh eval  (after run, same machine) `opsbot eval`'s 25 incident cases on
#                               that bf16 folder under vLLM bf16, FP8 and FP8 + FP8 KV cache,
#                               compared by bench/eval_compare.py                     (~4 min)
set -uo pipefail
step=${1:?usage: quality.sh 00|01|bnb|run|eval [extra quality_bench.py run / opsbot eval args]}
shift
mkdir -p /tmp/q
if [ "$step" = bnb ]; then
  python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site2 .gguf/bitsandbytes-*.whl || exit 3
  echo "installed $(ls .gguf/bitsandbytes-*.whl) into /tmp/site2"
  exit 0
fi
if [ "$step" != run ] && [ "$step" != eval ]; then
  cp ".gguf/SmolLM2-135M-Instruct.Q4_1.gguf.$step" .gguf/manifest.json /tmp/q/ || exit 3
  echo "staged chunk $step ($(du -h "/tmp/q/SmolLM2-135M-Instruct.Q4_1.gguf.$step" | cut -f1))"
  for wheel in .gguf/gguf-*.whl; do  # the converter reads the GGUF with it
    [ -f "$wheel" ] && python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site2 "$wheel"
  done
  exit 0
fi
source bench/h200/env.sh || exit $?
if [ "$step" = eval ]; then
  [ -f /tmp/q/smollm2-bf16/config.json ] || { echo "no /tmp/q/smollm2-bf16: run quality.sh run first" >&2; exit 3; }
  reports=()
  for cfg in bf16 fp8 fp8+kvfp8; do
    quant='""'; kv=auto
    [[ $cfg == fp8* ]] && quant='"fp8"'
    [[ $cfg == *kvfp8 ]] && kv=fp8
    printf '[engine]\nbackend = "vllm"\nmodel = "/tmp/q/smollm2-bf16"\ndtype = "bfloat16"\nquantization = %s\nkv_cache_dtype = "%s"\ngpu_memory_utilization = 0.3\nenforce_eager = true\n' \
      "$quant" "$kv" | sed 's/^quantization = ""$//' > "/tmp/q/eval-$cfg.toml"
    python3 -m bot.cli eval --out "/tmp/q/eval-$cfg" --engine-config "/tmp/q/eval-$cfg.toml" --max-tokens 128 "$@" \
      2>&1 | grep -v "Passing raw prompts" | tail -40
    [ "${PIPESTATUS[0]}" = 0 ] || exit 1
    reports+=("$cfg=/tmp/q/eval-$cfg/report.json")
    # each report to $OUT as it lands (a time limit keeps what finished); not the whole folder:
    # its kubeconfig files are over the device tool's file count
    mkdir -p "$OUT/eval-$cfg" && cp /tmp/q/eval-$cfg/report.json /tmp/q/eval-$cfg/report.md "$OUT/eval-$cfg/"
  done
  python3 bench/eval_compare.py "${reports[@]}" --out "$OUT/eval-smollm2-h200" \
    --note "SmolLM2-135M-Instruct dequantized from Q4_1 to bf16, vLLM 0.26 eager, 128 tokens" || exit $?
  exit 0
fi
python3 bench/quality_bench.py join --parts /tmp/q --out /tmp/q/smollm2.gguf || exit $?
python3 bench/quality_bench.py convert --gguf /tmp/q/smollm2.gguf --out /tmp/q/smollm2-bf16 || exit $?
# Eager mode: five engine starts fit the run; the kernels (and so the numbers) are the same ones.
python3 bench/quality_bench.py run --model /tmp/q/smollm2-bf16 --gguf /tmp/q/smollm2.gguf \
  --configs bf16,fp8,kvfp8,fp8+kvfp8,gguf,bnb4,bf16 --eager --config-timeout-s 240 \
  --work /tmp/q/work --out "$OUT/quality.json" "$@" 2>&1 | tee "$OUT/quality.log" | tail -c 100000
exit "${PIPESTATUS[0]}"
