#!/usr/bin/env bash
# Session 4, run 14: the stems' stage dtype and stage budget, side by side (alexnet L0, res18 stem)
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/wpc && rm -rf /tmp/wpc/wpcache && tar -C /tmp/wpc -xJf .device/s4/wpcache.txz && export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
run() {  # tag, batches, layers, env...
  local tag=$1 bs=$2 ls=$3; shift 3
  env "$@" timeout 150 python3 -m fovi_lab.bench.backward train-step --batches $bs --jobs 16 --reps 25 --graphs \
    --layers $ls --time-budget-s 120 --out $OUT/ts_$tag.jsonl > $OUT/ts_$tag.log 2>&1
  echo "== $tag ($*) done at $(( $(date +%s) - t0 )) s"
  grep -v "^\[" $OUT/ts_$tag.log | grep "  warp_train \|warp_train_graphed\|torch_autograd_tgather_bmm  \|torch_autograd_gather_bmm  \|tgather_bmm_graphed\|  gather_bmm_graphed" | cut -c1-240
}
run default "64 512" "alex_L0 res18_stem"
run f32_b64 64 alex_L0 FOVI_KNN_GI_CONFIG=gi2i_p64b64_f32 FOVI_KNN_GW_CONFIG=gw3i_p64n128_f32 FOVI_KNN_GRAD_STAGE_MIB=64
run f32_b64_stem 64 res18_stem FOVI_KNN_GI_CONFIG=gi2i_p64b64_f32 FOVI_KNN_GW_CONFIG=gw3i_p64n64_f32 FOVI_KNN_GRAD_STAGE_MIB=64
run mixed_b64 64 alex_L0 FOVI_KNN_GW_CONFIG=gw3i_p64n128_f32 FOVI_KNN_GRAD_STAGE_MIB=64
run f32_b512 512 alex_L0 FOVI_KNN_GW_CONFIG=gw3i_p64n128_f32 FOVI_KNN_GRAD_STAGE_MIB=64
run budget64 "64 512" alex_L0 FOVI_KNN_GRAD_STAGE_MIB=64
