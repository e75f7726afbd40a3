"""Notebook 12, the adjoints as forwards: a check of both tensor-core adjoints against the oracle, what the
derived layers pay in padding on the real layers, and what the H200 recorded for them beside the fused / staged
kernels (each gradient alone, and the whole train step with both forced onto the tensor cores), with the rule read
from it (:mod:`fovi_lab.kernels.adjoint.as_forward`)."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import plotly.graph_objects as go

import torch

from fovi_lab.lab.common import readable_log_axes, text_table
from fovi_lab import lab as kl
import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.graph.layers import LAYERS, layer_meta
from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph, tap_meta, transposed_meta
from fovi_lab.ops.records import read_file
from fovi_lab.ops.reference import oracle_forward

__all__ = ["check", "padding_rows", "padding_table", "ADJOINT_RECORDS", "recorded_rows", "recorded_table",
           "recorded_summary", "recorded_figure", "STEP_RULE_RECORDS", "step_rule_rows", "step_rule_table",
           "step_rule_figure", "time_here", "STEMS", "stem_chunk_rows", "stem_chunk_table", "stem_dw_here",
           "stem_rule_batches", "TAPS_LAYERS", "taps_work_rows", "taps_work_table", "stem_dx_here",
           "taps_recorded_rows", "taps_recorded_lines"]

#: The checkout's records of ``python -m fovi_lab bench adjoints`` on the H200 (absent from a wheel install).
ADJOINT_RECORDS = kl.DATA_DIR / "h200" / "adjoint_paths.jsonl"


def check(shape: str = "ODD", batch: int = 17, dtype=torch.float16, device=None, seed: int = 3) -> List[str]:
    """Pass/fail lines of the tensor-core dx and dW on a synthetic shape against autograd through the fp32
    oracle on the same rounded operands (tolerance ``1e-4 * (1 + max |oracle|)``: fp32 accumulation of exact
    products), and whether a second run is bitwise identical."""
    from fovi_lab.kernels.adjoint.as_forward import grad_input_mma, grad_weight_mma
    device = torch.device(device or "cpu")
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[shape]
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin, device=device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, cin, nin, generator=gen).to(device, dtype)
    w = (torch.randn(cout, cin * v, generator=gen) / (cin * k) ** 0.5).to(device, dtype)
    g = torch.randn(batch, cout, nout, generator=gen).to(device, dtype)
    xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
    dx_o, dw_o = torch.autograd.grad(oracle_forward(xf, wf, None, meta.idx, meta.rf_index, v), (xf, wf), g.float())
    dx, dw = grad_input_mma(meta, g, w), grad_weight_mma(meta, g, x)
    lines = []
    for name, got, want in (("dx, forward of the transposed layer", dx, dx_o), ("dW, forward of the tap layer", dw, dw_o)):
        tol = 1e-4 * (1.0 + float(want.abs().max()))
        lines.append(kl.parity_line(f"{name} ({shape}, B={batch}, {str(dtype)[6:]}) vs the fp32 oracle",
                                    float((got - want).abs().max()), tol, coarse=True))
    same = torch.equal(dx, grad_input_mma(meta, g, w)) and torch.equal(dw, grad_weight_mma(meta, g, x))
    lines.append(f"fp32 outputs: {dx.dtype == dw.dtype == torch.float32}; bitwise identical on a second run: {same}")
    return lines


def time_here(layer: str = "res18_layer3", batch: int = 8, device=None, reps: int = 5) -> List[dict]:
    """Both gradients of a real layer timed on ``device`` (default: the lab's device) two ways, on the same fp16
    operands: as forwards of the derived layers (:func:`~fovi_lab.kernels.adjoint.as_forward.grad_input_mma` /
    ``grad_weight_mma``, the per-call copies of ``W'`` and ``x'`` included) and on the layer's own adjoint kernels
    (:func:`fovi_lab.knn_warp.grad_input_kernels` / ``grad_weight_kernels``, the path the layer takes). One row per
    gradient: ``as_forward_ms``, ``kernels_ms``, their ratio and the largest difference of the two results over
    the largest entry (both sum in fp32, in different orders)."""
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.kernels.adjoint.as_forward import grad_input_mma, grad_weight_mma
    from fovi_lab.knn_warp import grad_input_kernels, grad_path, grad_paths, grad_weight_kernels

    device = str(device or kl.default_device())
    meta = layer_meta(layer, device=device)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(batch, meta.cin, meta.nin, generator=gen).to(device, torch.float16)
    w = (torch.randn(meta.cout, meta.q, generator=gen) / (meta.cin * meta.k) ** 0.5).to(device, torch.float16)
    g = torch.randn(batch, meta.cout, meta.nout, generator=gen).to(device, torch.float16)
    path = grad_paths(meta, batch)
    rows = []
    for what, mma, own, operand, kernels in (("dx", grad_input_mma, grad_input_kernels, w, path[0]),
                                             ("dW", grad_weight_mma, grad_weight_kernels, x, path[1])):
        kernels = kernels if kernels in ("fused", "staged") else grad_path(meta)     # the layer's own kernels
        a, b = mma(meta, g, operand), own(meta, g, operand, kernels)
        diff = float((a - b.float()).abs().max()) / max(1e-12, float(b.float().abs().max()))
        t_mma = kl.time_ms(lambda: mma(meta, g, operand), device, max_reps=reps)
        t_own = kl.time_ms(lambda: own(meta, g, operand, kernels), device, max_reps=reps)
        rows.append(dict(layer=layer, B=batch, gradient=what, own_path=kernels, as_forward_ms=t_mma,
                         kernels_ms=t_own, kernels_over_as_forward=t_own / t_mma, rel_diff=diff, device=device))
    return rows


def padding_rows(layers: Optional[Sequence[str]] = None) -> List[dict]:
    """Per real layer: the transposed layer's lists (input nodes, largest in-degree, slots over real entries) and
    the tap layer's (taps, longest list, slots over real entries)."""
    rows = []
    for name in layers or LAYERS:
        meta = layer_meta(name)
        real = int((meta.idx < meta.nin).sum())
        t, taps = transposed_meta(meta), tap_meta(meta, 1)
        rows.append(dict(layer=name, nin=meta.nin, in_degree_max=t.k, dx_padding=t.nout * t.k / real,
                         v=meta.v, tap_max=taps.k, dw_padding=taps.nout * taps.k / real))
    return rows


def padding_table(layers: Optional[Sequence[str]] = None) -> str:
    """:func:`padding_rows` as text (two decimals)."""
    head = f"{'layer':15s} {'Nin':>5s} {'max in':>6s} {'dx slots/real':>13s}   {'V':>4s} {'max tap':>7s} {'dW slots/real':>13s}"
    return "\n".join([head] + [f"{r['layer']:15s} {r['nin']:5d} {r['in_degree_max']:6d} {r['dx_padding']:13.2f}   "
                               f"{r['v']:4d} {r['tap_max']:7d} {r['dw_padding']:13.2f}" for r in padding_rows(layers)])


def _latest(records: List[dict]) -> Dict[tuple, dict]:
    """(layer, B, what, impl) -> the latest timed record (by date)."""
    out: Dict[tuple, dict] = {}
    for r in records:
        if r.get("kind") == "adjoint_paths" and r.get("ms") and r.get("what") in ("dx", "dW", "step"):
            key = (r["layer"], r["B"], r["what"], r["impl"])
            if key not in out or str(r.get("date", "")) >= str(out[key].get("date", "")):
                out[key] = r
    return out


def recorded_rows(records: Optional[List[dict]] = None) -> List[dict]:
    """Per recorded (layer, B) that timed the rule's tensor-core config: its useful GFLOP, dx and dW on the fused /
    staged kernels (``*_kernels``) and on :data:`~fovi_lab.kernels.adjoint.as_forward.MMA_GRAD_CONFIG`
    (``*_mma``), ms of the latest record of each, and whether :func:`select_grad_mma` takes the tensor cores
    there (``rule``)."""
    from fovi_lab.kernels.adjoint.as_forward import MMA_GRAD_CONFIG, select_grad_mma
    if records is None:
        records = list(read_file(ADJOINT_RECORDS)) if ADJOINT_RECORDS.is_file() else []
    latest = _latest(records)
    rows = []
    order = {name: i for i, name in enumerate(LAYERS)}
    for layer, b in sorted({(k[0], k[1]) for k in latest if k[0] in order}, key=lambda lb: (order[lb[0]], lb[1])):
        row = dict(layer=layer, B=b, records=[])
        for what in ("dx", "dW"):
            kern = [r for k, r in latest.items() if k[:3] == (layer, b, what) and k[3] in ("warp_fused", "warp_staged")]
            mma = latest.get((layer, b, what, "mma:" + MMA_GRAD_CONFIG))
            row[what + "_kernels"] = kern[0]["ms"] if kern else None
            row[what + "_mma"] = mma["ms"] if mma else None
            row["records"] += kern[:1] + ([mma] if mma else [])
        if None in (row["dx_kernels"], row["dx_mma"], row["dW_kernels"], row["dW_mma"]):
            continue
        meta = layer_meta(layer)
        row["gflop"] = 2e-9 * b * meta.p64 * meta.cout * meta.nout
        row["rule"] = select_grad_mma(meta, b) is not None
        rows.append(row)
    return rows


def recorded_table(rows: Optional[List[dict]] = None) -> str:
    """:func:`recorded_rows` as text: per gradient the kernels' ms, the tensor cores' ms and their speedup."""
    head = (f"{'layer':15s} {'B':>4s} {'GFLOP':>6s} | {'dx kernels':>10s} {'mma':>6s} {'':>6s} | {'dW kernels':>10s} "
            f"{'mma':>6s} {'':>6s} | rule")
    return text_table(recorded_rows() if rows is None else rows, head, lambda r: (
        f"{r['layer']:15s} {r['B']:4d} {r['gflop']:6.2f} | {r['dx_kernels']:10.3f} {r['dx_mma']:6.3f} "
        f"{r['dx_kernels'] / r['dx_mma']:5.2f}x | {r['dW_kernels']:10.3f} {r['dW_mma']:6.3f} "
        f"{r['dW_kernels'] / r['dW_mma']:5.2f}x | {'tensor cores' if r['rule'] else 'kernels'}"),
        f"no records of bench adjoints at {ADJOINT_RECORDS}")


def recorded_summary(rows: Optional[List[dict]] = None) -> List[str]:
    """Lines: the tensor cores' speedup range per gradient where the rule takes them and where it does not, and the
    least work from which they win both gradients on every recorded shape with Cin >= 16 (with their ranges there)."""
    rows = recorded_rows() if rows is None else rows
    lines = []
    for label, part in (("where the rule takes the tensor cores", [r for r in rows if r["rule"]]),
                        ("where it keeps the fused / staged kernels", [r for r in rows if not r["rule"]])):
        if not part:
            continue
        sp = {w: [r[w + "_kernels"] / r[w + "_mma"] for r in part] for w in ("dx", "dW")}
        lines.append(f"{label} ({len(part)} shapes): dx {min(sp['dx']):.2f}-{max(sp['dx']):.2f}x, "
                     f"dW {min(sp['dW']):.2f}-{max(sp['dW']):.2f}x")
    # the least work from which the tensor cores win both gradients on every recorded shape with Cin >= 16
    wide = sorted((r for r in rows if layer_meta(r["layer"]).cin >= 16), key=lambda r: r["gflop"])
    wins = lambda r: r["dx_kernels"] > r["dx_mma"] and r["dW_kernels"] > r["dW_mma"]  # noqa: E731
    tail = [r for i, r in enumerate(wide) if all(wins(q) for q in wide[i:])]
    if tail:
        first = min(r["gflop"] for r in tail)
        part = [r for r in wide if r["gflop"] >= first]
        sp = {w: [r[w + "_kernels"] / r[w + "_mma"] for r in part] for w in ("dx", "dW")}
        lines.append(f"from {first:.2f} GFLOP on with Cin >= 16 ({len(part)} shapes) the tensor cores win both: "
                     f"dx {min(sp['dx']):.2f}-{max(sp['dx']):.2f}x, dW {min(sp['dW']):.2f}-{max(sp['dW']):.2f}x")
    return lines


def recorded_figure(rows: Optional[List[dict]] = None, height: int = 460) -> go.Figure:
    """Speedup of the tensor-core config over the fused / staged kernels, per gradient, against the call's useful
    work (log x), with the rule's threshold marked: the picture the rule was read from."""
    from fovi_lab.kernels.adjoint.as_forward import MMA_GRAD_MIN_GFLOP
    rows = recorded_rows() if rows is None else rows
    if not rows:
        return kl.message_figure(f"no records of bench adjoints at {ADJOINT_RECORDS}")
    fig = go.Figure()
    for what, colour in (("dx", "#2ca02c"), ("dW", "#1f77b4")):
        fig.add_trace(go.Scatter(x=[r["gflop"] for r in rows], y=[r[what + "_kernels"] / r[what + "_mma"] for r in rows],
                                 mode="markers", name=what, marker=dict(color=colour, size=9),
                                 text=[f"{r['layer']} B={r['B']}" for r in rows],
                                 hovertemplate="%{text}: %{y:.2f}x at %{x:.2f} GFLOP<extra>" + what + "</extra>"))
    return _over_gflop(fig, rows, height, f"rule: tensor cores from {MMA_GRAD_MIN_GFLOP:g} GFLOP",
                       "tensor cores' speedup (×)",
                       "The adjoints on tensor cores against the fused / staged kernels", "one call, back to back")


def _over_gflop(fig: go.Figure, rows: List[dict], height: int, rule: str, ytitle: str, title: str,
                note: str) -> go.Figure:
    """The frame of a speedup-over-useful-work figure: a dotted line at 1, the rule's threshold (``rule``) dashed,
    the log GFLOP axis, ``title``, and under it ``note`` and the versions of the ``rows``' records; the legend
    between the title and the plot."""
    from fovi_lab.kernels.adjoint.as_forward import MMA_GRAD_MIN_GFLOP
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.add_vline(x=MMA_GRAD_MIN_GFLOP, line_dash="dash", line_color="#d62728", annotation_text=rule)
    fig.update_layout(xaxis=dict(type="log", title="useful work of one gradient, 2·B·P64·Cout·Nout (GFLOP)"),
                      yaxis=dict(title=ytitle), margin=dict(b=50))
    figure_layout.headed(fig, height, title, kl.recorded_message([rec for r in rows for rec in r["records"]], note))
    return readable_log_axes(fig)


#: The checkout's train steps replayed from CUDA graphs with both gradients forced onto the tensor cores beside the
#: rule of the run's commit (``variant`` = ``forced`` / ``rule``), what the package's rule was read from.
STEP_RULE_RECORDS = kl.DATA_DIR / "h200" / "grad_mma_rule.jsonl.gz"


def _when(record: dict) -> float:
    """A record's ``date`` as seconds since the epoch (0 when it has none)."""
    import datetime
    try:
        return datetime.datetime.fromisoformat(str(record.get("date"))).timestamp()
    except ValueError:
        return 0.0


def step_rule_rows(records: Optional[List[dict]] = None) -> List[dict]:
    """Per (layer, B) of :data:`STEP_RULE_RECORDS`: the replayed ``warp_train`` step with both gradients forced onto
    :data:`~fovi_lab.kernels.adjoint.as_forward.MMA_GRAD_CONFIG` (``forced_ms``) and under the rule of that run
    (``rule_ms``), the rule record taken from the forced one's build, nearest in time; the useful GFLOP of one
    gradient, the speedup of the forced step, and whether the package's :func:`select_grad_mma` takes the tensor
    cores (``now``)."""
    from fovi_lab.kernels.adjoint.as_forward import select_grad_mma
    if records is None:
        records = list(read_file(STEP_RULE_RECORDS)) if STEP_RULE_RECORDS.is_file() else []
    steps = [r for r in records if r.get("impl") == "warp_train_graphed" and r.get("ms") and r.get("variant")]
    order = {name: i for i, name in enumerate(LAYERS)}
    rows: Dict[tuple, dict] = {}
    for f in (r for r in steps if r["variant"] == "forced"):
        same = [r for r in steps if r["variant"] == "rule" and r.get("commit") == f.get("commit")
                and (r["layer"], r["B"]) == (f["layer"], f["B"])]
        if not same or f["layer"] not in order:
            continue
        rule = min(same, key=lambda r: abs(_when(r) - _when(f)))
        meta = layer_meta(f["layer"])
        row = dict(layer=f["layer"], B=f["B"], gflop=2e-9 * f["B"] * meta.p64 * meta.cout * meta.nout,
                   rule_ms=rule["ms"], forced_ms=f["ms"], speedup=rule["ms"] / f["ms"],
                   now=select_grad_mma(meta, f["B"]) is not None, records=[rule, f])
        key = (f["layer"], f["B"])
        if key not in rows or _when(f) > _when(rows[key]["records"][1]):
            rows[key] = row                                   # the newest pair of a shape
    return sorted(rows.values(), key=lambda r: (order[r["layer"]], r["B"]))


def step_rule_table(rows: Optional[List[dict]] = None) -> str:
    """:func:`step_rule_rows` as text, by useful work."""
    rows = step_rule_rows() if rows is None else rows
    if not rows:
        return f"no forced-gradient train steps at {STEP_RULE_RECORDS}"
    head = ("layer", "B", "GFLOP", "run's rule", "forced", "speedup")
    lines = [f"{head[0]:15s} {head[1]:>4s} {head[2]:>6s} | {head[3]:>10s} {head[4]:>7s} {head[5]:>7s} | "
             f"the package's rule"]
    for r in sorted(rows, key=lambda r: r["gflop"]):
        lines.append(f"{r['layer']:15s} {r['B']:4d} {r['gflop']:6.2f} | {r['rule_ms']:10.3f} {r['forced_ms']:7.3f} "
                     f"{r['speedup']:6.2f}x | {'tensor cores' if r['now'] else 'kernels'}")
    return "\n".join(lines)


def step_rule_figure(rows: Optional[List[dict]] = None, height: int = 460) -> go.Figure:
    """The forced step's speedup against the useful work of one gradient (log x), coloured by the package's rule's
    pick, with its threshold marked."""
    from fovi_lab.kernels.adjoint.as_forward import MMA_GRAD_MIN_GFLOP
    rows = step_rule_rows() if rows is None else rows
    if not rows:
        return kl.message_figure(f"no forced-gradient train steps at {STEP_RULE_RECORDS}")
    fig = go.Figure()
    for label, now, colour in (("rule: tensor cores", True, "#2ca02c"), ("rule: fused / staged kernels", False, "#7f7f7f")):
        part = [r for r in rows if r["now"] == now]
        fig.add_trace(go.Scatter(x=[r["gflop"] for r in part], y=[r["speedup"] for r in part], mode="markers",
                                 name=label, marker=dict(color=colour, size=10),
                                 text=[f"{r['layer']} B={r['B']}" for r in part],
                                 hovertemplate="%{text}: %{y:.2f}x at %{x:.2f} GFLOP<extra></extra>"))
    return _over_gflop(fig, rows, height, f"rule: from {MMA_GRAD_MIN_GFLOP:g} GFLOP",
                       "forced step's speedup (×)",
                       "Train steps with both gradients forced onto the tensor cores",
                       "replayed from CUDA graphs; the speedup is over the step under the rule of the run")


#: The real layers with three input channels (the stems, and the DINOv3 patch embed).
STEMS = ("res18_stem", "alex_L0", "dinov3_patch")


def stem_chunk_rows(layers: Sequence[str] = STEMS, batches: Sequence[int] = (8, 16, 64, 256)) -> List[dict]:
    """Per stem and batch: the paths of dx and dW (:func:`fovi_lab.kernels.adjoint.rule.adjoint_plan`), the rows per
    chunk of dW on the tensor cores, the chunks, the MiB of the tap tables of one chunk against those of the
    whole batch (:func:`fovi_lab.graph.meta.tap_table_bytes`), and the MiB of the staged dW's fp16 stage
    (``Nout x P64 x Cout``: the same at every batch)."""
    from fovi_lab.graph.meta import tap_table_bytes
    from fovi_lab.kernels.adjoint.rule import adjoint_plan
    rows = []
    for name in layers:
        meta = layer_meta(name)
        for b in batches:
            plan = adjoint_plan(meta, b, torch.float16, device="cpu")
            rows_per = plan.dw_batch_chunk or 0
            rows.append(dict(layer=name, B=b, dx=plan.dx, dw=plan.dw, rows=rows_per,
                             chunks=-(-b // rows_per) if rows_per else 0,
                             chunk_mib=tap_table_bytes(meta, rows_per) / 2 ** 20 if rows_per else None,
                             whole_mib=tap_table_bytes(meta, b) / 2 ** 20,
                             stage_mib=meta.nout * meta.p64 * meta.cout * 2 / 2 ** 20))
    return rows


def stem_chunk_table(rows: Optional[List[dict]] = None) -> str:
    """:func:`stem_chunk_rows` as text: the tap tables of one chunk and of the whole batch, the staged dW's stage."""
    head = (f"{'layer':13s} {'B':>4s} {'dx':>7s} {'dW':>12s} {'rows':>4s} {'chunks':>6s} {'chunk tables':>12s} "
            f"{'whole batch':>11s} {'stage':>9s}")
    lines = [head]
    for r in stem_chunk_rows() if rows is None else rows:
        dw = "tensor cores" if r["dw"] == "mma" else r["dw"]
        chunk = f"{r['chunk_mib']:.1f} MiB" if r["chunk_mib"] is not None else "-"
        lines.append(f"{r['layer']:13s} {r['B']:4d} {r['dx']:>7s} {dw:>12s} {r['rows'] or '-':>4} "
                     f"{r['chunks'] or '-':>6} {chunk:>12s} {r['whole_mib']:7.1f} MiB {r['stage_mib']:5.1f} MiB")
    return "\n".join(lines)


def stem_rule_batches(layers: Sequence[str] = STEMS, largest: int = 1024) -> Dict[str, Optional[Tuple[int, int]]]:
    """Per stem: the smallest and the largest batch (up to ``largest``) whose fp16 dW the rule sends to the tensor
    cores, None where none is."""
    from fovi_lab.kernels.adjoint.rule import decide         # (not the cached plans: a thousand batches each)
    out = {}
    for name in layers:
        meta = layer_meta(name)
        on = [b for b in range(1, largest + 1) if decide(meta, b, torch.float16, device="cpu").dw == "mma"]
        out[name] = (min(on), max(on)) if on else None
    return out


def stem_dw_here(layer: str = "res18_stem", batch: int = 40, device=None, reps: int = 3) -> dict:
    """A stem's dW on ``device`` (default: the lab's) both ways from the same fp16 operands, at a batch that is no
    multiple of the chunk: the rule's (the tap layer in batch chunks, :func:`fovi_lab.knn_warp.grad_weight`) and the
    staged kernels (:func:`fovi_lab.knn_warp.staged_grad_weight`). Returns the chunk rows, each one's largest
    difference from the fp64 oracle over its largest entry, whether the rule's dW repeats bit for bit, and both
    times (``tensor_ms``, ``staged_ms``)."""
    import fovi_lab.knn_warp as K
    from fovi_lab.kernels.adjoint.rule import adjoint_plan
    from fovi_lab.ops.reference import CompactTorchOps

    device = str(device or kl.default_device())
    meta = layer_meta(layer, device=device)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(batch, meta.cin, meta.nin, generator=gen).to(device, torch.float16)
    g = torch.randn(batch, meta.cout, meta.nout, generator=gen).to(device, torch.float16)
    ref = CompactTorchOps.grad_weight(meta.to("cpu"), g.cpu().double(), x.cpu().double())
    scale = float(ref.abs().max())
    rule, staged = K.grad_weight(meta, g, x), K.staged_grad_weight(meta, g, x)
    err = lambda t: float((t.cpu().double() - ref).abs().max()) / scale          # noqa: E731
    return dict(layer=layer, B=batch, device=device,
                rows=adjoint_plan(meta, batch, torch.float16, device=device).dw_batch_chunk,
                tensor_err=err(rule), staged_err=err(staged), bitwise=torch.equal(rule, K.grad_weight(meta, g, x)),
                tensor_ms=kl.time_ms(lambda: K.grad_weight(meta, g, x), device, max_reps=reps),
                staged_ms=kl.time_ms(lambda: K.staged_grad_weight(meta, g, x), device, max_reps=reps))


#: The stems, and the ResNet-18 stem on its doubled reference frame (rf2: 196 taps for 49 neighbours).
TAPS_LAYERS = STEMS + ("res18_stem_rf2",)


def taps_work_rows(layers: Sequence[str] = TAPS_LAYERS, batch: int = 512) -> List[dict]:
    """Per layer: what dx on the tap-expanded layer (:func:`fovi_lab.kernels.adjoint.as_forward.grad_input_taps`)
    costs beside the staged dx's stage. Multiply-adds per batch row and output node: ``P64 x Cout`` for the staged
    stage (every neighbour slot, fillers included, times every output channel), ``Q x Cout`` for the tap-expanded
    GEMM (every tap, used or not); their ratio; the MiB of the fp32 stage ``S`` per batch row; and, at ``batch``,
    the rows per chunk within the staged adjoints' budget
    (:func:`~fovi_lab.kernels.adjoint.as_forward.taps_batch_chunk`) and the chunks."""
    from fovi_lab.kernels.adjoint.as_forward import taps_batch_chunk
    rows = []
    for name in layers:
        meta = layer_meta(name)
        rows_per = taps_batch_chunk(meta, batch)
        rows.append(dict(layer=name, cin=meta.cin, k=meta.k, v=meta.v, p64=meta.p64, q=meta.q, cout=meta.cout,
                         staged_macs=meta.nout * meta.p64 * meta.cout, taps_macs=meta.nout * meta.q * meta.cout,
                         ratio=meta.q / meta.p64, stage_mib_per_row=4 * meta.q * meta.nout / 2 ** 20,
                         B=batch, rows=rows_per, chunks=-(-batch // rows_per)))
    return rows


def taps_work_table(rows: Optional[List[dict]] = None) -> str:
    """:func:`taps_work_rows` as text: multiply-adds per batch row (millions), their ratio, the fp32 stage per row,
    the chunks at the rows' batch."""
    rows = taps_work_rows() if rows is None else rows
    head = (f"{'layer':15s} {'Cin':>3s} {'K':>4s} {'V':>4s} {'P64':>4s} {'Q':>5s} {'staged':>9s} {'taps':>9s} "
            f"{'taps/staged':>11s} {'S per row':>10s}  chunks at B = {rows[0]['B'] if rows else '-'}")
    return text_table(rows, head, lambda r: (
        f"{r['layer']:15s} {r['cin']:3d} {r['k']:4d} {r['v']:4d} {r['p64']:4d} {r['q']:5d} "
        f"{r['staged_macs'] / 1e6:7.1f} M {r['taps_macs'] / 1e6:7.1f} M {r['ratio']:10.2f}x "
        f"{r['stage_mib_per_row']:6.2f} MiB  {r['chunks']} of {r['rows']} rows"), "no layers")


def stem_dx_here(layer: str = "res18_stem", batch: int = 5, device=None, reps: int = 3) -> dict:
    """A layer's fp16 dx on ``device`` (default: the lab's) both ways from the same operands: on the tap-expanded
    layer (:func:`~fovi_lab.kernels.adjoint.as_forward.grad_input_taps`) and on the staged kernels
    (:func:`fovi_lab.knn_warp.staged_grad_input`). Returns each one's largest difference from the fp64 oracle over
    the oracle's largest entry, whether the taps dx repeats bit for bit and is exactly zero on the input nodes no
    output reads, and both times (``taps_ms``, ``staged_ms``)."""
    import fovi_lab.knn_warp as K
    from fovi_lab.kernels.adjoint.as_forward import grad_input_taps

    device = str(device or kl.default_device())
    meta = layer_meta(layer, device=device)
    gen = torch.Generator().manual_seed(11)
    w = (torch.randn(meta.cout, meta.q, generator=gen) / (meta.cin * meta.k) ** 0.5).to(device, torch.float16)
    g = torch.randn(batch, meta.cout, meta.nout, generator=gen).to(device, torch.float16)
    cpu = meta.to("cpu")
    xf = torch.zeros(batch, meta.cin, meta.nin, dtype=torch.float64, requires_grad=True)
    ref, = torch.autograd.grad(oracle_forward(xf, w.cpu().double(), None, cpu.idx, cpu.rf_index, cpu.v), (xf,),
                               g.cpu().double())
    scale = float(ref.abs().max())
    taps, staged = grad_input_taps(meta, g, w), K.staged_grad_input(meta, g, w)
    err = lambda t: float((t.cpu().double() - ref).abs().max()) / scale          # noqa: E731
    unread = (cpu.rev_rowptr[1:] == cpu.rev_rowptr[:-1]).nonzero().squeeze(1)
    return dict(layer=layer, B=batch, device=device, taps_err=err(taps), staged_err=err(staged),
                bitwise=torch.equal(taps, grad_input_taps(meta, g, w)), unread=int(unread.numel()),
                unread_zero=bool((taps.cpu()[:, :, unread] == 0).all()),
                taps_ms=kl.time_ms(lambda: grad_input_taps(meta, g, w), device, max_reps=reps),
                staged_ms=kl.time_ms(lambda: K.staged_grad_input(meta, g, w), device, max_reps=reps))


def _dx_switch(r: dict) -> str:
    """The value of ``FOVI_KNN_DX_PATH`` a record ran under (``auto`` where unset)."""
    return str((r.get("settings") or {}).get("FOVI_KNN_DX_PATH", "auto")).strip().lower()


def _run_key(r: dict) -> tuple:
    """What a taps record shares with the rule's record it is paired with: the shape and impl, the machine boot, the
    replay mode, the tile GEMMs' build and every other setting (a pair that differed there would compare two things
    at once)."""
    others = tuple(sorted((k, v) for k, v in (r.get("settings") or {}).items() if k != "FOVI_KNN_DX_PATH"))
    return (r.get("layer"), r.get("v"), r.get("B"), r.get("impl"), r.get("device"), r.get("boot_id"),
            r.get("replay"), r.get("tile_gemm"), others)


def taps_recorded_rows(records: Optional[List[dict]] = None) -> List[dict]:
    """The checkout's GPU records of the train step under ``FOVI_KNN_DX_PATH=taps`` (their ``settings`` say so;
    ``tools/gpu/run.sh steps`` takes them), each beside the newest record of the rule (the switch unset or
    ``auto``, no other variant) with the same layer, frame, batch, impl, machine boot, replay mode, build and other
    settings: ``[{layer, B, impl, device, taps_ms, rule_ms, speedup, date, commit}]``, the newest pair of each
    (layer, B, impl); empty where no such record is kept. Records without a boot id pair with nothing."""
    if records is None:
        records = [r for path in sorted(kl.DATA_DIR.glob("*/*.jsonl*")) for r in read_file(path)]
    steps = [r for r in records if r.get("mode") == "train-step" and r.get("ms") and r.get("boot_id")
             and str(r.get("impl", "")).startswith("warp_train")]
    rule: Dict[tuple, dict] = {}
    for r in steps:
        if _dx_switch(r) == "auto" and not r.get("note_run"):
            k = _run_key(r)
            if k not in rule or _when(r) >= _when(rule[k]):
                rule[k] = r
    best: Dict[tuple, dict] = {}
    for r in steps:
        other = rule.get(_run_key(r)) if _dx_switch(r) == "taps" else None
        if other is None:
            continue
        row = dict(layer=r["layer"], B=int(r["B"]), impl=r["impl"], device=r.get("device"), taps_ms=r["ms"],
                   rule_ms=other["ms"], speedup=other["ms"] / r["ms"], date=str(r.get("date", ""))[:10],
                   commit=r.get("commit"))
        k = (row["layer"], row["B"], row["impl"])
        if k not in best or _when(r) >= best[k]["_when"]:
            best[k] = dict(row, _when=_when(r))
    return [{k: v for k, v in r.items() if k != "_when"}
            for r in sorted(best.values(), key=lambda r: (r["layer"], r["B"], r["impl"]))]


def taps_recorded_lines(rows: Optional[List[dict]] = None) -> List[str]:
    """:func:`taps_recorded_rows` as lines, or one line saying that no GPU record of the switch is kept."""
    rows = taps_recorded_rows() if rows is None else rows
    if not rows:
        return ["No GPU record of the train step under FOVI_KNN_DX_PATH=taps is kept in this checkout's data/; "
                "`bash tools/gpu/run.sh steps` on a GPU machine takes them beside the rule's."]
    out = []
    for r in rows:
        how = "replayed" if r["impl"].endswith("_graphed") else "eager"
        out.append(f"{r['layer']:15s} B={r['B']:<4d} {how:8s} taps {r['taps_ms']:.3f} ms, rule {r['rule_ms']:.3f} ms "
                   f"({r['speedup']:.2f}x; {r['device']}, {r['date']}, commit {r['commit']})")
    return out
