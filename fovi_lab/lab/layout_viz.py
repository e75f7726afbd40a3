"""Notebook 11, section 7: the operands' layout copies through shared memory (:mod:`fovi_lab.kernels.layout`).

* :func:`check_here`: the copies a forward and a fused adjoint make (x^T with its pad row and batch columns, a
  node-major g with channel padding, a strided destination), run here and compared element by element with
  PyTorch's permute.
* :func:`recorded_copy_rows` / :func:`recorded_copy_table` / :func:`recorded_copy_figure`: the H200 probe that timed
  PyTorch's strided copy and the layout kernel on a step's copy shapes, both replayed from CUDA graphs
  (``data/h200/layout_copies.jsonl``).
* :func:`step_rows` / :func:`step_table`: the train step at B = 512 replayed on the H200 before the layout kernel
  (``data/h200/train_step.jsonl``) and with it (``data/h200/train_step_b512.jsonl.gz``), each beside PyTorch's
  fastest step of its own run.
"""

from __future__ import annotations

from typing import List, Optional

import plotly.graph_objects as go
import torch

from fovi_lab import lab as kl
import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.kernels.layout import swap_axes_into, transpose_into
from fovi_lab.ops.records import read_file

__all__ = ["COPY_RECORDS", "STEP_BEFORE", "STEP_AFTER", "check_here", "recorded_copy_rows", "recorded_copy_table",
           "recorded_copy_figure", "step_rows", "step_table"]

#: The checkout's records (absent from a wheel install).
COPY_RECORDS = kl.DATA_DIR / "h200" / "layout_copies.jsonl"
STEP_BEFORE = kl.DATA_DIR / "h200" / "train_step.jsonl"
STEP_AFTER = kl.DATA_DIR / "h200" / "train_step_b512.jsonl.gz"


def check_here(device=None) -> List[str]:
    """Three layout copies on ``device`` (default: the lab's), each against PyTorch's permute, NaN-prefilled:
    x^T of a batch of 70 with a pad row and 10 padding columns, a node-major g ``[Nout, Cout_p, B]`` with 6 padding
    channels, and dx ``[B, Cin, Nin]`` written through its ``[Cin, B, Nin]`` view from fp32 partials."""
    dev = torch.device(device or kl.default_device())
    g = torch.Generator().manual_seed(0)
    lines = []
    x = torch.randn(70, 3 * 60, generator=g).half().to(dev)                    # x [B, Cin*Nin]
    xt = torch.full((3 * 60 + 1, 80), float("nan"), dtype=torch.float16, device=dev)
    transpose_into(x, xt)
    want = torch.zeros_like(xt)
    want[:-1, :70] = x.t()
    lines.append(_line("x^T [Cin*Nin + 1, Bx]: rows = x's columns, pad row and columns zero", xt, want))
    gy = torch.randn(64, 90, 50, generator=g).half().to(dev)                    # g [B, Cout, Nout]
    gn = torch.full((50, 96, 64), float("nan"), dtype=torch.float16, device=dev)
    swap_axes_into(gy, gn)
    want = torch.zeros_like(gn)
    want[:, :90] = gy.permute(2, 1, 0)
    lines.append(_line("node-major g [Nout, Cout_p, B]: Cout padded 90 -> 96", gn, want))
    part = torch.randn(60, 8, 64, generator=g).to(dev)                         # fp32 partials [Nin, B, Cin]
    dx = torch.full((8, 64, 60), float("nan"), device=dev)
    swap_axes_into(part, dx.permute(1, 0, 2))
    lines.append(_line("dx [B, Cin, Nin] from fp32 [Nin, B, Cin], through a strided view", dx, part.permute(1, 2, 0)))
    return lines


def _line(what: str, got: torch.Tensor, want: torch.Tensor) -> str:
    same = bool(torch.equal(got, want))
    return f"{'PASS' if same else 'FAIL'}  {what}: {got.numel()} elements, bit for bit equal: {same}"


def recorded_copy_rows(records: Optional[List[dict]] = None, dispatch: str = "kernel") -> List[dict]:
    """Per recorded copy (``kind == "layout_copy"``) of the probe run whose ``dispatch`` is ``"kernel"`` (every shape
    through the layout kernel) or ``"rule"`` (through :func:`swap_axes_into`, which hands narrow shapes to PyTorch):
    ``shape`` ``[A, R, C]``, dtype, MB moved one way, PyTorch's and the kernel's GPU time (us) replayed, the ratio
    and the bandwidth of each (read + write)."""
    if records is None:
        records = list(read_file(COPY_RECORDS)) if COPY_RECORDS.is_file() else []
    rows = []
    for r in records:
        if r.get("kind") != "layout_copy" or r.get("dispatch") != dispatch:
            continue
        gb = 2 * r["mb"] / 1e3
        rows.append(dict(shape=r["shape"], dtype=r["dtype"], mb=r["mb"], torch_us=r["torch_us"],
                         kernel_us=r["kernel_us"], speedup=r["torch_us"] / r["kernel_us"],
                         torch_tbs=gb / r["torch_us"] * 1e3, kernel_tbs=gb / r["kernel_us"] * 1e3,
                         narrow=min(r["shape"][0], r["shape"][2]), equal=r.get("equal"), record=r))
    return rows


