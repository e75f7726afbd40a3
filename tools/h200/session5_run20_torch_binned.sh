#!/usr/bin/env bash
# Session 5, run 20: every layer side by side with the new PyTorch baseline torch_binned_mm
# (fovi_lab.ops.reference.binned_forward). Part a (this script with arg "forward"): the forward benchmark at
# B = 16/64 with --graphs. Part b (arg "train"): the train step at B = 16/64/512 with --graphs.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s5/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
if [ "${1:-forward}" = "forward" ]; then
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/nvsmi.txt
  timeout 560 python3 -m fovi_lab.bench.forward --graphs --no-cached --compile-budget-s 60 --reps 20 --warmup 3 \
    --batches 16 64 --time-budget-s 500 --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^   \|^Warp" > $OUT/bench.log
  echo "forward done at $(( $(date +%s) - t0 )) s"
  grep -v "^\[" $OUT/bench.log | grep -v "^ [a-z0-9_]* B=" | tail -34
else
  timeout 570 python3 -m fovi_lab.bench.backward train-step --batches 64 16 512 --jobs 16 --reps 25 --graphs \
    --time-budget-s 520 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
  echo "train-step done at $(( $(date +%s) - t0 )) s"
  grep -v "^\[" $OUT/train.log | grep -v "^  \[" | tail -62 | cut -c1-170
fi
