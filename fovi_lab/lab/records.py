"""The recorded GPU results: load the benchmark records (the shipped ones in ``fovi_lab/records/``, and a checkout's
``data/``) and plot them (device, Warp and torch versions in each figure's title), or say that there are none.
"""

from __future__ import annotations

from dataclasses import dataclass

import fnmatch
import glob
import math
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from fovi_lab.lab.common import readable_log_axes
from fovi_lab.graph.layers import LAYERS, RF_MULT, layer_name
from fovi_lab.ops.records import LOCAL_DIR, RECORDS_DIR, iter_records, read_file
from fovi_lab.lab.labels import kernel_label, short_label, tick_label
from fovi_lab.lab.common import (LAYER_CHOICES, COLOURS, drop_empty_traces, hline, log_range, round4, batch_menu,
                                 message_figure)


#: A checkout's own records (``data/``); the shipped ones are under :data:`RECORDS_DIR`.
DATA_DIR = LOCAL_DIR
#: The shipped logs the figures read (host probes, Nsight Compute summary, cubin registers).
LOGS_DIR = RECORDS_DIR / "h200" / "logs"


@dataclass(frozen=True)
class Selection:
    """Recorded runs a notebook reads, named for what they measured and chosen by the records' fields: the shipped
    records file (``kind``), the device and the window of the runs' ``date`` stamps (ISO text, from ``start``
    inclusive to ``end`` exclusive). ``what``: one line for figure titles."""

    what: str
    kind: str
    start: str
    end: str
    device: str = "NVIDIA H200"

    @property
    def mode(self) -> str:
        """The records' mode: ``train-step`` for the train-step files, else ``forward``."""
        return "train-step" if self.kind == "train_step" else "forward"

    def pick(self, records: Iterable[dict]) -> List[dict]:
        """The records of ``records`` this selection names."""
        return [r for r in records if r.get("device", self.device) == self.device
                and (r.get("mode") or "forward") == self.mode and self.start <= str(r.get("date", "")) < self.end]


#: Every recorded selection the lab reads, in one place (the records keep the runs' own tags for their history).
SELECTIONS: Dict[str, Selection] = {
    "tensor-core sweep": Selection(
        "every tensor-core config replayed beside the rule's pick and PyTorch, every layer, B = 1 to 512, H200",
        "mma_sweep", "2026-12-01T08:38", "2026-12-01T09:12"),
    "staged-store sweep": Selection(
        "the staged stores replayed beside the direct ones, every layer, B = 1 to 512, H200",
        "mma_sweep", "2026-12-01T09:11", "2026-12-01T09:12"),
    "tile and SIMT rules": Selection(
        "the sweeps whose chosen config was the tile / SIMT rules' pick (before the tensor-core rule), H200",
        "forward_sweep", "2026-12-01T05:45", "2026-12-01T05:47"),
    "tensor-core layouts": Selection(
        "the x^T and W-in-place layouts replayed beside x in place and W^T, H200",
        "forward_sweep", "2026-12-01T05:57", "2026-12-01T06:06"),
    "split-loop sweep": Selection(
        "the split SIMT kernel at three thread counts beside the tile kernels, replayed, H200",
        "forward_sweep", "2026-11-30T04:53", "2026-11-30T05:09"),
    "SIMT sweep": Selection(
        "the SIMT register blocks beside the i2c tiles and PyTorch on the stems, replayed, H200",
        "forward_sweep", "2026-11-30T02:51", "2026-11-30T03:27"),
    "stems against binning, rf2": Selection(
        "the stems' compact forward beside torch_binned_mm and PyTorch, rf2 tables, eager and replayed, H200",
        "forward", "2026-11-29T23:32", "2026-11-29T23:33"),
    "stems against binning, rf1": Selection(
        "the stems' compact forward beside torch_binned_mm and PyTorch, rf1 tables, eager and replayed, H200",
        "forward", "2026-11-29T23:36", "2026-11-29T23:37"),
    "Warp binned stems": Selection(
        "the Warp binned forward (bin pass + dense GEMM) beside the compact i2c kernels on the rf2 stems, H200",
        "forward", "2026-11-29T23:24", "2026-11-29T23:25"),
    "stem train step, gathered operands": Selection(
        "the stems' train step with the adjoints gathering their operand tiles in the GEMM loop, H200",
        "train_step", "2026-11-29T19:27", "2026-11-29T19:28"),
    "stem train step, staged operands": Selection(
        "the stems' train step with staged operands (the 'i' adjoint configs), H200",
        "train_step", "2026-11-29T20:50", "2026-11-29T20:51"),
}


def selected(records: Iterable[dict], name: str) -> List[dict]:
    """The records of the selection ``name`` of :data:`SELECTIONS`."""
    return SELECTIONS[name].pick(records)


