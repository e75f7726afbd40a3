#!/usr/bin/env bash
# Session 10, run 59: mma loops of 2 and 4 k-steps per iteration (tile_k 32 / 64: every load of the iteration
# issued before its MMAs). GPU parity of every mma config, experimental ones too (tests/test_warp_mma.py); the
# registers and spills of each mma kernel; then every mma config (registered and experimental) on every layer
# at B = 16, 1 and 64, beside the picks and PyTorch, eager and replayed. Run 60 does B = 128, 512 and 32.
source tools/h200/device_env10.sh
BATCHES=${BATCHES:-16 1 64}
TAG=${TAG:-run59-ksteps}
if [ -z "${SKIP_TESTS:-}" ]; then
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.draw --format=csv > $OUT/nvsmi.txt 2>&1
  timeout 240 python3 -m pytest -x -q -p no:cacheprovider -o addopts="" -k gpu tests/test_warp_mma.py 2>&1 \
    | grep -v "^Warp" | tail -8 > $OUT/pytest_mma_gpu.log
  cat $OUT/pytest_mma_gpu.log
  echo "gpu tests done at $(( $(date +%s) - t0 )) s"
  for f in $(ls -d ${WARP_CACHE_PATH:-$HOME/.cache/warp/1.19.0}/wp_fovi_fwd_mma* 2>/dev/null); do
    cuobjdump --dump-resource-usage $f/*.cubin 2>/dev/null | grep -E "Function|REG" | tr -s ' ' | paste - - | cut -c1-200
  done > $OUT/mma_resources.txt 2>&1
  grep -c REG $OUT/mma_resources.txt
fi
MMA=$(python3 -c "from fovi_lab import warp_forward as F; print(' '.join(n for n in F.uncached_config_names(experimental=True) if F.config_spec(n).family in F._MMA_FAMILIES))" 2>/dev/null)
timeout ${SWEEP_S:-440} python3 -m fovi_lab.bench.forward --graphs --op-all --no-cached --compile-budget-s 60 --reps 15 \
  --warmup 3 --configs $MMA --batches $BATCHES --time-budget-s $(( ${SWEEP_S:-440} - 20 )) --tag $TAG \
  --out $OUT/forward_sweep_h200_$TAG.jsonl 2>&1 | grep -v "^Warp" > $OUT/sweep_$TAG.log
echo "sweep done at $(( $(date +%s) - t0 )) s"
grep -E "B=|budget" $OUT/sweep_$TAG.log | grep -v fastest | cut -c1-200 | tail -45
