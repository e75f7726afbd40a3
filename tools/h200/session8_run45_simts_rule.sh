#!/usr/bin/env bash
# Session 8, run 45: the simts rule in place (ss_b4o8u4 at B <= 4, ss_b8o8u4 at B <= 16 on <= 16-node layers):
# the default picks at B = 1/4/16 on every layer beside the previous picks (nm/nms/i2c 16x32 tiles) and PyTorch,
# eager per call and replayed; then the split kernel on the two CNN stems at B = 16 beside their sd_b8o8u4 pick.
source tools/h200/device_env.sh
B="python3 -m fovi_lab.bench.forward --op-all --graphs --no-cached --compile-budget-s 40 --reps 20 --warmup 3"
timeout 300 $B --layers res18_layer3 res18_layer3_0 res18_layer4_0 res18_layer2 res18_layer2_0 res18_layer1 \
  alex_L2 alex_L4 alex_L3 alex_L1 --batches 16 4 1 --configs nm_m16n32k64 nms_m16n32k64 ss_b8o8u4 ss_b4o8u4 \
  --time-budget-s 280 --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench_nm.log
echo "node-major layers done at $(( $(date +%s) - t0 )) s"
timeout 80 $B --layers dinov3_patch --batches 16 4 1 --configs i2c_m16n64k64 ss_b8o8u4 ss_b4o8u4 \
  --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench_dino.log
echo "dinov3 done at $(( $(date +%s) - t0 )) s"
timeout 90 $B --layers alex_L0 res18_stem --batches 16 4 --configs sd_b8o8u4 sdp_b4o4u4 ss_b8o8u4 ss_b4o8u4 \
  --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench_stems.log
echo "stems done at $(( $(date +%s) - t0 )) s"
cat $OUT/bench_nm.log $OUT/bench_dino.log $OUT/bench_stems.log | grep -A40 "CUDA-graph replay" | cut -c1-200
