#!/usr/bin/env bash
# Session 10, run 66: the train step (the session-10 forward picks + the unchanged fused / staged deterministic
# adjoints) beside PyTorch's train steps, eager and replayed, at B = 16 and 64. The kernel cache: session 10's
# (forward) and session 9's (the adjoints' MathDx modules), both carried and unpacked here.
set -uo pipefail
mkdir -p /tmp/wpc
for c in .device/s10/wpcache.txz .device/s9/wpcache.txz; do [ -f $c ] && tar -C /tmp/wpc -xJf $c; done
source tools/h200/device_env10.sh
L="alex_L0 alex_L1 res18_stem res18_layer1 dinov3_patch"
timeout 230 python3 -m fovi_lab.bench.backward train-step --layers $L --batches 16 64 --jobs 16 --reps 20 --graphs \
  --time-budget-s 200 --out $OUT/train-step_h200_run66_session10.jsonl 2>&1 | grep -v "^Warp" > $OUT/train_run66.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train_graphed\|torch_\|budget" $OUT/train_run66.log | cut -c1-200 | head -60
