#!/usr/bin/env bash
# Session 6, run 32: the stems' train step at B = 16/64/512 with --graphs on the final rules (staged operands
# from 4M staged elements with the 96-wide Cout tiles, gi2i and fp32 stages above B = 64).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s6/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 300 python3 -m fovi_lab.bench.backward train-step --layers alex_L0 res18_stem dinov3_patch \
  --batches 64 16 512 --jobs 16 --reps 25 --graphs --out $OUT/train-step_h200.jsonl 2>&1 \
  | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train pipelined\|warp_train_graphed" $OUT/train.log | cut -c1-200
