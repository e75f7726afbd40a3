"""Plain functions behind notebooks 01 (compact forward), 02 (weight reuse) and 04 (adjoint staging).

Every function here is ``parameters -> results dict -> plotly go.Figure`` (never a ``FigureWidget``),
so the notebooks only wire widgets to them and the tests can call them headless. Nothing in this module
defines a kernel: it runs the kernels of :mod:`fovi_lab.warp_forward` and :mod:`fovi_lab.warp_adjoint`
and explains them.

* Set-up and text: :func:`setup`, :func:`device_line`, :func:`tolerance_class`, :func:`parity_line`,
  :func:`show_source`, :func:`missing_marks`, :func:`format_result`.
* Problems: :func:`make_meta`, :func:`make_problem` (a real fovi layer from :data:`fovi_lab.layers.LAYERS`
  or one of fovi's synthetic test shapes, any batch and Cout, optionally the first ``nodes`` nodes).
* Models: :func:`shape_of`, :func:`forward_counts` (FLOPs, fewest bytes), :func:`tile_traffic` (the bytes a
  tiled kernel gathers per call, by tile shape and weight reuse ``r``), :func:`tile_smem_estimate`,
  :func:`adjoint_grid` (CTAs per launch of a gi/gw stage kernel).
* Widget callbacks: :func:`explore_forward` and :func:`explore_adjoint` rerun a real kernel on the
  current device (sizes clamped on the CPU so a run takes seconds), check it against the reference,
  time compile and run apart, and add the run to a :class:`RunLog` figure. An invalid or unlaunchable
  choice returns ``ok=False`` and a message; they never raise.
* Recorded data: :func:`load_records` finds every ``data/*.jsonl`` file (forward sweeps from
  :mod:`fovi_lab.bench.forward`, backward / train-step records from :mod:`fovi_lab.bench.backward`)
  and the ``*_recorded_figure`` functions plot them with device, Warp and torch versions in the title,
  or say "no recorded data yet".
"""

from __future__ import annotations

import functools
import glob
import gzip
import inspect
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from .layers import LAYERS, RF_MULT, SYNTHETIC, layer_graph, layer_name, resolve_layer
from .meta import TrainingMeta, build_meta, pad_to, synthetic_graph

__all__ = [
    "setup", "device_line", "default_device", "tolerance_class", "rel_error", "parity_line",
    "show_source", "missing_marks", "format_result", "LAYER_CHOICES", "make_meta", "make_problem",
    "Problem", "reference_forward", "reference_grads", "shape_of", "forward_counts", "tile_traffic",
    "tile_smem_estimate", "traffic_table", "traffic_figure", "node_gemm", "node_gemm_figure",
    "RunLog", "explore_forward", "explore_adjoint", "FORWARD_CHOICES", "CPU_WORK_BUDGET",
    "registered_forward_config", "reuse_live", "reuse_live_figure", "adjoint_by_node_gemms",
    "determinism_demo", "adjoint_grid", "occupancy_table", "occupancy_figure", "H200_SMS",
    "DATA_DIR", "load_records", "forward_records", "backward_records", "versions_title",
    "forward_table", "forward_recorded_figure", "roofline_figure", "reuse_recorded_figure",
    "heuristic_table", "heuristic_figure", "reuse_summary", "backward_recorded_figure", "gi_gw_sweep_figure",
    "benchmark_forward", "message_figure",
]

#: Repository ``data/`` folder (recorded GPU results).
DATA_DIR = Path(__file__).resolve().parents[1] / "data"

#: SMs of an H200 (the occupancy argument of notebook 04).
H200_SMS = 132

#: Tile work (padded FLOPs of one launch) a widget run may ask of Warp's CPU device. Measured on a
#: 2-core box: ~5-12 GFLOP/s for the gather kernel, so one launch stays well under a second.
CPU_WORK_BUDGET = 1.5e9

#: The fp32 oracle materialises ``[B, Cin, Nout, max(K, V)]``; above this many elements the chunked
#: ``CompactTorchOps`` in fp32 is the reference instead (same math, bounded memory).
_ORACLE_MAX_ELEMS = 4e7

#: Choices the forward widget offers (anything else is refused with a message).
FORWARD_CHOICES = {
    "tile_m": (8, 16, 32, 64, 128),
    "tile_n": (16, 32, 64, 96, 128, 256),
    "r": (1, 2, 4),
    "block_dim": (32, 64, 128, 256, 512),
    "kernel": ("uncached", "cached"),
    "rf": (None, "rf1", "rf2"),
}
_MAX_BATCH = 4096
_MAX_COUT = 2048

#: Layer names the widgets offer: the real fovi layers, then fovi's synthetic test shapes.
LAYER_CHOICES: Tuple[str, ...] = tuple(LAYERS) + tuple(SYNTHETIC)

_COLOURS = {
    "warp": "#1f77b4", "warp_best": "#17becf", "dense": "#9467bd", "torch": "#ff7f0e",
    "cached": "#2ca02c", "fail": "#d62728", "grey": "#7f7f7f",
}


# =================================================================================================
# set-up, text
# =================================================================================================

def default_device() -> str:
    """``"cuda:0"`` when both Warp and torch see a GPU, else ``"cpu"`` (Warp's CPU device)."""
    try:
        import warp as wp
        from .warp_common import init_warp
        init_warp()
        if wp.is_cuda_available() and torch.cuda.is_available():
            return "cuda:0"
    except Exception:  # noqa: BLE001 - no Warp: the caller sees the CPU and a clear error later
        pass
    return "cpu"


def setup(seed: int = 0) -> str:
    """Quiet Warp logging, fix the seeds, return the device the kernels will run on."""
    import random
    from .warp_common import init_warp
    init_warp()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return default_device()


def device_line(device: str) -> str:
    """One line that says where kernels run, with no device name or version (nbval compares it)."""
    if str(device).startswith("cuda"):
        return "Kernels run on the GPU (tile GEMMs through cuBLASDx; timings are meaningful)."
    return ("Kernels run on Warp's CPU device (no GPU here): results are checked for correctness, "
            "timings are only relative.")


def rel_error(a: torch.Tensor, ref: torch.Tensor, floor: float = 1.0) -> float:
    """``max|a - ref| / max(floor, max|ref|)`` in fp64 (floor 1: an absolute error for O(1) outputs)."""
    a = a.detach().to(torch.float64).cpu()
    ref = ref.detach().to(torch.float64).cpu()
    if a.shape != ref.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(ref.shape)}")
    if a.numel() == 0:
        return 0.0
    if not bool(torch.isfinite(a).all()):
        return math.inf
    scale = max(float(floor), float(ref.abs().max()))
    return float((a - ref).abs().max()) / scale


def tolerance_class(err: float) -> str:
    """``err`` as its order of magnitude: ``"= 0 (bitwise)"``, ``"< 1e-3"``, ... (stable text)."""
    if err is None or (isinstance(err, float) and math.isnan(err)):
        return "not computed"
    if math.isinf(err):
        return "inf (non-finite output)"
    if err == 0:
        return "= 0 (bitwise)"
    k = math.floor(math.log10(err)) + 1          # smallest power of ten strictly above err
    k = max(k, -12)
    return f"< 1e{k:+d}".replace("+", "") if k < 0 else f"< 1e{k}"


def parity_line(what: str, err: float, tol: float, coarse: bool = False) -> str:
    """``"PASS  <what>: max error < 1e-3 (tolerance 1e-2)"`` (or FAIL); no raw floats.

    ``coarse=True`` states only that a passing error is below the tolerance (for fp64 checks, whose
    last bits depend on the BLAS a machine uses: the text stays the same everywhere).
    """
    ok = err is not None and not math.isnan(err) and err <= tol
    if coarse and ok:
        return f"PASS  {what}: max error below {_sci(tol)}"
    return f"{'PASS' if ok else 'FAIL'}  {what}: max error {tolerance_class(err)} (tolerance {_sci(tol)})"


def _sci(x: float) -> str:
    """``1e-2`` style for a power of ten, else 2 significant digits (``3e-3``)."""
    m, e = f"{x:.0e}".split("e")
    return f"{m}e{int(e)}"


def show_source(fn: Callable, marks: Optional[Dict[str, str]] = None, width: int = 104) -> str:
    """The source of ``fn`` (``inspect.getsource``, from the installed package) with numbered lines;
    every line containing a ``marks`` pattern gets ``# <- [label]`` so prose can point at it.

    Patterns that no longer occur are listed at the end (the prose would be stale).
    """
    marks = marks or {}
    src = inspect.getsource(fn).rstrip("\n").split("\n")
    out = []
    for i, line in enumerate(src, 1):
        labels = [lab for pat, lab in marks.items() if pat in line]
        text = f"{i:3d}  {line}"
        if labels:
            text = f"{text:<{width}}# <- [{', '.join(labels)}]"
        out.append(text.rstrip())
    missing = missing_marks(fn, marks)
    if missing:
        out.append(f"(the text points at lines that are no longer here: {missing})")
    return "\n".join(out)


def missing_marks(fn: Callable, marks: Iterable[str]) -> List[str]:
    """Patterns of ``marks`` that do not occur in ``fn``'s source."""
    src = inspect.getsource(fn)
    return [p for p in marks if p not in src]


def format_result(result: dict, keys: Optional[Iterable[str]] = None, digits: int = 4) -> str:
    """``key: value`` lines (floats rounded): stable text of a results dict for compared output."""
    keys = list(result) if keys is None else list(keys)
    lines = []
    for key in keys:
        val = result.get(key)
        if isinstance(val, float):
            val = round(val, digits)
        lines.append(f"{key}: {val}")
    return "\n".join(lines)


def layer_replays_figure(layer: str, rows: List[dict], series, runs: str, empty: str, log: bool = False,
                         height: int = 320) -> go.Figure:
    """Grouped bars of one layer's recorded replays over B (the widgets' side figures of notebooks 01 and 06).

    ``rows``: one dict per batch with a ``B`` and ``records``; ``series``: ``(ms key, config key, name, colour)``
    per bar group; ``runs``: the runs named in the subtitle; ``empty``: the message when there are no rows."""
    if not rows:
        return message_figure(empty)
    fig = go.Figure()
    for key, cfg_key, name, colour in series:
        fig.add_trace(go.Bar(x=[f"B={r['B']}" for r in rows], y=[r[key] for r in rows], name=name,
                             marker_color=colour, customdata=[r.get(cfg_key) for r in rows],
                             hovertemplate="%{x}: %{y:.3f} ms (%{customdata})<extra>" + name + "</extra>"))
    recs = [rec for r in rows for rec in r["records"]]
    title = "ms per op, replayed (log)" if log else "ms per op, CUDA-graph replay"
    fig.update_layout(barmode="group", height=height, yaxis=dict(type="log" if log else "linear", title=title),
                      title=dict(text=f"{layer}: recorded replays<br><sub>{versions_title(recs)} · {runs}, "
                                      "medians</sub>", x=0.01),
                      margin=dict(t=70, b=40), legend=dict(orientation="h", y=-0.2))
    return fig


def message_figure(message: str, height: int = 180) -> go.Figure:
    """A figure that only shows ``message`` (what a plot says when there is nothing to plot)."""
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color=_COLOURS["fail"]))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=30, b=10))
    return fig


