"""Pictures for notebook 07 (training a real foveated network) and its widget callback.

Every function is ``data -> plotly go.Figure`` (never a ``FigureWidget``) or a plain dict, so the
notebook only wires widgets to them and everything is tested headless. Coordinates and values are
rounded to 4 decimals and stored as float32 so figures are small and identical from run to run.

* :func:`retina_points_px` -- the retina's sample points in pixel coordinates of an image.
* :func:`retina_figure` -- a digit with the retina's sample points on it (left) and the values the
  retina read, drawn at the sample points (right).
* :func:`loss_figure` -- loss curves of several :class:`~fovi_lab.train.TrainResult` in one figure, each visible
  where they coincide, and the difference of two of them below.
* :func:`compare_losses` -- how closely two loss curves track (max absolute / relative gap).
* :func:`coincide_line` -- that comparison as one printed line.
* :func:`available_backends` -- which of the wanted backends are registered here.
* :func:`train_and_plot` -- the widget callback: ``(backends, steps, lr, batch) -> (summary, figure)``;
  an invalid choice returns a message and never raises.
"""

from __future__ import annotations

import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import fovi_lab.lab.figure_layout as figure_layout

__all__ = [
    "retina_points_px", "retina_figure", "loss_figure", "compare_losses", "coincide_line", "available_backends",
    "train_and_plot", "format_train_summary", "TRAIN_LIMITS",
]

#: Bounds :func:`train_and_plot` accepts (keeps a widget run short on a laptop CPU).
TRAIN_LIMITS = {"steps": (1, 500), "lr": (1e-5, 1.0), "batch": (1, 512)}

_COLOURS = {"torch_compact": "#1f77b4", "warp_train": "#d62728"}
#: How each backend's loss curve is drawn beside another's: a thick line under open circles, so both show where
#: they coincide ("other": any further backend, in turn; "single": a curve drawn alone).
_STYLES = {
    "torch_compact": dict(mode="lines", width=4),
    "warp_train": dict(mode="markers", symbol="circle-open", size=8),
    "other": [dict(mode="lines", width=2, colour="#2ca02c"),
              dict(mode="markers", symbol="x", size=6, colour="#9467bd")],
    "single": dict(mode="lines+markers", width=2, size=4),
}


def _f(x) -> np.ndarray:
    """Round to 4 decimals, float32: small, stable JSON."""
    return np.round(np.asarray(x, dtype=np.float64), 4).astype(np.float32)


def retina_points_px(model, size: int, fixation: Optional[Sequence[float]] = None) -> np.ndarray:
    """``[N0, 2]`` (column, row) pixel coordinates of the model's retina points on a ``size`` image.

    The retina holds ``grid_sample`` coordinates in [-1, 1] (``align_corners=False``: pixel ``j``'s
    centre is at ``(2j + 1) / size - 1``); ``fixation`` shifts them like the model's forward does.
    """
    pts = model.retina.detach().reshape(-1, 2).cpu().double().numpy().copy()
    if fixation is not None:
        pts = pts + np.asarray(fixation, dtype=np.float64).reshape(1, 2)
    return ((pts + 1.0) * size - 1.0) / 2.0


