#!/usr/bin/env bash
# Session 6, run 30: the final train step of every layer at B = 16/64/512 with --graphs, on the session's
# defaults (balanced segments, 16/32-deep dW batch chunks, 16x16 dx tiles at B <= 16, the stems' 96-wide
# Cout tiles), now with the pipelined time of every eager step (back-to-back calls, one sync) beside the
# per-call one. Host probe first.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s6/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 100 python3 tools/h200/host_probe.py > $OUT/host_probe.log 2>&1
echo "probe done at $(( $(date +%s) - t0 )) s"
timeout 480 python3 -m fovi_lab.bench.backward train-step --batches 64 16 512 --jobs 16 --reps 25 --graphs \
  --time-budget-s 450 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train pipelined\|warp_train_graphed" $OUT/train.log | cut -c1-200
