"""Notebook 13, section 3: the split SIMT forward (``simts``) for grids with too few threads (logic and
figures).

* :func:`thread_count`: how many threads a layer's unsplit SIMT launch has, and the split the tile / SIMT rule
  picks (``FOVI_WARP_MMA=off``: the default picks are the tensor-core kernels of :mod:`fovi_lab.lab.mma_viz`,
  notebooks 09 and 10).
* :func:`explore_split`: run the split kernel on a real layer shape on this machine, checked against the fp32
  reference, with a bitwise repeat (its partials are summed in a fixed order).
* :func:`split_rows` / :func:`split_figure`: the recorded H200 sweeps (the split-loop sweep of :data:`fovi_lab.lab.records.SELECTIONS`): per layer and batch, the split
  kernel's whole op replayed from a CUDA graph, the fastest other Warp forward measured beside it, and the
  fastest PyTorch forward, replayed too.
* :func:`thread_sweep_rows`: the split's thread target swept (8192 / 32768 / 131072 threads).
* :func:`explore_split_widget`: what the notebook's widget runs: one layer, batch and split config here,
  its thread arithmetic, and the recorded H200 replays of that layer beside it.
"""

from __future__ import annotations

import json
import statistics
from typing import List, Optional, Sequence, Tuple

import plotly.graph_objects as go

from fovi_lab import lab as kl
from fovi_lab.graph.layers import layer_meta
from fovi_lab.lab.labels import short_label
from fovi_lab.lab.records import mark_batch

__all__ = ["LAYERS", "SPLIT_CONFIGS", "thread_count", "partial_traffic", "explore_split", "split_rows",
           "split_figure", "thread_sweep_rows", "vec4_w_rows", "explore_split_widget"]

#: The ``run`` ids, in ``fovi_lab/records/h200/forward_sweep.jsonl.gz``, of the sweeps that replayed the split kernels
#: beside the other Warp forwards and PyTorch: the rule's shapes beside the 16x32 node-major tiles and nms, the
#: stems at B = 1/4 with every default pick, and the split kernels beside their vec4-W variants.
LAYERS = ("res18_layer1", "res18_layer2", "res18_layer3_0", "res18_layer3", "res18_layer4_0", "alex_L2",
          "alex_L1", "dinov3_patch", "res18_stem_rf2", "alex_L0")
def _split_simt(name: str) -> bool:
    """Whether config ``name`` is a split SIMT kernel (the SIMT family with its p loop split), by its parameters."""
    from fovi_lab.kernels.families import family, lookup
    point = lookup(name)
    return point.owner is family("simt") and bool(point["split"])
#: The registered split configs (the widget's choices).
SPLIT_CONFIGS = ("ss_b8o8u4", "ss_b4o8u4")


