"""Backward and train-step benchmark: Warp adjoints vs PyTorch, on the real fovi layer table.

``python -m fovi_lab.bench.backward [backward|train-step] [--layers alex_L1 res18_layer1]
[--batches 64 128 512] [--sweep] [--out data/backward_xxx.jsonl]``
(also ``python -m fovi_lab bench backward`` / ``python -m fovi_lab bench train-step``).

Per (layer, B), in one process on identical fp16 inputs (``x [B, Cin, Nin]``, ``W [Cout, Q]``, an
upstream gradient ``g [B, Cout, Nout]``):

mode ``backward`` (both gradients, dx and dW):
    * ``warp``: :func:`fovi_lab.kernels.adjoint.staged_plans.grad_input` + :func:`grad_weight` with the default
      configs, timed as the whole ops (operand layouts, every chunk, output copies), plus each
      pipeline's kernels alone (``gi_stage_ms``, ``dx_reduce_ms``, ``gw_stage_ms``, ``dw_reduce_ms``)
      on prepared operands, the stage GEMMs' TFLOP/s and fraction of Warp's dense tile-GEMM ceiling
      for the same tile shape (:func:`fovi_lab.kernels.forward.api.make_dense_ceiling`: the same GEMM sizes
      with plain loads, no gathers), and the reductions' GB/s and fraction of HBM bandwidth;
    * ``torch_compact``: :class:`fovi_lab.ops.reference.CompactTorchOps` explicit backward (bmm + fp32
      ``index_add_``; atomics on CUDA); ``torch_binned``: :class:`fovi_lab.ops.reference.BinnedTorchOps`, the
      binned form's explicit backward (matmul + ``index_add_``; G binned again for dW);
    * ``torch_autograd_gather_bmm`` / ``torch_autograd_tgather_bmm`` / ``torch_autograd_binned_mm``:
      ``torch.autograd.grad`` through the strongest PyTorch forwards (gather + bmm; the transposed gather
      whose gathered rows are contiguous batch runs; the binned form of :func:`fovi_lab.ops.reference.
      binned_forward`, index_add into the Q taps + one shared-weight matmul), backward only (the graph
      is built once, ``retain_graph=True``).
mode ``train-step`` (forward + both gradients):
    * ``warp_train``: the ``warp_train`` backend as a user gets it (:class:`fovi_lab.knn_warp.WarpTrainOps`:
      the default forward config and, per :func:`fovi_lab.knn_warp.grad_path`, the fused node-major
      adjoints of :mod:`fovi_lab.kernels.adjoint.fused` or the staged ones), with each fused kernel timed alone
      and against the dense ceiling of its tiles; ``warp_train_staged``: the staged pipelines with the
      per-stage numbers above; ``warp_train_fused``: the fused path forced where the rule picks staged;
    * ``torch_compact`` / ``torch_binned``: the registered PyTorch backends, forward + explicit backward;
    * ``torch_autograd_*``: the PyTorch forward + ``torch.autograd.grad``.
(In ``backward`` mode the same Warp records are named ``warp``, ``warp_staged``, ``warp_fused``.)
``--sweep`` (either mode) also measures every gi/gw config (v2/v2p, v2/v3/v3p/v4, tile sizes, fp16
and fp32 staging; gw also with the ``index_add`` finish) on each shape, op and kernels alone;
``--sweep-fused`` every fused dx config and dW config x list split; ``--graphs`` also replays
``warp_train`` and every PyTorch step from a CUDA graph (``*_graphed`` records: no per-call host work).

Every Warp result is checked against ``torch_compact`` in fp32 (``err_dx``, ``err_dw``: max abs error
over the reference's max abs), and run twice to check bitwise determinism (``deterministic``). Peak
memory is ``torch.cuda.max_memory_allocated`` during one call minus what was allocated before it
(``peak_mib``; inputs excluded, outputs included). FLOPs are ``2*B*P64*Cout*Nout`` per GEMM (two for
backward, three for a train step); bytes the fewest each op must move. Fractions of the roofline use
the H200 datasheet ceilings (:class:`fovi_lab.bench.common.Roofline`). A train step bumps the
weight's version first (as the optimizer's in-place update does), so no backend reuses a weight layout
cached from the previous step (records carry ``weight_version_bumped``). The seed's own H200 train-step
numbers (notes/warp-facts.md, one run each) are printed beside ours where the shape matches.

Suggested H200 runs (each fits one 10-minute call; the MathDx precompile is ~1 min per round of
``--jobs`` modules)::

    python -m fovi_lab.bench.backward train-step --batches 64 128 512 --time-budget-s 480
    python -m fovi_lab.bench.backward backward --layers alex_L0 alex_L1 alex_L3 res18_layer1 res18_layer3 \
        --batches 64 512 --sweep --time-budget-s 480

Robustness: on CUDA every needed Warp module (grads, forward, dense ceilings) is compiled first by a
pool of spawned processes (``--jobs``; MathDx links take ~50 s each and in-process workers do not
overlap them); a failing shape or implementation is recorded with a ``note`` and the run goes on;
records are appended after every shape; ``--time-budget-s`` stops starting new shapes.
"""

import argparse
import gc
import math
import multiprocessing as mp
import os
import sys
import time
import traceback
from typing import Callable, Dict, List, Optional, Tuple

