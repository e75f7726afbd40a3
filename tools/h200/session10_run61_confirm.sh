#!/usr/bin/env bash
# Session 10, run 61: (1) A/B of the session-10 warp_mma source against session 9's (db404c0, carried in
# .device/ab) on the k16 configs the rules pick, interleaved on one lease (tools/h200/ab_mma_source.py);
# (2) every mma config (registered and experimental) again on every layer at B = 16/1/4/32/64/128/512, with the
# rule of runs 59-60 choosing (a second lease's sample for every point).
source tools/h200/device_env10.sh
timeout 200 python3 tools/h200/ab_mma_source.py --old .device/ab/warp_mma_s9.py --rounds 3 --tag run61-ab \
  --configs mma_o32b8 mma_o64b16 mma_o96b16 mmas_o32b8 mmas_o64b8 mmasw_o32b16 mmat_o64b16 mmat_o64b32 mmat_o96b32 \
  --layers res18_layer1 alex_L2 res18_stem --batches 16 128 \
  --out $OUT/forward_h200_run61_ab.jsonl 2>&1 | grep -v "^Warp" | tee $OUT/ab_run61.log | cut -c1-600
echo "a/b done at $(( $(date +%s) - t0 )) s"
MMA=$(python3 -c "from fovi_lab import warp_forward as F; print(' '.join(n for n in F.uncached_config_names(experimental=True) if F.config_spec(n).family in F._MMA_FAMILIES))" 2>/dev/null)
timeout 360 python3 -m fovi_lab.bench.forward --graphs --op-all --no-cached --compile-budget-s 60 --reps 15 \
  --warmup 3 --configs $MMA --batches 16 1 64 128 512 32 4 --time-budget-s 340 --tag run61-confirm \
  --out $OUT/forward_sweep_h200_run61.jsonl 2>&1 | grep -v "^Warp" > $OUT/sweep_run61.log
echo "sweep done at $(( $(date +%s) - t0 )) s"
grep -E "B=|budget" $OUT/sweep_run61.log | grep -v fastest | cut -c1-180 | tail -20
