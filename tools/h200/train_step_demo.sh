#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/wpc && [ -d /tmp/wpc/wpcache ] || python3 -c "import tarfile; tarfile.open('.device/fwd/wpcache.txz').extractall('/tmp/wpc')"
export WARP_CACHE_PATH=/tmp/wpc/wpcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee $OUT/nvsmi.txt
t0=$(date +%s)
python3 -m fovi_lab.bench.backward train-step --batches 64 512 128 --jobs 16 \
  --time-budget-s ${TRAIN_BUDGET:-200} --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"; grep "precompile done" $OUT/train.log
tail -42 $OUT/train.log
python3 -m fovi_lab demo --layer alex_L1 --batch 64 --reps 5 2>&1 | grep -v "^Warp" > $OUT/demo.log
tail -7 $OUT/demo.log
echo "all done at $(( $(date +%s) - t0 )) s"
