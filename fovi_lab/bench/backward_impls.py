"""What the backward / train-step benchmark runs and records per implementation: the PyTorch forwards
it differentiates, the staged pipelines' stage-by-stage records, the fused kernels' records, the dense
tile-GEMM ceilings each is compared with, and where fovi's own backends are timed beside ours.
"""

from __future__ import annotations

import gc
from typing import Callable, Dict, List, Optional, Tuple

import torch

from fovi_lab.bench.common import Roofline, _sync, compact_flops, gbps, tflops


_MIB = 1 << 20


def _frame(layer: str, rf):
    """The reference frame a record of ``layer`` was measured on (None for synthetic shapes)."""
    from fovi_lab.graph.layers import resolve_layer
    try:
        return resolve_layer(layer, rf)[1]
    except KeyError:
        return rf

def _peak_mib(fn: Callable[[], object], device: torch.device) -> Optional[float]:
    """Extra memory at the peak of one ``fn()`` call (outputs included, inputs excluded), MiB."""
    if device.type != "cuda":
        return None
    gc.collect()                     # no garbage from earlier calls may be freed inside the measured call
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    out = fn()
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del out
    return peak / _MIB


def _xpad(x: torch.Tensor) -> torch.Tensor:
    b = x.shape[0]
    return torch.cat([x.reshape(b, -1), x.new_zeros(b, 1)], dim=1)


def torch_forwards(meta) -> Dict[str, Callable]:
    """Differentiable PyTorch forwards ``fn(x, w) -> y [B, Cout, Nout]`` (the autograd baselines)."""
    from fovi_lab.ops.reference import binned_forward
    il, wl = meta.input_linear_flat, meta.weight_linear_flat
    nout, p64, cout = meta.nout, meta.p64, meta.cout

    def gather_bmm(x, w):
        b = x.shape[0]
        a = _xpad(x).index_select(1, il).view(b, nout, p64).transpose(0, 1)            # [Nout, B, P64]
        wn = w.t().index_select(0, wl).view(nout, p64, cout)                           # [Nout, P64, Cout]
        return torch.bmm(a, wn).permute(1, 2, 0)

    def tgather_bmm(x, w):
        b = x.shape[0]
        at = _xpad(x).t().index_select(0, il).view(nout, p64, b)                       # rows: batch runs
        wn = w.t().index_select(0, wl).view(nout, p64, cout)
        return torch.bmm(at.transpose(1, 2), wn).permute(1, 2, 0)

    def binned_mm(x, w):
        return binned_forward(meta, x, w)

    return {"gather_bmm": gather_bmm, "tgather_bmm": tgather_bmm, "binned_mm": binned_mm}


def torch_steps(meta) -> Dict[str, Callable]:
    """Hand-written PyTorch train steps ``fn(x, w, g) -> (y, dx, dW)`` (explicit adjoints, no autograd): the
    strongest PyTorch forms we know for this operator, timed beside the backends.

    ``explicit_tgather``: every operand in the batch-contiguous ``x^T`` layout, whose gathered rows are runs of
    ``B`` elements: ``A_n^T = xpad^T[il[n]]`` ``[Nout, P64, B]``, ``W_n = W^T[wl[n]]`` ``[Nout, P64, Cout]``;
    ``y_n = A_n W_n`` (one ``bmm``); ``dW_n = A_n^T g_n`` and ``dA_n = W_n g_n^T`` (two ``bmm``), each scattered
    back with one fp32 ``index_add_`` into ``W^T`` rows and ``xpad^T`` rows (pad entries land in the pad row
    and in rows of zero contributions). On CUDA ``index_add_`` uses atomics: the last bits vary run to run."""
    il, wl = meta.input_linear_flat, meta.weight_linear_flat
    nout, p64, cout, cin, nin, q = meta.nout, meta.p64, meta.cout, meta.cin, meta.nin, meta.q

    def explicit_tgather(x, w, g):
        b = x.shape[0]
        at = _xpad(x).t().index_select(0, il).view(nout, p64, b)                       # [Nout, P64, B]
        wn = w.t().index_select(0, wl).view(nout, p64, cout)                           # [Nout, P64, Cout]
        y = torch.bmm(at.transpose(1, 2), wn).permute(1, 2, 0)                         # [B, Cout, Nout]
        gn = g.permute(2, 0, 1)                                                        # [Nout, B, Cout]
        dwn = torch.bmm(at, gn).view(-1, cout).float()                                 # [Nout*P64, Cout]
        dwt = torch.zeros(q, cout, dtype=torch.float32, device=x.device).index_add_(0, wl, dwn)
        dan = torch.bmm(wn, gn.transpose(1, 2)).view(-1, b).float()                    # [Nout*P64, B]
        dxt = torch.zeros(cin * nin + 1, b, dtype=torch.float32, device=x.device).index_add_(0, il, dan)
        return y, dxt[:-1].t().reshape(b, cin, nin), dwt.t()

    return {"explicit_tgather": explicit_tgather}


