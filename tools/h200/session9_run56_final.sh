#!/usr/bin/env bash
# Session 9, run 56: the final selection rule (x^T / W-in-place / split mma picks). Every registered mma-family
# config on every layer at B = 1/4/16/32/64/128/512 beside the picks and PyTorch, eager and replayed (the third
# replicate of runs 52-54 for the heuristic test, and the numbers of the closing note); then the train step with
# the final forward picks at B = 16 and 64.
source tools/h200/device_env9.sh
MMA=$(python3 -c "from fovi_lab import warp_forward as F; print(' '.join(n for n in F.uncached_config_names() if F.config_spec(n).family in F._MMA_FAMILIES))" 2>/dev/null)
timeout 330 python3 -m fovi_lab.bench.forward --graphs --op-all --no-cached --compile-budget-s 60 --reps 15 --warmup 3 \
  --configs $MMA --batches 16 1 4 32 64 128 512 --time-budget-s 300 --tag run56-final \
  --out $OUT/forward_sweep_h200_run56.jsonl 2>&1 | grep -v "^Warp" > $OUT/sweep_run56.log
echo "sweep done at $(( $(date +%s) - t0 )) s"
sed -n '/^ layer            B     warp ms/,$p' $OUT/sweep_run56.log | cut -c1-160 | head -100
L="alex_L0 alex_L1 res18_stem res18_layer1 res18_layer3 res18_layer4_0 dinov3_patch"
timeout 230 python3 -m fovi_lab.bench.backward train-step --layers $L --batches 16 64 --jobs 16 --reps 20 --graphs \
  --time-budget-s 200 --out $OUT/train-step_h200_run56_final.jsonl 2>&1 | grep -v "^Warp" > $OUT/train_final.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train_graphed\|warp_train pipelined" $OUT/train_final.log | cut -c1-160
