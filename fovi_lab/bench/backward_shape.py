"""One shape of the backward / train-step benchmark: :func:`run_shape` times every implementation on one (layer, B)
in one process on the same fp16 operands, checks each against the fp32 reference and returns the records;
:data:`SEED_TRAIN_STEP_MS`, the fovi library's own Warp train step, is what warp_train's records are compared with.
"""

from __future__ import annotations

import contextlib
import math
import traceback
from typing import List

import torch

from fovi_lab.settings import override
from fovi_lab.bench.common import Roofline, compact_bytes, compact_flops, pipelined_ms, tflops, time_fn
from fovi_lab.bench.backward_impls import (FOVIS_WEIGHT, _against_fovi, _DenseCache, _MIB, _dw_plan_steps,
                                           _dx_plan_steps, _fovi_wanted, _frame, _fused_records, _peak_mib,
                                           _warp_pipeline_records, backward_bytes, fused_ceiling, torch_forwards,
                                           torch_steps)
from fovi_lab.bench.precompile import _sweep_names
from fovi_lab.bench.backward_report import _fmt


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

        def dx_run(name, nsplit, seg_steps):
            plan = nm.plan_grad_input_nm(meta, g, w, name, seg_steps=seg_steps)
            got = plan.run()
            return plan, got, ref[0], _dx_plan_steps(meta, plan), (b, meta.cin)

        def dw_run(name, nsplit, seg_steps):
            plan = nm.plan_grad_weight_nm(meta, g, x, name, nsplit=nsplit, seg_steps=seg_steps)
            got = plan.run()
            return plan, got, ref[1], _dw_plan_steps(meta, plan, b), (meta.cout, meta.cin)

        runs = {"dx": dx_run, "dw": dw_run}

        def one_fused(which, name, nsplit=None, seg_steps=None, target=None):
            plan, got, want, (ctas, steps), (mm, nn) = runs[which](name, nsplit, seg_steps)
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
        for kind in nm.FUSED_KINDS:
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
