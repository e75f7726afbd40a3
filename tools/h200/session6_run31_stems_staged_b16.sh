#!/usr/bin/env bash
# Session 6, run 31: should the stems stage their operands at small batch too? The train step of the Cin = 3
# layers at B = 16 (and DINOv3 at 64) with the staged-operand adjoints forced by FOVI_KNN_GI_CONFIG /
# FOVI_KNN_GW_CONFIG, beside the same step on the default rule (which stages only from 16M staged elements),
# each with --graphs (per-call, pipelined and graph-replayed times).
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s6/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
run() {  # tag layer batch gi gw
  FOVI_KNN_GI_CONFIG=$4 FOVI_KNN_GW_CONFIG=$5 timeout 150 python3 -m fovi_lab.bench.backward train-step \
    --layers $2 --batches $3 --jobs 16 --reps 25 --graphs --out $OUT/train-step_$1.jsonl 2>&1 | grep -v "^Warp" \
    > $OUT/train_$1.log
  echo "== $1 ($2 B=$3 gi=$4 gw=$5) at $(( $(date +%s) - t0 )) s"
  grep -h "warp_train \|warp_train pipelined\|warp_train_graphed" $OUT/train_$1.log | cut -c1-170
}
run default_stems16 "alex_L0 res18_stem dinov3_patch" 16 "" ""
run staged_alex16 alex_L0 16 gi2i_p64b64o96 gw3i_p64n96
run staged_stem16 res18_stem 16 gi2i_p64b64 gw3i_p64n64
run staged_dino16 dinov3_patch 16 gi2i_p64b64 gw3i_p64n128
run staged_dino64 dinov3_patch 64 gi2i_p64b64 gw3i_p64n128