def _hline(x, y: float, name: str, colour: str, dash: str = "dash", showlegend: bool = True) -> go.Scatter:
    """A horizontal reference line as a trace from ``x[0]`` to ``x[-1]`` (``add_hline`` annotations
    misplace themselves on log axes and blow up the autorange)."""
    return go.Scatter(x=[x[0], x[-1]], y=[_r4(y), _r4(y)], mode="lines", name=name, showlegend=showlegend,
                      line=dict(color=colour, dash=dash, width=1.5), hoverinfo="name")


def _log_range(values, pad: float = 1.5):
    """``[log10(min/pad), log10(max*pad)]`` over the positive values (for an explicit log-axis range)."""
    v = [float(x) for x in values if x is not None and x > 0 and math.isfinite(float(x))]
    if not v:
        return None
    return [math.log10(min(v) / pad), math.log10(max(v) * pad)]


def batch_menu(batches: Sequence[int], per_b: int, default_b: int, y: float = 1.12) -> List[dict]:
    """``updatemenus`` of a figure whose traces come in ``per_b``-long groups, one group per batch size:
    one button per batch that shows that group only."""
    buttons = []
    for i, b in enumerate(batches):
        vis = [False] * (per_b * len(batches))
        vis[i * per_b:(i + 1) * per_b] = [True] * per_b
        buttons.append(dict(label=f"B = {b}", method="update", args=[{"visible": vis}]))
    return [dict(buttons=buttons, type="buttons", direction="right", x=1.0, xanchor="right", y=y,
                 active=list(batches).index(default_b))]


def _title(main: str, records: List[dict]) -> str:
    """A figure title with the recording's device, Warp and torch versions on a second line."""
    return f"{main}<br><sup>recorded on {versions_title(records)}</sup>"


def _r4(x):
    """Round to 4 significant digits (small, stable figure JSON); None stays None."""
    if x is None:
        return None
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(x) or x == 0:
        return x if math.isfinite(x) else None
    return float(f"{x:.4g}")


# =================================================================================================
# problems
# =================================================================================================

@functools.lru_cache(maxsize=32)
def _meta_cached(layer: str, cout: Optional[int], rf: Optional[str], nodes: Optional[int], seed: int) -> TrainingMeta:
    if layer not in SYNTHETIC:
        spec, rf = resolve_layer(layer, rf)
        g = layer_graph(spec.name, rf)
        cin, nin, v = spec.cin, g.nin, g.v
        cout = spec.cout if cout is None else cout
        if nodes is None or nodes >= g.nout:
            return g.meta(cin, cout)
        idx, rf_index = g.idx, g.rf_index
    else:
        cin, c0, nin, nout, k, v, pads = SYNTHETIC[layer]
        cout = c0 if cout is None else cout
        idx, rf_index = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    if nodes is not None:
        idx, rf_index = idx[:nodes], rf_index[:nodes]
    return build_meta(idx, rf_index, cin=cin, cout=cout, v=v, nin=nin)


def make_meta(layer: str, cout: Optional[int] = None, rf: Optional[str] = None, nodes: Optional[int] = None,
              seed: int = 0, device=None) -> TrainingMeta:
    """Index tables of a real fovi layer (``LAYERS``, or a variant such as ``"res18_stem_rf2"``) or a
    synthetic test shape (``"MAIN"``, ``"ODD"``, ``"PAD_HEAVY"``), with ``cout`` output channels (default:
    the layer's) and only the first ``nodes`` output nodes when given (a sub-layer with the same Cin, Nin,
    K, V: how the CPU widget clamps). ``rf`` None: the layer's network frame (see :mod:`fovi_lab.layers`)."""
    meta = _meta_cached(str(layer), None if cout is None else int(cout), None if rf is None else str(rf),
                        None if nodes is None else int(nodes), int(seed))
    return meta if device is None else meta.to(device)


@dataclass
class Problem:
    """One layer's operands in fp16 on ``device``: ``x [B, Cin, Nin]``, ``weight [Cout, Q]``,
    ``bias [Cout]`` (or None), ``grad_y [B, Cout, Nout]``, and the meta."""

    layer: str
    meta: TrainingMeta
    x: torch.Tensor
    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    grad_y: torch.Tensor
    device: str

    @property
    def batch(self) -> int:
        return int(self.x.shape[0])


def make_problem(layer: str, batch: int, cout: Optional[int] = None, rf: Optional[str] = None, seed: int = 0,
                 device: str = "cpu", nodes: Optional[int] = None, bias: bool = True) -> Problem:
    """Random fp16 operands for ``layer`` (Kaiming-scaled weights so outputs are O(1)), reproducible."""
    meta = make_meta(layer, cout, rf, nodes, seed)
    g = torch.Generator().manual_seed(1000 + seed)
    b = int(batch)
    x = torch.randn(b, meta.cin, meta.nin, generator=g)
    w = torch.randn(meta.cout, meta.q, generator=g) * math.sqrt(2.0 / (meta.cin * meta.k))
    bb = 0.1 * torch.randn(meta.cout, generator=g) if bias else None
    gy = torch.randn(b, meta.cout, meta.nout, generator=g)
    dev = torch.device(device)
    h = lambda t: None if t is None else t.to(dev, torch.float16).contiguous()  # noqa: E731
    return Problem(str(layer), meta.to(dev), h(x), h(w), h(bb), h(gy), str(device))


def reference_forward(meta: TrainingMeta, x, weight, bias) -> Tuple[torch.Tensor, str]:
    """The fp32 reference output and its name: the oracle (gather + one-hot binning + einsum) when it
    fits in memory, else ``CompactTorchOps`` in fp32 (the same sum, chunked)."""
    from .reference import CompactTorchOps, oracle_forward
    b = x.shape[0]
    xf, wf = x.float(), weight.float()
    bf = None if bias is None else bias.float()
    if b * meta.cin * meta.nout * max(meta.k, meta.v) <= _ORACLE_MAX_ELEMS:
        return oracle_forward(xf, wf, bf, meta.idx, meta.rf_index, meta.v), "fp32 oracle"
    return CompactTorchOps.forward(meta, xf, wf, bf), "fp32 torch_compact"


def reference_grads(meta: TrainingMeta, x, weight, grad_y, dtype=torch.float32) -> Tuple[torch.Tensor, torch.Tensor, str]:
    """``(dx, dW, name)``: torch autograd through the oracle in ``dtype`` when it fits, else the explicit
    ``CompactTorchOps`` adjoints in ``dtype``."""
    from .reference import CompactTorchOps, oracle_forward
    b = x.shape[0]
    if b * meta.cin * meta.nout * max(meta.k, meta.v) <= _ORACLE_MAX_ELEMS:
        xr = x.detach().to(dtype).requires_grad_()
        wr = weight.detach().to(dtype).requires_grad_()
        y = oracle_forward(xr, wr, None, meta.idx, meta.rf_index, meta.v, dtype=dtype)
        dx, dw = torch.autograd.grad(y, (xr, wr), grad_y.to(dtype))
        names = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}
        return dx, dw, f"torch autograd of the {names.get(dtype, str(dtype))} oracle"
    gy = grad_y.to(dtype)
    return (CompactTorchOps.grad_input(meta, gy, weight.to(dtype)),
            CompactTorchOps.grad_weight(meta, gy, x.to(dtype)),
            f"{'fp32' if dtype == torch.float32 else str(dtype)} torch_compact adjoints")


# =================================================================================================
# the models: FLOPs, bytes, gathered traffic, tile memory
# =================================================================================================

def shape_of(meta_or_layer, cout: Optional[int] = None, rf: Optional[str] = None) -> dict:
    """``{cin, cout, nin, nout, k, v, p, p64, q}`` of a meta or a layer name."""
    meta = make_meta(meta_or_layer, cout, rf) if isinstance(meta_or_layer, str) else meta_or_layer
    return {k: int(getattr(meta, k)) for k in ("cin", "cout", "nin", "nout", "k", "v", "p", "p64", "q")}


def forward_counts(shape: dict, batch: int, itemsize: int = 2) -> dict:
    """FLOPs of the compact forward (``2 B P64 Cout Nout``), the fewest bytes it must move (x, W, bias,
    both int32 tables and y once each), their ratio, and the same for the inference cache (``Weff``
    read instead of W) and for the dense baseline (depth ``Q`` instead of ``P64``)."""
    b = int(batch)
    s = shape
    flops = 2.0 * b * s["p64"] * s["cout"] * s["nout"]
    tables = 2 * 4 * s["nout"] * s["p64"]
    xy = itemsize * (b * s["cin"] * s["nin"] + b * s["cout"] * s["nout"] + s["cout"])
    w_bytes = itemsize * s["cout"] * s["q"]
    weff_bytes = itemsize * s["nout"] * s["p64"] * pad_to(s["cout"], 64)
    nbytes = float(xy + w_bytes + tables)
    return {
        "flops": flops, "bytes": nbytes, "intensity": flops / nbytes,
        "w_bytes": float(w_bytes), "weff_bytes": float(weff_bytes),
        "cached_bytes": float(xy + weff_bytes + tables / 2), "cached_intensity": flops / (xy + weff_bytes + tables / 2),
        "dense_flops": 2.0 * b * s["q"] * s["cout"] * s["nout"],
    }


def tile_smem_estimate(tile_m: int, tile_n: int, r: int = 1, tile_k: int = 64, cached: bool = False) -> int:
    """Lower-bound estimate of the tile memory one CTA of the gather (or cached) kernel reserves:
    ``r`` A tiles + one W tile (fp16), ``r`` fp32 accumulators, index tiles and bias (notebook 03
    derives this bill and checks it against Warp's own count; Warp's count is at least this)."""
    a = r * tile_m * tile_k * 2
    w = tile_k * tile_n * 2
    acc = r * tile_m * tile_n * 4
    idx = (1 if cached else 2) * tile_k * 4
    return int(a + w + acc + idx + tile_n * 4)


