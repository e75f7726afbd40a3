#!/usr/bin/env bash
# Session 7, run 42: the fp16 SIMT kernel with the next step's indices prefetched (sdp_*: one memory round trip
# per loop step instead of two) against sd_b8o8u4 and sv_b4o4u4 on the stems at B = 1..32, every config's op
# eager and replayed.
source tools/h200/device_env.sh
timeout 240 python3 -m fovi_lab.bench.forward --layers alex_L0 res18_stem --batches 16 1 4 32 \
  --configs sd_b8o8u4 sdp_b8o8u4 sdp_b4o8u4 sdp_b4o4u4 sdp_b8o8u2 sv_b4o4u4 --op-all --graphs --no-cached \
  --compile-budget-s 30 --reps 20 --warmup 3 --time-budget-s 220 --out $OUT/forward_h200.jsonl 2>&1 \
  | grep -v "^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | grep "B=\|fastest" | cut -c1-240
