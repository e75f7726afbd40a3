"""The forward widget's callbacks: rerun a production forward kernel on the current device, check it,
time compile and run apart (sizes clamped on the CPU so a run takes seconds), and log the run.

An invalid or unlaunchable choice returns ``ok=False`` and a message; nothing here raises for a widget value.
"""

from __future__ import annotations

import math
import time
import warnings
from typing import List, Optional, Sequence, Tuple

import plotly.graph_objects as go
import torch

import fovi_lab.lab.figure_layout as figure_layout
from fovi_lab.lab.common import readable_log_axes
from fovi_lab.lab.common import (CPU_WORK_BUDGET, FORWARD_CHOICES, RunLog, COLOURS, result_answer,
                                 check_explore_args, clamp_shape, fail_result, round4, sync_device, time_ms,
                                 default_device, message_figure, parity_line, rel_error, widget_device)
from fovi_lab.lab.labels import kernel_label, short_label, tick_label
from fovi_lab.lab.problems import make_meta, make_problem, reference_forward
from fovi_lab.lab.traffic import shape_of, tile_smem_estimate, tile_traffic


def registered_forward_config(kernel: str, tile_m: int, tile_n: int, r: int, block_dim: int) -> Optional[str]:
    """The name :mod:`fovi_lab.kernels.forward.api` registers for these tiles (gather family for ``"uncached"``,
    ``c_*`` for ``"cached"``), or None when the combination is not registered."""
    from fovi_lab.kernels import forward as F
    cached = kernel == "cached"
    variant = "cached" if cached else "gather"
    names = F.cached_config_names() if cached else F.uncached_config_names("gather")
    for name in names:
        c = F.config_spec(name)
        if (c.variant, c.tile_m, c.tile_n, c.r, c.block_dim) == (variant, tile_m, tile_n, r, block_dim):
            return name
    return None


def _derived_id(kernel: str, tile_m: int, tile_n: int, r: int = 1, block_dim: int = 128) -> str:
    """The id the tile families derive for the widget's tiles (what the labels read)."""
    return (("c_" if kernel == "cached" else "") + f"m{tile_m}n{tile_n}" + (f"r{r}" if r != 1 else "")
            + (f"b{block_dim}" if block_dim != 128 else ""))


def tiles_label(kernel: str, tile_m: int, tile_n: int, r: int = 1, block_dim: int = 128) -> str:
    """The widget's tiles in words (:func:`~fovi_lab.lab.labels.kernel_label` of the id they derive), also for tiles no
    family has (the canary's oversized ones): ``tile GEMM over gathered rows, 32 rows x 64 channels per tile``."""
    cached = kernel == "cached"
    derived = _derived_id(kernel, tile_m, tile_n, r, block_dim)
    words = kernel_label(derived)
    if words != derived:
        return words
    return (f"{'cached' if cached else 'gather'} tiles of {tile_m} rows x {tile_n} channels"
            + (f", {r} batch tiles share each weight tile" if r != 1 else "") + f", {block_dim} threads per block")


def _forward_kernel(kernel: str, tile_m: int, tile_n: int, r: int, block_dim: int, device: str):
    """``(name, config, kernel, ok, why, built_now)`` of the widget's tiles on ``device``.

    Every kernel goes through the package's one build-and-canary cache
    (:func:`fovi_lab.kernels.forward.get_config`): registered tiles by name, other tiles as an unregistered
    :class:`~fovi_lab.kernels.forward.FwdConfig` of the same family.
    """
    from fovi_lab.kernels import forward as F
    name = registered_forward_config(kernel, tile_m, tile_n, r, block_dim)
    if name is None:
        cached = kernel == "cached"
        variant = "cached" if cached else "gather"
        lab_name = (f"lab_c_m{tile_m}n{tile_n}b{block_dim}" if cached
                    else f"lab_m{tile_m}n{tile_n}r{r}b{block_dim}")
        target = F.FwdConfig(lab_name, variant, tile_m, tile_n, 64, r, block_dim)
    else:
        target = name
    key = F.cache_key(target, F.mathdx_default())
    built_now = not F.VALIDATED.has(key, device)
    with warnings.catch_warnings():          # the widget reports why a config cannot launch in its message
        warnings.simplefilter("ignore", RuntimeWarning)
        built = F.get_config(target, device)
    why = "ok" if built is not None else F.VALIDATED.why(key, device)
    cfg = built.config if built is not None else (F.config_spec(name) if name else target)
    return cfg.name, cfg, (built.kernel if built is not None else None), built is not None, why, built_now


