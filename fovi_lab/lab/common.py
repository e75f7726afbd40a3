"""What every notebook's cells share: set-up, devices, error classes, source display, figure helpers.

Every lab function is ``parameters -> results dict -> plotly go.Figure`` (never a ``FigureWidget``), so the
notebooks only wire widgets to them and the tests call them headless. Nothing in the lab defines a kernel:
it runs the production kernels of :mod:`fovi_lab.kernels` and explains them.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from fovi_lab.bench.common import call_ms
from fovi_lab.graph.layers import LAYERS, SYNTHETIC
import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.lab.labels import short_label
from fovi_lab.lab.problems import ORACLE_MAX_ELEMS


#: Tile work (padded FLOPs of one launch) a widget run may ask of Warp's CPU device. Measured on a
#: 2-core box: ~5-12 GFLOP/s for the gather kernel, so one launch stays well under a second.
CPU_WORK_BUDGET = 1.5e9


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

COLOURS = {
    "warp": "#1f77b4", "warp_best": "#17becf", "dense": "#9467bd", "torch": "#ff7f0e",
    "cached": "#2ca02c", "fail": "#d62728", "grey": "#7f7f7f",
}

def default_device() -> str:
    """``"cuda:0"`` when both Warp and torch see a GPU, else ``"cpu"`` (Warp's CPU device)."""
    try:
        import warp as wp
        from fovi_lab.kernels.common import init_warp
        init_warp()
        if wp.is_cuda_available() and torch.cuda.is_available():
            return "cuda:0"
    except Exception:  # noqa: BLE001 - no Warp: the caller sees the CPU and a clear error later
        pass
    return "cpu"


def widget_device(device: Optional[str], normalize: Callable[[str], str]) -> str:
    """The device a widget run uses: ``device`` or :func:`default_device`, ``"cpu"`` as is, a CUDA device in the
    form ``normalize`` gives (the key of the validated-kernel cache the run consults)."""
    device = device or default_device()
    return "cpu" if device == "cpu" else normalize(device)


def setup(seed: int = 0) -> str:
    """Quiet Warp logging, fix the seeds, return the device the kernels will run on."""
    import random
    from fovi_lab.kernels.common import init_warp
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


def _source(obj, inner: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """``(source, where)``: the source of ``obj`` (a function or a module, ``inspect.getsource``) and ``None``; with
    ``inner``, that of the one function named ``inner`` defined anywhere inside ``obj`` (a kernel or loop body that a
    factory builds; decorators included, dedented) and where it sits (``module: outer > ... > inner``)."""
    src = inspect.getsource(obj)
    if inner is None:
        return src, None
    text = textwrap.dedent(src)
    found = []

    def visit(node, path):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                sub = path + (child.name,)
                if child.name == inner and not isinstance(child, ast.ClassDef):
                    found.append((child, sub))
                visit(child, sub)
            else:
                visit(child, path)

    visit(ast.parse(text), ())
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", repr(obj))
    if len(found) != 1:
        raise ValueError(f"inner: {len(found)} functions named {inner!r} in {name} (expected exactly one)")
    node, path = found[0]
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    block = textwrap.dedent("\n".join(text.split("\n")[start - 1:node.end_lineno]))
    module = obj.__name__ if inspect.ismodule(obj) else obj.__module__
    return block, f"{module}: {' > '.join(path)}"


def show_source(fn: Callable, marks: Optional[Dict[str, str]] = None, width: int = 104,
                inner: Optional[str] = None) -> str:
    """The source of ``fn`` (``inspect.getsource``, from the installed package) with numbered lines;
    every line containing a ``marks`` pattern gets ``# <- [label]`` so prose can point at it.

    ``inner`` lists only the function of that name defined inside ``fn`` (``fn`` may also be a module), e.g. the
    kernel a factory decorates or a loop body it builds, under a line that says where it sits.
    Patterns that no longer occur are listed at the end (the prose would be stale).
    """
    marks = marks or {}
    text, where = _source(fn, inner)
    out = [f"     # {where}"] if where else []
    for i, line in enumerate(text.rstrip("\n").split("\n"), 1):
        labels = [lab for pat, lab in marks.items() if pat in line]
        text_line = f"{i:3d}  {line}"
        if labels:
            text_line = f"{text_line:<{width}}# <- [{', '.join(labels)}]"
        out.append(text_line.rstrip())
    missing = missing_marks(fn, marks, inner=inner)
    if missing:
        out.append(f"(the text points at lines that are no longer here: {missing})")
    return "\n".join(out)


def missing_marks(fn: Callable, marks: Iterable[str], inner: Optional[str] = None) -> List[str]:
    """Patterns of ``marks`` that do not occur in ``fn``'s source (in that of its function ``inner``, if given)."""
    src, _ = _source(fn, inner)
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


def text_table(rows: Sequence[dict], head: str, line: Callable[[dict], str], empty: str) -> str:
    """A printed table: ``head``, then ``line(row)`` for each of ``rows``; ``empty`` where there are no rows."""
    if not rows:
        return empty
    return "\n".join([head] + [line(r) for r in rows])


def message_figure(message: str, height: int = 180) -> go.Figure:
    """A figure that only shows ``message`` (what a plot says when there is nothing to plot)."""
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=14, color=COLOURS["fail"]))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=height, margin=dict(l=10, r=10, t=30, b=10))
    return fig


