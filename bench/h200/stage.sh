#!/usr/bin/env bash
# Bring the vLLM 0.26.0 bundle onto the lent H200 in three back-to-back device runs (a run carries
# at most 64 MiB): `bench/h200/stage.sh 00`, then `01`, then `02` (which unpacks the bundle into
# /tmp/site and the bot's own wheels from .whl/ into /tmp/site2). Build the chunks here first with
# ../shared/gpu/make-vllm-bundle.sh .gpu ../shared/gpu/server-extras.txt and the wheels with
# ../shared/gpu/make-bot-wheels.sh .whl (see bench/README.md "Reproducing").
# A call carries the working tree too (about 10 MB now): `bench/h200/stage.sh split`, run here
# once, re-cuts the bundle's 58 MB chunks into 50 + 50 MB + the rest, so that chunk 00 or 01 with
# the tree, and chunk 02 with .whl/ and the tree, each stay under 64 MiB.
set -euo pipefail
part=${1:?usage: stage.sh split|00|01|02}
if [ "$part" = split ]; then
  cat .gpu/vllm.tar.xz.0? > .gpu/vllm.tar.xz.all
  rm .gpu/vllm.tar.xz.0?
  split -b 50000000 -d -a 2 .gpu/vllm.tar.xz.all .gpu/vllm.tar.xz.
  rm .gpu/vllm.tar.xz.all
  ls -l .gpu
  exit 0
fi
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