import torch

from fovi_lab.bench.common import (Progress, Roofline, append_jsonl, compact_bytes, compact_flops, default_record_path,
                     env_info, gbps, pipelined_ms, tflops, time_fn)

__all__ = ["main", "SEED_TRAIN_STEP_MS", "run_shape", "precompile"]

#: The seed's (upstream fovi) Warp train step on the H200, ms (notes/warp-facts.md; one run each).
SEED_TRAIN_STEP_MS = {("res18_layer1", 64): 1.09, ("res18_layer1", 512): 3.60, ("alex_L1", 64): 9.68,
                      ("alex_L1", 512): 53.1, ("alex_L0", 64): 3.40, ("alex_L0", 512): 18.3}
#: Same notes: torch explicit-backward train step and its peak memory (GiB), for orientation.
NOTES_TORCH_TRAIN_STEP = {("res18_layer1", 64): (0.52, 0.13), ("res18_layer1", 512): (1.25, 0.58),
                          ("alex_L1", 64): (2.89, 1.23), ("alex_L1", 512): (6.17, 2.53),
                          ("alex_L0", 64): (1.40, 0.37), ("alex_L0", 512): (3.77, 1.60)}

_MIB = 1 << 20


# ------------------------------------------------------------------------------------------- helpers


def _frame(layer: str, rf):
    """The reference frame a record of ``layer`` was measured on (None for synthetic shapes)."""
    from fovi_lab.graph.layers import resolve_layer
    try:
        return resolve_layer(layer, rf)[1]
    except KeyError:
        return rf

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


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


def backward_bytes(meta, b: int) -> float:
    """Fewest bytes both adjoints must move: g, W, x (fp16) in; dx, dW (fp32) out; both tables."""
    return float(2 * (b * meta.cout * meta.nout + meta.cout * meta.q + b * meta.cin * meta.nin)
                 + 4 * (b * meta.cin * meta.nin + meta.cout * meta.q) + 2 * 4 * meta.nout * meta.p64)


def _dense_config_for(kind: str, spec: dict) -> Optional[str]:
    """The forward config whose dense ceiling has this stage's tile shape (M = p tile, N = b or o tile)."""
    try:
        from fovi_lab.kernels import forward as F
    except Exception:  # pragma: no cover - forward module missing
        return None
    tm = spec["tile_p"]
    tn = spec["tile_b"] if kind == "gi" else spec["tile_n"]
    tk = spec.get("tile_o", 64) if kind == "gi" else 64
    pipelined = str(spec["version"]).endswith("p")
    fams = ("gp",) if pipelined else ("gather",)
    best = None
    for name in F.uncached_config_names():
        c = F.config_spec(name)
        if c.family in fams and (c.tile_m, c.tile_n, c.tile_k, c.r) == (tm, tn, tk, 1):
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


# ------------------------------------------------------------------------------------------- warp

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
        out.update(dx_reduce_gbps=gbps(rbytes, rd), dx_reduce_hbm_frac=gbps(rbytes, rd) / (roof.hbm_tbps * 1e3))
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
            out.update(dw_reduce_gbps=gbps(rbytes, rd), dw_reduce_hbm_frac=gbps(rbytes, rd) / (roof.hbm_tbps * 1e3))
        dcfg = _dense_config_for("gw", plan.stage_k.spec)
        d = dense.get(dcfg, meta.p64, plan.cpad, n1 - n0, plan.bpad, device, tm)
        out.update(gw_dense_config=dcfg, gw_dense_ms=d, gw_frac_dense=(d / st) if d else None,
                   gw_dense_tflops=tflops(flops0, d) if d else None)
        del plan
        out["dw_tflops"] = tflops(gemm, out["dw_ms"])
    return out


def _dense_nm_config(tm: int, tn: int, tk: int) -> Optional[str]:
    """A registered forward config with these tiles (its dense ceiling is the fused kernel's); the
    experimental table holds the tiles only a fused adjoint uses (16x16 dx, 16/32-deep dW chunks)."""
    from fovi_lab.kernels import forward as F
    for name in F.uncached_config_names(experimental=True):
        c = F.config_spec(name)
        if c.family == "nm" and (c.tile_m, c.tile_n, c.tile_k, c.r) == (tm, tn, tk, 1):
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


# ------------------------------------------------------------------------------------------- a shape

