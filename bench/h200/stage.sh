#!/usr/bin/env bash
# Bring the vLLM 0.26.0 bundle onto the lent H200 in three back-to-back device runs (a run carries
# at most 64 MiB): `bench/h200/stage.sh 00`, then `01`, then `02` (which unpacks the bundle into
# /tmp/site and the bot's own wheels from .whl/ into /tmp/site2). Build the chunks here first with
# ../shared/gpu/make-vllm-bundle.sh .gpu ../shared/gpu/server-extras.txt and the wheels with
# ../shared/gpu/make-bot-wheels.sh .whl (see bench/README.md "Reproducing").
set -euo pipefail
part=${1:?usage: stage.sh 00|01|02}
mkdir -p /tmp/b
cp ".gpu/vllm.tar.xz.$part" /tmp/b/
echo "staged chunk $part ($(du -h "/tmp/b/vllm.tar.xz.$part" | cut -f1))"
if [ "$part" = 02 ]; then
  have=$(ls /tmp/b/vllm.tar.xz.* | wc -l)
  if [ "$have" != 3 ]; then
    echo "only $have of 3 chunks here: the machine was given back between runs; start again at 00" >&2
    exit 3
  fi
  t0=$(date +%s)
  mkdir -p /tmp/site
  cat /tmp/b/vllm.tar.xz.* | xz -d -T0 | tar -x -C /tmp/site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site2 .whl/*.whl
  echo "unpacked vLLM bundle and bot wheels in $(( $(date +%s) - t0 )) s"
fi
