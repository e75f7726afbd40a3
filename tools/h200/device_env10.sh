# Sourced by the session-10 device scripts: strict mode, the Warp install of prepare-warp.sh on PYTHONPATH, the
# sm_90 kernel cache carried in .device/s10 (built here with `python -m fovi_lab warmup --aot-arch 90`) unpacked
# once per lease, and t0 for elapsed-time lines.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
if [ -f .device/s10/wpcache.txz ] && [ ! -d /tmp/wpc/wpcache ]; then
  mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s10/wpcache.txz
fi
[ -d /tmp/wpc/wpcache ] && export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