def layer_replays_figure(layer: str, rows: List[dict], series, runs: str, empty: str, log: bool = False,
                         height: int = 320) -> go.Figure:
    """Grouped bars of one layer's recorded replays over B (the widgets' side figures of notebooks 02 and 09).

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
    return readable_log_axes(fig)


def mark_batch(fig: go.Figure, batch, note: Optional[str] = None) -> go.Figure:
    """Mark ``batch`` on a figure of bars over ``B=...`` categories (the widgets of notebooks 10 and 12): a dashed line
    named ``your batch: B = ...`` (the categories kept in batch order) and ``note`` (the live run) as an annotation."""
    ys = [v for t in fig.data if t.type == "bar" for v in (t.y or ()) if v]
    if not ys or isinstance(batch, bool) or not isinstance(batch, int):
        return fig
    cat = f"B={batch}"
    cats = sorted({x for t in fig.data for x in (t.x or ())} | {cat}, key=lambda c: int(str(c)[2:]))
    low = min(ys) if fig.layout.yaxis.type == "log" else 0
    fig.add_trace(go.Scatter(x=[cat, cat], y=[low, max(ys)], mode="lines", name=f"your batch: B = {batch}",
                             line=dict(color="black", dash="dash"), hoverinfo="skip"))
    fig.update_xaxes(categoryorder="array", categoryarray=cats)
    if note:
        fig.add_annotation(text=note, xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom",
                           showarrow=False, font=dict(size=11))
    return fig


def figure_title(main: str, records: List[dict]) -> str:
    """A figure title with the recording's device, Warp and torch versions on a second line."""
    return f"{main}<br><sup>recorded on {versions_title(records)}</sup>"


#: The device whose recorded runs the notebooks' figures and tables show by default (the records of other devices,
#: e.g. ``fovi_lab/records/h100``, are read with ``device=None`` or their own name).
RECORDED_DEVICE = "NVIDIA H200"


def load_records(data_dir=None, patterns: Sequence[str] = ("*.jsonl", "*.jsonl.gz"),
                 device: Optional[str] = RECORDED_DEVICE) -> List[dict]:
    """Every benchmark record of ``device`` (None: every device) whose source file matches one of ``patterns``: the
    shipped records and a checkout's ``data/`` (:func:`fovi_lab.ops.records.iter_records`), or the files of
    ``data_dir`` matching ``patterns``. Each is tagged ``_file`` with its source file (one benchmark run writes one
    source). ``.gz`` files are read through gzip. Unreadable lines are skipped; no folder means ``[]``.

    A record measured on another reference frame than its layer's network frame is named as that variant
    (``layer`` becomes e.g. ``"res18_stem_rf2"``, :func:`fovi_lab.graph.layers.layer_name`), so a name always means
    one table."""
    if data_dir is None:
        recs = (r for r in iter_records() if any(fnmatch.fnmatch(r["source"], pat) for pat in patterns))
    else:
        d = Path(data_dir)
        paths = sorted({p for pat in patterns for p in glob.glob(str(d / pat))})
        recs = (r for p in paths for r in read_file(Path(p)))
    out: List[dict] = []
    for r in recs:
        if device is not None and r.get("device") != device:
            continue
        if "impl" in r and "layer" in r:
            r["_file"] = r["source"]
            if r["layer"] in LAYERS and r.get("rf") in RF_MULT:
                r["layer"] = layer_name(r["layer"], r["rf"])
            out.append(r)
    return out


def kind_records(kind: str, device: Optional[str] = RECORDED_DEVICE) -> List[dict]:
    """Every shipped record of one kind (``fovi_lab/records/<device>/<kind>.jsonl.gz``) of ``device`` (None: every
    device), as recorded."""
    return [r for path in sorted(RECORDS_DIR.glob(f"*/{kind}.jsonl.gz")) for r in read_file(path)
            if device is None or r.get("device") == device]


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


def record_runs(records: List[dict]) -> Dict[tuple, List[List[dict]]]:
    """(layer, B, mode) -> that shape's runs, oldest first. A run is the records of one benchmark
    invocation: same file and same ``date`` stamp. Figures never mix two runs of one shape (the config
    chosen, the configs swept and the baselines of a row always come from one invocation)."""
    groups: Dict[tuple, Dict[tuple, List[dict]]] = {}
    for r in records:
        key = (r.get("layer"), r.get("B"), r.get("mode"))
        groups.setdefault(key, {}).setdefault((str(r.get("date", "")), r.get("_file", "")), []).append(r)
    return {k: [v[rk] for rk in sorted(v)] for k, v in groups.items()}


def latest_run_where(runs: List[List[dict]], pred: Callable[[List[dict]], bool]) -> Optional[List[dict]]:
    """The most recent run that satisfies ``pred`` (None if none does)."""
    for run in reversed(runs):
        if pred(run):
            return run
    return None


