#!/usr/bin/env bash
# Session 4, run 17: the fused dW finish as a tiled transpose-sum kernel (no temporary, coalesced both ways)
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/wpc && rm -rf /tmp/wpc/wpcache && tar -C /tmp/wpc -xJf .device/s4/wpcache.txz && export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 420 python3 -m fovi_lab.bench.backward train-step --batches 64 16 512 --jobs 16 --reps 25 --graphs \
  --layers alex_L1 alex_L2 alex_L3 alex_L4 res18_layer1 res18_layer2_0 res18_layer2 res18_layer3_0 res18_layer3 res18_layer4_0 --time-budget-s 380 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/train.log | grep -v "^  \[" | grep "fused\*\|staged\*" | cut -c1-150