def tile_traffic(shape: dict, batch: int, tile_m: int, tile_n: int, r: int = 1, cached: bool = False,
                 tile_k: int = 64) -> dict:
    """Bytes one call of the tiled forward kernel gathers into its tiles, by stream.

    Grid ``(Nout, ceil(B / (tile_m r)), ceil(Cout / tile_n))``; per CTA and 64-wide p tile: two index
    tiles (one for the cached kernel), one W tile ``[64, tile_n]`` shared by the CTA's ``r`` batch
    sub-tiles, and one A tile ``[64, tile_m]`` per sub-tile that starts inside the batch. So the
    **weight stream** ``= CTAs * P64/64 * 64 * tile_n * 2`` halves when ``r`` doubles, while the A
    stream (every sub-tile reads its own inputs, once per output-channel tile) does not change.

    Returns a dict: ctas, w_bytes, a_bytes, idx_bytes, y_bytes, gathered (sum of the four),
    flops (useful), padded_flops (tile work incl. padding), intensity (useful FLOPs per gathered byte),
    smem (per-CTA tile memory estimate), ctas_per_sm_h200 ... as floats/ints.
    """
    b, tm, tn, r = int(batch), int(tile_m), int(tile_n), int(r)
    nout, cout, p64 = shape["nout"], shape["cout"], shape["p64"]
    groups = -(-b // (tm * r))
    otiles = -(-cout // tn)
    ptiles = -(-p64 // tile_k)
    ctas = nout * groups * otiles
    sub = nout * (-(-b // tm)) * otiles                  # A sub-tiles that run (past-batch ones are skipped)
    w_bytes = ctas * ptiles * tile_k * tn * 2.0
    a_bytes = sub * ptiles * tile_k * tm * 2.0
    idx_bytes = ctas * ptiles * tile_k * 4.0 * (1 if cached else 2)
    y_bytes = 2.0 * b * cout * nout
    flops = 2.0 * b * p64 * cout * nout
    padded = sub * ptiles * 2.0 * tm * tn * tile_k
    gathered = w_bytes + a_bytes + idx_bytes + y_bytes
    return {
        "batch": b, "tile_m": tm, "tile_n": tn, "r": r, "ctas": int(ctas), "w_bytes": w_bytes,
        "a_bytes": a_bytes, "idx_bytes": idx_bytes, "y_bytes": y_bytes, "gathered": gathered,
        "flops": flops, "padded_flops": padded, "padding_waste": 1.0 - flops / padded if padded else 0.0,
        "intensity": flops / gathered, "smem": tile_smem_estimate(tm, tn, r, tile_k, cached),
    }


def traffic_table(shape: dict, batch: int, tiles: Sequence[Tuple[int, int]] = ((16, 32), (32, 64), (64, 64), (64, 128)),
                  rs: Sequence[int] = (1, 2, 4)) -> List[dict]:
    """:func:`tile_traffic` for every (tile, r)."""
    return [tile_traffic(shape, batch, tm, tn, r) for tm, tn in tiles for r in rs]


def traffic_figure(shape: dict, batch: int, tiles=((16, 32), (32, 64), (64, 64), (64, 128)), rs=(1, 2, 4),
                   title: str = "", height: int = 440) -> go.Figure:
    """Left: gathered MB per call by stream (weight / input / index / output) for each tile shape and
    ``r``. Right: what ``r`` costs: tile memory per CTA (KiB) and CTAs per launch."""
    rows = traffic_table(shape, batch, tiles, rs)
    labels = [f"m{t['tile_m']}n{t['tile_n']} r{t['r']}" for t in rows]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.12,
                        specs=[[{}, {"secondary_y": True}]],
                        subplot_titles=("bytes gathered into tiles per call (MB)", "what r costs"))
    for key, name, colour in (("w_bytes", "weight stream", _COLOURS["warp"]),
                              ("a_bytes", "input (A) stream", _COLOURS["torch"]),
                              ("idx_bytes", "index tiles", _COLOURS["grey"]),
                              ("y_bytes", "output", _COLOURS["cached"])):
        fig.add_trace(go.Bar(x=labels, y=[_r4(t[key] / 1e6) for t in rows], name=name,
                             marker_color=colour), row=1, col=1)
    fig.add_trace(go.Bar(x=labels, y=[_r4(t["smem"] / 1024) for t in rows], name="tile memory per CTA (KiB)",
                         marker_color=_COLOURS["dense"], showlegend=True), row=1, col=2)
    fig.add_trace(go.Scatter(x=labels, y=[t["ctas"] for t in rows], name="CTAs per launch", mode="lines+markers",
                             line=dict(color="black")), row=1, col=2, secondary_y=True)
    fig.update_layout(barmode="stack", height=height, margin=dict(l=10, r=10, t=60, b=10),
                      title=title or (f"The traffic model: Nout={shape['nout']}, Cout={shape['cout']}, "
                                      f"P64={shape['p64']}, B={batch}"),
                      legend=dict(orientation="h", y=-0.25))
    fig.update_yaxes(title_text="MB", row=1, col=1)
    fig.update_yaxes(title_text="KiB per CTA", row=1, col=2)
    fig.update_yaxes(title_text="CTAs per launch", type="log", dtick=1, showgrid=False, row=1, col=2, secondary_y=True)
    return fig


# =================================================================================================
# one node's GEMM
# =================================================================================================

def node_gemm(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, node: int) -> dict:
    """Output node ``node`` as one small GEMM (spec §2.2), in fp64 on the CPU.

    ``A_n = xpad[:, input_linear[n]]`` ``[B, P64]`` (pad entries read the zero column),
    ``W_n = W^T[weight_linear[n]]`` ``[P64, Cout]``, ``y_n = A_n @ W_n`` ``[B, Cout]`` (no bias).
    """
    from .reference import pad_flat_input
    meta = meta.to("cpu")
    n = int(node)
    if not 0 <= n < meta.nout:
        raise IndexError(f"node: expected 0 <= node < Nout={meta.nout}, got {node}")
    xpad = pad_flat_input(x.detach().cpu().double(), meta)
    il = meta.input_linear[n].long()
    wl = meta.weight_linear[n].long()
    a = xpad[:, il]
    wn = weight.detach().cpu().double().t()[wl]
    return {"A": a, "W": wn, "y": a @ wn, "input_linear": il, "weight_linear": wl,
            "is_pad": il == meta.pad_column}


def node_gemm_figure(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, node: int,
                     tile_m: int = 32, tile_n: int = 64, max_rows: int = 64, height: int = 380) -> go.Figure:
    """``A_n``, ``W_n`` and ``y_n = A_n W_n`` of one node as heat maps, with the tile grid drawn on:
    64-wide p tiles (the kernel's K loop), ``tile_m`` batch rows, ``tile_n`` output channels. Zero
    columns of ``A_n`` are the pad neighbours and the P..P64 fillers."""
    d = node_gemm(meta, x, weight, node)
    a, wn, y = d["A"][:max_rows], d["W"], d["y"][:max_rows]
    b, p64 = a.shape
    cout = wn.shape[1]
    fig = make_subplots(rows=1, cols=3, column_widths=[0.5, 0.25, 0.25], horizontal_spacing=0.06,
                        subplot_titles=(f"A_n (node {node}): gathered inputs [B, P64]", "W_n [P64, Cout]",
                                        "y_n = A_n W_n [B, Cout]"))
    rnd = lambda t: np.round(t.numpy(), 2).astype(np.float32)  # noqa: E731
    fig.add_trace(go.Heatmap(z=rnd(a), colorscale="RdBu", zmid=0, showscale=False), row=1, col=1)
    zero_cols = torch.nonzero(d["is_pad"]).flatten().tolist()
    fig.add_trace(go.Scatter(x=zero_cols, y=[-1.5] * len(zero_cols), mode="markers", cliponaxis=False,
                             name="zero columns of A_n (pad neighbours, P..P64 fillers)",
                             marker=dict(symbol="triangle-down", size=7, color=_COLOURS["fail"])), row=1, col=1)
    fig.add_trace(go.Heatmap(z=rnd(wn), colorscale="RdBu", zmid=0, showscale=False), row=1, col=2)
    fig.add_trace(go.Heatmap(z=rnd(y), colorscale="RdBu", zmid=0, showscale=False), row=1, col=3)
    line = dict(color="black", width=1)
    for p in range(64, p64, 64):
        fig.add_vline(x=p - 0.5, line=line, row=1, col=1)
        fig.add_hline(y=p - 0.5, line=line, row=1, col=2)
    for m in range(tile_m, b, tile_m):
        fig.add_hline(y=m - 0.5, line=dict(color="black", width=1, dash="dot"), row=1, col=1)
        fig.add_hline(y=m - 0.5, line=dict(color="black", width=1, dash="dot"), row=1, col=3)
    for o in range(tile_n, cout, tile_n):
        fig.add_vline(x=o - 0.5, line=dict(color="black", width=1, dash="dot"), row=1, col=2)
        fig.add_vline(x=o - 0.5, line=dict(color="black", width=1, dash="dot"), row=1, col=3)
    for col in (1, 2, 3):
        fig.update_yaxes(autorange="reversed", row=1, col=col)
    fig.update_xaxes(title_text="p (solid lines: 64-wide p tiles)", row=1, col=1)
    fig.update_xaxes(title_text="o", row=1, col=2)
    fig.update_xaxes(title_text="o", row=1, col=3)
    fig.update_yaxes(title_text="b", row=1, col=1)
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=50, b=10), legend=dict(orientation="h", y=-0.25))
    return fig


# =================================================================================================
# running the forward kernels (the widget's engine)
# =================================================================================================

def registered_forward_config(kernel: str, tile_m: int, tile_n: int, r: int, block_dim: int) -> Optional[str]:
    """The name :mod:`fovi_lab.warp_forward` registers for these tiles (gather family for ``"uncached"``,
    ``c_*`` for ``"cached"``), or None when the combination is not registered."""
    from . import warp_forward as F
    fam = "cached" if kernel == "cached" else "gather"
    names = F.cached_config_names() if fam == "cached" else F.uncached_config_names("gather")
    for name in names:
        c = F.config_spec(name)
        if (c.family, c.tile_m, c.tile_n, c.r, c.block_dim) == (fam, tile_m, tile_n, r, block_dim):
            return name
    return None


_LAB_KERNELS: Dict[tuple, tuple] = {}


def _forward_kernel(kernel: str, tile_m: int, tile_n: int, r: int, block_dim: int, device: str):
    """``(name, config, kernel, ok, why, built_now)``. Registered tiles go through the package's own
    build-and-canary cache (shared with every other caller); other tiles are built here the same way
    (the package's factory, then its NaN canary)."""
    from . import warp_forward as F
    name = registered_forward_config(kernel, tile_m, tile_n, r, block_dim)
    if name is not None:
        key = ("registered", name, device)
        built_now = key not in _LAB_KERNELS
        if kernel == "cached":
            built = F._get_config(name, device)
        else:
            built = F._get_uncached_batch_config(name, device)
        why = F._VALIDATED.why(F._cache_key(name, F._mathdx_default()), device) if built is None else "ok"
        _LAB_KERNELS[key] = (name,)
        return name, (built.config if built else None), (built.kernel if built else None), built is not None, why, built_now
    fam = "cached" if kernel == "cached" else "gather"
    lab_name = (f"lab_c_m{tile_m}n{tile_n}b{block_dim}" if fam == "cached"
                else f"lab_m{tile_m}n{tile_n}r{r}b{block_dim}")
    key = (fam, tile_m, tile_n, r, block_dim, device)
    if key in _LAB_KERNELS:
        return _LAB_KERNELS[key] + (False,)
    cfg = F.FwdConfig(lab_name, fam, tile_m, tile_n, 64, r, block_dim)
    try:
        k = F._build_kernel(cfg)
        ok, why = F._canary(k, tile_m, tile_n, r, block_dim, device)
    except Exception as exc:  # noqa: BLE001 - a compile error is "unlaunchable" too
        k, ok, why = None, False, f"build failed: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
    _LAB_KERNELS[key] = (lab_name, cfg, k if ok else None, ok, why)
    return _LAB_KERNELS[key] + (True,)


def _sync(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def _time_ms(fn: Callable[[], object], device: str, budget_s: float = 1.0, max_reps: int = 7) -> float:
    """Median ms of ``fn()`` after one warm-up call; stops early when ``budget_s`` is spent (>= 1 rep)."""
    fn()
    _sync(device)
    times: List[float] = []
    t_start = time.perf_counter()
    while len(times) < max_reps:
        if str(device).startswith("cuda"):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() - t_start > budget_s:
            break
    return float(np.median(times))


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check_common(layer, batch, cout, rf) -> Optional[str]:
    if layer not in LAYER_CHOICES:
        return f"layer must be one of {', '.join(LAYER_CHOICES)}; got {layer!r}"
    if not _is_int(batch) or not 1 <= batch <= _MAX_BATCH:
        return f"batch must be an integer in [1, {_MAX_BATCH}], got {batch!r}"
    if cout is not None and (not _is_int(cout) or not 1 <= cout <= _MAX_COUT):
        return f"Cout must be an integer in [1, {_MAX_COUT}] (or None for the layer's own), got {cout!r}"
    if rf not in FORWARD_CHOICES["rf"]:
        return f"rf must be 'rf1', 'rf2' or None (the layer's network frame), got {rf!r}"
    return None


def _clamp(shape: dict, batch: int, work: Callable[[int, int], float], device: str,
           budget: float, tile_rows: int = 1) -> Tuple[int, Optional[int], Optional[str]]:
    """(batch, nodes or None, note): on the CPU, shrink the batch (not below one CTA's ``tile_rows``:
    a smaller batch saves no tile work), then the output nodes, until ``work(batch, nodes)`` and the
    oracle's memory fit. On a GPU nothing is clamped."""
    if str(device).startswith("cuda"):
        return batch, None, None
    b, n = batch, shape["nout"]
    elems = lambda bb, nn: bb * shape["cin"] * nn * max(shape["k"], shape["v"])  # noqa: E731
    floor = max(1, min(batch, tile_rows))
    while b > floor and work(b, n) > budget:
        b = max(floor, b // 2)
    while n > 1 and work(b, n) > budget:
        n = max(1, n // 2)
    while elems(b, n) > _ORACLE_MAX_ELEMS and (b > 1 or n > 1):
        if b > 1:
            b = max(1, b // 2)
        else:
            n = max(1, n // 2)
    if (b, n) == (batch, shape["nout"]):
        return batch, None, None
    parts = []
    if b != batch:
        parts.append(f"batch {batch} -> {b}")
    if n != shape["nout"]:
        parts.append(f"output nodes {shape['nout']} -> {n} (the first {n})")
    note = (f"clamped for Warp's CPU device: {', '.join(parts)} "
            f"(at most {budget / 1e9:.1f} GFLOP of tile work per launch)")
    return b, (n if n != shape["nout"] else None), note


@dataclass
class RunLog:
    """The runs of one widget, drawn as one figure (each run adds a bar)."""

    runs: List[dict] = field(default_factory=list)
    title: str = "runs so far"

    def add(self, result: dict) -> None:
        self.runs.append(result)

    def figure(self, message: Optional[str] = None, height: int = 420) -> go.Figure:
        """Top: compile (build + canary) time per run, s. Bottom: kernel run time vs the torch
        reference on the same device, ms (log). Red bars: runs whose output failed the check."""
        if not self.runs:
            return message_figure(message or "no runs yet: press Run")
        labels = [f"#{i + 1} {r['label']}" for i, r in enumerate(self.runs)]
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08, row_heights=[0.35, 0.65],
                            subplot_titles=("compile + canary (s); 0 = already built in this session",
                                            "run time (ms, median)"))
        fig.add_trace(go.Bar(x=labels, y=[_r4(r.get("compile_s")) for r in self.runs], name="compile + canary",
                             marker_color=_COLOURS["grey"]), row=1, col=1)
        colours = [_COLOURS["warp"] if r.get("passed") else _COLOURS["fail"] for r in self.runs]
        fig.add_trace(go.Bar(x=labels, y=[_r4(r.get("run_ms")) for r in self.runs], name="Warp kernel(s)",
                             marker_color=colours), row=2, col=1)
        fig.add_trace(go.Bar(x=labels, y=[_r4(r.get("torch_ms")) for r in self.runs],
                             name=self.runs[-1].get("torch_name", "torch reference"),
                             marker_color=_COLOURS["torch"]), row=2, col=1)
        fig.update_yaxes(type="log", row=2, col=1)
        fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=60, b=10),
                          title=message or self.title, legend=dict(orientation="h", y=-0.15))
        return fig


def _fail(result: dict, log: Optional[RunLog], message: str) -> Tuple[dict, go.Figure]:
    result.update(ok=False, passed=False, message=message)
    fig = log.figure(message=message) if (log is not None and log.runs) else message_figure(message)
    return result, fig


def _answer(result: dict, log: Optional[RunLog]) -> Tuple[dict, go.Figure]:
    """Add a finished run to ``log`` (or to a fresh one) and return it with the log's figure."""
    log = RunLog() if log is None else log
    log.add(result)
    return result, log.figure(message=result["message"])


def explore_forward(layer: str = "res18_layer1", batch: int = 64, cout: Optional[int] = None,
                    tile_m: int = 32, tile_n: int = 64, r: int = 1, block_dim: int = 128,
                    kernel: str = "uncached", rf: Optional[str] = None, device: Optional[str] = None,
                    log: Optional[RunLog] = None, budget: float = CPU_WORK_BUDGET,
                    seed: int = 0) -> Tuple[dict, go.Figure]:
    """Run the real forward kernel with these tiles on ``layer`` and check it against the reference.

    Args:
        layer: a :data:`LAYER_CHOICES` name. batch, cout: B and Cout (None: the layer's Cout).
        tile_m, tile_n, r, block_dim: the kernel's compile-time tiles (see :data:`FORWARD_CHOICES`);
            ``r`` batch tiles share each gathered weight tile (the uncached kernel only).
        kernel: ``"uncached"`` (the gather kernel, per-call weight gather) or ``"cached"`` (plain loads
            from the inference cache ``Weff``).
        device: ``"cpu"`` / ``"cuda:0"`` (default: :func:`default_device`). On the CPU the batch and
            then the output nodes are clamped so one launch is at most ``budget`` FLOPs of tile work
            (the result's ``clamp`` says so).
        log: a :class:`RunLog`; a successful run is appended and the returned figure shows every run.

    Returns:
        ``(result, figure)``. ``result`` always has ``ok``, ``passed`` and ``message``; after a run also
        ``config`` (the registered name or ``lab_*``), ``registered``, ``batch``, ``nodes``, ``clamp``,
        ``err`` (max error over max(1, max|ref|)), ``tolerance``, ``parity`` (a PASS/FAIL line),
        ``reference``, ``compile_s``, ``run_ms`` (kernel alone), ``torch_ms``, ``torch_name``,
        ``gflops`` (useful FLOPs / kernel time) and the traffic model of the call. Invalid or
        unlaunchable choices give ``ok=False`` and a message, never an exception.
    """
    from . import warp_forward as F
    from .reference import CompactTorchOps, build_effective_weight
    result = {"ok": False, "passed": False, "layer": layer, "batch_requested": batch, "cout_requested": cout,
              "tile_m": tile_m, "tile_n": tile_n, "r": r, "block_dim": block_dim, "kernel": kernel}
    problem = _check_common(layer, batch, cout, rf)
    for key, val in (("tile_m", tile_m), ("tile_n", tile_n), ("r", r), ("block_dim", block_dim), ("kernel", kernel)):
        if problem is None and (val not in FORWARD_CHOICES[key] or isinstance(val, bool)):
            problem = f"{key} must be one of {FORWARD_CHOICES[key]}, got {val!r}"
    if problem is None and kernel == "cached" and r != 1:
        problem = "the cached kernel has no weight-reuse loop: use r = 1 with kernel='cached'"
    if problem is not None:
        return _fail(result, log, problem)
    try:
        device = device or default_device()
        dev = "cpu" if device == "cpu" else F._device_str(device)
        shape = shape_of(make_meta(layer, cout, rf))
        cached = kernel == "cached"
        smem = tile_smem_estimate(tile_m, tile_n, r, cached=cached)
        limit = _tile_memory_limit(dev)
        if smem > limit:
            return _fail(result, log, (f"unlaunchable: m{tile_m}n{tile_n}r{r} needs at least {smem // 1024} KiB of "
                                       f"tile memory per CTA, over this device's {limit // 1024} KiB "
                                       f"(not compiled; pick smaller tiles or a smaller r)"))
        work = lambda bb, nn: tile_traffic(dict(shape, nout=nn), bb, tile_m, tile_n, r, cached)["padded_flops"]  # noqa: E731
        b, nodes, note = _clamp(shape, batch, work, dev, budget, tile_rows=tile_m * r)
        pb = make_problem(layer, b, cout, rf, seed=seed, device="cpu" if dev == "cpu" else dev, nodes=nodes)
        meta = pb.meta
        t0 = time.perf_counter()
        name, cfg, kern, ok, why, built_now = _forward_kernel(kernel, tile_m, tile_n, r, block_dim, dev)
        compile_s = time.perf_counter() - t0 if built_now else 0.0
        result.update(config=name, registered=not name.startswith("lab_"), compile_s=compile_s)
        if not ok:
            return _fail(result, log, f"unlaunchable on this device: {name} ({why})")
        if cached:
            weff = build_effective_weight(meta, pb.weight, cout_multiple=math.lcm(64, tile_n))
            plan = F._plan_cached(cfg, kern, pb.x, weff, pb.bias, meta.input_linear, meta.cout, "staged")
        else:
            plan = F._plan_uncached(cfg, kern, pb.x, pb.weight, pb.bias, meta.input_linear, meta.weight_linear,
                                    "staged")
        plan.launch()
        y = plan.finish()
        _sync(dev)
        ref, ref_name = reference_forward(meta, pb.x, pb.weight, pb.bias)
        err = rel_error(y, ref)
        tol = 1e-2
        run_ms = _time_ms(plan.launch, dev)
        xf = pb.x if dev != "cpu" else pb.x.float()
        wf = pb.weight if dev != "cpu" else pb.weight.float()
        bf = None if pb.bias is None else (pb.bias if dev != "cpu" else pb.bias.float())
        torch_ms = _time_ms(lambda: CompactTorchOps.forward(meta, xf, wf, bf), dev)
        traffic = tile_traffic(shape_of(meta), b, tile_m, tile_n, r, cached)
        label = f"{layer} B={b} {name}"
        what = f"{'cached' if cached else 'uncached'} kernel {name} on {layer} (B={b}, Cout={meta.cout})"
        result.update(
            ok=True, passed=err <= tol, batch=b, nodes=meta.nout, cout=meta.cout, clamp=note, err=err,
            tolerance=tol, parity=parity_line(what + f" vs the {ref_name}", err, tol), reference=ref_name,
            run_ms=run_ms, torch_ms=torch_ms,
            torch_name="torch_compact (fp32 on the CPU)" if dev == "cpu" else "torch_compact (fp16)",
            gflops=traffic["flops"] / (run_ms * 1e6), ctas=traffic["ctas"], smem_estimate=smem,
            w_bytes=traffic["w_bytes"], a_bytes=traffic["a_bytes"], padded_flops=traffic["padded_flops"],
            label=label, device=dev,
        )
        result["message"] = result["parity"] + (f"  [{note}]" if note else "")
        return _answer(result, log)
    except Exception as exc:  # noqa: BLE001 - the widget must answer with a message
        return _fail(result, log, f"could not run: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")


def _tile_memory_limit(device: str) -> int:
    """Tile memory a CTA may reserve: Warp's 256 KiB CPU arena, or the GPU's opt-in shared memory."""
    if str(device).startswith("cuda"):
        try:
            props = torch.cuda.get_device_properties(torch.device(device))
            return int(getattr(props, "shared_memory_per_block_optin", 0) or 227 * 1024)
        except Exception:  # noqa: BLE001
            return 227 * 1024
    return 256 * 1024


def reuse_live(layer: str = "res18_layer1", batch: int = 64, tile_m: int = 32, tile_n: int = 64,
               rs: Sequence[int] = (1, 2, 4), block_dim: int = 128, device: Optional[str] = None,
               budget: float = CPU_WORK_BUDGET) -> List[dict]:
    """Run the uncached kernel with ``r`` = each of ``rs`` (same tiles otherwise) on one shape:
    every run's :func:`explore_forward` result, plus ``rel_time`` = its kernel time over r=1's."""
    out = []
    for r in rs:
        res, _ = explore_forward(layer, batch, None, tile_m, tile_n, r, block_dim, "uncached", device=device,
                                 budget=budget)
        out.append(res)
    base = next((x.get("run_ms") for x in out if x.get("r") == rs[0] and x.get("ok")), None)
    for x in out:
        x["rel_time"] = (x["run_ms"] / base) if (base and x.get("ok")) else None
    return out


def reuse_live_figure(rows: List[dict], height: int = 360) -> go.Figure:
    """Kernel time relative to r=1 and the modelled weight-stream bytes relative to r=1, per r."""
    ok = [x for x in rows if x.get("ok")]
    if not ok:
        return message_figure("no successful run to plot")
    base_w = ok[0]["w_bytes"]
    labels = [f"r={x['r']} ({x['config']})" for x in ok]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=[_r4(x["rel_time"]) for x in ok], name="measured kernel time / r=1",
                         marker_color=_COLOURS["warp"]))
    fig.add_trace(go.Bar(x=labels, y=[_r4(x["w_bytes"] / base_w) for x in ok], name="modelled weight stream / r=1",
                         marker_color=_COLOURS["grey"]))
    dev = ok[0].get("device", "cpu")
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=60, b=10),
                      title=(f"{ok[0]['layer']}, B={ok[0]['batch']}, measured here on "
                             f"{'the GPU' if str(dev).startswith('cuda') else 'the CPU (relative only)'}"),
                      yaxis_title="relative to r = 1", legend=dict(orientation="h", y=-0.2))
    fig.add_hline(y=1.0, line=dict(color="black", width=1, dash="dot"))
    return fig


