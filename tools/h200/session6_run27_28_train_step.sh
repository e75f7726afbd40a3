#!/usr/bin/env bash
# Session 6, runs 27 and 28 (the same script before and after the capture fix): the train step of every layer at B = 16/64/512 with --graphs, the fused adjoints on
# their new defaults (balanced segments where the rules pick them, 16/32-deep dW batch chunks at B <= 32),
# the dense-ceiling fractions as TFLOP/s ratios over the same tiles and grid. Host probe first.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s6/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 100 python3 tools/h200/host_probe.py > $OUT/host_probe.log 2>&1
echo "probe done at $(( $(date +%s) - t0 )) s"
timeout 440 python3 -m fovi_lab.bench.backward train-step --batches 64 16 512 --jobs 16 --reps 25 --graphs \
  --time-budget-s 420 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/train.log | grep "\*" | cut -c1-170
grep -h "warp_train " $OUT/train.log | head -60 | cut -c1-330
