#!/usr/bin/env bash
# Session 9, run 55: the train step (forward + both deterministic adjoints) with the mma forward picks, then, on the
# same lease, with FOVI_WARP_MMA=off (the forward picks of session 8), at B = 16 and 64, eager and replayed.
source tools/h200/device_env9.sh
L="alex_L0 alex_L1 res18_stem res18_layer1 res18_layer3 dinov3_patch"
timeout 280 python3 -m fovi_lab.bench.backward train-step --layers $L --batches 16 64 --jobs 16 --reps 20 --graphs \
  --time-budget-s 250 --out $OUT/train-step_h200_run55_mma.jsonl 2>&1 | grep -v "^Warp" > $OUT/train_mma.log
echo "train-step (mma forward) done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train_graphed\|torch_" $OUT/train_mma.log | cut -c1-200 | head -60
FOVI_WARP_MMA=off timeout 250 python3 -m fovi_lab.bench.backward train-step --layers $L --batches 16 64 --jobs 16 \
  --reps 20 --graphs --time-budget-s 220 --out $OUT/train-step_h200_run55_mma-off.jsonl 2>&1 | grep -v "^Warp" > $OUT/train_off.log
echo "train-step (mma off) done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train_graphed" $OUT/train_off.log | cut -c1-200 | head -40
