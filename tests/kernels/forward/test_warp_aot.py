"""The forward kernels compile ahead of time without a GPU: every config for sm_90, each family for sm_80 and sm_89.

Warp's bundled NVRTC compiles CUDA modules on a CPU-only machine (``wp.compile_aot_module``). This
proves the kernels' CUDA code stays valid for each architecture; it does not prove a launch fits a
CTA's resources (the runtime NaN canary checks that per device).

Every config is built for sm_90 (the GPU this project runs on); for sm_80 and sm_89, the first config of each
family and block size, and for the tensor-core ``mma`` kernels (inline PTX ``mma.sync``, sm_80+) one config
per distinct load code (``_MMA_REPRESENTATIVES``, each also as its bf16 kernel): ~3-8 s of NVRTC each at -O1.

CI time (2 cores, measured): the scalar-GEMM path (``enable_mathdx_gemm=False``) takes ~2.5 s per kernel
at -O3, so the forward kernels are grouped into one module per block_dim (one NVRTC run each), built
at -O1 (~3x faster; validity is what is tested) for the three architectures, in parallel processes;
one config is also built with MathDx (cuBLASDx LTO, ~50 s), the path the GPU actually runs.
"""

from __future__ import annotations

import time

from fovi_lab.kernels import forward as F
from fovi_lab.kernels import common as wc
from fovi_lab.kernels.common import init_warp, wp

ARCHS = (80, 89, 90)


# The mma kernels for sm_80 / sm_89: one config per distinct load code (W as uint2 / uint4 words, W in place,
# x^T as u32 / uint2 words, the split store, loops of 4 k-steps with x in place and x^T, the staged store with x
# in place and x^T). Their CUDA differs from the other block shapes only in
# those template constants; sm_90 builds every registered mma config.
_MMA_REPRESENTATIVES = ("mma_o64b16", "mma_o96b16", "mmas_o32b8", "mmasw_o32b8", "mmat_o64b32", "mmat_o96b32",
                        "mma_o32b8k64b64", "mmat_o64b16k64b32", "mmao_o96b16", "mmato_o64b16k64")


def _forward_kernels_by_block_dim(module_prefix: str, every_config: bool = True):
    """Build the forward kernels (uncached, cached, dense ceilings) into shared modules by block_dim.

    ``every_config=False``: the first config of each (family, block_dim) and :data:`_MMA_REPRESENTATIVES` of
    the mma families. A family's configs differ in template constants only (tile sizes), so one of each
    shows its code is valid for an architecture; sm_90, which the GPU runs, builds every config.
    """
    init_warp()
    groups = {}
    seen = set()
    families = set()
    try:
        for name in F.uncached_config_names() + F.cached_config_names():
            cfg = F.config_spec(name)
            if cfg.variant in F.PIPE_VARIANTS:
                # their own modules (tests/kernels/forward/test_warp_mma_pipe.py): ptxas counts every static
                # __shared__ array of a module against each of its kernels, and the staged mma stores' tiles would
                # push the stages past 48 KiB
                continue
            if not every_config:
                if cfg.variant in F.MMA_VARIANTS:
                    if name not in _MMA_REPRESENTATIVES:
                        continue
                elif (cfg.variant, cfg.block_dim) in families:
                    continue
                families.add((cfg.variant, cfg.block_dim))
            mod = f"{module_prefix}_b{cfg.block_dim}"
            wc.SHARED_KERNEL_MODULE = mod
            groups.setdefault(cfg.block_dim, mod)
            if cfg.variant == "gather":
                F.make_gather_kernel(cfg.tile_m, cfg.tile_n, cfg.r, cfg.block_dim, mathdx=False)
            elif cfg.variant == "nm":
                F.make_nm_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim, mathdx=False)
            elif cfg.variant == "nmp":
                F.make_nmp_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, mathdx=False)
            elif cfg.variant == "gp":
                F.make_gp_kernel(cfg.tile_m, cfg.tile_n, cfg.block_dim, mathdx=False)
            elif cfg.variant == "nms":
                F.make_nms_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, mathdx=False)
            elif cfg.variant in ("i2c", "i2cg"):
                F.make_i2c_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, cfg.variant == "i2cg",
                                   mathdx=False)
            elif cfg.variant == "cached":
                F.make_cached_kernel(cfg.tile_m, cfg.tile_n, cfg.block_dim, mathdx=False)
            elif cfg.variant in ("simt", "simtv"):
                make = F.make_simt_kernel if cfg.variant == "simt" else F.make_simtv_kernel
                make(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim)
                make(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, dense=True)
                continue
            elif cfg.variant == "simtp":                     # its dense ceiling is the simt one
                F.make_simt_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, prefetch=True)
                continue
            elif cfg.variant in ("simts", "simtsw"):          # its dense ceiling is the simt one, too
                F.make_simts_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, wvec=cfg.variant == "simtsw")
                continue
            elif cfg.variant == "simtw":
                F.make_simt_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, wvec=True)
                continue
            elif cfg.variant in F.MMA_VARIANTS:              # inline PTX mma.sync (sm_80+)
                from fovi_lab.kernels.forward.mma import make_mma_kernel
                mt, nt = cfg.tile_n // 16, cfg.tile_m // 8
                split, w_native, x_t = F.mma_flags(cfg.variant)
                ku = cfg.tile_k // 16
                make_mma_kernel(mt, nt, cfg.block_dim, split=split, w_native=w_native, x_t=x_t, k_steps=ku,
                                stage=F.mma_staged(cfg.variant))
                if name in _MMA_REPRESENTATIVES:              # the bf16 kernels: same code but the MMA's type
                    make_mma_kernel(mt, nt, cfg.block_dim, split=split, w_native=w_native, x_t=x_t, k_steps=ku,
                                    stage=F.mma_staged(cfg.variant), bf16=True)
                if not split:                                 # the split ones share their unsplit ceiling
                    make_mma_kernel(mt, nt, cfg.block_dim, dense=True, w_native=w_native, x_t=x_t, k_steps=ku)
                continue
            else:
                raise AssertionError(f"test_warp_aot does not know the {cfg.variant!r} family ({name})")
            pipelined = cfg.variant in ("nmp", "gp")
            key = (pipelined, cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim)
            if cfg.variant != "cached" and key not in seen:
                seen.add(key)
                if pipelined:
                    F.make_densep_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, mathdx=False)
                else:
                    F.make_dense_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim, mathdx=False)
    finally:
        wc.SHARED_KERNEL_MODULE = None
    mods = {}
    for bd, name in groups.items():
        m = wp.get_module(name)
        m.options.update({"block_dim": bd, "enable_backward": False, "enable_mathdx_gemm": False,
                          "fast_math": True})
        mods[bd] = m
    return mods