# =================================================================================================
# adjoints
# =================================================================================================

def adjoint_by_node_gemms(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, grad_y: torch.Tensor,
                          dtype=torch.float64) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dW)`` written out as per-node GEMMs plus scatters (spec §3), in ``dtype`` on the CPU:
    ``dA_n = g_n W_n^T`` scattered through ``input_linear`` (pad column dropped), ``dWeff_n = A_n^T g_n``
    scattered through ``weight_linear``. A readable loop, not a fast one."""
    from .reference import pad_flat_input
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
    from . import warp_adjoint as wa
    from .reference import CompactTorchOps
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


def _adjoint_spec(kind: str, config: str) -> dict:
    from . import warp_adjoint as wa
    table = wa._GRAD_INPUT_CONFIG_SPECS if kind == "gi" else wa._GRAD_WEIGHT_CONFIG_SPECS
    base = config[:-4] if config.endswith("_f32") else config
    if base not in table:
        raise KeyError(f"{kind} config must be one of {sorted(table)}, got {config!r}")
    return dict(table[base])


def adjoint_grid(kind: str, config: str, shape: dict, batch: int, sms: int = H200_SMS,
                 stage_budget: int = 256 << 20) -> dict:
    """CTAs per launch of a gi/gw stage kernel on one layer, and what that is in waves of ``sms`` SMs.

    gi (``dA_stage [Nout, P64, Bchunk]``, batch chunked so the fp16 stage fits ``stage_budget``):
    ``gi2`` grid ``(Nout, Bchunk/tile_b)`` with the P loop inside the CTA; ``gi3`` grid
    ``(Nout, P64/tile_p, Bchunk/tile_b)``. gw (``dWeff [nc, P64, Cout_pad]``, nodes chunked the same
    way): ``gw2`` ``(nc, Cout_pad/tile_n)``; ``gw3`` ``(nc, P64/tile_p, Cout_pad/tile_n)``; ``gw4`` as gw3
    with two o tiles per CTA. ``p`` variants (register prefetch) have their base version's grid.

    Returns dict: dims and ctas of the first (full) launch, launches (chunks), chunk (batch columns
    of a gi launch / nodes of a gw launch), waves (ctas / sms), steps_per_cta (tile GEMMs one CTA
    runs), ctas_per_sm.
    """
    spec = _adjoint_spec(kind, config)
    ver = str(spec["version"]).rstrip("p")
    itemsize = 4 if config.endswith("_f32") else 2
    b, nout, p64, cout = int(batch), shape["nout"], shape["p64"], shape["cout"]
    n_p = p64 // spec["tile_p"]
    if kind == "gi":
        tb = spec["tile_b"]
        cpad = pad_to(cout, spec["tile_o"])
        per_b = nout * p64 * itemsize
        bchunk = max(tb, (stage_budget // max(1, per_b)) // tb * tb)
        bchunk = min(bchunk, pad_to(b, tb))
        launches = -(-b // bchunk)
        nb = bchunk // tb
        n_o = cpad // spec["tile_o"]
        chunk = bchunk
        if ver == "3":
            dims, steps = (nout, n_p, nb), n_o
        else:
            dims, steps = (nout, nb), n_p * n_o
    else:
        tn = spec["tile_n"]
        cpad = pad_to(cout, tn * (2 if ver == "4" else 1))
        bpad = pad_to(b, 64)
        per_node = p64 * cpad * itemsize
        nc = max(1, min(nout, stage_budget // max(1, per_node)))
        launches = -(-nout // nc)
        n_b = bpad // 64
        chunk = nc
        if ver == "2":
            dims, steps = (nc, cpad // tn), n_p * n_b
        elif ver == "4":
            dims, steps = (nc, n_p, cpad // (2 * tn)), 2 * n_b
        else:
            dims, steps = (nc, n_p, cpad // tn), n_b
    ctas = int(np.prod(dims))
    return {"kind": kind, "config": config, "dims": tuple(int(d) for d in dims), "ctas": ctas,
            "launches": int(launches), "chunk": int(chunk), "waves": ctas / sms, "ctas_per_sm": ctas / sms, "steps_per_cta": int(steps)}


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
                     sms: int = H200_SMS, height: int = 520) -> go.Figure:
    """CTAs per launch of each gi/gw grid on every layer (log scale), against one wave of ``sms`` SMs
    and four CTAs per SM; a dropdown picks the batch."""
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
                fig.add_trace(go.Bar(x=[x["layer"] for x in sel], y=[x["ctas"] for x in sel], name=c,
                                     marker_color=palette[ci % len(palette)], visible=bi == len(batches) - 1,
                                     customdata=[[x["waves"], x["steps_per_cta"], x["launches"]] for x in sel],
                                     hovertemplate="%{x}: %{y} CTAs = %{customdata[0]:.2f} waves, "
                                                   "%{customdata[1]} tile GEMMs per CTA, %{customdata[2]} launch(es)"
                                                   "<extra>" + c + "</extra>"),
                              row=row, col=1)
    all_ctas = [c for t in fig.data for c in t.y]
    for row in (1, 2):
        fig.add_trace(_hline(layers, sms, f"{sms} CTAs: one per SM", "black", "solid", showlegend=row == 1),
                      row=row, col=1)
        fig.add_trace(_hline(layers, 4 * sms, "4 CTAs per SM", "black", "dot", showlegend=row == 1), row=row, col=1)
        fig.update_yaxes(type="log", title_text="CTAs per launch", range=_log_range(all_ctas + [sms, 4 * sms]),
                         row=row, col=1)
    buttons = []
    for bi, b in enumerate(batches):
        vis = [False] * (n_per_b * len(batches)) + [True] * 4          # the four reference lines stay
        vis[bi * n_per_b:(bi + 1) * n_per_b] = [True] * n_per_b
        buttons.append(dict(label=f"B = {b}", method="update",
                            args=[{"visible": vis}, {"title": f"CTAs per stage launch at B = {b} (H200: {sms} SMs)"}]))
    fig.update_layout(height=height, barmode="group", margin=dict(l=10, r=10, t=80, b=10),
                      title=f"CTAs per stage launch at B = {batches[-1]} (H200: {sms} SMs)",
                      updatemenus=[dict(buttons=buttons, direction="right", x=1.0, xanchor="right", y=1.12,
                                        active=len(batches) - 1, type="buttons")],
                      legend=dict(orientation="h", y=-0.2))
    return fig


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
    from . import warp_adjoint as wa
    from .reference import CompactTorchOps
    result = {"ok": False, "passed": False, "layer": layer, "batch_requested": batch, "cout_requested": cout,
              "gi_config": gi_config, "gw_config": gw_config}
    problem = _check_common(layer, batch, cout, rf)
    gi_names = sorted(wa._GRAD_INPUT_CONFIG_SPECS) + sorted(n + "_f32" for n in wa._GRAD_INPUT_CONFIG_SPECS)
    gw_names = sorted(wa._GRAD_WEIGHT_CONFIG_SPECS) + sorted(n + "_f32" for n in wa._GRAD_WEIGHT_CONFIG_SPECS)
    if problem is None and gi_config not in gi_names:
        problem = f"gi config must be one of {', '.join(sorted(wa._GRAD_INPUT_CONFIG_SPECS))} (optionally + '_f32'), got {gi_config!r}"
    if problem is None and gw_config not in gw_names:
        problem = f"gw config must be one of {', '.join(sorted(wa._GRAD_WEIGHT_CONFIG_SPECS))} (optionally + '_f32'), got {gw_config!r}"
    if problem is not None:
        return _fail(result, log, problem)
    try:
        device = device or default_device()
        dev = "cpu" if device == "cpu" else wa._normalize_device(device)
        shape = shape_of(make_meta(layer, cout, rf))
        gis, gws = _adjoint_spec("gi", gi_config), _adjoint_spec("gw", gw_config)

        def work(bb, nn):
            s = dict(shape, nout=nn)
            gi_w = 2.0 * nn * s["p64"] * pad_to(s["cout"], gis["tile_o"]) * pad_to(bb, gis["tile_b"])
            gw_w = 2.0 * nn * s["p64"] * pad_to(s["cout"], gws["tile_n"] * 2) * pad_to(bb, 64)
            return max(gi_w, gw_w)

        b, nodes, note = _clamp(shape, batch, work, dev, budget, tile_rows=max(gis["tile_b"], 64))
        pb = make_problem(layer, b, cout, rf, seed=seed, device="cpu" if dev == "cpu" else dev, nodes=nodes,
                          bias=False)
        meta = pb.meta
        t0 = time.perf_counter()
        built_now = False
        names = [("gi", gi_config), ("csr", "dx_f32" if gi_config.endswith("_f32") else "dx_f16"),
                 ("gw", gw_config), ("csr", "dw_f32" if gw_config.endswith("_f32") else "dw_f16")]
        for kind, name in names:
            key = ("adjoint", kind, name, dev)
            built_now |= key not in _LAB_KERNELS
            k = wa._get_grad_kernel(kind, name, dev)
            _LAB_KERNELS[key] = (name,)
            if k is None:
                why = wa._GRAD_KERNELS.why((kind, name), dev)
                result["compile_s"] = time.perf_counter() - t0
                return _fail(result, log, f"unlaunchable on this device: {kind} kernel {name} ({why})")
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
        run_ms = _time_ms(lambda: (wa.grad_input(meta, pb.grad_y, pb.weight, config=gi_config),
                                   wa.grad_weight(meta, pb.grad_y, pb.x, config=gw_config)), dev)
        if dev == "cpu":
            gf, wf, xf = pb.grad_y.float(), pb.weight.float(), pb.x.float()
        else:
            gf, wf, xf = pb.grad_y, pb.weight, pb.x
        torch_ms = _time_ms(lambda: (CompactTorchOps.grad_input(meta, gf, wf),
                                     CompactTorchOps.grad_weight(meta, gf, xf)), dev)
        s = shape_of(meta)
        gi_grid = adjoint_grid("gi", gi_config, s, b)
        gw_grid = adjoint_grid("gw", gw_config, s, b)
        tag = f"{layer} (B={b}, Cout={meta.cout})"
        result.update(
            ok=True, passed=bool(err_dx <= tol and err_dw <= tol), batch=b, nodes=meta.nout, cout=meta.cout,
            clamp=note, err_dx=err_dx, err_dw=err_dw, tolerance=tol, reference=ref_name, deterministic=det,
            parity_dx=parity_line(f"dx, {gi_config} + reverse-CSR reduction on {tag} vs {ref_name}", err_dx, tol),
            parity_dw=parity_line(f"dW, {gw_config} + weight-row reduction on {tag} vs {ref_name}", err_dw, tol),
            compile_s=compile_s, run_ms=run_ms, torch_ms=torch_ms,
            torch_name="torch_compact adjoints (fp32 on the CPU)" if dev == "cpu" else "torch_compact adjoints (fp16)",
            gi_ctas=gi_grid["ctas"], gw_ctas=gw_grid["ctas"], label=f"{layer} B={b} {gi_config}+{gw_config}",
            device=dev,
        )
        result["message"] = (f"{'PASS' if result['passed'] else 'FAIL'}  dx {tolerance_class(err_dx)}, "
                             f"dW {tolerance_class(err_dw)} vs {ref_name}; "
                             f"bitwise identical on a second run: {'yes' if det else 'NO'}"
                             + (f"  [{note}]" if note else ""))
        return _answer(result, log)
    except Exception as exc:  # noqa: BLE001 - the widget must answer with a message
        return _fail(result, log, f"could not run: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")


# =================================================================================================
# recorded data
# =================================================================================================

def load_records(data_dir=None, patterns: Sequence[str] = ("*.jsonl", "*.jsonl.gz")) -> List[dict]:
    """Every JSON-lines record under ``data_dir`` (default: the repository's ``data/``) matching
    ``patterns``, each tagged with ``_file``. ``.gz`` files are read through gzip (the big sweeps are stored
    compressed). Unreadable lines are skipped; no folder means ``[]``.

    A record measured on another reference frame than its layer's network frame is named as that variant
    (``layer`` becomes e.g. ``"res18_stem_rf2"``, :func:`fovi_lab.layers.layer_name`), so a name always means
    one table."""
    d = Path(data_dir) if data_dir is not None else DATA_DIR
    paths = sorted({p for pat in patterns for p in glob.glob(str(d / pat))})
    out: List[dict] = []
    for p in paths:
        try:
            with (gzip.open(p, "rt") if p.endswith(".gz") else open(p)) as f:
                for line in f:
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        r = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(r, dict) and "impl" in r and "layer" in r:
                        r["_file"] = os.path.basename(p)
                        if r["layer"] in LAYERS and r.get("rf") in RF_MULT:
                            r["layer"] = layer_name(r["layer"], r["rf"])
                        out.append(r)
        except OSError:
            continue
    return out


def forward_records(data_dir=None, variants: bool = False) -> List[dict]:
    """Forward records (:mod:`fovi_lab.bench.forward`): the ones without a backward ``mode``. Records
    flagged ``note_run`` (development runs, non-default variants) only with ``variants=True``."""
    return [r for r in load_records(data_dir) if "mode" not in r and (variants or not r.get("note_run"))]


def backward_records(data_dir=None, mode: Optional[str] = None, variants: bool = False) -> List[dict]:
    """Backward / train-step records (:mod:`fovi_lab.bench.backward`: they carry ``mode``); ``note_run``
    records only with ``variants=True``."""
    recs = [r for r in load_records(data_dir) if "mode" in r and (variants or not r.get("note_run"))]
    return [r for r in recs if mode is None or r.get("mode") == mode]


def versions_title(records: List[dict]) -> str:
    """``"NVIDIA H200 · Warp 1.19.0 · torch 2.11.0+cu130 · 2026-11-29"`` (every distinct value)."""
    if not records:
        return "no recorded data"

    def uniq(key, fmt=lambda v: v):
        vals = sorted({fmt(r[key]) for r in records if r.get(key)})
        return ", ".join(vals) if vals else "?"

    dates = sorted({str(r["date"])[:10] for r in records if r.get("date")})
    when = dates[0] if len(dates) == 1 else (f"{dates[0]} .. {dates[-1]}" if dates else "?")
    return f"{uniq('device')} · Warp {uniq('warp')} · torch {uniq('torch')} · {when}"


def _runs(records: List[dict]) -> Dict[tuple, List[List[dict]]]:
    """(layer, B, mode) -> that shape's runs, oldest first. A run is the records of one benchmark
    invocation: same file and same ``date`` stamp. Figures never mix two runs of one shape (the config
    chosen, the configs swept and the baselines of a row always come from one invocation)."""
    groups: Dict[tuple, Dict[tuple, List[dict]]] = {}
    for r in records:
        key = (r.get("layer"), r.get("B"), r.get("mode"))
        groups.setdefault(key, {}).setdefault((str(r.get("date", "")), r.get("_file", "")), []).append(r)
    return {k: [v[rk] for rk in sorted(v)] for k, v in groups.items()}


def _latest_where(runs: List[List[dict]], pred: Callable[[List[dict]], bool]) -> Optional[List[dict]]:
    """The most recent run that satisfies ``pred`` (None if none does)."""
    for run in reversed(runs):
        if pred(run):
            return run
    return None


def _n_swept(run: List[dict]) -> int:
    return len({r.get("config") for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")})


def _sweep_run(runs: List[List[dict]]) -> Optional[List[dict]]:
    """The latest run of a shape that timed several uncached configs (a ``--all-configs`` sweep)."""
    return _latest_where(runs, lambda run: _n_swept(run) >= 3)


def _pick_run(runs: List[List[dict]]) -> Optional[List[dict]]:
    """The latest run of a shape that timed the chosen config as a whole op (falls back to the latest run)."""
    return (_latest_where(runs, lambda run: any(r.get("impl") == "warp_uncached" and r.get("chosen") and r.get("ms")
                                                for r in run)) or (runs[-1] if runs else None))


def _sweep_records(records: List[dict]) -> List[dict]:
    """The uncached-kernel records of every shape's latest sweep run."""
    out: List[dict] = []
    for key, runs in _runs(records).items():
        run = _sweep_run(runs)
        if run is not None:
            out += [r for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")]
    return out


def _latest_run(records: List[dict]) -> List[dict]:
    """Per (layer, B, mode), the records of the most recent run only."""
    return [r for runs in _runs(records).values() for r in runs[-1]]


def _latest(records: List[dict]) -> Dict[tuple, dict]:
    """(layer, B, impl, config) -> one record of the most recent run of that shape (last one wins)."""
    out: Dict[tuple, dict] = {}
    for r in _latest_run(records):
        out[(r.get("layer"), r.get("B"), r.get("impl"), r.get("config"))] = r
    return out


def _layer_order(names: Iterable[str]) -> List[str]:
    order = {n: i for i, n in enumerate(LAYER_CHOICES)}
    return sorted(set(names), key=lambda n: (order.get(n, len(order)), n))


def _forward_rows(records: List[dict]) -> Tuple[List[dict], List[dict]]:
    """(rows of :func:`forward_table`, the records they were read from)."""
    rows, used = [], []
    for (layer, b, mode), runs in _runs(records).items():
        if layer == "gemm4096" or mode is not None:
            continue
        prim = _pick_run(runs) or []
        sweep = _sweep_run(runs) or prim
        used += prim + ([r for r in sweep if r not in prim] if sweep is not prim else [])
        prim = [r for r in prim if not r.get("graphed")]      # CUDA-graph replays: fv/bench --graphs tables
        unc = [r for r in prim if r.get("impl") == "warp_uncached"]
        pick = next((r for r in unc if r.get("chosen") and r.get("ms")), None)
        kern = [r for r in sweep if r.get("impl") == "warp_uncached" and r.get("ms_kernel")]
        best = min(kern, key=lambda r: r["ms_kernel"]) if kern else None
        torch_rows = [r for r in prim if str(r.get("impl")).startswith("torch") and r.get("ms")]
        strongest = min(torch_rows, key=lambda r: r["ms"]) if torch_rows else None
        cached = next((r for r in prim if r.get("impl") == "warp_cached" and r.get("ms")), None)
        ceiling = next((r for r in prim if r.get("impl") == "warp_dense_ceiling" and r.get("ms")), None)
        flops = next((r.get("flops") for r in prim + sweep if r.get("flops")), None)
        nbytes = next((r.get("bytes") for r in prim + sweep if r.get("bytes")), None)
        errs = [r.get("err") for r in prim + sweep
                if str(r.get("impl")).startswith("warp") and r.get("err") is not None]
        rows.append({
            "layer": layer, "B": b, "flops": flops, "bytes": nbytes,
            "pick_config": pick and pick.get("config"), "pick_ms": pick and pick.get("ms"),
            "pick_kernel_ms": pick and pick.get("ms_kernel"),
            "pick_dense_ms": (ceiling and ceiling.get("ms")) or (pick and pick.get("dense_ms")),
            "best_config": best and best.get("config"), "best_kernel_ms": best and best.get("ms_kernel"),
            "best_dense_ms": best and best.get("dense_ms"),
            "torch_impl": strongest and strongest["impl"], "torch_ms": strongest and strongest["ms"],
            "cached_ms": cached and cached["ms"], "cached_config": cached and cached.get("config"),
            "max_err": max(errs) if errs else None,
        })
    order = {n: i for i, n in enumerate(_layer_order(r["layer"] for r in rows))}
    rows.sort(key=lambda r: (order[r["layer"]], r["B"]))
    return rows, used


def forward_table(records: List[dict]) -> List[dict]:
    """One row per recorded (layer, B). From the latest run that timed the chosen config as a whole op:
    the Warp pick (whole op and kernel alone), the dense tile-GEMM ceiling of its tiles, the strongest
    PyTorch baseline (whole op), the Warp cached kernel. From the latest sweep of every config (if any):
    the fastest Warp config (kernel alone) and its dense ceiling. Plus FLOPs, bytes, max recorded error."""
    return _forward_rows(records)[0]


def _gemm4096(records: List[dict]) -> dict:
    """Warp's best dense tile GEMM and cuBLAS at 4096^3 (TFLOP/s), from the run that timed the most tile
    configs on it (the latest such run); {} when none is recorded."""
    runs = _runs([r for r in records if r.get("layer") == "gemm4096" and r.get("tflops")])
    best_run: List[dict] = []
    for run_list in runs.values():
        for run in run_list:
            n = sum(r.get("impl") == "warp_dense_gemm" for r in run)
            if n >= sum(r.get("impl") == "warp_dense_gemm" for r in best_run):
                best_run = run
    warp = [r for r in best_run if r["impl"] == "warp_dense_gemm"]
    cub = [r for r in best_run if r["impl"] == "torch_matmul"]
    out = {}
    if warp:
        w = max(warp, key=lambda r: r["tflops"])
        out["warp_tflops"], out["warp_config"] = w["tflops"], w.get("config")
    if cub:
        out["cublas_tflops"] = max(r["tflops"] for r in cub)
    return out


def _tf(flops, ms):
    return flops / (ms * 1e-3) / 1e12 if (flops and ms) else None


def forward_recorded_figure(records: Optional[List[dict]] = None, batches: Optional[Sequence[int]] = None,
                            height: int = 620) -> go.Figure:
    """The recorded forward: per layer, ms (top, log) and TFLOP/s (bottom, log) of the Warp kernel with
    the heuristic's config (whole op, and kernel alone), the dense tile-GEMM ceiling of the same tiles
    (kernel alone), the strongest PyTorch baseline and the Warp cached kernel (whole ops). A dropdown picks B; the title carries
    device, Warp and torch versions; dashed lines: Warp's dense 4096³ GEMM and cuBLAS."""
    records = forward_records() if records is None else records
    rows, used = _forward_rows(records)
    if not rows:
        return message_figure("no recorded forward data yet (run python -m fovi_lab bench forward on a GPU)")
    all_b = sorted({r["B"] for r in rows})
    batches = [b for b in (batches or all_b) if b in all_b] or all_b
    series = (("pick_ms", "Warp, heuristic's config (whole op)", _COLOURS["warp"]),
              ("pick_kernel_ms", "Warp, same config (kernel alone)", _COLOURS["warp_best"]),
              ("pick_dense_ms", "Warp dense tile-GEMM ceiling, same tiles (kernel alone)", _COLOURS["dense"]),
              ("torch_ms", "strongest PyTorch (whole op)", _COLOURS["torch"]),
              ("cached_ms", "Warp cached Weff (whole op)", _COLOURS["cached"]))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("time per call (ms, lower is better)", "TFLOP/s (2·B·P64·Cout·Nout / time)"))
    default_b = 512 if 512 in batches else batches[-1]
    for b in batches:
        sel = [r for r in rows if r["B"] == b]
        x = [r["layer"] for r in sel]
        for key, name, colour in series:
            text = [(r.get("torch_impl") if key == "torch_ms" else
                     r.get("cached_config") if key == "cached_ms" else r.get("pick_config")) or "" for r in sel]
            for row, val in ((1, [_r4(r[key]) for r in sel]), (2, [_r4(_tf(r["flops"], r[key])) for r in sel])):
                fig.add_trace(go.Bar(x=x, y=val, name=name, marker_color=colour, legendgroup=name,
                                     showlegend=row == 1, visible=b == default_b, hovertext=text),
                              row=row, col=1)
    g = _gemm4096(records)
    layers_x = _layer_order(r["layer"] for r in rows)
    n_lines = 0
    if "warp_tflops" in g:
        fig.add_trace(_hline(layers_x, g["warp_tflops"], f"Warp dense tile GEMM 4096³ ({g['warp_tflops']:.0f} TFLOP/s)",
                             _COLOURS["dense"]), row=2, col=1)
        n_lines += 1
    if "cublas_tflops" in g:
        fig.add_trace(_hline(layers_x, g["cublas_tflops"], f"cuBLAS 4096³ ({g['cublas_tflops']:.0f} TFLOP/s)",
                             _COLOURS["torch"]), row=2, col=1)
        n_lines += 1
    per_b = 2 * len(series)
    buttons = []
    for i, b in enumerate(batches):
        vis = [False] * (per_b * len(batches)) + [True] * n_lines
        vis[i * per_b:(i + 1) * per_b] = [True] * per_b
        buttons.append(dict(label=f"B = {b}", method="update", args=[{"visible": vis}]))
    ms_vals = [r[k] for r in rows for k, _, _ in series if r.get(k)]
    tf_vals = [_tf(r["flops"], r[k]) for r in rows for k, _, _ in series if r.get(k)]
    tf_vals += [v for k, v in g.items() if k.endswith("tflops")]
    fig.update_yaxes(type="log", row=1, col=1, title_text="ms", range=_log_range(ms_vals))
    fig.update_yaxes(type="log", row=2, col=1, title_text="TFLOP/s", range=_log_range(tf_vals))
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=90, b=10),
                      title=_title("Compact forward: time and throughput per layer", used),
                      updatemenus=[dict(buttons=buttons, type="buttons", direction="right", x=1.0, xanchor="right",
                                        y=1.1, active=batches.index(default_b))],
                      legend=dict(orientation="h", y=-0.12))
    return fig


