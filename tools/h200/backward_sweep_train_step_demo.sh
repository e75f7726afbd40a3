#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/wpc && [ -d /tmp/wpc/wpcache ] || python3 -c "import tarfile; tarfile.open('.device/fwd/wpcache.txz').extractall('/tmp/wpc')"
export WARP_CACHE_PATH=/tmp/wpc/wpcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee $OUT/nvsmi.txt
t0=$(date +%s)
python3 -m fovi_lab.bench.backward backward --sweep \
  --gi-configs gi2_p64b128 gi2_p64b64 gi3_p64b128 gi2p_p64b128 gi3p_p64b128 \
  --gw-configs gw2_p64n128 gw3_p64n128 gw3_p64n64 gw4_p64n64 gw3p_p64n128 \
  --layers alex_L1 res18_layer1 alex_L0 res18_layer3 --batches 512 64 --jobs 16 \
  --time-budget-s ${SWEEP_BUDGET:-170} --out $OUT/backward_sweep_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/sweep.log
echo "sweep done at $(( $(date +%s) - t0 )) s"; grep "precompile done" $OUT/sweep.log
python3 -m fovi_lab.bench.backward train-step --batches 64 512 128 --jobs 16 \
  --time-budget-s ${TRAIN_BUDGET:-170} --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
tail -40 $OUT/train.log
python3 -m fovi_lab demo --layer res18_layer1 --batch 64 --reps 5 2>&1 | grep -v "^Warp" > $OUT/demo.log
tail -8 $OUT/demo.log
echo "all done at $(( $(date +%s) - t0 )) s"