def hline(x, y: float, name: str, colour: str, dash: str = "dash", showlegend: bool = True) -> go.Scatter:
    """A horizontal reference line as a trace from ``x[0]`` to ``x[-1]`` (``add_hline`` annotations
    misplace themselves on log axes and blow up the autorange)."""
    return go.Scatter(x=[x[0], x[-1]], y=[round4(y), round4(y)], mode="lines", name=name, showlegend=showlegend,
                      line=dict(color=colour, dash=dash, width=1.5), hoverinfo="name")


def log_range(values, pad: float = 1.5):
    """``[log10(min/pad), log10(max*pad)]`` over the positive values (for an explicit log-axis range)."""
    v = [float(x) for x in values if x is not None and x > 0 and math.isfinite(float(x))]
    if not v:
        return None
    return [math.log10(min(v) / pad), math.log10(max(v) * pad)]


def _tick_text(v: float) -> str:
    return f"{v:,.0f}" if v >= 1000 else f"{v:g}"


def log_ticks(lo: float, hi: float) -> Tuple[List[float], List[str]]:
    """Tick values and their labels, written out in full, for a log axis over ``[lo, hi]`` (both > 0): the
    1-2-5 steps of every decade in the range, or the decades alone where that gives more than 12 ticks."""
    d0, d1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for steps in ((1, 2, 5), (1,)):
        vals = [m * 10.0 ** d for d in range(d0, d1 + 1) for m in steps if lo <= m * 10.0 ** d <= hi]
        if len(vals) <= 12:
            break
    if len(vals) < 2:                                    # a narrow range: its two ends
        vals = [float(f"{lo:.2g}"), float(f"{hi:.2g}")]
    vals = [float(f"{v:.6g}") for v in vals]
    return vals, [_tick_text(v) for v in vals]


def readable_log_axes(fig: go.Figure) -> go.Figure:
    """``fig`` with every log axis that sets no ticks of its own labelled in full numbers (0.02, 0.05, 0.1, ...;
    :func:`log_ticks`) instead of plotly's digit-only minor labels ("2, 5, 0.1, 2, 5"). The range is the axis's own
    where it has one, else the data of the traces drawn on it."""
    layout = fig.layout.to_plotly_json()
    for name, axis in layout.items():
        if not (name.startswith(("xaxis", "yaxis")) and isinstance(axis, dict) and axis.get("type") == "log"):
            continue
        if axis.get("tickvals") is not None or axis.get("dtick") is not None:
            continue
        letter, ref = name[0], name[0] + name[5:]          # "yaxis2" -> traces with yaxis == "y2"
        if axis.get("range"):
            lo, hi = (10.0 ** float(r) for r in axis["range"])
        else:
            vals = []
            for t in fig.data:
                if (getattr(t, letter + "axis", None) or letter) != ref:
                    continue
                for v in (getattr(t, letter, None) or ()):
                    try:
                        f = float(v)
                    except (TypeError, ValueError):
                        continue
                    if f > 0 and math.isfinite(f):
                        vals.append(f)
            if not vals:
                continue
            lo, hi = min(vals) / 1.3, max(vals) * 1.3
        tickvals, ticktext = log_ticks(lo, hi)
        fig.layout[name].update(tickvals=tickvals, ticktext=ticktext)
    return fig


