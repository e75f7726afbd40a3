#!/usr/bin/env bash
# Session 6, run 29: the stems' staged-operand adjoints with 96-wide Cout tiles (gi2i/gi3i ...o96, gw3i_p64n96:
# alexnet's stem has Cout = 96, the 64/128-wide tiles padded it to 128). The gi/gw stage sweep on alexnet L0
# (both widths, fp16 and fp32 stages; kernels alone and whole grads), then the stems' train step at
# B = 16/64/512 with --graphs on the new defaults.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s6/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 200 python3 -m fovi_lab.bench.backward backward --sweep --layers alex_L0 --batches 64 16 512 --jobs 16 \
  --gi-configs gi2i_p64b64 gi2i_p64b64o96 gi3i_p64b128 gi3i_p64b128o96 --gw-configs gw3i_p64n128 gw3i_p64n96 \
  --reps 15 --out $OUT/backward_sweep_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/sweep.log
echo "sweep done at $(( $(date +%s) - t0 )) s"
grep -h "warp_gi \|warp_gw " $OUT/sweep.log | cut -c1-200 | head -40
timeout 300 python3 -m fovi_lab.bench.backward train-step --layers alex_L0 res18_stem dinov3_patch \
  --batches 64 16 512 --jobs 16 --reps 25 --graphs --out $OUT/train-step_h200.jsonl 2>&1 \
  | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train_graphed" $OUT/train.log | cut -c1-260