def retina_figure(model, image: torch.Tensor, label: Optional[int] = None,
                  fixation: Optional[Sequence[float]] = None, height: int = 440) -> go.Figure:
    """Left: the image with the retina's sample points. Right: the sampled values at those points. Both panels'
    axes are in the image's pixels; the legend stands under them.

    ``image`` is ``[1, H, W]`` or ``[H, W]`` in [0, 1]. Both panels have row 0 at the top, like the
    image, so the right panel is the image as the network sees it: dense at the fixation point and
    sparse in the periphery (nearest-neighbour samples, one per node).
    """
    img = image.detach().reshape(image.shape[-2], image.shape[-1]).cpu().float()
    size = img.shape[-1]
    px = retina_points_px(model, size, fixation)
    fix = None if fixation is None else torch.as_tensor(fixation, dtype=torch.float32).view(1, 2)
    with torch.no_grad():
        vals = model.sample(img.view(1, 1, *img.shape).to(model.retina.device),
                            None if fix is None else fix.to(model.retina.device))[0, 0].cpu().numpy()
    title = "retina sample points" + ("" if label is None else f" on a '{int(label)}'")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.08,
                        subplot_titles=(title, f"what the retina reads ({len(vals)} nodes)"))
    fig.add_trace(go.Heatmap(z=_f(img.numpy()), colorscale="Greys", reversescale=False, showscale=False,
                             zmin=0, zmax=1, name="image", hoverinfo="skip"), row=1, col=1)
    fig.add_trace(go.Scatter(x=_f(px[:, 0]), y=_f(px[:, 1]), mode="markers", name="sample points",
                             marker=dict(size=3, color="#d62728")), row=1, col=1)
    fig.add_trace(go.Scatter(x=_f(px[:, 0]), y=_f(px[:, 1]), mode="markers", name="sampled values",
                             marker=dict(size=5, color=_f(vals), colorscale="Greys", cmin=0, cmax=1,
                                         showscale=True, colorbar=dict(title="value", len=0.8))),
                  row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(range=[-0.5, size - 0.5], constrain="domain", title_text="image x (pixels)", row=1, col=col)
        fig.update_yaxes(range=[size - 0.5, -0.5], scaleanchor=f"x{'' if col == 1 else col}", scaleratio=1,
                         title_text="image y (pixels)", row=1, col=col)
    fig.update_layout(margin=dict(l=30, r=30), plot_bgcolor="white")
    figure_layout.fit_top(fig)
    figure_layout.legend_below(fig, height)
    return fig


def _result_fields(res) -> Tuple[str, List[int], List[float], float]:
    if isinstance(res, dict):
        return res["backend"], list(res["steps"]), list(res["loss"]), float(res.get("test_accuracy", float("nan")))
    return res.backend, list(res.steps), list(res.loss), float(res.test_accuracy)


def loss_figure(results: Iterable, title: Optional[str] = None, height: int = 380) -> go.Figure:
    """Training loss against step for each result (a ``TrainResult`` or its ``as_dict()``); the legend carries each
    backend's test accuracy.

    With two or more results the curves would hide each other where they coincide, so each backend has its own
    mark (``torch_compact`` a thick line, ``warp_train`` open circles on it) and a lower panel draws the difference
    of the first two, step by step, its largest value in that panel's title (:func:`compare_losses`)."""
    results = list(results)
    fields = [_result_fields(r) for r in results]
    pair = len(fields) >= 2
    if pair:
        (na, sa, la, _), (nb, sb, lb, _) = fields[:2]
        gap = compare_losses(results[0], results[1])
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, row_heights=[0.6, 0.4],
                            subplot_titles=("", f"difference {na} \u2212 {nb} (largest {gap['max_abs_gap']:.4f} "
                                                f"at step {gap['step_of_max']})"))
        height = max(height, 520)
    else:
        fig = go.Figure()
    styles = [_STYLES.get(f[0], _STYLES["other"][i % len(_STYLES["other"])]) if pair else _STYLES["single"]
              for i, f in enumerate(fields)]
    order = sorted(range(len(fields)), key=lambda i: styles[i]["mode"] != "lines")   # lines under the markers
    for i in order:
        name, steps, loss, acc = fields[i]
        style = styles[i]
        label = name if math.isnan(acc) else f"{name} (test acc {acc:.1%})"
        trace = go.Scatter(x=steps, y=_f(loss), name=label, mode=style["mode"], line=dict(
            color=_COLOURS.get(name, style.get("colour")), width=style.get("width", 2)),
            marker=dict(size=style.get("size", 4), symbol=style.get("symbol", "circle"),
                        line=dict(width=1.5, color=_COLOURS.get(name, style.get("colour")))))
        if pair:
            fig.add_trace(trace, row=1, col=1)
        else:
            fig.add_trace(trace)
    layout = dict(title=title or "Training loss (cross-entropy) on the digits, same seed", height=height,
                  margin=dict(l=70, r=20, t=60, b=50), legend=dict(x=0.99, xanchor="right", y=0.99, yanchor="top",
                                                                 bgcolor="rgba(255,255,255,0.8)"))
    if not pair:
        fig.update_layout(xaxis_title="training time (steps)", yaxis_title="loss (nats)", **layout)
        return fig
    db = dict(zip(sb, lb))
    steps = [s for s in sa if s in db]
    diff = [la[sa.index(s)] - db[s] for s in steps]
    fig.add_trace(go.Scatter(x=steps, y=_f(diff), mode="lines+markers", name=f"{na} \u2212 {nb}", showlegend=False,
                             line=dict(color="#7f7f7f", width=1.5), marker=dict(size=4, color="#7f7f7f")),
                  row=2, col=1)
    fig.add_trace(go.Scatter(x=[steps[0], steps[-1]], y=[0.0, 0.0], mode="lines", showlegend=False, name="zero",
                             line=dict(color="black", width=1, dash="dot"), hoverinfo="skip"), row=2, col=1)
    bound = max(abs(v) for v in diff) or 1e-3
    fig.update_yaxes(title_text="loss (nats)", row=1, col=1)
    fig.update_yaxes(title_text="difference (nats)", range=[-1.3 * bound, 1.3 * bound], row=2, col=1)
    fig.update_xaxes(title_text="training time (steps)", row=2, col=1)
    fig.update_layout(**layout)
    return fig


def coincide_line(a, b, within: float = 0.01) -> str:
    """One line on whether two loss curves coincide: the largest difference between them, in nats and relative to
    the loss, and the step where it falls (:func:`compare_losses`)."""
    g = compare_losses(a, b)
    na, nb = _result_fields(a)[0], _result_fields(b)[0]
    verdict = "coincide" if g["max_rel_gap"] < within else "do not coincide"
    return (f"{na} and {nb} {verdict} (within {within:.0%} of the loss at every one of {g['steps']} logged steps: "
            f"{g['max_rel_gap'] < within}): largest difference {g['max_abs_gap']:.4f} nats "
            f"({g['max_rel_gap']:.2%} of the loss) at step {g['step_of_max']}")


