#!/usr/bin/env bash
# Session 7, run 37: the stems with the SIMT forward selected (sd_b8o8u4 at B <= 32, and B <= 64 for Cout <= 64):
# the forward op at B = 16/64 (default picks, --graphs), then the train step at B = 16/64 with the new default
# and, on the same lease, with FOVI_WARP_STEM_SIMT=off (the i2c forward of run 33) for the side-by-side.
# Runs 39 and 41 ran this script again with FWD_BATCHES="16 64 128" (session7_run39/run41_*.sh).
source tools/h200/device_env.sh
timeout 150 python3 -m fovi_lab.bench.forward --layers alex_L0 res18_stem dinov3_patch --batches ${FWD_BATCHES:-16 64} --graphs \
  --no-cached --compile-budget-s 45 --reps 20 --warmup 3 --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/fwd.log
echo "forward done at $(( $(date +%s) - t0 )) s"; grep -v "^\[" $OUT/fwd.log | grep "B=" | cut -c1-240
timeout 200 python3 -m fovi_lab.bench.backward train-step --layers alex_L0 res18_stem --batches 16 64 --jobs 16 \
  --reps 25 --graphs --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step (SIMT forward) done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train pipelined\|warp_train_graphed" $OUT/train.log | cut -c1-220
FOVI_WARP_STEM_SIMT=off timeout 200 python3 -m fovi_lab.bench.backward train-step --layers alex_L0 res18_stem \
  --batches 16 64 --jobs 16 --reps 25 --graphs --out $OUT/train-step_h200_i2c.jsonl 2>&1 | grep -v "^Warp" > $OUT/train_i2c.log
echo "train-step (i2c forward) done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train pipelined\|warp_train_graphed" $OUT/train_i2c.log | cut -c1-220
