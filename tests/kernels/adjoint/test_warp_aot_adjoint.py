"""Every Warp adjoint kernel compiles ahead of time for sm_90 (one fp16-staged kernel of each version and block
size, and every reduction, also for sm_80 and sm_89), with no GPU.

``wp.compile_aot_module`` drives Warp's bundled NVRTC, so CI proves the generated CUDA of every gi/gw
stage kernel (fp16 and fp32 staging) and every reverse-index reduction still compiles for the
A100/L40/H100-H200 architectures. What it cannot prove is that a config fits a device's shared
memory at launch: that is the NaN canary's job on the device.

The configs of one version are one kernel body with other tile constants, and the fp32-staging variants
differ from their fp16 twins only in the final store: every kernel is compiled for the newest arch of the
list (sm_90), and one fp16-staged kernel per (kind, version, block size) plus every reduction for the others.

Cost, measured on a 2-core CPU box (warp-lang 1.19) with ``enable_mathdx_gemm=False`` (scalar
``tile_matmul``, the fast path used here): one Warp module per (arch, block_dim) holding the kernels,
compiled by a spawned pool (one worker per core, largest job first); ~1 s of CPU per tile kernel and
arch, ~115 s of CPU for 42 kernels on sm_90 plus 23 each on sm_80/sm_89. That is ~60 s of wall time
on an idle 2-core box (CPU / 2; not measured idle: the box was shared, and measured 93-132 s wall
under a load of 3-6 from other jobs). One module per kernel costs ~3x more. The
cuBLASDx (MathDx) build of one tile kernel takes ~60 s per arch on the same box, so it is opt-in:
``FOVI_TEST_AOT_MATHDX=1`` compiles the default gi and gw kernels with MathDx for sm_90.
``FOVI_TEST_AOT_ARCHS=90`` (comma-separated) narrows the arch list.
"""

import multiprocessing as mp
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from fovi_lab.kernels import adjoint as wa

ARCHS = [int(a) for a in os.environ.get("FOVI_TEST_AOT_ARCHS", "80,89,90").split(",") if a.strip()]


def _compile_all(tmp_path, names_by_arch, mathdx, workers):
    """One job per (arch, block_dim group), largest first, over a spawned pool (balanced on 2 cores)."""
    t0 = time.perf_counter()
    jobs = []
    for arch, names in names_by_arch.items():
        groups = {}
        for kind, name in names:
            groups.setdefault(wa.spec_of(kind, name)["block_dim"], []).append((kind, name))
        jobs += [(arch, bd, g) for bd, g in groups.items()]
    jobs.sort(key=lambda j: -len(j[2]))
    per_arch = {arch: {} for arch in names_by_arch}
    if workers == 1:
        for arch, bd, g in jobs:
            per_arch[arch].update(wa.aot_compile_grad_kernels(g, arch, str(tmp_path / f"sm{arch}_b{bd}"),
                                                              mathdx=mathdx))
    else:
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
            futs = [(arch, pool.submit(wa.aot_compile_grad_kernels, g, arch, str(tmp_path / f"sm{arch}_b{bd}"),
                                       mathdx=mathdx)) for arch, bd, g in jobs]
            for arch, f in futs:
                per_arch[arch].update(f.result())
    return per_arch, time.perf_counter() - t0


def _check(per_arch, names_by_arch):
    assert sorted(per_arch) == sorted(names_by_arch)
    for arch, results in per_arch.items():
        assert set(results) == {f"{k}:{n}" for k, n in names_by_arch[arch]}
        for key, r in results.items():
            files = [Path(f) for f in r["files"]]
            assert len(files) == 1 and f".sm{arch}." in files[0].name, (key, arch, files)
            assert files[0].stat().st_size > 0


def test_every_adjoint_kernel_compiles_aot_without_mathdx(tmp_path):
    names = wa.all_grad_kernel_names()
    # fp32-staging variants differ from their fp16 twins only in the final store (no tile_astype):
    # every kernel for the newest arch in the list, the fp16-staged ones and the reductions for the others
    newest = max(ARCHS)
    # the older archs: one fp16-staged kernel of each (kind, version, block size, operand dtype), and every
    # reduction (the
    # configs of one version are one kernel body with other tile constants)
    older, seen = [], set()
    for k, n in names:
        if k == "csr":
            older.append((k, n))
        elif not n.endswith("_f32"):
            spec = wa.spec_of(k, n)
            key = (k, str(spec["version"]), spec["block_dim"], n.endswith("_bf16"))   # bf16: other element types
            if key not in seen:
                seen.add(key)
                older.append((k, n))
    names_by_arch = {arch: (names if arch == newest else older) for arch in ARCHS}
    workers = max(1, min(4, os.cpu_count() or 1))
    per_arch, wall = _compile_all(tmp_path, names_by_arch, False, workers)
    _check(per_arch, names_by_arch)
    times = {arch: sum({id(r): r["seconds"] for r in res.values()}.values()) for arch, res in per_arch.items()}
    print(f"\nAOT (no MathDx): {wall:.1f} s wall with {workers} workers; "
          + ", ".join(f"sm_{a} {len(names_by_arch[a])} kernels {t:.1f} s" for a, t in times.items()))


@pytest.mark.skipif(os.environ.get("FOVI_TEST_AOT_MATHDX") != "1",
                    reason="MathDx AOT takes ~60 s per kernel and arch; set FOVI_TEST_AOT_MATHDX=1")
def test_default_adjoint_kernels_compile_aot_with_mathdx(tmp_path):
    names = [("gi", wa.DEFAULT_GI_CONFIG), ("gw", wa.DEFAULT_GW_CONFIG)]
    per_arch, wall = _compile_all(tmp_path, {90: names}, True, 1)
    _check(per_arch, {90: names})
    print(f"\nAOT (MathDx) {names} sm_90: {wall:.1f} s")