def backward_bytes(meta, b: int) -> float:
    """Fewest bytes both adjoints must move: g, W, x (fp16) in; dx, dW (fp32) out; both tables."""
    return float(2 * (b * meta.cout * meta.nout + meta.cout * meta.q + b * meta.cin * meta.nin)
                 + 4 * (b * meta.cin * meta.nin + meta.cout * meta.q) + 2 * 4 * meta.nout * meta.p64)


def _dense_config_for(kind: str, spec: dict) -> Optional[str]:
    """The forward config whose dense ceiling has this stage's tile shape (M = p tile, N = b or o tile)."""
    try:
        from fovi_lab.kernels import forward as F
        from fovi_lab.kernels.families.registry import adjoint_family
    except Exception:  # pragma: no cover - forward module missing
        return None
    fam = adjoint_family(kind)
    tm, tn = spec["tile_p"], spec[fam.spec_wide]
    tk = spec.get("tile_o", 64)                 # dx's Cout step; dW's batch chunks run on 64-deep tiles
    pipelined = fam.from_spec(spec)["prefetch"]
    best = None
    for name in F.uncached_config_names():
        c = F.config_spec(name)
        if _variant_is(c, "tile_gemm", prefetch=pipelined) and (c.tile_m, c.tile_n, c.tile_k, c.r) == (tm, tn, tk, 1):
            if c.block_dim == spec["block_dim"]:
                return name
            best = best or name
    return best


