#!/usr/bin/env bash
# Session 5, run 24: the train step of every layer at B = 16/64/512 with --graphs, now with the registered
# PyTorch backend torch_binned (fovi_lab.ops.reference.BinnedTorchOps) timed beside torch_compact, so the auto
# rule can pick it; host probe first (the lease's host speed).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s5/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 120 python3 tools/h200/host_probe.py > $OUT/host_probe.log 2>&1
echo "probe done at $(( $(date +%s) - t0 )) s"
timeout 400 python3 -m fovi_lab.bench.backward train-step --batches 64 16 512 --jobs 16 --reps 25 --graphs \
  --time-budget-s 380 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/train.log | grep "\*" | cut -c1-170
grep -h "torch_binned " $OUT/train.log | head -40 | cut -c1-120
