"""Notebook 13, section 1: the Cin = 3 stems, where the gathers leave the GEMM loop (logic and figures).

* :func:`stage_bytes`: the im2col stage's size against the layer's own operands, per stem.
* :func:`explore_stem`: run the stem's gather-family and i2c forwards and the gathered / staged-operand
  adjoints on this machine, each checked against the fp32 reference.
* :func:`stem_forward_rows` / :func:`stem_forward_figure`: the recorded H200 sweep (kernel alone: the
  gather family's best config, the heuristic's i2c config, the dense tile-GEMM ceiling of the i2c tiles,
  and the strongest PyTorch forward of the same run).
* :func:`stem_train_rows`: the recorded train steps before (gathered operands) and after (staged ones).
* :func:`simt_rows` / :func:`simt_figure`: the SIMT register-blocked forward against the i2c tiles and the
  strongest PyTorch forward, per stem and batch (the H200 SIMT sweep of :data:`fovi_lab.lab.records.SELECTIONS`).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import plotly.graph_objects as go

from fovi_lab.lab.common import readable_log_axes
from fovi_lab import lab as kl
import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.graph.layers import layer_meta
from fovi_lab.graph.meta import pad_to
from fovi_lab.kernels.families.registry import family, lookup
from fovi_lab.lab.labels import kernel_label, short_label

__all__ = ["STEMS", "stage_bytes", "explore_stem", "stem_forward_rows", "stem_forward_figure", "stem_train_rows",
           "simt_rows", "simt_figure"]

STEMS = ("alex_L0", "res18_stem_rf2", "dinov3_patch")   # the tables the recorded stem runs used
_MIB = 1 << 20


def _is_stem(r: dict) -> bool:
    return r.get("cin") is not None and r["cin"] < 32


def stage_bytes(layers: Sequence[str] = STEMS, batch: int = 64, budget_mib: float = 32.0) -> List[dict]:
    """Per stem at ``batch``: x, y and W in MiB, the whole im2col operand ``[Nout*P64, B]`` fp16, the
    staged weight rows ``[Nout*P64, Cout]`` fp16, and how many chunks the stage budget cuts the first into."""
    rows = []
    for name in layers:
        m = layer_meta(name)
        bx = pad_to(batch, 8)
        stage = 2 * m.nout * m.p64 * bx
        per_chunk = max(1, int(budget_mib * _MIB) // (2 * m.p64 * bx))
        rows.append(dict(layer=name, B=batch, x_mib=2 * batch * m.cin * m.nin / _MIB,
                         y_mib=2 * batch * m.cout * m.nout / _MIB, w_mib=2 * m.cout * m.q / _MIB,
                         stage_mib=stage / _MIB, weff_mib=2 * m.nout * m.p64 * pad_to(m.cout, 8) / _MIB,
                         chunks=-(-m.nout // per_chunk)))
    return rows


def explore_stem(layer: str = "alex_L0", batch: int = 5, nodes: int = 48, device=None) -> dict:
    """The stem's forwards (the gather family's config, the i2c config of its shape, the fp16 SIMT kernel
    and the vec4 one used from B = 32 on) and its adjoints (gathered and staged-operand gi/gw), on a ``nodes``-node slice of
    ``layer``: parity lines against the fp32 reference, the configs, and the run times on this machine."""
    import time
    from fovi_lab.kernels import adjoint as wa
    from fovi_lab.kernels import forward as F
    from fovi_lab.ops.reference import CompactTorchOps
    device = kl.default_device() if device is None else device
    pb = kl.make_problem(layer, batch=batch, device=device, nodes=nodes)
    m = pb.meta
    ref, ref_name = kl.reference_forward(m, pb.x, pb.weight, pb.bias)
    pick = F.select_i2c(batch, m.cout, m.p64)
    gather = "m64n96b256" if m.cout % 96 == 0 and m.cout % 64 else "m64n64r1b256"
    out = dict(layer=layer, B=batch, nodes=m.nout, device=device, configs={}, lines=[])
    for cfg in (gather, pick, F.SIMT_CONFIG, F.select_simt(64, m.cout)):
        t0 = time.perf_counter()
        y = F.run_uncached(pb.x, pb.weight, pb.bias, m.input_linear, m.weight_linear, config=cfg)
        dt = (time.perf_counter() - t0) * 1e3
        err = kl.rel_error(y.float().cpu(), ref.cpu())
        out["configs"][cfg] = dict(err=err, ms=dt)
        out["lines"].append(kl.parity_line(f"forward, {short_label(cfg)}, vs {ref_name}", err, 1e-2))
    g32 = pb.grad_y.float()
    dx_ref = CompactTorchOps.grad_input(m, g32, pb.weight.float())
    dw_ref = CompactTorchOps.grad_weight(m, g32, pb.x.float())
    for gi, gw in (("gi2_p64b64", "gw3_p64n64"), ("gi2i_p64b64", "gw3i_p64n64")):
        dx = wa.grad_input(m, pb.grad_y, pb.weight, config=gi)
        dw = wa.grad_weight(m, pb.grad_y, pb.x, config=gw)
        for what, got, want, cfg in (("dx", dx, dx_ref, gi), ("dW", dw, dw_ref, gw)):
            err = kl.rel_error(got.cpu(), want.cpu())
            out["configs"][cfg] = dict(err=err)
            out["lines"].append(kl.parity_line(f"{short_label(cfg)}, vs fp32 torch_compact", err, 1e-2))
    out["pick"] = pick
    return out


def _sweep_runs_with_i2c(records: List[dict]):
    """(layer, B) -> the latest forward run of that stem shape that swept both the i2c and the gather
    configs (kernel alone): a benchmark run times only the chosen config, so it cannot fill a row."""
    from fovi_lab.kernels import forward as F

    def variant(r):
        try:
            return F.config_spec(str(r.get("config"))).variant if r.get("ms_kernel") else None
        except (KeyError, ValueError):
            return None

    out = {}
    for (layer, b, mode), runs in kl.record_runs([r for r in records if not r.get("note_run")]).items():
        if mode is not None:
            continue
        run = kl.latest_run_where(runs, lambda run: {"i2c", "gather"} <= {variant(r) for r in run})
        if run is not None and _is_stem(run[0]):
            out[(layer, b)] = run
    return out


def stem_forward_rows(records: Optional[List[dict]] = None) -> List[dict]:
    """Per recorded stem shape, from its latest sweep with i2c configs: the gather family's fastest kernel,
    the heuristic's i2c config (kernel alone: the row gathers included) and the dense tile-GEMM ceiling of
    its tiles (ms, and TFLOP/s of the layer's compact work: ``i2c_dense_tflops``), the fastest i2c config, and
    the strongest PyTorch forward (whole op) of the same run."""
    from fovi_lab.kernels import forward as F
    records = kl.forward_records() if records is None else records
    rows = []
    for (layer, b), run in sorted(_sweep_runs_with_i2c(records).items(),
                                  key=lambda kv: (STEMS.index(kv[0][0]) if kv[0][0] in STEMS else 99, kv[0][1])):
        k = {r["config"]: r for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")}
        r0 = run[0]
        pick = F.select_i2c(b, r0["cout"], r0["p64"])
        gath = [r for c, r in k.items() if lookup(c).owner is family("tile_gemm") and not lookup(c)["prefetch"]]
        i2c = [r for c, r in k.items() if lookup(c).owner is family("im2col")]
        torch_rows = [r for r in run if str(r.get("impl")).startswith("torch") and r.get("ms") and not r.get("graphed")]
        g = min(gath, key=lambda r: r["ms_kernel"]) if gath else None
        bi = min(i2c, key=lambda r: r["ms_kernel"]) if i2c else None
        p = k.get(pick)
        t = min(torch_rows, key=lambda r: r["ms"]) if torch_rows else None
        rows.append(dict(layer=layer, B=b, gather_config=g and g["config"], gather_ms=g and g["ms_kernel"],
                         i2c_config=pick, i2c_ms=p and p["ms_kernel"], i2c_dense_ms=p and p.get("dense_ms"),
                         i2c_dense_tflops=(p["flops"] / p["dense_ms"] / 1e9) if p and p.get("flops") and p.get("dense_ms")
                         else None,
                         i2c_frac_dense=p and p.get("frac_dense"), best_i2c=bi and bi["config"],
                         best_i2c_ms=bi and bi["ms_kernel"], torch_impl=t and t["impl"], torch_ms=t and t["ms"],
                         speedup_vs_gather=(g["ms_kernel"] / p["ms_kernel"]) if (g and p) else None,
                         date=str(r0.get("date", ""))[:19], records=run))
    return rows


def stem_forward_figure(rows: Optional[List[dict]] = None, height: int = 480) -> go.Figure:
    """Grouped bars (ms, log) per stem shape: gather family (best config), i2c (the heuristic's config),
    the dense tile-GEMM ceiling of the i2c tiles, and the strongest PyTorch forward."""
    rows = stem_forward_rows() if rows is None else rows
    if not rows:
        return kl.message_figure("no recorded stem sweep with i2c configs under data/")
    x = [f"{r['layer']}<br>B={r['B']}" for r in rows]
    fig = go.Figure()
    for key, name, colour in (("gather_ms", "gather family, best config (kernel)", "#9e9e9e"),
                              ("i2c_ms", "i2c, heuristic's config (row gathers + kernel)", "#1f77b4"),
                              ("i2c_dense_ms", "dense tile-GEMM ceiling, same tiles", "#2ca02c"),
                              ("torch_ms", "strongest PyTorch forward (whole op)", "#d62728")):
        fig.add_trace(go.Bar(x=x, y=[r[key] for r in rows], name=name, marker_color=colour,
                             hovertemplate="%{x}: %{y:.3f} ms<extra>" + name + "</extra>"))
    recs = [rec for r in rows for rec in r["records"]]
    fig.update_layout(barmode="group", yaxis_type="log", yaxis_title="time (ms)", xaxis_title="stem and batch",
                      margin=dict(b=60))
    figure_layout.headed(fig, height, "Stems on the H200: moving the gathers out of the GEMM loop",
                         kl.recorded_message(recs))
    return readable_log_axes(fig)


#: The two recorded runs that :func:`stem_train_rows` compares by default (fovi_lab.lab.records.SELECTIONS): the train
#: step with gathered operand tiles and the one with staged operands, both taken before the host path was trimmed,
#: so the eager columns compare like with like.
STEM_TRAIN_RUNS = ("stem train step, gathered operands", "stem train step, staged operands")


def stem_train_rows(records: Optional[List[dict]] = None, layers: Sequence[str] = STEMS,
                    runs: Optional[Sequence[str]] = STEM_TRAIN_RUNS) -> List[dict]:
    """Per stem and batch, the latest recorded train step (``warp_train_staged``) whose adjoints gathered
    their operand tiles in the GEMM loop, and the latest whose operands were staged ("i" configs): ms
    (eager, and replayed from a CUDA graph when recorded), peak MiB, configs, with the fovi library's own time and
    the strongest PyTorch step of the later run. ``runs``: only these selections' records (when ``records`` is None;
    default :data:`STEM_TRAIN_RUNS`; None: every train-step record). Records that carry a
    ``note_run`` (development runs: other gathers, other stage dtypes) are left out."""
    if records is None:
        records = kl.backward_records(mode="train-step")
        if runs is not None:
            records = [r for name in runs for r in kl.selected(records, name)]
    records = [r for r in records if not r.get("note_run")]      # development runs stay out of the comparison
    rows = []
    for layer in layers:
        for b in sorted({r["B"] for r in records if r.get("layer") == layer}):
            st = [r for r in records if r.get("layer") == layer and r.get("B") == b
                  and r.get("impl") == "warp_train_staged" and r.get("ms") and r.get("gi_config")]
            if not st:
                continue
            staged_op = [r for r in st if "i_" in r["gi_config"]]
            gathered = [r for r in st if "i_" not in r["gi_config"]]
            new = max(staged_op, key=lambda r: str(r.get("date"))) if staged_op else None
            old = max(gathered, key=lambda r: str(r.get("date"))) if gathered else None
            row = dict(layer=layer, B=b)
            for tag, r in (("before", old), ("after", new)):
                graphed = [q for q in records if r is not None and q.get("impl") == "warp_train_graphed"
                           and q.get("layer") == layer and q.get("B") == b and q.get("date") == r.get("date")]
                row[f"{tag}_graphed_ms"] = graphed[0]["ms"] if graphed and graphed[0].get("ms") else None
                row[f"{tag}_ms"] = r and r["ms"]
                row[f"{tag}_peak_mib"] = r and r.get("peak_mib")
                row[f"{tag}_configs"] = r and f"{r['gi_config']} + {r['gw_config']}"
                row[f"{tag}_date"] = r and str(r.get("date"))[:19]
            ref = new or old
            row["seed_ms"] = ref.get("seed_ms")
            row["torch_impl"], row["torch_ms"] = ref.get("strongest"), None
            if ref.get("strongest"):
                same = [r for r in records if r.get("layer") == layer and r.get("B") == b
                        and r.get("impl") == ref["strongest"] and r.get("date") == ref.get("date") and r.get("ms")]
                row["torch_ms"] = same[0]["ms"] if same else None
            rows.append(row)
    return rows


#: The ``run`` ids, in ``fovi_lab/records/h200/forward_sweep.jsonl.gz``, of the SIMT sweeps: the SIMT configs and the
#: i2c pick on the stems, B = 1..128, every config's whole op timed eagerly and replayed from a CUDA graph (the
#: first two: the fp16 ``sd_*`` kernels; the last two: the vec4 ``sv_*`` ones beside ``sd_b8o8u4``).


def simt_rows(records: Optional[List[dict]] = None) -> List[dict]:
    """Per stem and batch, from the SIMT sweep's runs (medians over them), each forward's
    whole op replayed from a CUDA graph (GPU time with every layout copy and no host gaps: the metric the
    heuristic's SIMT rule was read from): the fp16 SIMT kernel (``_SIMT_CONFIG``), the vec4 kernel used
    for that Cout above B = 16, the i2c config of the shape, and the fastest PyTorch forward (replayed, and
    eager); the kernel-alone medians of the first two; the heuristic's pick."""
    import statistics
    from fovi_lab.kernels import forward as F
    records = kl.forward_records() if records is None else records
    runs = [r for r in kl.SELECTIONS["SIMT sweep"].pick(records) if r.get("ms")]
    rows = []
    for layer in STEMS:
        for b in sorted({r["B"] for r in runs if r["layer"] == layer}):
            rs = [r for r in runs if r["layer"] == layer and r["B"] == b]
            r0 = next(r for r in rs if r.get("cin") is not None)
            fp16, vec = F.SIMT_CONFIG, F.select_simt(64, r0["cout"])
            i2c = F.select_i2c(b, r0["cout"], r0["p64"])

            def med(cfg, impl="warp_uncached_graphed", key="ms"):
                vals = [r[key] for r in rs if r["impl"] == impl and r.get("config") == cfg and r.get(key)]
                return statistics.median(vals) if vals else None
            torch_eager = min((r["ms"] for r in rs if str(r["impl"]).startswith("torch") and not r.get("graphed")),
                              default=None)
            torch_graphed = min((r["ms"] for r in rs if str(r["impl"]).startswith("torch") and r.get("graphed")),
                                default=None)
            pick = F.select_config(b, r0["cout"], r0["nout"], r0["p64"], in_channels=r0["cin"],
                                                   mma=False)    # the tile / SIMT rule, the one these sweeps read
            rows.append(dict(
                layer=layer, B=b, fp16_config=fp16, vec_config=vec, i2c_config=i2c, pick=pick,
                fp16_ms=med(fp16), vec_ms=med(vec), i2c_ms=med(i2c),
                fp16_kernel_ms=med(fp16, "warp_uncached", "ms_kernel"), vec_kernel_ms=med(vec, "warp_uncached", "ms_kernel"),
                torch_ms=torch_eager, torch_graphed_ms=torch_graphed, records=rs))
    return rows


def simt_figure(rows: Optional[List[dict]] = None, height: int = 500) -> go.Figure:
    """Whole-op ms replayed from CUDA graphs against B (log-log), one panel per stem: the fp16 SIMT kernel,
    the vec4 one, the i2c tiles and the fastest PyTorch forward."""
    from plotly.subplots import make_subplots
    rows = simt_rows() if rows is None else rows
    if not rows:
        return kl.message_figure("no recorded SIMT sweep in the records")
    layers = [l for l in STEMS if any(r["layer"] == l for r in rows)]
    fig = make_subplots(rows=1, cols=len(layers), subplot_titles=layers, shared_yaxes=True)
    for col, layer in enumerate(layers, start=1):
        rs = [r for r in rows if r["layer"] == layer]
        fp16_tile = kernel_label(rs[0]["fp16_config"], title=False).split(", ")[0]
        for key, name, colour, dash in (("fp16_ms", f"SIMT, fp16 operands ({fp16_tile})", "#ffbb78", None),
                                        ("vec_ms", "SIMT, fp32 operands as 4-vectors (the faster of two blocks)",
                                         "#ff7f0e", None),
                                        ("i2c_ms", "i2c tiles (row gathers + kernel)", "#1f77b4", None),
                                        ("torch_graphed_ms", "fastest PyTorch", "#d62728", "dot")):
            fig.add_trace(go.Scatter(x=[r["B"] for r in rs], y=[r[key] for r in rs], name=name, mode="lines+markers",
                                     line=dict(color=colour, dash=dash), legendgroup=name, showlegend=col == 1,
                                     connectgaps=True,
                                     hovertemplate="B=%{x}: %{y:.3f} ms<extra>" + name + "</extra>"), row=1, col=col)
        fig.update_xaxes(type="log", title_text="batch B (samples)", row=1, col=col)
    fig.update_yaxes(type="log", title_text="time per op (ms)", row=1, col=1)
    recs = [rec for r in rows for rec in r["records"]]
    fig.update_layout(margin=dict(b=60))
    figure_layout.headed(fig, height, "Stems below one tensor-core tile: SIMT register blocks against the i2c tiles",
                         kl.recorded_message(recs, "whole ops replayed from CUDA graphs, medians of the SIMT sweeps"))
    return readable_log_axes(fig)