def roofline_figure(records: Optional[List[dict]] = None, batch: int = 512, hbm_tbps: float = 4.8,
                    peak_tflops: float = 990.0, height: int = 460) -> go.Figure:
    """Roofline of the recorded forward at ``batch``: x = FLOPs per byte of the fewest bytes the op must
    move, y = TFLOP/s. The H200 roof (4.8 TB/s HBM, 990 TFLOP/s dense fp16, datasheet), Warp's dense
    4096³ tile GEMM and cuBLAS as horizontal ceilings; points: the Warp kernel with the heuristic's config,
    the dense ceiling of its tiles, the strongest PyTorch op."""
    records = forward_records() if records is None else records
    all_rows, used = _forward_rows(records)
    rows = [r for r in all_rows if r["B"] == batch and r.get("flops") and r.get("bytes")]
    if not rows:
        return message_figure(f"no recorded forward data at B = {batch} yet")
    ai = [r["flops"] / r["bytes"] for r in rows]
    xs = np.logspace(math.log10(min(ai) / 4), math.log10(max(ai) * 4), 60)
    roof = [min(peak_tflops, hbm_tbps * x) for x in xs]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[_r4(v) for v in xs], y=[_r4(v) for v in roof], mode="lines", name="H200 roofline (datasheet)",
                             line=dict(color="black")))
    g = _gemm4096(records)
    xr = [_r4(xs[0]), _r4(xs[-1])]
    if "cublas_tflops" in g:
        fig.add_trace(_hline(xr, g["cublas_tflops"], f"cuBLAS 4096³ ({g['cublas_tflops']:.0f})", _COLOURS["torch"]))
    if "warp_tflops" in g:
        fig.add_trace(_hline(xr, g["warp_tflops"], f"Warp tile GEMM 4096³ ({g['warp_tflops']:.0f})", _COLOURS["dense"]))
    for key, name, colour, sym in (("pick_kernel_ms", "Warp, heuristic's config (kernel)", _COLOURS["warp_best"], "circle"),
                                   ("pick_dense_ms", "Warp dense ceiling, same tiles", _COLOURS["dense"], "diamond"),
                                   ("torch_ms", "strongest PyTorch (op)", _COLOURS["torch"], "square")):
        fig.add_trace(go.Scatter(x=[_r4(a) for a in ai], y=[_r4(_tf(r["flops"], r[key])) for r in rows],
                                 mode="markers+text", text=[r["layer"] if key == "pick_kernel_ms" else "" for r in rows],
                                 textposition="top center", textfont=dict(size=9), name=name,
                                 marker=dict(color=colour, size=9, symbol=sym)))
    ys = [y for t in fig.data for y in t.y if y is not None]
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte the op must move)")
    fig.update_yaxes(type="log", title_text="TFLOP/s", range=_log_range(ys + [peak_tflops], pad=1.3))
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=60, b=10),
                      title=_title(f"Roofline of the compact forward at B = {batch}", [r for r in used if r.get("B") == batch]),
                      legend=dict(orientation="h", y=-0.2))
    return fig


