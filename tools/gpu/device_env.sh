# Sourced by tools/gpu/run.sh on the GPU machine: strict mode, the Warp install of the set-up calls on PYTHONPATH,
# and a prebuilt sm_90 kernel cache (.device/cache/wpcache.txz, made here by tools/gpu/stage_cache.sh) unpacked once
# per machine into $FOVI_GPU_SCRATCH/wpc when a call carried it.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# what a job keeps for the next call on the same machine (the kernel cache, fovi's network records); the checks of
# tests/tools/test_gpu_runner.py point it at a folder of their own
scratch="${FOVI_GPU_SCRATCH:-/tmp}"
# the records' commit: the staged HEAD's (tools/gpu/stage_head.sh), where a call carried it
[ -f .device/head/commit ] && [ -z "${FOVI_COMMIT:-}" ] && export FOVI_COMMIT="$(cat .device/head/commit)"
if [ -f .device/cache/wpcache.txz ] && [ ! -d "$scratch/wpc/wpcache" ]; then
  mkdir -p "$scratch/wpc" && tar -C "$scratch/wpc" -xJf .device/cache/wpcache.txz
fi
[ -d "$scratch/wpc/wpcache" ] && export WARP_CACHE_PATH="$scratch/wpc/wpcache"
t0=$(date +%s)