def batch_menu(batches: Sequence[int], per_b: int, default_b: int, y: float = 1.12, always: int = 0) -> List[dict]:
    """``updatemenus`` of a figure whose traces come in ``per_b``-long groups, one group per batch size:
    one button per batch that shows that group only (and the ``always`` traces after the groups, shown by every
    button)."""
    buttons = []
    for i, b in enumerate(batches):
        vis = [False] * (per_b * len(batches)) + [True] * always
        vis[i * per_b:(i + 1) * per_b] = [True] * per_b
        buttons.append(dict(label=f"B = {b}", method="update", args=[{"visible": vis}]))
    return [dict(buttons=buttons, type="buttons", direction="right", x=1.0, xanchor="right", y=y,
                 active=list(batches).index(default_b))]


def _has_data(trace) -> bool:
    vals = [v for k in ("y", "x", "z", "values") for v in (getattr(trace, k, None) or ())]
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in vals)


def drop_empty_traces(fig: go.Figure) -> go.Figure:
    """``fig`` without the traces that hold no finite number (a series a batch has no record of), the
    ``visible`` lists of its buttons remapped to the traces that stay."""
    keep = [i for i, t in enumerate(fig.data) if _has_data(t)]
    if len(keep) == len(fig.data):
        return fig
    fig.data = [fig.data[i] for i in keep]
    for menu in fig.layout.updatemenus or ():
        for button in menu.buttons or ():
            args = list(button.args or ())
            if args and isinstance(args[0], dict) and isinstance(args[0].get("visible"), (list, tuple)):
                vis = list(args[0]["visible"])
                args[0] = dict(args[0], visible=[vis[i] for i in keep if i < len(vis)])
                button.args = args
    return fig


def round4(x):
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


def sync_device(device: str) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], object], device: str, budget_s: float = 1.0, max_reps: int = 7) -> float:
    """Median ms of ``fn()`` after one warm-up call; stops early when ``budget_s`` is spent (>= 1 rep)."""
    fn()
    sync_device(device)
    times: List[float] = []
    t_start = time.perf_counter()
    while len(times) < max_reps:
        times.append(call_ms(fn, device))
        if time.perf_counter() - t_start > budget_s:
            break
    return float(np.median(times))


def is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def check_explore_args(layer, batch, cout, rf) -> Optional[str]:
    if layer not in LAYER_CHOICES:
        return f"layer must be one of {', '.join(LAYER_CHOICES)}; got {layer!r}"
    if not is_int(batch) or not 1 <= batch <= _MAX_BATCH:
        return f"batch must be an integer in [1, {_MAX_BATCH}], got {batch!r}"
    if cout is not None and (not is_int(cout) or not 1 <= cout <= _MAX_COUT):
        return f"Cout must be an integer in [1, {_MAX_COUT}] (or None for the layer's own), got {cout!r}"
    if rf not in FORWARD_CHOICES["rf"]:
        return f"rf must be 'rf1', 'rf2' or None (the layer's network frame), got {rf!r}"
    return None