def _n_swept(run: List[dict]) -> int:
    return len({r.get("config") for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")})


def _sweep_run(runs: List[List[dict]]) -> Optional[List[dict]]:
    """The latest run of a shape that timed several uncached configs (a ``--all-configs`` sweep)."""
    return latest_run_where(runs, lambda run: _n_swept(run) >= 3)


def _pick_run(runs: List[List[dict]]) -> Optional[List[dict]]:
    """The latest run of a shape that timed the chosen config as a whole op (falls back to the latest run)."""
    return (latest_run_where(runs, lambda run: any(r.get("impl") == "warp_uncached" and r.get("chosen") and r.get("ms")
                                                for r in run)) or (runs[-1] if runs else None))


def _sweep_records(records: List[dict]) -> List[dict]:
    """The uncached-kernel records of every shape's latest sweep run."""
    out: List[dict] = []
    for key, runs in record_runs(records).items():
        run = _sweep_run(runs)
        if run is not None:
            out += [r for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")]
    return out


def _latest_run(records: List[dict]) -> List[dict]:
    """Per (layer, B, mode), the records of the most recent run only."""
    return [r for runs in record_runs(records).values() for r in runs[-1]]


def _latest(records: List[dict]) -> Dict[tuple, dict]:
    """(layer, B, impl, config) -> one record of the most recent run of that shape (last one wins)."""
    out: Dict[tuple, dict] = {}
    for r in _latest_run(records):
        out[(r.get("layer"), r.get("B"), r.get("impl"), r.get("config"))] = r
    return out


def layer_order(names: Iterable[str]) -> List[str]:
    order = {n: i for i, n in enumerate(LAYER_CHOICES)}
    return sorted(set(names), key=lambda n: (order.get(n, len(order)), n))


def _forward_rows(records: List[dict]) -> Tuple[List[dict], List[dict]]:
    """(rows of :func:`forward_table`, the records they were read from)."""
    rows, used = [], []
    for (layer, b, mode), runs in record_runs(records).items():
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
    order = {n: i for i, n in enumerate(layer_order(r["layer"] for r in rows))}
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
    runs = record_runs([r for r in records if r.get("layer") == "gemm4096" and r.get("tflops")])
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
    series = (("pick_ms", "Warp, heuristic's config (whole op)", COLOURS["warp"]),
              ("pick_kernel_ms", "Warp, same config (kernel alone)", COLOURS["warp_best"]),
              ("pick_dense_ms", "Warp dense tile-GEMM ceiling, same tiles (kernel alone)", COLOURS["dense"]),
              ("torch_ms", "strongest PyTorch (whole op)", COLOURS["torch"]),
              ("cached_ms", "Warp cached Weff (whole op)", COLOURS["cached"]))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=("time per call (ms, lower is better)", "TFLOP/s (2·B·P64·Cout·Nout / time)"))
    default_b = 512 if 512 in batches else batches[-1]
    for b in batches:
        sel = [r for r in rows if r["B"] == b]
        x = [r["layer"] for r in sel]
        for key, name, colour in series:
            text = [(r.get("torch_impl") if key == "torch_ms" else
                     r.get("cached_config") if key == "cached_ms" else r.get("pick_config")) or "" for r in sel]
            for row, val in ((1, [round4(r[key]) for r in sel]), (2, [round4(_tf(r["flops"], r[key])) for r in sel])):
                fig.add_trace(go.Bar(x=x, y=val, name=name, marker_color=colour, legendgroup=name,
                                     showlegend=row == 1, visible=b == default_b, hovertext=text),
                              row=row, col=1)
    g = _gemm4096(records)
    layers_x = layer_order(r["layer"] for r in rows)
    n_lines = 0
    if "warp_tflops" in g:
        fig.add_trace(hline(layers_x, g["warp_tflops"], f"Warp dense tile GEMM 4096³ ({g['warp_tflops']:.0f} TFLOP/s)",
                             COLOURS["dense"]), row=2, col=1)
        n_lines += 1
    if "cublas_tflops" in g:
        fig.add_trace(hline(layers_x, g["cublas_tflops"], f"cuBLAS 4096³ ({g['cublas_tflops']:.0f} TFLOP/s)",
                             COLOURS["torch"]), row=2, col=1)
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
    fig.update_yaxes(type="log", row=1, col=1, title_text="ms", range=log_range(ms_vals))
    fig.update_yaxes(type="log", row=2, col=1, title_text="TFLOP/s", range=log_range(tf_vals))
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=90, b=10),
                      title=figure_title("Compact forward: time and throughput per layer", used),
                      updatemenus=[dict(buttons=buttons, type="buttons", direction="right", x=1.0, xanchor="right",
                                        y=1.1, active=batches.index(default_b))],
                      legend=dict(orientation="h", y=-0.12))
    return readable_log_axes(drop_empty_traces(fig))


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
    fig.add_trace(go.Scatter(x=[round4(v) for v in xs], y=[round4(v) for v in roof], mode="lines", name="H200 roofline (datasheet)",
                             line=dict(color="black")))
    g = _gemm4096(records)
    xr = [round4(xs[0]), round4(xs[-1])]
    if "cublas_tflops" in g:
        fig.add_trace(hline(xr, g["cublas_tflops"], f"cuBLAS 4096³ ({g['cublas_tflops']:.0f})", COLOURS["torch"]))
    if "warp_tflops" in g:
        fig.add_trace(hline(xr, g["warp_tflops"], f"Warp tile GEMM 4096³ ({g['warp_tflops']:.0f})", COLOURS["dense"]))
    for key, name, colour, sym in (("pick_kernel_ms", "Warp, heuristic's config (kernel)", COLOURS["warp_best"], "circle"),
                                   ("pick_dense_ms", "Warp dense ceiling, same tiles", COLOURS["dense"], "diamond"),
                                   ("torch_ms", "strongest PyTorch (op)", COLOURS["torch"], "square")):
        fig.add_trace(go.Scatter(x=[round4(a) for a in ai], y=[round4(_tf(r["flops"], r[key])) for r in rows],
                                 mode="markers+text", text=[r["layer"] if key == "pick_kernel_ms" else "" for r in rows],
                                 textposition="top center", textfont=dict(size=9), name=name,
                                 marker=dict(color=colour, size=9, symbol=sym)))
    ys = [y for t in fig.data for y in t.y if y is not None]
    fig.update_xaxes(type="log", title_text="arithmetic intensity (FLOP per byte the op must move)")
    fig.update_yaxes(type="log", title_text="TFLOP/s", range=log_range(ys + [peak_tflops], pad=1.3))
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=60, b=10),
                      title=figure_title(f"Roofline of the compact forward at B = {batch}", [r for r in used if r.get("B") == batch]),
                      legend=dict(orientation="h", y=-0.2))
    return readable_log_axes(fig)


