"""The main job, headless: one real fovi layer through every registered backend, checked and timed.

``python -m fovi_lab demo [--layer res18_layer1] [--batch 8] [--rf rf1|rf2]`` builds the layer's foveated
KNN graph (docs/operator.md §5, §6), runs every backend in ``OPS_REGISTRY`` on the best available device (CUDA if
present, else CPU; Warp's CPU device runs the Warp kernels there), checks the forward output and, for
train-capable backends, both gradients against autograd of the fp64 oracle, and prints one row per
backend: device, dtype, max errors, tolerance verdict and median times. New backends appear here by
registration alone.

Each backend computes in its first compute dtype (fp16 for the Warp backends); on the CPU the PyTorch backends
compute in fp32, where PyTorch's fp16 matrix products are slow. The references are computed once per dtype and
shared by the backends of that dtype. On the CPU the demo estimates its run time from the layer's FLOPs
(:func:`cpu_estimate`) and, when the run will take a minute or more, says so before it starts, with a batch that
fits; a phase expected to take seconds says so as it starts. The timing's estimate comes from its first timed
call, a warm one: a backend's first calls may compile Warp kernels or build tables, and say nothing of the rest.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from fovi_lab.graph.layers import layer_name
from fovi_lab.ops.arguments import check_device as _check_device, command_main
from fovi_lab.ops.reference import oracle_forward
from fovi_lab.ops.registry import OPS_REGISTRY, load_optional_backends, trains as backend_trains

__all__ = ["DemoRow", "run_demo", "format_rows", "check_device", "main", "add_arguments", "run", "DESCRIPTION",
           "pass_flops", "cpu_estimate", "estimate_line", "CPU_GFLOPS"]


@dataclass
class DemoRow:
    backend: str
    device: str
    dtype: str
    fwd_err: Optional[float]
    dx_err: Optional[float]
    dw_err: Optional[float]
    tol: float                      # y's tolerance: 3x the same-dtype oracle's error + 2e-3
    ok: Optional[bool]
    fwd_ms: Optional[float]
    bwd_ms: Optional[float]
    note: str = ""
    dx_tol: Optional[float] = None  # dx's and dW's tolerances, the same rule
    dw_tol: Optional[float] = None


def _timeit(fn, device: torch.device, reps: int, warm_up: bool = True,
            after_first: Optional[Callable[[float], None]] = None) -> float:
    """Median ms of ``reps`` calls of ``fn``, after one warm-up call (any compile) unless ``warm_up`` is False (the
    callable has run already). ``after_first`` gets the seconds of the first timed call as it ends (a warm call:
    what the others will take)."""
    if warm_up:
        fn()
    times = []
    for i in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
        if i == 0 and after_first is not None:
            after_first(times[0] / 1e3)
    return sorted(times)[len(times) // 2]


def _compute_dtype(ops, device: torch.device) -> torch.dtype:
    """The dtype the demo runs ``ops`` in: its first compute dtype (fp16 for a backend that names none); on the CPU
    fp32 wherever the backend computes fp32 (PyTorch's CPU matrix products are slow in fp16)."""
    dtypes = getattr(ops, "compute_dtypes", None)
    if device.type == "cpu" and (dtypes is None or torch.float32 in dtypes):
        return torch.float32
    return dtypes[0] if dtypes else torch.float16


def check_device(device) -> torch.device:
    """The torch device ``device`` names, if the demo can run there: ``cpu``, or ``cuda[:i]`` with that GPU
    visible to torch. Raises ValueError saying why not."""
    return _check_device(device)


# ------------------------------------------------------------------------------------------------ references

@dataclass
class _References:
    """One dtype's operands (rounded to it, on the device) and the references they are checked against."""
    x: torch.Tensor
    w: torch.Tensor
    b: Optional[torch.Tensor]
    gy: torch.Tensor
    exact: Tuple[torch.Tensor, torch.Tensor, torch.Tensor]     # y, dx, dW of the fp64 reference (CPU)
    tols: Tuple[float, float, float]                           # 3x the same-dtype reference's errors + 2e-3


def _references(x32, w32, b32, gy32, dtype, device, graph, v) -> _References:
    """Round the operands to ``dtype`` (so the references see the numbers the backends see), then autograd of the
    oracle (:func:`fovi_lab.ops.reference.oracle_forward`) in fp64 (the exact values) and in ``dtype`` (whose
    errors set the tolerances, docs/operator.md §5), both on the CPU. Computed once per dtype: every backend of
    that dtype is checked against them."""
    x, w, gy = (t.to(dtype).to(device) for t in (x32, w32, gy32))
    b = None if b32 is None else b32.to(dtype).to(device)

    def grads(compute):
        xr = x.cpu().to(compute).requires_grad_()
        wr = w.cpu().to(compute).requires_grad_()
        y = oracle_forward(xr, wr, None if b is None else b.cpu(), graph.idx, graph.rf_index, v, dtype=compute)
        dx, dw = torch.autograd.grad(y, (xr, wr), gy.cpu().to(compute))
        return y.detach(), dx, dw

    exact = grads(torch.float64)
    own = grads(dtype)
    errs = [(o.double() - e).abs().max().item() for o, e in zip(own, exact)]
    return _References(x, w, b, gy, exact, tuple(3 * e + 2e-3 for e in errs))


# ------------------------------------------------------------------------------------------------ CPU estimate

#: Throughput on the CPU, in GFLOP/s of the layer's ``2*B*Nout*P64*Cout`` per pass (a forward, a dx or a dW), each
#: averaged over a forward and both gradients: the references' autograd of the oracle in each dtype, and each
#: backend's forward and adjoints in the dtype the demo runs it in. Measured by the demo on a 2-core x86-64 machine
#: (AMD EPYC, PyTorch 2.13, Warp's CPU kernels) on alex_L1 at B = 64, rounded between an idle and a busy machine; a
#: backend not listed counts at the slowest rate. The FLOPs leave out per-call overhead and the compilation of Warp
#: kernels, so small shapes and first runs take longer than this says.
CPU_GFLOPS: Dict[str, float] = {
    "reference float64": 7.0,
    "reference float32": 14.0,
    "reference float16": 1.0,
    "torch_compact float32": 12.0,
    "torch_binned float32": 9.0,
    "warp_compact float16": 3.5,
    "warp_train float16": 3.5,
}


def pass_flops(batch: int, nout: int, p64: int, cout: int) -> float:
    """The FLOPs of one pass (forward, dx or dW) of a layer: ``2*B*Nout*P64*Cout``."""
    return 2.0 * batch * nout * p64 * cout


def _rate(key: str) -> float:
    return CPU_GFLOPS.get(key, min(CPU_GFLOPS.values())) * 1e9


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _phase_seconds(flops: float, name: str, dtype: torch.dtype, trains: bool, reps: int) -> Dict[str, float]:
    """Estimated CPU seconds of each phase of one backend: its forward's first call, its adjoints' first call and
    its timing (``reps`` calls of each pass, and a warm-up of the combined backward)."""
    one = flops / _rate(f"{name} {_dtype_name(dtype)}")
    return {"forward": one, "adjoints": 2 * one if trains else 0.0,
            "timing": reps * one + ((reps + 1) * 2 * one if trains else 0.0)}


def _reference_seconds(flops: float, dtype: torch.dtype) -> float:
    """Estimated CPU seconds of one dtype's references: forward and autograd in fp64 and in ``dtype``."""
    return 3 * flops / _rate("reference float64") + 3 * flops / _rate(f"reference {_dtype_name(dtype)}")


def cpu_estimate(flops: float, backends: Sequence[Tuple[str, torch.dtype, bool]], reps: int) -> float:
    """Estimated seconds of a demo run on the CPU: ``flops`` per pass (:func:`pass_flops`) times the passes of the
    references (forward and both gradients, in fp64 and in each backend dtype, once per dtype) and of every
    ``(name, dtype, trains)`` backend (a first call and ``reps`` timed calls of the forward and, if it trains, of
    both adjoints), each at its rate in :data:`CPU_GFLOPS`."""
    total = sum(_reference_seconds(flops, d) for d in dict.fromkeys(d for _, d, _ in backends))
    for name, dtype, trains in backends:
        total += sum(_phase_seconds(flops, name, dtype, trains, reps).values())
    return total


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    return f"{minutes:.0f} minutes" if minutes < 90 else f"{minutes / 60:.1f} hours"


def estimate_line(layer: str, batch: int, seconds: float, flops: float) -> str:
    """The warning printed before a CPU run estimated at ``seconds``: the time, the work per pass and a batch that
    would take about a minute (the time grows with the batch), e.g. ``alex_L1 at B = 64 on the CPU: about 4 minutes
    (~18.3 GFLOP per pass, not counting Warp's compilation); try --batch 16``."""
    fits = max(1, 2 ** int(math.floor(math.log2(max(1.0, batch * 60.0 / max(seconds, 1e-9))))))
    hint = f"; try --batch {fits}" if fits < batch else ""
    return (f"{layer} at B = {batch} on the CPU: about {_duration(seconds)} (~{flops / 1e9:.3g} GFLOP per pass, not "
            f"counting Warp's compilation){hint}")


#: A CPU run estimated at this many seconds or more is announced before it starts; a phase estimated at
#: :data:`_LONG_PHASE_S` or more says so as it starts.
_LONG_RUN_S = 60.0
_LONG_PHASE_S = 3.0


# ------------------------------------------------------------------------------------------------ the run

def run_demo(layer: str = "res18_layer1", batch: int = 8, rf: Optional[str] = None, device=None, reps: int = 3,
             backends: Optional[List[str]] = None, log=print) -> List[DemoRow]:
    """Run every registered backend on one real layer; returns one :class:`DemoRow` per backend.

    Tolerance (docs/operator.md §5): each of y, dx, dW within 3x the error of autograd through the oracle computed
    in the same dtype, + 2e-3; errors are max-abs against autograd of the fp64 oracle (both references computed
    on the CPU, once per dtype, and shared by that dtype's backends). ``log`` gets a line per phase (graph, then per
    backend: references, first call, adjoints, timing) as it ends, with its time, and, for a phase expected to take
    seconds (or to compile Warp kernels), a line as it starts (for the timing, after its first timed call of each
    pass, from that call's time); on the CPU a run estimated at a minute or more is announced first
    (:func:`estimate_line`).

    Raises:
        ValueError: ``batch`` or ``reps`` below 1, an unusable ``device``. KeyError: an unknown layer or backend.
    """
    from fovi_lab.graph.layers import layer_graph, resolve_layer

    for name, val in (("batch", batch), ("reps", reps)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {val!r}")
    load_optional_backends()
    names = list(backends) if backends else sorted(OPS_REGISTRY)
    unknown = [n for n in names if n not in OPS_REGISTRY]
    if unknown:
        raise KeyError(f"backends: unknown {unknown}; registered: {sorted(OPS_REGISTRY)}")
    device = check_device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    spec, rf = resolve_layer(layer, rf)
    full_name = layer_name(layer, rf)
    t0 = time.perf_counter()
    log(f"[demo] building the foveated KNN graph of {full_name} ...")
    graph = layer_graph(spec.name, rf=rf)
    meta = graph.meta(spec.cin, spec.cout).to(device)
    log(f"[demo] Cin={meta.cin} Cout={meta.cout} Nin={meta.nin} Nout={meta.nout} K={meta.k} V={meta.v} "
        f"P64={meta.p64}, B={batch}, device={device} ({time.perf_counter() - t0:.1f} s)")

    plan = [(name, _compute_dtype(OPS_REGISTRY[name], device), backend_trains(OPS_REGISTRY[name])) for name in names]
    flops = pass_flops(batch, meta.nout, meta.p64, meta.cout)
    on_cpu = device.type == "cpu"
    if on_cpu:
        seconds = cpu_estimate(flops, plan, reps)
        if seconds >= _LONG_RUN_S:
            log(f"[demo] {estimate_line(full_name, batch, seconds, flops)}")

    g = torch.Generator().manual_seed(0)
    x32 = torch.randn(batch, meta.cin, meta.nin, generator=g)
    w32 = torch.randn(meta.cout, meta.q, generator=g) * (2.0 / (meta.cin * meta.k)) ** 0.5
    b32 = torch.randn(meta.cout, generator=g) * 0.1 if spec.bias else None
    gy32 = torch.randn(batch, meta.cout, meta.nout, generator=g)

    rows: List[DemoRow] = []
    refs: Dict[torch.dtype, _References] = {}
    for i, (name, dtype, trains) in enumerate(plan, 1):
        ops = OPS_REGISTRY[name]
        tag = f"[demo] ({i}/{len(plan)}) {name}"
        dname = _dtype_name(dtype)
        shared = dtype in refs
        log(f"{tag} in {dname}" + (f" (against the {dname} references above)" if shared else ""))
        expect = _phase_seconds(flops, name, dtype, trains, reps) if on_cpu else {}
        t_phase = time.perf_counter()

        def starting(what: str, seconds: Optional[float] = None, note: str = "") -> None:
            """A line as a phase starts, when it is expected to take a while (or compiles Warp kernels)."""
            nonlocal t_phase
            if note or (seconds is not None and seconds >= _LONG_PHASE_S):
                about = f", about {_duration(seconds)}" if seconds is not None and seconds >= _LONG_PHASE_S else ""
                log(f"{tag}: {what}{about}{note} ...")
            t_phase = time.perf_counter()

        def phase(what: str) -> float:
            """The line as a phase ends, with its time; returns the seconds it took."""
            nonlocal t_phase
            now = time.perf_counter()
            took, t_phase = now - t_phase, now
            log(f"{tag}   {what} ({took:.1f} s)")
            return took

        if not shared:
            starting(f"fp64 and {dname} references (forward and both gradients)",   # on the CPU, on any device
                     _reference_seconds(flops, dtype))
            refs[dtype] = _references(x32, w32, b32, gy32, dtype, device, graph, meta.v)
            phase("fp64 and same-dtype oracle references")
        ref = refs[dtype]
        x, w, b, gy = ref.x, ref.w, ref.b, ref.gy
        y64, dx64, dw64 = ref.exact
        tols = ref.tols
        row = DemoRow(name, str(device), dname, None, None, None, tols[0], None, None, None,
                      dx_tol=tols[1], dw_tol=tols[2])
        compiles = name.startswith("warp")
        try:
            starting("forward, first call", expect.get("forward"),
                     " (compiles its Warp kernels unless they are cached)" if compiles else "")
            y = ops.forward(meta, x, w, b)
            row.fwd_err = (y.double().cpu() - y64).abs().max().item()
            ok = row.fwd_err <= tols[0]
            phase("forward, first call" + (" (compiles its Warp kernels)" if compiles else ""))
            if trains:
                starting("dx and dW, first call", expect.get("adjoints"))
            try:
                dx = ops.grad_input(meta, gy, w)
                dw = ops.grad_weight(meta, gy, x)
            except NotImplementedError as exc:
                row.note = f"forward only ({exc})"
            else:
                row.dx_err = (dx.double().cpu() - dx64).abs().max().item()
                row.dw_err = (dw.double().cpu() - dw64).abs().max().item()
                ok = ok and row.dx_err <= tols[1] and row.dw_err <= tols[2]
                phase("dx and dW, first call")
            row.ok = bool(ok)
            both = getattr(ops, "backward_combined", None) if row.dx_err is not None else None
            # no estimate from the first calls: they may have compiled kernels or built tables (2.3 s where a
            # timed call took 0.3); each pass's estimate comes from its first timed call, a warm one
            starting(f"timing {reps} call{'s' if reps > 1 else ''} of each pass")

            def timing_left(what: str):
                def say(seconds: float) -> None:
                    if (reps - 1) * seconds >= _LONG_PHASE_S:
                        log(f"{tag}: timing {what}: one call took {seconds:.1f} s, about "
                            f"{_duration((reps - 1) * seconds)} for the other {reps - 1} ...")
                return say

            # the forward and the separate adjoints ran above (their warm-up); backward_combined has not run yet
            row.fwd_ms = _timeit(lambda: ops.forward(meta, x, w, b), device, reps, warm_up=False,
                                 after_first=timing_left("the forward"))
            if row.dx_err is not None:
                row.bwd_ms = _timeit((lambda: both(meta, gy, x, w)) if both else     # as KNNConvFunction calls it
                                     (lambda: (ops.grad_input(meta, gy, w), ops.grad_weight(meta, gy, x))),
                                     device, reps, warm_up=both is not None, after_first=timing_left("dx and dW"))
            phase(f"timed, median of {reps}")
            if name == "warp_train":
                from fovi_lab.knn_warp import grad_path
                row.note = f"adjoints: {grad_path(meta)} (knn_warp.grad_path)"
        except Exception as exc:  # one backend failing must not hide the others
            row.ok = False
            row.note = f"{type(exc).__name__}: {exc}"[:160]
        rows.append(row)
    return rows


def format_rows(rows: List[DemoRow]) -> str:
    """The demo's table: per backend its errors against the fp64 oracle, each beside its tolerance, the
    verdict and the median times."""
    def f(v, fmt):
        return format("-", f">{fmt[:-2].split('.')[0]}") if v is None else format(v, fmt)

    head = f"{'backend':<15}{'device':<8}{'dtype':<9}{'y err':>9}{'tol':>9}{'dx err':>9}{'tol':>9}" \
           f"{'dW err':>9}{'tol':>9}{'ok':>5}{'fwd ms':>9}{'bwd ms':>9}  note"
    lines = [head, "-" * len(head)]
    for r in rows:
        dx_tol = r.dx_tol if r.dx_err is not None else None
        dw_tol = r.dw_tol if r.dw_err is not None else None
        lines.append(f"{r.backend:<15}{r.device:<8}{r.dtype:<9}{f(r.fwd_err, '9.1e')}{f(r.tol, '9.1e')}"
                     f"{f(r.dx_err, '9.1e')}{f(dx_tol, '9.1e')}{f(r.dw_err, '9.1e')}{f(dw_tol, '9.1e')}"
                     f"{('yes' if r.ok else 'NO'):>5}{f(r.fwd_ms, '9.2f')}{f(r.bwd_ms, '9.2f')}  {r.note}")
    lines.append("tol: 3x the error of the oracle computed in the backend's own dtype, + 2e-3 (each of y, dx, dW)")
    return "\n".join(lines)


def auto_choice(layer: str, batch: int, rf: Optional[str] = None, device=None) -> str:
    """One line saying what ``backend="auto"`` picks for this layer and batch, training and inference."""
    from fovi_lab.ops.dispatch import pick_backend
    from fovi_lab.graph.layers import layer_meta

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    meta = layer_meta(layer, rf=rf)
    x = torch.empty(batch, meta.cin, meta.nin, dtype=torch.float16, device=device)
    pick = {mode: pick_backend(meta, x, training=mode == "training") or "torch_compact (no record applies)"
            for mode in ("training", "inference")}
    return f"auto picks (fp16 on {device}): training -> {pick['training']}, inference -> {pick['inference']}"


# ------------------------------------------------------------------------------------------------ command line

#: The help text of ``python -m fovi_lab demo``.
DESCRIPTION = """\
Run one real fovi layer through every registered backend, check each against the fp64 oracle and time it.

The demo builds the layer's foveated KNN graph, runs each backend on the best device here (CUDA if torch sees a
GPU, else the CPU, where Warp runs its kernels too), checks the forward output and, for backends that train, both
gradients against the fp64 oracle, and prints one row per backend: dtype, errors beside their tolerances, the
verdict and median times. The exit status is 1 when a backend disagrees with the oracle.

On the CPU the PyTorch backends compute in fp32 and the Warp ones in fp16. Large layers at large batches take
minutes there; the demo estimates the time first and names a batch that fits:

  python -m fovi_lab demo
  python -m fovi_lab demo --layer alex_L1 --batch 8
"""


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab demo``, each checked as it is parsed."""
    from fovi_lab.graph.layers import LAYERS
    from fovi_lab.ops.arguments import COUNT, backend_name, add_device_option, layer_name as layer_arg

    parser.add_argument("--layer", type=layer_arg, default="res18_layer1",
                        help=f"the layer to run: one of {', '.join(LAYERS)}, or a variant <layer>_rf1 / "
                             f"<layer>_rf2 on the other reference frame")
    parser.add_argument("--batch", type=COUNT, default=8, help="images in the batch")
    parser.add_argument("--rf", default=None, choices=["rf1", "rf2"],
                        help="reference frame (default: the one the layer's network uses)")
    add_device_option(parser)
    parser.add_argument("--reps", type=COUNT, default=3, help="timed calls of each pass per backend, whose median is "
                                                              "shown")
    parser.add_argument("--backends", nargs="+", type=backend_name(), default=None, metavar="BACKEND",
                        help="run only these registered backends (default: every registered backend)")


def run(args) -> int:
    """Run the demo as ``args`` say (the options of :func:`add_arguments`); 0 when every backend agrees with the
    oracle, else 1."""
    from fovi_lab.graph.layers import resolve_layer
    from fovi_lab.ops.arguments import usage_error

    try:
        resolve_layer(args.layer, args.rf)
    except ValueError:                                    # each value was checked alone; the pair disagrees
        usage_error("python -m fovi_lab demo", f"--rf: {args.rf} contradicts --layer {args.layer} (the variant name "
                                               f"names its frame; give one or the other)")
    rows = run_demo(args.layer, args.batch, args.rf, args.device, args.reps, args.backends,
                    log=lambda line: print(line, flush=True))
    print(format_rows(rows))
    print(auto_choice(args.layer, args.batch, args.rf, args.device))
    bad = [r.backend for r in rows if not r.ok]
    print("all backends agree with the oracle" if not bad else f"FAILED: {', '.join(bad)}")
    return 1 if bad else 0


main = command_main("python -m fovi_lab demo", DESCRIPTION, add_arguments, run)


if __name__ == "__main__":
    sys.exit(main())
