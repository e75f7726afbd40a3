#!/usr/bin/env bash
# Session 7, run 34: the SIMT register-blocked forward (sd_* configs) against the i2c default and the PyTorch
# baselines on the Cin = 3 stems and the DINOv3 patch embed, B = 1..128, every config's whole op timed
# eagerly and replayed from a CUDA graph (--op-all --graphs).
source tools/h200/device_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > $OUT/nvsmi.txt 2>&1
timeout 420 python3 -m fovi_lab.bench.forward --layers alex_L0 res18_stem dinov3_patch --batches 16 64 1 4 32 128 \
  --configs sd_b4o4 sd_b4o8 sd_b8o4 sd_b8o8 sd_b4o8b64 sd_b4o8b256 --op-all --graphs --no-cached \
  --compile-budget-s 45 --reps 20 --warmup 3 --time-budget-s 400 --out $OUT/forward_h200.jsonl 2>&1 \
  | grep -v "^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | grep "B=\|fastest" | cut -c1-240