def recorded_copy_table(rows: Optional[List[dict]] = None, dispatch: str = "kernel") -> str:
    """:func:`recorded_copy_rows` as text."""
    head = (f"{'src [A, R, C]':18s} {'dtype':8s} {'MB':>6s} | {'PyTorch us':>10s} {'TB/s':>5s} | {'kernel us':>9s} "
            f"{'TB/s':>5s} | {'speedup':>7s}")
    return kl.text_table(recorded_copy_rows(dispatch=dispatch) if rows is None else rows, head, lambda r: (
        f"{str(r['shape']):18s} {r['dtype']:8s} {r['mb']:6.1f} | {r['torch_us']:10.1f} {r['torch_tbs']:5.2f} | "
        f"{r['kernel_us']:9.1f} {r['kernel_tbs']:5.2f} | {r['speedup']:6.2f}x"), f"no layout-copy records at {COPY_RECORDS}")


def recorded_copy_figure(rows: Optional[List[dict]] = None, height: int = 460) -> go.Figure:
    """Bandwidth (read + write, TB/s) of each recorded copy: PyTorch's strided copy and the layout kernel, the legend
    between the title and the plot, clear of the turned shape labels."""
    rows = recorded_copy_rows() if rows is None else rows
    if not rows:
        return kl.message_figure(f"no layout-copy records at {COPY_RECORDS}")
    labels = [f"{r['shape']} {r['dtype']}" for r in rows]
    fig = go.Figure()
    for key, name, colour in (("torch_tbs", "PyTorch's strided copy", "#7f7f7f"),
                              ("kernel_tbs", "layout kernel (shared-memory tile)", "#2ca02c")):
        fig.add_trace(go.Bar(x=labels, y=[r[key] for r in rows], name=name, marker_color=colour,
                             hovertemplate="%{x}: %{y:.2f} TB/s<extra>" + name + "</extra>"))
    recs = [r["record"] for r in rows]
    fig.update_layout(barmode="group", yaxis=dict(title="read + write (TB/s)"),
                      xaxis=dict(tickangle=-40, title="source shape [A, R, C] and dtype"), margin=dict(b=10))
    figure_layout.headed(fig, height, "Layout copies of a train step's shapes",
                         kl.recorded_message(recs, "replayed · data/h200/layout_copies.jsonl"))
    return fig


def _step_times(path, batch: int) -> dict:
    """layer -> (warp_train replayed ms, PyTorch's fastest replayed ms, its name, commit) of one run at ``batch``."""
    recs = [r for r in read_file(path) if r.get("B") == batch] if path.is_file() else []
    out = {}
    for layer in sorted({r["layer"] for r in recs}):
        rs = [r for r in recs if r["layer"] == layer and r.get("ms")]
        ours = next((r for r in rs if r["impl"] == "warp_train_graphed"), None)
        theirs = [r for r in rs if r["impl"].startswith("torch") and r["impl"].endswith("_graphed")]
        if ours and theirs:
            best = min(theirs, key=lambda r: r["ms"])
            out[layer] = (ours["ms"], best["ms"], best["impl"], ours.get("commit"))
    return out


def step_rows(batch: int = 512) -> List[dict]:
    """Per layer: the replayed train step before the layout kernel and with it, and PyTorch's fastest replayed step
    of each run (``speedup_*``: PyTorch's time over ours)."""
    before, after = _step_times(STEP_BEFORE, batch), _step_times(STEP_AFTER, batch)
    rows = []
    for layer in kl.layer_order(set(before) & set(after)):
        (b_ms, b_torch, _, b_commit), (a_ms, a_torch, a_best, a_commit) = before[layer], after[layer]
        rows.append(dict(layer=layer, before_ms=b_ms, after_ms=a_ms, gain=b_ms / a_ms, speedup_before=b_torch / b_ms,
                         speedup_after=a_torch / a_ms, torch_ms=a_torch, torch_best=a_best, commits=(b_commit, a_commit)))
    return rows


def step_table(rows: Optional[List[dict]] = None) -> str:
    """:func:`step_rows` as text."""
    head = (f"{'layer':15s} | {'before ms':>9s} {'vs PyTorch':>10s} | {'with it ms':>10s} {'vs PyTorch':>10s} | "
            f"{'faster':>6s}")
    return kl.text_table(step_rows() if rows is None else rows, head, lambda r: (
        f"{r['layer']:15s} | {r['before_ms']:9.3f} {r['speedup_before']:9.2f}x | {r['after_ms']:10.3f} "
        f"{r['speedup_after']:9.2f}x | {r['gain']:5.2f}x"), f"no train-step records at {STEP_BEFORE} and {STEP_AFTER}")
