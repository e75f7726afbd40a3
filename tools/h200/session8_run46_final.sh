#!/usr/bin/env bash
# Session 8, run 46: the CNN stems at B = 1/4 with the split SIMT kernel beside their sdp_b4o4u4 / sd_b8o8u4
# picks (run 45 found ss_b4o8u4 1.3x faster replayed on alexnet's stem at B = 4); then the default picks of every
# layer at B = 1/4/16/32, eager and replayed, beside PyTorch (the record quoted for the split SIMT rule).
source tools/h200/device_env.sh
B="python3 -m fovi_lab.bench.forward --graphs --no-cached --compile-budget-s 60 --reps 20 --warmup 3"
timeout 120 $B --op-all --layers alex_L0 res18_stem --batches 1 4 --configs sdp_b4o4u4 ss_b4o8u4 ss_b8o8u4 sd_b8o8u4 \
  --out $OUT/forward_h200_stems.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench_stems.log
echo "stems done at $(( $(date +%s) - t0 )) s"
grep -A12 "CUDA-graph replay" $OUT/bench_stems.log | cut -c1-200
grep "fastest" $OUT/bench_stems.log
timeout 420 $B --batches 16 4 1 32 --time-budget-s 400 --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench_all.log
echo "all layers done at $(( $(date +%s) - t0 )) s"
grep -A80 "layer            B     warp ms" $OUT/bench_all.log | cut -c1-200
