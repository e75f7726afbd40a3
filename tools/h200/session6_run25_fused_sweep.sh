#!/usr/bin/env bash
# Session 6, run 25: the fused adjoints' balanced segments. Every non-stem layer at B = 16/64/512, kernels
# alone: dx whole lists (dxn) against segments of 1/2/4 entries (dxs), dW interleaved splits (dwn, S = 1/4/16)
# against segments aimed at 256..4096 CTAs (dws), 16/32/64-deep batch chunks at B <= 32; each beside Warp's
# dense ceiling of the same tiles and grid. Host probe first (the lease's host speed).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s6/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv > $OUT/nvsmi.txt 2>&1
timeout 300 python3 -m fovi_lab.bench.backward backward --sweep-fused --fused-only --jobs 16 --reps 15 \
  --layers alex_L1 alex_L2 alex_L3 alex_L4 res18_layer1 res18_layer2_0 res18_layer2 res18_layer3_0 res18_layer3 \
  res18_layer4_0 --batches 64 512 16 --time-budget-s 270 --out $OUT/fused_sweep_h200.jsonl 2>&1 \
  | grep -v "^Warp" > $OUT/sweep.log
echo "sweep done at $(( $(date +%s) - t0 )) s"
grep "fused d\|shapes\|precompile\|FAILED" $OUT/sweep.log | cut -c1-230
