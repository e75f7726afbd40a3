#!/usr/bin/env bash
# Session 7, run 40: the vec4 SIMT forward with its coalesced prep launch (x rows fastest, vec4 stores): the
# SIMT configs, the fp16 sd_b8o8u4 and the i2c pick on the stems at B = 1..128 (--op-all --graphs: the
# sweep behind the block rule), then the stems' train step at B = 16/64 on the default picks.
source tools/h200/device_env.sh
timeout 300 python3 -m fovi_lab.bench.forward --layers alex_L0 res18_stem dinov3_patch --batches 16 1 32 64 128 \
  --configs sd_b8o8u4 sv_b4o4u4 sv_b8o8u2 sv_b8o8u4b64 sv_b16o8u2 sv_b8o8u8 --op-all --graphs --no-cached \
  --compile-budget-s 45 --reps 20 --warmup 3 --time-budget-s 280 --out $OUT/forward_h200.jsonl 2>&1 \
  | grep -v "^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | grep "B=\|fastest" | cut -c1-240
timeout 200 python3 -m fovi_lab.bench.backward train-step --layers alex_L0 res18_stem --batches 16 64 --jobs 16 \
  --reps 25 --graphs --out $OUT/train-step_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/train.log
echo "train-step done at $(( $(date +%s) - t0 )) s"
grep -h "warp_train \|warp_train pipelined\|warp_train_graphed" $OUT/train.log | cut -c1-220
