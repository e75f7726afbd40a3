#!/usr/bin/env bash
# Session 6, run 33: alexnet's stem with B = 16 tiles in its staged-operand adjoints (gi2i_p64b16o96: a 16-wide
# batch tile; gw3i_p64n96k16: 16-deep batch chunks; the 64-wide ones were 3/4 zero padding at B = 16), its
# train step at B = 16/64/512 with --graphs.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s6/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
timeout 200 python3 -m fovi_lab.bench.backward train-step --layers alex_L0 --batches 16 64 512 --jobs 16 --reps 25 \
  --graphs --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train pipelined\|warp_train_graphed\|precompile" $OUT/train.log | cut -c1-220
