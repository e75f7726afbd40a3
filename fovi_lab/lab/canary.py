"""The silent-launch canary, taught: notebook 03's kernels, byte counts, figures and widget callback.

A GPU thread block (a CTA) has a fixed resource budget. For Warp tile kernels the budget that bites is
**shared memory**: Warp reserves shared memory for *every* tile expression in a kernel (live or not,
taken or not), unrolls small constant-trip loops (<= 16 trips) so each unrolled copy of a tile
expression reserves again, and, with ``enable_backward=True``, compiles an adjoint kernel that
reserves twice the forward's own tiles (each tile paired with a gradient tile). When a launch asks
for more than the device allows:

* Warp < 1.15 printed ``CUDA error 1: invalid argument`` on stderr and *returned normally*, leaving
  the output untouched: the silent-launch trap.
* Warp >= 1.15 raises ``RuntimeError`` naming the byte shortfall (checked with 1.19 on an H200).
* Warp's **CPU** device has its own budget: a fixed 256 KiB tile arena per block
  (``WP_MAX_CPU_SHARED`` in ``warp/native/tile.h``); going over it fails a native assertion that ends
  the *process* (no exception to catch). :func:`explore_config` never launches such a config.

Everything here is ``parameters -> numbers -> plotly go.Figure`` so it runs headless and is tested:

* :func:`estimate_smem` -- a bytes model of a tile-GEMM config (an **estimate**: it counts the tiles
  a kernel declares, the way Warp's codegen does; with ``gather=True, bias=True`` those of the package's
  gather-family forward kernel).
* :func:`warp_smem_bytes` -- Warp's own count for a built kernel (the ``*_smem_bytes`` entry Warp's
  codegen writes into the module's metadata; read on the CPU, no GPU needed).
* :func:`gather_kernel` -- the production gather kernel (:func:`fovi_lab.kernels.forward.make_gather_kernel`)
  for a tile config; :func:`canary_check` runs its production plan into a NaN-prefilled output, or stands
  in for a launch that returns without writing.
* :func:`make_budget_experiment` -- a small GEMM with one of Warp's counting rules switched on (a
  never-taken branch, a constant-trip loop, ``enable_backward``); :func:`make_oversized_kernel` -- one
  shared tile bigger than an H200 block may have.
* :func:`validated_kernel`, :func:`oversized_launch_demo` -- the forward's build-and-canary cache, and an
  over-budget launch on a GPU.
* :func:`budget_figure`, :func:`explore_config`, :func:`format_summary` -- the pictures and the widget.

Every kernel here is built with ``enable_mathdx_gemm=False`` (the scalar tile GEMM: it compiles in about a
second, and reserves the same shared memory): these cells teach resource budgets, not speed.
"""

from __future__ import annotations

import functools
import math
import time
import warnings
from typing import Dict, Optional, Sequence, Tuple

import plotly.graph_objects as go
import torch

from fovi_lab.kernels.common import init_warp, nan_canary, wp
from fovi_lab.kernels.experiments import (BLOCK_DIM_CHOICES, R_CHOICES, TILE_CHOICES, check_config,  # noqa: F401
                                          make_budget_experiment, make_oversized_kernel)  # (re-exported)
import fovi_lab.lab.figure_layout as figure_layout

__all__ = [
    "GPU_LIMITS", "CUDA_DEFAULT_SMEM", "CPU_TILE_ARENA_BYTES", "TILE_CHOICES", "R_CHOICES",
    "BLOCK_DIM_CHOICES", "BUDGET_CONFIGS",
    "estimate_smem", "warp_smem_bytes", "warp_smem_bytes_aot", "gather_config", "gather_kernel",
    "make_budget_experiment", "make_oversized_kernel", "canary_check", "oversized_launch_demo",
    "validated_kernel", "budget_figure", "budget_table", "tile_text", "limits_table", "explore_config", "format_summary",
    "fmt_bytes", "error_class",
]

#: Per-block shared-memory limits the bar chart draws (bytes).
GPU_LIMITS: Dict[str, int] = {
    "CUDA default, no opt-in (48 KiB)": 48 * 1024,
    "sm_89 opt-in (99 KiB)": 101376,
    "H200 sm_90, as Warp 1.19 reported it": 231424,
}
CUDA_DEFAULT_SMEM = 48 * 1024
#: Warp's CPU tile arena per block (``WP_MAX_CPU_SHARED`` in warp/native/tile.h, Warp 1.19).
CPU_TILE_ARENA_BYTES = 256 * 1024