#: (r=1, r=2[, r=4]) config triples that differ only in r, for the weight-reuse plot.
REUSE_PAIRS = (("m32n64", "m32n64r2", "m32n64r4"), ("m64n64r1", "m64n64r2", None),
               ("m64n64r1b256", "m64n64r2b256", None), ("m64n128r1", "m64n128r2", None),
               ("nm_m64n64k64b256", "nm_m64n64k64r2", None), ("nm_m64n128k64", "nm_m64n128k64r2", None))


def _pair_kernel_ms(records: List[dict], pairs) -> Tuple[Dict[tuple, float], List[dict]]:
    """``(layer, B, config) -> ms_kernel`` for the configs of ``pairs`` (``(r1, r2, r4)`` twins) and the records
    read: per shape and twin, the latest run that timed the r = 1 config and that twin side by side (a later sweep of
    other configs does not hide an earlier one of these). The ``(layer, B, r1)`` entry is the r = 1 time of the run
    the twin's came from; a twin whose run differs from another twin's keeps its own base under
    ``(layer, B, (r1, twin))``."""
    ms: Dict[tuple, float] = {}
    read: List[dict] = []
    for (layer, b, _), runs in record_runs(records).items():
        for base, *twins in pairs:
            for cfg in (c for c in twins if c):
                def timed(rs, cfgs=(base, cfg)):
                    have = {r.get("config") for r in rs if r.get("impl") == "warp_uncached" and r.get("ms_kernel")}
                    return set(cfgs) <= have
                run = latest_run_where(runs, timed)
                if run is None:
                    continue
                got = {r["config"]: r for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")
                       and r.get("config") in (base, cfg)}
                ms[(layer, b, cfg)] = got[cfg]["ms_kernel"]
                ms[(layer, b, (base, cfg))] = got[base]["ms_kernel"]
                ms.setdefault((layer, b, base), got[base]["ms_kernel"])
                read += [got[base], got[cfg]]
    return ms, read


def reuse_recorded_figure(records: Optional[List[dict]] = None, pairs=REUSE_PAIRS, height: int = 480) -> go.Figure:
    """Recorded kernel time of each r=2 / r=4 config over its r=1 twin (same tiles and threads), per
    layer; below 1 means weight reuse paid. A dropdown picks B."""
    records = forward_records() if records is None else records
    ms, sweep = _pair_kernel_ms(records, pairs)
    if not ms:
        return message_figure("no recorded forward sweep yet")
    all_b = sorted({b for (_, b, _) in ms})
    layers = layer_order(l for (l, _, _) in ms)
    fig = go.Figure()
    traces_per_b = 0
    default_b = 512 if 512 in all_b else all_b[-1]
    for b in all_b:
        count = 0
        for base, r2, r4 in pairs:
            for cfg in (r2, r4):
                if cfg is None:
                    continue
                ys = [round4(ms[(l, b, cfg)] / ms[(l, b, (base, cfg))]) if (l, b, cfg) in ms else None
                      for l in layers]
                fig.add_trace(go.Bar(x=layers, y=[None if y is None else round4(y - 1.0) for y in ys], base=1.0,
                                     customdata=ys, hovertemplate="%{x}: %{customdata:.2f}x<extra>%{fullData.name}</extra>",
                                     name=f"{kernel_label(cfg)} (over r = 1)", visible=b == default_b))
                count += 1
        traces_per_b = count
    fig.add_hline(y=1.0, line=dict(color="black", width=1))
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=90, b=10),
                      title=figure_title("Kernel time with r = 2 or 4 over r = 1 (below 1: reuse paid)", sweep),
                      yaxis_title="time ratio to r = 1",
                      updatemenus=batch_menu(all_b, traces_per_b, default_b),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def reuse_summary(records: Optional[List[dict]] = None, pairs=REUSE_PAIRS, faster_below: float = 0.97) -> List[dict]:
    """Per reuse config (r = 2 / 4) over its r = 1 twin, across every swept shape: ``config``, ``base``,
    ``shapes``, ``median``, ``best`` (lowest ratio) and ``faster`` (shapes with a ratio below
    ``faster_below``)."""
    records = forward_records() if records is None else records
    ms, _ = _pair_kernel_ms(records, pairs)
    out = []
    for base, r2, r4 in pairs:
        for cfg in (c for c in (r2, r4) if c):
            ratios = [t / ms[(l, b, (base, cfg))] for (l, b, c), t in ms.items() if c == cfg]
            if ratios:
                out.append({"config": cfg, "base": base, "shapes": len(ratios), "median": float(np.median(ratios)),
                            "best": min(ratios), "faster": sum(x < faster_below for x in ratios)})
    return out


