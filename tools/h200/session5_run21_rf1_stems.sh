#!/usr/bin/env bash
# Session 5, run 21: the stems with rf1 tables (ref_frame_mult = 1: V = K, Q = Cin*V ~ P) beside rf2's run 20,
# forward B = 16/64/512 and train step B = 16/64/512: where binning (torch_binned_mm) beats the compact GEMM.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s5/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 250 python3 -m fovi_lab.bench.forward --rf rf1 --layers alex_L0 res18_stem dinov3_patch --graphs --no-cached \
  --compile-budget-s 60 --reps 20 --batches 16 64 512 --time-budget-s 230 --out $OUT/forward_h200.jsonl 2>&1 \
  | grep -v "^   \|^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | grep -v "^ [a-z0-9_]* B=" | tail -24
timeout 300 python3 -m fovi_lab.bench.backward train-step --rf rf1 --layers alex_L0 res18_stem dinov3_patch \
  --batches 64 16 512 --jobs 16 --reps 25 --graphs --time-budget-s 280 --out $OUT/train-step_h200.jsonl 2>&1 \
  | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/train.log | grep -v "^  \[" | tail -30 | cut -c1-170