#: (r=1, r=2[, r=4]) config triples that differ only in r, for the weight-reuse plot.
REUSE_PAIRS = (("m32n64", "m32n64r2", "m32n64r4"), ("m64n64r1", "m64n64r2", None),
               ("m64n64r1b256", "m64n64r2b256", None), ("m64n128r1", "m64n128r2", None),
               ("nm_m64n64k64b256", "nm_m64n64k64r2", None), ("nm_m64n128k64", "nm_m64n128k64r2", None))


def reuse_recorded_figure(records: Optional[List[dict]] = None, pairs=REUSE_PAIRS, height: int = 480) -> go.Figure:
    """Recorded kernel time of each r=2 / r=4 config over its r=1 twin (same tiles and threads), per
    layer; below 1 means weight reuse paid. A dropdown picks B."""
    records = forward_records() if records is None else records
    sweep = _sweep_records(records)
    ms = {(r["layer"], r["B"], r.get("config")): r["ms_kernel"] for r in sweep}
    if not ms:
        return message_figure("no recorded forward sweep yet")
    all_b = sorted({b for (_, b, _) in ms})
    layers = _layer_order(l for (l, _, _) in ms)
    fig = go.Figure()
    traces_per_b = 0
    default_b = 512 if 512 in all_b else all_b[-1]
    for b in all_b:
        count = 0
        for base, r2, r4 in pairs:
            for cfg in (r2, r4):
                if cfg is None:
                    continue
                ys = [_r4(ms[(l, b, cfg)] / ms[(l, b, base)]) if (l, b, cfg) in ms and (l, b, base) in ms else None
                      for l in layers]
                fig.add_trace(go.Bar(x=layers, y=[None if y is None else _r4(y - 1.0) for y in ys], base=1.0,
                                     customdata=ys, hovertemplate="%{x}: %{customdata:.2f}x<extra>%{fullData.name}</extra>",
                                     name=f"{cfg} / {base}", visible=b == default_b))
                count += 1
        traces_per_b = count
    fig.add_hline(y=1.0, line=dict(color="black", width=1))
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=90, b=10),
                      title=_title("Kernel time with r = 2 or 4 over r = 1 (below 1: reuse paid)", sweep),
                      yaxis_title="time ratio to r = 1",
                      updatemenus=batch_menu(all_b, traces_per_b, default_b),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def reuse_summary(records: Optional[List[dict]] = None, pairs=REUSE_PAIRS, faster_below: float = 0.97) -> List[dict]:
    """Per reuse config (r = 2 / 4) over its r = 1 twin, across every swept shape: ``config``, ``base``,
    ``shapes``, ``median``, ``best`` (lowest ratio) and ``faster`` (shapes with a ratio below
    ``faster_below``)."""
    records = forward_records() if records is None else records
    ms = {(r["layer"], r["B"], r.get("config")): r["ms_kernel"] for r in _sweep_records(records)}
    out = []
    for base, r2, r4 in pairs:
        for cfg in (c for c in (r2, r4) if c):
            ratios = [ms[(l, b, cfg)] / t for (l, b, c), t in ms.items() if c == base and (l, b, cfg) in ms]
            if ratios:
                out.append({"config": cfg, "base": base, "shapes": len(ratios), "median": float(np.median(ratios)),
                            "best": min(ratios), "faster": sum(x < faster_below for x in ratios)})
    return out


