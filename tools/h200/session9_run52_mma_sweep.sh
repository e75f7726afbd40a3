#!/usr/bin/env bash
# Session 9, runs 52-53: the registered mma / mmas configs on every layer beside the current pick (its kernel, whole op
# eager and replayed, dense ceilings) and every PyTorch baseline (replayed too). BATCHES picks the batch sizes
# (run 52: 16 1 4; run 53: 64 128 512). Needs the sm_90 cache in .device/s9 (the current picks' MathDx modules).
source tools/h200/device_env9.sh
RUN=${RUN:-52}
BATCHES=${BATCHES:-16 1 4}
MMA=$(python3 -c "from fovi_lab import warp_forward as F; print(' '.join(n for n in F.uncached_config_names() if F.config_spec(n).family in ('mma','mmas')))" 2>/dev/null)
timeout ${LIMIT:-540} python3 -m fovi_lab.bench.forward --graphs --op-all --no-cached --compile-budget-s 60 --reps 15 --warmup 3 \
  --configs $MMA --batches $BATCHES --time-budget-s ${BUDGET:-470} --tag run$RUN-mma \
  --out $OUT/forward_sweep_h200_run$RUN.jsonl 2>&1 | grep -v "^Warp" > $OUT/sweep_run$RUN.log
echo "sweep done at $(( $(date +%s) - t0 )) s"
grep -E "B=|fastest|budget" $OUT/sweep_run$RUN.log | cut -c1-230
