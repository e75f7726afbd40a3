"""The main job, headless: one real fovi layer through every registered backend, checked and timed.

``python -m fovi_lab demo [--layer res18_layer1] [--batch 8] [--rf rf1|rf2]`` builds the layer's foveated
KNN graph (docs/operator.md §5, §6), runs every backend in ``OPS_REGISTRY`` on the best available device (CUDA if
present, else CPU; Warp's CPU device runs the Warp kernels there), checks the forward output and, for
train-capable backends, both gradients against autograd of the fp64 oracle, and prints one row per
backend: device, dtype, max errors, tolerance verdict and median times. New backends appear here by
registration alone.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import List, Optional

import torch

from fovi_lab.ops.registry import OPS_REGISTRY, load_optional_backends
from fovi_lab.ops.reference import oracle_forward
from fovi_lab.graph.layers import layer_name

__all__ = ["DemoRow", "run_demo", "format_rows", "check_device", "main"]


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


def _timeit(fn, device: torch.device, reps: int) -> float:
    fn()  # warm-up (includes any compile)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


def _compute_dtype(ops) -> torch.dtype:
    dtypes = getattr(ops, "compute_dtypes", (torch.float16, torch.float32))
    return dtypes[0]


def check_device(device) -> torch.device:
    """The torch device ``device`` names, if the demo can run there: ``cpu``, or ``cuda[:i]`` with that GPU
    visible to torch. Raises ValueError saying why not."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device: {device!r} is not a torch device ({exc})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected cpu or cuda[:i], got {device!r} (the Warp kernels run on those only)")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA device on this machine")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"device: {device!r} asked for, but torch sees {torch.cuda.device_count()} CUDA device(s)")
    return dev


