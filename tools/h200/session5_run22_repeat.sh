#!/usr/bin/env bash
# Session 5, run 22: a repeat of run 20 on another lease (host probe first, so the lease's host speed is
# on record): forward B = 16/64 and the train step B = 16/64/512, every layer, with --graphs.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s5/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 120 python3 tools/h200/host_probe.py > $OUT/host_probe.log 2>&1
echo "probe done at $(( $(date +%s) - t0 )) s"; grep -v "^ \|^-\|^Warp" $OUT/host_probe.log | cut -c1-250 | tail -12
timeout 200 python3 -m fovi_lab.bench.forward --graphs --no-cached --compile-budget-s 60 --reps 20 --warmup 3 \
  --batches 16 64 --time-budget-s 180 --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^   \|^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | grep -A27 "^ layer  " | head -28
timeout 250 python3 -m fovi_lab.bench.backward train-step --batches 64 16 512 --jobs 16 --reps 25 --graphs \
  --time-budget-s 230 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/train.log | grep "\*" | cut -c1-170
