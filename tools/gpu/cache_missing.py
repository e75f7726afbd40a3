"""Which modules the GPU runs need have no sm_90 cubin in the kernel cache, and (``--compile``) compile
them here ahead of time, without a GPU, in parallel processes.

``WARP_CACHE_PATH=/tmp/wpc/wpcache python tools/gpu/cache_missing.py [--compile] [--jobs N]``

Covers every forward config (kernel and dense ceiling, the experimental ones too), every fused adjoint
kernel (dxn/dxs/dwn/dws), every staged gi/gw/csr kernel and the SIMT helpers. MathDx follows
``FOVI_WARP_MATHDX`` as on the device (the default there: on).
"""
import argparse
import multiprocessing as mp
import os
import sys
import time


def _targets():
    from fovi_lab.kernels import adjoint as A
    from fovi_lab.kernels.adjoint import staged as adj_staged
    from fovi_lab.kernels import adjoint as N
    from fovi_lab.kernels.adjoint import fused_build as adj_fused_build
    from fovi_lab.kernels.adjoint import fused_plans as adj_fused_plans
    from fovi_lab.kernels import forward as F
    out = []
    for name in F.uncached_config_names(experimental=True):
        out += [("fwd", name, False), ("fwd", name, True)]
    out += [("nm", f"{k}:{n}", False) for k, n in N.nm_grad_kernel_names()]
    out += [("grad", f"{k}:{n}", False) for k, n in A.all_grad_kernel_names()]
    out += [("simt", n, False) for n in ("gather_rows", "gather_rows_pair", "nms_reduce", "dw_finish",
                                         "seg_finish", "seg_finish_tiled32", "seg_finish_tiled64")]
    return out


def _kernel(t):
    from fovi_lab.kernels import adjoint as A
    from fovi_lab.kernels.adjoint import staged as adj_staged
    from fovi_lab.kernels import adjoint as N
    from fovi_lab.kernels.adjoint import fused_build as adj_fused_build
    from fovi_lab.kernels.adjoint import fused_plans as adj_fused_plans
    from fovi_lab.kernels import forward as F
    from fovi_lab.kernels import common as C
    what, name, dense = t
    if what == "fwd":
        cfg = F.config_spec(name)
        if dense and cfg.variant == "cached":
            cfg = F.FwdConfig(cfg.name, "gather", cfg.tile_m, cfg.tile_n, cfg.tile_k, 1, cfg.block_dim)
        return F.build_kernel(cfg, dense=dense)
    if what == "nm":
        kind, n = name.split(":")
        return adj_fused_build.build_fused_kernel(kind, n)
    if what == "grad":
        kind, n = name.split(":")
        return adj_staged._build_kernel(kind, n)[0]
    return {"gather_rows": C.gather_rows_kernel, "gather_rows_pair": C.gather_rows_pair_kernel,
            "nms_reduce": F.nms_reduce_kernel, "dw_finish": adj_fused_plans._dw_finish_kernel,
            "seg_finish": N.seg_finish_kernel, "seg_finish_tiled32": lambda: N.seg_finish_tiled_kernel(32),
            "seg_finish_tiled64": lambda: N.seg_finish_tiled_kernel(64)}[name]()


def _have(k):
    from fovi_lab.kernels.common import wp
    mid = k.module.get_module_identifier()
    return os.path.exists(os.path.join(wp.config.kernel_cache_dir, mid, mid + ".sm90.cubin")), mid


def _compile(t):
    t0 = time.perf_counter()
    try:
        from fovi_lab.kernels.common import init_warp, wp
        init_warp()
        k = _kernel(t)
        mid = k.module.get_module_identifier()
        wp.compile_aot_module(k.module, arch=90, module_dir=os.path.join(wp.config.kernel_cache_dir, mid))
        return t, "ok", time.perf_counter() - t0
    except Exception as exc:  # noqa: BLE001 - report per module
        return t, f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}", time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", nargs="*", default=None, help="substring filters on the target names (any)")
    args = ap.parse_args()
    from fovi_lab.kernels.common import init_warp, wp
    init_warp()
    targets = [t for t in _targets() if not args.only or any(o in f"{t[0]}:{t[1]}" for o in args.only)]
    missing = []
    for t in targets:
        ok, mid = _have(_kernel(t))
        if not ok:
            missing.append(t)
    print(f"cache {wp.config.kernel_cache_dir}: {len(targets) - len(missing)}/{len(targets)} have sm90 cubins")
    for t in missing:
        print("  missing", t)
    if args.compile and missing:
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            for i, (t, why, dt) in enumerate(pool.imap_unordered(_compile, missing), 1):
                print(f"  [{i}/{len(missing)}] {t}: {why} in {dt:.0f}s", flush=True)
    return 0 if not missing or args.compile else 1


if __name__ == "__main__":
    sys.exit(main())
