#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/wpc && python3 -c "import tarfile; tarfile.open('.device/fwd/wpcache.txz').extractall('/tmp/wpc')"
export WARP_CACHE_PATH=/tmp/wpc/wpcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee $OUT/nvsmi.txt
L="res18_layer1 alex_L1 alex_L0 res18_stem dinov3_patch alex_L2 alex_L3 alex_L4 res18_layer2_0 res18_layer2 res18_layer3_0 res18_layer3 res18_layer4_0"
t0=$(date +%s)
timeout 200 python3 -m fovi_lab.bench.backward train-step --batches 64 16 512 --jobs 16 --reps 25 --graphs \
  --layers $L --time-budget-s 170 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -A 45 "backend's own path" $OUT/train.log | head -60
