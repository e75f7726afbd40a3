#!/usr/bin/env bash
# Session 7, run 43: the fp16 SIMT kernels reading x and writing y in place (no transposed, padded copy of x, no
# output permute): sd_b8o8u4 and sdp_b4o4u4 on the stems at B = 1/4/16, eager and replayed, against their run-42
# times with the copied layouts; then the stems' train step at B = 16 on the default picks.
source tools/h200/device_env.sh
timeout 150 python3 -m fovi_lab.bench.forward --layers alex_L0 res18_stem --batches 16 1 4 \
  --configs sd_b8o8u4 sdp_b4o4u4 --op-all --graphs --no-cached --compile-budget-s 30 --reps 20 --warmup 3 \
  --time-budget-s 140 --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | grep "B=\|fastest" | cut -c1-240
timeout 120 python3 -m fovi_lab.bench.backward train-step --layers alex_L0 res18_stem --batches 16 --jobs 16 \
  --reps 25 --graphs --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train pipelined\|warp_train_graphed" $OUT/train.log | cut -c1-220
