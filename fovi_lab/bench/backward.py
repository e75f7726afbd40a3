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
    * ``torch_explicit_tgather`` (both modes; ``_compiled`` with ``--compile-steps``): the hand-written PyTorch step of
      :func:`fovi_lab.bench.backward_impls.torch_steps` (x^T layout, bmm + fp32 ``index_add_`` adjoints).
    * ``fovi_<backend>`` (train step, where fovi is installed; ``--no-fovi`` leaves them out): what a fovi user
      has, fovi's own layer of the same table layer with ``kernel_backend`` = ``auto``, ``cuda`` (its fused CuPy
      kernel), ``baseline``, ``torch_compact`` and ``warp_train`` (its copy of the seed's kernels), on the same fp16
      operands as ours (:func:`fovi_lab.integrations.fovi.fovi_steps`: the layer set up once, its weight's version
      bumped per step); judged, eager and replayed, against that layer's fp32 result (fovi's tables are its own). Our ``warp_train`` records carry ``fastest_fovi`` and ``speedup_vs_fovi``; a
      backend fovi refuses on the device is recorded with fovi's reason.
(In ``backward`` mode the same Warp records are named ``warp``, ``warp_staged``, ``warp_fused``.)
``--sweep`` (either mode) also measures every gi/gw config (v2/v2p, v2/v3/v3p/v4, tile sizes, fp16
and fp32 staging; gw also with the ``index_add`` finish) on each shape, op and kernels alone;
``--sweep-fused`` every fused dx config and dW config x list split; ``--graphs`` also replays
``warp_train`` and every PyTorch step from a CUDA graph (``*_graphed`` records: no per-call host work).

Every Warp result is checked against ``torch_compact`` in fp32 (``err_dx``, ``err_dw``: max abs error
over the reference's max abs), and run twice to check bitwise determinism (``deterministic``). Peak
memory is ``torch.cuda.max_memory_allocated`` during one call minus what was allocated before it
(``peak_mib``; inputs excluded, outputs included); warp_train's records add what stays: ``tables_mib`` (the index
tables the layer keeps on the device, its own and the adjoints' derived layers) and the replay cache's
``replay_resident_mib`` / ``replay_shape_mib``. FLOPs are ``2*B*P64*Cout*Nout`` per GEMM (two for
backward, three for a train step); bytes the fewest each op must move. Fractions of the roofline use
the datasheet ceilings of the device measured (:class:`fovi_lab.bench.common.Roofline`). A train step bumps the
weight's version first (as the optimizer's in-place update does), so no backend reuses a weight layout
cached from the previous step (records carry ``weight_version_bumped``). The fovi library's own Warp
train step, as measured on an H200 outside this repository (one run each), is printed beside ours where
the shape matches.

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

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import List

import torch

from fovi_lab.settings import override
from fovi_lab.bench.common import (Progress, Roofline, roofline_of, append_jsonl, compact_bytes, compact_flops,
                                   default_record_path, env_info, pipelined_ms, records_note, tflops, time_fn)
from fovi_lab.bench.backward_impls import (_DenseCache, _MIB, _dw_plan_steps, _dx_plan_steps, _frame, _fused_records,
                                           _peak_mib, _warp_pipeline_records, backward_bytes, fused_ceiling,
                                           torch_forwards, torch_steps)
from fovi_lab.bench.precompile import _jobs_for, _sweep_names, precompile
from fovi_lab.bench.backward_report import _fmt, _print_shape, _summary


__all__ = ["main", "add_arguments", "run", "MODES", "DESCRIPTIONS", "SEED_TRAIN_STEP_MS", "run_shape", "precompile"]

#: The fovi library's own Warp train step on an H200, ms (measured outside this repository; one run each).
SEED_TRAIN_STEP_MS = {("res18_layer1", 64): 1.09, ("res18_layer1", 512): 3.60, ("alex_L1", 64): 9.68,
                      ("alex_L1", 512): 53.1, ("alex_L0", 64): 3.40, ("alex_L0", 512): 18.3}