def run_shape(layer: str, meta, b: int, mode: str, device: torch.device, env: dict, args, roof: Roofline,
              dense: _DenseCache) -> List[dict]:
    """Measure every implementation on one (layer, B); returns the records (failures carry a note)."""
    from fovi_lab.kernels import adjoint as wa
    from fovi_lab.ops.reference import BinnedTorchOps, CompactTorchOps

    gen = torch.Generator(device="cpu").manual_seed(b * 7919 + meta.nout)
    x = torch.randn(b, meta.cin, meta.nin, generator=gen).to(device, torch.float16)
    w = (torch.randn(meta.cout, meta.q, generator=gen) * (2.0 / (meta.cin * meta.k)) ** 0.5).to(device, torch.float16)
    g = (torch.randn(b, meta.cout, meta.nout, generator=gen) / math.sqrt(meta.nout)).to(device, torch.float16)
    gemm = compact_flops(b, meta.p64, meta.cout, meta.nout)
    n_gemm = 2 if mode == "backward" else 3
    flops = n_gemm * gemm
    nbytes = backward_bytes(meta, b)
    if mode == "train-step":
        nbytes += compact_bytes(b, meta.cin, meta.nin, meta.cout, meta.q, meta.nout, meta.p64)
    shape = {"layer": layer, "B": b, "rf": _frame(layer, args.rf), "mode": mode, "cin": meta.cin, "cout": meta.cout,
             "nin": meta.nin, "nout": meta.nout, "k": meta.k, "v": meta.v, "p64": meta.p64, "q": meta.q,
             "nnz": meta.nnz, "flops": flops, "bytes": nbytes}
    recs: List[dict] = []
    tm = lambda fn: time_fn(fn, device, warmup=args.warmup, reps=args.reps)  # noqa: E731
    pipe = lambda fn: pipelined_ms(fn, device, warmup=1, reps=args.reps)  # noqa: E731

    def rec(impl, ms, **kw):
        r = dict(env)
        r.update(shape)
        r.update(impl=impl, ms=ms, tflops=tflops(flops, ms) if ms else None,
                 roofline_frac=roof.fraction(ms, flops, nbytes) if ms else None)
        if mode == "train-step":
            r["weight_version_bumped"] = True
        r.update(kw)
        recs.append(r)
        return r

    fused_only = bool(getattr(args, "fused_only", False))

    def guarded(impl, fn, **kw):
        if fused_only and impl not in ("warp_dx", "warp_dw"):
            return None                                      # --fused-only: the fused sweep alone
        try:
            return fn()
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            rec(impl, None, note="out of memory", **kw)
        except Exception as exc:  # noqa: BLE001 - one failing implementation must not end the run
            rec(impl, None, note=f"{type(exc).__name__}: {str(exc).strip()[:300]}", **kw)
            if args.verbose:
                traceback.print_exc()
        return None

    graphs = bool(getattr(args, "graphs", False)) and device.type == "cuda"

    def graphed(impl, fn, **kw):
        """``fn`` replayed from a CUDA graph (no per-call host work): record ``<impl>_graphed``."""
        from fovi_lab.ops.graphs import capture
        try:
            cap = capture(fn)
            out = cap.replay()
            dx, dw = out[-2], out[-1]
            err_dx = float((dx.float() - ref[0]).abs().max()) / max(1e-12, float(ref[0].abs().max()))
            err_dw = float((dw.float() - ref[1]).abs().max()) / max(1e-12, float(ref[1].abs().max()))
            t = tm(cap.replay)
            rec(impl + "_graphed", t.ms, reps=t.reps, graphed=True, err_dx=err_dx, err_dw=err_dw, **kw)
            del cap, out
        except Exception as exc:  # noqa: BLE001 - report, keep measuring
            rec(impl + "_graphed", None, graphed=True, note=f"{type(exc).__name__}: {str(exc)[:200]}", **kw)

    def new_version(t):
        """A train step's weight is new every step (the optimizer updates it in place): bump its version
        so no backend reuses a layout derived from the previous step's values (the Warp forward caches
        its weight layout per version for inference)."""
        torch.autograd.graph.increment_version(t)

    # fp32 reference grads (torch_compact on fp32 copies of the same fp16 inputs)
    ref = (CompactTorchOps.grad_input(meta, g.float(), w.float()),
           CompactTorchOps.grad_weight(meta, g.float(), x.float()))

    # ---- PyTorch: the registered PyTorch backends (explicit adjoints), then autograd through the forwards
    def torch_backend(impl, ops):
        if mode == "backward":
            fn = lambda: (ops.grad_input(meta, g, w), ops.grad_weight(meta, g, x))  # noqa: E731
        else:
            def fn():
                new_version(w)
                y = ops.forward(meta, x, w, None)
                return y, ops.grad_input(meta, g, w), ops.grad_weight(meta, g, x)
        r1 = fn()
        r2 = fn()
        det = bool(torch.equal(r1[-2], r2[-2]) and torch.equal(r1[-1], r2[-1]))
        err_dx = float((r1[-2].float() - ref[0]).abs().max()) / max(1e-12, float(ref[0].abs().max()))
        err_dw = float((r1[-1].float() - ref[1]).abs().max()) / max(1e-12, float(ref[1].abs().max()))
        del r1, r2
        t = tm(fn)
        rec(impl, t.ms, reps=t.reps, peak_mib=_peak_mib(fn, device), deterministic=det, err_dx=err_dx,
            err_dw=err_dw, pipelined_ms=pipe(fn))
        if graphs:
            graphed(impl, fn)
    for impl, ops in (("torch_compact", CompactTorchOps), ("torch_binned", BinnedTorchOps)):
        guarded(impl, lambda impl=impl, ops=ops: torch_backend(impl, ops))

    for name, fwd in torch_forwards(meta).items():
        impl = f"torch_autograd_{name}"

        def autograd(fwd=fwd, impl=impl):
            xr = x.detach().clone().requires_grad_()
            wr = w.detach().clone().requires_grad_()
            if mode == "backward":
                y = fwd(xr, wr)
                fn = lambda: torch.autograd.grad(y, (xr, wr), g, retain_graph=True)  # noqa: E731
            else:
                def fn():
                    new_version(wr)
                    return torch.autograd.grad(fwd(xr, wr), (xr, wr), g)
            dx, dw = fn()
            err_dx = float((dx.float() - ref[0]).abs().max()) / max(1e-12, float(ref[0].abs().max()))
            err_dw = float((dw.float() - ref[1]).abs().max()) / max(1e-12, float(ref[1].abs().max()))
            del dx, dw
            t = tm(fn)
            rec(impl, t.ms, reps=t.reps, peak_mib=_peak_mib(fn, device), err_dx=err_dx, err_dw=err_dw,
                note="backward only (graph built once)" if mode == "backward" else None, pipelined_ms=pipe(fn))
            if graphs and mode == "train-step":
                graphed(impl, fn)
        guarded(impl, autograd)

    torch_ms = {r["impl"]: r["ms"] for r in recs if r.get("ms") and not r.get("graphed")}
    strongest = min(torch_ms, key=torch_ms.get) if torch_ms else None
    torch_peak = {r["impl"]: r.get("peak_mib") for r in recs if r.get("ms") and not r.get("graphed")}

    torch_pipe = {r["impl"]: r["pipelined_ms"] for r in recs if r.get("pipelined_ms") and not r.get("graphed")}
    strongest_pipe = min(torch_pipe, key=torch_pipe.get) if torch_pipe else None

    def finish_warp_record(r, t_ms):
        if strongest_pipe and r.get("pipelined_ms"):
            r.update(strongest_pipelined=strongest_pipe,
                     speedup_vs_strongest_pipelined=torch_pipe[strongest_pipe] / r["pipelined_ms"])
        if strongest:
            r.update(strongest=strongest, speedup_vs_strongest=torch_ms[strongest] / t_ms)
            if torch_peak.get(strongest) and r.get("peak_mib"):
                r["peak_frac_of_strongest"] = r["peak_mib"] / torch_peak[strongest]
        if "torch_compact" in torch_ms:
            r["speedup_vs_torch_compact"] = torch_ms["torch_compact"] / t_ms
            if torch_peak.get("torch_compact") and r.get("peak_mib"):
                r["peak_frac_of_torch_compact"] = r["peak_mib"] / torch_peak["torch_compact"]
        seed = SEED_TRAIN_STEP_MS.get((layer, b)) if mode == "train-step" else None
        if seed:
            r.update(seed_ms=seed, speedup_vs_seed=seed / t_ms)

    # ---- Warp, staged (the seed's stage + reverse-index pipelines, default configs)
    staged_impl = "warp_staged" if mode == "backward" else "warp_train_staged"

    def warp_staged():
        info = _warp_pipeline_records(meta, x, w, g, None, None, None, None, device, tm, dense, roof, ref)
        from fovi_lab.kernels import adjoint as wa_
        if mode == "backward":
            fn = lambda: (wa_.grad_input(meta, g, w), wa_.grad_weight(meta, g, x))  # noqa: E731
        else:
            from fovi_lab.kernels import forward as F

            def fn():
                new_version(w)
                y = F.run_uncached(x, w, None, meta.input_linear, meta.weight_linear)
                return y, wa_.grad_input(meta, g, w), wa_.grad_weight(meta, g, x)
        t = tm(fn)
        r = rec(staged_impl, t.ms, reps=t.reps, peak_mib=_peak_mib(fn, device), path="staged",
                deterministic=bool(info.get("deterministic_dx") and info.get("deterministic_dw")),
                pipelined_ms=pipe(fn), **info)
        finish_warp_record(r, t.ms)
    guarded(staged_impl, warp_staged)

    # ---- Warp, the warp_train backend as a user gets it (path per layer: knn_warp.grad_path), and the
    #      fused path forced where the rule picks the staged one (the evidence for the rule)
    from fovi_lab.knn_warp import grad_path
    warp_impl = "warp" if mode == "backward" else "warp_train"

    def warp_backend(impl, force=None):
        from fovi_lab.knn_warp import WarpTrainOps
        old = os.environ.get("FOVI_KNN_GRAD_PATH")
        if force:
            os.environ["FOVI_KNN_GRAD_PATH"] = force
        try:
            path = grad_path(meta)
            info = _fused_records(meta, x, w, g, device, tm, dense, ref) if path == "fused" else {}
            if mode == "backward":
                fn = lambda: WarpTrainOps.backward_combined(meta, g, x, w)  # noqa: E731
            else:
                y = WarpTrainOps.forward(meta, x, w, None)
                info["err_y"] = float((y.float() - CompactTorchOps.forward(meta, x.float(), w.float(),
                                                                           None)).abs().max())
                del y
                info["fwd_ms"] = tm(lambda: WarpTrainOps.forward(meta, x, w, None)).ms

                def fn():
                    new_version(w)
                    return (WarpTrainOps.forward(meta, x, w, None),) + tuple(
                        WarpTrainOps.backward_combined(meta, g, x, w))
            r1, r2 = fn(), fn()
            info["deterministic"] = bool(torch.equal(r1[-2], r2[-2]) and torch.equal(r1[-1], r2[-1]))
            info["err_dx"] = float((r1[-2] - ref[0]).abs().max()) / max(1e-12, float(ref[0].abs().max()))
            info["err_dw"] = float((r1[-1] - ref[1]).abs().max()) / max(1e-12, float(ref[1].abs().max()))
            del r1, r2
            t = tm(fn)
            r = rec(impl, t.ms, reps=t.reps, peak_mib=_peak_mib(fn, device), path=path, pipelined_ms=pipe(fn),
                    **info)
            finish_warp_record(r, t.ms)
            if graphs and force is None:
                graphed(impl, fn, path=path)
                tg = {q["impl"]: q["ms"] for q in recs if q.get("graphed") and q.get("ms")
                      and q["impl"].startswith("torch")}
                wg = [q for q in recs if q["impl"] == impl + "_graphed" and q.get("ms")]
                if tg and wg:
                    best = min(tg, key=tg.get)
                    wg[0].update(strongest_graphed=best, speedup_vs_strongest_graphed=tg[best] / wg[0]["ms"])
        finally:
            if force:
                if old is None:
                    os.environ.pop("FOVI_KNN_GRAD_PATH", None)
                else:
                    os.environ["FOVI_KNN_GRAD_PATH"] = old
    guarded(warp_impl, lambda: warp_backend(warp_impl))
    if grad_path(meta) != "fused":
        guarded(warp_impl + "_fused", lambda: warp_backend(warp_impl + "_fused", force="fused"))

    # ---- sweep of the fused kernels alone: every dxn config, every dwn config x list split
    if getattr(args, "sweep_fused", False):
        from fovi_lab.kernels import adjoint as nm
        from fovi_lab.graph.meta import pad_to
        useful = 2.0 * b * meta.cout * meta.cin * meta.nnz

        def one_fused(kind, name, nsplit=None, seg_steps=None, target=None):
            if kind == "dx":
                plan = nm.plan_grad_input_nm(meta, g, w, name, seg_steps=seg_steps)
                got, want = plan.run(), ref[0]
                ctas, steps = _dx_plan_steps(meta, plan)
                mm, nn = b, meta.cin
            else:
                plan = nm.plan_grad_weight_nm(meta, g, x, name, nsplit=nsplit, seg_steps=seg_steps)
                got, want = plan.run(), ref[1]
                ctas, steps = _dw_plan_steps(meta, plan, b)
                mm, nn = meta.cout, meta.cin
            err = float((got - want).abs().max()) / max(1e-12, float(want.abs().max()))
            t = tm(plan.launch).ms
            op_ms = tm(plan.run).ms
            c = fused_ceiling(dense, plan.k.tiles, mm, nn, ctas, steps, useful, t, device, tm)
            rec(f"warp_{plan.k.kind}", t, config=name, nsplit=getattr(plan, "nsplit", None),
                seg_steps=plan.seg_steps, seg_target_ctas=target, longest=getattr(plan, "longest", None),
                ctas=ctas, kernel_ms=t, op_ms=op_ms, err=err, tflops=tflops(useful, t), roofline_frac=None,
                partial_mib=plan.out.numel() * 4 / _MIB if plan.out.is_contiguous() else None, **c)
        # the tiles a rule could pick here (16-wide Cin tiles only for Cin <= 16 and the 16x16 small-grid
        # tile; 16/32-deep dW batch chunks only at B <= 32)
        dx_names = [n for n in nm.DX_NM_CONFIG_SPECS if n != "dxn_m64n128k64" and (
            nm.DX_NM_CONFIG_SPECS[n][1] > 16 or meta.cin <= 16 or n == "dxn_m16n16k64")]
        for name in dx_names:
            n_oc = pad_to(meta.cout, nm.DX_NM_CONFIG_SPECS[name][2]) // nm.DX_NM_CONFIG_SPECS[name][2]
            for seg in (0, n_oc, 2 * n_oc, 4 * n_oc):
                guarded("warp_dx", lambda name=name, seg=seg: one_fused("dx", name, seg_steps=seg), config=name,
                        seg_steps=seg)
        dw_names = [n for n in nm.DW_NM_CONFIG_SPECS if (nm.DW_NM_CONFIG_SPECS[n][1] > 16) == (meta.cin > 16)
                    and (nm.DW_NM_CONFIG_SPECS[n][2] == 64 or b <= 32)
                    and (b > 32 or nm.DW_NM_CONFIG_SPECS[n][:2] in ((64, 64), (64, 16)))]
        for name in dw_names:
            tiles = nm.DW_NM_CONFIG_SPECS[name]
            for s_ in (1, 4, 16):
                guarded("warp_dw", lambda name=name, s_=s_: one_fused("dw", name, nsplit=s_), config=name, nsplit=s_)
            seen = set()
            for target in (256, 512, 1024, 2048, 4096):
                L = nm.dw_seg_steps_for(meta, b, tiles, target)
                if L and L not in seen:
                    seen.add(L)
                    guarded("warp_dw", lambda name=name, L=L, target=target: one_fused("dw", name, seg_steps=L,
                                                                                       target=target),
                            config=name, seg_steps=L)
        for kind in ("dxn", "dxs", "dwn", "dws"):
            rows = sorted([r for r in recs if r["impl"] == f"warp_{kind}" and r.get("ms")], key=lambda r: r["ms"])
            print(f"{'':>22s}fused {kind}: " + ", ".join(
                f"{r['config']}/s{r.get('seg_steps') or r.get('nsplit')} {r['ms']:.3f} "
                f"({_fmt(100 * (r.get('frac_dense') or math.nan), '{:.0f}')}%)" for r in rows[:4]), flush=True)

    # ---- sweep of every gi / gw config
    if args.sweep:
        def one(impl, which, **kw):
            info = _warp_pipeline_records(meta, x, w, g, kw.get("gi"), kw.get("gw"), None, kw.get("finish"),
                                          device, tm, dense, roof, ref, do_gi=which == "dx", do_gw=which == "dw")
            ms = info.get(f"{which}_ms")
            rec(impl, ms, config=kw.get("gi") or kw.get("gw"), **info,
                **{"tflops": tflops(gemm, ms) if ms else None, "roofline_frac": None})

        for base in _sweep_names(wa.GRAD_INPUT_CONFIG_SPECS, args.gi_configs):
            for fp32 in (False, True):
                name = base + ("_f32" if fp32 else "")
                guarded("warp_gi", lambda name=name: one("warp_gi", "dx", gi=name), config=name)
        for base in _sweep_names(wa.GRAD_WEIGHT_CONFIG_SPECS, args.gw_configs):
            for fp32 in (False, True):
                name = base + ("_f32" if fp32 else "")
                default_gw = wa.select_gw_config(meta.cout, meta.cin, b, meta.nout, meta.p64)
                finishes = ("csr", "index_add") if base == default_gw else ("csr",)
                for fin in finishes:
                    guarded("warp_gw", lambda name=name, fin=fin: one("warp_gw", "dw", gw=name, finish=fin),
                            config=name, gw_finish=fin)
    return recs


