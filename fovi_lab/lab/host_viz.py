"""The host path of an eager call (notebook 08): what a small-batch forward pays besides its
kernel, measured here and recorded on the H200.

* :func:`host_cost`: the host time of one forward call on this machine, no kernel launched: the first
  call of a signature (argument checks, table analysis, config choice, operands) against a repeated one
  (the call cache of :func:`fovi_lab.kernels.forward.api.prepare_uncached` skips the first three).
* :func:`host_probe_runs` / :func:`host_probe_figure`: the recorded H200 host probes
  (``fovi_lab/records/h200/logs/host_probe_*.json``, written by ``tools/gpu/host_probe.py``). Per shape and probe,
  the host time to issue one forward and one train step (no synchronisation), with the step's CUDA-graph
  replay (its GPU time) beside it.
* :func:`replayed_step_ops`: what a replayed train step issues from the host, counted on the CPU with the graphs
  emulated (:func:`fovi_lab.ops.replay.emulated_on_cpu`).
* :func:`replay_ab_rows` / :func:`replay_ab_figure`: the backends' own replay of their calls
  (:mod:`fovi_lab.ops.replay`), recorded on the H200 by ``tools/gpu/replay_ab.py``
  (``fovi_lab/records/h200/logs/replay_ab.jsonl.gz``): per layer and batch, the eager call replayed and direct beside
  PyTorch's fastest eager form of the same op, interleaved.
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import List

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from fovi_lab import lab as kl
import fovi_lab.lab.figure_layout as figure_layout

__all__ = ["host_cost", "host_probe_runs", "host_probe_rows", "host_probe_figure", "PROBE_LABELS",
           "replay_ab_records", "replay_ab_rows", "replay_ab_summary", "replay_ab_figure", "replay_check"]

#: recorded probe file -> what the probed call did (the three variants of the call, then the last one on two more
#: machines)
PROBE_LABELS = {
    "host_probe_before.json": "no call cache",
    "host_probe_call_cache.json": "call cache",
    "host_probe_trimmed.json": "call cache + trimmed call",
    "host_probe_trimmed_repeat_a.json": "the same, a second machine",
    "host_probe_trimmed_repeat_b.json": "the same, a third machine",
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


def host_probe_figure(log_dir=None, height: int = 540) -> go.Figure:
    """Recorded host time per call (ms) of the eager forward (left) and train step (right), one bar
    per probe, on the shapes every probe measured; the step's CUDA-graph replay (its GPU time) as a
    marker."""
    runs = host_probe_runs(log_dir)
    if not runs:
        return kl.message_figure("no recorded host probe yet (tools/gpu/host_probe.py on a GPU)")
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
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10))
    fig.update_yaxes(title_text="host time per call (ms)", row=1, col=1)
    fig.update_yaxes(title_text="host time per step (ms)", row=1, col=2)
    fig.update_xaxes(title_text="layer and batch")
    figure_layout.headed(fig, height, "host time per eager call, H200 machine", kl.recorded_message(recs))
    return fig


def replay_ab_records(path=None) -> List[dict]:
    """The recorded replay A/B (``tools/gpu/replay_ab.py``): one record per (mode, layer, B, implementation)."""
    p = Path(path) if path is not None else kl.LOGS_DIR / "replay_ab.jsonl.gz"
    if not p.exists():
        return []
    with (gzip.open(p, "rt") if p.name.endswith(".gz") else open(p)) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def replay_ab_rows(mode: str = "train-step", path=None) -> List[dict]:
    """Per (layer, B) of the recorded A/B in ``mode`` (``train-step`` or ``forward``), in record order: the Warp call
    replayed (``replayed_ms``, ``replay``: the switch it ran under) and direct (``direct_ms``), PyTorch's fastest eager
    form (``torch_impl``, ``torch_ms``), ``speedup`` (torch / replayed), ``direct_over_replayed`` and
    ``bitwise`` (the replayed outputs equal to the direct ones)."""
    warp = "warp_train" if mode == "train-step" else "warp_compact"
    shapes: dict = {}
    for r in replay_ab_records(path):
        if r.get("mode") == mode and r.get("ms"):
            shapes.setdefault((r["layer"], r["B"]), {})[r["impl"]] = r
    rows = []
    for (layer, b), d in shapes.items():
        w, direct = d.get(warp), d.get(warp + "_direct")
        torch_impls = {k: v["ms"] for k, v in d.items() if k.startswith("torch")}
        if not (w and direct and torch_impls):
            continue
        best = min(torch_impls, key=torch_impls.get)
        rows.append(dict(layer=layer, B=b, replay=w.get("replay") or "auto", replayed_ms=w["ms"], direct_ms=direct["ms"],
                         torch_impl=best, torch_ms=torch_impls[best], speedup=torch_impls[best] / w["ms"],
                         direct_over_replayed=direct["ms"] / w["ms"], bitwise=w.get("bitwise_equal_direct"),
                         date=w.get("date"), device=w.get("device"), warp=w.get("warp"), torch=w.get("torch")))
    return rows


def replay_ab_summary(mode: str = "train-step", path=None) -> List[dict]:
    """Per recorded batch of :func:`replay_ab_rows`: ``B``, ``replay`` (the switch), ``layers``, ``wins`` (replayed
    faster than PyTorch's fastest eager form), the range of ``direct_over_replayed`` (``gain_min``, ``gain_max``)
    and ``losses`` (``[(layer, speedup)]``)."""
    rows = replay_ab_rows(mode, path)
    out = []
    for b in sorted({r["B"] for r in rows}):
        sub = [r for r in rows if r["B"] == b]
        out.append(dict(B=b, replay=sub[0]["replay"], layers=len(sub), wins=sum(r["speedup"] > 1 for r in sub),
                        gain_min=min(r["direct_over_replayed"] for r in sub),
                        gain_max=max(r["direct_over_replayed"] for r in sub),
                        losses=[(r["layer"], r["speedup"]) for r in sub if r["speedup"] <= 1]))
    return out


def replay_ab_figure(mode: str = "train-step", batches=(16, 64), path=None, height: int = 580) -> go.Figure:
    """Recorded eager time per call (ms), one panel per batch: the Warp call replayed by the backend and direct, and
    PyTorch's fastest eager form, per layer."""
    rows = [r for r in replay_ab_rows(mode, path) if r["B"] in batches]
    if not rows:
        return kl.message_figure("no recorded replay A/B yet (tools/gpu/replay_ab.py on a GPU)")
    fig = make_subplots(rows=len(batches), cols=1, shared_xaxes=True,
                        subplot_titles=[f"{mode}, B = {b}: eager ms per call" for b in batches])
    series = (("replayed by the backend", "replayed_ms", kl.COLOURS["warp"]),
              ("direct (FOVI_KNN_REPLAY=off)", "direct_ms", kl.COLOURS["grey"]),
              ("PyTorch's fastest, eager", "torch_ms", kl.COLOURS["torch"]))
    for i, b in enumerate(batches, start=1):
        sub = [r for r in rows if r["B"] == b]
        for name, key, colour in series:
            fig.add_trace(go.Bar(x=[r["layer"] for r in sub], y=[kl.round4(r[key]) for r in sub], name=name,
                                 marker_color=colour, legendgroup=name, showlegend=i == 1), row=i, col=1)
        fig.update_yaxes(title_text="time per call (ms)", row=i, col=1)
    fig.update_xaxes(title_text="layer", row=len(batches), col=1)
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10))
    figure_layout.headed(fig, height, "eager calls replayed by the backends, interleaved", kl.recorded_message(rows))
    return fig