def heuristic_table(records: Optional[List[dict]] = None) -> List[dict]:
    """For every recorded (layer, B): the config :func:`fovi_lab.kernels.forward.rules.select_config`
    picks *now* among the kernels the sweep timed (``pipe=False``: the pipelined tensor-core kernels, which the rule
    takes on the large-GEMM layers from B = 64, were timed in their own side-by-side run,
    ``data/h200/forward_pipe.jsonl.gz``), its recorded kernel time, the fastest recorded config and the ratio
    pick / fastest (None where the pick was not part of the recorded sweep)."""
    from fovi_lab.kernels import forward as F
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
            pick = F.select_config(b, cout, nout, p64, in_channels=cin, node_major=True, q=q, pipe=False)
        except Exception as exc:  # noqa: BLE001
            pick = f"error: {type(exc).__name__}"
        best = min(cfgs.values(), key=lambda r: r["ms_kernel"])
        pick_ms = cfgs[pick]["ms_kernel"] if pick in cfgs else None
        rows.append({"layer": l, "B": b, "pick": pick, "pick_ms": pick_ms, "best": best["config"],
                     "best_ms": best["ms_kernel"], "ratio": (pick_ms / best["ms_kernel"]) if pick_ms else None,
                     "configs_recorded": len(cfgs)})
    order = {n: i for i, n in enumerate(layer_order(r["layer"] for r in rows))}
    rows.sort(key=lambda r: (order[r["layer"]], r["B"]))
    return rows


def heuristic_figure(records: Optional[List[dict]] = None, height: int = 460) -> go.Figure:
    """Heat map over (layer, B) of the recorded kernel time of the heuristic's pick over the fastest
    recorded config (1.00 = the heuristic found the best); the cell text names the pick."""
    records = forward_records() if records is None else records
    rows = heuristic_table(records)
    if not rows:
        return message_figure("no recorded forward sweep yet")
    layers = layer_order(r["layer"] for r in rows)
    bs = sorted({r["B"] for r in rows})
    family = _common_family([r["pick"] for r in rows])
    z, text, hover = [], [], []
    for l in layers:
        zr, tr, hr = [], [], []
        for b in bs:
            r = next((x for x in rows if x["layer"] == l and x["B"] == b), None)
            zr.append(round4(r["ratio"]) if r and r["ratio"] else None)
            words = _cell_words(r["pick"], family) if r else ""
            tr.append(f"{words}<br>{r['ratio']:.2f}x" if r and r["ratio"] else (words + "<br>not swept" if r else ""))
            hr.append(f"{l} B={b}: {short_label(r['pick'])} ({r['pick']})" if r else "")
        z.append(zr)
        text.append(tr)
        hover.append(hr)
    fig = go.Figure(go.Heatmap(z=z, x=[f"B={b}" for b in bs], y=layers, text=text, texttemplate="%{text}",
                               customdata=hover, hovertemplate="%{customdata}: %{z:.2f}x<extra></extra>",
                               textfont=dict(size=9), colorscale=[[0, "#f7fbff"], [1, "#d62728"]], zmin=1.0, zmax=2.0,
                               colorbar=dict(title="pick / best")))
    fig.update_yaxes(autorange="reversed")
    what = "Kernel time of the heuristic's pick over the fastest recorded config"
    fig.update_layout(height=max(height, 56 * len(layers) + 110), margin=dict(l=10, r=10, t=60, b=10),
                      title=figure_title(what + (f" (every pick: {family})" if family else ""),
                                         _sweep_records(records)))
    return fig


def _common_family(configs: Sequence[str]) -> str:
    """The leading words without digits (the family, ``"tensor cores"``) that every config's short label starts
    with, else ``""``."""
    words = [short_label(c).split(" ") for c in configs]
    head: List[str] = []
    for i, w in enumerate(words[0] if words else []):
        if any(ch.isdigit() for ch in w) or any(len(x) <= i + 1 or x[i] != w for x in words):
            break
        head.append(w)
    return " ".join(head)


