#!/usr/bin/env bash
# Here, on a CPU machine: the sm_90 kernel cache a GPU call unpacks (tools/gpu/device_env.sh), so the jobs of
# tools/gpu/run.sh load most modules instead of compiling them inside the call. Warp's bundled NVRTC builds them ahead
# of time (`warmup --aot-arch 90`, no GPU needed), twice:
#   a) every forward config and fused adjoint kernel with the scalar tile GEMM (FOVI_WARP_MATHDX=0: warmup, parity
#      and host run so), the experimental configs included;
#   b) the same with Warp's default cuBLASDx tile GEMM (the train-step and network jobs): of these only the fused
#      adjoint modules are kept (1-3 MB each; the cuBLASDx tile-GEMM forwards, 3 MB each, are not the rules' picks on
#      a GPU, and the tensor-core forwards are the same modules in both builds).
# Packed without the CUDA sources and the LTO parts (a load reads the cubin and its .meta alone) into
# .device/cache/wpcache.txz: about 4 MB, carried beside .device/wt1 (move data/ aside for that call: the tracked
# tree travels too, within the 64 MiB a call carries). A module whose kernel source changed since is compiled there
# as before.  ~16 min on 2 cores.
#
#   bash tools/gpu/stage_cache.sh [build folder: a new one, or one this script made; default /tmp/wpc_stage]
set -euo pipefail
build="$(realpath -m "${1:-/tmp/wpc_stage}")"        # resolved before the cd below
cd "$(dirname "$0")/../.."
if [ -e "$build" ] && [ ! -f "$build/.fovi_stage_cache" ]; then
  echo "stage_cache.sh: $build exists and is not a folder this script made; name a new one" >&2; exit 2
fi
rm -rf "$build" && mkdir -p "$build" && touch "$build/.fovi_stage_cache"
warm() {        # $1: the cache folder, then warmup's options; the log's end where it fails
  local cache="$1"; shift
  env -u FOVI_WARP_MATHDX WARP_CACHE_PATH="$build/$cache" python -m fovi_lab warmup --no-dense --aot-arch 90 "$@" \
    > "$build/$cache.log" 2>&1 || { tail -20 "$build/$cache.log" >&2; exit 1; }
  tail -1 "$build/$cache.log"
}
warm a --experimental --mathdx off      # the scalar tile GEMM (warmup, parity and host run under FOVI_WARP_MATHDX=0)
warm b                                  # Warp's default, cuBLASDx (the train step and the networks)
versions=("$build/a"/*)
[ ${#versions[@]} -eq 1 ] || { echo "stage_cache.sh: expected one Warp version in $build/a" >&2; exit 1; }
version=$(basename "${versions[0]}")
mkdir -p "$build/wpcache/$version"
cp -r "$build/a/$version"/wp_* "$build/wpcache/$version/"
for d in "$build/b/$version"/wp_*; do          # b's fused adjoint modules (a has the tensor-core forwards already)
  case "$(basename "$d")" in wp_fovi_fwd_*) ;; *) cp -r "$d" "$build/wpcache/$version/" ;; esac
done
mkdir -p .device/cache
tar -C "$build" -cJf .device/cache/wpcache.txz --exclude='*.cu' --exclude='*/lto' wpcache
echo "$(ls "$build/wpcache/$version" | wc -l) modules for sm_90 in .device/cache/wpcache.txz" \
     "($(du -h .device/cache/wpcache.txz | cut -f1))"