def explore_forward(layer: str = "res18_layer1", batch: int = 64, cout: Optional[int] = None,
                    tile_m: int = 32, tile_n: int = 64, r: int = 1, block_dim: int = 128,
                    kernel: str = "uncached", rf: Optional[str] = None, device: Optional[str] = None,
                    log: Optional[RunLog] = None, budget: float = CPU_WORK_BUDGET,
                    seed: int = 0) -> Tuple[dict, go.Figure]:
    """Run the real forward kernel with these tiles on ``layer`` and check it against the reference.

    Args:
        layer: a :data:`LAYER_CHOICES` name. batch, cout: B and Cout (None: the layer's Cout).
        tile_m, tile_n, r, block_dim: the kernel's compile-time tiles (see :data:`FORWARD_CHOICES`);
            ``r`` batch tiles share each gathered weight tile (the uncached kernel only).
        kernel: ``"uncached"`` (the gather kernel, per-call weight gather) or ``"cached"`` (plain loads
            from the inference cache ``Weff``).
        device: ``"cpu"`` / ``"cuda:0"`` (default: :func:`default_device`). On the CPU the batch and
            then the output nodes are clamped so one launch is at most ``budget`` FLOPs of tile work
            (the result's ``clamp`` says so).
        log: a :class:`RunLog`; a successful run is appended and the returned figure shows every run.

    Returns:
        ``(result, figure)``. ``result`` always has ``ok``, ``passed`` and ``message``; after a run also
        ``config`` (the registered name or ``lab_*``), ``words`` (the tiles in words), ``registered``, ``batch``,
        ``nodes``, ``clamp``, ``err`` (max error over max(1, max|ref|)), ``tolerance``, ``parity`` (a PASS/FAIL line),
        ``reference``, ``compile_s``, ``run_ms`` (kernel alone), ``torch_ms``, ``torch_name``,
        ``gflops`` (useful FLOPs / kernel time) and the traffic model of the call. Invalid or
        unlaunchable choices give ``ok=False`` and a message, never an exception.
    """
    from fovi_lab.kernels import forward as F
    from fovi_lab.ops.reference import CompactTorchOps, build_effective_weight
    result = {"ok": False, "passed": False, "layer": layer, "batch_requested": batch, "cout_requested": cout,
              "tile_m": tile_m, "tile_n": tile_n, "r": r, "block_dim": block_dim, "kernel": kernel}
    problem = check_explore_args(layer, batch, cout, rf)
    for key, val in (("tile_m", tile_m), ("tile_n", tile_n), ("r", r), ("block_dim", block_dim), ("kernel", kernel)):
        if problem is None and (val not in FORWARD_CHOICES[key] or isinstance(val, bool)):
            problem = f"{key} must be one of {FORWARD_CHOICES[key]}, got {val!r}"
    if problem is None and kernel == "cached" and r != 1:
        problem = "the cached kernel has no weight-reuse loop: use r = 1 with kernel='cached'"
    if problem is not None:
        return fail_result(result, log, problem)
    try:
        dev = widget_device(device, F.device_str)
        shape = shape_of(make_meta(layer, cout, rf))
        cached = kernel == "cached"
        smem = tile_smem_estimate(tile_m, tile_n, r, cached=cached)
        limit = _tile_memory_limit(dev)
        if smem > limit:
            return fail_result(result, log, (f"unlaunchable: {tiles_label(kernel, tile_m, tile_n, r, block_dim)} needs at "
                                             f"least {smem // 1024} KiB of tile memory per CTA, over this device's "
                                             f"{limit // 1024} KiB (not compiled; pick smaller tiles or a smaller r)"))
        b, nodes, note = forward_clamp(shape, batch, tile_m, tile_n, dev, budget, cached=cached)
        pb = make_problem(layer, b, cout, rf, seed=seed, device="cpu" if dev == "cpu" else dev, nodes=nodes)
        meta = pb.meta
        t0 = time.perf_counter()
        name, cfg, kern, ok, why, built_now = _forward_kernel(kernel, tile_m, tile_n, r, block_dim, dev)
        compile_s = time.perf_counter() - t0 if built_now else 0.0
        words = tiles_label(kernel, tile_m, tile_n, r, block_dim)
        result.update(config=name, registered=not name.startswith("lab_"), compile_s=compile_s, words=words)
        if not ok:
            return fail_result(result, log, f"unlaunchable on this device: {words} ({why})")
        if cached:
            weff = build_effective_weight(meta, pb.weight, cout_multiple=math.lcm(64, tile_n))
            plan = F.plan_cached(cfg, kern, pb.x, weff, pb.bias, meta.input_linear, meta.cout, "staged")
        else:
            plan = F.plan_uncached(cfg, kern, pb.x, pb.weight, pb.bias, meta.input_linear, meta.weight_linear,
                                    "staged")
        plan.launch()
        y = plan.finish()
        sync_device(dev)
        ref, ref_name = reference_forward(meta, pb.x, pb.weight, pb.bias)
        err = rel_error(y, ref)
        tol = 1e-2
        run_ms = time_ms(plan.launch, dev)
        xf = pb.x if dev != "cpu" else pb.x.float()
        wf = pb.weight if dev != "cpu" else pb.weight.float()
        bf = None if pb.bias is None else (pb.bias if dev != "cpu" else pb.bias.float())
        torch_ms = time_ms(lambda: CompactTorchOps.forward(meta, xf, wf, bf), dev)
        traffic = tile_traffic(shape_of(meta), b, tile_m, tile_n, r, cached)
        label = f"{layer} B={b} {short_label(_derived_id(kernel, tile_m, tile_n, r, block_dim))}"
        what = f"{words}, on {layer} (B={b}, Cout={meta.cout})"
        result.update(
            ok=True, passed=err <= tol, batch=b, nodes=meta.nout, cout=meta.cout, clamp=note, err=err,
            tolerance=tol, parity=parity_line(what + f" vs the {ref_name}", err, tol), reference=ref_name,
            run_ms=run_ms, torch_ms=torch_ms,
            torch_name="torch_compact (fp32 on the CPU)" if dev == "cpu" else "torch_compact (fp16)",
            gflops=traffic["flops"] / (run_ms * 1e6), ctas=traffic["ctas"], smem_estimate=smem,
            w_bytes=traffic["w_bytes"], a_bytes=traffic["a_bytes"], padded_flops=traffic["padded_flops"],
            label=label, device=dev,
        )
        result["fill"] = reuse_fill(b, tile_m, r)
        result["message"] = result["parity"] + (f"  [{note}]" if note else "")
        return result_answer(result, log)
    except Exception as exc:  # noqa: BLE001 - the widget must answer with a message
        return fail_result(result, log, f"could not run: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")