class _DenseCache:
    def __init__(self):
        self.ms: Dict[tuple, Optional[float]] = {}

    def get(self, config: Optional[str], m: int, n: int, nodes: int, k: int, device, tm) -> Optional[float]:
        if config is None:
            return None
        key = (config, m, n, nodes, k)
        if key not in self.ms:
            try:
                from fovi_lab.kernels import forward as F
                plan = F.make_dense_ceiling(config, m, n, nodes, k, device)
                self.ms[key] = tm(plan.launch).ms
                del plan
            except Exception as exc:  # noqa: BLE001 - report, keep measuring
                print(f"  dense ceiling {config} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                self.ms[key] = None
        return self.ms[key]

def _warp_pipeline_records(meta, x, w, g, gi_cfg: Optional[str], gw_cfg: Optional[str], stage_fp32,
                           finish: Optional[str], device, tm, dense: _DenseCache, roof: Roofline,
                           ref: Tuple[torch.Tensor, torch.Tensor], do_gi: bool = True, do_gw: bool = True) -> dict:
    """Time one Warp (gi config, gw config) pair: ops, kernels alone, dense ceilings, errors, determinism."""
    from fovi_lab.kernels import adjoint as wa
    b = x.shape[0]
    gemm = compact_flops(b, meta.p64, meta.cout, meta.nout)
    out: dict = {}
    if do_gi:
        plan, why = wa.plan_grad_input(meta, g, w, gi_cfg, stage_fp32=stage_fp32)
        if plan is None:
            raise RuntimeError(why)
        out["gi_config"] = plan.stage_k.name
        out["gi_chunks"] = len(plan.chunks)
        out["gi_stage_mib"] = plan.stage_bytes / _MIB
        dx = wa.grad_input(meta, g, w, gi_cfg, stage_fp32=stage_fp32)
        dx2 = wa.grad_input(meta, g, w, gi_cfg, stage_fp32=stage_fp32)
        out["deterministic_dx"] = bool(torch.equal(dx, dx2))
        out["err_dx"] = float((dx - ref[0]).abs().max()) / max(1e-12, float(ref[0].abs().max()))
        del dx, dx2
        out["dx_ms"] = tm(lambda: wa.grad_input(meta, g, w, gi_cfg, stage_fp32=stage_fp32)).ms
        out["dx_peak_mib"] = _peak_mib(lambda: wa.grad_input(meta, g, w, gi_cfg, stage_fp32=stage_fp32), device)
        plan.prepare(0)
        st = tm(plan.stage).ms
        rd = tm(plan.reduce).ms
        b0, b1, bcp = plan.chunks[0]
        flops0 = 2.0 * meta.nout * meta.p64 * plan.cpad * bcp
        out.update(gi_stage_ms=st, gi_stage_tflops=tflops(flops0, st), dx_reduce_ms=rd)
        itemsize = plan.stage_buf.element_size()
        rbytes = meta.nnz * meta.cin * (b1 - b0) * itemsize + meta.cin * meta.nin * (b1 - b0) * 4
        out.update(dx_reduce_gbps=gbps(rbytes, rd), dx_reduce_hbm_frac=roof.hbm_fraction(gbps(rbytes, rd)))
        dcfg = _dense_config_for("gi", plan.stage_k.spec)
        d = dense.get(dcfg, meta.p64, bcp, meta.nout, plan.cpad, device, tm)
        out.update(gi_dense_config=dcfg, gi_dense_ms=d, gi_frac_dense=(d / st) if d else None,
                   gi_dense_tflops=tflops(flops0, d) if d else None)
        del plan
        out["dx_tflops"] = tflops(gemm, out["dx_ms"])
    if do_gw:
        plan, why = wa.plan_grad_weight(meta, g, x, gw_cfg, stage_fp32=stage_fp32, finish=finish)
        if plan is None:
            raise RuntimeError(why)
        out["gw_config"] = plan.stage_k.name
        out["gw_finish"] = plan.finish_mode
        out["gw_chunks"] = len(plan.chunks)
        out["gw_stage_mib"] = plan.stage_bytes / _MIB
        dw = wa.grad_weight(meta, g, x, gw_cfg, stage_fp32=stage_fp32, finish=finish)
        dw2 = wa.grad_weight(meta, g, x, gw_cfg, stage_fp32=stage_fp32, finish=finish)
        out["deterministic_dw"] = bool(torch.equal(dw, dw2))
        out["err_dw"] = float((dw - ref[1]).abs().max()) / max(1e-12, float(ref[1].abs().max()))
        del dw, dw2
        out["dw_ms"] = tm(lambda: wa.grad_weight(meta, g, x, gw_cfg, stage_fp32=stage_fp32, finish=finish)).ms
        out["dw_peak_mib"] = _peak_mib(lambda: wa.grad_weight(meta, g, x, gw_cfg, stage_fp32=stage_fp32,
                                                              finish=finish), device)
        plan.prepare(0)
        st = tm(plan.stage).ms
        rd = tm(plan.reduce).ms
        n0, n1 = plan.chunks[0]
        flops0 = 2.0 * (n1 - n0) * meta.p64 * plan.cpad * plan.bpad
        out.update(gw_stage_ms=st, gw_stage_tflops=tflops(flops0, st), dw_reduce_ms=rd)
        if plan.finish_mode == "csr":
            itemsize = plan.stage_buf.element_size()
            nnz_w = int(wa.weight_row_csr(meta)[1].numel()) * (n1 - n0) / meta.nout
            rbytes = nnz_w * meta.cout * itemsize + meta.q * meta.cout * 4
            out.update(dw_reduce_gbps=gbps(rbytes, rd), dw_reduce_hbm_frac=roof.hbm_fraction(gbps(rbytes, rd)))
        dcfg = _dense_config_for("gw", plan.stage_k.spec)
        d = dense.get(dcfg, meta.p64, plan.cpad, n1 - n0, plan.bpad, device, tm)
        out.update(gw_dense_config=dcfg, gw_dense_ms=d, gw_frac_dense=(d / st) if d else None,
                   gw_dense_tflops=tflops(flops0, d) if d else None)
        del plan
        out["dw_tflops"] = tflops(gemm, out["dw_ms"])
    return out


def _variant_is(cfg, key: str, **values) -> bool:
    """Whether the configs-table entry ``cfg`` belongs to family ``key`` with these parameter values."""
    from fovi_lab.kernels.families.registry import family
    fam = family(cfg.variant)
    return fam.key == key and all(fam.variant_values(cfg).get(k) == v for k, v in values.items())


def _dense_nm_config(tm: int, tn: int, tk: int) -> Optional[str]:
    """A registered forward config with these tiles (its dense ceiling is the fused kernel's); the
    experimental table holds the tiles only a fused adjoint uses (16x16 dx, 16/32-deep dW chunks)."""
    from fovi_lab.kernels import forward as F
    for name in F.uncached_config_names(experimental=True):
        c = F.config_spec(name)
        if _variant_is(c, "node_major", split=False, prefetch=False) and (c.tile_m, c.tile_n, c.tile_k, c.r) == (tm, tn, tk, 1):
            return name
    return None


def fused_ceiling(dense: "_DenseCache", tiles, m: int, n: int, ctas: int, steps: int, useful: float, t_ms: float,
                  device, tm) -> dict:
    """Warp's dense tile-GEMM ceiling of one fused launch: the same tiles, the same grid (``ctas`` CTAs
    per output tile), the launch's total ``steps`` of tile GEMMs spread evenly (``round(steps/ctas)``
    per CTA), dense operands. The fraction compares TFLOP/s (useful FLOPs of the fused kernel over the
    dense GEMM's own FLOPs), so the rounding of the per-CTA depth does not bias it."""
    tm_, tn_, tk_ = tiles[:3]
    cfg = _dense_nm_config(tm_, tn_, tk_)
    per = max(1, int(round(steps / max(1, ctas))))
    d = dense.get(cfg, m, n, max(1, ctas), per * tk_, device, tm)
    if not d:
        return dict(dense_config=cfg, dense_ms=None, frac_dense=None)
    dflops = 2.0 * m * n * max(1, ctas) * per * tk_
    return dict(dense_config=cfg, dense_ms=d, dense_tflops=tflops(dflops, d),
                frac_dense=tflops(useful, t_ms) / tflops(dflops, d))


def _dx_plan_steps(meta, px) -> Tuple[int, int]:
    """(CTAs per output tile, total tile GEMMs) of a fused dx launch."""
    n_oc = px.op // px.k.tiles[2]
    return px.dims[0], meta.nnz * n_oc


def _dw_plan_steps(meta, pw, b: int) -> Tuple[int, int]:
    """(CTAs per output tile, total tile GEMMs) of a fused dW launch."""
    from fovi_lab.graph.meta import pad_to
    n_bc = -(-pad_to(b, 8) // pw.k.tiles[2])
    ctas = pw.dims[0] if pw.seg_steps else pw.dims[0] * pw.dims[1]
    return ctas, meta.nnz * n_bc


def _fused_records(meta, x, w, g, device, tm, dense: "_DenseCache", ref) -> dict:
    """Kernels alone of the fused node-major adjoints (the default plans): ms, useful TFLOP/s, and the
    fraction of Warp's dense ceiling for the same tiles and grid (:func:`fused_ceiling`). dx's time
    includes its segment finish when it has one; dW's finish is timed apart (``dw_finish_ms``)."""
    from fovi_lab.kernels import adjoint as nm
    b = x.shape[0]
    useful = 2.0 * b * meta.cout * meta.cin * meta.nnz               # non-pad (n, k) pairs only
    out: dict = {}
    px = nm.plan_grad_input_nm(meta, g, w)
    pw = nm.plan_grad_weight_nm(meta, g, x)
    if px is not None:
        t = tm(px.launch).ms
        out.update(dx_config=px.k.name, dx_kind=px.k.kind, dx_seg_steps=px.seg_steps, dxn_kernel_ms=t,
                   dxn_tflops=tflops(useful, t))
        ctas, steps = _dx_plan_steps(meta, px)
        c = fused_ceiling(dense, px.k.tiles, b, meta.cin, ctas, steps, useful, t, device, tm)
        out.update(dx_dense_config=c["dense_config"], dx_dense_ms=c["dense_ms"], dx_frac_dense=c["frac_dense"],
                   dx_ctas=ctas)
        del px
    if pw is not None:
        t = tm(pw.launch).ms
        pw.launch()
        tf = tm(pw.finish).ms
        out.update(dw_config=pw.k.name, dw_kind=pw.k.kind, dw_seg_steps=pw.seg_steps, dw_nsplit=pw.nsplit,
                   dwn_kernel_ms=t, dwn_tflops=tflops(useful, t), dw_finish_ms=tf,
                   dw_partial_mib=pw.out.numel() * 4 / _MIB)
        ctas, steps = _dw_plan_steps(meta, pw, b)
        c = fused_ceiling(dense, pw.k.tiles, meta.cout, meta.cin, ctas, steps, useful, t, device, tm)
        out.update(dw_dense_config=c["dense_config"], dw_dense_ms=c["dense_ms"], dw_frac_dense=c["frac_dense"],
                   dw_ctas=ctas)
        del pw
    return out


#: How fovi's timed steps get their weight (records of fovi's backends carry it): set up once, then its version
#: bumped per step as for ours (records without it copied the weight in and cast the module in every timed step).
FOVIS_WEIGHT = "set once, version bumped per step"


def _fovi_wanted(layer: str, args) -> bool:
    """Whether fovi's own backends are timed on ``layer``: fovi is installed, ``--no-fovi`` was not given, and the
    layer is one of fovi's own network layers (``fovi:...``) or one of the table's in its own reference frame (fovi
    builds it so)."""
    from fovi_lab.graph.layers import LAYERS

    if getattr(args, "no_fovi", False):
        return False
    if not layer.startswith("fovi:") and (layer not in LAYERS or args.rf not in (None, LAYERS[layer].rf)):
        return False
    from fovi_lab.integrations.fovi import _fovi
    try:
        _fovi()                     # the same test as run()'s line saying fovi's backends are not timed
    except ImportError:
        return False
    return True


def _against_fovi(recs: List[dict]) -> None:
    """On our warp_train records (eager and replayed): the fastest of fovi's own backends of the same kind
    (``fastest_fovi``) and its time over ours (``speedup_vs_fovi``)."""
    for graphed in (False, True):
        fovi = [r for r in recs if str(r.get("impl", "")).startswith("fovi_") and r.get("ms")
                and bool(r.get("graphed")) == graphed]
        ours = [r for r in recs if r.get("impl") == ("warp_train_graphed" if graphed else "warp_train") and r.get("ms")]
        if fovi and ours:
            best = min(fovi, key=lambda r: r["ms"])
            for r in ours:
                r.update(fastest_fovi=best["impl"], speedup_vs_fovi=best["ms"] / r["ms"])
