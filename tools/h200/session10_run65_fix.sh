#!/usr/bin/env bash
# Session 10, run 65: the forward benchmark again on the three layers where run 64's benchmark timed a config
# other than the library's pick (bench/forward.py chose without W's column count Q, so it missed the W-in-place
# rule: mmas instead of mmasw on res18 layer3 / layer3_0 / layer4_0 at B <= 128). Fixed in the same commit.
source tools/h200/device_env10.sh
timeout 200 python3 -m fovi_lab.bench.forward --graphs --no-cached --reps 20 --warmup 3 \
  --layers res18_layer3 res18_layer3_0 res18_layer4_0 --batches 16 1 4 32 64 128 512 --time-budget-s 180 \
  --tag run65-final --out $OUT/forward_h200_run65_final.jsonl 2>&1 | grep -v "^Warp" > $OUT/final_run65.log
echo "bench done at $(( $(date +%s) - t0 )) s"
sed -n '/^ layer            B     warp ms/,$p' $OUT/final_run65.log | cut -c1-170 | head -60
