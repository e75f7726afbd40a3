#!/usr/bin/env bash
# Session 4, run 13 (part 2): train step, every layer, B=16/64/512, graphs; then the stems' fp32-stage variant at B=64
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s4/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 420 python3 -m fovi_lab.bench.backward train-step --batches 64 16 512 --jobs 16 --reps 25 --graphs \
  --time-budget-s 380 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/train.log | grep -v "^  \[" | tail -75
FOVI_KNN_GI_CONFIG=gi2i_p64b64_f32 FOVI_KNN_GW_CONFIG=gw3i_p64n128_f32 timeout 100 python3 -m fovi_lab.bench.backward train-step \
  --batches 64 --jobs 16 --reps 25 --graphs --layers alex_L0 --time-budget-s 80 --out $OUT/train-step_f32stages.jsonl 2>&1 | grep -v "^Warp" > $OUT/train_f32.log
FOVI_KNN_GI_CONFIG=gi2i_p64b64_f32 FOVI_KNN_GW_CONFIG=gw3i_p64n64_f32 timeout 100 python3 -m fovi_lab.bench.backward train-step \
  --batches 64 --jobs 16 --reps 25 --graphs --layers res18_stem --time-budget-s 80 --out $OUT/train-step_f32stages.jsonl 2>&1 | grep -v "^Warp" >> $OUT/train_f32.log
echo "variants done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/train_f32.log | grep "warp_train\|graphed" | tail -12