#: Configs drawn by :func:`budget_figure`: (label, tile_m, tile_n, r, enable_backward).
BUDGET_CONFIGS: Tuple[Tuple[str, int, int, int, bool], ...] = (
    ("m16n32", 16, 32, 1, False),
    ("m32n64", 32, 64, 1, False),
    ("m64n64r1", 64, 64, 1, False),
    ("m64n64r2", 64, 64, 2, False),
    ("m64n128r2", 64, 128, 2, False),
    ("m64n64r4", 64, 64, 4, False),
    ("m128n128r2", 128, 128, 2, False),
    ("m128n128r2 + backward", 128, 128, 2, True),
    ("m128n128r4", 128, 128, 4, False),
)

_TILE_K = 64
_F16, _F32, _I32 = 2, 4, 4


def error_class(err: Optional[float]) -> str:
    """A max abs error as a tolerance class (stable text for notebooks), not a raw float."""
    if err is None:
        return "nothing written"
    if err != err:
        return "NaN"
    for tol in (1e-6, 1e-4, 1e-2):
        if err < tol:
            return f"< {tol:g}"
    return "WRONG (>= 0.01)"


def fmt_bytes(n: Optional[int]) -> str:
    """``123456 -> '123456 B (120.6 KiB)'``; ``None -> 'n/a'``."""
    if n is None:
        return "n/a"
    return f"{int(n)} B ({n / 1024:.1f} KiB)"


# --------------------------------------------------------------------------------------------------
# the bytes model
# --------------------------------------------------------------------------------------------------

def estimate_smem(tile_m: int, tile_n: int, r: int = 1, tile_k: int = _TILE_K, *, gather: bool = False,
                  bias: bool = False, unroll: int = 1, enable_backward: bool = False) -> Dict:
    """Estimate the shared memory one block of a tile-GEMM config reserves (bytes). An estimate.

    Counts the tile expressions the kernels of this module (``gather=False``) or the package's
    gather-family forward kernels (``gather=True, bias=True``) declare, as Warp's codegen does:

    * ``a``: ``r`` fp16 A tiles ``tile_m x tile_k`` (one per batch tile sharing the B tile),
    * ``b``: one fp16 B (weight) tile ``tile_k x tile_n``,
    * ``acc``: ``r`` fp32 accumulators ``tile_m x tile_n``,
    * ``index``: with ``gather``, two int32 index tiles of ``tile_k`` entries,
    * ``bias``: with ``bias``, one fp32 tile of ``tile_n``.

    ``unroll`` multiplies the loop-body tiles (a, b, index): a constant-trip loop of <= 16 trips is
    unrolled and each copy reserves again. ``enable_backward`` adds the adjoint kernel's request
    (``backward`` = twice the forward's own tiles); the forward launch's request is unchanged.
    Alignment padding and MathDx scratch are not counted; compare with :func:`warp_smem_bytes`.
    """
    for name, v in (("tile_m", tile_m), ("tile_n", tile_n), ("r", r), ("tile_k", tile_k), ("unroll", unroll)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name}: expected a positive integer, got {v!r}")
    u = int(unroll)
    parts = {
        "a": u * r * tile_m * tile_k * _F16,
        "b": u * tile_k * tile_n * _F16,
        "acc": r * tile_m * tile_n * _F32,
        "index": u * 2 * tile_k * _I32 if gather else 0,
        "bias": tile_n * _F32 if bias else 0,
    }
    forward = sum(parts.values())
    return {
        "tile_m": int(tile_m), "tile_n": int(tile_n), "r": int(r), "tile_k": int(tile_k), "unroll": u,
        "parts": parts, "forward": forward, "backward": 2 * forward if enable_backward else 0,
        "enable_backward": bool(enable_backward),
    }


def _fits(nbytes: int) -> Dict[str, bool]:
    return {name: nbytes <= limit for name, limit in GPU_LIMITS.items()}


# --------------------------------------------------------------------------------------------------
# kernels: the production gather kernel, and one small experiment kernel for Warp's counting rules
# --------------------------------------------------------------------------------------------------

def gather_config(tile_m: int, tile_n: int, r: int = 1, block_dim: int = 64):
    """The :class:`~fovi_lab.kernels.forward.FwdConfig` of the production gather kernel with these tiles
    (registered or not: the forward's build cache takes either)."""
    from fovi_lab.kernels import forward as F
    check_config(tile_m, tile_n, r, block_dim)
    return F.FwdConfig(f"lab_m{tile_m}n{tile_n}r{r}b{block_dim}", "gather", tile_m, tile_n, _TILE_K, r, block_dim)