def _sweep_names(table: dict, only: Optional[List[str]]) -> List[str]:
    return [n for n in table if only is None or n in only]


# ------------------------------------------------------------------------------------------- compile

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
        from fovi_lab.kernels.warmup import _compile_one
        name, dense, _dt, status = _compile_one((job[1], job[2], job[3], None, None))
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
    from fovi_lab.kernels import adjoint as wa
    jobs = []
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
        if dcfg:
            jobs.append(("fwd", dcfg, True, device))
    jobs += [("grad", "csr", n, device) for n in wa.CSR_KERNEL_SPECS]
    from fovi_lab.kernels import adjoint as nm
    for meta in metas.values():
        cfgs = [(k, nm.select_dx_nm_config(b, meta.cin, meta.nin, segments=sg)) for b in batches
                for k in ("dxn", "dxs") for sg in (False, True)]
        cfgs += [(k, nm.select_dw_nm_config(meta.cout, meta.cin, b)) for b in batches for k in ("dwn", "dws")]
        if getattr(args, "sweep_fused", False):
            cfgs += nm.nm_grad_kernel_names()
        for kind, name in sorted(set(cfgs)):
            jobs.append(("nm", kind, name, device))
            t = (nm.DX_NM_CONFIG_SPECS if kind.startswith("dx") else nm.DW_NM_CONFIG_SPECS)[name]
            dcfg = _dense_nm_config(t[0], t[1], t[2])
            if dcfg:
                jobs.append(("fwd", dcfg, True, device))
    if mode == "train-step":
        try:
            from fovi_lab.kernels import forward as F
            for meta in metas.values():
                nm_ok = F.analyse_tables(meta.input_linear, meta.weight_linear, meta.cin, meta.nin,
                                          meta.q).nm is not None
                for b in batches:
                    jobs.append(("fwd", F.select_config(b, meta.cout, meta.nout, meta.p64,
                                                                         in_channels=meta.cin, node_major=nm_ok,
                                                                         q=meta.q),
                                 False, device))
        except Exception as exc:  # noqa: BLE001
            print(f"# forward precompile skipped: {exc}", flush=True)
    return jobs


