# Sourced by the session-8 device scripts: strict mode, the Warp install of prepare-warp.sh on PYTHONPATH, the
# sm_90 kernel cache carried in .device/s6 unpacked once per lease, and t0 for the scripts' elapsed-time lines.
set -uo pipefail
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
[ -d /tmp/wpc/wpcache ] || { mkdir -p /tmp/wpc && tar -C /tmp/wpc -xJf .device/s6/wpcache.txz; }
export WARP_CACHE_PATH=/tmp/wpc/wpcache
t0=$(date +%s)