#: The same measurements' PyTorch explicit-backward train step and its peak memory (GiB), for orientation.
NOTES_TORCH_TRAIN_STEP = {("res18_layer1", 64): (0.52, 0.13), ("res18_layer1", 512): (1.25, 0.58),
                          ("alex_L1", 64): (2.89, 1.23), ("alex_L1", 512): (6.17, 2.53),
                          ("alex_L0", 64): (1.40, 0.37), ("alex_L0", 512): (3.77, 1.60)}


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
    only = set(getattr(args, "only", None) or ())

    def guarded(impl, fn, **kw):
        if fused_only and impl not in ("warp_dx", "warp_dw"):
            return None                                      # --fused-only: the fused sweep alone
        if only and impl not in only:
            return None                                      # --only: these implementations alone
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

    def graphed(impl, fn, against=None, **kw):
        """``fn`` replayed from a CUDA graph (no per-call host work): record ``<impl>_graphed``, its gradients judged
        against ``against`` (dx, dW; default: the fp32 reference of our layer)."""
        from fovi_lab.ops.graphs import capture
        want = against or ref
        try:
            cap = capture(fn)
            out = cap.replay()
            dx, dw = out[-2], out[-1]
            err_dx = float((dx.float() - want[0]).abs().max()) / max(1e-12, float(want[0].abs().max()))
            err_dw = float((dw.float() - want[1]).abs().max()) / max(1e-12, float(want[1].abs().max()))
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

    def rel_err(out, i):
        """max |out - ref| / max |ref| against the fp32 reference dx (i = 0) or dW (i = 1)."""
        return float((out.float() - ref[i]).abs().max()) / max(1e-12, float(ref[i].abs().max()))

    def measure(impl, fn, replay, **kw):
        """Two calls (bitwise equal?), the error of the last two outputs (dx, dW) against the fp32 reference,
        the time one call at a time and back to back, peak memory: one record; ``replay``: also from a graph."""
        r1, r2 = fn(), fn()
        det = bool(torch.equal(r1[-2], r2[-2]) and torch.equal(r1[-1], r2[-1]))
        err_dx, err_dw = rel_err(r1[-2], 0), rel_err(r1[-1], 1)
        del r1, r2
        t = tm(fn)
        rec(impl, t.ms, reps=t.reps, peak_mib=_peak_mib(fn, device), deterministic=det, err_dx=err_dx,
            err_dw=err_dw, pipelined_ms=pipe(fn), **kw)
        if replay:
            graphed(impl, fn)

    # ---- PyTorch: the registered PyTorch backends (explicit adjoints), then autograd through the forwards
    def torch_backend(impl, ops):
        if mode == "backward":
            fn = lambda: (ops.grad_input(meta, g, w), ops.grad_weight(meta, g, x))  # noqa: E731
        else:
            def fn():
                new_version(w)
                y = ops.forward(meta, x, w, None)
                return y, ops.grad_input(meta, g, w), ops.grad_weight(meta, g, x)
        measure(impl, fn, replay=graphs)
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

    for name, step in torch_steps(meta).items():
        impl = f"torch_{name}"

        def explicit(step=step, impl=impl):
            if mode == "backward":
                fn = lambda: step(x, w, g)[1:]  # noqa: E731  (the forward's gathers are part of this form)
            else:
                def fn():
                    new_version(w)
                    return step(x, w, g)
            measure(impl, fn, replay=graphs and mode == "train-step",
                    note="forward gathers included" if mode == "backward" else None)
            if getattr(args, "compile_steps", False) and mode == "train-step":
                cstep = torch.compile(step, fullgraph=True)
                measure(impl + "_compiled", lambda: (new_version(w), cstep(x, w, g))[1], replay=False, compiled=True)
        guarded(impl, explicit)

    torch_ms = {r["impl"]: r["ms"] for r in recs if r.get("ms") and not r.get("graphed")}
    strongest = min(torch_ms, key=torch_ms.get) if torch_ms else None
    torch_peak = {r["impl"]: r.get("peak_mib") for r in recs if r.get("ms") and not r.get("graphed")}

    torch_pipe = {r["impl"]: r["pipelined_ms"] for r in recs if r.get("pipelined_ms") and not r.get("graphed")}
    strongest_pipe = min(torch_pipe, key=torch_pipe.get) if torch_pipe else None

    # ---- fovi's own backends (what a fovi user has), each through fovi's own layer of the same table layer, judged
    #      against that layer's fp32 result (fovi's tables are its own); after PyTorch's strongest is taken
    fovi_named = not only or any(n.startswith("fovi_") for n in only)
    if mode == "train-step" and fovi_named and _fovi_wanted(layer, args):
        from fovi_lab.integrations.fovi import fovi_steps

        steps = fovi_steps(layer, device)
        fref = steps.reference(x, w, g)
        for impl, step in steps.items():
            def fovi_step(step=step, impl=impl):
                r1, r2 = step(x, w, g), step(x, w, g)
                det = bool(torch.equal(r1[1], r2[1]) and torch.equal(r1[2], r2[2]))
                errs = [float((a.float() - r).abs().max()) / max(1e-12, float(r.abs().max()))
                        for a, r in zip(r1[1:], fref[1:])]
                del r1, r2
                fn = lambda: step(x, w, g)  # noqa: E731
                t = tm(fn)
                rec(impl, t.ms, reps=t.reps, peak_mib=_peak_mib(fn, device), deterministic=det, err_dx=errs[0],
                    err_dw=errs[1], pipelined_ms=pipe(fn), err_against="fovi's baseline in fp32 on its own layer",
                    fovi_weight=FOVIS_WEIGHT)
                if graphs:
                    graphed(impl, fn, against=fref[1:], fovi_weight=FOVIS_WEIGHT,
                            err_against="fovi's baseline in fp32 on its own layer")
            guarded(impl, fovi_step)

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

    # ---- Warp, staged (fovi's stage + reverse-index pipelines, default configs)
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

    # ---- Warp, the warp_train backend as a user gets it (path per call: the tensor cores where
    #      as_forward.select_grad_mma picks them, else knn_warp.grad_path), and the fused path forced where the
    #      rule picks the staged one (the evidence for the rule)
    from fovi_lab.knn_warp import grad_path, grad_paths
    warp_impl = "warp" if mode == "backward" else "warp_train"

    def warp_backend(impl, force=None):
        from fovi_lab.graph.meta import held_bytes
        from fovi_lab.knn_warp import WarpTrainOps
        from fovi_lab.ops import replay
        held = replay.resident_bytes(device)
        with contextlib.ExitStack() as forced:
            if force:
                forced.enter_context(override(FOVI_KNN_GRAD_PATH=force))
            dx_path, dw_path = grad_paths(meta, b, g.dtype)
            path = dx_path if dx_path == dw_path else f"dx {dx_path}, dW {dw_path}"
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
            # replay_resident_mib: what the backends' replay cache holds in this whole process (every shape so far);
            # replay_shape_mib: what this shape's calls added to it (static tensors and graph pools, kept beyond peak_mib)
            # tables_mib: the index tables the layer keeps on the device (its own and the adjoints' derived layers)
            r = rec(impl, t.ms, reps=t.reps, peak_mib=_peak_mib(fn, device), path=path, pipelined_ms=pipe(fn),
                    replay=replay.replay_mode(), replay_resident_mib=replay.resident_bytes(device) / _MIB,
                    replay_shape_mib=(replay.resident_bytes(device) - held) / _MIB,
                    tables_mib=held_bytes(meta, device) / _MIB, **info)
            finish_warp_record(r, t.ms)
            if graphs and force is None:
                graphed(impl, fn, path=path)
                tg = {q["impl"]: q["ms"] for q in recs if q.get("graphed") and q.get("ms")
                      and q["impl"].startswith("torch")}
                wg = [q for q in recs if q["impl"] == impl + "_graphed" and q.get("ms")]
                if tg and wg:
                    best = min(tg, key=tg.get)
                    wg[0].update(strongest_graphed=best, speedup_vs_strongest_graphed=tg[best] / wg[0]["ms"])
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
    _against_fovi(recs)
    return recs


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


