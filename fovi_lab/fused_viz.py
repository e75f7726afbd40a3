"""Notebook 04, section 7: the fused node-major adjoints against the staged ones (logic and figures).

* :func:`stage_bytes_table`: the memory argument, per layer: what the staged pipelines write and read
  back (the stage buffers) against what the fused kernels need (g in node-major order, dW partials).
* :func:`explore_fused`: run both fused kernels on this machine, check them against torch autograd of
  the fp32 oracle and against the staged kernels, and check that a second run is bitwise identical.
* :func:`fused_vs_staged_figure`, :func:`graphed_step_figure`: the recorded H200 train steps.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from . import kernel_lab as kl
from .layers import layer_meta

__all__ = ["stage_bytes_table", "explore_fused", "train_step_runs", "fused_vs_staged_figure",
           "graphed_step_figure"]

_MIB = 1 << 20


def stage_bytes_table(layers: Sequence[str] = ("alex_L0", "alex_L1", "alex_L3", "res18_layer1", "res18_layer3"),
                      batch: int = 512) -> List[dict]:
    """Per layer at ``batch``: bytes the staged pipelines stage (written once, read back once: fp16 dA
    ``[Nout, P64, B]`` and dWeff ``[Nout, P64, Cout]``, before chunking) against the fused path's extra
    operands (g node-major ``[Nout, Cout, B]`` fp16 and the dW partials, ``S x [V, Cout, Cin]`` fp32
    with the split S its rule picks on the H200) and the gradients themselves (dx, dW fp32)."""
    from .warp_adjoint_nm import select_dw_nm_config, DW_NM_CONFIG_SPECS, _WAVE_CTAS
    from .meta import pad_to
    rows = []
    for name in layers:
        m = layer_meta(name)
        staged = 2 * m.nout * m.p64 * batch + 2 * m.nout * m.p64 * pad_to(m.cout, 64)
        to, tc, _, _ = DW_NM_CONFIG_SPECS[select_dw_nm_config(m.cout, m.cin)]
        op, cp = pad_to(m.cout, to), pad_to(m.cin, tc)
        tiles = (op // to) * (cp // tc)
        split = 16 if m.v * tiles < _WAVE_CTAS else 8
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
    from . import warp_adjoint as wa
    from . import warp_adjoint_nm as nm
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
    tol = 1e-2                                 # relative to max|ref|, as notebook 04's other checks
    err_dx, err_dw = kl.rel_error(dx, rdx, floor=1e-30), kl.rel_error(dw, rdw, floor=1e-30)
    return dict(
        shape=shape, B=pb.batch, dx_config=px.k.name, dw_config=pw.k.name, dw_split=pw.nsplit,
        err_dx=err_dx, err_dw=err_dw, passed=bool(err_dx <= tol and err_dw <= tol),
        parity_dx=kl.parity_line(f"fused dx ({px.k.name}) vs {ref_name}", err_dx, tol),
        parity_dw=kl.parity_line(f"fused dW ({pw.k.name}, list split {pw.nsplit}) vs {ref_name}", err_dw, tol),
        vs_staged=kl.parity_line("fused vs staged kernels (another fp32 summation order)",
                                 max(kl.rel_error(dx, sdx, floor=1e-30), kl.rel_error(dw, sdw, floor=1e-30)), tol),
        deterministic=bool(torch.equal(dx, dx2) and torch.equal(dw, dw2)),
        first_s=t_first, second_s=t_second)


# ------------------------------------------------------------------------------------- recorded data

def train_step_runs(records: Optional[List[dict]] = None,
                    need: Sequence[str] = ("warp_train", "warp_train_staged")) -> Dict[tuple, dict]:
    """``(layer, B) -> {impl: record}`` from the most recent recorded train-step run of each shape that
    measured every impl in ``need`` (default: both paths, the staged one next to the backend's own)."""
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
        ok = [rk for rk, d in by_run.items() if all(n in d for n in need)]
        if ok:
            out[key] = by_run[max(ok)]
    return out


def _fused_of(d: Dict[str, dict]) -> Optional[dict]:
    r = d.get("warp_train")
    if r is not None and r.get("path") == "fused":
        return r
    return d.get("warp_train_fused")


def _best_torch(d: Dict[str, dict], graphed: bool) -> Optional[dict]:
    rows = [r for k, r in d.items() if k.startswith("torch") and bool(r.get("graphed")) == graphed]
    return min(rows, key=lambda r: r["ms"]) if rows else None


def fused_vs_staged_figure(records: Optional[List[dict]] = None, height: int = 600) -> go.Figure:
    """Recorded train step (forward + dx + dW) per layer: staged path, fused path and the fastest PyTorch
    step (ms, log axis), and below it each one's peak memory (MiB); a dropdown picks B."""
    runs = train_step_runs(records)
    if not runs:
        return kl.message_figure("no recorded train step with both adjoint paths yet "
                                 "(python -m fovi_lab bench train-step on a GPU)")
    bs = sorted({b for _, b in runs})
    layers = kl._layer_order(l for l, _ in runs)
    default_b = 64 if 64 in bs else bs[0]
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("train step (ms, log)", "peak memory of one step (MiB, log)"))
    series = (("staged (seed design)", lambda d: d.get("warp_train_staged"), kl._COLOURS["grey"]),
              ("fused (node-major)", _fused_of, kl._COLOURS["warp"]),
              ("fastest PyTorch", lambda d: _best_torch(d, False), kl._COLOURS["torch"]))
    per_b = 2 * len(series)
    for b in bs:
        for name, pick, colour in series:
            recs = [pick(runs[(l, b)]) if (l, b) in runs else None for l in layers]
            fig.add_trace(go.Bar(x=layers, y=[kl._r4(r["ms"]) if r else None for r in recs], name=name,
                                 marker_color=colour, visible=b == default_b, legendgroup=name,
                                 hovertext=[r["impl"] if r else "" for r in recs]), row=1, col=1)
            fig.add_trace(go.Bar(x=layers, y=[kl._r4(r.get("peak_mib")) if r else None for r in recs], name=name,
                                 marker_color=colour, visible=b == default_b, legendgroup=name, showlegend=False),
                          row=2, col=1)
    buttons = []
    for i, b in enumerate(bs):
        vis = [False] * (per_b * len(bs))
        vis[i * per_b:(i + 1) * per_b] = [True] * per_b
        buttons.append(dict(label=f"B = {b}", method="update", args=[{"visible": vis}]))
    used = [r for d in runs.values() for r in d.values()]
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=90, b=10),
                      title=kl._title("train step: staged vs fused adjoints vs PyTorch", used),
                      updatemenus=[dict(buttons=buttons, type="buttons", direction="right", x=1.0, xanchor="right",
                                        y=1.13, active=bs.index(default_b))],
                      legend=dict(orientation="h", y=-0.12))
    fig.update_yaxes(type="log")
    return fig


