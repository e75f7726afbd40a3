"""Fingerprints of every forward preset's output (``--adjoints``: of every adjoint kernel's) on Warp's CPU device, to
show that a refactor left the kernels bit for bit unchanged.

Each preset (registered and experimental; fp16, and bf16 where the family has a bf16 kernel; the cached configs
through ``run_cached``; every dense ceiling kind once) runs one fixed small problem, NaN-prefilled, and its output's
sha256 is kept. Run it before a change and after, and compare:

    python tools/kernel_fingerprints.py --out /tmp/before.json
    ... change ...
    python tools/kernel_fingerprints.py --compare /tmp/before.json      # exit 1 and the names where any differ

``--adjoints`` fingerprints the adjoint kernels instead: every staged config that
:func:`fovi_lab.kernels.adjoint.configs.all_grad_kernel_names` lists (gi / gw with an fp16 stage, an fp32 stage and
bf16 operands; the CSR reductions) and every fused kernel of
:func:`fovi_lab.kernels.adjoint.fused.nm_grad_kernel_names` (dxn / dxs / dwn / dws, fp16 and bf16), each launched
directly (no plan) on one fixed irregular problem sized from its tiles (two or more tiles on every axis, random
index tables with pad rows, an empty reverse list, lists of unequal length), into NaN-prefilled outputs:

    python tools/kernel_fingerprints.py --adjoints --out /tmp/adj_before.json
    python tools/kernel_fingerprints.py --adjoints --compare /tmp/adj_before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch

from fovi_lab.graph.meta import build_meta, synthetic_graph
from fovi_lab.kernels import forward as F
from fovi_lab.kernels.families import PRESETS, family

# (cin, cout, nin, nout, k, v, pads): P64 = 128 (the 128-deep steps divide it), Cout below a 64-wide tile
SHAPE = (5, 37, 60, 21, 25, 30, 17)
BATCH = 19


def _problem(dtype=torch.float16):
    cin, cout, nin, nout, k, v, pads = SHAPE
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=4)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH, cin, nin, generator=g).to(dtype)
    w = (torch.randn(cout, cin * v, generator=g) / 8).to(dtype)
    bias = torch.randn(cout, generator=g).to(dtype)
    return meta, x, w, bias


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def fingerprints(log=print) -> dict:
    out = {}
    probs = {torch.float16: _problem(torch.float16), torch.bfloat16: _problem(torch.bfloat16)}
    dense_done = set()
    for name, preset in sorted(PRESETS.items()):
        if preset.point is None:
            continue
        fam = family(preset.point.family)
        cfg = F.config_spec(name)
        if fam.inference_only:
            meta, x, w, bias = probs[torch.float16]
            from fovi_lab.ops.reference import build_effective_weight
            weff = build_effective_weight(meta, w, cout_multiple=64)
            plan = F.prepare_cached(x, weff, bias, meta.input_linear, cout=meta.cout, config=name)
            plan.out.fill_(float("nan"))
            plan.launch()
            out[name] = _digest(plan.finish())
            continue
        for dtype in fam.dtypes:
            meta, x, w, bias = probs[dtype]
            plan = F.prepare_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=name)
            plan.out.fill_(float("nan"))
            plan.launch()
            out[f"{name}{'' if dtype == torch.float16 else ' bf16'}"] = _digest(plan.finish())
        kind = F.dense_kind(cfg)
        if kind not in dense_done:
            dense_done.add(kind)
            meta, *_ = probs[torch.float16]
            plan = F.make_dense_ceiling(name, BATCH, meta.cout, meta.nout, 128, device="cpu")
            plan.launch()
            out[f"{name} dense"] = _digest(plan.finish())
        log(f"{name}: {out.get(name) or out.get(name + ' bf16')}")
    return out


def _staged_fingerprint(kind: str, name: str) -> str:
    """One staged adjoint kernel (gi, gw or csr) on a problem of two or more tiles per axis, NaN-prefilled."""
    from fovi_lab.kernels.adjoint.configs import _GW_TILE_B, is_bf16_name
    from fovi_lab.kernels.adjoint.staged import _build_kernel
    from fovi_lab.kernels.adjoint.staged_build import _stage_dims
    from fovi_lab.kernels.common import to_warp, wp

    kernel, spec, fp32 = _build_kernel(kind, name)
    g = torch.Generator().manual_seed(11)
    if kind == "csr":
        fp32 = spec["fp32_stage"]
        sdt = torch.float32 if fp32 else torch.float16
        rowptr = torch.tensor([0, 3, 3, 4, 9, 11], dtype=torch.int32)            # an empty list, unequal lengths
        if spec["target"] == "dx":
            k, bc = 3, 7
            rev_row = torch.randint(0, 2 * 64 - 3 * k, (11,), generator=g, dtype=torch.int32)
            da = torch.randn(2 * 64, bc, generator=g).to(sdt)
            out = torch.full((2, 5, bc), float("nan"))
            wp.launch(kernel, dim=(5, 2, bc), inputs=[to_warp(rowptr), to_warp(rev_row), to_warp(da), k],
                      outputs=[to_warp(out)], device="cpu")
        elif spec["target"] == "dx_taps":
            vn, b = 13, 4                                                          # s [B, Cin*vn], 2 channels
            rev_taps = torch.randint(0, vn, (11,), generator=g, dtype=torch.int32)
            s = torch.randn(b, 2 * vn, generator=g)
            out = torch.full((b, 2, 5), float("nan"))
            wp.launch(kernel, dim=(b, 2, 5), inputs=[to_warp(rowptr), to_warp(rev_taps), to_warp(s), vn],
                      outputs=[to_warp(out)], device="cpu")
        else:
            w_col = torch.sort(torch.randint(0, 40, (11,), generator=g, dtype=torch.int32)).values
            dweff = torch.randn(40, 9, generator=g).to(sdt)
            out = torch.full((5, 9), float("nan"))
            wp.launch(kernel, dim=(5, 9), inputs=[to_warp(rowptr), to_warp(w_col), to_warp(dweff), 0, 2147483647, 0],
                      outputs=[to_warp(out)], device="cpu")
        return _digest(out)
    et = torch.bfloat16 if is_bf16_name(name) else torch.float16
    nodes, p64 = 3, 2 * spec["tile_p"]
    rows = 3 * spec["tile_p"] + 5                     # gathered rows of W^T (gi) or x^T (gw); the last one: the pad
    if kind == "gi":                                  # contraction tile (two of them) and the output's width
        inner, wide = spec["tile_o"], 2 * spec["tile_b"]
    else:
        inner, wide = spec.get("tile_kb", _GW_TILE_B), (4 if spec["version"] == 4 else 2) * spec["tile_n"]
    table = torch.randint(0, rows, (nodes, p64), generator=g, dtype=torch.int32)
    table[:, ::7] = rows - 1                                                      # pad entries: the zero row
    operand = (torch.randn(rows, 2 * inner, generator=g) / 4).to(et)
    operand[-1] = 0
    gt = (torch.randn(nodes, 2 * inner, wide, generator=g) / 4).to(et)
    if str(spec["version"]).endswith("i"):                                     # the rows pre-gathered
        operand = operand[table.reshape(-1).long()].contiguous()
    out = torch.full((nodes, p64, wide), float("nan"), dtype=torch.float32 if fp32 else torch.float16)
    wp.launch_tiled(kernel, dim=_stage_dims(spec, kind, nodes, p64, wide),
                    inputs=[to_warp(table), to_warp(operand), to_warp(gt), p64 // spec["tile_p"], 2, to_warp(out)],
                    block_dim=spec["block_dim"], device="cpu")
    return _digest(out)


def _fused_fingerprint(kind: str, name: str, bf16: bool) -> str:
    """One fused adjoint kernel (dxn, dxs, dwn or dws) on irregular lists of a problem of two or more tiles per
    axis (batch and Cin not tile multiples), NaN-prefilled."""
    from fovi_lab.kernels.adjoint import fused_build
    from fovi_lab.kernels.adjoint.fused import segment_table
    from fovi_lab.kernels.common import to_warp, wp

    t1, t2, t3, block_dim = fused_build._spec(kind, name)
    kernel = fused_build.build_fused_kernel(kind, name, bf16)
    et = torch.bfloat16 if bf16 else torch.float16
    g = torch.Generator().manual_seed(13)
    nin, nout, v = 6, 5, 4

    def lists(lengths, hi_a, hi_b):
        """CSR lists of the given lengths: ``(rowptr, a, b)``, entries ``a < hi_a``, ``b < hi_b`` at random."""
        rowptr = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        rowptr[1:] = torch.cumsum(torch.tensor(lengths), 0)
        nnz = int(rowptr[-1])
        return (rowptr, torch.randint(0, hi_a, (nnz,), generator=g, dtype=torch.int32),
                torch.randint(0, hi_b, (nnz,), generator=g, dtype=torch.int32))

    if kind in ("dxn", "dxs"):        # input node m's readers (output node, tap); batch and Cin not tile multiples
        tm, tn, tk = t1, t2, t3
        batch, cin, op = 2 * tm - 3, 2 * tn - 5, 2 * tk
        rowptr, rn, rv = lists([3, 0, 1, 4, 2, 5], nout, v)
        gn = (torch.randn(nout * op, batch, generator=g) / 4).to(et)
        wr = (torch.randn(v * op, 2 * tn, generator=g) / 4).to(et)
        heads = rowptr if kind == "dxn" else segment_table(rowptr, op // tk, 3)[0]   # segments of <= 3 steps
        out = torch.full((heads.numel() - 1, batch, cin), float("nan"))
        wp.launch_tiled(kernel, dim=(heads.numel() - 1, -(-batch // tm), -(-cin // tn)),
                        inputs=[to_warp(t) for t in (gn, wr, heads, rn, rv, out)] + [op // tk, op],
                        block_dim=block_dim, device="cpu")
        return _digest(out)
    to, tc, tkb = t1, t2, t3          # tap v's (output node, input node) pairs; the batch not a tile multiple
    bx, op, cp = 2 * tkb - 3, 2 * to, 2 * tc
    n_bchunks, n_ct = -(-bx // tkb), cp // tc
    vrowptr, vn, vm = lists([2, 0, 4, 3], nout, nin)
    gn = (torch.randn(nout * op, bx, generator=g) / 4).to(et)
    xn = (torch.randn(nin * cp, bx, generator=g) / 4).to(et)
    if kind == "dwn":
        nsplit = 2
        out = torch.full((nsplit, v, op, cp), float("nan"))
        wp.launch_tiled(kernel, dim=(v, nsplit, (op // to) * n_ct),
                        inputs=[to_warp(t) for t in (gn, xn, vrowptr, vn, vm, out)] + [n_bchunks, op, cp, nsplit, n_ct],
                        block_dim=block_dim, device="cpu")
        return _digest(out)
    bounds = segment_table(vrowptr, n_bchunks, 3)[0]
    out = torch.full((bounds.numel() - 1, op, cp), float("nan"))
    wp.launch_tiled(kernel, dim=(bounds.numel() - 1, (op // to) * n_ct),
                    inputs=[to_warp(t) for t in (gn, xn, bounds, vn, vm, out)] + [n_bchunks, op, cp, n_ct],
                    block_dim=block_dim, device="cpu")
    return _digest(out)


def adjoint_fingerprints(log=print) -> dict:
    """The staged and fused adjoint kernels' fingerprints (see the module docstring)."""
    from fovi_lab.kernels.adjoint.configs import all_grad_kernel_names
    from fovi_lab.kernels.adjoint.fused import nm_grad_kernel_names
    from fovi_lab.kernels.common import init_warp

    init_warp()
    out = {}
    for kind, name in all_grad_kernel_names():
        out[f"{kind}:{name}"] = _staged_fingerprint(kind, name)
        log(f"{kind}:{name}: {out[f'{kind}:{name}']}")
    for kind, name in nm_grad_kernel_names():
        for bf16 in (False, True):
            key = f"{kind}:{name}{' bf16' if bf16 else ''}"
            out[key] = _fused_fingerprint(kind, name, bf16)
            log(f"{key}: {out[key]}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the fingerprints (JSON) here")
    ap.add_argument("--compare", help="compare with the fingerprints in this file")
    ap.add_argument("--adjoints", action="store_true", help="the staged and fused adjoint kernels instead")
    ap.add_argument("--verbose", action="store_true", help="print each fingerprint as it is taken")
    args = ap.parse_args(argv)
    log = (lambda line: print(line, flush=True)) if args.verbose else (lambda line: None)
    fp = adjoint_fingerprints(log=log) if args.adjoints else fingerprints(log=log)
    print(f"{len(fp)} outputs fingerprinted")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(fp, f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            old = json.load(f)
        diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
        print(f"{len(old)} before, {len(fp)} now; {len(diff)} differ" + (f": {', '.join(diff)}" if diff else ""))
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
