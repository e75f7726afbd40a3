"""Notebook 06: the fused node-major adjoints against the staged ones of notebook 05 (logic and figures).

* :func:`stage_bytes_table`: the memory argument, per layer: what the staged pipelines write and read
  back (the stage buffers) against what the fused kernels need (g in node-major order, dW partials).
* :func:`explore_fused`: run both fused kernels on this machine, check them against torch autograd of
  the fp32 oracle and against the staged kernels, and check that a second run is bitwise identical.
* :func:`list_length_table`, :func:`segments_sweep_figure`: why one list can set a fused kernel's time,
  and the recorded H200 sweep of whole lists against balanced segments.
* :func:`fused_vs_staged_figure`, :func:`graphed_step_figure`: the recorded H200 train steps, and as text
  :func:`staged_step_table` (notebook 05, section 7), :func:`train_step_table`, :func:`graphed_step_table` and
  :func:`segments_sweep_table`.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from fovi_lab.lab.common import readable_log_axes
from fovi_lab import lab as kl
import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.lab.adjoint_explorer import short_impl
from fovi_lab.lab.labels import short_label
from fovi_lab.graph.layers import layer_meta

__all__ = ["stage_bytes_table", "explore_fused", "explore_fused_run", "train_step_runs", "fused_vs_staged_figure",
           "graphed_step_figure", "list_length_table", "segments_sweep_figure", "staged_step_table", "train_step_table",
           "graphed_step_table", "segments_sweep_table", "FINISH_RECORDS", "finish_ab_table"]

_MIB = 1 << 20


def stage_bytes_table(layers: Sequence[str] = ("alex_L0", "alex_L1", "alex_L3", "res18_layer1", "res18_layer3"),
                      batch: int = 512) -> List[dict]:
    """Per layer at ``batch``: bytes the staged pipelines stage (written once, read back once: fp16 dA
    ``[Nout, P64, B]`` and dWeff ``[Nout, P64, Cout]``, before chunking) against the fused path's extra
    operands (g node-major ``[Nout, Cout, B]`` fp16 and the dW partials, ``S x [V, Cout, Cin]`` fp32
    with the split S its rule picks on the H200) and the gradients themselves (dx, dW fp32)."""
    from fovi_lab.kernels.adjoint import DW_NM_CONFIG_SPECS, WAVE_CTAS, select_dw_nm_config
    from fovi_lab.graph.meta import pad_to
    rows = []
    for name in layers:
        m = layer_meta(name)
        staged = 2 * m.nout * m.p64 * batch + 2 * m.nout * m.p64 * pad_to(m.cout, 64)
        to, tc, _, _ = DW_NM_CONFIG_SPECS[select_dw_nm_config(m.cout, m.cin)]
        op, cp = pad_to(m.cout, to), pad_to(m.cin, tc)
        tiles = (op // to) * (cp // tc)
        split = 16 if m.v * tiles < WAVE_CTAS else 8
        split = max(1, min(split, (64 * _MIB) // (4 * m.v * op * cp)))
        split = 1 << (split.bit_length() - 1)
        fused = 2 * m.nout * op * batch + 4 * split * m.v * op * cp
        grads = 4 * (batch * m.cin * m.nin + m.cout * m.q)
        rows.append(dict(layer=name, B=batch, staged_mib=staged / _MIB, fused_mib=fused / _MIB,
                         grads_mib=grads / _MIB, ratio=staged / fused))
    return rows


def explore_fused(shape: str = "PAD_HEAVY", batch: int = 40, device=None) -> dict:
    """Fused dx and dW on ``shape`` (a synthetic shape name or a layer name, clamped on the CPU):
    parity lines against torch autograd of the fp32 oracle and against the staged kernels, bitwise
    determinism over two runs, the configs the rules picked and the run times."""
    from fovi_lab.kernels import adjoint as wa
    from fovi_lab.kernels import adjoint as nm
    device = kl.default_device() if device is None else device
    pb = kl.make_problem(shape, batch=batch, device=device, bias=False)
    m = pb.meta
    t0 = time.perf_counter()
    px = nm.plan_grad_input_nm(m, pb.grad_y, pb.weight)
    pw = nm.plan_grad_weight_nm(m, pb.grad_y, pb.x)
    dx, dw = px.run(), pw.run()
    t_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    dx2 = nm.grad_input_nm(m, pb.grad_y, pb.weight)
    dw2 = nm.grad_weight_nm(m, pb.grad_y, pb.x, nsplit=pw.nsplit)
    t_second = time.perf_counter() - t0
    rdx, rdw, ref_name = kl.reference_grads(m, pb.x, pb.weight, pb.grad_y)
    sdx, sdw = wa.grad_input(m, pb.grad_y, pb.weight), wa.grad_weight(m, pb.grad_y, pb.x)
    tol = 1e-2                                 # relative to max|ref|, as notebook 05's other checks
    err_dx, err_dw = kl.rel_error(dx, rdx, floor=1e-30), kl.rel_error(dw, rdw, floor=1e-30)
    return dict(
        shape=shape, B=pb.batch, dx_config=px.k.name, dw_config=pw.k.name, dw_split=pw.nsplit,
        err_dx=err_dx, err_dw=err_dw, passed=bool(err_dx <= tol and err_dw <= tol),
        parity_dx=kl.parity_line(f"{short_label(px.k.name)}, vs {ref_name}", err_dx, tol),
        parity_dw=kl.parity_line(f"{short_label(pw.k.name)}, list split {pw.nsplit}, vs {ref_name}", err_dw, tol),
        vs_staged=kl.parity_line("fused vs staged kernels (another fp32 summation order)",
                                 max(kl.rel_error(dx, sdx, floor=1e-30), kl.rel_error(dw, sdw, floor=1e-30)), tol),
        deterministic=bool(torch.equal(dx, dx2) and torch.equal(dw, dw2)),
        first_s=t_first, second_s=t_second)


# ------------------------------------------------------------------------------------- recorded data

def train_step_runs(records: Optional[List[dict]] = None,
                    need: Sequence[str] = ("warp_train", "warp_train_staged")) -> Dict[tuple, dict]:
    """``(layer, B) -> {impl: record}`` from the most recent recorded train-step run of each shape that
    measured every impl in ``need`` (default: both paths, the staged one next to the backend's own) with
    ``warp_train`` on these kernels: runs where it took the tensor-core adjoints (``path`` ``"mma"``, notebook 12)
    are left out."""
    records = kl.backward_records(mode="train-step") if records is None else records
    runs: Dict[tuple, Dict[tuple, Dict[str, dict]]] = {}
    for r in records:
        if r.get("mode") != "train-step" or not r.get("ms"):
            continue
        key = (r.get("layer"), r.get("B"))
        run = (str(r.get("date", "")), r.get("_file", ""))
        runs.setdefault(key, {}).setdefault(run, {})[r["impl"]] = r
    out = {}
    for key, by_run in runs.items():
        ok = [rk for rk, d in by_run.items() if all(n in d for n in need)
              and not any(t in str(d.get("warp_train", {}).get("path", "")) for t in ("mma", "taps"))]
        if ok:
            out[key] = by_run[max(ok)]
    return out


def _axes(runs: Dict[tuple, dict]):
    """(batches, layers in table order, the batch shown first: 64 where recorded) of :func:`train_step_runs`."""
    bs = sorted({b for _, b in runs})
    return bs, kl.layer_order(l for l, _ in runs), 64 if 64 in bs else bs[0]


def _fused_of(d: Dict[str, dict]) -> Optional[dict]:
    r = d.get("warp_train")
    if r is not None and r.get("path") == "fused":
        return r
    return d.get("warp_train_fused")


def _best_torch(d: Dict[str, dict], graphed: bool) -> Optional[dict]:
    rows = [r for k, r in d.items() if k.startswith("torch") and bool(r.get("graphed")) == graphed]
    return min(rows, key=lambda r: r["ms"]) if rows else None


def fused_vs_staged_figure(records: Optional[List[dict]] = None, height: int = 640) -> go.Figure:
    """Recorded train step (forward + dx + dW) per layer: staged path, fused path and the fastest PyTorch
    step (ms, log axis), and below it each one's peak memory (MiB); a column of buttons beside the plot picks B, the
    legend stands between the title and the plot."""
    runs = train_step_runs(records)
    if not runs:
        return kl.message_figure("no recorded train step with both adjoint paths yet "
                                 "(python -m fovi_lab bench train-step on a GPU)")
    bs, layers, default_b = _axes(runs)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("train step (ms, log)", "peak memory of one step (MiB, log)"))
    series = (("staged (seed design)", lambda d: d.get("warp_train_staged"), kl.COLOURS["grey"]),
              ("fused (node-major)", _fused_of, kl.COLOURS["warp"]),
              ("fastest PyTorch", lambda d: _best_torch(d, False), kl.COLOURS["torch"]))
    per_b = 2 * len(series)
    for b in bs:
        for name, pick, colour in series:
            recs = [pick(runs[(l, b)]) if (l, b) in runs else None for l in layers]
            fig.add_trace(go.Bar(x=layers, y=[kl.round4(r["ms"]) if r else None for r in recs], name=name,
                                 marker_color=colour, visible=b == default_b, legendgroup=name,
                                 hovertext=[r["impl"] if r else "" for r in recs]), row=1, col=1)
            fig.add_trace(go.Bar(x=layers, y=[kl.round4(r.get("peak_mib")) if r else None for r in recs], name=name,
                                 marker_color=colour, visible=b == default_b, legendgroup=name, showlegend=False),
                          row=2, col=1)
    used = [r for d in runs.values() for r in d.values()]
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10),
                      updatemenus=kl.batch_menu(bs, per_b, default_b))
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="train step (ms)", row=1, col=1)
    fig.update_yaxes(title_text="peak memory (MiB)", row=2, col=1)
    fig.update_xaxes(title_text="layer", row=2, col=1)
    figure_layout.headed(fig, height, "train step: staged vs fused adjoints vs PyTorch", kl.recorded_message(used))
    return readable_log_axes(fig)


def graphed_step_figure(records: Optional[List[dict]] = None, height: int = 520) -> go.Figure:
    """Recorded train step replayed from a CUDA graph (no per-call host work) against the fastest
    PyTorch step replayed the same way, per layer; eager ``warp_train`` as markers (one call at a time,
    and back to back: ``pipelined_ms``, where recorded); a column of buttons beside the plot picks B."""
    runs = train_step_runs(records, need=("warp_train", "warp_train_graphed"))
    if not runs:
        return kl.message_figure("no recorded CUDA-graph train step yet "
                                 "(python -m fovi_lab bench train-step --graphs on a GPU)")
    bs, layers, default_b = _axes(runs)
    fig = go.Figure()
    per_b = 4
    for b in bs:
        get = lambda f: [f(runs[(l, b)]) if (l, b) in runs else None for l in layers]  # noqa: E731
        w = get(lambda d: d.get("warp_train_graphed"))
        t = get(lambda d: _best_torch(d, True))
        e = get(lambda d: d.get("warp_train"))
        fig.add_trace(go.Bar(x=layers, y=[kl.round4(r["ms"]) if r else None for r in w], name="warp_train, graph replay",
                             marker_color=kl.COLOURS["warp"], visible=b == default_b))
        fig.add_trace(go.Bar(x=layers, y=[kl.round4(r["ms"]) if r else None for r in t],
                             name="fastest PyTorch, graph replay", marker_color=kl.COLOURS["torch"],
                             visible=b == default_b, hovertext=[r["impl"] if r else "" for r in t]))
        fig.add_trace(go.Scatter(x=layers, y=[kl.round4(r["ms"]) if r else None for r in e], mode="markers",
                                 name="warp_train, eager (one call)", marker=dict(symbol="line-ew-open", size=16),
                                 visible=b == default_b))
        fig.add_trace(go.Scatter(x=layers, y=[kl.round4(r.get("pipelined_ms")) if r else None for r in e],
                                 mode="markers", name="warp_train, eager back to back (pipelined)",
                                 marker=dict(symbol="circle-open", size=9), visible=b == default_b))
    used = [r for d in runs.values() for r in d.values()]
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10),
                      yaxis_type="log", yaxis_title="train step (ms)", xaxis_title="layer",
                      updatemenus=kl.batch_menu(bs, per_b, default_b))
    figure_layout.headed(fig, height, "train step replayed from a CUDA graph, both sides", kl.recorded_message(used))
    return readable_log_axes(fig)


def _ms(r: Optional[dict], key: str = "ms") -> str:
    return f"{r[key]:.3f}" if r and r.get(key) else "-"


def _pct(v: Optional[float]) -> str:
    return f"{100 * v:.0f}" if v else "-"


def staged_step_table(records: Optional[List[dict]] = None) -> str:
    """The staged pipelines' recorded train step (``warp_train_staged``: forward + gi/gw stages + reductions) on the
    shapes the fovi library's own Warp step was timed on (:data:`fovi_lab.bench.backward.SEED_TRAIN_STEP_MS`), with
    the fastest eager PyTorch step of the same run, one line per (layer, B). The runs are those of
    :func:`train_step_runs` (the latest that timed both adjoint paths)."""
    from fovi_lab.bench.backward import SEED_TRAIN_STEP_MS
    runs = train_step_runs(records)
    lines = [f"{'layer':14s} {'B':>4s} {'staged ms':>10s} {'fovi lib ms':>12s} {'fastest PyTorch':>22s} {'ms':>7s} "
             f"{'bitwise repeatable':>19s}"]
    for (layer, b), seed in sorted(SEED_TRAIN_STEP_MS.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        d = runs.get((layer, b))
        if not d:
            continue
        st, t = d["warp_train_staged"], _best_torch(d, False)
        lines.append(f"{layer:14s} {b:4d} {st['ms']:10.3f} {seed:12.2f} {short_impl(t['impl']):>22s} {t['ms']:7.3f} "
                     f"{'yes' if st.get('deterministic') else 'no':>19s}")
    return "\n".join(lines)


def _step_table(runs: dict, batches: Sequence[int], empty: str, header: str, row) -> str:
    """A text table of recorded train-step runs: ``header``, then ``row(b, layer, run)`` for every run at
    ``batches``, batch-major, in the figures' layer order (``empty`` where nothing is recorded)."""
    if not runs:
        return empty
    bs, layers, _ = _axes(runs)
    return "\n".join([header] + [row(b, l, runs[(l, b)]) for b in bs if b in batches for l in layers
                                  if (l, b) in runs])


def train_step_table(batches: Sequence[int] = (16, 64, 512), records: Optional[List[dict]] = None) -> str:
    """The bars of :func:`fused_vs_staged_figure` as text, one line per (B, layer) of :func:`train_step_runs`: the
    path ``warp_train`` took, the staged and fused steps (ms) and staged / fused, the fastest eager PyTorch step
    (ms) and PyTorch / warp_train (above 1: Warp is faster), warp_train's peak memory over that PyTorch step's, and
    each fused kernel alone as a share of Warp's dense tile GEMM with its tiles and grid (%)."""
    def row(b, l, d):
        st, fu, t, w = d.get("warp_train_staged"), _fused_of(d), _best_torch(d, False), d["warp_train"]
        ratio = f"{st['ms'] / fu['ms']:.2f}" if st and fu else "-"
        vs = f"{t['ms'] / w['ms']:.2f}" if t else "-"
        peak = f"{w['peak_mib'] / t['peak_mib']:.2f}" if t and w.get("peak_mib") and t.get("peak_mib") else "-"
        return (f"{b:3d} {l:14s} {w.get('path') or '-':6s} {_ms(st):>7s} {_ms(fu):>7s} {ratio:>5s} "
                f"{short_impl(t['impl']) if t else '-':>21s} {_ms(t):>7s} {vs:>8s} {peak:>5s} "
                f"{_pct(fu.get('dx_frac_dense') if fu else None):>4s} "
                f"{_pct(fu.get('dw_frac_dense') if fu else None):>4s}")
    return _step_table(train_step_runs(records), batches, "no recorded train step with both adjoint paths yet",
                       f"{'B':>3s} {'layer':14s} {'path':6s} {'staged':>7s} {'fused':>7s} {'st/fu':>5s} "
                       f"{'fastest PyTorch':>21s} {'ms':>7s} {'PyT/warp':>8s} {'peak':>5s} {'dx%':>4s} {'dW%':>4s}", row)


def graphed_step_table(batches: Sequence[int] = (16, 64, 512), records: Optional[List[dict]] = None) -> str:
    """The bars and markers of :func:`graphed_step_figure` as text, one line per (B, layer): warp_train replayed
    from a CUDA graph, the fastest PyTorch step replayed the same way and PyTorch / Warp (above 1: Warp is
    faster), and warp_train eager, one call at a time and back to back (ms)."""
    def row(b, l, d):
        w, t, e = d["warp_train_graphed"], _best_torch(d, True), d["warp_train"]
        vs = f"{t['ms'] / w['ms']:.2f}" if t else "-"
        return (f"{b:3d} {l:14s} {_ms(w):>10s} {short_impl(t['impl']) if t else '-':>22s} {_ms(t):>7s} "
                f"{vs:>8s} {_ms(e):>10s} {_ms(e, 'pipelined_ms'):>12s}")
    return _step_table(train_step_runs(records, need=("warp_train", "warp_train_graphed")), batches,
                       "no recorded CUDA-graph train step yet",
                       f"{'B':>3s} {'layer':14s} {'Warp graph':>10s} {'fastest PyTorch graph':>22s} {'ms':>7s} "
                       f"{'PyT/warp':>8s} {'eager call':>10s} {'back to back':>12s}", row)


# ------------------------------------------------------------------------------------- segments

def _plan_label(plan) -> str:
    """The plan's tiles in words (:func:`~fovi_lab.lab.labels.short_label`), with its segments
    (``64x64, 64-deep, in segments of 4 steps (112 segments)``) or its dW split (``64x64, 32-deep, split 4 ways``)."""
    words = short_label(plan.k.name, title=False)
    if getattr(plan, "seg_steps", None):
        return f"{words}, in segments of {plan.seg_steps} steps ({plan.dims[0]} segments)"
    if getattr(plan, "nsplit", None) is not None:             # a dW plan over whole lists: split into partials
        return f"{words}, split {plan.nsplit} way{'s' if plan.nsplit != 1 else ''}"
    return words


def list_length_table(layers: Sequence[str] = ("res18_layer1", "res18_layer2_0", "res18_layer2", "res18_layer3_0",
                                               "res18_layer3", "res18_layer4_0", "alex_L1", "alex_L3"),
                      batch: int = 64) -> List[dict]:
    """Per layer: the reverse lists of dx (input nodes: count, mean and longest length) and the tap lists
    of dW (taps, mean, longest), and the segment lengths the default rules pick on a GPU at ``batch``."""
    from fovi_lab.kernels import adjoint as nm
    from fovi_lab.graph.layers import layer_meta
    rows = []
    for name in layers:
        m = layer_meta(name)
        dmean, dmax, _, dbusy = nm.list_stats(m, "dx")
        wmean, wmax, _, wbusy = nm.list_stats(m, "dw")
        tiles = nm.DW_NM_CONFIG_SPECS[nm.select_dw_nm_config(m.cout, m.cin, batch)]
        rows.append(dict(layer=name, nin=m.nin, dx_lists=dbusy, dx_mean=dmean, dx_max=dmax, taps=m.v, dw_lists=wbusy,
                         dw_mean=wmean, dw_max=wmax, dx_seg=nm.default_dx_seg_steps(m, batch, "cuda:0"),
                         dw_seg=nm.default_dw_seg_steps(m, batch, tiles, "cuda:0")))
    return rows


def _fused_sweep_records(path: Optional[str] = None) -> List[dict]:
    """The recorded fused sweep: the shipped ``fused_sweep`` records, or the JSON-lines file ``path``."""
    import json
    from pathlib import Path
    if path:
        p = Path(path)
        return [json.loads(line) for line in p.read_text().splitlines() if line.strip()] if p.exists() else []
    return kl.kind_records("fused_sweep")


def _fastest(recs: List[dict], layer: str, impl: str) -> Optional[dict]:
    rows = [r for r in recs if r["layer"] == layer and r["impl"] == impl]
    return min(rows, key=lambda r: r["ms"]) if rows else None


def segments_sweep_table(batches: Sequence[int] = (16, 64, 512), path: Optional[str] = None) -> str:
    """The bars of :func:`segments_sweep_figure` as text, one line per (B, layer): the fastest whole-list dx
    (``dxn``), dx in segments (``dxs``, with its segment length L), dW with interleaved splits (``dwn``, with its
    split) and dW in segments (``dws``), kernels alone (ms), each with its tiles in words."""
    recs = [r for r in _fused_sweep_records(path) if r.get("ms")]
    if not recs:
        return "no recorded fused sweep"
    lines = [f"{'B':>3s} {'layer':14s} {'dx whole lists':>22s} {'dx segments':>27s} {'dW splits':>27s} "
             f"{'dW segments':>28s}"]

    def cell(r, extra):
        return f"{r['ms']:.3f} {short_label(r['config'], title=False)}{extra(r)}" if r else "-"

    def seg(r):
        return f" L={r['seg_steps']}"

    def split(r):
        return f" x{r.get('nsplit') or 1}"

    for b in batches:
        rb = [r for r in recs if r.get("B") == b]
        for l in kl.layer_order(r["layer"] for r in rb):
            dxn, dxs, dwn, dws = (_fastest(rb, l, i) for i in ("warp_dxn", "warp_dxs", "warp_dwn", "warp_dws"))
            lines.append(f"{b:3d} {l:14s} {cell(dxn, lambda r: ''):>22s} {cell(dxs, seg):>27s} "
                         f"{cell(dwn, split):>27s} {cell(dws, seg):>28s}")
    return "\n".join(lines)


def segments_sweep_figure(batch: int = 64, path: Optional[str] = None, height: int = 540) -> go.Figure:
    """The recorded fused sweep (the shipped ``fused_sweep`` records, or the JSON-lines file ``path``): per layer at ``batch``, the
    fastest whole-list dx (``dxn``) against the fastest dx in segments (``dxs``), and the fastest dW with
    interleaved splits (``dwn``) against the fastest in segments (``dws``), kernels alone (ms, log axis);
    the hover text names the tiles and the split or segment length."""
    recs = _fused_sweep_records(path)
    if not recs:
        return kl.message_figure("no recorded fused sweep (python -m fovi_lab.bench.backward backward "
                                 "--sweep-fused --fused-only on a GPU)")
    recs = [r for r in recs if r.get("ms") and r.get("B") == batch]
    if not recs:
        return kl.message_figure(f"the recorded sweep has no B = {batch}")
    layers = kl.layer_order(r["layer"] for r in recs)
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"dx kernel, B = {batch} (ms)", f"dW kernel, B = {batch} (ms)"))
    series = (("dx", "warp_dxn", "whole lists", kl.COLOURS["grey"], 1), ("dx", "warp_dxs", "segments",
                                                                          kl.COLOURS["warp"], 1),
              ("dw", "warp_dwn", "interleaved splits", kl.COLOURS["grey"], 2), ("dw", "warp_dws", "segments",
                                                                                  kl.COLOURS["warp"], 2))
    for what, impl, name, colour, col in series:
        best = [_fastest(recs, l, impl) for l in layers]
        hover = [f"{r['config']} " + (f"L={r['seg_steps']}" if r.get("seg_steps") else f"x{r.get('nsplit') or 1}")
                 + (f", {100 * r['frac_dense']:.0f}% of the dense ceiling" if r.get("frac_dense") else "")
                 if r else "" for r in best]
        fig.add_trace(go.Bar(x=layers, y=[kl.round4(r["ms"]) if r else None for r in best], name=name,
                             marker_color=colour, hovertext=hover, legendgroup=f"{what}{name}",
                             showlegend=True), row=1, col=col)
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10))
    fig.update_yaxes(type="log", title_text="kernel time (ms)")
    fig.update_xaxes(title_text="layer")
    figure_layout.headed(fig, height, "fused adjoints: whole lists against balanced segments (kernels alone)",
                         kl.recorded_message(recs))
    return readable_log_axes(fig)