def graphed_step_figure(records: Optional[List[dict]] = None, height: int = 460) -> go.Figure:
    """Recorded train step replayed from a CUDA graph (no per-call host work) against the fastest
    PyTorch step replayed the same way, per layer; eager ``warp_train`` as a marker; dropdown for B."""
    runs = train_step_runs(records, need=("warp_train", "warp_train_graphed"))
    if not runs:
        return kl.message_figure("no recorded CUDA-graph train step yet "
                                 "(python -m fovi_lab bench train-step --graphs on a GPU)")
    bs = sorted({b for _, b in runs})
    layers = kl._layer_order(l for l, _ in runs)
    default_b = 64 if 64 in bs else bs[0]
    fig = go.Figure()
    per_b = 3
    for b in bs:
        get = lambda f: [f(runs[(l, b)]) if (l, b) in runs else None for l in layers]  # noqa: E731
        w = get(lambda d: d.get("warp_train_graphed"))
        t = get(lambda d: _best_torch(d, True))
        e = get(lambda d: d.get("warp_train"))
        fig.add_trace(go.Bar(x=layers, y=[kl._r4(r["ms"]) if r else None for r in w], name="warp_train, graph replay",
                             marker_color=kl._COLOURS["warp"], visible=b == default_b))
        fig.add_trace(go.Bar(x=layers, y=[kl._r4(r["ms"]) if r else None for r in t],
                             name="fastest PyTorch, graph replay", marker_color=kl._COLOURS["torch"],
                             visible=b == default_b, hovertext=[r["impl"] if r else "" for r in t]))
        fig.add_trace(go.Scatter(x=layers, y=[kl._r4(r["ms"]) if r else None for r in e], mode="markers",
                                 name="warp_train, eager", marker=dict(symbol="line-ew-open", size=16),
                                 visible=b == default_b))
    buttons = []
    for i, b in enumerate(bs):
        vis = [False] * (per_b * len(bs))
        vis[i * per_b:(i + 1) * per_b] = [True] * per_b
        buttons.append(dict(label=f"B = {b}", method="update", args=[{"visible": vis}]))
    used = [r for d in runs.values() for r in d.values()]
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=90, b=10),
                      title=kl._title("train step replayed from a CUDA graph, both sides", used),
                      yaxis_type="log", yaxis_title="ms",
                      updatemenus=[dict(buttons=buttons, type="buttons", direction="right", x=1.0, xanchor="right",
                                        y=1.15, active=bs.index(default_b))],
                      legend=dict(orientation="h", y=-0.2))
    return fig