# ------------------------------------------------------------------------------------------- main

def main(argv=None) -> int:
    from fovi_lab.graph.layers import LAYERS, SYNTHETIC, layer_meta, synthetic_meta

    ap = argparse.ArgumentParser(prog="python -m fovi_lab.bench.backward", description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", nargs="?", default="backward", choices=["backward", "train-step"])
    ap.add_argument("--layers", nargs="*", default=None,
                    help=f"layer names (default: all of {list(LAYERS)}; also {list(SYNTHETIC)})")
    ap.add_argument("--batches", nargs="*", type=int, default=[64, 128, 512])
    ap.add_argument("--rf", default=None, choices=["rf1", "rf2"],
                    help="reference frame (default: each layer's network frame; the record's rf says which)")
    ap.add_argument("--sweep", action="store_true", help="also measure every gi/gw config (fp16 and fp32 staging)")
    ap.add_argument("--graphs", action="store_true",
                    help="also time warp_train and the PyTorch baselines replayed from CUDA graphs")
    ap.add_argument("--sweep-fused", action="store_true",
                    help="also time every fused dx config and every dW config x list split (kernels alone)")
    ap.add_argument("--fused-only", action="store_true",
                    help="with --sweep-fused: time only the fused sweep (no baselines, no other Warp paths)")
    ap.add_argument("--gi-configs", nargs="*", default=None, help="restrict the sweep's gi configs")
    ap.add_argument("--gw-configs", nargs="*", default=None, help="restrict the sweep's gw configs")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=min(16, os.cpu_count() or 1), help="precompile processes")
    ap.add_argument("--no-precompile", action="store_true", help="skip the parallel precompile (CUDA)")
    ap.add_argument("--out", default=None, help="JSON-lines file to append to (default data/<mode>_<device>.jsonl)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--time-budget-s", type=float, default=None,
                    help="start no new shape after this many seconds (records so far are kept)")
    ap.add_argument("--verbose", action="store_true", help="print tracebacks of failing implementations")
    args = ap.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    env = env_info(device)
    kind = "backward" if args.mode == "backward" else "train_step"
    out = args.out or default_record_path(kind, env["device"])
    layers = args.layers or list(LAYERS)
    roof = Roofline()
    print(f"# {args.mode} benchmark on {env['device']} (warp {env['warp']}, torch {env['torch']}), "
          f"records -> {out}", flush=True)
    print(f"# ceilings: HBM {roof.hbm_tbps} TB/s, fp16 dense {roof.fp16_tflops} TFLOP/s (H200 datasheet); "
          f"Warp's dense tile GEMM measured per stage tile shape", flush=True)
    t_start = time.perf_counter()
    metas = {}
    for name in layers:
        try:
            # fovi's synthetic test shapes (MAIN, ODD, PAD_HEAVY) are accepted too: quick smoke runs
            metas[name] = (synthetic_meta(name, device=device) if name in SYNTHETIC
                           else layer_meta(name, args.rf, device=device))
        except Exception as exc:  # noqa: BLE001
            print(f"# layer {name}: meta failed ({type(exc).__name__}: {exc}); skipped", flush=True)
    from fovi_lab.kernels.common import warp_device
    if device.type == "cuda" and not args.no_precompile:
        wdev = warp_device(torch.empty(0, device=device))
        precompile(_jobs_for(metas, args.batches, args.mode, args, wdev), args.jobs)
    prog = Progress(len(metas) * len(args.batches), "shapes")
    dense = _DenseCache()
    all_recs: List[dict] = []
    for name, meta in metas.items():
        for b in args.batches:
            if args.time_budget_s and time.perf_counter() - t_start > args.time_budget_s:
                print(f"# time budget of {args.time_budget_s:.0f}s spent: stopping before {name} B={b}", flush=True)
                break
            try:
                recs = run_shape(name, meta, b, args.mode, device, env, args, roof, dense)
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                recs = [dict(env, layer=name, B=b, mode=args.mode, impl="shape", ms=None, note="out of memory")]
            except Exception as exc:  # noqa: BLE001 - one failing shape must not end the run
                recs = [dict(env, layer=name, B=b, mode=args.mode, impl="shape", ms=None,
                             note=f"{type(exc).__name__}: {str(exc)[:300]}")]
                if args.verbose:
                    traceback.print_exc()
            append_jsonl(out, recs)
            all_recs += recs
            _print_shape(recs, args.mode)
            prog.step(f"{name} B={b}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            continue
        break
    _summary(all_recs, args.mode)
    return 0


def _fmt(v, spec="{:.3f}", none="-"):
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


def _warp_line(head: str, r: dict) -> str:
    line = (f"{head} {r['impl']} {r['ms']:.3f} ms ({_fmt(r.get('tflops'), '{:.1f}')} TFLOP/s, "
            f"{_fmt(100 * (r.get('roofline_frac') or math.nan), '{:.1f}')}% roofline, peak "
            f"{_fmt(r.get('peak_mib'), '{:.0f}')} MiB, det {r.get('deterministic')})")
    if r.get("path") == "fused":
        line += (f" dx kernel {_fmt(r.get('dxn_kernel_ms'))} ({r.get('dx_config')}, "
                 f"{r.get('dx_kind')} seg {r.get('dx_seg_steps')}, "
                 f"{_fmt(100 * (r.get('dx_frac_dense') or math.nan), '{:.0f}')}% dense) dW kernel "
                 f"{_fmt(r.get('dwn_kernel_ms'))} ({r.get('dw_config')} {r.get('dw_kind')} x{r.get('dw_nsplit')} "
                 f"seg {r.get('dw_seg_steps')}, finish {_fmt(r.get('dw_finish_ms'))}, "
                 f"{_fmt(100 * (r.get('dw_frac_dense') or math.nan), '{:.0f}')}% dense)")
    else:
        line += (f" dx {_fmt(r.get('dx_ms'))} [stage {_fmt(r.get('gi_stage_ms'))} = "
                 f"{_fmt(100 * (r.get('gi_frac_dense') or math.nan), '{:.0f}')}% dense, "
                 f"reduce {_fmt(r.get('dx_reduce_ms'))} "
                 f"{_fmt(r.get('dx_reduce_gbps'), '{:.0f}')} GB/s] dW {_fmt(r.get('dw_ms'))} [stage "
                 f"{_fmt(r.get('gw_stage_ms'))} = {_fmt(100 * (r.get('gw_frac_dense') or math.nan), '{:.0f}')}% dense, "
                 f"reduce {_fmt(r.get('dw_reduce_ms'))}]")
    if r.get("strongest"):
        line += f" | best torch {r['strongest']} -> x{r['speedup_vs_strongest']:.2f}"
    if r.get("seed_ms"):
        line += f" | seed {r['seed_ms']} ms -> x{r['speedup_vs_seed']:.2f}"
    return line


def _print_shape(recs: List[dict], mode: str) -> None:
    if not recs:
        return
    head = f"{recs[0]['layer']:>15s} B={recs[0]['B']:<4d}"
    base = "warp" if mode == "backward" else "warp_train"
    warp_impls = (base, base + "_fused", base + "_staged")
    torch_rows = sorted([r for r in recs if r["impl"].startswith("torch") and r.get("ms")], key=lambda r: r["ms"])
    for impl in warp_impls:
        wr = [r for r in recs if r["impl"] == impl]
        if wr and wr[0].get("ms"):
            print(_warp_line(head, wr[0]), flush=True)
        elif wr:
            print(f"{head} {impl}: {wr[0].get('note')}", flush=True)
    for r in recs:
        if r["impl"] in (base + "_graphed",) and r.get("ms"):
            print(f"{head} {r['impl']} {r['ms']:.3f} ms (CUDA-graph replay) | best torch graphed "
                  f"{r.get('strongest_graphed')} -> x{_fmt(r.get('speedup_vs_strongest_graphed'), '{:.2f}')}",
                  flush=True)
    for r in recs:
        if r["impl"] == base and r.get("speedup_vs_strongest_pipelined"):
            print(f"{head} {base} pipelined {r['pipelined_ms']:.3f} ms/call (back to back) | best torch pipelined "
                  f"{r.get('strongest_pipelined')} -> x{r['speedup_vs_strongest_pipelined']:.2f}", flush=True)
    for r in torch_rows:
        print(f"{'':>22s}{r['impl']:<30s} {r['ms']:.3f} ms (pipelined {_fmt(r.get('pipelined_ms'))})  "
              f"peak {_fmt(r.get('peak_mib'), '{:.0f}')} MiB", flush=True)
    for r in recs:
        if r["impl"] not in warp_impls and not r.get("ms") and r["impl"] not in ("warp_gi", "warp_gw"):
            print(f"{'':>22s}{r['impl']:<30s} failed: {r.get('note')}", flush=True)
    sweep = [r for r in recs if r["impl"] in ("warp_gi", "warp_gw")]
    if sweep:
        for which, key in (("warp_gi", "gi_stage_ms"), ("warp_gw", "gw_stage_ms")):
            rows = sorted([r for r in sweep if r["impl"] == which and r.get(key)], key=lambda r: r[key])
            if rows:
                print(f"{'':>22s}{which} fastest stages: " + ", ".join(
                    f"{r['config']}{'/' + r['gw_finish'] if r.get('gw_finish') else ''} {r[key]:.3f}"
                    f" (op {_fmt(r.get('ms'))})" for r in rows[:4]), flush=True)
        bad = [r for r in sweep if not r.get(key if r['impl'] == 'warp_gw' else 'gi_stage_ms') and r.get("note")]
        for r in bad[:6]:
            print(f"{'':>22s}{r['impl']} {r.get('config')}: {r.get('note')}", flush=True)


def _summary(recs: List[dict], mode: str) -> None:
    warp_impl = "warp" if mode == "backward" else "warp_train"
    grows = [r for r in recs if r["impl"] == warp_impl + "_graphed" and r.get("ms")]
    if grows:
        print("\n CUDA-graph replay (no per-call host work), both sides:")
        print(" layer            B   warp graphed  best torch graphed                   ms   speedup")
        for r in grows:
            sp = r.get("speedup_vs_strongest_graphed")
            print(f" {r['layer']:<15s} {r['B']:>4d} {r['ms']:>12.3f}  {str(r.get('strongest_graphed')):<32s}"
                  f"{(r['ms'] * sp if sp else math.nan):>8.3f}  x{(sp or math.nan):.2f}")
    rows = [r for r in recs if r["impl"] in (warp_impl, warp_impl + "_fused", warp_impl + "_staged") and r.get("ms")]
    if not rows:
        return
    print(f"\n (* = the warp_train backend's own path for that layer)")
    print(f" layer            B    path            ms  TFLOP/s  peak MiB  best torch (ms, MiB)              "
          f"speedup  mem frac  vs seed")
    for r in rows:
        tr = [t for t in recs if t["layer"] == r["layer"] and t["B"] == r["B"] and t["impl"] == r.get("strongest")]
        tpk = tr[0].get("peak_mib") if tr else None
        tms = tr[0]["ms"] if tr else None
        tag = r.get("path", "-") + ("*" if r["impl"] == warp_impl else "")
        print(f" {r['layer']:<15s} {r['B']:>4d} {tag:<8s} {r['ms']:>9.3f} {r['tflops']:>8.1f} "
              f"{_fmt(r.get('peak_mib'), '{:>9.0f}')}"
              f"  {str(r.get('strongest')):<26s} {_fmt(tms, '{:>7.3f}')} {_fmt(tpk, '{:>6.0f}')}"
              f"  x{_fmt(r.get('speedup_vs_strongest'), '{:.2f}')}   {_fmt(r.get('peak_frac_of_strongest'), '{:.2f}')}"
              f"     {('x%.2f' % r['speedup_vs_seed']) if r.get('speedup_vs_seed') else '-'}")


if __name__ == "__main__":
    sys.exit(main())
