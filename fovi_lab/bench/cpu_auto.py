"""How good ``backend="auto"`` is on the CPU: each form and fovi's ``baseline`` timed per shape, beside auto's pick.

    python -m fovi_lab bench cpu-auto                                   # fovi's layers and the 13 table layers
    python -m fovi_lab bench cpu-auto --layers res18_layer3 --nets none --batches 1 --reps 2

The shapes: the distinct KNN conv layers of fovi's own networks (``--nets``: fovi's KNNAlexNet and its ResNet-18,
:func:`fovi_lab.integrations.fovi.fovi_network`, named ``<net>.<index of the first layer of that shape>``) and the
table layers (``--layers``, :data:`fovi_lab.graph.layers.LAYERS`), each at every ``--batches`` B, a train step in
fp32 (forward and both gradients, autograd through :class:`fovi_lab.ops.autograd.KNNConvFunction`).

The forms timed: the CPU forms ``auto`` chooses among (:func:`fovi_lab.ops.cpu_auto.forms`: ``torch_compact``,
``torch_binned``, ``torch_dense``) and, where fovi imports, fovi's ``baseline`` (its dense one-hot einsum) through
fovi's own layer of the same shape (for a table layer, :func:`fovi_lab.integrations.fovi.fovi_layer`: the same
sizes, fovi's own tables). Each form runs once (its time decides whether it is repeated: a form whose first two calls
each take more than ``--cutoff`` times the fastest first call is not, and its time is its second call's, marked
``one call``); the others run ``--reps`` interleaved rounds (more until each form's add up to ``--min-ms``, as
auto's own measurement does), and the median counts.

Auto's pick is what a user's first call gets: :func:`fovi_lab.ops.cpu_auto.decide` (the tune cache's entry for
this machine, else a measurement now, unless ``FOVI_KNN_AUTO_MEASURE=off``); the estimate's pick (the cost model
alone) is recorded beside it. Per shape the line gives every form's time, the picks and the ratio of the pick's time
(this benchmark's) to the fastest form's; the closing line counts the shapes where auto is within 1.25x of the fastest.
Records (JSON lines, one per shape and B, with the device, versions, date, commit and command) go to ``--out``
(default ``data/cpu_auto_<device>.jsonl``).
"""

from __future__ import annotations

import copy
import math
import statistics
import time
import warnings
from typing import Dict, List, Optional, Tuple

import torch

from fovi_lab.bench.common import default_record_path, emit_rows, env_info, say_appended, stamp_command
from fovi_lab.graph.layers import LAYERS, layer_meta
from fovi_lab.ops import cpu_auto
from fovi_lab.ops.arguments import command_main

__all__ = ["shapes", "time_forms", "bench_shape", "summary", "main", "add_arguments", "run", "DESCRIPTION", "WITHIN"]

PROG = "python -m fovi_lab bench cpu-auto"
#: The ratio to the fastest form within which auto's pick counts as good.
WITHIN = 1.25
NETS = ("alexnet", "resnet18")


def _fovi_shapes(nets) -> List[Tuple[str, object, object]]:
    """``(name, fovi_lab meta, fovi's layer)`` of each distinct KNN conv layer shape of fovi's ``nets``."""
    from fovi_lab.integrations.fovi import _fovi, _lab_meta, conv_layers, fovi_network
    registry_module, _ = _fovi()
    out, seen = [], set()
    for net in nets:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = fovi_network(net, "cpu", n_classes=10)
        for i, layer in enumerate(conv_layers(model)):
            meta = _lab_meta(registry_module.ensure_training_metadata(layer, torch.device("cpu")))
            key = (meta.cin, meta.cout, meta.nin, meta.nout, meta.k, meta.v, meta.nnz)
            if key not in seen:
                seen.add(key)
                out.append((f"{net}.{i}", meta, layer))
    return out


def shapes(layers, nets) -> List[Tuple[str, object, Optional[object]]]:
    """``(name, meta, fovi's layer or None)``: fovi's network layers of ``nets`` first, then the table ``layers``
    (fovi's layer of a table layer is built when fovi imports, else None: no baseline)."""
    out = list(_fovi_shapes(nets)) if nets else []
    for name in layers:
        conv = None
        try:
            from fovi_lab.integrations.fovi import fovi_layer
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                conv = fovi_layer(name, "cpu")
        except ImportError:
            pass
        out.append((name, layer_meta(name), conv))
    return out


