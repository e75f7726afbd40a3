"""The adjoint widgets' callbacks: the staged adjoints by node GEMMs, their determinism, the grid and
occupancy of each stage, and a rerun of a production gi / gw kernel on the current device; and the recorded
gi / gw sweep as text (:func:`gi_gw_sweep_table`).
"""

from __future__ import annotations

import time
from typing import List, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.lab.common import readable_log_axes
from fovi_lab.graph.layers import LAYERS
from fovi_lab.graph.meta import TrainingMeta, pad_to
from fovi_lab.kernels.families.registry import adjoint_family, adjoint_point
from fovi_lab.lab.labels import short_label, stage_label
from fovi_lab.lab.common import (CPU_WORK_BUDGET, RunLog, result_answer, check_explore_args,
                                 clamp_shape, fail_result, hline, log_range, time_ms, parity_line,
                                 rel_error, tolerance_class, widget_device)
from fovi_lab.lab.problems import Problem, make_meta, make_problem, reference_grads
from fovi_lab.lab.traffic import shape_of


#: SMs of an H200 (the occupancy argument of notebook 05).
H200_SMS = 132


def adjoint_by_node_gemms(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, grad_y: torch.Tensor,
                          dtype=torch.float64) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dW)`` written out as per-node GEMMs plus scatters (docs/operator.md §3), in ``dtype`` on the CPU:
    ``dA_n = g_n W_n^T`` scattered through ``input_linear`` (pad column dropped), ``dWeff_n = A_n^T g_n``
    scattered through ``weight_linear``. A readable loop, not a fast one."""
    from fovi_lab.ops.reference import pad_flat_input
    meta = meta.to("cpu")
    x, w, g = (t.detach().cpu().to(dtype) for t in (x, weight, grad_y))
    b = x.shape[0]
    xpad = pad_flat_input(x, meta)
    wt = w.t()
    dx = torch.zeros(b, meta.pad_column + 1, dtype=dtype)
    dwt = torch.zeros(meta.q, meta.cout, dtype=dtype)
    for n in range(meta.nout):
        il = meta.input_linear[n].long()
        wl = meta.weight_linear[n].long()
        a_n, w_n, g_n = xpad[:, il], wt[wl], g[:, :, n]          # [B, P64], [P64, Cout], [B, Cout]
        dx.index_add_(1, il, g_n @ w_n.t())                        # dA_n = g_n W_n^T
        dwt.index_add_(0, wl, a_n.t() @ g_n)                       # dWeff_n = A_n^T g_n
    return dx[:, :-1].reshape(b, meta.cin, meta.nin), dwt.t().contiguous()


def determinism_demo(problem: Problem, gi_config: Optional[str] = None, gw_config: Optional[str] = None,
                     runs: int = 3, seed: int = 0) -> dict:
    """Why staging + a reverse CSR is deterministic, shown on ``problem``.

    * Warp: ``grad_input`` / ``grad_weight`` run ``runs`` times; are all results bitwise equal?
    * Scatter order: the same per-node ``dA`` terms scattered with ``index_add_`` in the natural order
      and in a shuffled order (what atomics do on a GPU: the order is whatever the hardware makes it).
      fp32 addition is not associative, so the two differ in the last bits.

    Returns a dict: warp_dx_bitwise, warp_dw_bitwise (bool), shuffled_differs (bool),
    shuffled_elements_differ (count), shuffled_max_rel (max difference over max |dx|).
    """
    from fovi_lab.kernels import adjoint as wa
    from fovi_lab.ops.reference import CompactTorchOps
    meta, g, w, x = problem.meta, problem.grad_y, problem.weight, problem.x
    dxs = [wa.grad_input(meta, g, w, config=gi_config) for _ in range(runs)]
    dws = [wa.grad_weight(meta, g, x, config=gw_config) for _ in range(runs)]
    dx_same = all(torch.equal(dxs[0], d) for d in dxs[1:])
    dw_same = all(torch.equal(dws[0], d) for d in dws[1:])
    # the torch recipe with the scatter order as a parameter
    mc = meta.to("cpu")
    gc = g.detach().cpu().float()
    wc = w.detach().cpu().float()
    b = gc.shape[0]
    wt = wc.t().contiguous()
    w_n = wt.index_select(0, mc.weight_linear_flat).view(mc.nout, mc.p64, mc.cout)
    da = torch.bmm(gc.permute(2, 0, 1), w_n.transpose(1, 2))             # [Nout, B, P64]
    vals = da.transpose(0, 1).reshape(b, -1)                               # [B, Nout*P64]
    idx = mc.input_linear_flat
    natural = torch.zeros(b, mc.pad_column + 1).index_add_(1, idx, vals)
    perm = torch.randperm(idx.numel(), generator=torch.Generator().manual_seed(seed))
    shuffled = torch.zeros(b, mc.pad_column + 1).index_add_(1, idx[perm], vals[:, perm])
    diff = (natural - shuffled)[:, :-1]
    ref = CompactTorchOps.grad_input(mc, gc, wc)
    return {
        "warp_dx_bitwise": bool(dx_same), "warp_dw_bitwise": bool(dw_same), "runs": runs,
        "natural_matches_torch_compact": bool(torch.equal(natural[:, :-1].reshape_as(ref), ref)),
        "shuffled_differs": bool((diff != 0).any()),
        "shuffled_elements_differ": int((diff != 0).sum()),
        "elements": int(diff.numel()),
        "shuffled_max_rel": float(diff.abs().max()) / max(1e-30, float(natural.abs().max())),
    }


def _stage_spec(kind: str, config: str) -> dict:
    """The spec record (tiles, version, block) of the stage kernel ``config`` of ``kind``; a KeyError names a config
    that is no kernel of the kind."""
    point = adjoint_point(kind, config)
    return point.owner.spec(point)


def _batch_chunks(spec: dict, b: int, nout: int, p64: int, cout: int, itemsize: int, budget: int, pairs: int):
    """dx: the stage ``[Nout, P64, Bchunk]`` cut along the batch. ``(chunk, launches, nodes, columns,
    contraction)`` of the first launch."""
    tb = spec["tile_b"]
    bchunk = max(tb, (budget // max(1, nout * p64 * itemsize)) // tb * tb)
    bchunk = min(bchunk, pad_to(b, tb))
    bchunk = min(bchunk, pad_to(-(-b // -(-b // bchunk)), tb))          # as even as the tiles allow
    return bchunk, -(-b // bchunk), nout, bchunk, pad_to(cout, spec["tile_o"])


def _node_chunks(spec: dict, b: int, nout: int, p64: int, cout: int, itemsize: int, budget: int, pairs: int):
    """dW: the stage ``[nc, P64, Cout_pad]`` cut along the nodes. As :func:`_batch_chunks`."""
    cpad = pad_to(cout, spec["tile_n"] * pairs)
    nc = max(1, min(nout, budget // max(1, p64 * cpad * itemsize)))
    nc = -(-nout // -(-nout // nc))                                   # as even as the nodes allow
    return nc, -(-nout // nc), nc, cpad, pad_to(b, spec["tile_kb"])


#: How a stage is cut into launches within the budget, by the gradient of the family.
_CHUNKS = {"dx": _batch_chunks, "dW": _node_chunks}


def adjoint_grid(kind: str, config: str, shape: dict, batch: int, sms: int = H200_SMS,
                 stage_budget: Optional[int] = None) -> dict:
    """CTAs per launch of a gi/gw stage kernel on one layer, and what that is in waves of ``sms`` SMs.

    gi (``dA_stage [Nout, P64, Bchunk]``, batch chunked so the fp16 stage fits ``stage_budget``):
    ``gi2`` grid ``(Nout, Bchunk/tile_b)`` with the P loop inside the CTA; ``gi3`` grid
    ``(Nout, P64/tile_p, Bchunk/tile_b)``. gw (``dWeff [nc, P64, Cout_pad]``, nodes chunked the same
    way; ``stage_budget`` default: the staged adjoints' own, ``grad_stage_budget_bytes()``, the chunks as even as
    the plans make them): ``gw2`` ``(nc, Cout_pad/tile_n)``; ``gw3`` ``(nc, P64/tile_p, Cout_pad/tile_n)``; ``gw4`` as gw3
    with two o tiles per CTA. ``p`` variants (register prefetch) have their base version's grid.

    Returns dict: dims and ctas of the first (full) launch, launches (chunks), chunk (batch columns
    of a gi launch / nodes of a gw launch), waves (ctas / sms), steps_per_cta (tile GEMMs one CTA
    runs), ctas_per_sm.
    """
    point = adjoint_point(kind, config)                # (a KeyError names a config that is no kernel of the kind)
    fam = point.owner
    spec = fam.spec(point)
    if stage_budget is None:
        from fovi_lab.kernels.adjoint.configs import grad_stage_budget_bytes
        stage_budget = grad_stage_budget_bytes()
    itemsize = 4 if point["stage"] == "fp32" else 2
    p64, pairs = shape["p64"], fam.pairs(point)
    chunk, launches, nodes, columns, contraction = _CHUNKS[fam.gradient](
        spec, int(batch), shape["nout"], p64, shape["cout"], itemsize, stage_budget, pairs)
    dims = fam.grid(spec, nodes, p64, columns)
    p_loop = p64 // spec["tile_p"] if len(dims) == 2 else 1          # (a 2-D grid runs the p tiles in the CTA)
    steps = contraction // spec[fam.spec_inner] * p_loop * pairs
    ctas = int(np.prod(dims))
    return {"kind": kind, "config": config, "dims": tuple(int(d) for d in dims), "ctas": ctas,
            "launches": int(launches), "chunk": int(chunk), "waves": ctas / sms, "ctas_per_sm": ctas / sms,
            "steps_per_cta": int(steps)}


def occupancy_table(batch: int = 512, layers: Optional[Sequence[str]] = None, rf: Optional[str] = None,
                    gi_configs: Sequence[str] = ("gi2_p64b128", "gi3_p64b128"),
                    gw_configs: Sequence[str] = ("gw2_p64n128", "gw3_p64n128", "gw4_p64n128"),
                    sms: int = H200_SMS) -> List[dict]:
    """:func:`adjoint_grid` for every (layer, config): rows with layer, kind, config, ctas, waves, ..."""
    layers = list(layers or LAYERS)
    rows = []
    for name in layers:
        s = shape_of(name, rf=rf)
        for kind, cfgs in (("gi", gi_configs), ("gw", gw_configs)):
            for c in cfgs:
                row = adjoint_grid(kind, c, s, batch, sms)
                row["layer"] = name
                rows.append(row)
    return rows


def occupancy_figure(batches: Sequence[int] = (64, 512), layers: Optional[Sequence[str]] = None,
                     gi_configs: Sequence[str] = ("gi2_p64b128", "gi3_p64b128"),
                     gw_configs: Sequence[str] = ("gw2_p64n128", "gw3_p64n128", "gw4_p64n128"),
                     sms: int = H200_SMS, height: int = 580) -> go.Figure:
    """CTAs per launch of each gi/gw grid on every layer (log scale), against one wave of ``sms`` SMs
    and four CTAs per SM; a column of buttons beside the plot picks the batch (and the title's), the legend stands
    between the title and the plot."""
    layers = list(layers or LAYERS)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("grad-input stage (dA)", "grad-weight stage (dWeff)"))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"]
    n_per_b = len(gi_configs) + len(gw_configs)
    for bi, b in enumerate(batches):
        rows = occupancy_table(b, layers, gi_configs=gi_configs, gw_configs=gw_configs, sms=sms)
        for kind, cfgs, row in (("gi", gi_configs, 1), ("gw", gw_configs, 2)):
            for ci, c in enumerate(cfgs):
                sel = [x for x in rows if x["config"] == c]
                fig.add_trace(go.Bar(x=[x["layer"] for x in sel], y=[x["ctas"] for x in sel], name=stage_label(c) or c,
                                     marker_color=palette[ci % len(palette)], visible=bi == len(batches) - 1,
                                     customdata=[[x["waves"], x["steps_per_cta"], x["launches"]] for x in sel],
                                     hovertemplate="%{x}: %{y} CTAs = %{customdata[0]:.2f} waves, "
                                                   "%{customdata[1]} tile GEMMs per CTA, %{customdata[2]} launch(es)"
                                                   "<extra>" + c + "</extra>"),
                              row=row, col=1)
    all_ctas = [c for t in fig.data for c in t.y]
    for row in (1, 2):
        fig.add_trace(hline(layers, sms, f"{sms} CTAs: one per SM", "black", "solid", showlegend=row == 1),
                      row=row, col=1)
        fig.add_trace(hline(layers, 4 * sms, "4 CTAs per SM", "black", "dot", showlegend=row == 1), row=row, col=1)
        fig.update_yaxes(type="log", title_text="launch size (CTAs)", range=log_range(all_ctas + [sms, 4 * sms]),
                         row=row, col=1)
    fig.update_xaxes(title_text="layer", row=2, col=1)

    def title(b: int) -> str:
        return figure_layout.wrapped_title(f"CTAs per stage launch at B = {b} (H200: {sms} SMs)")[0]
    buttons = []
    for bi, b in enumerate(batches):
        vis = [False] * (n_per_b * len(batches)) + [True] * 4          # the four reference lines stay
        vis[bi * n_per_b:(bi + 1) * n_per_b] = [True] * n_per_b
        buttons.append(dict(label=f"B = {b}", method="update", args=[{"visible": vis}, {"title.text": title(b)}]))
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10),
                      updatemenus=[dict(buttons=buttons, direction="right", x=1.0, xanchor="right", y=1.12,
                                        active=len(batches) - 1, type="buttons")])
    figure_layout.headed(fig, height, f"CTAs per stage launch at B = {batches[-1]} (H200: {sms} SMs)")
    return readable_log_axes(fig)


def explore_adjoint(layer: str = "res18_layer1", batch: int = 64, cout: Optional[int] = None,
                    gi_config: str = "gi2_p64b64", gw_config: str = "gw3_p64n64", rf: Optional[str] = None,
                    device: Optional[str] = None, log: Optional[RunLog] = None, budget: float = CPU_WORK_BUDGET,
                    seed: int = 0) -> Tuple[dict, go.Figure]:
    """Run the Warp adjoints (``gi_config`` stage + dx reverse-CSR reduction, ``gw_config`` stage + dW
    reduction) on ``layer`` and check them against torch autograd of the fp32 oracle.

    Compile time (build + canary of the four kernels, 0 when already built) and run time (both
    gradients, whole ops) are reported apart; each gradient is run twice and compared bitwise. On the
    CPU the batch, then the output nodes, are clamped to ``budget`` FLOPs of tile work per stage.

    Returns ``(result, figure)`` like :func:`explore_forward`; result keys include ``err_dx``, ``err_dw``,
    ``parity_dx``, ``parity_dw``, ``deterministic``, ``gi_ctas``, ``gw_ctas``.
    """
    from fovi_lab.kernels import adjoint as wa
    from fovi_lab.ops.reference import CompactTorchOps
    result = {"ok": False, "passed": False, "layer": layer, "batch_requested": batch, "cout_requested": cout,
              "gi_config": gi_config, "gw_config": gw_config}
    problem = check_explore_args(layer, batch, cout, rf)
    gi_names = sorted(wa.GRAD_INPUT_CONFIG_SPECS) + sorted(n + "_f32" for n in wa.GRAD_INPUT_CONFIG_SPECS)
    gw_names = sorted(wa.GRAD_WEIGHT_CONFIG_SPECS) + sorted(n + "_f32" for n in wa.GRAD_WEIGHT_CONFIG_SPECS)
    if problem is None and gi_config not in gi_names:
        problem = f"gi config must be one of {', '.join(sorted(wa.GRAD_INPUT_CONFIG_SPECS))} (optionally + '_f32'), got {gi_config!r}"
    if problem is None and gw_config not in gw_names:
        problem = f"gw config must be one of {', '.join(sorted(wa.GRAD_WEIGHT_CONFIG_SPECS))} (optionally + '_f32'), got {gw_config!r}"
    if problem is not None:
        return fail_result(result, log, problem)
    try:
        dev = widget_device(device, wa.normalize_device)
        shape = shape_of(make_meta(layer, cout, rf))
        gis, gws = _stage_spec("gi", gi_config), _stage_spec("gw", gw_config)

        def work(bb, nn):
            s = dict(shape, nout=nn)
            gi_w = 2.0 * nn * s["p64"] * pad_to(s["cout"], gis["tile_o"]) * pad_to(bb, gis["tile_b"])
            gw_w = 2.0 * nn * s["p64"] * pad_to(s["cout"], gws["tile_n"] * 2) * pad_to(bb, 64)
            return max(gi_w, gw_w)

        b, nodes, note = clamp_shape(shape, batch, work, dev, budget, tile_rows=max(gis["tile_b"], 64))
        pb = make_problem(layer, b, cout, rf, seed=seed, device="cpu" if dev == "cpu" else dev, nodes=nodes,
                          bias=False)
        meta = pb.meta
        t0 = time.perf_counter()
        built_now = False
        names = [("gi", gi_config), ("csr", "dx_f32" if gi_config.endswith("_f32") else "dx_f16"),
                 ("gw", gw_config), ("csr", "dw_f32" if gw_config.endswith("_f32") else "dw_f16")]
        for kind, name in names:
            built_now |= not wa.GRAD_KERNELS.has((kind, name), dev)
            k = wa.get_grad_kernel(kind, name, dev)
            if k is None:
                why = wa.GRAD_KERNELS.why((kind, name), dev)
                result["compile_s"] = time.perf_counter() - t0
                return fail_result(result, log, f"unlaunchable on this device: {kind} kernel {name} ({why})")
        compile_s = time.perf_counter() - t0 if built_now else 0.0
        dx = wa.grad_input(meta, pb.grad_y, pb.weight, config=gi_config)
        dw = wa.grad_weight(meta, pb.grad_y, pb.x, config=gw_config)
        dx2 = wa.grad_input(meta, pb.grad_y, pb.weight, config=gi_config)
        dw2 = wa.grad_weight(meta, pb.grad_y, pb.x, config=gw_config)
        det = bool(torch.equal(dx, dx2) and torch.equal(dw, dw2))
        rdx, rdw, ref_name = reference_grads(meta, pb.x, pb.weight, pb.grad_y)
        err_dx = rel_error(dx, rdx, floor=1e-30)
        err_dw = rel_error(dw, rdw, floor=1e-30)
        tol = 1e-2
        run_ms = time_ms(lambda: (wa.grad_input(meta, pb.grad_y, pb.weight, config=gi_config),
                                   wa.grad_weight(meta, pb.grad_y, pb.x, config=gw_config)), dev)
        if dev == "cpu":
            gf, wf, xf = pb.grad_y.float(), pb.weight.float(), pb.x.float()
        else:
            gf, wf, xf = pb.grad_y, pb.weight, pb.x
        torch_ms = time_ms(lambda: (CompactTorchOps.grad_input(meta, gf, wf),
                                     CompactTorchOps.grad_weight(meta, gf, xf)), dev)
        s = shape_of(meta)
        gi_grid = adjoint_grid("gi", gi_config, s, b)
        gw_grid = adjoint_grid("gw", gw_config, s, b)
        tag = f"{layer} (B={b}, Cout={meta.cout})"
        result.update(
            ok=True, passed=bool(err_dx <= tol and err_dw <= tol), batch=b, nodes=meta.nout, cout=meta.cout,
            clamp=note, err_dx=err_dx, err_dw=err_dw, tolerance=tol, reference=ref_name, deterministic=det,
            parity_dx=parity_line(f"{short_label(gi_config)} + reverse-CSR reduction, on {tag} vs {ref_name}", err_dx,
                                  tol),
            parity_dw=parity_line(f"{short_label(gw_config)} + weight-row reduction, on {tag} vs {ref_name}", err_dw,
                                  tol),
            compile_s=compile_s, run_ms=run_ms, torch_ms=torch_ms,
            torch_name="torch_compact adjoints (fp32 on the CPU)" if dev == "cpu" else "torch_compact adjoints (fp16)",
            gi_ctas=gi_grid["ctas"], gw_ctas=gw_grid["ctas"],
            label=f"{layer} B={b} {short_label(gi_config)} + {short_label(gw_config)}",
            device=dev,
        )
        result["message"] = (f"{'PASS' if result['passed'] else 'FAIL'}  dx {tolerance_class(err_dx)}, "
                             f"dW {tolerance_class(err_dw)} vs {ref_name}; "
                             f"bitwise identical on a second run: {'yes' if det else 'NO'}"
                             + (f"  [{note}]" if note else ""))
        return result_answer(result, log)
    except Exception as exc:  # noqa: BLE001 - the widget must answer with a message
        return fail_result(result, log, f"could not run: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")


# ------------------------------------------------------------------------------------- recorded tables

def short_impl(impl: str) -> str:
    """A recorded PyTorch impl as table text: ``torch_autograd_gather_bmm_graphed`` -> ``autograd gather_bmm``,
    ``torch_binned`` -> ``binned``."""
    s = impl[:-len("_graphed")] if impl.endswith("_graphed") else impl
    return s.replace("torch_autograd_", "autograd ").replace("torch_", "")


def gi_gw_sweep_table(layer: str, batch: int, records: Optional[List[dict]] = None,
                      only: Optional[Sequence[str]] = None) -> str:
    """The recorded gi / gw sweep of one layer and batch as text (the latest sweep run of that shape, the records
    :func:`fovi_lab.lab.records.gi_gw_sweep_figure` draws, reverse-CSR dW finish): per config the whole backward
    (ms), the stage kernel alone (ms), the stage as a share of Warp's dense tile GEMM with its tiles (%, ``-`` where
    none was timed) and its reduction's stream rate (GB/s). ``only``: keep the configs starting with one of these."""
    from fovi_lab.lab.records import backward_records, record_runs, versions_title
    records = backward_records() if records is None else records
    sweep = [r for r in records if r.get("impl") in ("warp_gi", "warp_gw") and r.get("B") == batch
             and r.get("layer") == layer and (r.get("gi_stage_ms") or r.get("gw_stage_ms"))
             and r.get("gw_finish", "csr") in (None, "csr")]
    runs = record_runs(sweep).get((layer, batch, "backward"))
    if not runs:
        return f"no recorded gi/gw sweep of {layer} at B = {batch}"
    latest = {}
    for r in runs[-1]:
        latest[(r["impl"], r["config"])] = r
    rows = [(short_label(cfg), impl[len("warp_"):], r) for (impl, cfg), r in sorted(latest.items())
            if not only or cfg.startswith(tuple(only))]
    width = max([len(w) for w, _, _ in rows] + [len("stage config")])
    lines = [f"{layer}, B = {batch}, {versions_title(runs[-1])}",
             f"{'stage config':{width}s} {'backward ms':>12s} {'stage ms':>9s} {'% of dense':>11s} {'reduction GB/s':>15s}"]
    for words, kind, r in rows:
        frac = r.get(f"{kind}_frac_dense")
        gbps = r.get(f"{adjoint_family(kind).sum_target}_reduce_gbps")     # (the stage's reverse-list sum)
        lines.append(f"{words:{width}s} {r['ms']:12.3f} {r[f'{kind}_stage_ms']:9.3f} "
                     f"{f'{100 * frac:.0f}' if frac else '-':>11s} {f'{gbps:.0f}' if gbps else '-':>15s}")
    return "\n".join(lines)
