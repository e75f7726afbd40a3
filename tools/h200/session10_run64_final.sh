#!/usr/bin/env bash
# Session 10, run 64: the final tree. GPU parity of every mma config (tests/test_warp_mma.py -k gpu); then the
# forward benchmark as a user runs it: the rule's pick (eager per call and replayed), its own dense ceiling and
# every PyTorch baseline, on every layer at B = 16/1/4/32/64/128/512.
source tools/h200/device_env10.sh
timeout 200 python3 -m pytest -x -q -p no:cacheprovider -o addopts="" -k gpu tests/test_warp_mma.py 2>&1 \
  | grep -v "^Warp" | tail -8 > $OUT/pytest_mma_gpu.log
cat $OUT/pytest_mma_gpu.log
echo "gpu tests done at $(( $(date +%s) - t0 )) s"
timeout 400 python3 -m fovi_lab.bench.forward --graphs --no-cached --reps 20 --warmup 3 \
  --batches 16 1 4 32 64 128 512 --time-budget-s 380 --tag run64-final \
  --out $OUT/forward_h200_run64_final.jsonl 2>&1 | grep -v "^Warp" > $OUT/final_run64.log
echo "bench done at $(( $(date +%s) - t0 )) s"
sed -n '/^ layer            B     warp ms/,$p' $OUT/final_run64.log | cut -c1-170 | head -100