MODES = ("backward", "train-step")

#: The help text of ``python -m fovi_lab bench backward`` and ``bench train-step``, per mode.
DESCRIPTIONS = {
    "backward": """\
Backward benchmark: both gradients (dx and dW) of the Warp adjoints against PyTorch, on the real fovi layers.

Per layer and batch, in one process on identical fp16 inputs (x, W and an upstream gradient), it times the staged
and the fused Warp adjoints (as whole ops and each pipeline's kernels alone, beside Warp's dense tile-GEMM ceiling
of the same tiles), the registered PyTorch backends' explicit adjoints, and autograd through the strongest
PyTorch forwards. Every Warp result is checked against torch_compact in fp32 and run twice for bitwise
determinism. Records (JSON lines) are appended to --out, by default to data/backward_<device>.jsonl under the
current folder.

  python -m fovi_lab bench backward --layers alex_L1 res18_layer1 --batches 64 512
  python -m fovi_lab bench backward --sweep --gi-configs gi2_p64b64
""",
    "train-step": """\
Train-step benchmark: the forward and both gradients of the warp_train backend against PyTorch's train steps,
on the real fovi layers.

Per layer and batch, in one process on identical fp16 inputs, it times warp_train as a user gets it (the rule's
forward config and adjoint path), the staged and the fused Warp paths, the registered PyTorch backends (forward
and explicit adjoints), autograd through the PyTorch forwards and the hand-written PyTorch step; each step bumps
the weight's version first, as an optimizer's update does. Every Warp result is checked against torch_compact in
fp32. Records (JSON lines) are appended to --out, by default to data/train_step_<device>.jsonl under the current
folder.

  python -m fovi_lab bench train-step --batches 64 128 512 --graphs
""",
}


