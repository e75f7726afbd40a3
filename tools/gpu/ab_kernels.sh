#!/usr/bin/env bash
# A/B of two revisions' kernels on the GPU machine in one call: the same benchmark, alternated
# base, new, base, new, so the drift between calls and between lent machines stays out of the comparison.
#
# Here (no GPU):
#   bash tools/gpu/ab_kernels.sh prepare BASE_REV     # writes .device/base/fovi_lab from git (git-ignored)
#   # the whole tree travels with each call (64 MiB with what is carried): move data/ out for the run
# On the GPU machine, after the three Warp install runs, carrying [".device/warp2", ".device/base"]:
#   bash .device/warp2/install.sh && export PYTHONPATH=/tmp/site && \
#     bash tools/gpu/ab_kernels.sh run backward --layers alex_L0 res18_layer1 --batches 64 512 --reps 15
#   (the arguments after "run" go to python -m fovi_lab.bench.backward; FOVI_AB_BENCH=fovi_lab.bench.forward
#   runs the forward benchmark instead; FOVI_AB_ROUNDS sets the number of base/new rounds, default 2)
# Records: $OUT/ab_base.jsonl and $OUT/ab_new.jsonl (one record per implementation, shape and round);
#   python tools/gpu/ab_compare.py ab_base.jsonl ab_new.jsonl prints them side by side.
set -euo pipefail
cmd="${1:-}"; shift || true
case "$cmd" in
  prepare)
    rev="${1:?usage: ab_kernels.sh prepare BASE_REV}"
    rm -rf .device/base && mkdir -p .device/base
    grep -qxF '/.device/' .git/info/exclude 2>/dev/null || echo '/.device/' >> .git/info/exclude
    git archive "$rev" fovi_lab | tar -x -C .device/base
    echo "base $(git rev-parse --short "$rev") in .device/base ($(du -sh .device/base | cut -f1))"
    ;;
  run)
    root="$PWD"
    bench="${FOVI_AB_BENCH:-fovi_lab.bench.backward}"
    for round in $(seq 1 "${FOVI_AB_ROUNDS:-2}"); do
      for side in base new; do
        if [ "$side" = base ]; then cd "$root/.device/base"; else cd "$root"; fi
        rc=0
        python3 -m "$bench" "$@" --out "$OUT/ab_$side.jsonl" >> "$OUT/ab_$side.log" 2>&1 || rc=$?
        echo "round $round $side: rc $rc"
      done
    done
    cd "$root"
    ;;
  *)
    echo "usage: ab_kernels.sh prepare BASE_REV | run BENCH_ARGS..." >&2
    exit 2
    ;;
esac
