"""Compile, in parallel processes, exactly the Warp modules the rules pick for some layers and batches (fp16 and
bf16): the forward's config, the fused adjoints (whole lists and segments), the tensor-core adjoints where the
rule takes them and, on the stems, the staged adjoints; with ``--all-mma`` every tensor-core forward config too (what ``tune`` times), with ``--mma-split`` the split ones
(what ``bench adjoints`` times). A benchmark run then
compiles nothing; the full ``warmup`` builds ~180 modules, most of which a given run never launches.

    python tools/gpu/warm_selected.py [--layers ...] [--batches 1 16 64] [--all-mma] [--jobs 16]
"""

from __future__ import annotations

import argparse

import torch

from fovi_lab.bench.precompile import precompile
from fovi_lab.graph.layers import LAYERS, layer_meta


def selected_jobs(layers, batches, device: str, all_mma: bool, mma_split: bool = False) -> list:
    from fovi_lab.kernels import adjoint as A
    from fovi_lab.kernels import forward as F
    from fovi_lab.kernels.adjoint.rule import adjoint_plan
    from fovi_lab.knn_warp import FUSED_MIN_CIN
    fwd, nm, staged = set(), set(), set()
    for name in layers:
        meta = layer_meta(name)
        node_major = F.analyse_tables(meta.input_linear, meta.weight_linear, meta.cin, meta.nin, meta.q).nm is not None
        for b in batches:
            fwd.add(F.select_config(b, meta.cout, meta.nout, meta.p64, in_channels=meta.cin, node_major=node_major,
                                    q=meta.q))
            for seg in (False, True):
                dx = A.select_dx_nm_config(b, meta.cin, meta.nin, segments=seg)
                nm |= {("dxn", dx), ("dxs", dx)}
            fwd.update(adjoint_plan(meta, b, torch.float16).mma_configs())     # the rules' tensor-core adjoints
            dw = A.select_dw_nm_config(meta.cout, meta.cin, b)
            nm |= {("dwn", dw), ("dws", dw)}
            if meta.cin < FUSED_MIN_CIN:
                sfx = "_f32" if A.stage_fp32_default() else ""
                staged.add(("gi", A.select_gi_config(b, meta.nout, device, meta.cin, meta.p64, meta.cout) + sfx))
                staged.add(("gw", A.select_gw_config(meta.cout, meta.cin, b, meta.nout, meta.p64) + sfx))
    if mma_split:
        from fovi_lab.bench.adjoints import split_configs
        fwd |= set(split_configs())
    if all_mma:
        fwd |= {n for n in F.uncached_config_names() if F.config_spec(n).variant in F.MMA_VARIANTS}
    jobs = []
    for n in sorted(fwd):
        mma = F.config_spec(n).variant in F.MMA_VARIANTS
        jobs += [("fwd", n, False, device)] + ([("fwd", n + ":bf16", False, device)] if mma else [])
    for kind, n in sorted(nm):
        jobs += [("fwd", f"nm:{kind}:{n}", False, device), ("fwd", f"nm:{kind}:{n}:bf16", False, device)]
    from fovi_lab.kernels.adjoint.configs import _split_name
    jobs += [("grad", kind, m, device) for kind, n in sorted(staged) for m in (n, _split_name(n)[0] + "_bf16")]
    if staged:
        jobs += [("grad", "csr", n, device) for n in A.CSR_KERNEL_SPECS]
    return jobs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", nargs="+", default=list(LAYERS))
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--all-mma", action="store_true")
    ap.add_argument("--mma-split", action="store_true", help="every split tensor-core config (the adjoints')")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--list", action="store_true", help="print the jobs and exit")
    args = ap.parse_args()
    jobs = selected_jobs(args.layers, args.batches, args.device, args.all_mma, args.mma_split)
    if args.list:
        print("\n".join(map(str, jobs)))
        return 0
    precompile(jobs, args.jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
