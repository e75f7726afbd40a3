"""Notebook 11: the pipelined tensor-core forward of :mod:`fovi_lab.kernels.forward.mma_pipe` (logic and figures).

* :func:`stage_rows` / :func:`stage_table`: what one CTA of each pipelined config holds: its warp grid, each warp's
  tile, the shared memory of its stages and the bytes it has in flight.
* :func:`bank_groups` / :func:`swizzle_figure`: where the 16-byte chunks of the stage rows land among shared
  memory's 8 bank groups, with and without the XOR swizzle, and how many one ``ldmatrix`` phase hits at once.
* :func:`explore_pipe`: run one pipelined config on a real layer's shape here, against the fp32 reference.
* :func:`recorded_rows` / :func:`recorded_table` / :func:`recorded_figure`: the H200 run that timed every
  pipelined config beside the register kernels' pick, their dense ceilings and cuBLAS on the same GEMMs
  (``data/h200/forward_pipe.jsonl.gz``, tag ``"mmap"``).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import plotly.graph_objects as go

from fovi_lab import lab as kl
import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.graph.layers import RECORDED_LAYERS, layer_meta
from fovi_lab.lab.labels import short_label
from fovi_lab.lab.records import mark_batch
from fovi_lab.ops.records import read_file

__all__ = ["PIPE_RECORDS", "LAYERS", "pipe_configs", "stage_rows", "stage_table", "bank_groups", "swizzle_figure",
           "ldmatrix_conflict", "explore_pipe", "explore_pipe_widget", "recorded_rows", "recorded_table",
           "recorded_figure"]

#: The checkout's record of the pipelined kernels' side-by-side H200 run (absent from a wheel install).
PIPE_RECORDS = kl.DATA_DIR / "h200" / "forward_pipe.jsonl.gz"
#: The layers with recorded H200 runs (the widget's choices).
LAYERS = RECORDED_LAYERS


def pipe_configs(experimental: bool = True) -> List[str]:
    """The pipelined configs (``mmap_*`` / ``mmaps_*``): the registered ones, and with ``experimental`` the ones
    the benchmark times beside them."""
    from fovi_lab.kernels import forward as F
    return [n for n in F.uncached_config_names(experimental=experimental)
            if F.config_spec(n).variant in F.PIPE_VARIANTS]


def stage_rows(configs: Optional[Sequence[str]] = None) -> List[dict]:
    """Per pipelined config: channels ``bm`` x batch rows ``bn`` per CTA, ``bk`` p entries per stage, ``stages``,
    threads, the warp grid ``wm x wn`` and each warp's ``16*mt`` x ``8*nt`` tile, the fp32 accumulators per thread,
    the stages' shared memory (``2 * stages * bk * (bm + bn)`` bytes) and the bytes in flight while a stage is
    multiplied (``stages - 1`` stages)."""
    from fovi_lab.kernels import forward as F
    from fovi_lab.kernels.forward.mma_pipe import pipe_layout
    rows = []
    for name in configs or pipe_configs():
        c = F.config_spec(name)
        bm, bn, bk, s, t = c.tile_n, c.tile_m, c.tile_k, c.r, c.block_dim
        wm, wn, mt, nt = pipe_layout(bm, bn, bk, s, t)
        stage = 2 * bk * (bm + bn)
        rows.append(dict(config=name, split=F.mma_flags(c.variant)[0], bm=bm, bn=bn, bk=bk, stages=s, threads=t, wm=wm,
                         wn=wn, warp_m=16 * mt, warp_n=8 * nt, acc=4 * mt * nt, smem=s * stage,
                         in_flight=(s - 1) * stage))
    return rows


def stage_table(rows: Optional[List[dict]] = None) -> str:
    """:func:`stage_rows` as text."""
    rows = stage_rows() if rows is None else rows
    words = [short_label(r["config"], title=False) for r in rows]
    width = max([len(w) for w in words] + [len("kernel")])
    head = (f"{'kernel':{width}s} {'CTA (ch x rows)':>15s} {'BK':>3s} {'S':>2s} {'warps':>6s} {'warp tile':>9s} "
            f"{'acc/thread':>10s} {'shared KiB':>10s} {'in flight KiB':>13s}")
    return "\n".join([head] + [
        f"{w:{width}s} {str(r['bm']) + ' x ' + str(r['bn']):>15s} {r['bk']:3d} {r['stages']:2d} "
        f"{str(r['wm']) + 'x' + str(r['wn']):>6s} {str(r['warp_m']) + 'x' + str(r['warp_n']):>9s} {r['acc']:10d} "
        f"{r['smem'] / 1024:10.1f} {r['in_flight'] / 1024:13.1f}" for w, r in zip(words, rows)])


def bank_groups(row_elems: int, swizzle: bool, rows: int = 8) -> List[List[int]]:
    """``groups[r][c]``: the bank group (16-byte slot of a 128-byte line, 0-7) where chunk ``c`` (8 fp16) of stage
    row ``r`` is stored, for rows of ``row_elems`` fp16 elements; swizzled: chunk ``c`` sits at ``c ^ (r % 8)``,
    the kernel's layout (:func:`fovi_lab.kernels.forward.mma_pipe.pipe_snippet`)."""
    chunks = row_elems // 8
    return [[((r * row_elems) // 8 + ((c ^ (r % 8)) if swizzle else c)) % 8 for c in range(chunks)]
            for r in range(rows)]


def ldmatrix_conflict(row_elems: int, swizzle: bool, chunk: int = 0) -> int:
    """How many of the 8 addresses of one ``ldmatrix`` phase (the same chunk column of 8 consecutive k rows)
    share a bank group: 1 is conflict-free, 8 serialises the phase 8-fold."""
    groups = [row[chunk] for row in bank_groups(row_elems, swizzle)]
    return max(groups.count(g) for g in set(groups))


def swizzle_figure(row_elems: int = 128, height: int = 380) -> go.Figure:
    """Two heat maps over (stage row, chunk): the bank group of each 16-byte chunk without and with the swizzle.
    One ``ldmatrix`` phase reads one column of 8 rows: one colour repeated down a column is a conflict."""
    from plotly.subplots import make_subplots
    titles = [f"plain: column {0} hits bank group(s) {sorted(set(r[0] for r in bank_groups(row_elems, False)))}",
              "swizzled (chunk c at c ^ (row % 8)): every column hits 8 groups"]
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.08)
    for col, sw in enumerate((False, True), start=1):
        z = bank_groups(row_elems, sw)
        fig.add_trace(go.Heatmap(z=z, text=[[str(v) for v in row] for row in z], texttemplate="%{text}",
                                 colorscale="Turbo", zmin=0, zmax=7, showscale=col == 2,
                                 colorbar=dict(title="bank group"),
                                 hovertemplate="row %{y}, chunk %{x}: bank group %{z}<extra></extra>"), row=1, col=col)
        fig.update_yaxes(autorange="reversed", title_text="stage row (p entry)", row=1, col=col)
        fig.update_xaxes(title_text="row position (16-byte chunks)", row=1, col=col)
    fig.update_layout(margin=dict(b=50))
    figure_layout.headed(fig, height, "Shared memory of one stage: where each row's chunks land", legend=None)
    return fig


def explore_pipe(layer: str = "alex_L1", batch: int = 16, config: str = "mmap_o64b128k32s3",
                 nodes: Optional[int] = 8, device=None) -> dict:
    """One pipelined config on ``layer``'s shape (its first ``nodes`` output nodes; None: all) at ``batch``, on
    this machine, into a NaN-prefilled output, against the fp32 reference; and the rule's pick for the full
    layer at that batch."""
    from fovi_lab.lab.mma_viz import explore_mma
    if config not in pipe_configs():
        raise ValueError(f"config must be one of the {len(pipe_configs())} pipelined kernels of pipe_configs(), got "
                         f"{short_label(config) if isinstance(config, str) else repr(config)}")
    return explore_mma(layer, batch=batch, config=config, nodes=nodes, device=device)


def _records() -> List[dict]:
    return list(read_file(PIPE_RECORDS)) if PIPE_RECORDS.is_file() else []


def recorded_rows(records: Optional[List[dict]] = None) -> List[dict]:
    """Per (layer, B) of the side-by-side run (tag ``"mmap"``): the register kernels' pick (``reg``: the config the
    run chose) and the fastest pipelined config (``pipe``), kernel times (ms) and TFLOP/s of the compact GEMM's
    ``2 B P64 Cout Nout``; the pipelined config's own loop over dense operands (``pipe_dense_tflops``) and cuBLAS's
    batched GEMM of the same shapes without gathers (``cublas_tflops``)."""
    from fovi_lab.kernels import forward as F
    records = _records() if records is None else records
    recs = [r for r in records if r.get("tag") == "mmap" and r.get("layer") in RECORDED_LAYERS]
    rows = []
    for layer in RECORDED_LAYERS:
        for b in sorted({r["B"] for r in recs if r["layer"] == layer}):
            rs = [r for r in recs if r["layer"] == layer and r["B"] == b]
            warp = [r for r in rs if r.get("impl") == "warp_uncached" and r.get("ms_kernel")]
            reg = next((r for r in warp if r.get("chosen")), None)
            pipes = [r for r in warp if r.get("config") and F.config_spec(r["config"]).variant in F.PIPE_VARIANTS]
            cublas = next((r for r in rs if r.get("impl") == "cublas_dense_bmm" and r.get("ms")), None)
            if reg is None or not pipes:
                continue
            best = min(pipes, key=lambda r: r["ms_kernel"])
            flops = float(best["flops"])
            rows.append(dict(layer=layer, B=b, reg=reg["config"], reg_ms=reg["ms_kernel"],
                             reg_tflops=flops / reg["ms_kernel"] * 1e-9, pipe=best["config"], pipe_ms=best["ms_kernel"],
                             pipe_tflops=flops / best["ms_kernel"] * 1e-9,
                             pipe_dense_tflops=flops / best["dense_ms"] * 1e-9 if best.get("dense_ms") else None,
                             cublas_tflops=cublas.get("tflops") if cublas else None,
                             speedup=reg["ms_kernel"] / best["ms_kernel"], records=rs))
    return rows


def recorded_table(rows: Optional[List[dict]] = None) -> str:
    """:func:`recorded_rows` as text."""
    head = (f"{'layer':15s} {'B':>4s} {'pick ms':>8s} {'TFLOP/s':>7s} | {'pipe ms':>9s} {'TFLOP/s':>7s} {'speedup':>7s} | "
            f"{'its dense':>9s} {'cuBLAS':>6s} | register pick -> fastest pipelined")
    f = lambda v: f"{v:.0f}" if v else "-"  # noqa: E731
    return kl.text_table(recorded_rows() if rows is None else rows, head, lambda r: (
        f"{r['layer']:15s} {r['B']:4d} {r['reg_ms']:8.3f} {r['reg_tflops']:7.0f} | {r['pipe_ms']:9.3f} "
        f"{r['pipe_tflops']:7.0f} {r['speedup']:6.2f}x | {f(r['pipe_dense_tflops']):>9s} {f(r['cublas_tflops']):>6s} | "
        f"{short_label(r['reg'])} -> {short_label(r['pipe'], title=False)}"),
        f"no side-by-side records of the pipelined kernels at {PIPE_RECORDS}")


def recorded_figure(rows: Optional[List[dict]] = None, batch: int = 512, height: int = 460) -> go.Figure:
    """TFLOP/s per layer at ``batch``: the register kernels' pick, the fastest pipelined config, that config's
    loop over dense operands, and cuBLAS on the same GEMMs without gathers (kernel times)."""
    rows = [r for r in (recorded_rows() if rows is None else rows) if r["B"] == batch]
    if not rows:
        return kl.message_figure(f"no side-by-side records of the pipelined kernels at B = {batch}")
    fig = go.Figure()
    for key, name, colour, cfg in (("reg_tflops", "register pick", "#1f77b4", "reg"),
                                   ("pipe_tflops", "fastest pipelined", "#2ca02c", "pipe"),
                                   ("pipe_dense_tflops", "its loop on dense operands", "#98df8a", "pipe"),
                                   ("cublas_tflops", "cuBLAS, same GEMMs, no gathers", "#7f7f7f", None)):
        fig.add_trace(go.Bar(x=[r["layer"] for r in rows], y=[r[key] for r in rows], name=name, marker_color=colour,
                             customdata=[r[cfg] if cfg else "torch.bmm" for r in rows],
                             hovertemplate="%{x}: %{y:.0f} TFLOP/s (%{customdata})<extra>" + name + "</extra>"))
    recs = [rec for r in rows for rec in r["records"]]
    fig.update_layout(barmode="group", yaxis=dict(title="kernel throughput (TFLOP/s)"),
                      xaxis=dict(title="layer"), margin=dict(b=40))
    figure_layout.headed(fig, height, f"The pipelined tensor-core forward at B = {batch}",
                         kl.recorded_message(recs, "data/h200/forward_pipe.jsonl.gz"))
    return fig


def explore_pipe_widget(layer: str, batch: int, config: str, device=None,
                        budget: float = kl.CPU_WORK_BUDGET) -> Tuple[List[str], go.Figure]:
    """One widget run: ``config`` on ``layer`` at ``batch`` here (its first 8 output nodes on a CPU, all of them on
    a GPU), and the recorded TFLOP/s of that layer at B = 64 and 512. Returns ``(lines, figure)``; a choice outside
    the offered ones, or more work than ``budget`` on the CPU, gives a message line instead."""
    rows = [r for r in recorded_rows() if r["layer"] == layer]
    lines, fig = kl.layer_kernel_widget(layer, batch, config, layers=LAYERS, configs=pipe_configs(), run=explore_pipe,
                                        figure=_layer_figure(layer, rows), cpu_nodes=8, device=device, budget=budget)
    return lines, (mark_batch(fig, batch, f"live here: {lines[1]}") if len(lines) == 3 else fig)


def _layer_figure(layer: str, rows: List[dict], height: int = 380) -> go.Figure:
    """One layer's recorded TFLOP/s over B: register pick, fastest pipelined, cuBLAS without gathers. The legend
    stands under the batch axis, which leaves the top of the plot to the note :func:`mark_batch` writes there."""
    if not rows:
        return kl.message_figure(f"no side-by-side records of the pipelined kernels for {layer!r}")
    fig = go.Figure()
    for key, name, colour in (("reg_tflops", "register pick", "#1f77b4"), ("pipe_tflops", "fastest pipelined", "#2ca02c"),
                              ("cublas_tflops", "cuBLAS, no gathers", "#7f7f7f")):
        fig.add_trace(go.Bar(x=[f"B={r['B']}" for r in rows], y=[r[key] for r in rows], name=name, marker_color=colour))
    recs = [rec for r in rows for rec in r["records"]]
    fig.update_layout(barmode="group", yaxis=dict(title="throughput (TFLOP/s)"), xaxis=dict(title="batch"))
    figure_layout.headed(fig, height, f"{layer}: throughput over the batch",
                         kl.recorded_message(recs, "from kernel times"), legend="below")
    return fig
