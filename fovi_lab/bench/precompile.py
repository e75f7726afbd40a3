"""Compile every Warp module a benchmark run needs first, in a pool of spawned processes.

MathDx (cuBLASDx) links take ~50 s each on a GPU and in-process workers do not overlap them, so each
module is built in its own process (``--jobs`` at a time) into Warp's kernel cache.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from typing import List, Optional, Tuple

import torch

from fovi_lab.bench.backward_impls import _dense_config_for, _dense_nm_config


def _sweep_names(table: dict, only: Optional[List[str]]) -> List[str]:
    return [n for n in table if only is None or n in only]

def _warm_job(job) -> Tuple[str, bool, float, str]:
    """One module compile in a spawned process: ('grad', kind, name, device) or ('fwd', name, dense, device)."""
    t0 = time.perf_counter()
    try:
        if job[0] == "nm":
            from fovi_lab.kernels.adjoint import warm_nm_grad_kernel
            ok, why, _ = warm_nm_grad_kernel(job[1], job[2], job[3])
            return f"{job[1]}:{job[2]}", ok, time.perf_counter() - t0, why
        if job[0] == "grad":
            from fovi_lab.kernels.adjoint import warm_grad_kernel
            ok, why, _ = warm_grad_kernel(job[1], job[2], job[3])
            return f"{job[1]}:{job[2]}", ok, time.perf_counter() - t0, why
        from fovi_lab.kernels.warmup import compile_one
        name, dense, _dt, status = compile_one((job[1], job[2], job[3], None, None))
        return f"fwd:{name}{' (dense)' if dense else ''}", status == "ok", time.perf_counter() - t0, status
    except Exception as exc:  # noqa: BLE001
        return str(job), False, time.perf_counter() - t0, f"{type(exc).__name__}: {str(exc)[:200]}"


def precompile(jobs: list, processes: int) -> None:
    """Compile every job's Warp module into the kernel cache with a pool of spawned processes."""
    jobs = list(dict.fromkeys(jobs))
    if not jobs:
        return
    print(f"# precompiling {len(jobs)} Warp modules with {processes} spawned processes", flush=True)
    t0 = time.perf_counter()
    ctx = mp.get_context("spawn")  # fresh interpreters: no inherited CUDA context, truly parallel compiles
    with ctx.Pool(processes=max(1, min(processes, len(jobs)))) as pool:
        for i, (what, ok, dt, why) in enumerate(pool.imap_unordered(_warm_job, jobs), 1):
            print(f"  [{i:>3d}/{len(jobs)}] {what}: {'ok' if ok else 'FAILED ' + why} in {dt:.1f}s", flush=True)
    print(f"# precompile done in {time.perf_counter() - t0:.0f}s", flush=True)


def _jobs_for(metas: dict, batches: List[int], mode: str, args, device: str) -> list:
    """The modules a run of ``bench backward`` / ``train-step`` compiles first. With ``--only`` the dense ceilings
    (timed beside the staged and fused kernels' records) are left to the records that need them."""
    from fovi_lab.kernels import adjoint as wa
    jobs = []
    with_dense = not getattr(args, "only", None)
    names = set()
    for meta in metas.values():
        for b in batches:
            suffix = "_f32" if wa.stage_fp32_default() else ""
            names.add(("gi", wa.select_gi_config(b, meta.nout, device, meta.cin, meta.p64, meta.cout) + suffix))
            names.add(("gw", wa.select_gw_config(meta.cout, meta.cin, b, meta.nout, meta.p64)
                       + ("_f32" if wa.stage_fp32_default() else "")))
    if args.sweep:
        for base in _sweep_names(wa.GRAD_INPUT_CONFIG_SPECS, args.gi_configs):
            names |= {("gi", base), ("gi", base + "_f32")}
        for base in _sweep_names(wa.GRAD_WEIGHT_CONFIG_SPECS, args.gw_configs):
            names |= {("gw", base), ("gw", base + "_f32")}
    for kind, name in sorted(names):
        jobs.append(("grad", kind, name, device))
        spec = wa.spec_of(kind, name)
        dcfg = _dense_config_for(kind, spec)
        if dcfg and with_dense:
            jobs.append(("fwd", dcfg, True, device))
    jobs += [("grad", "csr", n, device) for n in wa.CSR_KERNEL_SPECS]
    from fovi_lab.kernels import adjoint as nm
    from fovi_lab.kernels.adjoint.fused import config_tiles
    for meta in metas.values():
        cfgs = [(k, nm.select_dx_nm_config(b, meta.cin, meta.nin, segments=sg)) for b in batches
                for k in ("dxn", "dxs") for sg in (False, True)]
        cfgs += [(k, nm.select_dw_nm_config(meta.cout, meta.cin, b)) for b in batches for k in ("dwn", "dws")]
        if getattr(args, "sweep_fused", False):
            cfgs += nm.nm_grad_kernel_names()
        for kind, name in sorted(set(cfgs)):
            jobs.append(("nm", kind, name, device))
            t = config_tiles(kind, name)
            dcfg = _dense_nm_config(t[0], t[1], t[2])
            if dcfg and with_dense:
                jobs.append(("fwd", dcfg, True, device))
    if mode == "train-step":
        try:
            from fovi_lab.kernels import forward as F
            from fovi_lab.kernels.adjoint.rule import adjoint_plan
            for meta in metas.values():
                nm_ok = F.analyse_tables(meta.input_linear, meta.weight_linear, meta.cin, meta.nin,
                                          meta.q).nm is not None
                for b in batches:
                    jobs.append(("fwd", F.select_config(b, meta.cout, meta.nout, meta.p64,
                                                                         in_channels=meta.cin, node_major=nm_ok,
                                                                         q=meta.q),
                                 False, device))
                    jobs += [("fwd", c, False, device)                         # the rules' tensor-core adjoints
                             for c in adjoint_plan(meta, b, torch.float16).mma_configs()]
        except Exception as exc:  # noqa: BLE001
            print(f"# forward precompile skipped: {exc}", flush=True)
    return jobs
