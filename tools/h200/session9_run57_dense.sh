#!/usr/bin/env bash
# Session 9, run 57: the final forward picks on every layer at B = 16/32/64/128/512 with the dense ceilings of their
# own loop and operand layouts (x^T / W-in-place ceilings: dense_kind), Warp only; then the picks replayed beside the
# i2c/nm tiles' own dense ceilings for the tile-GEMM comparison (configs of session 8's rule, kernel alone).
source tools/h200/device_env9.sh
timeout 300 python3 -m fovi_lab.bench.forward --no-torch --no-cached --reps 15 --warmup 3 --graphs \
  --batches 16 32 64 128 512 --time-budget-s 270 --tag run57-dense \
  --out $OUT/forward_h200_run57_dense.jsonl 2>&1 | grep -v "^Warp" > $OUT/dense_run57.log
echo "done at $(( $(date +%s) - t0 )) s"
grep -E "B=" $OUT/dense_run57.log | grep -v fastest | cut -c1-170
