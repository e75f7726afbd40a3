"""The tile-size widget over every kernel family: pick a family and a value for each of its parameters, and the
point is checked (why it cannot run, before anything compiles), built, canary-checked, run on a real layer against
the reference, timed beside PyTorch and placed against its roofline, all live on the current device.

    result, fig = explore_point("tensor_cores", layer="res18_layer1", batch=16, tile_o=48, tile_b=32, k=32,
                                x_layout="transposed")
    family_widget()          # the same, with a dropdown per parameter (JupyterLab)

Parameters left out take the values of the family's point the rules would pick for the call (or its first
registered preset). An invalid or unlaunchable point returns ``ok=False`` and the reasons; nothing here raises for
a widget value.
"""

from __future__ import annotations

import time
import warnings
from typing import Optional, Tuple

import plotly.graph_objects as go
import torch

from fovi_lab.lab.common import (CPU_WORK_BUDGET, RunLog, busy, clamp_shape, default_device, error_words,
                                 fail_result, parity_line, rel_error, result_answer, time_ms)
from fovi_lab.lab.problems import make_meta, make_problem, reference_forward

__all__ = ["explore_point", "start_point", "family_widget"]


def start_point(family_key: str, layer: str = "res18_layer1", batch: int = 16):
    """The point a widget for ``family_key`` starts from: the rules' pick for the call where it belongs to this
    family, else the family's first registered preset."""
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.kernels.families import Problem, lookup, presets
    from fovi_lab.kernels.forward.rules import pick
    fam_key = _family(family_key).key
    meta = layer_meta(layer)
    problem = Problem.of(meta, batch)
    for kw in (dict(), dict(pipe=False), dict(mma=False)):
        pt = lookup(pick(batch, meta.cout, meta.nout, meta.p64, meta.cin, problem.node_major, meta.q, **kw))
        if pt.family == fam_key:
            return pt
    return presets(fam_key, experimental=False)[0].point


def _family(key: str):
    from fovi_lab.kernels.families import family
    try:
        return family(key)
    except KeyError as exc:
        raise ValueError(str(exc).strip("'\"")) from None