def clamp_shape(shape: dict, batch: int, work: Callable[[int, int], float], device: str,
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
    while elems(b, n) > ORACLE_MAX_ELEMS and (b > 1 or n > 1):
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

    def figure(self, message: Optional[str] = None, height: int = 540) -> go.Figure:
        """Top: compile (build + canary) time per run, s, written on each bar (0: built earlier in this session).
        Bottom: kernel run time beside the torch reference on the same device, ms, on an axis from zero (bars
        compare lengths). Red bars: runs whose output failed the check.

        The title is the log's title and the verdict of ``message`` (PASS, FAIL, or "not run" for a choice that
        was refused or failed to run); the whole ``message`` stands under it in small type, wrapped to the
        figure's width. The legend sits between the title and the plot area, clear of the rotated run labels."""
        if not self.runs:
            return message_figure(message or "no runs yet")
        labels = [f"#{i + 1} {r['label']}" for i, r in enumerate(self.runs)]
        fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.1, row_heights=[0.35, 0.65],
                            subplot_titles=("compile + canary (0 s: built earlier in this session)",
                                            "run time, median of the timed calls"))
        compile_s = [round4(r.get("compile_s")) for r in self.runs]
        fig.add_trace(go.Bar(x=labels, y=compile_s, name="compile + canary", marker_color=COLOURS["grey"],
                             text=[None if v is None else f"{v:.2f} s" for v in compile_s], textposition="outside",
                             cliponaxis=False), row=1, col=1)
        colours = [COLOURS["warp"] if r.get("passed") else COLOURS["fail"] for r in self.runs]
        fig.add_trace(go.Bar(x=labels, y=[round4(r.get("run_ms")) for r in self.runs], name="Warp kernel(s)",
                             marker_color=colours), row=2, col=1)
        fig.add_trace(go.Bar(x=labels, y=[round4(r.get("torch_ms")) for r in self.runs],
                             name=self.runs[-1].get("torch_name", "torch reference"),
                             marker_color=COLOURS["torch"]), row=2, col=1)
        fig.update_yaxes(rangemode="tozero", title_text="compile (s)", row=1, col=1)
        fig.update_yaxes(rangemode="tozero", title_text="run time (ms)", row=2, col=1)
        fig.update_xaxes(title_text="run (layer, batch, kernel)", row=2, col=1)
        main = self.title if message is None else f"{self.title}: {run_verdict(message)}"
        fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10))
        figure_layout.headed(fig, height, main, message)
        return fig


def run_verdict(message: str) -> str:
    """The verdict a run's message opens with: ``PASS`` or ``FAIL`` (a checked run), else ``not run`` (a choice
    refused, or a run that stopped before its check)."""
    head = message.split(None, 1)[0] if message and message.strip() else ""
    return head if head in ("PASS", "FAIL") else "not run"


def fail_result(result: dict, log: Optional[RunLog], message: str) -> Tuple[dict, go.Figure]:
    result.update(ok=False, passed=False, message=message)
    fig = log.figure(message=message) if (log is not None and log.runs) else message_figure(message)
    return result, fig


def result_answer(result: dict, log: Optional[RunLog]) -> Tuple[dict, go.Figure]:
    """Add a finished run to ``log`` (or to a fresh one) and return it with the log's figure."""
    log = RunLog() if log is None else log
    log.add(result)
    return result, log.figure(message=result["message"])


def layer_kernel_widget(layer: str, batch: int, config: Optional[str], *, layers: Sequence[str],
                        configs: Sequence[str], run: Callable[..., dict], figure: go.Figure, cpu_nodes: int,
                        device: Optional[str] = None, budget: float = CPU_WORK_BUDGET,
                        none_is_pick: bool = False) -> Tuple[List[str], go.Figure]:
    """The shared flow of the kernel widgets (notebooks 10 and 11): refuse a layer, config or batch outside the
    offered ones, or more than ``budget`` FLOPs of work on a CPU, each with a message line; else
    ``run(layer, batch=, config=, nodes=, device=)`` (a dict with ``line``, ``config``, ``ms``, ``finite``,
    ``split`` and ``pick``) on the layer's first ``cpu_nodes`` output nodes on a CPU (all on a GPU). Returns
    ``(lines, figure)``, ``figure`` being the layer's recorded runs."""
    from fovi_lab.graph.layers import layer_meta
    lines: List[str] = []
    if layer not in layers:
        lines.append(f"layer must be one of {tuple(layers)}, got {layer!r}")
    if not (config is None and none_is_pick) and config not in configs:
        got = short_label(config) if isinstance(config, str) else repr(config)
        lines.append(f"config must be one of the {len(configs)} kernels the widget offers"
                     + (" or None (the pick)" if none_is_pick else "") + f", got {got}")
    if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 512:
        lines.append(f"batch must be an integer in [1, 512], got {batch!r}")
    if lines:
        return lines, figure
    device = default_device() if device is None else device
    nodes = cpu_nodes if device == "cpu" else None
    m = layer_meta(layer)
    flops = 2.0 * batch * m.p64 * m.cout * (min(nodes, m.nout) if nodes else m.nout)
    if device == "cpu" and flops > budget:
        return [f"{layer} at B = {batch} on {nodes} nodes is {flops / 1e9:.1f} GFLOP: over this CPU's "
                f"{budget / 1e9:.1f} GFLOP budget for one widget run; try a smaller batch"], figure
    res = run(layer, batch=batch, config=config, nodes=nodes, device=device)
    return [res["line"],
            f"{short_label(res['config'])}: {res['ms']:.1f} ms here ({device}), every output written: {res['finite']}"
            + (f", p range split {res['split']} ways" if res["split"] else ""),
            f"the rule picks {short_label(res['pick'])} for {layer} at B = {batch}"], figure


