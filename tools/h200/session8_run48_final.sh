#!/usr/bin/env bash
# Session 8, run 48: the final code (split SIMT rule, SIMT runners): the default forward picks of every layer at
# B = 16/1/4, eager and replayed, beside PyTorch; then the train step at B = 16 of the three few-node layers that
# now take the split forward, with it and, on the same lease, with FOVI_WARP_STEM_SIMT=off (their nms forward).
source tools/h200/device_env.sh
timeout 260 python3 -m fovi_lab.bench.forward --graphs --no-cached --compile-budget-s 60 --reps 20 --warmup 3 \
  --batches 16 1 4 --time-budget-s 240 --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench_all.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -A60 "layer            B     warp ms" $OUT/bench_all.log | cut -c1-200
L="res18_layer3 res18_layer3_0 res18_layer4_0"
timeout 150 python3 -m fovi_lab.bench.backward train-step --layers $L --batches 16 --jobs 16 --reps 25 --graphs \
  --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step (split forward) done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train pipelined\|warp_train_graphed" $OUT/train.log | cut -c1-220
FOVI_WARP_STEM_SIMT=off timeout 150 python3 -m fovi_lab.bench.backward train-step --layers $L --batches 16 --jobs 16 \
  --reps 25 --graphs --out $OUT/train-step_h200_nms.jsonl 2>&1 | grep -v "^Warp" > $OUT/train_nms.log
echo "train-step (nms forward) done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train pipelined\|warp_train_graphed" $OUT/train_nms.log | cut -c1-220