def gather_kernel(tile_m: int, tile_n: int, r: int = 1, block_dim: int = 64):
    """The production gather-family forward kernel (:func:`fovi_lab.kernels.forward.make_gather_kernel`) for
    these tiles, built with the scalar tile GEMM (``mathdx=False``: it compiles in about a second; the shared
    memory it reserves is the same)."""
    from fovi_lab.kernels import forward as F
    return F.build_kernel(gather_config(tile_m, tile_n, r, block_dim), mathdx=False)


@functools.lru_cache(maxsize=None)
def warp_smem_bytes(kernel, device: str = "cpu", backward: bool = False) -> Optional[int]:
    """Warp's own count of the dynamic shared memory ``kernel``'s forward launch requests (bytes).

    ``backward=True`` reads the adjoint kernel's request instead (``None`` unless the kernel was built
    with ``enable_backward=True``).

    Builds (or loads from Warp's kernel cache) the kernel's module on ``device`` and reads the
    ``<kernel>_cuda_kernel_forward_smem_bytes`` entry Warp's codegen writes into the module metadata:
    the number a CUDA launch asks the driver for. The CPU build writes the same entry, so no GPU is
    needed. Uses Warp internals (``ModuleExec.meta``): returns ``None`` if they are not there.
    """
    init_warp()
    try:
        exec_ = kernel.module.load(device)
        meta = getattr(exec_, "meta", None) or {}
        which = "backward" if backward else "forward"
        entries = {k: v for k, v in meta.items() if k.endswith(f"_{which}_smem_bytes")}
        key = kernel.get_mangled_name() + f"_cuda_kernel_{which}_smem_bytes"
        if key in entries:
            return int(entries[key])
        if len(entries) == 1:  # module="unique": one kernel per module
            return int(next(iter(entries.values())))
    except Exception:
        return None
    return None


def warp_smem_bytes_aot(kernel, arch: int = 90) -> Optional[int]:
    """Warp's count for a CUDA build of ``kernel`` for ``sm_{arch}``, compiled here without a GPU.

    Ahead-of-time compiles the kernel's module with Warp's bundled NVRTC into a temporary folder and
    reads the same metadata entry as :func:`warp_smem_bytes` (about a second per kernel without MathDx).
    """
    import json
    import os
    import tempfile

    init_warp()
    with tempfile.TemporaryDirectory() as d:
        try:
            wp.compile_aot_module(kernel.module, arch=int(arch), module_dir=d)
        except Exception:
            return None
        for f in sorted(os.listdir(d)):
            if f.endswith(".meta"):
                with open(os.path.join(d, f)) as fh:
                    meta = json.load(fh)
                vals = [v for k, v in meta.items() if k.endswith("_forward_smem_bytes")]
                if len(vals) == 1:
                    return int(vals[0])
    return None


# --------------------------------------------------------------------------------------------------
# the canary on the production kernel, and the production cache
# --------------------------------------------------------------------------------------------------

