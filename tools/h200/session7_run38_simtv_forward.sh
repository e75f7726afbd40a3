#!/usr/bin/env bash
# Session 7, run 38: the vectorised SIMT forward (sv_*: fp32 operands read as vec4, channel-permuted W^T) against
# the fp16 SIMT kernel sd_b8o8u4, the i2c pick and PyTorch on the stems and the DINOv3 patch embed, B = 1..128,
# every config's whole op eager and replayed.
source tools/h200/device_env.sh
timeout 420 python3 -m fovi_lab.bench.forward --layers alex_L0 res18_stem dinov3_patch --batches ${BATCHES:-16 1 4 32 64 128} \
  --configs ${CONFIGS:-sd_b8o8u4 sv_b4o4u4 sv_b4o8u4 sv_b8o4u4 sv_b8o8u2 sv_b8o8u4 sv_b8o8u8 sv_b16o8u2 sv_b8o16u2 sv_b8o8u4b64} \
  --op-all --graphs --no-cached --compile-budget-s 45 --reps 20 --warmup 3 --time-budget-s 400 \
  --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | grep "B=\|fastest" | cut -c1-240