# ----------------------------------------------------------------------------------------------- widgets at work

def error_words(exc: BaseException) -> str:
    """An exception as one line a widget can show: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


@contextmanager
def busy(controls: Iterable, status, doing: str = "running"):
    """Show that a widget callback is at work: while the block runs, ``status`` (a widget with a text ``value``, a
    ``Label``) reads ``"running ..."`` and every control in ``controls`` is disabled; after it, each control is as it
    was and ``status`` reads ``"done in 1.2 s"``, or, where the block raised, ``"stopped after 1.2 s by ValueError:
    ..."`` (the exception goes on to the caller). The kernel's busy light goes out before a callback's work is done,
    so this line is the one a learner can read."""
    controls = [w for w in controls if hasattr(w, "disabled")]
    was = [w.disabled for w in controls]
    for w in controls:
        w.disabled = True
    status.value = f"{doing} ..."
    t0 = time.perf_counter()
    try:
        yield status
    except Exception as exc:
        status.value = f"stopped after {time.perf_counter() - t0:.1f} s by {error_words(exc)}"
        raise
    else:
        status.value = f"done in {time.perf_counter() - t0:.1f} s"
    finally:
        for w, d in zip(controls, was):
            w.disabled = d


def live(fn: Callable[..., object], controls: Dict[str, object], *, button: Optional[str] = None,
         arrange=None, doing: str = "running", run_now: bool = True):
    """A widget panel that reruns ``fn(**values)`` (``values``: each control's ``value`` by its name in
    ``controls``) on every change of a control, or on each press of a ``button`` of that label, and once as it is
    built (``run_now``). What ``fn`` prints or displays goes to the panel's output, replacing the last run's; while
    it runs the status line under the controls says so and the controls are disabled (:func:`busy`); an exception
    is shown as one line there and in the output, not as a traceback.

    ``arrange``: a box holding the controls in the layout wanted (default: one column, as ``interact`` has them).
    The panel is a ``VBox`` of that box (and the button), the status line and the output; ``panel.status``,
    ``panel.output``, ``panel.controls``, ``panel.button`` and ``panel.run`` (a rerun) are its parts, ``panel.last``
    what ``fn`` returned last."""
    import ipywidgets as W
    from IPython.display import clear_output
    for name, w in controls.items():
        if hasattr(w, "description") and not w.description:
            w.description = name                                     # as ipywidgets.interact labels them
    status, output = W.Label(value=""), W.Output()
    press = W.Button(description=button, button_style="primary") if button else None
    box = arrange if arrange is not None else W.VBox(list(controls.values()))
    panel = W.VBox([box] + ([press] if press else []) + [status, output])

    def run(*_):
        with output:
            clear_output(wait=True)
            try:
                with busy(list(controls.values()) + ([press] if press else []), status, doing):
                    panel.last = fn(**{name: w.value for name, w in controls.items()})
            except Exception as exc:  # noqa: BLE001 - a widget answers with a line, not a traceback
                print(f"could not run: {error_words(exc)}")

    if press:
        press.on_click(run)
    else:
        for w in controls.values():
            w.observe(run, names="value")
    panel.status, panel.output, panel.controls, panel.button, panel.run, panel.last = (
        status, output, dict(controls), press, run, None)
    if run_now:
        run()
    return panel