# ------------------------------------------------------------------------------------- the widget

def explore_fused_run(layer: str = "res18_layer1", batch: int = 64, cout: Optional[int] = None,
                      dx_config: str = "auto", dw_config: str = "auto", nsplit: int = 0, rf: Optional[str] = None,
                      device: Optional[str] = None, log: Optional[kl.RunLog] = None,
                      budget: float = kl.CPU_WORK_BUDGET, seed: int = 0, seg_steps: int = -1):
    """Notebook 06's explorer callback: run the fused dx and dW kernels on ``layer`` with the chosen
    configs (``"auto"``: the rules of :mod:`fovi_lab.kernels.adjoint.fused`; ``nsplit`` 0: the split rule;
    ``seg_steps`` -1: the segment rules (whole lists on the CPU), 0: whole lists / interleaved splits,
    L >= 1: balanced segments of L steps for both kernels; a ``nsplit`` > 0 overrides it for dW),
    check them against torch autograd of the fp32 oracle, run them again and compare bits, and time
    them against ``torch_compact``'s adjoints. On the CPU the batch, then the output nodes, are clamped
    to ``budget`` FLOPs of tile work. Returns ``(result, figure)`` like :func:`fovi_lab.lab.adjoint_explorer`.
    """
    from fovi_lab.kernels import adjoint as nm
    from fovi_lab.graph.meta import pad_to
    from fovi_lab.ops.reference import CompactTorchOps
    result = {"ok": False, "passed": False, "layer": layer, "batch_requested": batch, "cout_requested": cout,
              "dx_config": dx_config, "dw_config": dw_config, "nsplit_requested": nsplit}
    problem = kl.check_explore_args(layer, batch, cout, rf)
    if problem is None and dx_config != "auto" and dx_config not in nm.DX_NM_CONFIG_SPECS:
        problem = f"dx config must be 'auto' or one of {', '.join(nm.DX_NM_CONFIG_SPECS)}, got {dx_config!r}"
    if problem is None and dw_config != "auto" and dw_config not in nm.DW_NM_CONFIG_SPECS:
        problem = f"dW config must be 'auto' or one of {', '.join(nm.DW_NM_CONFIG_SPECS)}, got {dw_config!r}"
    if problem is None and (not kl.is_int(nsplit) or not 0 <= int(nsplit) <= 64):
        problem = f"list split must be an integer in [0, 64] (0 = the rule), got {nsplit!r}"
    if problem is None and (not kl.is_int(seg_steps) or not -1 <= int(seg_steps) <= 4096):
        problem = f"segment length must be an integer in [-1, 4096] (-1 = the rule, 0 = whole lists), got {seg_steps!r}"
    if problem is not None:
        return kl.fail_result(result, log, problem)
    try:
        dev = device or kl.default_device()
        shape = kl.shape_of(kl.make_meta(layer, cout, rf))

        def work(bb, nn):                      # both fused GEMMs, padded tiles, nn output nodes
            return 2 * 2.0 * bb * nn * shape["k"] * pad_to(shape["cout"], 64) * pad_to(shape["cin"], 16)

        b, nodes, note = kl.clamp_shape(shape, batch, work, dev, budget, tile_rows=16)
        pb = kl.make_problem(layer, b, cout, rf, seed=seed, device=dev, nodes=nodes, bias=False)
        m = pb.meta
        dxc = None if dx_config == "auto" else dx_config
        dwc = None if dw_config == "auto" else dw_config
        split = None if int(nsplit) == 0 else int(nsplit)
        seg = None if int(seg_steps) < 0 else int(seg_steps)
        t0 = time.perf_counter()
        px = nm.plan_grad_input_nm(m, pb.grad_y, pb.weight, dxc, seg_steps=seg)
        pw = nm.plan_grad_weight_nm(m, pb.grad_y, pb.x, dwc, nsplit=split, seg_steps=seg)
        if px is None or pw is None:
            return kl.fail_result(result, log, "unlaunchable on this device: the rule's fused kernel failed its canary")
        dx, dw = px.run(), pw.run()
        compile_s = time.perf_counter() - t0
        # the same plans again (same tiles, same splits or segments): a second, independent launch
        dx2 = nm.grad_input_nm(m, pb.grad_y, pb.weight, px.k.name, seg_steps=px.seg_steps or 0)
        dw2 = (nm.grad_weight_nm(m, pb.grad_y, pb.x, pw.k.name, seg_steps=pw.seg_steps) if pw.seg_steps
               else nm.grad_weight_nm(m, pb.grad_y, pb.x, pw.k.name, nsplit=pw.nsplit))
        det = bool(torch.equal(dx, dx2) and torch.equal(dw, dw2))
        rdx, rdw, ref_name = kl.reference_grads(m, pb.x, pb.weight, pb.grad_y)
        tol = 1e-2
        err_dx, err_dw = kl.rel_error(dx, rdx, floor=1e-30), kl.rel_error(dw, rdw, floor=1e-30)
        run_ms = kl.time_ms(lambda: (px.run(), pw.run()), dev)
        if dev == "cpu":
            gf, wf, xf = pb.grad_y.float(), pb.weight.float(), pb.x.float()
        else:
            gf, wf, xf = pb.grad_y, pb.weight, pb.x
        torch_ms = kl.time_ms(lambda: (CompactTorchOps.grad_input(m, gf, wf),
                                        CompactTorchOps.grad_weight(m, gf, xf)), dev)
        tag = f"{layer} (B={b}, Cout={m.cout})"
        result.update(
            ok=True, passed=bool(err_dx <= tol and err_dw <= tol), batch=b, nodes=m.nout, cout=m.cout, clamp=note,
            dx_kernel=px.k.name, dw_kernel=pw.k.name, dw_split=pw.nsplit, dx_kind=px.k.kind, dw_kind=pw.k.kind,
            dx_seg_steps=px.seg_steps, dw_seg_steps=pw.seg_steps, err_dx=err_dx, err_dw=err_dw,
            tolerance=tol, reference=ref_name, deterministic=det,
            parity_dx=kl.parity_line(f"fused dx {_plan_label(px)}, on {tag} vs {ref_name}", err_dx, tol),
            parity_dw=kl.parity_line(f"fused dW {_plan_label(pw)}, on {tag} vs {ref_name}", err_dw, tol),
            compile_s=compile_s, run_ms=run_ms, torch_ms=torch_ms,
            torch_name="torch_compact adjoints (fp32 on the CPU)" if dev == "cpu" else "torch_compact adjoints (fp16)",
            label=f"{layer} B={b} dx {_plan_label(px)} + dW {_plan_label(pw)}", device=dev)
        result["message"] = (f"{'PASS' if result['passed'] else 'FAIL'}  dx {kl.tolerance_class(err_dx)}, "
                             f"dW {kl.tolerance_class(err_dw)} vs {ref_name}; "
                             f"bitwise identical on a second run: {'yes' if det else 'NO'}"
                             + (f"  [{note}]" if note else ""))
        return kl.result_answer(result, log)
    except Exception as exc:  # noqa: BLE001 - the widget must answer with a message
        return kl.fail_result(result, log, f"could not run: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")