def thread_count(layer: str, batch: int) -> dict:
    """Threads of the unsplit 8x8-block SIMT launch of ``layer`` at ``batch`` (``Nout * ceil(B/8) * Cout/8``),
    the config the tile / SIMT rule picks, and, for a split pick, its split ``S`` and the threads it launches."""
    from fovi_lab.kernels import forward as F
    from fovi_lab.graph.meta import pad_to
    m = layer_meta(layer)
    pick = F.select_config(batch, m.cout, m.nout, m.p64, in_channels=m.cin, node_major=m.cin >= 32,
                                           mma=False)            # the tile / SIMT rule (this section's context)
    cfg = F.config_spec(pick)
    out = dict(layer=layer, B=batch, nout=m.nout, cout=m.cout, p64=m.p64, pick=pick,
               unsplit_threads=m.nout * -(-batch // 8) * pad_to(m.cout, 8) // 8, split=None, threads=None)
    if _split_simt(pick):
        per_split = m.nout * -(-batch // cfg.tile_m) * pad_to(m.cout, cfg.tile_n) // cfg.tile_n
        s, _ = F.simts_split(per_split, pad_to(m.p64, cfg.tile_k) // cfg.tile_k, (cfg.tile_m, cfg.tile_n))
        out.update(split=s, threads=s * per_split)
    return out


def partial_traffic(layer: str, batch: int, hbm_tbps: Optional[float] = None) -> dict:
    """What the tile / SIMT rule's split of ``layer`` at ``batch`` costs in partials: ``S * B * Cout * Nout`` fp32
    (``mb``, 10^6 bytes) and the microseconds (``us``) of HBM time to write them and read them back once each at
    ``hbm_tbps`` (default: the H200 datasheet's, :class:`fovi_lab.bench.common.Roofline`), if none stays in L2.
    ``split`` is None (and both sizes 0) where the rule does not split."""
    from fovi_lab.bench.common import Roofline
    hbm_tbps = Roofline.H200_HBM_TBPS if hbm_tbps is None else hbm_tbps
    t = thread_count(layer, batch)
    nbytes = 4.0 * (t["split"] or 0) * batch * t["cout"] * t["nout"]
    return dict(layer=layer, B=batch, split=t["split"], mb=nbytes / 1e6, hbm_tbps=hbm_tbps,
                us=2 * nbytes / (hbm_tbps * 1e12) * 1e6)


def explore_split(layer: str = "res18_layer3", batch: int = 3, device=None, config: Optional[str] = None) -> dict:
    """The split SIMT forward on ``layer``'s real shape at ``batch``: the split it chose, parity against the
    fp32 reference, a bitwise repeat, and its run time here (``config``: default the heuristic's pick)."""
    import torch
    from fovi_lab.kernels import forward as F
    device = kl.default_device() if device is None else device
    pb = kl.make_problem(layer, batch=batch, device=device)
    m = pb.meta
    config = config or F.select_config(batch, m.cout, m.nout, m.p64, in_channels=m.cin,
                                                       node_major=m.cin >= 32, mma=False)
    y, plan, dt, err, ref_name = kl.run_checked(pb, config)
    again = F.run_uncached(pb.x, pb.weight, pb.bias, m.input_linear, m.weight_linear, config=config)
    return dict(layer=layer, B=batch, config=config, split=getattr(plan, "split", None), err=err, ms=dt,
                bitwise_repeat=bool(torch.equal(y, again)), device=device,
                line=kl.parity_line(f"{short_label(config)}, on {layer} B={batch} vs {ref_name}", err, 1e-2))


def split_rows(records: Optional[List[dict]] = None, batches: Sequence[int] = (1, 4, 16)) -> List[dict]:
    """Per layer (:data:`LAYERS`) and batch, medians over the split-loop sweep's runs of whole ops replayed from CUDA
    graphs: the split config the heuristic would pick there (``ss_b8o8u4`` where the rule does not take the
    split, to show what it would cost), the fastest other Warp forward measured beside it, and the fastest
    PyTorch forward (replayed); plus the heuristic's pick and both ratios."""
    from fovi_lab.kernels import forward as F
    records = kl.forward_records() if records is None else records
    runs = [r for r in kl.SELECTIONS["split-loop sweep"].pick(records) if r.get("ms") and r.get("layer") in LAYERS]
    rows = []
    for layer in LAYERS:
        for b in batches:
            rs = [r for r in runs if r["layer"] == layer and r["B"] == b]
            shape = next((r for r in rs if r.get("cin") is not None), None)
            if shape is None:
                continue
            pick = F.select_config(b, shape["cout"], shape["nout"], shape["p64"],
                                                   in_channels=shape["cin"], node_major=shape["cin"] >= 32,
                                                   mma=False)   # the tile / SIMT rule, the one these sweeps read

            split_cfg = pick if _split_simt(pick) else F.select_simts(
                b, shape["cout"], shape["nout"], shape["p64"])
            per = {}
            for r in rs:
                if r["impl"] == "warp_uncached_graphed":
                    per.setdefault(r["config"], []).append(r["ms"])
            med = {c: statistics.median(v) for c, v in per.items()}
            others = {c: v for c, v in med.items() if not _split_simt(c)}
            torch_med = {}
            for r in rs:
                if str(r["impl"]).startswith("torch") and r.get("graphed"):
                    torch_med.setdefault(r["impl"], []).append(r["ms"])
            torch_med = {k: statistics.median(v) for k, v in torch_med.items()}
            other = min(others, key=others.get) if others else None
            tbest = min(torch_med, key=torch_med.get) if torch_med else None
            split_ms = med.get(split_cfg)
            rows.append(dict(layer=layer, B=b, pick=pick, split_config=split_cfg, split_ms=split_ms,
                             other_config=other, other_ms=others.get(other), torch_impl=tbest,
                             torch_ms=torch_med.get(tbest),
                             split_vs_other=(others[other] / split_ms) if other and split_ms else None,
                             split_vs_torch=(torch_med[tbest] / split_ms) if tbest and split_ms else None,
                             records=rs))
    return rows


#: The recorded series of the split figures: (ms key, config key, name, colour).
_SERIES = (("split_ms", "split_config", "split SIMT (ss_*)", "#ff7f0e"),
           ("other_ms", "other_config", "fastest other Warp forward", "#1f77b4"),
           ("torch_ms", "torch_impl", "fastest PyTorch", "#d62728"))


def split_figure(rows: Optional[List[dict]] = None, height: int = 520) -> go.Figure:
    """Grouped bars, one panel per batch: per layer the split kernel, the fastest other Warp forward and the
    fastest PyTorch forward, all whole ops replayed from CUDA graphs (ms, log scale); the heuristic's pick is
    outlined."""
    rows = split_rows() if rows is None else rows
    if not rows:
        return kl.message_figure("no recorded split-SIMT sweep in the records")
    return kl.batch_panels_figure(rows, _SERIES, "Too few threads: the split SIMT kernel against the tiles and "
                                  "PyTorch", "whole ops, medians of the recorded H200 replays of the split-loop "
                                  "sweep; black outline: the heuristic's pick", height=height, outline_pick=True)


def thread_sweep_rows(path=None) -> List[dict]:
    """The split kernel's thread-target sweep: per layer, batch and split config, the whole op replayed at 8192,
    32768 and 131072 threads (the records that carry ``simts_threads``, or the JSON-lines file ``path``; the 32768
    column is the same run's main process, in the forward sweep)."""
    if path is None:
        extra = [r for r in kl.load_records() if r.get("simts_threads")]
    else:
        try:
            extra = [json.loads(line) for line in open(path)]
        except OSError:
            return []
    if not extra:
        return []
    run = extra[0].get("run")
    main = [r for r in kl.forward_records() if r.get("run") == run and r.get("source") != extra[0].get("source")]
    table = {}
    for r in extra + main:
        if r.get("impl") != "warp_uncached_graphed" or not r.get("ms") or not str(r.get("config", "")).startswith("ss_"):
            continue
        t = r.get("simts_threads") or 32768
        table.setdefault((r["layer"], r["B"], r["config"]), {})[t] = r["ms"]
    return [dict(layer=k[0], B=k[1], config=k[2], ms_by_threads=dict(sorted(v.items())))
            for k, v in sorted(table.items()) if len(v) > 1]


def vec4_w_rows(records: Optional[List[dict]] = None) -> List[dict]:
    """The experimental vec4-W variants against the kernels they vary, per recorded shape: every (run, layer, B)
    that replayed both ``ssw_X`` and ``ss_X`` (or ``sw_X`` and ``sd_X``) from CUDA graphs, with the medians of
    both and ``ratio`` = variant / base (above 1: the variant is slower), sorted by ratio."""
    records = kl.forward_records(variants=True) if records is None else records
    per: dict = {}
    for r in records:
        c = str(r.get("config", ""))
        if r.get("impl") == "warp_uncached_graphed" and r.get("ms") and c.split("_")[0] in ("ss", "ssw", "sd", "sw"):
            per.setdefault((r.get("run"), r["layer"], r["B"], c), []).append(r["ms"])
    bases = {"ssw": "ss", "sw": "sd"}
    rows = []
    for (run, layer, b, c), v in per.items():
        fam, rest = c.split("_", 1)
        base = (run, layer, b, f"{bases[fam]}_{rest}") if fam in bases else None
        if base in per:
            ms, base_ms = statistics.median(v), statistics.median(per[base])
            rows.append(dict(layer=layer, B=b, config=c, base=base[3], ms=ms, base_ms=base_ms, ratio=ms / base_ms))
    return sorted(rows, key=lambda r: (r["ratio"], r["layer"], r["B"], r["config"]))


def explore_split_widget(layer: str, batch: int, config: str = "ss_b8o8u4", device=None,
                         budget: float = kl.CPU_WORK_BUDGET) -> Tuple[List[str], go.Figure]:
    """One widget run: ``config`` on ``layer`` at ``batch`` here (parity, bitwise repeat, split, run time),
    the heuristic's pick for the shape, and a figure of the recorded H200 replays of ``layer`` (split
    kernel, fastest other Warp forward, PyTorch) over B. Returns ``(lines, figure)``; a choice outside the
    offered ones, or more FLOPs than ``budget`` on the CPU, gives a message line instead of a run."""
    from fovi_lab.graph.meta import pad_to
    lines: List[str] = []
    if layer not in LAYERS:
        lines.append(f"layer must be one of {LAYERS}, got {layer!r}")
    if config not in SPLIT_CONFIGS:
        got = short_label(config) if isinstance(config, str) else repr(config)
        lines.append(f"config must be one of the {len(SPLIT_CONFIGS)} split kernels the widget offers, got {got}")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 64:
        lines.append(f"batch must be an integer in [1, 64], got {batch!r}")
    rows = [r for r in split_rows() if r["layer"] == layer] if layer in LAYERS else []
    fig = _layer_figure(layer, rows)
    if lines:
        return lines, fig
    device = kl.default_device() if device is None else device
    m = layer_meta(layer)
    flops = 2.0 * batch * m.p64 * pad_to(m.cout, 8) * m.nout
    if device == "cpu" and flops > budget:
        return [f"{layer} at B = {batch} is {flops / 1e9:.1f} GFLOP: over this CPU's {budget / 1e9:.1f} GFLOP "
                f"budget for one widget run; try a smaller batch"], fig
    t = thread_count(layer, batch)
    res = explore_split(layer, batch=batch, device=device, config=config)
    lines.append(res["line"])
    lines.append(f"{short_label(config)}: split S = {res['split']}, bitwise-identical on a second call: {res['bitwise_repeat']}, "
                 f"{res['ms']:.1f} ms here ({device})")
    lines.append(f"an unsplit 8x8 launch would have {t['unsplit_threads']:,d} threads; the heuristic picks "
                 f"{short_label(t['pick'])} for {layer} at B = {batch}")
    return lines, mark_batch(fig, batch, f"live here: {lines[-2]}")


def _layer_figure(layer: str, rows: List[dict], height: int = 380) -> go.Figure:
    """The recorded replays of one layer over B: split kernel, fastest other Warp forward, PyTorch."""
    return kl.layer_replays_figure(layer, rows, _SERIES, "recorded H200 replays of the split-loop sweep",
                                   f"no recorded split-SIMT runs for {layer!r} under data/", height=height)