def add_arguments(parser, mode: str = "backward") -> None:
    """The options of ``python -m fovi_lab bench <mode>`` (``backward`` or ``train-step``), each checked as it is
    parsed; the parsed ``mode`` is ``mode``."""
    import fovi_lab.integrations.fovi  # noqa: F401  (its layer source: --layers fovi:resnet18@64, ...)
    from fovi_lab.graph.layers import SYNTHETIC
    from fovi_lab.ops.arguments import (COUNT, LayersAction, add_device_option, int_at_least, layer_names, out_file,
                                        positive_float)

    kind = "backward" if mode == "backward" else "train_step"
    parser.set_defaults(mode=mode)

    def impl_name(text: str) -> str:
        if not re.fullmatch(r"warp(_train)?(_staged|_fused)?|warp_d[xw]|torch_\w+|fovi_\w+", text):
            raise argparse.ArgumentTypeError(
                f"expected an implementation this benchmark times (warp_train, warp_train_staged, warp_train_fused, "
                f"warp, warp_staged, warp_fused, torch_..., fovi_...), got {text!r}")
        return text
    parser.add_argument("--layers", nargs="+", type=layer_names(synthetic=True), action=LayersAction, default=None,
                        metavar="LAYER", help=f"layer names, all, the layers of fovi's own networks "
                                              f"(fovi:resnet18@64, fovi:alexnet@128:1, fovi:all), or the synthetic "
                                              f"test shapes {', '.join(SYNTHETIC)} (default: every layer of the "
                                              f"table)")
    parser.add_argument("--batches", nargs="+", type=COUNT, default=[64, 128, 512], metavar="B",
                        help="batch sizes to time on each layer")
    parser.add_argument("--rf", default=None, choices=["rf1", "rf2"],
                        help="reference frame (default: each layer's network frame; the record's rf says which)")
    parser.add_argument("--sweep", action="store_true", help="also time every gi/gw config (fp16 and fp32 staging)")
    parser.add_argument("--graphs", action="store_true",
                        help="also time warp_train and the PyTorch baselines replayed from CUDA graphs")
    parser.add_argument("--sweep-fused", action="store_true",
                        help="also time every fused dx config and every dW config x list split (kernels alone)")
    parser.add_argument("--fused-only", action="store_true",
                        help="with --sweep-fused: time only the fused sweep (no baselines, no other Warp paths)")
    parser.add_argument("--gi-configs", nargs="+", default=None, metavar="CONFIG",
                        help="restrict the sweep's grad-input configs to these (default: every one)")
    parser.add_argument("--gw-configs", nargs="+", default=None, metavar="CONFIG",
                        help="restrict the sweep's grad-weight configs to these (default: every one)")
    parser.add_argument("--only", nargs="+", type=impl_name, default=None, metavar="IMPL",
                        help="time only these implementations, with their replayed forms under --graphs (warp_train, "
                             "say, to time a switch such as FOVI_KNN_DX_PATH=taps beside a run of the rule; the "
                             "records then carry no ratio to PyTorch's, and the dense ceilings compile only where a "
                             "record needs one; default: every one)")
    parser.add_argument("--no-fovi", action="store_true",
                        help="train-step: leave out fovi's own backends (timed by default where fovi is installed)")
    parser.add_argument("--compile-steps", action="store_true",
                        help="also time torch.compile of the hand-written PyTorch steps (train-step; slow to compile)")
    parser.add_argument("--reps", type=COUNT, default=15, help="timed calls per implementation, whose median is kept")
    parser.add_argument("--warmup", type=int_at_least(0), default=3, help="untimed calls before the timed ones")
    parser.add_argument("--jobs", type=COUNT, default=min(16, os.cpu_count() or 1),
                        help="processes that precompile the Warp modules in parallel on a GPU (default: the CPU "
                             "count, at most 16)")
    parser.add_argument("--no-precompile", action="store_true", help="skip the parallel precompile (CUDA)")
    parser.add_argument("--out", type=out_file, default=None,
                        help=f"JSON-lines file to append the records to (default: data/{kind}_<device>.jsonl under "
                             f"the current folder)")
    add_device_option(parser)
    parser.add_argument("--time-budget-s", type=positive_float, default=None, metavar="S",
                        help="start no new shape after this many seconds (the records so far are kept; default: "
                             "no limit)")
    parser.add_argument("--verbose", action="store_true", help="print the traceback of a failing implementation")


