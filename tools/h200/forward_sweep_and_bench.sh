#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/wpc && python3 -c "import tarfile; tarfile.open('.device/fwd/wpcache.txz').extractall('/tmp/wpc')"
export WARP_CACHE_PATH=/tmp/wpc/wpcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee $OUT/nvsmi.txt
python3 tools/h200/check_cache.py 2>&1 | grep -v "^   " | head -3
python3 -m fovi_lab.kernels.warmup --jobs 16 2>&1 | grep -v "^   \|^Warp" | tail -2
python3 -m fovi_lab.bench.forward --all-configs --gemm4096 --store-compare --reps 10 --warmup 2 \
  --layers res18_layer1 alex_L1 alex_L0 res18_stem dinov3_patch alex_L2 alex_L3 alex_L4 res18_layer2_0 res18_layer2 \
           res18_layer3_0 res18_layer3 res18_layer4_0 \
  --batches 512 64 16 128 --no-compile --time-budget-s ${SWEEP_BUDGET:-220} \
  --out $OUT/forward_sweep.jsonl 2>&1 | grep -v "^   \|^Warp" > $OUT/sweep.log
tail -3 $OUT/sweep.log
python3 -m fovi_lab.bench.forward --store-compare --reps 20 --warmup 3 --compile-budget-s 90 \
  --time-budget-s ${BENCH_BUDGET:-200} --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^   \|^Warp" > $OUT/bench.log
tail -62 $OUT/bench.log
