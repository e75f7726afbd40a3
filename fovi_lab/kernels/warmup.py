"""Compile every Warp forward kernel (and the fused adjoint kernels ``warp_train`` runs) for this machine
into Warp's kernel cache, in parallel processes.

``python -m fovi_lab warmup [--jobs N] [--no-dense] [--no-grad] [--bf16] [--aot-arch 90]``

``--bf16`` adds the bf16 kernels: those of the tensor-core forward configs and of the fused adjoints.

Every forward config is its own Warp module, and on a GPU each module's MathDx (cuBLASDx) link takes
~50 s. Warp's in-process ``max_workers`` did not help on the H200 machine (11 modules unfinished after
550 s), separate processes did (6 modules in 54 s), so this spawns one process per module, ``--jobs``
at a time (default: the CPU count), each building one kernel and loading it (compile or cache hit)
for the local device. Later runs find every module in the cache (``~/.cache/warp/<version>`` or
``WARP_CACHE_PATH``).

``--aot-arch 90`` compiles the CUDA modules for that architecture *without a GPU* (Warp's bundled
NVRTC) into the same cache layout, so a cache built on a CPU machine can be shipped to a GPU one.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time
from typing import List, Tuple

import fovi_lab.settings as settings
from fovi_lab.kernels import adjoint as NM
from fovi_lab.kernels import forward as F
from fovi_lab.kernels.adjoint import fused_build
from fovi_lab.kernels.common import init_warp, wp
from fovi_lab.kernels.families.registry import family
from fovi_lab.ops.arguments import COUNT, command_main, device_name, usage_error

__all__ = ["main", "add_arguments", "run", "DESCRIPTION", "forward_jobs", "grad_jobs"]


def forward_jobs(dense: bool = True, experimental: bool = False) -> List[Tuple[str, bool]]:
    """(config name, dense ceiling?) for every forward module: uncached, cached, dense ceilings."""
    names = F.uncached_config_names(experimental=experimental)
    jobs = [(n, False) for n in names] + [(n, False) for n in F.cached_config_names()]
    if dense:
        seen = set()
        for n in names:
            key = F.dense_kind(F.config_spec(n))
            if key not in seen:
                seen.add(key)
                jobs.append((n, True))
    return jobs


def grad_jobs(bf16: bool = False) -> List[Tuple[str, bool]]:
    """``("nm:<kind>:<name>", False)`` for every fused node-major adjoint kernel (what ``warp_train`` runs), and
    with ``bf16`` their bf16 forms (``"nm:<kind>:<name>:bf16"``)."""
    names = NM.nm_grad_kernel_names()
    return ([(f"nm:{kind}:{name}", False) for kind, name in names]
            + [(f"nm:{kind}:{name}:bf16", False) for kind, name in names if bf16])


def bf16_forward_jobs(experimental: bool = False) -> List[Tuple[str, bool]]:
    """``("<name>:bf16", False)`` for every tensor-core forward config (the forward's only bf16 kernels)."""
    return [(f"{n}:bf16", False) for n in F.uncached_config_names(experimental=experimental)
            if F.config_spec(n).variant in F.MMA_VARIANTS]


def _compile(kernel, device, aot_arch, block_dim) -> None:
    """Compile ``kernel``'s module for ``aot_arch`` into Warp's cache layout, or load it on ``device``."""
    if aot_arch:
        module = kernel.module
        module_dir = os.path.join(wp.config.kernel_cache_dir, module.get_module_identifier())
        wp.compile_aot_module(module, arch=int(aot_arch), module_dir=module_dir)
    else:
        kernel.module.load(wp.get_device(device), block_dim)


def compile_one(job) -> Tuple[str, bool, float, str]:
    """Compile one job ``(name, dense, device, aot_arch, mathdx)`` (a name of :func:`forward_jobs`,
    :func:`bf16_forward_jobs` or :func:`grad_jobs`; ``mathdx`` None: the setting's default); returns
    ``(name, dense, seconds, "ok" or the error in one line)``."""
    name, dense, device, aot_arch, mathdx = job
    t0 = time.perf_counter()
    try:
        pinned = {} if mathdx is None else {"FOVI_WARP_MATHDX": "1" if mathdx else "0"}
        with settings.override(**pinned):
            init_warp()
            if name.startswith("nm:"):
                _, kind, cname, *dt = name.split(":")
                bf16 = dt == ["bf16"]
                if str(device).startswith("cuda") and not aot_arch:
                    NM.get_nm_grad_kernel(kind, cname, device, bf16)  # compile + canary
                else:
                    _compile(fused_build.build_fused_kernel(kind, cname, bf16), device, aot_arch,
                             NM.config_tiles(kind, cname)[3])
                return name, dense, time.perf_counter() - t0, "ok"
            cname, *dt = name.split(":")
            cfg = F.config_spec(cname)
            if dense and family(cfg.variant).inference_only:  # the cached kernel's ceiling: the gather tiles' loop
                cfg = F.FwdConfig(cfg.name, "gather", cfg.tile_m, cfg.tile_n, cfg.tile_k, 1, cfg.block_dim)
            _compile(F.build_kernel(cfg, dense=dense, bf16=dt == ["bf16"]), device, aot_arch, cfg.block_dim)
        return name, dense, time.perf_counter() - t0, "ok"
    except Exception as exc:  # noqa: BLE001 - report per module, keep going
        return name, dense, time.perf_counter() - t0, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"


#: The help text of ``python -m fovi_lab warmup``.
DESCRIPTION = """\
Compile every Warp kernel config (the forward configs, and the fused adjoint kernels warp_train runs) for this
machine into Warp's kernel cache, in parallel processes.

On a GPU each tile-GEMM module's MathDx link takes about 50 s, so this spawns one process per module, --jobs at a
time; later runs find every module in the cache (~/.cache/warp/<version>, or WARP_CACHE_PATH). --aot-arch 90
compiles the CUDA modules for that architecture without a GPU (Warp's bundled NVRTC) into the same cache layout,
so a cache built on a CPU machine can be shipped to a GPU one.

  python -m fovi_lab warmup
  python -m fovi_lab warmup --aot-arch 90 --bf16
"""


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab warmup``, each checked as it is parsed."""
    parser.add_argument("--jobs", type=COUNT, default=os.cpu_count() or 1, help="compile processes at a time (default: the CPU count)")
    parser.add_argument("--no-dense", action="store_true", help="skip the dense-ceiling kernels (benchmark only)")
    parser.add_argument("--device", type=device_name, default=None,
                        help="cpu or cuda[:i] (default: cuda:0 when torch sees a GPU, else cpu)")
    parser.add_argument("--aot-arch", type=COUNT, default=None, metavar="SM",
                        help="compile the CUDA modules for this architecture (e.g. 90) without a GPU (default: "
                             "load them on --device)")
    parser.add_argument("--only", nargs="+", default=None, metavar="CONFIG",
                        help="config names to compile (default: all)")
    parser.add_argument("--mathdx", choices=["on", "off"], default=None,
                        help="force the MathDx GEMM on or off (default: Warp's choice)")
    parser.add_argument("--experimental", action="store_true", help="also the experimental (never selected) configs")
    parser.add_argument("--no-grad", action="store_true", help="skip the fused adjoint kernels (forward only)")
    parser.add_argument("--bf16", action="store_true", help="also the bf16 kernels (tensor-core forward, fused adjoints)")


def _nvrtc_archs() -> list:
    """The architectures (``90`` for sm_90) Warp's bundled NVRTC compiles for (``wp.get_cuda_supported_archs``),
    Warp initialised quietly (:func:`fovi_lab.kernels.common.init_warp`)."""
    init_warp()
    return sorted(wp.get_cuda_supported_archs())


def run(args) -> int:
    """Compile as ``args`` say (the options of :func:`add_arguments`); returns 1 when a module failed, else 0."""
    if args.aot_arch:
        archs = _nvrtc_archs()
        if args.aot_arch not in archs:
            usage_error("python -m fovi_lab warmup", f"--aot-arch: expected an architecture Warp's NVRTC compiles "
                        f"for ({', '.join(map(str, archs))}), got {args.aot_arch}")
    device = args.device
    if device is None and not args.aot_arch:
        import torch
        device = "cuda:0" if torch.cuda.is_available() else "cpu"
    mathdx = None if args.mathdx is None else args.mathdx == "on"
    jobs = forward_jobs(dense=not args.no_dense, experimental=args.experimental)
    if args.bf16:
        jobs += bf16_forward_jobs(experimental=args.experimental)
    if not args.no_grad:
        jobs += grad_jobs(bf16=args.bf16)
    def names(job: str) -> set:           # "--only m16n32 dxn_m16n16k64" selects both dtypes of each
        return {job, [p for p in job.split(":") if p not in ("nm", "bf16")][-1]}
    if args.only is not None:
        known = set().union(*(names(j[0]) for j in jobs))
        unknown = [n for n in args.only if n not in known]
        if unknown:
            usage_error("python -m fovi_lab warmup", f"--only: no module of this warmup is named "
                        f"{', '.join(map(repr, unknown))} (python -m fovi_lab configs lists the forward configs; "
                        f"--experimental, --bf16 and --no-grad change which modules are here)")
        jobs = [j for j in jobs if names(j[0]) & set(args.only)]
    where = f"sm_{args.aot_arch} (ahead of time)" if args.aot_arch else device
    print(f"warmup: {len(jobs)} Warp modules (forward + fused adjoint) for {where}, {args.jobs} processes", flush=True)
    t0 = time.perf_counter()
    # spawn: fresh interpreters (no inherited CUDA context), true parallel compiles. For the long CUDA
    # compiles, one module per process (maxtasksperchild=1): Warp reads kernel source from disk at
    # codegen, so a long-lived worker compiles garbled source if the file is edited mid-run (seen);
    # CPU modules compile in ~2 s, where re-importing torch per module would double the time.
    long_compiles = bool(args.aot_arch) or not str(device).startswith("cpu")
    ctx = mp.get_context("spawn")
    failed = 0
    with ctx.Pool(processes=max(1, min(args.jobs, len(jobs))),
                  maxtasksperchild=1 if long_compiles else None) as pool:
        work = [(n, d, device, args.aot_arch, mathdx) for n, d in jobs]
        for i, (name, dense, dt, status) in enumerate(pool.imap_unordered(compile_one, work), 1):
            bar = "#" * (30 * i // len(jobs))
            failed += status != "ok"
            print(f"[{bar:<30s}] {i:>3d}/{len(jobs)} {name}{' (dense ceiling)' if dense else ''}: "
                  f"{status} in {dt:.1f}s", flush=True)
    print(f"warmup done in {time.perf_counter() - t0:.0f}s, {failed} failed", flush=True)
    return 1 if failed else 0


main = command_main("python -m fovi_lab warmup", DESCRIPTION, add_arguments, run)


if __name__ == "__main__":
    sys.exit(main())