def forward_clamp(shape: dict, batch: int, tile_m: int, tile_n: int, device: str, budget: float = CPU_WORK_BUDGET,
                  cached: bool = False) -> Tuple[int, Optional[int], Optional[str]]:
    """``(batch, nodes or None, note)`` the forward widget runs on ``device`` (:func:`clamp_shape`): on the CPU the
    batch, then the output nodes, shrink until one launch is at most ``budget`` FLOPs of tile work.

    It takes no ``r``: the tile work counts the batch sub-tiles that run (a CTA skips those past the batch), which
    ``r`` does not change, and the batch stops shrinking at one sub-tile of ``tile_m`` rows. So every ``r`` runs the
    same problem and their weight streams compare like with like."""
    def work(bb, nn):
        return tile_traffic(dict(shape, nout=nn), bb, tile_m, tile_n, 1, cached)["padded_flops"]
    return clamp_shape(shape, batch, work, device, budget, tile_rows=tile_m)


def reuse_fill(batch: int, tile_m: int, r: int) -> Optional[str]:
    """A line when a CTA's ``r`` batch tiles of ``tile_m`` rows are not all inside the batch (a batch smaller than
    ``tile_m * r``): the weight stream is then that of the smaller ``r`` the batch fills; else None."""
    used = -(-int(batch) // int(tile_m))
    if r <= 1 or used >= r:
        return None
    return (f"B = {batch} fills {used} of the {r} batch tiles of {tile_m} rows each CTA owns: r = {r} streams the "
            f"weights as r = {used} does")


def run_checked(problem, config: str):
    """Run the production plan of forward ``config`` once on ``problem`` (a :class:`~fovi_lab.lab.Problem`) into a
    NaN-prefilled output (every entry must be written): ``(y, plan, ms, relative error, reference name)``,
    against :func:`~fovi_lab.lab.reference_forward`; ``ms`` is the wall time of the launch and finish."""
    from fovi_lab.kernels import forward as F
    m = problem.meta
    ref, ref_name = reference_forward(m, problem.x, problem.weight, problem.bias)
    plan = F.prepare_uncached(problem.x, problem.weight, problem.bias, m.input_linear, m.weight_linear, config=config)
    plan.out.fill_(float("nan"))
    t0 = time.perf_counter()
    plan.launch()
    y = plan.finish()
    ms = (time.perf_counter() - t0) * 1e3
    return y, plan, ms, rel_error(y.float().cpu(), ref.cpu()), ref_name


def _tile_memory_limit(device: str) -> int:
    """Tile memory a CTA may reserve: Warp's 256 KiB CPU arena, or the GPU's opt-in shared memory."""
    if str(device).startswith("cuda"):
        try:
            props = torch.cuda.get_device_properties(torch.device(device))
            return int(getattr(props, "shared_memory_per_block_optin", 0) or 227 * 1024)
        except Exception:  # noqa: BLE001
            return 227 * 1024
    return 256 * 1024


def reuse_live(layer: str = "res18_layer1", batch: int = 64, tile_m: int = 32, tile_n: int = 64,
               rs: Sequence[int] = (1, 2, 4), block_dim: int = 128, device: Optional[str] = None,
               budget: float = CPU_WORK_BUDGET) -> List[dict]:
    """Run the uncached kernel with ``r`` = each of ``rs`` (same tiles otherwise) on one shape:
    every run's :func:`explore_forward` result, plus ``rel_time`` = its kernel time over r=1's.

    The runs are compared on one shape only: the CPU's ``budget`` clamps every ``r`` alike (:func:`forward_clamp`),
    and should the runs still differ in shape, ValueError says which budget the batch needs."""
    out = []
    for r in rs:
        res, _ = explore_forward(layer, batch, None, tile_m, tile_n, r, block_dim, "uncached", device=device,
                                 budget=budget)
        out.append(res)
    shapes = {(x.get("batch"), x.get("nodes")) for x in out if x.get("ok")}
    if len(shapes) > 1:
        raise ValueError(f"budget: {budget / 1e9:.1f} GFLOP clamps the runs to different shapes "
                         f"({sorted(shapes, key=str)}); give a budget that holds B = {batch} for every r, or a "
                         f"smaller batch")
    base = next((x.get("run_ms") for x in out if x.get("r") == rs[0] and x.get("ok")), None)
    for x in out:
        x["rel_time"] = (x["run_ms"] / base) if (base and x.get("ok")) else None
    return out


def reuse_live_figure(rows: List[dict], height: int = 420) -> go.Figure:
    """Kernel time relative to r=1 and the modelled weight-stream bytes relative to r=1, per r; the legend between
    the title and the plot."""
    ok = [x for x in rows if x.get("ok")]
    if not ok:
        return message_figure("no successful run to plot")
    base_w = ok[0]["w_bytes"]
    labels = [f"r = {x['r']}<br>{tick_label(x['config'], title=False)}" for x in ok]
    fig = go.Figure()
    fig.add_trace(go.Bar(x=labels, y=[round4(x["rel_time"]) for x in ok], name="measured kernel time / r=1",
                         marker_color=COLOURS["warp"]))
    fig.add_trace(go.Bar(x=labels, y=[round4(x["w_bytes"] / base_w) for x in ok], name="modelled weight stream / r=1",
                         marker_color=COLOURS["grey"]))
    dev = ok[0].get("device", "cpu")
    fig.update_layout(barmode="group", margin=dict(l=10, r=10, b=10), yaxis_title="relative to r = 1 (×)",
                      xaxis_title="weight reuse r and tile")
    fig.add_hline(y=1.0, line=dict(color="black", width=1, dash="dot"))
    figure_layout.headed(fig, height, f"{ok[0]['layer']}, B={ok[0]['batch']}, measured here on "
                                      f"{'the GPU' if str(dev).startswith('cuda') else 'the CPU (relative only)'}")
    return fig


def benchmark_forward(layers: Sequence[str] = ("res18_layer1", "alex_L1"), batch: int = 64,
                      device: Optional[str] = None, reps: int = 20) -> Tuple[List[dict], go.Figure]:
    """Time the Warp forward (heuristic config, whole op and kernel alone), Warp's dense tile-GEMM
    ceiling for that config, the Warp cached kernel and the PyTorch baselines on ``device``.

    Returns ``(rows, figure)``: one row per (layer, implementation) with ms, TFLOP/s and the max error
    against the fp32 reference; the figure's title carries the device, Warp and torch versions. On a
    GPU every new config is a MathDx compile (~50 s): ``python -m fovi_lab warmup`` fills the cache.
    """
    from fovi_lab.kernels import forward as F
    from fovi_lab.bench.common import env_info
    from fovi_lab.ops.reference import CompactTorchOps, build_effective_weight
    device = device or default_device()
    dev_t = torch.device(device)
    rows: List[dict] = []
    for name in layers:
        pb = make_problem(name, batch, device=device)
        meta = pb.meta
        ref = CompactTorchOps.forward(meta, pb.x.float(), pb.weight.float(), pb.bias.float())
        flops = 2.0 * batch * meta.p64 * meta.cout * meta.nout
        cfg = F.select_config(batch, meta.cout, meta.nout, meta.p64, in_channels=meta.cin,
                                              node_major=True, q=meta.q)

        def add(impl, fn, config=None, check=True):
            try:
                y = fn()
                err = rel_error(y, ref) if check else None
                ms = time_ms(fn, device, budget_s=2.0, max_reps=reps)
                rows.append({"layer": name, "B": batch, "impl": impl, "config": config, "ms": ms,
                             "tflops": flops / (ms * 1e-3) / 1e12, "err": err})
            except Exception as exc:  # noqa: BLE001 - record and go on
                rows.append({"layer": name, "B": batch, "impl": impl, "config": config, "ms": None,
                             "note": f"{type(exc).__name__}: {str(exc)[:200]}"})

        plan = F.prepare_uncached(pb.x, pb.weight, pb.bias, meta.input_linear, meta.weight_linear, config=cfg)
        add("warp_uncached", lambda: F.run_uncached(pb.x, pb.weight, pb.bias, meta.input_linear,
                                                    meta.weight_linear, config=cfg), cfg)
        add("warp_uncached_kernel", plan.launch, cfg, check=False)            # the kernel alone (checked above)
        try:
            dplan = F.make_dense_ceiling(cfg, batch, meta.cout, meta.nout, meta.p64, device)
            add("warp_dense_ceiling", lambda: dplan.launch(), cfg, check=False)
        except Exception as exc:  # noqa: BLE001
            rows.append({"layer": name, "B": batch, "impl": "warp_dense_ceiling", "config": cfg, "ms": None,
                         "note": str(exc)[:200]})
        weff = build_effective_weight(meta, pb.weight, cout_multiple=64)
        add("warp_cached", lambda: F.run_cached(pb.x, weff, pb.bias, meta.input_linear, cout=meta.cout), "default")
        add("torch_compact", lambda: CompactTorchOps.forward(meta, pb.x, pb.weight, pb.bias))
        try:
            from fovi_lab.bench.forward import torch_baselines
            for impl, fn in torch_baselines(meta, pb.weight, build_effective_weight(meta, pb.weight, 8)).items():
                if impl != "torch_compact":
                    add(impl, lambda fn=fn: fn(pb.x, pb.bias))
        except ImportError:
            pass
    env = env_info(dev_t)
    fig = go.Figure()
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    for impl in impls:
        sel = [r for r in rows if r["impl"] == impl]
        fig.add_trace(go.Bar(x=[r["layer"] for r in sel], y=[round4(r.get("ms")) for r in sel], name=impl,
                             hovertext=[r.get("config") or "" for r in sel]))
    fig.update_layout(barmode="group", yaxis_type="log", yaxis_title="time (ms)", xaxis_title="layer",
                      margin=dict(l=10, r=10, b=10))
    figure_layout.headed(fig, 480, f"Forward at B = {batch}, measured here",
                         f"on {env['device']} · Warp {env['warp']} · torch {env['torch']}")
    return rows, readable_log_axes(fig)