def _cell_words(config: str, family: str, width: int = 18) -> str:
    """A config in words for a heat-map cell: its short label less the ``family`` every cell shares, its phrases
    joined into lines of about ``width`` characters (``<br>`` between them)."""
    words = short_label(config)
    if family and words.startswith(family + " "):
        words = words[len(family) + 1:]
    lines: List[str] = []
    for phrase in words.split(", "):
        if lines and len(lines[-1]) + 2 + len(phrase) <= width:
            lines[-1] += ", " + phrase
        else:
            lines.append(phrase)
    return "<br>".join(lines)


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
    layers = layer_order(k[0] for k in latest)
    default_b = 512 if 512 in all_b else all_b[-1]
    palette = {warp_impl: COLOURS["warp"], "torch_compact": COLOURS["torch"]}
    fig = go.Figure()
    per_b = len(impls) + 4
    for b in all_b:
        for impl in impls:
            ys = [round4(latest[(l, b, impl, None)]["ms"]) if (l, b, impl, None) in latest else None for l in layers]
            fig.add_trace(go.Bar(x=layers, y=ys, name=impl, marker_color=palette.get(impl), visible=b == default_b))
        for key, name in (("gi_stage_ms", "Warp gi stage kernel"), ("dx_reduce_ms", "Warp dx reduction kernel"),
                          ("gw_stage_ms", "Warp gw stage kernel"), ("dw_reduce_ms", "Warp dW reduction kernel")):
            ys = [round4(latest[(l, b, warp_impl, None)].get(key)) if (l, b, warp_impl, None) in latest else None
                  for l in layers]
            fig.add_trace(go.Scatter(x=layers, y=ys, name=name, mode="markers", visible=b == default_b,
                                     marker=dict(symbol="line-ew-open", size=14)))
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=90, b=10),
                      title=figure_title(f"{mode.replace('_', ' ')} (dx and dW) per layer", _latest_run(main)),
                      yaxis_type="log", yaxis_title="ms",
                      updatemenus=batch_menu(all_b, per_b, default_b),
                      legend=dict(orientation="h", y=-0.2))
    return readable_log_axes(drop_empty_traces(fig))


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
    layers = layer_order(k[0] for k in latest)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("grad-input stage kernel (ms)", "grad-weight stage kernel (ms)"))
    for row, impl, key in ((1, "warp_gi", "gi_stage_ms"), (2, "warp_gw", "gw_stage_ms")):
        cfgs = sorted({k[3] for k in latest if k[2] == impl and k[3]})
        for c in cfgs:
            ys = [round4(latest[(l, b, impl, c)].get(key)) if (l, b, impl, c) in latest else None for l in layers]
            fig.add_trace(go.Bar(x=layers, y=ys, name=kernel_label(c), hovertemplate="%{x}: %{y:.3f} ms<extra>" + c
                                 + "</extra>"), row=row, col=1)
        fig.update_yaxes(type="log", title_text="ms", row=row, col=1)
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=60, b=10),
                      title=figure_title(f"gi / gw stage configs at B = {b}", _latest_run(sweep)),
                      legend=dict(orientation="h", y=-0.2))
    return readable_log_axes(fig)


def batch_panels_figure(rows: List[dict], series: Sequence[Tuple[str, str, str, str]], title: str, subtitle: str,
                        height: int = 460, outline_pick: bool = False):
    """Recorded whole ops replayed from CUDA graphs, one panel per batch ``B``: per layer, a bar per series
    ``(ms key, config key, name, colour)`` of ``rows`` (dicts with ``layer``, ``B``, ``records`` and those keys),
    on a log axis, the config in the hover. ``outline_pick``: outline the bar whose config is the row's
    ``pick``. The title carries the records' device and versions, then ``subtitle``."""
    from plotly.subplots import make_subplots
    batches = sorted({r["B"] for r in rows})
    fig = make_subplots(rows=1, cols=len(batches), subplot_titles=[f"B = {b}" for b in batches], shared_yaxes=True)
    for col, b in enumerate(batches, start=1):
        rs = [r for r in rows if r["B"] == b]
        xs = [r["layer"] for r in rs]
        for key, cfg_key, name, colour in series:
            bar = dict(x=xs, y=[r[key] for r in rs], name=name, marker_color=colour, legendgroup=name,
                       showlegend=col == 1, customdata=[r.get(cfg_key) for r in rs],
                       hovertemplate="%{x}: %{y:.3f} ms (%{customdata})<extra>" + name + "</extra>")
            if outline_pick:
                bar["marker_line"] = dict(width=[2.5 if r["pick"] == r.get(cfg_key) else 0 for r in rs], color="black")
            fig.add_trace(go.Bar(**bar), row=1, col=col)
        fig.update_xaxes(tickangle=-45, row=1, col=col)
    fig.update_yaxes(type="log", title_text="ms per op, CUDA-graph replay (log)", row=1, col=1)
    recs = [rec for r in rows for rec in r["records"]]
    fig.update_layout(barmode="group", height=height,
                      title=dict(text=f"{title}<br><sub>{versions_title(recs)} · {subtitle}</sub>", x=0.01),
                      legend=dict(orientation="h", y=-0.42), margin=dict(t=90, b=150))
    return readable_log_axes(fig)


