#!/usr/bin/env bash
# Session 4, run 15: the nms forward through the node-major runner with a one-launch partial reduction
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/wpc && rm -rf /tmp/wpc/wpcache && tar -C /tmp/wpc -xJf .device/s4/wpcache.txz && export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 150 python3 -m fovi_lab.bench.forward --graphs --no-cached --compile-budget-s 60 --reps 20 --warmup 3 \
  --layers res18_layer3 res18_layer4_0 res18_layer3_0 --batches 16 64 --time-budget-s 120 --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^   \|^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | tail -20
timeout 200 python3 -m fovi_lab.bench.backward train-step --batches 16 64 --jobs 16 --reps 25 --graphs \
  --layers res18_layer3 res18_layer4_0 --time-budget-s 160 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/train.log | grep -v "^  \[" | tail -16
