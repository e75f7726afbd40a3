#!/usr/bin/env bash
# Session 9, run 51 (after the third Warp install part): the mma.sync kernels' fragment packing on the GPU. Every
# mma config (experimental ones too) on six real layers at B = 1/17/64 against the fp32 oracle, NaN-prefilled, split
# ones bitwise repeated (tests/test_warp_mma.py's GPU test); then one quick eager timing of each on alexnet's stem
# at B = 16 beside the current pick (a smoke reading before the sweep of run 52).
source tools/h200/device_env9.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm,power.draw --format=csv > $OUT/nvsmi.txt 2>&1
timeout 300 python3 -m pytest -x -q -p no:cacheprovider -o addopts="" -k gpu tests/test_warp_mma.py 2>&1 \
  | grep -v "^Warp" | tail -25 > $OUT/pytest_mma_gpu.log
cat $OUT/pytest_mma_gpu.log
echo "gpu tests done at $(( $(date +%s) - t0 )) s"
MMA=$(python3 -c "from fovi_lab import warp_forward as F; print(' '.join(n for n in F.uncached_config_names(experimental=True) if F.config_spec(n).family in ('mma','mmas')))" 2>/dev/null)
timeout 200 python3 -m fovi_lab.bench.forward --layers alex_L0 res18_layer3 --batches 16 --no-torch --no-cached \
  --configs $MMA sd_b8o8u4 --reps 10 --graphs --op-all --time-budget-s 180 --out $OUT/forward_h200_smoke.jsonl 2>&1 \
  | grep -v "^Warp" > $OUT/smoke.log
grep -E "B=|fastest" $OUT/smoke.log | cut -c1-220
# registers and spills of the mma kernels (Warp's kernel cache)
for f in $(ls -d ${WARP_CACHE_PATH:-$HOME/.cache/warp/1.19.0}/wp_fovi_fwd_mma* 2>/dev/null); do
  cuobjdump --dump-resource-usage $f/*.cubin 2>/dev/null | grep -E "Function|REG" | tr -s ' ' | paste - - | cut -c1-200
done > $OUT/mma_resources.txt 2>&1
head -40 $OUT/mma_resources.txt
echo "smoke done at $(( $(date +%s) - t0 )) s"
