#!/usr/bin/env bash
# Session 8, run 50: after the SIMT loops' p entry became one shared Warp function (_simt_step), the split and
# unsplit SIMT kernels replayed beside their run 45-49 times (Warp only; the replay times are printed).
source tools/h200/device_env.sh
B="python3 -m fovi_lab.bench.forward --op-all --graphs --no-cached --no-torch --reps 20 --warmup 3"
$B --layers alex_L0 res18_stem --batches 16 4 --configs sd_b8o8u4 sdp_b4o4u4 ss_b4o8u4 ss_b8o8u4 --out $OUT/f.jsonl 2>&1 | grep -v "^Warp" > $OUT/a.log
$B --layers res18_layer3 alex_L2 --batches 16 1 --configs ss_b8o8u4 ss_b4o8u4 --out $OUT/f.jsonl 2>&1 | grep -v "^Warp" > $OUT/b.log
python3 - <<'PY'
import json,os
for l in open(os.environ['OUT']+'/f.jsonl'):
    r=json.loads(l)
    if r['impl']=='warp_uncached_graphed' and r.get('ms'): print(r['layer'],r['B'],r['config'],round(r['ms'],4))
PY