def gemm_ceilings(records: Optional[List[dict]] = None) -> dict:
    """The recorded dense 4096³ GEMM ceilings (TFLOP/s): ``warp_tflops`` (Warp's best tile GEMM config, named in
    ``warp_config``) and ``cublas_tflops`` (``torch.matmul``), from the run that timed the most tile configs on it;
    ``{}`` when none is recorded."""
    return _gemm4096(forward_records() if records is None else records)


#: The tile-kernel families notebook 02 teaches: the tile GEMM over gathered rows and the node-major kernels, each
#: without its prefetching variant (the gather kernel, node-major, and node-major with the neighbour loop split
#: across CTAs).
TILE_FAMILIES = ("tile_gemm", "node_major")


def _taught(family: Optional[str], families: Sequence[str]) -> bool:
    """Whether a record's family string is a variant of one of ``families`` (registry keys) without prefetch."""
    from fovi_lab.kernels.families.registry import family_or_none
    fam = family_or_none(family) if family else None
    return fam is not None and fam.key in families and not fam.variants.get(family, {}).get("prefetch", False)


def _family(rec: dict) -> Optional[str]:
    """A record's kernel family: its ``family`` field, else the registered config's (None when unknown)."""
    if rec.get("family"):
        return rec["family"]
    from fovi_lab.kernels import forward as F
    try:
        return F.config_spec(rec.get("config")).family
    except Exception:  # noqa: BLE001 - a config no longer registered
        return None


def tile_kernel_table(records: Optional[List[dict]] = None, families: Sequence[str] = TILE_FAMILIES) -> List[dict]:
    """One row per recorded (layer, B) for the tile kernels of ``families``, each part read from one run.

    From the run that timed the most configs of ``families`` (the latest of equals): the fastest of them,
    kernel alone (``config``, ``kernel_ms``), the dense tile-GEMM ceiling of its tiles recorded beside it
    (``dense_ms``: the same tile loop on dense operands), its whole op (``op_ms``), ``tflops`` (kernel alone),
    the strongest eager PyTorch op of that run (``torch_impl``, ``torch_ms``) and the run's ``records``.
    From the latest run that timed the cached kernel (None where none did): ``cached_ms``, ``cached_config``,
    and that run's chosen uncached config as a whole op (``cached_vs_config``, ``cached_vs_ms``); its records
    are in ``cached_records``. Plus ``cin``."""
    records = forward_records() if records is None else records
    fams = set(families)
    rows = []
    for (layer, b, mode), runs in record_runs(records).items():
        if layer == "gemm4096" or mode is not None:
            continue

        def tiles(run):
            return [r for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")
                    and not r.get("graphed") and _taught(_family(r), fams)]

        best_run = None
        for run in runs:                                           # oldest first: ">=" keeps the latest of equals
            if tiles(run) and (best_run is None or len(tiles(run)) >= len(tiles(best_run))):
                best_run = run
        if best_run is None:
            continue
        best = min(tiles(best_run), key=lambda r: r["ms_kernel"])
        torch_rows = [r for r in best_run if str(r.get("impl")).startswith("torch") and r.get("ms")
                      and not r.get("graphed")]
        strongest = min(torch_rows, key=lambda r: r["ms"]) if torch_rows else None
        cached_run = latest_run_where(runs, lambda run: any(r.get("impl") == "warp_cached" and r.get("ms")
                                                            for r in run))
        cached = vs = None
        if cached_run is not None:
            cached = next(r for r in cached_run if r.get("impl") == "warp_cached" and r.get("ms"))
            vs = next((r for r in cached_run if r.get("impl") == "warp_uncached" and r.get("chosen") and r.get("ms")
                       and not r.get("graphed")), None)
        rows.append({
            "layer": layer, "B": b, "cin": best.get("cin"), "config": best.get("config"),
            "kernel_ms": best["ms_kernel"], "dense_ms": best.get("dense_ms"), "op_ms": best.get("ms"),
            "tflops": _tf(best.get("flops"), best["ms_kernel"]),
            "torch_impl": strongest and strongest["impl"], "torch_ms": strongest and strongest["ms"],
            "records": best_run,
            "cached_ms": cached and cached["ms"], "cached_config": cached and cached.get("config"),
            "cached_vs_config": vs and vs.get("config"), "cached_vs_ms": vs and vs.get("ms"),
            "cached_records": cached_run or [],
        })
    order = {n: i for i, n in enumerate(layer_order(r["layer"] for r in rows))}
    rows.sort(key=lambda r: (order[r["layer"]], r["B"]))
    return rows


def _ratio(a, b) -> Optional[float]:
    return a / b if (a and b) else None


