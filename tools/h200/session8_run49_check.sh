#!/usr/bin/env bash
# Session 8, run 49: the folded SIMT kernels (the vec4-W load chosen by wp.static in the fp16 loops): default
# forward picks on the layers that take SIMT kernels at B = 1/4/16, eager and replayed; then run 48's train-step
# side-by-side again in the other order (nms forward first), to see how much of run 48's eager gap was order.
source tools/h200/device_env.sh
timeout 150 python3 -m fovi_lab.bench.forward --graphs --no-cached --compile-budget-s 40 --reps 20 --warmup 3 \
  --layers alex_L0 res18_stem res18_layer3 res18_layer3_0 res18_layer4_0 dinov3_patch alex_L2 --batches 16 1 4 \
  --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -A30 "layer            B     warp ms" $OUT/bench.log | cut -c1-200
L="res18_layer3 res18_layer3_0 res18_layer4_0"
FOVI_WARP_STEM_SIMT=off timeout 150 python3 -m fovi_lab.bench.backward train-step --layers $L --batches 16 --jobs 16 \
  --reps 25 --graphs --out $OUT/train-step_h200_nms.jsonl 2>&1 | grep -v "^Warp" > $OUT/train_nms.log
echo "train-step (nms forward) done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train pipelined\|warp_train_graphed" $OUT/train_nms.log | cut -c1-220
timeout 150 python3 -m fovi_lab.bench.backward train-step --layers $L --batches 16 --jobs 16 --reps 25 --graphs \
  --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step (split forward) done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train pipelined\|warp_train_graphed" $OUT/train.log | cut -c1-220
