"""Bin first, then one GEMM? (notebook 13, section 4): docs/operator.md §1.4's binned form against the compact GEMM.

The compact operator contracts ``P64 = Cin*K`` (padded) gathered rows per output node, each node with its
own gathered weight ``W_n``. The binned form (:func:`fovi_lab.ops.reference.binned_forward`) first sums every
node's neighbours into the layer's ``Q = Cin*V`` taps and then multiplies by the one shared weight, a single
dense GEMM per image. Its work is ``Q/P64`` times the compact work: about 1 with ``rf1`` tables
(``V = K``) and about 4 with ``rf2`` tables (``V ~ 4K``), the tables of every recorded benchmark.

* :func:`tap_ratio_rows`: ``P64``, ``Q`` and their ratio per layer, for rf1 and rf2.
* :func:`measure_here`: on this machine, the binned PyTorch forward, ``torch_compact`` and the Warp compact
  forward on a small stem with V = K and with V = 4K, each checked against the fp32 oracle.
* :func:`recorded_rows` / :func:`binning_figure`: the H200 benchmarks of the stems on rf2 and on rf1
  (the "stems against binning" selections of :data:`fovi_lab.lab.records.SELECTIONS`): the Warp compact forward, ``torch_binned_mm`` and the strongest other PyTorch forward,
  replayed from CUDA graphs (GPU time; the eager times of those runs are in the records too).
* :func:`warp_binned_rows`: a Warp binned forward (branch ``exp/binned-stems``, never on main)
  against the Warp compact (``i2c``) kernels on the rf2 stems.
* :func:`tensor_core_binned_rows`: :mod:`fovi_lab.kernels.forward.binned` (the binned form on the tensor-core
  kernels, ``FOVI_KNN_FWD_PATH=binned``) against the compact kernels and PyTorch's fastest forward, replayed, on
  the H200 (:data:`TC_BINNED_RECORDS`).
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.lab.common import readable_log_axes
from fovi_lab import lab as kl

__all__ = ["STEMS", "BINNING_RUNS", "TC_BINNED_RECORDS", "tap_ratio_rows", "measure_here", "recorded_rows",
           "binning_figure", "warp_binned_rows", "tensor_core_binned_rows"]

STEMS = ("alex_L0", "res18_stem", "dinov3_patch")

#: rf -> the record source of the stems' forward benchmark on that frame (H200)
#: The recorded runs read here, per reference frame (fovi_lab.lab.records.SELECTIONS).
BINNING_RUNS = {"rf2": "stems against binning, rf2", "rf1": "stems against binning, rf1"}
#: The H200 runs of ``python -m fovi_lab bench forward --binned --graphs`` (records carry their commit and command)
TC_BINNED_RECORDS = kl.DATA_DIR / "h200" / "forward_binned.jsonl.gz"


def tap_ratio_rows(layers=None) -> List[dict]:
    """Per layer and tables: ``P64`` (the compact contraction), ``Q = Cin*V`` (the binned one) and
    ``Q / P64``, the binned form's work relative to the compact GEMM's."""
    from fovi_lab.graph.layers import LAYERS, layer_shape
    rows = []
    for name in layers or LAYERS:
        for rf in ("rf1", "rf2"):
            s = layer_shape(name, rf)
            rows.append(dict(layer=name, rf=rf, cin=s["cin"], k=s["k"], v=s["v"], p64=s["p64"], q=s["q"],
                             ratio=s["q"] / s["p64"]))
    return rows


def measure_here(batch: int = 8, reps: int = 5, device=None, seed: int = 0) -> List[dict]:
    """Time the four forwards (PyTorch binned and compact, Warp compact and binned) on a small stem (Cin = 3,
    K = 25, Nout = 150) with ``V = K`` and ``V = 4K`` on this machine: best of ``reps`` calls each, and the max
    abs error of each against the fp32 oracle."""
    from fovi_lab.kernels import forward as F
    from fovi_lab.graph.meta import build_meta, synthetic_graph
    from fovi_lab.kernels.forward.binned import run_binned
    from fovi_lab.ops.reference import CompactTorchOps, binned_forward, oracle_forward

    device = torch.device(device or kl.default_device())
    cin, cout, nin, nout, k = 3, 32, 600, 150, 25
    rows = []
    for label, v in (("V = K (rf1-like)", k), ("V = 4K (rf2-like)", 4 * k)):
        idx, rf = synthetic_graph(nin, nout, k, v, pads=10, seed=seed)
        meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin, device=device)
        g = torch.Generator().manual_seed(seed + v)
        x = torch.randn(batch, cin, nin, generator=g).half().to(device)
        w = (torch.randn(cout, cin * v, generator=g) / (cin * k) ** 0.5).half().to(device)
        ref = oracle_forward(x.float().cpu(), w.float().cpu(), None, meta.idx.cpu(), meta.rf_index.cpu(), v)
        fns = {
            "torch_binned_mm": lambda: binned_forward(meta, x, w),
            "torch_compact": lambda: CompactTorchOps.forward(meta, x, w, None),
            "warp (compact)": lambda: F.run_uncached(x, w, None, meta.input_linear, meta.weight_linear),
            "warp (binned)": lambda: run_binned(meta, x, w),
        }
        for name, fn in fns.items():
            y = fn()
            best = float("inf")
            for _ in range(reps):
                if device.type == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                fn()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t0)
            rows.append(dict(tables=label, impl=name, q=cin * v, p64=meta.p64, ms=1e3 * best,
                             err=float((y.float().cpu() - ref).abs().max()), device=str(device)))
    return rows


def _ms(run: List[dict], impl: str) -> Optional[float]:
    vals = [r["ms"] for r in run if r.get("impl") == impl and r.get("ms")
            and (impl != "warp_uncached" or r.get("chosen"))]
    return vals[-1] if vals else None


def recorded_rows(data_dir=None) -> List[dict]:
    """Per recorded (rf, stem, B): the Warp compact forward (its chosen config), ``torch_binned_mm`` and the
    strongest other PyTorch forward, eager and replayed from a CUDA graph, from :data:`BINNING_RUNS`."""
    rows = []
    every = kl.load_records(data_dir)
    for rf, name in BINNING_RUNS.items():
        recs = [r for r in kl.selected(every, name) if _stem_index(r.get("layer")) < len(STEMS)]
        for (layer, b, _), runs in sorted(kl.record_runs(recs).items(), key=lambda kv: (_stem_index(kv[0][0]), kv[0][1])):
            run = runs[-1]
            row = dict(rf=rf, layer=layer, B=b, warp=_ms(run, "warp_uncached"),
                       warp_graphed=_ms(run, "warp_uncached_graphed"),
                       binned=_ms(run, "torch_binned_mm"), binned_graphed=_ms(run, "torch_binned_mm_graphed"),
                       config=next((r.get("config") for r in run if r.get("impl") == "warp_uncached"
                                    and r.get("chosen")), None))
            for suffix, graphed in (("", False), ("_graphed", True)):
                other = {r["impl"]: r["ms"] for r in run if r["impl"].startswith("torch") and r.get("ms")
                         and bool(r.get("graphed")) == graphed and not r["impl"].startswith("torch_binned_mm")}
                best = min(other, key=other.get) if other else None
                row["other" + suffix] = other.get(best) if best else None
                row["other_impl" + suffix] = best
            rows.append(row)
    return rows


def binning_figure(rows: Optional[List[dict]] = None, height: int = 500) -> go.Figure:
    """Grouped bars of :func:`recorded_rows`, rf2 left and rf1 right: GPU time (CUDA-graph replay) of the
    Warp compact forward, the binned PyTorch forward and the strongest other PyTorch forward."""
    rows = recorded_rows() if rows is None else rows
    if not rows:
        return kl.message_figure("no recorded binning runs under data/")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("rf2 tables (V ~ 4K: Q ~ 4 P64)", "rf1 tables (V = K: Q ~ P64)"),
                        shared_yaxes=True)
    series = (("Warp compact", "warp_graphed", "#76b900"), ("torch_binned_mm", "binned_graphed", "#1f77b4"),
              ("strongest other PyTorch", "other_graphed", "#aaaaaa"))
    for col, rf in ((1, "rf2"), (2, "rf1")):
        sub = [r for r in rows if r["rf"] == rf]
        xs = [f"{r['layer']} B={r['B']}" for r in sub]
        for name, key, color in series:
            fig.add_bar(x=xs, y=[kl.round4(r.get(key)) for r in sub], name=name, marker_color=color,
                        showlegend=col == 1, legendgroup=name,
                        hovertext=[r.get("other_impl_graphed") if key == "other_graphed" else r.get("config")
                                   for r in sub])
    fig.update_yaxes(title_text="GPU time per op (ms)", type="log", col=1)
    fig.update_xaxes(title_text="stem and batch")
    fig.update_layout(barmode="group")
    used = [r for n in BINNING_RUNS.values() for r in kl.selected(kl.load_records(), n)]
    figure_layout.headed(fig, height, "The stems: compact GEMM against binning, H200",
                         kl.recorded_message(used, "whole ops replayed from CUDA graphs"))
    return readable_log_axes(fig)


def warp_binned_rows(data_dir=None) -> List[dict]:
    """The Warp binned forward (branch ``exp/binned-stems``; the "Warp binned stems" selection): per rf2 stem and B, the fastest Warp binned forward kernel
    (``bin_*`` configs: the bin SIMT pass plus the dense GEMM), its GEMM alone on a pre-binned stage with
    the compact ``P64`` depth, and the fastest compact ``i2c`` kernel, all kernel times in ms."""
    recs = [r for r in kl.selected(kl.load_records(data_dir), "Warp binned stems") if r.get("impl") == "warp_uncached"]
    out: Dict[tuple, dict] = {}
    for r in recs:
        if not r.get("ms_kernel"):
            continue
        row = out.setdefault((r["layer"], r["B"]), dict(layer=r["layer"], B=r["B"], q=r["cin"] * r["v"],
                                                         p64=r.get("p64")))
        fam = "bin" if str(r["config"]).startswith("bin_") else "i2c"
        if fam == "bin" and r.get("dense_ms"):
            row["bin_gemm_p64"] = min(row.get("bin_gemm_p64", float("inf")), r["dense_ms"])
        if r["ms_kernel"] < row.get(fam, float("inf")):
            row[fam], row[fam + "_config"] = r["ms_kernel"], r["config"]
    for row in out.values():
        if row.get("bin") and row.get("i2c"):
            row["bin_over_i2c"] = row["bin"] / row["i2c"]
    return sorted(out.values(), key=lambda r: (_stem_index(r["layer"]), r["B"]))


def _stem_index(name) -> int:
    """Position in :data:`STEMS` of the stem that layer or variant ``name`` is built from (``len(STEMS)`` if none)."""
    from fovi_lab.graph.layers import base_layer
    try:
        base = base_layer(name)
    except KeyError:
        return len(STEMS)
    return STEMS.index(base) if base in STEMS else len(STEMS)


def tensor_core_binned_rows(records: Optional[List[dict]] = None, batches=(1,)) -> List[dict]:
    """Per layer and B in ``batches``, from the latest run that measured it (:data:`TC_BINNED_RECORDS`): the binned
    op on the tensor cores, the compact kernels' op and PyTorch's fastest forward, each replayed from a CUDA graph
    (ms), the ratios, and the run's commit."""
    from fovi_lab.graph.layers import LAYERS
    from fovi_lab.ops.records import read_file
    if records is None:
        records = list(read_file(TC_BINNED_RECORDS)) if TC_BINNED_RECORDS.is_file() else []
    runs: Dict[tuple, Dict[str, List[dict]]] = {}
    for r in records:
        if r.get("graphed") and r.get("ms") and r.get("B") in batches:
            runs.setdefault((r["layer"], r["B"]), {}).setdefault(r.get("date", ""), []).append(r)
    rows = []
    for layer in LAYERS:
        for b in batches:
            by_date = runs.get((layer, b))
            if not by_date:
                continue
            rs = by_date[max(by_date)]
            binned = [r for r in rs if r["impl"] == "warp_binned_graphed"]
            compact = [r for r in rs if r["impl"] == "warp_uncached_graphed"]
            torch_rs = [r for r in rs if r["impl"].startswith("torch")]
            if not (binned and compact and torch_rs):
                continue
            best = min(torch_rs, key=lambda r: r["ms"])
            rows.append(dict(layer=layer, B=b, binned=binned[0]["ms"], binned_config=binned[0].get("config"),
                             compact=compact[0]["ms"], torch=best["ms"], torch_impl=best["impl"][:-len("_graphed")],
                             binned_over_compact=binned[0]["ms"] / compact[0]["ms"],
                             binned_over_torch=binned[0]["ms"] / best["ms"], commit=binned[0].get("commit")))
    return rows
