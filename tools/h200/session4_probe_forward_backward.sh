#!/usr/bin/env bash
# Session 4, run 13 (part 1): host probe, forward benchmark B=16/64 (all layers, graphs), backward stage/reduce breakdown
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
mkdir -p /tmp/wpc && rm -rf /tmp/wpc/wpcache && tar -C /tmp/wpc -xJf .device/s4/wpcache.txz && export WARP_CACHE_PATH=/tmp/wpc/wpcache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv > $OUT/nvsmi.txt
t0=$(date +%s)
timeout 120 python3 tools/h200/host_probe.py > $OUT/host_probe.log 2>&1
echo "probe done at $(( $(date +%s) - t0 )) s"; grep -v "^ \|^-\|^Warp" $OUT/host_probe.log | cut -c1-330
timeout 200 python3 -m fovi_lab.bench.forward --graphs --no-cached --compile-budget-s 60 --reps 20 --warmup 3 \
  --batches 16 64 --time-budget-s 170 --out $OUT/forward_h200.jsonl 2>&1 | grep -v "^   \|^Warp" > $OUT/bench.log
echo "forward done at $(( $(date +%s) - t0 )) s"
grep -v "^\[" $OUT/bench.log | grep -v "^ [a-z0-9_]* B=" | tail -34
timeout 150 python3 -m fovi_lab.bench.backward backward --jobs 16 --reps 15 --layers alex_L0 res18_stem dinov3_patch \
  --batches 64 512 --time-budget-s 120 --out $OUT/backward_h200.jsonl 2>&1 | grep -v "^Warp" > $OUT/backward.log
echo "backward done at $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/backward_h200.jsonl"):
    r = json.loads(l)
    if r.get("dx_reduce_gbps") or r.get("dw_reduce_gbps"):
        print(r["layer"], r["B"], r["impl"], r.get("gi_config") or r.get("gw_config"), "dx_red", r.get("dx_reduce_ms"), r.get("dx_reduce_gbps"), "dw_red", r.get("dw_reduce_ms"), r.get("dw_reduce_gbps"))
PY