def _f(v, spec: str, width: int) -> str:
    """``v`` formatted with ``spec``, or a dash where there is no value (right-aligned to ``width``)."""
    return format(v, spec).rjust(width) if v is not None else "-".rjust(width)


def forward_lines(rows: List[dict], batches: Sequence[int] = (16, 512),
                  records: Optional[List[dict]] = None) -> List[str]:
    """Text lines of :func:`forward_table` rows at ``batches``, one per row, 3 decimals (ms): the heuristic's
    config as a whole op and kernel alone, the dense ceiling of its tiles, the kernel's TFLOP/s, the strongest
    PyTorch op and PyTorch's time over Warp's op (above 1: Warp faster). A ``cached`` column only when some
    row records the cached kernel. ``records`` (those ``rows`` were read from): a first line with the device,
    versions and dates of the runs behind the printed rows."""
    sel = [r for r in rows if r["B"] in batches and r.get("pick_ms") and r.get("torch_ms")]
    with_cached = any(r.get("cached_ms") for r in sel)
    out = []
    if records is not None:
        out.append("recorded on " + versions_title([r for r in _forward_rows(records)[1] if r.get("B") in batches]))
    head = (f"{'B':>3s}  {'layer':15s} {'op':>6s} {'kernel':>6s} {'ceil':>6s} {'TFLOP/s':>7s}  "
            f"{'strongest PyTorch':17s} {'ms':>6s} {'torch/op':>8s}" + (f" {'cached':>6s}" if with_cached else "")
            + "  heuristic's kernel")
    out.append(head)
    for r in sel:
        out.append(f"{r['B']:3d}  {r['layer']:15s} {_f(r['pick_ms'], '.3f', 6)} "
                   f"{_f(r['pick_kernel_ms'], '.3f', 6)} {_f(r['pick_dense_ms'], '.3f', 6)} "
                   f"{_f(_tf(r['flops'], r['pick_kernel_ms']), '.1f', 7)}  {str(r['torch_impl']):17s} "
                   f"{_f(r['torch_ms'], '.3f', 6)} {_f(_ratio(r['torch_ms'], r['pick_ms']), '.2f', 8)}"
                   + (f" {_f(r.get('cached_ms'), '.3f', 6)}" if with_cached else "")
                   + f"  {short_label(str(r['pick_config']))}")
    return out


def tile_kernel_lines(rows: List[dict], batches: Sequence[int] = (16, 512)) -> List[str]:
    """Text lines of :func:`tile_kernel_table` rows at ``batches``: per row the fastest tile config (kernel
    alone), its dense ceiling and their ratio (kernel / ceiling), TFLOP/s, its whole op, the strongest PyTorch op
    of the same run and Warp's op over it (above 1: PyTorch faster); then, where a run timed it, the cached kernel
    against that run's chosen uncached op (cached / uncached: below 1, caching paid)."""
    sel = [r for r in rows if r["B"] in batches]
    out = ["tile kernels, the run that timed the most of them: " + versions_title([x for r in sel for x in r["records"]]),
           f"{'B':>3s}  {'layer':15s} {'Cin':>3s} {'kernel':>6s} {'ceil':>6s} {'k/ceil':>6s} "
           f"{'TFLOP/s':>7s} {'op':>6s}  {'strongest PyTorch':17s} {'ms':>6s} {'op/torch':>8s}  fastest tile kernel"]
    for r in sel:
        out.append(f"{r['B']:3d}  {r['layer']:15s} {_f(r['cin'], 'd', 3)} "
                   f"{_f(r['kernel_ms'], '.3f', 6)} {_f(r['dense_ms'], '.3f', 6)} "
                   f"{_f(_ratio(r['kernel_ms'], r['dense_ms']), '.2f', 6)} {_f(r['tflops'], '.1f', 7)} "
                   f"{_f(r['op_ms'], '.3f', 6)}  {str(r['torch_impl']):17s} {_f(r['torch_ms'], '.3f', 6)} "
                   f"{_f(_ratio(r['op_ms'], r['torch_ms']), '.2f', 8)}  {short_label(str(r['config']))}")
    cached = [r for r in sel if r.get("cached_ms")]
    if cached:
        out.append("")
        out.append("cached kernel, the latest run that timed it: "
                   + versions_title([x for r in cached for x in r["cached_records"]]))
        out.append(f"{'B':>3s}  {'layer':15s} {'Cin':>3s} {'cached ms':>9s} {'uncached ms':>11s} "
                   f"{'cached/uncached':>15s}  {'cached tiles':15s} uncached pick")
        for r in cached:
            out.append(f"{r['B']:3d}  {r['layer']:15s} {_f(r['cin'], 'd', 3)} {_f(r['cached_ms'], '.3f', 9)} "
                       f"{_f(r['cached_vs_ms'], '.3f', 11)} {_f(_ratio(r['cached_ms'], r['cached_vs_ms']), '.2f', 15)}  "
                       f"{short_label(str(r['cached_config']), title=False):15s} {short_label(str(r['cached_vs_config']))}")
    return out