def _operands(meta, batch: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, meta.cin, meta.nin, generator=gen)
    w = torch.randn(meta.cout, meta.q, generator=gen) / math.sqrt(max(1, meta.p))
    g = torch.randn(batch, meta.cout, meta.nout, generator=gen)
    return x, w, g


def _our_step(form: str, meta, x, w, g):
    from fovi_lab.ops.autograd import KNNConvFunction

    def step():
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        y = KNNConvFunction.apply(xr, wr, None, meta, form)
        return torch.autograd.grad(y, (xr, wr), g)
    return step


def _baseline_step(conv, x, w, g):
    conv = copy.deepcopy(conv)
    conv.kernel_backend = "baseline"
    with torch.no_grad():
        conv.weight.copy_(w)

    def step():
        xr = x.detach().requires_grad_()
        y = conv(xr)
        return torch.autograd.grad(y, (xr, conv.weight), g)
    return step


def time_forms(steps: Dict[str, object], reps: int, cutoff: float, clock=time.perf_counter,
               min_ms: float = 0.0) -> Tuple[Dict, List]:
    """``({form: median ms}, [forms timed once])``: each step once, then ``reps`` interleaved rounds of those whose
    first call is within ``cutoff`` times the fastest first call (the others: a second call, which counts), more
    until each form's rounds add up to ``min_ms`` (at most :data:`~fovi_lab.ops.cpu_auto.MEASURE_MAX_REPS`)."""
    def once(fn) -> float:
        t0 = clock()
        fn()
        return (clock() - t0) * 1e3

    first = {f: once(fn) for f, fn in steps.items()}
    fastest = min(first.values())
    slow = [f for f, ms in first.items() if ms > cutoff * fastest]
    samples = {f: [] for f in steps if f not in slow}
    times: Dict[str, float] = {}
    for f in slow:
        times[f] = once(steps[f])
        if times[f] <= cutoff * fastest:                 # its first call was slow, not the form
            samples[f] = [times.pop(f)]
    i = 0
    while cpu_auto.another_round(i, reps, samples, min_ms):
        for f in samples:
            samples[f].append(once(steps[f]))
        i += 1
    times.update({f: statistics.median(s) for f, s in samples.items()})
    return times, [f for f in slow if f not in samples]


def bench_shape(name: str, meta, conv, batch: int, reps: int, cutoff: float, min_ms: float = 0.0) -> dict:
    """One record: every form's time at ``batch``, auto's pick (and how it was decided), the estimate's pick."""
    x, w, g = _operands(meta, batch)
    choice = cpu_auto.decide(meta, batch, torch.float32, True)
    forms = cpu_auto.forms(torch.float32, True)
    steps = {f: _our_step(f, meta, x, w, g) for f in forms}
    if conv is not None:
        steps["fovi_baseline"] = _baseline_step(conv, x, w, g)
    times, once = time_forms(steps, reps, cutoff, min_ms=min_ms)
    fastest = min(times, key=times.get)
    est = cpu_auto.estimates(meta, batch, torch.float32, True)
    est_pick = min(est, key=est.get)
    return dict(kind="cpu_auto", layer=name, mode="train-step", dtype="float32", B=batch, cin=meta.cin,
                cout=meta.cout, nin=meta.nin, nout=meta.nout, k=meta.k, v=meta.v, p64=meta.p64, times=times,
                timed_once=once, fastest=fastest, fastest_ms=times[fastest], auto=choice.backend,
                auto_source=choice.source, auto_ms=times[choice.backend], ratio=times[choice.backend] / times[fastest],
                estimate_pick=est_pick, estimate_ratio=times[est_pick] / times[fastest], estimates=est,
                auto_measured=dict(choice.times), threads=torch.get_num_threads(), reps=reps, min_ms=min_ms)


