#!/usr/bin/env bash
# Session 8, run 47: the fp16 SIMT loops with W read as fp32 vec4 words of a cached, channel-permuted W^T (sw_*:
# unsplit, ssw_*: split), x still read in place, against the sd_/sv_/ss_ picks: the stems at B = 16/32/64, and
# the split kernels at B = 1/4/16 on the layers that take them. Eager per call and replayed.
source tools/h200/device_env.sh
B="python3 -m fovi_lab.bench.forward --op-all --graphs --no-cached --compile-budget-s 40 --reps 20 --warmup 3"
timeout 200 $B --layers alex_L0 res18_stem --batches 16 32 64 \
  --configs sd_b8o8u4 sw_b8o8u4 sw_b8o8u2 sw_b8o16u2 sw_b4o8u4 sv_b8o8u8 sv_b16o8u2 \
  --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench_stems.log
echo "stems done at $(( $(date +%s) - t0 )) s"
grep "B=\|fastest" $OUT/bench_stems.log | cut -c1-220
timeout 250 $B --layers res18_layer3 res18_layer3_0 res18_layer4_0 res18_layer2 res18_layer1 alex_L2 alex_L1 dinov3_patch \
  --batches 1 4 16 --configs ss_b8o8u4 ss_b4o8u4 ssw_b8o8u4 ssw_b4o8u4 \
  --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/bench_split.log
timeout 60 $B --layers alex_L0 res18_stem --batches 1 4 --configs ss_b8o8u4 ss_b4o8u4 ssw_b8o8u4 ssw_b4o8u4 \
  --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^Warp" >> $OUT/bench_split.log
echo "split done at $(( $(date +%s) - t0 )) s"
grep "fastest" $OUT/bench_split.log | cut -c1-220