def replayed_step_ops(layer: str = "res18_layer3_0", batch: int = 4, amp: bool = True, bias: bool = True) -> dict:
    """What a replayed eager train step of ``warp_train`` issues from the host, counted on the CPU with the CUDA
    graphs emulated (:func:`fovi_lab.ops.replay.emulated_on_cpu`): a ``KNNConv`` (fp32 master weights under CPU
    autocast when ``amp``, else fp16) stepped three times (direct, captured, replayed), then one step counted by
    :class:`fovi_lab.bench.host.OpCounter`. Returns ``{"forward": {op: count}, "backward": {...}, "allocations": n,
    "replayed": graphs replayed in the counted step}``: the operations outside the graphs, which a GPU's host issues."""
    from fovi_lab.bench.host import OpCounter
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.ops import replay
    from fovi_lab.ops.autograd import KNNConv
    meta = layer_meta(layer)
    dtype = torch.float32 if amp else torch.float16
    conv = KNNConv(meta.idx, meta.rf_index, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout,
                   backend="warp_train", bias=bias).to(dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, meta.cin, meta.nin, generator=gen).to(dtype).requires_grad_()
    g = torch.randn(batch, meta.cout, meta.nout, generator=gen).half()

    def forward():
        with torch.autocast("cpu", dtype=torch.float16, enabled=amp):
            return conv(x)

    def backward(y):
        y.backward(g)
        x.grad = None
        for p in conv.parameters():
            p.grad = None
    with replay.emulated_on_cpu():
        for _ in range(3):
            backward(forward())
        before = replay.stats()["replayed"]
        with OpCounter() as fwd_ops:
            y = forward()
        with OpCounter() as bwd_ops:
            backward(y)
    return dict(forward=dict(sorted(fwd_ops.names.items())), backward=dict(sorted(bwd_ops.names.items())),
                allocations=fwd_ops.allocations + bwd_ops.allocations,
                replayed=replay.stats()["replayed"] - before)


def replay_check(layer: str = "res18_layer1", batch: int = 16, device: str = "cuda") -> str:
    """On a GPU: ``warp_train``'s step (forward with bias, dx, dW) called three times (direct, captured, replayed) and
    once more after an in-place update of x and the weight, each against the same calls with ``FOVI_KNN_REPLAY=off``;
    returns one line saying whether every output was bitwise equal and how many calls were replayed."""
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.settings import override
    from fovi_lab.knn_warp import WarpTrainOps
    from fovi_lab.ops import replay
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return (f"{layer} B={batch}: not run (the backends replay calls from CUDA graphs, which need a CUDA device; "
                f"elsewhere they call their kernels directly)")
    meta = layer_meta(layer, device=device)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, meta.cin, meta.nin, generator=gen).to(device, torch.float16)
    w = (torch.randn(meta.cout, meta.q, generator=gen) / (meta.cin * meta.k) ** 0.5).to(device, torch.float16)
    bias = torch.randn(meta.cout, generator=gen).to(device, torch.float16)
    g = torch.randn(batch, meta.cout, meta.nout, generator=gen).to(device, torch.float16)

    def step():
        return (WarpTrainOps.forward(meta, x, w, bias),) + tuple(WarpTrainOps.backward_combined(meta, g, x, w))

    def direct():
        with override(FOVI_KNN_REPLAY="off"):
            return step()

    before = replay.stats()["replayed"]
    want = direct()
    same = all(all(torch.equal(a, e) for a, e in zip(step(), want)) for _ in range(3))
    with torch.no_grad():
        w.mul_(0.5)
        x.mul_(-1.0)
    want = direct()
    same = same and all(torch.equal(a, e) for a, e in zip(step(), want))
    return (f"{layer} B={batch}: replayed y, dx and dW bitwise equal to the direct calls' (after an in-place update "
            f"too): {same}; calls replayed: {replay.stats()['replayed'] - before}")
