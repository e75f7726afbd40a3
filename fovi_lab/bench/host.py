"""The host work of an eager call: microseconds and launches of a forward, a backward and a train step, with the
kernels left out.

    python -m fovi_lab bench host [--layers NAME ...] [--batches 16 64] [--backends warp_train torch_compact]
                                  [--reps 30] [--device cpu|cuda] [--out F.jsonl]

At small batch an eager step is decided by what the host does per call: checks, the plan lookup, the launches'
set-up, the autograd engine, the allocations. This benchmark measures that part alone, on any machine: each call
runs through the layer a user builds (:class:`fovi_lab.KNNConv` with the backend named, fp16 operands) after a
warm-up that compiles and checks its kernels; then, for the timed calls, Warp's launches are counted and not run
(:func:`dry_launches`), so what is left is the host's work. Per (layer, batch, backend, path):

* ``warp_launches``: Warp kernel launches (recorded launches re-issued and plain ones);
* ``torch_ops``: PyTorch operations that run a kernel (views and bare allocations are not counted), and among them
  ``allocations`` (operations that return new memory, ``torch.empty`` included) and ``syncs`` (operations that
  wait for the device: ``.item()``, ``nonzero``...), counted by a dispatch mode (:class:`OpCounter`);
* ``wall_us``: the call's wall time with the Warp launches left out (median of ``reps`` calls; the backends of one
  layer and batch take turns, one call each in an order rotated every round, so the machine's drift over the run
  falls on all of them alike; ``interleaved``: how many took turns);
* ``torch_ops_us``: the part of it spent inside those PyTorch operations (median of ``reps`` calls under the mode) (on a CPU their arithmetic runs there; on a
  GPU it is the host's cost of launching them);
* ``host_us = wall_us - torch_ops_us``: the host work outside PyTorch's operations: Python, the checks, the plan,
  the Warp launches' set-up, the autograd engine, and the CUDA graph replays of replayed calls;
* ``graph_replays`` and ``graph_replay_us``: those replays (a GPU call the Warp backends replay from a graph,
  :mod:`fovi_lab.ops.replay`) and the median wall time inside them, part of ``host_us``.

``--fovi`` adds calls through fovi's own layer of the table layer (:func:`fovi_lab.integrations.fovi.fovi_layer`):
``fovi:fovi_lab`` is our ``warp_train`` through fovi's registry and autograd Function, the route inside fovi's
networks; ``fovi:cuda`` and the others are fovi's own backends (a backend fovi refuses on the device is a row
saying why). fovi's own kernels are not Warp's, so they are launched in the timed calls (``fovi:cuda``'s CuPy
kernels): their launch is host work, their GPU time is not waited for. ``backend_used`` on these rows is the route
asked for, not the backend fovi's ``auto`` picked.

Beside the backends, the ``floor`` rows (:class:`FloorLayer`, ``--no-floor`` leaves them out): an empty custom op
with the layer's outputs, the least host work an eager layer call has on the machine measured, so a backend's host
work reads against what no op can avoid there.

Paths: ``forward`` (an inference call, no autograd graph), ``backward`` (``y.backward(g)`` of a forward made
outside the timed region) and ``step`` (forward and backward, the gradients set to None between steps as an
optimizer's ``zero_grad`` does). Counts are exact and the same on every run of one device (a test pins them);
times are this machine's. On a CPU the kernels the rules pick differ from a GPU's, so the counts are the CPU path's.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from typing import Dict, Iterator, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fovi_lab.bench.common import _sync, emit_rows, say_appended, started
from fovi_lab.graph.layers import LAYERS, layer_meta
from fovi_lab.ops.arguments import command_main

__all__ = ["dry_launches", "OpCounter", "host_work", "FLOOR", "FloorLayer", "THROUGH_FOVI", "main", "add_arguments",
           "run", "DESCRIPTION", "PATHS"]

PROG = "python -m fovi_lab bench host"
PATHS = ("forward", "backward", "step")

# operations that return memory without running a kernel
_NO_KERNEL = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh", "set_",
              "resize_", "_local_scalar_dense", "_unsafe_view"}
# operations that make the host wait for the device
_SYNCS = {"_local_scalar_dense", "item", "nonzero", "is_nonzero", "equal", "masked_select", "unique", "_unique2"}


class OpCounter(TorchDispatchMode):
    """A dispatch mode that counts the PyTorch operations run under it and times them.

    ``ops``: operations that run a kernel (not views, not bare allocations); ``allocations``: operations whose
    result is new memory (``empty`` included, views and in-place operations not); ``syncs``: operations that wait
    for the device; ``seconds``: wall time inside all of them; ``names``: operation name -> count."""

    def __init__(self):
        super().__init__()
        self.ops = self.allocations = self.syncs = 0
        self.seconds = 0.0
        self.names: Dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        self.seconds += time.perf_counter() - t0
        name = func._schema.name.split("::")[-1]
        if func.is_view or name == "_unsafe_view":               # a view that autograd does not track
            return out
        inplace = name.endswith("_") or any(a.is_write for a in func._schema.arguments if a.alias_info)
        if not inplace:
            self.allocations += sum(1 for t in (out if isinstance(out, (tuple, list)) else (out,))
                                    if isinstance(t, torch.Tensor))
        if name in _SYNCS:
            self.syncs += 1
        if name not in _NO_KERNEL:
            self.ops += 1
            self.names[name] = self.names.get(name, 0) + 1
        return out


class _Launches:
    count = 0           # Warp launches (counted, not run)
    replays = 0         # CUDA graph replays (run: a replayed call's kernels are in its graph)
    replay_s = 0.0      # wall time inside those replays


@contextlib.contextmanager
def dry_launches() -> Iterator[_Launches]:
    """Inside: Warp kernel launches are counted and not run (recorded launches re-issued through
    ``wp.Launch.launch``, plain ``wp.launch`` / ``wp.launch_tiled``); recording a launch (``record_cmd=True``)
    still works. Yields the counter (``.count``). Outputs the kernels would write hold whatever they held. CUDA graph
    replays (``torch.cuda.CUDAGraph.replay``: the Warp backends' replayed calls) run, and are counted and timed
    (``.replays``, ``.replay_s``); an emulated graph's replay (:func:`fovi_lab.ops.replay.emulated_on_cpu`) is counted
    and does nothing, as its kernels are left out. A graph the replay layer captures inside would hold no Warp kernel,
    so where one was, every cached graph is dropped on the way out (:func:`fovi_lab.ops.replay.clear`)."""
    import warp as wp

    counter = _Launches()
    real_launch, real_tiled, real_cmd = wp.launch, wp.launch_tiled, wp.Launch.launch

    def launch(*args, **kwargs):
        if kwargs.get("record_cmd"):
            return real_launch(*args, **kwargs)
        counter.count += 1

    def launch_tiled(*args, **kwargs):
        if kwargs.get("record_cmd"):
            return real_tiled(*args, **kwargs)
        counter.count += 1

    def cmd_launch(self, stream=None):
        counter.count += 1

    graph = getattr(torch.cuda, "CUDAGraph", None)
    real_replay = getattr(graph, "replay", None)

    def replay(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real_replay(self, *args, **kwargs)
        finally:
            counter.replays += 1
            counter.replay_s += time.perf_counter() - t0

    from fovi_lab.ops import replay as replay_layer
    real_emulated, real_in_place = replay_layer._EmulatedStep.replay, replay_layer._EmulatedInPlace.run

    def emulated(self):                 # an emulated graph (replay.emulated_on_cpu): counted, its kernels not run
        counter.replays += 1
        return self.outputs

    def emulated_in_place(self, args, outs, where):
        counter.replays += 1

    wp.launch, wp.launch_tiled, wp.Launch.launch = launch, launch_tiled, cmd_launch
    replay_layer._EmulatedStep.replay = emulated
    replay_layer._EmulatedInPlace.run = emulated_in_place
    if real_replay is not None:
        graph.replay = replay
    made = _captures(replay_layer)
    try:
        yield counter
    finally:
        wp.launch, wp.launch_tiled, wp.Launch.launch = real_launch, real_tiled, real_cmd
        replay_layer._EmulatedStep.replay, replay_layer._EmulatedInPlace.run = real_emulated, real_in_place
        if real_replay is not None:
            graph.replay = real_replay
        if _captures(replay_layer) != made:
            # a graph captured inside holds no Warp kernel (its launches were counted, not run): drop every graph
            replay_layer.clear()


def _captures(replay_layer) -> tuple:
    s = replay_layer.stats()
    return s["captured"], s["captured_in_place"]


#: The yardstick's name in the records: the least host work of a custom autograd op with this layer's outputs.
FLOOR = "floor"


class _EmptyConv(torch.autograd.Function):
    """A custom op that does nothing but return the tensors a layer returns: ``y`` forward, ``dx`` and ``dW``
    backward, uninitialised (``new_empty``)."""

    @staticmethod
    def forward(ctx, x, weight, cout: int, nout: int):
        ctx.shapes = (x.shape, weight.shape)
        return x.new_empty((x.shape[0], cout, nout))

    @staticmethod
    def backward(ctx, grad_y):
        xs, ws = ctx.shapes
        return grad_y.new_empty(xs), grad_y.new_empty(ws), None, None


class FloorLayer(torch.nn.Module):
    """The floor of an eager layer call on this machine (:data:`FLOOR`): a module with the layer's weight whose
    forward is :class:`_EmptyConv`. What a custom op cannot avoid: the module call, ``Function.apply``, the autograd
    engine, and an allocation per returned tensor; no checks, no plan, no kernel. Its host work beside ours says how
    much of ours is the op's own."""

    def __init__(self, meta):
        super().__init__()
        self.cout, self.nout = meta.cout, meta.nout
        self.weight = torch.nn.Parameter(torch.empty(meta.cout, meta.q))
        self.last_backend = FLOOR

    def forward(self, x):
        return _EmptyConv.apply(x, self.weight, self.cout, self.nout)


#: A backend name's prefix for a call through fovi's own layer (:func:`fovi_lab.integrations.fovi.fovi_layer`):
#: ``fovi:fovi_lab`` (our warp_train through fovi's registry, as inside fovi's networks) or ``fovi:<its backend>``.
THROUGH_FOVI = "fovi:"


def _layer(meta, backend: str, device, dtype):
    from fovi_lab.ops.autograd import KNNConv

    if backend == FLOOR:
        return FloorLayer(meta).to(device=device, dtype=dtype)
    conv = KNNConv(meta.idx, meta.rf_index, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout, backend=backend)
    return conv.to(device=device, dtype=dtype)


@contextlib.contextmanager
def _layer_in_use(layer: str, meta, backend: str, device, dtype) -> Iterator[torch.nn.Module]:
    """The module a call of ``backend`` runs through: ours (:class:`fovi_lab.KNNConv`), the floor, or fovi's own
    layer of the table layer with fovi_lab inside (``fovi:fovi_lab``) or one of fovi's backends (``fovi:cuda``...),
    for as long as the calls are measured."""
    if not backend.startswith(THROUGH_FOVI):
        yield _layer(meta, backend, device, dtype)
        return
    from fovi_lab.integrations.fovi import fovi_backend, fovi_lab_inside, fovi_layer

    name = backend[len(THROUGH_FOVI):]
    conv = fovi_layer(layer, device).to(dtype=dtype)
    with (fovi_lab_inside(conv, "warp_train", device) if name == "fovi_lab" else fovi_backend(conv, name)):
        conv.last_backend = backend
        yield conv


def host_work(layer: str, batch: int, backend="warp_train", device="cpu", reps: int = 30,
              dtype: torch.dtype = torch.float16, paths=PATHS, warmup: int = 3,
              emulate_replay: bool = False, refusals: Optional[Dict[str, Exception]] = None) -> List[dict]:
    """The host work of ``paths`` of one eager layer call (see the module doc); one dict per backend and path.
    ``backend``: a name or several; several take turns, each timed call of one followed by one of the next (the order
    rotated every round), so a drift of the machine over the run (a CPU warming up, another process) falls on all of
    them alike. ``refusals``: where given, a backend whose layer or first call raises is left out and its exception
    kept there under its name; otherwise the exception propagates. ``emulate_replay`` (a CPU only): the calls are
    replayed from emulated graphs (:func:`fovi_lab.ops.replay.emulated_on_cpu`), as a GPU replays them, each replay
    counted and not run."""
    device = torch.device(device)
    if emulate_replay:
        if device.type != "cpu":
            raise ValueError(f"emulate_replay: the graphs are emulated on a CPU only; on {device} they are real")
        from fovi_lab.ops import replay
        with replay.emulated_on_cpu():
            rows = host_work(layer, batch, backend, device, reps, dtype, paths, warmup, refusals=refusals)
        return [dict(r, replay="emulated") for r in rows]
    backends = [backend] if isinstance(backend, str) else list(dict.fromkeys(backend))
    if THROUGH_FOVI + "warp_train" in backends and THROUGH_FOVI + "fovi_lab" in backends:
        # fovi's own copy of the seed's warp_train first: fovi_lab registers under that name in fovi's registry
        first = [THROUGH_FOVI + "warp_train"]
        return (host_work(layer, batch, first, device, reps, dtype, paths, warmup, refusals=refusals)
                + host_work(layer, batch, [b for b in backends if b not in first], device, reps, dtype, paths,
                            warmup, refusals=refusals))
    meta = layer_meta(layer, device=device)
    with contextlib.ExitStack() as stack:
        calls = {}
        for name in backends:
            try:
                conv = stack.enter_context(_layer_in_use(layer, meta, name, device, dtype))
                calls[name] = _Calls(conv, meta, batch, device, dtype)
            except Exception as exc:  # noqa: BLE001  (fovi refuses a backend on this device or dtype)
                if refusals is None:
                    raise
                refusals[name] = exc
        return _measure(calls, batch, device, dtype, reps, paths, warmup, layer, refusals)


class _Calls:
    """One backend's layer and operands (the same seeded x and grad_y for every backend), and its calls by path:
    ``(prepare or None, call)``."""

    def __init__(self, conv, meta, batch: int, device, dtype):
        gen = torch.Generator().manual_seed(0)
        self.conv = conv
        x = torch.randn(batch, meta.cin, meta.nin, generator=gen).to(device, dtype).requires_grad_()
        g = torch.randn(batch, meta.cout, meta.nout, generator=gen).to(device, dtype)
        made: list = []

        def forward():
            with torch.no_grad():
                conv(x)

        def prepare_backward():
            made[:] = [conv(x)]

        def backward():
            made.pop().backward(g)
            x.grad = conv.weight.grad = None

        def step():
            conv(x).backward(g)
            x.grad = conv.weight.grad = None

        self.paths = {"forward": (None, forward), "backward": (prepare_backward, backward), "step": (None, step)}


def _turn(names: List[str], i: int) -> List[str]:
    """The backends' order in round ``i``: rotated by one every round."""
    k = i % len(names)
    return names[k:] + names[:k]


def _measure(calls: Dict[str, _Calls], batch: int, device, dtype, reps: int, paths, warmup: int, layer: str,
             refusals: Optional[Dict[str, Exception]]) -> List[dict]:
    out = []
    for path in paths:
        # compiles and checks the kernels, fills the plan caches and (replayed calls) captures the forward on the
        # second call, the backward that reads its copies on the third
        for name in list(calls):
            prep, fn = calls[name].paths[path]
            try:
                for _ in range(warmup):
                    if prep:
                        prep()
                    fn()
            except Exception as exc:  # noqa: BLE001  (fovi refuses a backend on this device or dtype)
                if refusals is None:
                    raise
                refusals[name] = exc
                del calls[name]
        _sync(device)
        names = list(calls)
        if not names:                                 # every backend refused
            break
        walls = {n: [] for n in names}
        op_secs = {n: [] for n in names}
        replay_secs = {n: [] for n in names}
        counts = {}
        with dry_launches() as launches:
            for i in range(reps):                     # the wall time, nothing watching; the backends take turns
                for n in _turn(names, i):
                    prep, fn = calls[n].paths[path]
                    if prep:
                        prep()
                    _sync(device)
                    launches.replay_s = 0.0
                    t0 = time.perf_counter()
                    fn()
                    walls[n].append(time.perf_counter() - t0)
                    replay_secs[n].append(launches.replay_s)
                    _sync(device)
            for i in range(reps):                     # the counts and the time inside PyTorch's operations
                for n in _turn(names, i):
                    prep, fn = calls[n].paths[path]
                    if prep:
                        prep()
                    _sync(device)
                    launches.count = launches.replays = 0
                    with OpCounter() as ops:
                        fn()
                    counts[n] = (launches.count, launches.replays, ops)
                    op_secs[n].append(ops.seconds)
                    _sync(device)
        for n in names:
            n_launch, n_replay, ops = counts[n]
            wall = statistics.median(walls[n]) * 1e6
            op_us = statistics.median(op_secs[n]) * 1e6
            out.append(dict(kind="host", layer=layer, B=batch, backend=n, path=path, dtype=str(dtype)[6:],
                            warp_launches=n_launch, graph_replays=n_replay, torch_ops=ops.ops,
                            allocations=ops.allocations, syncs=ops.syncs,
                            torch_op_names=dict(sorted(ops.names.items())), wall_us=wall, torch_ops_us=op_us,
                            host_us=max(0.0, wall - op_us), graph_replay_us=statistics.median(replay_secs[n]) * 1e6,
                            reps=reps, backend_used=calls[n].conv.last_backend, interleaved=len(names)))
    order = {n: i for i, n in enumerate(calls)}           # per backend, its paths in turn; none of a refused one
    return sorted((r for r in out if r["backend"] in order), key=lambda r: order[r["backend"]])


#: The help text of ``python -m fovi_lab bench host``.
DESCRIPTION = """\
The host work of an eager call, kernels left out: per layer, batch and backend, the microseconds and the launches
of a forward, a backward and a train step through the layer a user builds (KNNConv, fp16).

After a warm-up that compiles and checks the kernels, the timed calls count Warp's launches without running them
and count PyTorch's operations (kernels, allocations, syncs) with a dispatch mode. host_us is the call's wall time
outside PyTorch's operations (Python, checks, the plan, the launches' set-up, autograd); torch_ops_us the time
inside them (their arithmetic on a CPU, their launch cost on a GPU); the backends take turns call by call. Counts
are exact; times are this machine's.
--fovi adds calls through fovi's own layer (fovi:fovi_lab: ours through fovi's registry, as inside its networks;
fovi:cuda and the others: fovi's backends, whose own kernels, not Warp's, are launched in the timed calls). Beside the backends, the floor rows (--no-floor leaves them out): an empty custom op with the layer's weight and
outputs, the least host work an eager layer call has on this machine.

  python -m fovi_lab bench host --layers res18_layer1 alex_L1 --batches 16 --out host.jsonl
"""


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab bench host``, each checked as it is parsed."""
    from fovi_lab.ops.arguments import (COUNT, LayersAction, add_device_option, add_out_option, backend_name,
                                        layer_names)

    parser.add_argument("--layers", nargs="+", type=layer_names(), action=LayersAction,
                        default=["res18_layer1", "alex_L1", "res18_stem"], metavar="LAYER",
                        help="layer names, or all (default: res18_layer1 alex_L1 res18_stem)")
    parser.add_argument("--batches", nargs="+", type=COUNT, default=[16], metavar="B", help="batch sizes")
    parser.add_argument("--backends", nargs="+", type=backend_name(trains=True), default=["warp_train", "torch_compact"],
                        metavar="BACKEND", help="backends that train (default: warp_train torch_compact)")
    parser.add_argument("--fovi", nargs="+", default=[], metavar="BACKEND",
                        choices=("fovi_lab", "auto", "cuda", "baseline", "torch_compact", "warp_train"),
                        help="also through fovi's own layer of each table layer: fovi_lab (our warp_train through "
                             "fovi's registry, as inside fovi's networks) or fovi's backends (auto, cuda, baseline, "
                             "torch_compact, its copy of the seed's warp_train); needs fovi (default: none)")
    parser.add_argument("--no-floor", action="store_true",
                        help=f"leave out the {FLOOR!r} rows: an empty custom op with the layer's outputs, the least "
                             f"host work an eager layer call has on this machine (measured by default)")
    parser.add_argument("--paths", nargs="+", choices=PATHS, default=list(PATHS), help="which calls to measure")
    parser.add_argument("--reps", type=COUNT, default=30, help="timed calls per path, whose median is kept")
    parser.add_argument("--emulate-replay", action="store_true",
                        help="on a CPU: replay the calls from emulated CUDA graphs, as a GPU replays them (the "
                             "records say replay=emulated)")
    add_device_option(parser)
    add_out_option(parser, "the table is printed")


def table_line(r: dict) -> str:
    if "wall_us" not in r:
        return f"{r['layer']:>14s} {r['B']:>4d} {r['backend']:>13s} {r['path']:>8s}   not run: {r.get('note', '')[:80]}"
    return (f"{r['layer']:>14s} {r['B']:>4d} {r['backend']:>13s} {r['path']:>8s} {r['host_us']:9.1f} "
            f"{r['torch_ops_us']:9.1f} {r['wall_us']:9.1f} {r['warp_launches']:7d} {r['torch_ops']:6d} "
            f"{r['allocations']:6d} {r['syncs']:5d} {r.get('graph_replays', 0):6d} {r.get('graph_replay_us', 0.0):9.1f}")


def run(args) -> int:
    """Run the host benchmark as ``args`` say (the options of :func:`add_arguments`); returns 0."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.emulate_replay and torch.device(device).type != "cpu":
        from fovi_lab.ops.arguments import usage_error
        usage_error(PROG, f"--emulate-replay: the graphs are emulated on a CPU only; on {device} they are real")
    env = started(device, PROG, args, "host work of eager calls on", "; times in us, Warp's kernels not run")
    print(f"{'layer':>14s} {'B':>4s} {'backend':>13s} {'path':>8s} {'host_us':>9s} {'torch_us':>9s} {'wall_us':>9s} "
          f"{'launch':>7s} {'ops':>6s} {'alloc':>6s} {'syncs':>5s} {'graphs':>6s} {'replay_us':>9s}", flush=True)
    total = 0
    for layer in args.layers:
        for b in args.batches:
            through = [THROUGH_FOVI + n for n in args.fovi]
            refused: Dict[str, Exception] = {}
            rows = host_work(layer, b, list(args.backends) + through + ([] if args.no_floor else [FLOOR]), device,
                             args.reps, paths=args.paths, emulate_replay=args.emulate_replay, refusals=refused)
            for backend, exc in refused.items():
                if backend not in through:          # ours and the floor must run
                    raise exc
                why = (str(exc).strip().splitlines() or [""])[0]
                rows = [r for r in rows if r["backend"] != backend]   # (a refusal after some paths ran)
                rows += [dict(kind="host", layer=layer, B=b, backend=backend, path=p,
                              note=f"{type(exc).__name__}: {why}"[:200]) for p in args.paths]
            total += emit_rows([dict(env, **r) for r in rows], args.out, table_line)
    say_appended(args.out, total)
    return 0


#: ``python -m fovi_lab bench host``: see :data:`DESCRIPTION`.
main = command_main(PROG, DESCRIPTION, add_arguments, run)

if __name__ == "__main__":
    raise SystemExit(main())