def _aot_job(job):
    """One NVRTC run in a worker process: (block_dim, arch, mathdx, out_dir) -> (paths, seconds)."""
    bd, arch, mathdx, out_dir = job
    t0 = time.perf_counter()
    if mathdx:
        init_warp()
        kernel = F.make_gather_kernel(16, 32, 1, 64, mathdx=True, name="fovi_fwd_aot_mathdx_m16n32")
        module = kernel.module
    else:
        module = _forward_kernels_by_block_dim(f"fovi_fwd_aot_sm{arch}", every_config=arch == 90)[bd]
        # validity, not speed, is tested: -O1 compiles ~3x faster than the default -O3
        module.options["optimization_level"] = 1
    paths = wp.compile_aot_module(module, arch=arch, module_dir=out_dir)
    return [str(p) for p in paths], time.perf_counter() - t0


def test_forward_kernels_compile_aot_for_sm80_sm89_sm90(tmp_path):
    """Every forward kernel (every config, cached kernels, dense ceilings) for sm_80/89/90 without
    MathDx, plus one MathDx (cuBLASDx) build for sm_90, in parallel worker processes."""
    import multiprocessing as mp
    import os

    # every block size a registered config uses (one shared module each), the largest first
    block_dims = sorted({F.config_spec(n).block_dim for n in F.uncached_config_names() + F.cached_config_names()},
                        reverse=True)
    jobs = [(64, 90, True, str(tmp_path / "mathdx"))]            # the longest first
    jobs += [(bd, arch, False, str(tmp_path / f"b{bd}_sm{arch}")) for bd in block_dims for arch in ARCHS]
    t0 = time.perf_counter()
    with mp.get_context("spawn").Pool(processes=max(1, min(4, os.cpu_count() or 1))) as pool:
        results = pool.map(_aot_job, jobs, chunksize=1)
    for (bd, arch, mathdx, _), (paths, dt) in zip(jobs, results):
        assert paths, (bd, arch, mathdx)
        for p in paths:
            assert os.path.getsize(p) > 0 and f"sm{arch}" in os.path.basename(p), p
    n = len(F.uncached_config_names()) + len(F.cached_config_names())
    print(f"\nAOT: {n} configs + dense ceilings, {len(block_dims)} block_dim modules x sm_80/89/90 (no MathDx, -O1) and one "
          f"MathDx sm_90 build, {time.perf_counter() - t0:.0f}s wall: "
          + ", ".join(f"{'mathdx' if m else f'b{bd}'}/sm{a} {dt:.0f}s" for (bd, a, m, _), (_, dt) in zip(jobs, results)))
