#!/usr/bin/env bash
# Session 3, run 10: the stems' i2c forward configs (sweep over B in {16, 64, 128, 512}; appended to
# data/forward_sweep_h200.jsonl) and the train step of the three stems with --graphs
# (data/train-step_h200_run10_stems-i2c.jsonl). Compiles on the GPU machine (warmup, 16 processes).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/wpc/wpcache && export WARP_CACHE_PATH=/tmp/wpc/wpcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/nvsmi.txt
t0=$(date +%s)
C="i2c_m16n64k64 i2c_m16n96k64 i2c_m64n64k64 i2c_m64n96k64 i2c_m64n96k128 i2c_m64n128k64 i2cg_m64n96k64"
timeout 110 python3 -m fovi_lab warmup --no-grad --jobs 16 --only $C m64n96b256 m64n64r1b256 m16n64 > $OUT/warmup.log 2>&1
echo "warmup done at $(( $(date +%s) - t0 )) s"; tail -1 $OUT/warmup.log
L="alex_L0 res18_stem dinov3_patch"
timeout 70 python3 -m fovi_lab.bench.forward --configs $C m64n96b256 m64n64r1b256 m16n64 --reps 10 --warmup 2 --no-compile --no-cached \
  --layers $L --batches 16 64 128 512 --time-budget-s 55 --out $OUT/forward_sweep.jsonl 2>&1 | grep -v "^   \|^Warp" > $OUT/sweep.log
echo "sweep done at $(( $(date +%s) - t0 )) s"; grep -v "^\[" $OUT/sweep.log | tail -14
timeout 230 python3 -m fovi_lab.bench.backward train-step --batches 64 512 16 --jobs 16 --reps 25 --graphs \
  --layers $L --time-budget-s 200 --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/train.log | grep -v "^  \[" | tail -40
