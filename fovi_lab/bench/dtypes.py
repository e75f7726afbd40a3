"""bf16 beside fp16, each beside PyTorch's fastest op in the same dtype: the forward and the train step.

    python -m fovi_lab.bench.dtypes [--layers NAME ...] [--batches 16 64] [--reps 20] [--out F.jsonl]

Per layer, batch and dtype (fp16, bf16), in one run:

* ``forward``: ``warp_compact`` (the rule's kernel; bf16 runs the tensor-core kernels) against the PyTorch
  forwards ``torch_compact`` (its op), ``gather_bmm``, ``tgather_bmm`` and ``binned_mm``
  (:func:`fovi_lab.bench.backward_impls.torch_forwards`);
* ``train-step`` (y, dx, dW): ``warp_train`` (forward + both fused adjoints) against ``torch_compact``'s op
  step and the hand-written ``explicit_tgather`` step (:func:`fovi_lab.bench.backward_impls.torch_steps`).

Each implementation runs once and is checked against the fp32 oracle on the same rounded operands (the
criterion of docs/operator.md §5: 3x torch_compact's error in that dtype + 2e-3), then is timed one call at a
time (``ms``: CUDA events, median) and replayed from a CUDA graph (``ms_graph``: no host work per call).
Records (``kind: "dtype_bench"``) carry device, versions, date, commit and command; the
summary prints, per layer and batch, bf16's time over fp16's for the Warp backends and each dtype's ratio of
PyTorch's fastest time to ours.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional

import torch

from fovi_lab.bench.backward_impls import torch_forwards, torch_steps
from fovi_lab.bench.common import append_jsonl, compact_flops, env_info, time_fn
from fovi_lab.graph.layers import LAYERS, layer_meta
from fovi_lab.ops.arguments import command_main
from fovi_lab.ops.reference import CompactTorchOps, oracle_forward

__all__ = ["bench_layer", "main", "add_arguments", "run", "DESCRIPTION"]

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


def _operands(meta, batch: int, dtype, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, meta.cin, meta.nin, generator=gen)
    w = torch.randn(meta.cout, meta.q, generator=gen) / (meta.cin * meta.k) ** 0.5
    g = torch.randn(batch, meta.cout, meta.nout, generator=gen)
    return [t.to(device=device, dtype=dtype) for t in (x, w, g)]


def _oracle(meta, x, w, g):
    xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
    y = oracle_forward(xf, wf, None, meta.idx, meta.rf_index, meta.v)
    dx, dw = torch.autograd.grad(y, (xf, wf), g.float())
    return y.detach(), dx, dw


def checked_operands(meta, batch: int, dtype, device):
    """``(x, w, g, refs, tols)``: the operands in ``dtype``, the fp32 oracle's (y, dx, dW) on them and each output's
    tolerance (3x torch_compact's error in that dtype + 2e-3)."""
    x, w, g = _operands(meta, batch, dtype, device)
    refs = _oracle(meta, x, w, g)
    t_ref = (CompactTorchOps.forward(meta, x, w, None), CompactTorchOps.grad_input(meta, g, w),
             CompactTorchOps.grad_weight(meta, g, x))
    return x, w, g, refs, [3 * float((t.float() - r).abs().max()) + 2e-3 for t, r in zip(t_ref, refs)]


def _error(outs, refs, tols) -> Optional[str]:
    for name, got, want, tol in zip(("y", "dx", "dW"), outs, refs, tols):
        got = got.float()
        if got.shape != want.shape or not torch.isfinite(got).all():
            return f"{name}: shape {tuple(got.shape)} or non-finite entries"
        err = float((got - want).abs().max())
        if err > tol:
            return f"{name}: max error {err:.3g} > {tol:.3g}"
    return None


def _impls(meta, x, w, g) -> Dict[str, Dict[str, Callable[[], tuple]]]:
    """``{mode: {impl: fn() -> outputs}}`` over the static operands."""
    from fovi_lab.knn_warp import WarpCompactOps, WarpTrainOps
    fwd = {"warp_compact": lambda: (WarpCompactOps.forward(meta, x, w, None),),
           "torch_compact": lambda: (CompactTorchOps.forward(meta, x, w, None),)}
    for name, fn in torch_forwards(meta).items():
        fwd[name] = (lambda f: lambda: (f(x, w),))(fn)
    steps = {"warp_train": lambda: (WarpTrainOps.forward(meta, x, w, None),) + tuple(
                 WarpTrainOps.backward_combined(meta, g, x, w)),
             "torch_compact": lambda: (CompactTorchOps.forward(meta, x, w, None),
                                       CompactTorchOps.grad_input(meta, g, w), CompactTorchOps.grad_weight(meta, g, x))}
    for name, fn in torch_steps(meta).items():
        steps[name] = (lambda f: lambda: f(x, w, g))(fn)

    def new_weight(step):
        """A train step's weight is new every step (an optimiser updates it in place): bump its version, so
        no backend reuses a weight layout cached for the previous values."""
        def run():
            torch.autograd.graph.increment_version(w)
            return step()
        return run
    return {"forward": fwd, "train-step": {k: new_weight(f) for k, f in steps.items()}}


def bench_layer(layer: str, batch: int, device, reps: int = 20, graphs: bool = True) -> List[dict]:
    """Every record of one layer and batch (both dtypes, both modes; see the module docstring)."""
    from fovi_lab.ops.graphs import capture
    device = torch.device(device)
    meta = layer_meta(layer).to(device)
    flops = compact_flops(batch, meta.p64, meta.cout, meta.nout)
    out = []
    for dname, dtype in DTYPES.items():
        x, w, g, refs, tols = checked_operands(meta, batch, dtype, device)
        for mode, impls in _impls(meta, x, w, g).items():
            n_out = 1 if mode == "forward" else 3
            mode_flops = flops * (1 if mode == "forward" else 3)
            for impl, fn in impls.items():
                rec = dict(kind="dtype_bench", layer=layer, B=batch, dtype=dname, mode=mode, impl=impl,
                           flops=mode_flops, ms=None, ms_graph=None, note=None)
                try:
                    why = _error(fn()[:n_out], refs[:n_out], tols[:n_out])
                    if why is not None:
                        rec["note"] = f"wrong: {why}"
                    else:
                        rec["ms"] = time_fn(fn, device, warmup=2, reps=reps).ms
                        if graphs and device.type == "cuda":
                            try:
                                cap = capture(fn)
                                why = _error(cap.replay()[:n_out], refs[:n_out], tols[:n_out])
                                if why is None:
                                    rec["ms_graph"] = time_fn(cap.replay, device, warmup=2, reps=reps).ms
                                else:
                                    rec["note"] = f"replay wrong: {why}"
                                del cap
                            except Exception as exc:  # noqa: BLE001 - record, keep measuring
                                rec["note"] = f"capture: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
                except torch.cuda.OutOfMemoryError:
                    rec["note"] = "out of memory"
                except Exception as exc:  # noqa: BLE001 - one failing implementation must not end the run
                    rec["note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                for key in ("ms", "ms_graph"):
                    rec["tflops" + key[2:]] = None if rec[key] is None else mode_flops / rec[key] / 1e9
                out.append(rec)
    return out


def _best(recs, dtype, mode, key, warp: bool) -> Optional[dict]:
    rows = [r for r in recs if r["dtype"] == dtype and r["mode"] == mode and r[key] is not None
            and r["impl"].startswith("warp_") == warp]
    return min(rows, key=lambda r: r[key]) if rows else None


def summary_lines(recs: List[dict]) -> List[str]:
    """Per (layer, B, mode, timing): Warp bf16 / fp16 time, and PyTorch's fastest / ours in each dtype."""
    lines = []
    keys = sorted({(r["layer"], r["B"], r["mode"]) for r in recs}, key=lambda k: (k[2], k[0], k[1]))
    for layer, b, mode in keys:
        rows = [r for r in recs if (r["layer"], r["B"], r["mode"]) == (layer, b, mode)]
        for key, label in (("ms", "eager"), ("ms_graph", "replayed")):
            ours = {d: _best(rows, d, mode, key, True) for d in DTYPES}
            theirs = {d: _best(rows, d, mode, key, False) for d in DTYPES}
            if not all(ours.values()):
                continue
            parts = [f"{mode:<10s} {layer:<15s} B={b:<4d} {label:<8s}",
                     f"bf16/fp16 {ours['bf16'][key] / ours['fp16'][key]:.2f}"]
            for d in DTYPES:
                t = theirs[d]
                if t is not None:
                    parts.append(f"{d}: ours {ours[d][key]:.3f} ms, {t['impl']} {t[key]:.3f} ms "
                                 f"({t[key] / ours[d][key]:.2f}x)")
            lines.append("  ".join(parts))
    return lines


#: The help text of ``python -m fovi_lab bench dtypes``.
DESCRIPTION = """\
bf16 beside fp16, each beside PyTorch's fastest op in the same dtype: the forward and the train step.

Per layer, batch and dtype, each implementation (warp_compact and warp_train against the PyTorch forwards and
train steps) runs once and is checked against the fp32 oracle on the same rounded operands, then is timed one call
at a time and replayed from a CUDA graph. The summary prints, per layer and batch, bf16's time over fp16's for the
Warp backends and each dtype's ratio of PyTorch's fastest time to ours; --out appends the records as JSON lines.

  python -m fovi_lab bench dtypes --layers res18_layer1 alex_L1 --batches 16 64 --out dtypes.jsonl
"""


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab bench dtypes``, each checked as it is parsed."""
    from fovi_lab.ops.arguments import COUNT, LayersAction, add_device_option, add_out_option, layer_names

    parser.add_argument("--layers", nargs="+", type=layer_names(), action=LayersAction, default=list(LAYERS),
                        metavar="LAYER", help="layer names, or all (default: every layer of the table)")
    parser.add_argument("--batches", nargs="+", type=COUNT, default=[16, 64], metavar="B",
                        help="batch sizes to time on each layer")
    parser.add_argument("--reps", type=COUNT, default=20, help="timed calls per implementation, whose median is kept")
    parser.add_argument("--no-graphs", dest="graphs", action="store_false", help="skip the CUDA-graph replays")
    add_device_option(parser)
    add_out_option(parser, "the summary is printed")


def run(args) -> int:
    """Run the dtype benchmark as ``args`` say (the options of :func:`add_arguments`); returns 0."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    env = env_info(device)
    recs = []
    for layer in args.layers:
        for b in args.batches:
            rows = [dict(env, **r) for r in bench_layer(layer, b, device, args.reps, args.graphs)]
            for r in rows:
                if r["note"]:
                    print(f"  {layer} B={b} {r['dtype']} {r['mode']} {r['impl']}: {r['note']}", flush=True)
            recs += rows
            if args.out:
                append_jsonl(args.out, rows)
            print("\n".join(summary_lines(rows)), flush=True)
    if args.out and recs:
        print(f"{len(recs)} records appended to {os.path.abspath(args.out)}", flush=True)
    return 0


main = command_main("python -m fovi_lab bench dtypes", DESCRIPTION, add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