def canary_check(tile_m: int, tile_n: int, r: int = 1, block_dim: int = 64, device: str = "cpu",
                 launch: bool = True, prefill: float = float("nan")) -> Dict:
    """Run the production gather kernel's plan on a small layer into a ``prefill``-ed output, report it.

    The problem (the synthetic ``ODD`` layer, ``B = 2 * tile_m * r``, ``Cout = 2 * tile_n``) has two batch-tile
    groups and two output-channel tiles per node. ``launch=False`` stands in for a launch that returns
    without writing (what Warp < 1.15 did with an over-budget launch): the output is left as prefilled.
    With ``prefill = nan`` (the default) the check is :func:`fovi_lab.kernels.common.nan_canary`; with a
    finite prefill it is the tempting shortcut, ``isfinite`` of an output prefilled with that value.

    Returns ``{"ok", "why", "untouched", "elements", "max_err", "compile_s", "run_s"}``: ``untouched`` =
    output elements still equal to the prefill, ``max_err`` = max abs error of the whole output against the
    fp32 oracle (None if nothing was written).
    """
    from fovi_lab.kernels import forward as F
    from fovi_lab.lab.problems import make_problem
    from fovi_lab.ops.reference import oracle_forward
    init_warp()
    cfg = gather_config(tile_m, tile_n, r, block_dim)
    t0 = time.perf_counter()
    kernel = gather_kernel(tile_m, tile_n, r, block_dim)
    kernel.module.load(wp.get_device(device), block_dim)
    compile_s = time.perf_counter() - t0
    pb = make_problem("ODD", 2 * tile_m * r, cout=2 * tile_n, seed=0, device=device)
    plan = F.plan_uncached(cfg, kernel, pb.x, pb.weight, pb.bias, pb.meta.input_linear, pb.meta.weight_linear,
                           store="staged")
    run = plan.launch if launch else (lambda: None)
    t1 = time.perf_counter()
    if math.isnan(prefill):
        ok, why = nan_canary(run, plan.out)
    else:
        plan.out.fill_(prefill)
        run()
        wp.synchronize_device(device)
        ok = bool(torch.isfinite(plan.out).all())
        why = "ok" if ok else "non-finite output"
    run_s = time.perf_counter() - t1
    out = plan.out.double().cpu()
    untouched = int(torch.isnan(out).sum()) if math.isnan(prefill) else int((out == prefill).sum())
    written = untouched < out.numel() or not math.isnan(prefill)
    max_err = None
    if written:
        ref = oracle_forward(pb.x.float().cpu(), pb.weight.float().cpu(), pb.bias.float().cpu(), pb.meta.idx.cpu(),
                             pb.meta.rf_index.cpu(), pb.meta.v)
        max_err = float((plan.finish().float().cpu() - ref).abs().max())
    return {"ok": ok, "why": why, "untouched": untouched, "elements": out.numel(), "max_err": max_err,
            "compile_s": compile_s, "run_s": run_s}


def oversized_launch_demo(device: str, rows: int = 256, cols: int = 256, block_dim: int = 256) -> Dict:
    """Launch :func:`make_oversized_kernel` on a CUDA ``device`` into a NaN-prefilled output.

    Returns ``{"raised", "error", "first_line", "output_all_nan", "requested_bytes"}``. Meant for a GPU;
    refuses the CPU (a tile over the CPU arena ends the process instead of raising).
    """
    if not str(device).startswith("cuda"):
        raise ValueError("device: oversized_launch_demo needs a CUDA device; on the CPU an over-arena tile "
                         "ends the process instead of raising")
    init_warp()
    kernel = make_oversized_kernel(rows, cols, block_dim)
    x = torch.ones(rows, cols, dtype=torch.float32, device=device)
    y = torch.full((rows, cols), float("nan"), dtype=torch.float32, device=device)
    raised, error, first = False, None, ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            wp.launch_tiled(kernel, dim=(1,), inputs=[wp.from_torch(x), wp.from_torch(y)], block_dim=block_dim,
                            device=device)
            wp.synchronize_device(device)
        except RuntimeError as exc:
            raised, error = True, type(exc).__name__
            first = str(exc).strip().splitlines()[0]
    torch.cuda.synchronize()
    return {"raised": raised, "error": error, "first_line": first,
            "output_all_nan": bool(torch.isnan(y).all()), "requested_bytes": rows * cols * 4}


def validated_kernel(tile_m: int, tile_n: int, r: int = 1, block_dim: int = 64, device: str = "cpu"):
    """``(built, cached_before)``: the production gather kernel for these tiles from the forward's one
    build-and-canary cache (:func:`fovi_lab.kernels.forward.get_config`, scalar tile GEMM), and whether that
    cache had its verdict already. ``built`` is None when the canary refused it (the cache warns once why)."""
    from fovi_lab.kernels import forward as F
    cfg = gather_config(tile_m, tile_n, r, block_dim)
    cached = F.VALIDATED.has(F.cache_key(cfg, False), device)
    return F.get_config(cfg, device, mathdx=False), cached


# --------------------------------------------------------------------------------------------------
# figures and the widget callback
# --------------------------------------------------------------------------------------------------

_PART_COLOURS = {"a": "#1f77b4", "b": "#ff7f0e", "acc": "#2ca02c", "index": "#9467bd", "bias": "#8c564b",
                 "backward": "#d62728"}
_PART_NAMES = {"a": "A tiles (fp16, r of them)", "b": "B tile (fp16)", "acc": "accumulators (fp32, r of them)",
               "index": "index tiles (int32)", "bias": "bias tile (fp32)",
               "backward": "adjoint kernel (enable_backward)"}
_LIMIT_STYLES = ("dot", "dash", "solid")