def heuristic_table(records: Optional[List[dict]] = None) -> List[dict]:
    """For every recorded (layer, B): the config :func:`fovi_lab.warp_forward._select_uncached_batch_config`
    picks *now*, its recorded kernel time, the fastest recorded config and the ratio pick / fastest
    (None where the pick was not part of the recorded sweep)."""
    from . import warp_forward as F
    records = forward_records() if records is None else records
    shapes: Dict[tuple, dict] = {}
    for r in _sweep_records(records):
        shapes.setdefault((r["layer"], r["B"]), {})[r.get("config")] = r
    rows = []
    for (l, b), cfgs in shapes.items():
        any_r = next(iter(cfgs.values()))
        cin, cout, nout, p64 = (any_r.get(k) for k in ("cin", "cout", "nout", "p64"))
        q = cin * any_r["v"] if cin and any_r.get("v") else None
        try:
            pick = F._select_uncached_batch_config(b, cout, nout, p64, in_channels=cin, node_major=True, q=q)
        except Exception as exc:  # noqa: BLE001
            pick = f"error: {type(exc).__name__}"
        best = min(cfgs.values(), key=lambda r: r["ms_kernel"])
        pick_ms = cfgs[pick]["ms_kernel"] if pick in cfgs else None
        rows.append({"layer": l, "B": b, "pick": pick, "pick_ms": pick_ms, "best": best["config"],
                     "best_ms": best["ms_kernel"], "ratio": (pick_ms / best["ms_kernel"]) if pick_ms else None,
                     "configs_recorded": len(cfgs)})
    order = {n: i for i, n in enumerate(_layer_order(r["layer"] for r in rows))}
    rows.sort(key=lambda r: (order[r["layer"]], r["B"]))
    return rows


