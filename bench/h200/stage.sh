#!/usr/bin/env bash
# Bring the vLLM 0.26.0 bundle onto the lent H200 in back-to-back device runs (a run carries at
# most 64 MiB, the working tree included): `bench/h200/stage.sh 00`, `01`, `02` (one chunk each,
# carry .gpu/vllm.tar.xz.NN), then `stage.sh unpack` (carry .whl), which unpacks the bundle into
# /tmp/site and the bot's own wheels from .whl/ into /tmp/site2. Build the chunks here first with
# ../shared/gpu/make-vllm-bundle.sh .gpu ../shared/gpu/server-extras.txt and the wheels with
# ../shared/gpu/make-bot-wheels.sh .whl (see bench/README.md "Reproducing").
# `bench/h200/stage.sh split [BYTES]`, run here once, re-cuts the bundle into chunks of BYTES
# (default 46 MB) so that each chunk with the working tree (17 MB on 2026-12-06) stays under 64 MiB;
# .whl/ (17 MB with the structured-output extras) travels alone with `unpack`.
set -euo pipefail
part=${1:?usage: stage.sh split [BYTES] | NN | unpack}
if [ "$part" = split ]; then
  cat .gpu/vllm.tar.xz.[0-9][0-9] > .gpu/vllm.tar.xz.all
  rm .gpu/vllm.tar.xz.[0-9][0-9]
  split -b "${2:-46000000}" -d -a 2 .gpu/vllm.tar.xz.all .gpu/vllm.tar.xz.
  rm .gpu/vllm.tar.xz.all
  ls -l .gpu
  exit 0
fi
mkdir -p /tmp/b
if [ "$part" != unpack ]; then
  cp ".gpu/vllm.tar.xz.$part" /tmp/b/
  echo "staged chunk $part ($(du -h "/tmp/b/vllm.tar.xz.$part" | cut -f1)); chunks here: $(ls /tmp/b | tr '\n' ' ')"
  exit 0
fi
t0=$(date +%s)
mkdir -p /tmp/site
# A missing chunk (the machine was given back between runs) cuts the xz stream: xz fails, and so do we.
if ! cat /tmp/b/vllm.tar.xz.* | xz -d -T0 | tar -x -C /tmp/site; then
  echo "the bundle did not unpack (chunks here: $(ls /tmp/b | tr '\n' ' ')): the machine was given back" \
    "between runs? stage every chunk again from 00" >&2
  exit 3
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site2 .whl/*.whl
echo "unpacked vLLM bundle and bot wheels in $(( $(date +%s) - t0 )) s"