def compare_losses(a, b) -> Dict:
    """How closely two loss curves track at their common steps.

    Returns ``{"steps", "max_abs_gap", "max_rel_gap", "step_of_max", "final_a", "final_b"}`` (gaps over the common
    logged steps, relative ones to the larger of the two losses at each step; ``step_of_max``: the step of the
    largest absolute gap).
    """
    _, sa, la, _ = _result_fields(a)
    _, sb, lb, _ = _result_fields(b)
    da, db = dict(zip(sa, la)), dict(zip(sb, lb))
    common = sorted(set(da) & set(db))
    if not common:
        raise ValueError("a, b: the two results share no logged step")
    gaps = [abs(da[s] - db[s]) for s in common]
    rel = [abs(da[s] - db[s]) / max(abs(da[s]), abs(db[s]), 1e-12) for s in common]
    return {"steps": len(common), "max_abs_gap": max(gaps), "max_rel_gap": max(rel),
            "step_of_max": common[gaps.index(max(gaps))], "final_a": da[common[-1]], "final_b": db[common[-1]]}


def available_backends(wanted: Sequence[str] = ("warp_train", "torch_compact")) -> List[str]:
    """The names in ``wanted`` that are registered (importing the Warp ops if they exist), in order."""
    from fovi_lab.ops.autograd import get_ops

    out = []
    for name in wanted:
        try:
            get_ops(name)
        except KeyError:
            continue
        out.append(name)
    return out


def format_train_summary(summary: Dict, timings: bool = True) -> str:
    """Text of a :func:`train_and_plot` summary; deterministic-ish with ``timings=False``."""
    if "message" in summary:
        return summary["message"]
    lines = []
    for name, r in summary["results"].items():
        line = f"{name:<14} final loss {r['loss'][-1]:.3f}   test accuracy {r['test_accuracy']:.1%}"
        if timings:
            line += f"   ({r['seconds']:.1f} s)"
        lines.append(line)
    if "gap" in summary:
        g = summary["gap"]
        lines.append(f"loss gap between the two backends: max {g['max_abs_gap']:.4f} "
                     f"({g['max_rel_gap']:.2%} relative) over {g['steps']} logged steps")
    for name in summary.get("missing", []):
        lines.append(f"{name}: not registered in this install (skipped)")
    return "\n".join(lines)


def _message_figure(msg: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(text=msg, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_layout(height=200, xaxis_visible=False, yaxis_visible=False)
    return fig


def train_and_plot(backends: Sequence[str], steps: int = 20, lr: float = 1e-2, batch: int = 64,
                   device=None, seed: int = 0, log_every: int = 1) -> Tuple[Dict, go.Figure]:
    """The widget callback: train each backend (same seed) and return ``(summary, loss figure)``.

    Never raises: an invalid choice (out-of-range ``steps``/``lr``/``batch``, no backend, an unknown
    backend) returns ``({"message": ...}, figure saying so)``. Backends that are valid names but not
    registered here (``warp_train`` before the Warp ops are installed) are listed as ``missing``.
    """
    from fovi_lab.train import train_digits

    try:
        steps, batch, lr = int(steps), int(batch), float(lr)
        for name, v in (("steps", steps), ("lr", lr), ("batch", batch)):
            lo, hi = TRAIN_LIMITS[name]
            if not lo <= v <= hi:
                raise ValueError(f"{name}: expected a value in [{lo}, {hi}], got {v}")
        backends = list(backends)
        if not backends:
            raise ValueError("backends: pick at least one backend")
    except (TypeError, ValueError) as exc:
        msg = f"Invalid choice: {exc}"
        return {"message": msg}, _message_figure(msg)
    known = available_backends(backends)
    missing = [b for b in backends if b not in known]
    if not known:
        msg = f"None of {backends} is registered here; registered backends: " + ", ".join(
            available_backends(("torch_compact", "warp_train", "warp_compact")))
        return {"message": msg}, _message_figure(msg)
    results = {}
    for name in known:
        try:
            res = train_digits(name, steps=steps, batch=batch, lr=lr, device=device, seed=seed, log_every=log_every)
        except Exception as exc:  # a backend that fails on this device is reported, not raised
            missing.append(f"{name} (failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]})")
            continue
        results[name] = res.as_dict()
    if not results:
        msg = "Every backend failed: " + "; ".join(missing)
        return {"message": msg}, _message_figure(msg)
    summary: Dict = {"results": results, "missing": missing}
    if len(results) >= 2:
        a, b = list(results.values())[:2]
        summary["gap"] = compare_losses(a, b)
    return summary, loss_figure(results.values())