def heuristic_figure(records: Optional[List[dict]] = None, height: int = 460) -> go.Figure:
    """Heat map over (layer, B) of the recorded kernel time of the heuristic's pick over the fastest
    recorded config (1.00 = the heuristic found the best); the cell text names the pick."""
    records = forward_records() if records is None else records
    rows = heuristic_table(records)
    if not rows:
        return message_figure("no recorded forward sweep yet")
    layers = _layer_order(r["layer"] for r in rows)
    bs = sorted({r["B"] for r in rows})
    z, text = [], []
    for l in layers:
        zr, tr = [], []
        for b in bs:
            r = next((x for x in rows if x["layer"] == l and x["B"] == b), None)
            zr.append(_r4(r["ratio"]) if r and r["ratio"] else None)
            tr.append(f"{r['pick']}<br>{r['ratio']:.2f}x" if r and r["ratio"] else (r["pick"] + "<br>not swept" if r else ""))
        z.append(zr)
        text.append(tr)
    fig = go.Figure(go.Heatmap(z=z, x=[f"B={b}" for b in bs], y=layers, text=text, texttemplate="%{text}",
                               textfont=dict(size=9), colorscale=[[0, "#f7fbff"], [1, "#d62728"]], zmin=1.0, zmax=2.0,
                               colorbar=dict(title="pick / best")))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=60, b=10),
                      title=_title("Kernel time of the heuristic's pick over the fastest recorded config",
                                   _sweep_records(records)))
    return fig


def backward_recorded_figure(records: Optional[List[dict]] = None, mode: str = "backward",
                             height: int = 520) -> go.Figure:
    """Recorded backward (or train-step) ms per layer: Warp's default gi+gw pipeline, torch_compact's
    explicit backward and torch autograd, with Warp's stage / reduction kernels alone; a dropdown
    picks B. Says "no recorded data yet" when there is none."""
    records = backward_records(mode=mode) if records is None else [r for r in records if r.get("mode") == mode]
    warp_impl = "warp" if mode == "backward" else "warp_train"
    main = [r for r in records if r.get("impl") in (warp_impl, "torch_compact") or
            str(r.get("impl", "")).startswith("torch_autograd")]
    main = [r for r in main if r.get("ms") and not r.get("graphed")]
    if not main:
        return message_figure(f"no recorded {mode} data yet (run python -m fovi_lab bench {mode.replace('_', '-')} "
                              f"on a GPU)")
    latest = _latest(main)
    impls = sorted({k[2] for k in latest}, key=lambda s: (s != warp_impl, s != "torch_compact", s))
    all_b = sorted({k[1] for k in latest})
    layers = _layer_order(k[0] for k in latest)
    default_b = 512 if 512 in all_b else all_b[-1]
    palette = {warp_impl: _COLOURS["warp"], "torch_compact": _COLOURS["torch"]}
    fig = go.Figure()
    per_b = len(impls) + 4
    for b in all_b:
        for impl in impls:
            ys = [_r4(latest[(l, b, impl, None)]["ms"]) if (l, b, impl, None) in latest else None for l in layers]
            fig.add_trace(go.Bar(x=layers, y=ys, name=impl, marker_color=palette.get(impl), visible=b == default_b))
        for key, name in (("gi_stage_ms", "Warp gi stage kernel"), ("dx_reduce_ms", "Warp dx reduction kernel"),
                          ("gw_stage_ms", "Warp gw stage kernel"), ("dw_reduce_ms", "Warp dW reduction kernel")):
            ys = [_r4(latest[(l, b, warp_impl, None)].get(key)) if (l, b, warp_impl, None) in latest else None
                  for l in layers]
            fig.add_trace(go.Scatter(x=layers, y=ys, name=name, mode="markers", visible=b == default_b,
                                     marker=dict(symbol="line-ew-open", size=14)))
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=90, b=10),
                      title=_title(f"{mode.replace('_', ' ')} (dx and dW) per layer", _latest_run(main)),
                      yaxis_type="log", yaxis_title="ms",
                      updatemenus=batch_menu(all_b, per_b, default_b),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def gi_gw_sweep_figure(records: Optional[List[dict]] = None, batch: Optional[int] = None,
                       height: int = 520) -> go.Figure:
    """Recorded stage-kernel time of every gi / gw config per layer (the ``--sweep`` records), at ``batch``
    (default: the largest recorded); "no recorded data yet" when there is none."""
    records = backward_records() if records is None else records
    sweep = [r for r in records if r.get("impl") in ("warp_gi", "warp_gw") and
             (r.get("gi_stage_ms") or r.get("gw_stage_ms"))]
    if not sweep:
        return message_figure("no recorded gi/gw sweep yet (python -m fovi_lab bench backward --sweep on a GPU)")
    bs = sorted({r["B"] for r in sweep})
    b = batch if batch in bs else bs[-1]
    sweep = [r for r in sweep if r["B"] == b and r.get("gw_finish", "csr") in (None, "csr")]
    latest = _latest(sweep)
    layers = _layer_order(k[0] for k in latest)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("grad-input stage kernel (ms)", "grad-weight stage kernel (ms)"))
    for row, impl, key in ((1, "warp_gi", "gi_stage_ms"), (2, "warp_gw", "gw_stage_ms")):
        cfgs = sorted({k[3] for k in latest if k[2] == impl and k[3]})
        for c in cfgs:
            ys = [_r4(latest[(l, b, impl, c)].get(key)) if (l, b, impl, c) in latest else None for l in layers]
            fig.add_trace(go.Bar(x=layers, y=ys, name=c), row=row, col=1)
        fig.update_yaxes(type="log", title_text="ms", row=row, col=1)
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=60, b=10),
                      title=_title(f"gi / gw stage configs at B = {b}", _latest_run(sweep)),
                      legend=dict(orientation="h", y=-0.2))
    return fig


# =================================================================================================
# a live benchmark (the gpu-tagged cell of notebook 01; also runs, slowly, on the CPU)
# =================================================================================================

def benchmark_forward(layers: Sequence[str] = ("res18_layer1", "alex_L1"), batch: int = 64,
                      device: Optional[str] = None, reps: int = 20) -> Tuple[List[dict], go.Figure]:
    """Time the Warp forward (heuristic config, whole op and kernel alone), Warp's dense tile-GEMM
    ceiling for that config, the Warp cached kernel and the PyTorch baselines on ``device``.

    Returns ``(rows, figure)``: one row per (layer, implementation) with ms, TFLOP/s and the max error
    against the fp32 reference; the figure's title carries the device, Warp and torch versions. On a
    GPU every new config is a MathDx compile (~50 s): ``python -m fovi_lab warmup`` fills the cache.
    """
    from . import warp_forward as F
    from .bench.common import env_info
    from .reference import CompactTorchOps, build_effective_weight
    device = device or default_device()
    dev_t = torch.device(device)
    rows: List[dict] = []
    for name in layers:
        pb = make_problem(name, batch, device=device)
        meta = pb.meta
        ref = CompactTorchOps.forward(meta, pb.x.float(), pb.weight.float(), pb.bias.float())
        flops = 2.0 * batch * meta.p64 * meta.cout * meta.nout
        cfg = F._select_uncached_batch_config(batch, meta.cout, meta.nout, meta.p64, in_channels=meta.cin,
                                              node_major=True, q=meta.q)

        def add(impl, fn, config=None, check=True):
            try:
                y = fn()
                err = rel_error(y, ref) if check else None
                ms = _time_ms(fn, device, budget_s=2.0, max_reps=reps)
                rows.append({"layer": name, "B": batch, "impl": impl, "config": config, "ms": ms,
                             "tflops": flops / (ms * 1e-3) / 1e12, "err": err})
            except Exception as exc:  # noqa: BLE001 - record and go on
                rows.append({"layer": name, "B": batch, "impl": impl, "config": config, "ms": None,
                             "note": f"{type(exc).__name__}: {str(exc)[:200]}"})

        plan = F._prepare_uncached(pb.x, pb.weight, pb.bias, meta.input_linear, meta.weight_linear, config=cfg)
        add("warp_uncached", lambda: F.run_uncached(pb.x, pb.weight, pb.bias, meta.input_linear,
                                                    meta.weight_linear, config=cfg), cfg)
        add("warp_uncached_kernel", plan.launch, cfg, check=False)            # the kernel alone (checked above)
        try:
            dplan = F.make_dense_ceiling(cfg, batch, meta.cout, meta.nout, meta.p64, device)
            add("warp_dense_ceiling", lambda: dplan.launch(), cfg, check=False)
        except Exception as exc:  # noqa: BLE001
            rows.append({"layer": name, "B": batch, "impl": "warp_dense_ceiling", "config": cfg, "ms": None,
                         "note": str(exc)[:200]})
        weff = build_effective_weight(meta, pb.weight, cout_multiple=64)
        add("warp_cached", lambda: F.run_cached(pb.x, weff, pb.bias, meta.input_linear, cout=meta.cout), "default")
        add("torch_compact", lambda: CompactTorchOps.forward(meta, pb.x, pb.weight, pb.bias))
        try:
            from .bench.forward import torch_baselines
            for impl, fn in torch_baselines(meta, pb.weight, build_effective_weight(meta, pb.weight, 8)).items():
                if impl != "torch_compact":
                    add(impl, lambda fn=fn: fn(pb.x, pb.bias))
        except ImportError:
            pass
    env = env_info(dev_t)
    title = f"Forward at B = {batch}, measured now on {env['device']} · Warp {env['warp']} · torch {env['torch']}"
    fig = go.Figure()
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    for impl in impls:
        sel = [r for r in rows if r["impl"] == impl]
        fig.add_trace(go.Bar(x=[r["layer"] for r in sel], y=[_r4(r.get("ms")) for r in sel], name=impl,
                             hovertext=[r.get("config") or "" for r in sel]))
    fig.update_layout(barmode="group", title=title, yaxis_type="log", yaxis_title="ms", height=420,
                      margin=dict(l=10, r=10, t=60, b=10), legend=dict(orientation="h", y=-0.2))
    return rows, fig
