#!/usr/bin/env bash
# Session 8, run 44: the split SIMT forward (simts, ss_*) on the layers with few output nodes at small batch,
# against the default picks (nm/nms/i2c) and PyTorch, eager per call and replayed from CUDA graphs; then the
# split's thread target swept (FOVI_WARP_SIMTS_THREADS, Warp only). Records carry tag simts_threads=<T>.
source tools/h200/device_env.sh
L="res18_layer3 res18_layer3_0 res18_layer4_0 res18_layer2 res18_layer2_0 dinov3_patch res18_layer1 alex_L2 alex_L4 alex_L1"
timeout 330 python3 -m fovi_lab.bench.forward --layers $L --batches 16 1 32 \
  --configs ss_b4o4u4 ss_b4o8u4 ss_b8o8u4 ss_b16o8u2 --op-all --graphs --no-cached --compile-budget-s 40 \
  --reps 20 --warmup 3 --time-budget-s 300 --tag simts_threads=32768 --out $OUT/forward_h200.jsonl 2>&1 \
  | grep -v "^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | grep "B=\|fastest" | cut -c1-250
for T in 8192 131072; do
  FOVI_WARP_SIMTS_THREADS=$T timeout 110 python3 -m fovi_lab.bench.forward --layers $L --batches 16 1 \
    --configs ss_b4o8u4 ss_b8o8u4 --op-all --graphs --no-torch --no-cached --reps 20 --warmup 3 \
    --time-budget-s 95 --tag simts_threads=$T --out $OUT/forward_h200_t$T.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench_t$T.log
  echo "threads $T done at $(( $(date +%s) - t0 )) s"
  grep "fastest" $OUT/bench_t$T.log | cut -c1-200
done
