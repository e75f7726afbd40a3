#!/usr/bin/env bash
# Session 6, first work call: run 25 (the fused sweep) then run 26 (the train step on the first-guess
# defaults, no host probe) within one 10-minute call.
set -uo pipefail
bash tools/h200/session6_run25_fused_sweep.sh
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 250 python3 -m fovi_lab.bench.backward train-step --batches 64 16 512 --jobs 16 --reps 25 \
  --time-budget-s 200 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train " $OUT/train.log | head -60 | cut -c1-330
