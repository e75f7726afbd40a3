"""The main job, headless: one real fovi layer through every registered backend, checked and timed.

``python -m fovi_lab demo [--layer res18_layer1] [--batch 8] [--rf rf1|rf2]`` builds the layer's foveated
KNN graph (spec §5, §6), runs every backend in ``OPS_REGISTRY`` on the best available device (CUDA if
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

from .knn_autograd import OPS_REGISTRY, _load_optional_backends
from .reference import oracle_forward
from .layers import layer_name

__all__ = ["DemoRow", "run_demo", "main"]


@dataclass
class DemoRow:
    backend: str
    device: str
    dtype: str
    fwd_err: Optional[float]
    dx_err: Optional[float]
    dw_err: Optional[float]
    tol: float
    ok: Optional[bool]
    fwd_ms: Optional[float]
    bwd_ms: Optional[float]
    note: str = ""


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


def run_demo(layer: str = "res18_layer1", batch: int = 8, rf: Optional[str] = None, device=None, reps: int = 3,
             backends: Optional[List[str]] = None, log=print) -> List[DemoRow]:
    """Run every registered backend on one real layer; returns one :class:`DemoRow` per backend.

    Tolerance (spec §5): each of y, dx, dW within 3x the error of autograd through the oracle computed
    in the same dtype, + 2e-3; errors are max-abs against autograd of the fp64 oracle.
    """
    from .layers import layer_graph

    _load_optional_backends()
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    t0 = time.perf_counter()
    log(f"[demo] building the foveated KNN graph of {layer_name(layer, rf)} ...")
    graph = layer_graph(layer, rf=rf)
    from .layers import LAYERS

    spec = LAYERS[layer]
    meta = graph.meta(spec.cin, spec.cout).to(device)
    log(f"[demo] Cin={meta.cin} Cout={meta.cout} Nin={meta.nin} Nout={meta.nout} K={meta.k} V={meta.v} "
        f"P64={meta.p64}, B={batch}, device={device} ({time.perf_counter() - t0:.1f} s)")

    g = torch.Generator().manual_seed(0)
    x32 = torch.randn(batch, meta.cin, meta.nin, generator=g)
    w32 = torch.randn(meta.cout, meta.q, generator=g) * (2.0 / (meta.cin * meta.k)) ** 0.5
    b32 = torch.randn(meta.cout, generator=g) * 0.1 if spec.bias else None
    gy32 = torch.randn(batch, meta.cout, meta.nout, generator=g)

    names = backends or sorted(OPS_REGISTRY)
    rows: List[DemoRow] = []
    ref_err_cache = {}
    for i, name in enumerate(names, 1):
        ops = OPS_REGISTRY[name]
        dtype = _compute_dtype(ops)
        slow = " (the first call compiles its Warp kernels)" if name.startswith("warp") else ""
        log(f"[demo] ({i}/{len(names)}) {name} in {str(dtype).replace('torch.', '')}{slow} ...")
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
        if dtype not in ref_err_cache:  # same-dtype autograd of the oracle sets the bar (spec §5)
            xr = x.cpu().requires_grad_()
            wr = w.cpu().requires_grad_()
            yr = oracle_forward(xr, wr, None if b is None else b.cpu(), graph.idx, graph.rf_index, meta.v,
                                dtype=dtype)
            dxr, dwr = torch.autograd.grad(yr, (xr, wr), gy.cpu())
            ref_err_cache[dtype] = tuple((a.double() - r).abs().max().item()
                                         for a, r in ((yr.detach(), y64.detach()), (dxr, dx64), (dwr, dw64)))
        ref_errs = ref_err_cache[dtype]
        row = DemoRow(name, str(device), str(dtype).replace("torch.", ""), None, None, None,
                      3 * ref_errs[0] + 2e-3, None, None, None)
        try:
            y = ops.forward(meta, x, w, b)
            row.fwd_err = (y.double().cpu() - y64.detach()).abs().max().item()
            ok = row.fwd_err <= 3 * ref_errs[0] + 2e-3
            try:
                dx = ops.grad_input(meta, gy, w)
                dw = ops.grad_weight(meta, gy, x)
            except NotImplementedError as exc:
                row.note = f"forward only ({exc})"
            else:
                row.dx_err = (dx.double().cpu() - dx64).abs().max().item()
                row.dw_err = (dw.double().cpu() - dw64).abs().max().item()
                ok = ok and row.dx_err <= 3 * ref_errs[1] + 2e-3 and row.dw_err <= 3 * ref_errs[2] + 2e-3
            row.ok = bool(ok)
            row.fwd_ms = _timeit(lambda: ops.forward(meta, x, w, b), device, reps)
            if row.dx_err is not None:
                both = getattr(ops, "backward_combined", None)   # what KNNConvFunction calls when both are needed
                row.bwd_ms = _timeit((lambda: both(meta, gy, x, w)) if both else
                                     (lambda: (ops.grad_input(meta, gy, w), ops.grad_weight(meta, gy, x))),
                                     device, reps)
            if name == "warp_train":
                from .knn_warp import grad_path
                row.note = f"adjoints: {grad_path(meta)} (knn_warp.grad_path)"
        except Exception as exc:  # one backend failing must not hide the others
            row.ok = False
            row.note = f"{type(exc).__name__}: {exc}"[:160]
        rows.append(row)
    return rows


def format_rows(rows: List[DemoRow]) -> str:
    def f(v, fmt):
        return format("-", f">{fmt[:-2].split('.')[0]}") if v is None else format(v, fmt)

    head = f"{'backend':<15}{'device':<8}{'dtype':<9}{'y err':>9}{'dx err':>9}{'dW err':>9}{'ok':>5}" \
           f"{'fwd ms':>9}{'bwd ms':>9}  note"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r.backend:<15}{r.device:<8}{r.dtype:<9}{f(r.fwd_err, '9.1e')}{f(r.dx_err, '9.1e')}"
                     f"{f(r.dw_err, '9.1e')}{('yes' if r.ok else 'NO'):>5}{f(r.fwd_ms, '9.2f')}"
                     f"{f(r.bwd_ms, '9.2f')}  {r.note}")
    return "\n".join(lines)


def auto_choice(layer: str, batch: int, rf: Optional[str] = None, device=None) -> str:
    """One line saying what ``backend="auto"`` picks for this layer and batch, training and inference."""
    from .autotune import pick_backend
    from .layers import layer_meta

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    meta = layer_meta(layer, rf=rf)
    x = torch.empty(batch, meta.cin, meta.nin, dtype=torch.float16, device=device)
    pick = {mode: pick_backend(meta, x, training=mode == "training") or "torch_compact (no record applies)"
            for mode in ("training", "inference")}
    return f"auto picks (fp16 on {device}): training -> {pick['training']}, inference -> {pick['inference']}"


def main(argv=None) -> int:
    from .layers import LAYERS

    ap = argparse.ArgumentParser(prog="python -m fovi_lab demo", description=__doc__.splitlines()[0])
    ap.add_argument("--layer", default="res18_layer1", choices=list(LAYERS))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rf", default=None, choices=["rf1", "rf2"],
                    help="reference frame (default: the one the layer's network uses)")
    ap.add_argument("--device", default=None, help="cpu or cuda[:i] (default: cuda if present)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--backends", nargs="*", default=None, help="subset of registered backends")
    args = ap.parse_args(argv)
    if args.batch < 1:
        ap.error("--batch must be >= 1")
    rows = run_demo(args.layer, args.batch, args.rf, args.device, args.reps, args.backends)
    print(format_rows(rows))
    print(auto_choice(args.layer, args.batch, args.rf, args.device))
    bad = [r.backend for r in rows if not r.ok]
    print("all backends agree with the oracle" if not bad else f"FAILED: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