def _line(r: dict) -> str:
    forms = "  ".join(f"{f} {ms:.3g}{'*' if f in r['timed_once'] else ''}"
                      for f, ms in sorted(r["times"].items(), key=lambda kv: kv[1]))
    return (f"{r['layer']:<16s} B={r['B']:<3d} auto {r['auto']} ({r['auto_source']}) {r['ratio']:.2f}x  "
            f"estimate {r['estimate_pick']} {r['estimate_ratio']:.2f}x  |  {forms} ms")


def summary(rows: List[dict]) -> str:
    """The closing line: on how many shapes auto's pick (and the estimate's) is within :data:`WITHIN` of the fastest."""
    n = len(rows)
    good = sum(r["ratio"] <= WITHIN for r in rows)
    est = sum(r["estimate_ratio"] <= WITHIN for r in rows)
    worst = max(rows, key=lambda r: r["ratio"]) if rows else None
    tail = f"; worst {worst['ratio']:.2f}x ({worst['layer']} B={worst['B']})" if worst else ""
    return (f"# auto within {WITHIN}x of the fastest form (fovi's baseline included) on {good} of {n} shapes"
            f"{tail}; the estimate alone on {est} of {n}")


#: The help text of ``python -m fovi_lab bench cpu-auto``.
DESCRIPTION = """\
How good backend="auto" is on this CPU: per shape (fovi's network layers and the table layers, a fp32 train step at
each batch) every CPU form's time and fovi's baseline's, auto's pick (measured on this machine, or estimated) and its
ratio to the fastest; the last line counts the shapes where auto is within 1.25x of the fastest. A form marked * ran
once more only (its first call was over --cutoff times the fastest's).

  python -m fovi_lab bench cpu-auto
  python -m fovi_lab bench cpu-auto --layers res18_layer3 --nets none --batches 1 --reps 2
"""


def add_arguments(parser) -> None:
    from fovi_lab.ops.arguments import COUNT, LayersAction, layer_names, out_file

    parser.add_argument("--layers", nargs="*", type=layer_names(), action=LayersAction, default=list(LAYERS),
                        help="table layers, or all (default: all 13; --layers with no name: none of them)")
    parser.add_argument("--nets", nargs="+", choices=NETS + ("none",), default=list(NETS),
                        help="fovi's networks whose layers are timed too (default: both; none: only --layers)")
    parser.add_argument("--batches", nargs="+", type=COUNT, default=[1, 8, 32], help="batch sizes (default 1 8 32)")
    parser.add_argument("--reps", type=COUNT, default=3, help="interleaved timed rounds per shape (default 3)")
    parser.add_argument("--min-ms", type=float, default=cpu_auto.MEASURE_MIN_MS, metavar="MS",
                        help="rounds continue past --reps until each form's add up to this many ms (default "
                             f"{cpu_auto.MEASURE_MIN_MS:g}, as auto's own measurement)")
    parser.add_argument("--cutoff", type=float, default=4.0,
                        help="a form whose first two calls each take over this many times the fastest first call "
                             "is not repeated (default 4)")
    parser.add_argument("--out", type=out_file, default=None,
                        help="append the records here (default: data/cpu_auto_<device>.jsonl)")


def run(args) -> int:
    from fovi_lab.ops.arguments import usage_error
    if not (math.isfinite(args.cutoff) and args.cutoff >= 1.0):
        usage_error(PROG, f"--cutoff: expected a number >= 1, got {args.cutoff}")
    if not (math.isfinite(args.min_ms) and args.min_ms >= 0.0):
        usage_error(PROG, f"--min-ms: expected milliseconds >= 0, got {args.min_ms}")
    nets = [] if "none" in args.nets else list(dict.fromkeys(args.nets))
    env = stamp_command(env_info("cpu"), PROG, args)
    out = args.out or str(default_record_path("cpu_auto", env["device"]))
    rows = []
    for name, meta, conv in shapes(args.layers, nets):
        for b in args.batches:
            rows.append(dict(env, **bench_shape(name, meta, conv, b, args.reps, args.cutoff, args.min_ms)))
            emit_rows(rows[-1:], out, _line)
    print(summary(rows), flush=True)
    say_appended(out, len(rows))
    return 0


main = command_main(PROG, DESCRIPTION, add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