def run_demo(layer: str = "res18_layer1", batch: int = 8, rf: Optional[str] = None, device=None, reps: int = 3,
             backends: Optional[List[str]] = None, log=print) -> List[DemoRow]:
    """Run every registered backend on one real layer; returns one :class:`DemoRow` per backend.

    Tolerance (docs/operator.md §5): each of y, dx, dW within 3x the error of autograd through the oracle computed
    in the same dtype, + 2e-3; errors are max-abs against autograd of the fp64 oracle. ``log`` gets a line
    per phase (graph, then per backend: reference, first call, adjoints, timing), each with its time.

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
    t0 = time.perf_counter()
    log(f"[demo] building the foveated KNN graph of {layer_name(layer, rf)} ...")
    graph = layer_graph(spec.name, rf=rf)
    meta = graph.meta(spec.cin, spec.cout).to(device)
    log(f"[demo] Cin={meta.cin} Cout={meta.cout} Nin={meta.nin} Nout={meta.nout} K={meta.k} V={meta.v} "
        f"P64={meta.p64}, B={batch}, device={device} ({time.perf_counter() - t0:.1f} s)")

    g = torch.Generator().manual_seed(0)
    x32 = torch.randn(batch, meta.cin, meta.nin, generator=g)
    w32 = torch.randn(meta.cout, meta.q, generator=g) * (2.0 / (meta.cin * meta.k)) ** 0.5
    b32 = torch.randn(meta.cout, generator=g) * 0.1 if spec.bias else None
    gy32 = torch.randn(batch, meta.cout, meta.nout, generator=g)

    rows: List[DemoRow] = []
    ref_err_cache = {}
    for i, name in enumerate(names, 1):
        ops = OPS_REGISTRY[name]
        dtype = _compute_dtype(ops)
        tag = f"[demo] ({i}/{len(names)}) {name}"
        log(f"{tag} in {str(dtype).replace('torch.', '')}")
        t_phase = time.perf_counter()

        def phase(what: str) -> None:
            nonlocal t_phase
            now = time.perf_counter()
            log(f"{tag}   {what} ({now - t_phase:.1f} s)")
            t_phase = now

        # Round the operands to the compute dtype first, so the oracle sees the same numbers.
        x = x32.to(dtype).to(device)
        w = w32.to(dtype).to(device)
        b = None if b32 is None else b32.to(dtype).to(device)
        gy = gy32.to(dtype).to(device)
        x64 = x.double().cpu().requires_grad_()
        w64 = w.double().cpu().requires_grad_()
        y64 = oracle_forward(x64, w64, None if b is None else b.double().cpu(), graph.idx, graph.rf_index,
                             meta.v, dtype=torch.float64)
        dx64, dw64 = torch.autograd.grad(y64, (x64, w64), gy.double().cpu())
        if dtype not in ref_err_cache:  # same-dtype autograd of the oracle sets the bar (docs/operator.md §5)
            xr = x.cpu().requires_grad_()
            wr = w.cpu().requires_grad_()
            yr = oracle_forward(xr, wr, None if b is None else b.cpu(), graph.idx, graph.rf_index, meta.v,
                                dtype=dtype)
            dxr, dwr = torch.autograd.grad(yr, (xr, wr), gy.cpu())
            ref_err_cache[dtype] = tuple((a.double() - r).abs().max().item()
                                         for a, r in ((yr.detach(), y64.detach()), (dxr, dx64), (dwr, dw64)))
        tols = tuple(3 * e + 2e-3 for e in ref_err_cache[dtype])
        phase("fp64 and same-dtype oracle references")
        row = DemoRow(name, str(device), str(dtype).replace("torch.", ""), None, None, None, tols[0], None, None, None,
                      dx_tol=tols[1], dw_tol=tols[2])
        try:
            y = ops.forward(meta, x, w, b)
            row.fwd_err = (y.double().cpu() - y64.detach()).abs().max().item()
            ok = row.fwd_err <= tols[0]
            phase("forward, first call" + (" (compiles its Warp kernels)" if name.startswith("warp") else ""))
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
            row.fwd_ms = _timeit(lambda: ops.forward(meta, x, w, b), device, reps)
            if row.dx_err is not None:
                both = getattr(ops, "backward_combined", None)   # what KNNConvFunction calls when both are needed
                row.bwd_ms = _timeit((lambda: both(meta, gy, x, w)) if both else
                                     (lambda: (ops.grad_input(meta, gy, w), ops.grad_weight(meta, gy, x))),
                                     device, reps)
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


def main(argv=None) -> int:
    from fovi_lab.graph.layers import LAYERS

    ap = argparse.ArgumentParser(prog="python -m fovi_lab demo", description=__doc__.splitlines()[0])
    ap.add_argument("--layer", default="res18_layer1", choices=list(LAYERS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rf", default=None, choices=["rf1", "rf2"],
                    help="reference frame (default: the one the layer's network uses)")
    ap.add_argument("--device", default=None, help="cpu or cuda[:i] (default: cuda if present)")
    ap.add_argument("--reps", type=int, default=3, help="timed calls per backend (>= 1; the median is shown)")
    ap.add_argument("--backends", nargs="*", default=None, help="subset of registered backends")
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error("--batch must be >= 1")
    if args.reps < 1:
        ap.error(f"--reps must be >= 1, got {args.reps}")
    load_optional_backends()
    unknown = [n for n in args.backends or () if n not in OPS_REGISTRY]
    if unknown:
        ap.error(f"--backends: unknown {', '.join(map(repr, unknown))}; registered: {', '.join(sorted(OPS_REGISTRY))}")
    if args.device is not None:
        try:
            check_device(args.device)
        except ValueError as exc:
            ap.error(f"--{exc}")
    rows = run_demo(args.layer, args.batch, args.rf, args.device, args.reps, args.backends)
    print(format_rows(rows))
    print(auto_choice(args.layer, args.batch, args.rf, args.device))
    bad = [r.backend for r in rows if not r.ok]
    print("all backends agree with the oracle" if not bad else f"FAILED: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