def tile_text(tile_m: int, tile_n: int, r: int, enable_backward: bool = False, sep: str = ", ") -> str:
    """A gather tile config in words, its phrases joined by ``sep``: ``64 rows x 64 channels, r = 2``."""
    return sep.join([f"{tile_m} rows x {tile_n} channels", f"r = {r}"]
                    + (["+ its adjoint (enable_backward)"] if enable_backward else []))


def _tile_words(tile_m: int, tile_n: int, r: int, enable_backward: bool) -> str:
    """A gather tile config on a figure's axis: :func:`tile_text`, one phrase a line."""
    return tile_text(tile_m, tile_n, r, enable_backward, sep="<br>")


def budget_figure(configs: Sequence[Tuple[str, int, int, int, bool]] = BUDGET_CONFIGS, gather: bool = True,
                  highlight: Optional[str] = None, height: int = 480,
                  title: str = "Estimated shared memory per block (bytes) vs per-block limits",
                  message: Optional[str] = None) -> go.Figure:
    """Stacked bars of :func:`estimate_smem` per config against the per-block limits (horizontal lines); ``title``
    with ``message`` under it, the legend between them and the plot.

    A config with ``enable_backward`` shows the adjoint kernel's request as its bar (2x own tiles).
    """
    keys = [c[0] for c in configs]
    labels = [_tile_words(tm, tn, r, eb) + ("<br>(yours)" if key.endswith("(yours)") else "")
              for key, tm, tn, r, eb in configs]
    ests = [estimate_smem(tm, tn, r, gather=gather, bias=gather, enable_backward=eb) for _, tm, tn, r, eb in configs]
    fig = go.Figure()
    for part in ("a", "b", "acc", "index", "bias"):
        ys = [0 if e["enable_backward"] else e["parts"][part] for e in ests]
        if any(ys):
            fig.add_bar(x=labels, y=ys, name=_PART_NAMES[part], marker_color=_PART_COLOURS[part])
    if any(e["enable_backward"] for e in ests):
        fig.add_bar(x=labels, y=[e["backward"] if e["enable_backward"] else 0 for e in ests],
                    name=_PART_NAMES["backward"], marker_color=_PART_COLOURS["backward"], opacity=0.6)
    for (name, limit), dash in zip(GPU_LIMITS.items(), _LIMIT_STYLES):
        fig.add_hline(y=limit, line_dash=dash, line_color="black", line_width=1,
                      annotation_text=f"{name}: {limit} B", annotation_position="top left",
                      annotation_font_size=10)
    if highlight is not None and highlight in keys:
        i = keys.index(highlight)
        e = ests[i]
        fig.add_annotation(x=labels[i], y=e["backward"] or e["forward"], text="your config", showarrow=True,
                           arrowhead=2, ay=-30)
    fig.update_layout(barmode="stack", margin=dict(l=60, r=20, b=60), yaxis_title="shared memory per block (bytes)",
                      xaxis_title="gather tile and weight reuse r")
    figure_layout.headed(fig, height, title, message)
    return fig


def limits_table() -> str:
    """The per-block shared-memory limits :func:`budget_figure` draws, plus Warp's CPU tile arena: one line
    each, in bytes and KiB (deterministic text for a compared notebook cell)."""
    rows = list(GPU_LIMITS.items()) + [("Warp's CPU tile arena (WP_MAX_CPU_SHARED)", CPU_TILE_ARENA_BYTES)]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'per-block limit':<{width}}  {'bytes':>7}  {'KiB':>6}"]
    lines += [f"{name:<{width}}  {limit:>7}  {limit / 1024:>6.1f}" for name, limit in rows]
    return "\n".join(lines)


def budget_table(configs: Sequence[Tuple[str, int, int, int, bool]] = BUDGET_CONFIGS, gather: bool = True) -> str:
    """The bars of :func:`budget_figure` as text: per config, the estimated request in bytes and KiB (the
    adjoint kernel's for an ``enable_backward`` row) and the limits of :data:`GPU_LIMITS` it fits."""
    words = [tile_text(tm, tn, r, eb) for _, tm, tn, r, eb in configs]
    width = max(len(w) for w in words)
    short = {name: name.split(",")[0].split(" (")[0] for name in GPU_LIMITS}
    lines = [f"{'tiles':<{width}}  {'bytes':>7}  {'KiB':>6}  fits"]
    for text, (_, tm, tn, r, eb) in zip(words, configs):
        e = estimate_smem(tm, tn, r, gather=gather, bias=gather, enable_backward=eb)
        nbytes = e["backward"] if eb else e["forward"]
        fits = [short[name] for name, ok in _fits(nbytes).items() if ok]
        lines.append(f"{text:<{width}}  {nbytes:>7}  {nbytes / 1024:>6.1f}  {', '.join(fits) or 'no GPU'}")
    return "\n".join(lines)


