"""Which forward modules have an sm_90 cubin in WARP_CACHE_PATH (no compiling)."""
import os, sys
from fovi_lab.kernels import forward as F
from fovi_lab.kernels.warmup import forward_jobs
from fovi_lab.kernels.common import init_warp, wp
init_warp()
missing = []
jobs = forward_jobs()
for name, dense in jobs:
    cfg = F.config_spec(name)
    if dense and cfg.variant == "cached":
        cfg = F.FwdConfig(cfg.name, "gather", cfg.tile_m, cfg.tile_n, cfg.tile_k, 1, cfg.block_dim)
    k = F.build_kernel(cfg, dense=dense)
    mid = k.module.get_module_identifier()
    path = os.path.join(wp.config.kernel_cache_dir, mid, mid + ".sm90.cubin")
    if not os.path.exists(path):
        missing.append((name, dense, mid))
print(f"cache {wp.config.kernel_cache_dir}: {len(jobs) - len(missing)}/{len(jobs)} modules have sm90 cubins")
for m in missing:
    print("  missing", m)
sys.exit(1 if missing else 0)