def run(args) -> int:
    """Run the benchmark of ``args.mode`` as ``args`` say (the options of :func:`add_arguments`); returns 0."""
    from fovi_lab.graph.layers import LAYERS, SYNTHETIC, layer_meta, synthetic_meta

    _check_only(args)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    env = env_info(device)
    kind = "backward" if args.mode == "backward" else "train_step"
    out = args.out or default_record_path(kind, env["device"])
    if args.out is None:                               # the default file: refused here, not after the timings
        from fovi_lab.ops.arguments import unwritable, usage_error
        why = unwritable(out)
        if why is not None:
            usage_error(f"python -m fovi_lab bench {args.mode}",
                        f"--out: the default {out} cannot be written ({why}); name a file with --out")
    fovi_missing = None
    if args.mode == "train-step" and not getattr(args, "no_fovi", False):
        from fovi_lab.integrations.fovi import _fovi
        try:
            _fovi()
        except ImportError as exc:
            fovi_missing = str(exc)
    only = getattr(args, "only", None) or []
    if fovi_missing and any(n.startswith("fovi_") for n in only):
        from fovi_lab.ops.arguments import usage_error
        usage_error(f"python -m fovi_lab bench {args.mode}", f"--only: fovi's backends need fovi: {fovi_missing}")
    layers = args.layers or list(LAYERS)
    roof = roofline_of(device)
    print(f"# {args.mode} benchmark on {env['device']} (warp {env['warp']}, torch {env['torch']}), "
          f"records -> {out}", flush=True)
    print(f"# ceilings: {roof.words()}; "
          f"Warp's dense tile GEMM measured per stage tile shape", flush=True)
    if fovi_missing and not only:
        print(f"# fovi's own backends are not timed: {fovi_missing} (--no-fovi leaves them out without this line)",
              flush=True)
    t_start = time.perf_counter()
    metas = {}
    for name in layers:
        try:
            # fovi's synthetic test shapes (MAIN, ODD, PAD_HEAVY) are accepted too: quick smoke runs; fovi's own
            # network layers (fovi:...) are built from fovi's tables
            if name.startswith("fovi:"):
                from fovi_lab.integrations.fovi import network_layer_meta
                metas[name] = network_layer_meta(name, device)
            else:
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
    if all_recs:
        print(f"# {len(all_recs)} records appended to {Path(out).resolve()}", flush=True)
        print(records_note(out), flush=True)
    return 0


def _check_only(args) -> None:
    """``--only`` names of the other mode's implementations (``warp_train`` in ``bench backward``, say), fovi's
    backends outside the train step, or the fused sweep's kernels without ``--sweep-fused``: a usage error, since
    the run would time nothing of them."""
    only = getattr(args, "only", None) or []
    ours = ("warp", "warp_staged", "warp_fused") if args.mode == "backward" else \
        ("warp_train", "warp_train_staged", "warp_train_fused")
    wrong = [n for n in only if (n.startswith("warp") and n not in ours and n not in ("warp_dx", "warp_dw"))
             or (n in ("warp_dx", "warp_dw") and not getattr(args, "sweep_fused", False))
             or (n.startswith("fovi_") and args.mode != "train-step")]
    if wrong:
        from fovi_lab.ops.arguments import usage_error
        usage_error(f"python -m fovi_lab bench {args.mode}",
                    f"--only: {', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not timed by bench {args.mode} "
                    f"(its own: {', '.join(ours)}; warp_dx / warp_dw with --sweep-fused; torch_...; "
                    f"fovi_... in train-step)")


def main(argv=None) -> int:
    """``python -m fovi_lab.bench.backward [backward|train-step] [options]``: the benchmark of that mode
    (``backward`` when the first argument names none); see :data:`DESCRIPTIONS`. The same as
    ``python -m fovi_lab bench backward`` / ``bench train-step``. Returns the exit status; a usage error exits with
    status 2."""
    from fovi_lab.ops.arguments import CommandParser

    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv.pop(0) if argv and argv[0] in MODES else "backward"
    parser = CommandParser(prog=f"python -m fovi_lab bench {mode}", description=DESCRIPTIONS[mode])
    add_arguments(parser, mode)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