def format_summary(summary: Dict, timings: bool = True) -> str:
    """Text for a summary dict of :func:`explore_config`; deterministic with ``timings=False``."""
    if "message" in summary:
        return summary["message"]
    lines = [
        f"tiles                 {tile_text(summary['tile_m'], summary['tile_n'], summary['r'])}, "
        f"block_dim {summary['block_dim']}",
        f"estimate (forward)    {fmt_bytes(summary['estimate'])}",
        f"Warp's own count      {fmt_bytes(summary['warp_count'])}",
    ]
    for name, ok in summary["fits"].items():
        lines.append(f"  {'fits ' if ok else 'OVER '} {name} ({GPU_LIMITS[name]} B)")
    lines.append(f"canary on this device: {summary['verdict']}")
    if not timings:
        return "\n".join(lines)
    if summary.get("compile_s") is not None:
        lines.append(f"build/load {summary['compile_s']:.2f} s")
    if summary.get("run_s") is not None:
        lines.append(f"canary launch {summary['run_s'] * 1e3:.1f} ms")
    return "\n".join(lines)


def explore_config(tile_m: int, tile_n: int, r: int, block_dim: int, device: str = "cpu",
                   run_canary: bool = True) -> Tuple[Dict, go.Figure]:
    """The widget callback: ``(tile_m, tile_n, r, block_dim) -> (summary, figure)``; never raises.

    The summary holds the estimate, Warp's own count, which limits it fits, and (``run_canary``) the
    canary verdict on ``device``. On the CPU a config whose count exceeds the 256 KiB CPU tile arena is
    not launched (it would end the process). An invalid choice returns ``{"message": ...}`` and a
    figure that says so.
    """
    try:
        tile_m, tile_n, r, block_dim = int(tile_m), int(tile_n), int(r), int(block_dim)
        check_config(tile_m, tile_n, r, block_dim)
    except (TypeError, ValueError) as exc:
        msg = f"Invalid choice: {exc}"
        fig = go.Figure()
        fig.add_annotation(text=msg, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_layout(height=200, xaxis_visible=False, yaxis_visible=False)
        return {"message": msg}, fig
    label = f"m{tile_m}n{tile_n}r{r} (yours)"
    est = estimate_smem(tile_m, tile_n, r, gather=True, bias=True)
    summary = {"tile_m": tile_m, "tile_n": tile_n, "r": r, "block_dim": block_dim, "estimate": est["forward"],
               "device_kind": "CPU" if device == "cpu" else "GPU", "compile_s": None, "run_s": None}
    t0 = time.perf_counter()
    try:
        count = warp_smem_bytes(gather_kernel(tile_m, tile_n, r, block_dim), device)
        summary["compile_s"] = time.perf_counter() - t0
    except Exception as exc:  # a compile error is a verdict too
        count = None
        summary["verdict"] = f"build failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        run_canary = False
    summary["warp_count"] = count
    nbytes = count if count is not None else est["forward"]
    summary["fits"] = _fits(nbytes)
    if run_canary:
        if device == "cpu" and nbytes > CPU_TILE_ARENA_BYTES:
            summary["verdict"] = (f"not launched: {nbytes} B is over Warp's {CPU_TILE_ARENA_BYTES} B CPU tile "
                                  "arena, where a launch ends the process instead of raising")
        else:
            res = canary_check(tile_m, tile_n, r, block_dim, device)
            summary["run_s"] = res["run_s"]
            if res["ok"]:
                summary["verdict"] = "launched and wrote every output element (canary passed)"
            else:
                summary["verdict"] = f"FAILED: {res['why']}"
    elif "verdict" not in summary:
        summary["verdict"] = "not run"
    configs = [c for c in BUDGET_CONFIGS if not c[4]] + [(label, tile_m, tile_n, r, False)]
    fig = budget_figure(configs, gather=True, highlight=label, height=440,
                        title=f"{tile_text(tile_m, tile_n, r)}: estimated {est['forward']} B per block",
                        message="the production gather kernel, against the per-block limits")
    return summary, fig