# ------------------------------------------------------------------------------------- the finish

#: The checkout's train steps replayed with each finish of the segment / split partials (``finish`` = ``warp``:
#: the SIMT and Warp-tile kernels; ``native``: the shared-memory tile, :func:`seg_finish_tiled_kernel`).
FINISH_RECORDS = kl.DATA_DIR / "h200" / "finish_ab.jsonl.gz"


def finish_ab_table(records: Optional[List[dict]] = None) -> str:
    """Per (layer, B) of :data:`FINISH_RECORDS`, from the newest build that timed both finishes there:
    ``warp_train`` replayed from a CUDA graph with each (ms), the ratio (above 1: the shared-memory finish is
    faster) and that build's commit."""
    from fovi_lab.ops.records import read_file
    if records is None:
        records = list(read_file(FINISH_RECORDS)) if FINISH_RECORDS.is_file() else []
    got: Dict[tuple, Dict[str, dict]] = {}
    for r in records:
        if r.get("impl") == "warp_train_graphed" and r.get("ms") and r.get("finish"):
            got.setdefault((r["layer"], r["B"], r.get("commit")), {})[r["finish"]] = r
    newest: Dict[tuple, tuple] = {}
    for (layer, b, commit), v in got.items():
        if "warp" in v and "native" in v:
            when = str(v["native"].get("date", ""))
            if (layer, b) not in newest or when > newest[(layer, b)][0]:
                newest[(layer, b)] = (when, commit, v["warp"]["ms"], v["native"]["ms"])
    if not newest:
        return f"no finish A/B records at {FINISH_RECORDS}"
    order = {n: i for i, n in enumerate(kl.layer_order(k[0] for k in newest))}
    lines = [f"{'layer':15s} {'B':>4s} {'SIMT / Warp-tile finish':>23s} {'shared-memory finish':>20s} {'ratio':>6s}  build"]
    for (layer, b), (_, commit, w, n) in sorted(newest.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        lines.append(f"{layer:15s} {b:4d} {w:23.3f} {n:20.3f} {w / n:5.2f}x  {commit}")
    return "\n".join(lines)
