#!/usr/bin/env bash
# Session 10, run 63: the staged store (mmao / mmato: a block's warps are consecutive nodes and write y through a
# shared tile) and the picks in 2-warp / 1-warp blocks (b64 / b32: more SMs busy on grids of a few hundred warps).
# GPU parity of every mma config, experimental ones too (tests/test_warp_mma.py, NaN-prefilled, six real layers);
# then every mma config on every layer at B = 512/128/64/16/32/4/1 beside the picks and PyTorch, replayed.
source tools/h200/device_env10.sh
timeout 200 python3 -m pytest -x -q -p no:cacheprovider -o addopts="" -k gpu tests/test_warp_mma.py 2>&1 \
  | grep -v "^Warp" | tail -8 > $OUT/pytest_mma_gpu.log
cat $OUT/pytest_mma_gpu.log
echo "gpu tests done at $(( $(date +%s) - t0 )) s"
MMA=$(python3 -c "from fovi_lab import warp_forward as F; print(' '.join(n for n in F.uncached_config_names(experimental=True) if F.config_spec(n).family in F._MMA_FAMILIES))" 2>/dev/null)
timeout 380 python3 -m fovi_lab.bench.forward --graphs --op-all --no-cached --compile-budget-s 60 --reps 15 \
  --warmup 3 --configs $MMA --batches 512 128 64 16 32 4 1 --time-budget-s 360 --tag run63-stage \
  --out $OUT/forward_sweep_h200_run63.jsonl 2>&1 | grep -v "^Warp" > $OUT/sweep_run63.log
echo "sweep done at $(( $(date +%s) - t0 )) s"
grep -E "B=|budget" $OUT/sweep_run63.log | grep -v fastest | cut -c1-180 | tail -12
