#!/usr/bin/env bash
# Session 9, run 54: the selection rule of runs 52-53 (mma picks) and the two other operand layouts (W read in
# place: mmaw / mmasw; x^T: mmat). GPU parity of every mma config (tests/test_warp_mma.py), then every registered
# mma-family config on every layer at B = 32 (not in runs 52-53) and at B = 16/1/4/64/128/512, beside the picks
# and PyTorch, eager and replayed.
source tools/h200/device_env9.sh
timeout 200 python3 -m pytest -x -q -p no:cacheprovider -o addopts="" -k gpu tests/test_warp_mma.py 2>&1 \
  | grep -v "^Warp" | tail -5 > $OUT/pytest_mma_gpu.log
cat $OUT/pytest_mma_gpu.log
echo "gpu tests done at $(( $(date +%s) - t0 )) s"
MMA=$(python3 -c "from fovi_lab import warp_forward as F; print(' '.join(n for n in F.uncached_config_names() if F.config_spec(n).family in F._MMA_FAMILIES))" 2>/dev/null)
timeout 420 python3 -m fovi_lab.bench.forward --graphs --op-all --no-cached --compile-budget-s 60 --reps 15 --warmup 3 \
  --configs $MMA --batches 32 16 1 4 64 128 512 --time-budget-s 380 --tag run54-mma \
  --out $OUT/forward_sweep_h200_run54.jsonl 2>&1 | grep -v "^Warp" > $OUT/sweep_run54.log
echo "sweep done at $(( $(date +%s) - t0 )) s"
grep -E "B=|budget" $OUT/sweep_run54.log | grep -v fastest | cut -c1-200 | tail -40