def explore_point(family: str = "tensor_cores", layer: str = "res18_layer1", batch: int = 16,
                  device: Optional[str] = None, log: Optional[RunLog] = None, budget: float = CPU_WORK_BUDGET,
                  seed: int = 0, **params) -> Tuple[dict, go.Figure]:
    """Run the point of ``family`` with ``params`` on ``layer`` at ``batch`` and check it against the reference.

    Returns ``(result, figure)``. ``result`` always has ``ok``, ``passed``, ``message`` and ``name`` / ``id`` of the
    point once its values are valid; a point that cannot run says why in ``reasons`` (nothing is compiled). After a
    run: ``err`` (max error over max(1, max|ref|)), ``tolerance``, ``parity``, ``compile_s`` (build + canary, 0 when
    built before), ``run_ms`` (the whole op), ``torch_ms`` (torch_compact on the same device), ``batch``, ``nodes``
    (clamped on the CPU), ``roofline_ms`` (None without peak figures) and ``device``."""
    from fovi_lab.kernels.families import Problem, device_spec
    from fovi_lab.kernels import forward as F
    from fovi_lab.ops.reference import CompactTorchOps
    result = {"ok": False, "passed": False, "family": family, "layer": layer, "batch_requested": batch,
              "params": dict(params), "reasons": []}
    try:
        fam = _family(family)
        if fam.inference_only:
            return fail_result(result, log, f"{fam.title}: inference only, from the cached effective weight; "
                                            f"explore it with fovi_lab.lab.explore_forward(kernel='cached')")
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 512:
            return fail_result(result, log, f"batch must be an integer in [1, 512], got {batch!r}")
        base = start_point(fam.key, layer, batch)
        point = fam.point(**{**base.as_dict(), **params})
    except (ValueError, KeyError) as exc:
        return fail_result(result, log, str(exc).strip("'\""))
    dev = default_device() if device is None else device
    spec = device_spec(dev)
    meta = make_meta(layer)
    problem = Problem.of(meta, batch, layer=layer)
    result.update(name=point.name, device=dev)
    reasons = fam.check(point, problem, spec)
    if not fam.combine_reasons(point):
        result["id"] = point.id
    if reasons:
        result["reasons"] = reasons
        return fail_result(result, log, f"{point.name} cannot run this call: " + "; ".join(reasons))
    try:
        rows, chans = fam.block_shape(point)
        work = lambda bb, nn: 2.0 * (-(-bb // rows) * rows) * meta.p64 * (-(-meta.cout // chans) * chans) * nn  # noqa: E731
        b, nodes, note = clamp_shape(dict(cin=meta.cin, nout=meta.nout, k=meta.k, v=meta.v), batch, work, dev,
                                     budget, tile_rows=rows)
        pb = make_problem(layer, b, seed=seed, device=dev, nodes=nodes)
        m = pb.meta
        key = F.cache_key(point.id, F.mathdx_default())
        built_before = F.VALIDATED.has(key, dev)
        t0 = time.perf_counter()
        with warnings.catch_warnings():          # the result reports why a point cannot launch
            warnings.simplefilter("ignore", RuntimeWarning)
            built = F.get_uncached_config(point.id, dev)
        compile_s = 0.0 if built_before else time.perf_counter() - t0
        if built is None:
            why = F.VALIDATED.why(key, dev)
            result.update(compile_s=compile_s, reasons=[why])
            return fail_result(result, log, f"{point.name}: built, but cannot launch on {dev} ({why})")
        plan = F.prepare_uncached(pb.x, pb.weight, pb.bias, m.input_linear, m.weight_linear, config=point.id)
        plan.out.fill_(float("nan"))
        plan.launch()
        y = plan.finish()
        ref, ref_name = reference_forward(m, pb.x, pb.weight, pb.bias)
        err = rel_error(y.float().cpu(), ref.cpu())
        tol = 1e-2

        def op():
            p = F.prepare_uncached(pb.x, pb.weight, pb.bias, m.input_linear, m.weight_linear, config=point.id)
            p.launch()
            return p.finish()
        run_ms = time_ms(op, dev)
        xf, wf = (pb.x, pb.weight) if dev != "cpu" else (pb.x.float(), pb.weight.float())
        bf = None if pb.bias is None else (pb.bias if dev != "cpu" else pb.bias.float())
        torch_ms = time_ms(lambda: CompactTorchOps.forward(m, xf, wf, bf), dev)
        est = fam.estimate(point, Problem.of(m, b, layer=layer), spec)
        words = f"{point.name} on {layer} (B = {b}, {m.nout} output nodes)"
        result.update(ok=True, passed=bool(torch.isfinite(y).all()) and err <= tol, batch=b, nodes=m.nout,
                      clamp=note, err=err, tolerance=tol, compile_s=compile_s, run_ms=run_ms, torch_ms=torch_ms,
                      torch_name="torch_compact (fp32 on the CPU)" if dev == "cpu" else "torch_compact (fp16)",
                      roofline_ms=est.ms, reference=ref_name, label=f"{point.name} (B = {b})",
                      parity=parity_line(words + f" vs the {ref_name}", err, tol))
        result["message"] = result["parity"] + (f"  [{note}]" if note else "")
        return result_answer(result, log)
    except Exception as exc:  # noqa: BLE001 - the widget must answer with a message
        return fail_result(result, log, f"could not run: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}")


def family_widget(family: str = "tensor_cores", layer: str = "res18_layer1", batch: int = 16,
                  device: Optional[str] = None):
    """An ipywidgets panel: a family, a dropdown per parameter (its values), a layer and a batch; each change
    re-runs :func:`explore_point` and redraws the runs so far. The panel starts with the family's starting point
    already run; ``panel.last_result`` is the latest run's result."""
    import ipywidgets as W
    from fovi_lab.graph.layers import LAYERS
    from fovi_lab.kernels.families import FAMILIES
    log = RunLog(title="runs so far: compile + canary, and the whole op beside torch_compact")
    fam_dd = W.Dropdown(options=[(f.title, f.key) for f in FAMILIES if not f.inference_only], value=family,
                        description="family")
    layer_dd = W.Dropdown(options=list(LAYERS), value=layer, description="layer")
    batch_in = W.BoundedIntText(value=batch, min=1, max=512, description="batch")
    params_box, status, out, fig_out = W.VBox(), W.Label(value=""), W.Output(), W.Output()
    state = {"widgets": {}}

    def build_params(*_):
        fam = _family(fam_dd.value)
        start = start_point(fam.key, layer_dd.value, batch_in.value)
        ws = {}
        for p in fam.params:
            ws[p.name] = W.Dropdown(options=[(f"{v}", v) for v in p.values], value=start[p.name],
                                    description=p.name, tooltip=p.label)
            ws[p.name].observe(run, names="value")
        state["widgets"] = ws
        params_box.children = list(ws.values())

    def controls():
        return [fam_dd, layer_dd, batch_in] + list(state["widgets"].values())

    def run(*_):
        values = {k: w.value for k, w in state["widgets"].items()}
        out.clear_output()
        try:
            with busy(controls(), status):
                res, fig = explore_point(fam_dd.value, layer_dd.value, batch_in.value, device=device, log=log,
                                         **values)
        except Exception as exc:  # noqa: BLE001 - a widget answers with a line, not a traceback
            with out:
                print(f"could not run: {error_words(exc)}")
            return
        panel.last_result = res
        fig_out.clear_output()
        with out:
            print(res["message"])
        with fig_out:
            fig.show()

    def on_family(*_):
        build_params()
        run()

    panel = W.VBox([W.HBox([fam_dd, layer_dd, batch_in]), params_box, status, out, fig_out])
    panel.status = status
    fam_dd.observe(on_family, names="value")
    layer_dd.observe(run, names="value")
    batch_in.observe(run, names="value")
    build_params()
    run()
    return panel
