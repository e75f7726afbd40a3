"""The host path of an eager call (notebook 07, section 4): what a small-batch forward pays besides its
kernel, measured here and recorded on the H200.

* :func:`host_cost`: the host time of one forward call on this machine, no kernel launched: the first
  call of a signature (argument checks, table analysis, config choice, operands) against a repeated one
  (the call cache of :func:`fovi_lab.kernels.forward.api.prepare_uncached` skips the first three).
* :func:`host_probe_runs` / :func:`host_probe_figure`: the recorded H200 host probes
  (``fovi_lab/records/h200/logs/host_probe_*.json``, written by ``tools/h200/host_probe.py``). Per shape and probe,
  the host time to issue one forward and one train step (no synchronisation), with the step's CUDA-graph
  replay (its GPU time) beside it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import List

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from fovi_lab import lab as kl

__all__ = ["host_cost", "host_probe_runs", "host_probe_rows", "host_probe_figure", "PROBE_LABELS"]

#: recorded probe file -> what the code was doing then
PROBE_LABELS = {
    "host_probe_before.json": "before the host-path work",
    "host_probe_call_cache.json": "the call cache",
    "host_probe_trimmed.json": "every trim",
    "host_probe_trimmed_repeat_a.json": "same code, another machine",
    "host_probe_trimmed_repeat_b.json": "same code, a third machine",
}


def host_cost(shape: str = "MAIN", batch: int = 8, reps: int = 200, device=None) -> dict:
    """Host microseconds of one forward call's preparation on ``device`` (default: the lab's device),
    launch excluded: ``cold_us`` re-runs the checks, table analysis and config choice of a first call;
    ``warm_us`` is a repeated call that finds its signature in the call cache. Both build the operands
    (the layouts the chosen kernel needs, the output), so their difference is the per-call work the cache
    removes."""
    from fovi_lab.kernels import forward as F

    device = device or kl.default_device()
    pb = kl.make_problem(shape, batch, device=device)
    x, w, bias = pb.x, pb.weight, pb.bias
    il, wl = pb.meta.input_linear, pb.meta.weight_linear

    def cold():
        built, info, mode, dev = F.resolve_uncached(x, w, bias, il, wl)
        return F.plan_uncached(built.config, built.kernel, x, w, bias, il, wl, mode, info=info, dev=dev)

    def warm():
        return F.prepare_uncached(x, w, bias, il, wl)

    out = {}
    for name, fn in (("cold", cold), ("warm", warm)):
        fn()
        if x.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        out[f"{name}_us"] = (time.perf_counter() - t0) / reps * 1e6
    out["config"] = F.resolve_uncached(x, w, bias, il, wl)[0].config.name
    out["device"] = str(x.device)
    return out


def host_probe_runs(log_dir=None) -> List[dict]:
    """Every recorded host probe (oldest first): ``{label, file, device, warp, torch, results}``."""
    d = Path(log_dir) if log_dir is not None else kl.LOGS_DIR
    runs = []
    for name, label in PROBE_LABELS.items():
        p = d / name
        if not p.exists():
            continue
        try:
            doc = json.loads(p.read_text())
        except ValueError:
            continue
        runs.append(dict(label=label, file=name, device=doc.get("device"), warp=doc.get("warp"),
                         torch=doc.get("torch"), date=doc.get("date"), results=doc.get("results", {})))
    return runs


def host_probe_rows(log_dir=None) -> List[dict]:
    """The recorded host probes as one row per (probe, shape), for the shapes every probe measured (the figure's):
    ``label``, ``shape``, the host ms to issue one forward (``fwd_ms``) and one train step (``step_ms``), the step
    replayed from a CUDA graph (``replay_ms``: its GPU time, None where not recorded) and ``step_ms / replay_ms``
    (``host_over_gpu``: above 1, the eager step is host-bound)."""
    runs = host_probe_runs(log_dir)
    if not runs:
        return []
    shapes = [s for s in runs[0]["results"] if all(s in r["results"] for r in runs)]
    rows = []
    for r in runs:
        for s in shapes:
            res = r["results"][s]
            replay = res.get("graph", {}).get("replay_ms")
            step = res["step"]["host_issue_ms"]
            rows.append(dict(label=r["label"], shape=s, fwd_ms=res["fwd"]["host_issue_ms"], step_ms=step,
                             replay_ms=replay, host_over_gpu=(step / replay) if replay else None))
    return rows


def host_probe_figure(log_dir=None, height: int = 480) -> go.Figure:
    """Recorded host time per call (ms) of the eager forward (left) and train step (right), one bar
    per probe, on the shapes every probe measured; the step's CUDA-graph replay (its GPU time) as a
    marker."""
    runs = host_probe_runs(log_dir)
    if not runs:
        return kl.message_figure("no recorded host probe yet (tools/h200/host_probe.py on a GPU)")
    shapes = [s for s in runs[0]["results"] if all(s in r["results"] for r in runs)]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("forward: host time to issue one call (ms)",
                                                        "train step: host time per step (ms)"))
    colours = [kl.COLOURS["grey"], kl.COLOURS["torch"], kl.COLOURS["warp"]]
    for i, r in enumerate(runs):
        res = r["results"]
        colour = colours[i % len(colours)]
        fig.add_trace(go.Bar(x=shapes, y=[kl.round4(res[s]["fwd"]["host_issue_ms"]) for s in shapes], name=r["label"],
                             marker_color=colour, legendgroup=r["label"]), row=1, col=1)
        fig.add_trace(go.Bar(x=shapes, y=[kl.round4(res[s]["step"]["host_issue_ms"]) for s in shapes], name=r["label"],
                             marker_color=colour, legendgroup=r["label"], showlegend=False), row=1, col=2)
    last = runs[-1]["results"]
    fig.add_trace(go.Scatter(x=shapes, y=[kl.round4(last[s].get("graph", {}).get("replay_ms")) for s in shapes],
                             mode="markers", marker=dict(symbol="line-ew-open", size=18, color="black"),
                             name=f"step replayed from a CUDA graph ({runs[-1]['label']}): its GPU time"),
                  row=1, col=2)
    recs = [dict(device=r["device"], warp=r["warp"], torch=r["torch"], date=r["date"]) for r in runs]
    fig.update_layout(barmode="group", height=height, margin=dict(l=10, r=10, t=90, b=10),
                      title=kl.figure_title("host time per eager call, H200 machine", recs),
                      legend=dict(orientation="h", y=-0.15))
    fig.update_yaxes(title_text="ms", row=1, col=1)
    return fig
