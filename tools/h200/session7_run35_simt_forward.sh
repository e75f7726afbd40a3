#!/usr/bin/env bash
# Session 7, run 35: the SIMT forward after two changes: a thread's output channels strided by the channel-group
# count (coalesced W^T loads) and U p entries per loop step (loads in flight together): sd_b{TB}o{TO}u{U},
# on the stems and the DINOv3 patch embed at B = 1..64, every config's whole op eager and replayed.
source tools/h200/device_env.sh
timeout 420 python3 -m fovi_lab.bench.forward --layers alex_L0 res18_stem dinov3_patch --batches ${BATCHES:-16 1 4 32 64} \
  --configs ${CONFIGS:-sd_b4o4u1 sd_b4o4u4 sd_b4o8u2 sd_b8o4u2 sd_b8o8u1 sd_b8o8u2 sd_b8o8u4 sd_b16o4u2 sd_b16o8u2} \
  --op-all --graphs --no-cached --compile-budget-s 45 --reps 20 --warmup 3 --time-budget-s 400 \
  --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | grep "B=\|fastest" | cut -c1-240
