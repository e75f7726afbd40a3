"""The tensor-core adjoints beside the fused / staged ones and PyTorch's fastest step, in one run.

For each layer and batch (fp16 operands, the fp32 oracle's gradients checked first, within the tolerances of
``bench dtypes``), this times

- ``dx``: the fused node-major or staged kernels (:func:`fovi_lab.knn_warp.grad_path`) and the tensor-core
  forward of the transposed layer under its default config (``mma_default``: the rule's where it takes the
  tensor cores) and every split config;
- ``dW``: the same for the tap layer's forward;
- the train step (y, dx, dW): ``warp_train`` on its rule, on the tensor cores for both gradients
  (``FOVI_KNN_DX_PATH=mma FOVI_KNN_DW_PATH=mma``), on the fastest of each gradient measured here, and every
  PyTorch step of ``bench dtypes``; eager (median over interleaved rounds) and replayed from a CUDA graph.

Each kernel's gradient is also computed twice and compared bit for bit. Records (``kind = "adjoint_paths"``)
carry ``what`` (dx, dW, step), ``impl``, ``ms`` / ``ms_graph``, ``tflops`` (useful FLOPs: ``2 B P64 Cout Nout``
per gradient), ``bitwise`` and ``note`` (why a candidate did not run).

    python -m fovi_lab bench adjoints [--layers ...] [--batches 16 64 512] [--rounds 3] [--reps 20] [--out F]
                                      [--shape-timeout S]
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Callable, Dict, List

import torch

import fovi_lab.settings as settings
from fovi_lab.bench.backward_impls import torch_steps
from fovi_lab.bench.common import append_jsonl, compact_flops, env_info, time_fn
from fovi_lab.bench.dtypes import _error, checked_operands
from fovi_lab.graph.layers import LAYERS, layer_meta

_SWITCHES = ("FOVI_KNN_DX_PATH", "FOVI_KNN_DW_PATH", "FOVI_KNN_GRAD_PATH")


def split_configs() -> List[str]:
    """The split tensor-core forward configs (fp32 output): the candidates for both adjoints."""
    from fovi_lab.kernels import forward as F
    from fovi_lab.kernels.families.registry import family
    return [n for n in F.uncached_config_names() if family(F.config_spec(n).variant).fp32_output(F.config_spec(n))]


def _candidates(meta, x, w, g) -> Dict[str, Dict[str, Callable[[], torch.Tensor]]]:
    from fovi_lab.kernels.adjoint.as_forward import grad_input_mma, grad_weight_mma
    from fovi_lab.knn_warp import grad_input_kernels, grad_path, grad_weight_kernels
    kernels = grad_path(meta)
    dx = {f"warp_{kernels}": lambda: grad_input_kernels(meta, g, w),
          "mma_default": lambda: grad_input_mma(meta, g, w)}
    dw = {f"warp_{kernels}": lambda: grad_weight_kernels(meta, g, x),
          "mma_default": lambda: grad_weight_mma(meta, g, x)}
    for c in split_configs():
        dx[f"mma:{c}"] = (lambda c: lambda: grad_input_mma(meta, g, w, c))(c)
        dw[f"mma:{c}"] = (lambda c: lambda: grad_weight_mma(meta, g, x, c))(c)
    return {"dx": dx, "dW": dw}


def _usable(fn, ref, tol) -> tuple:
    """``(note, bitwise)``: note None when ``fn`` runs and matches the oracle; bitwise: two calls equal."""
    try:
        a = fn()
        why = _error((a,), (ref,), (tol,))
        if why is not None:
            return why, None
        return None, bool(torch.equal(a, fn()))
    except Exception as exc:  # a config that cannot launch here, a table over its budget: recorded, not fatal
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}", None


def _log(msg: str) -> None:
    if settings.get("FOVI_BENCH_VERBOSE"):
        print("# " + msg, file=sys.stderr, flush=True)


def _time_interleaved(fns: dict, device, rounds: int, reps: int, flops: float) -> None:
    """``rec["ms"]`` (median over ``rounds`` interleaved rounds, so drift hits every candidate alike) and
    ``rec["tflops"]`` for each ``(fn, rec)`` of ``fns``."""
    times = {k: [] for k in fns}
    for _ in range(rounds):
        for k, (fn, _rec) in fns.items():
            times[k].append(time_fn(fn, device, warmup=2, reps=reps).ms)
    for k, (_fn, rec) in fns.items():
        rec["ms"] = statistics.median(times[k])
        rec["tflops"] = flops / rec["ms"] * 1e-9


def bench_shape(layer: str, batch: int, device, rounds: int, reps: int, graphs: bool) -> List[dict]:
    from fovi_lab.knn_warp import WarpTrainOps
    from fovi_lab.ops.graphs import capture
    from fovi_lab.ops.reference import CompactTorchOps
    meta = layer_meta(layer).to(device)
    flops = compact_flops(batch, meta.p64, meta.cout, meta.nout)
    x, w, g, refs, tols = checked_operands(meta, batch, torch.float16, device)
    recs, fns = [], {}
    for what, cands in _candidates(meta, x, w, g).items():
        i = 1 if what == "dx" else 2
        for impl, fn in cands.items():
            note, bitwise = _usable(fn, refs[i], tols[i])
            _log(f"{layer} B={batch} {what} {impl}: {note or 'ok'}")
            rec = dict(kind="adjoint_paths", layer=layer, B=batch, dtype="fp16", what=what, impl=impl,
                       flops=flops, ms=None, ms_graph=None, tflops=None, bitwise=bitwise, note=note)
            recs.append(rec)
            if note is None:
                fns[(what, impl)] = (fn, rec)
    _time_interleaved(fns, device, rounds, reps, flops)
    best = {what: min((rec for (wh, _), (_, rec) in fns.items() if wh == what), key=lambda r: r["ms"],
                      default=None) for what in ("dx", "dW")}

    def bump(step):
        def run():
            torch.autograd.graph.increment_version(w)       # a new weight every step, as an optimiser's
            return step()
        return run
    fwd = lambda: WarpTrainOps.forward(meta, x, w, None)                      # noqa: E731
    steps = {"warp_train": lambda: (fwd(),) + tuple(WarpTrainOps.backward_combined(meta, g, x, w)),
             "torch_compact": lambda: (CompactTorchOps.forward(meta, x, w, None),
                                       CompactTorchOps.grad_input(meta, g, w), CompactTorchOps.grad_weight(meta, g, x))}
    cands = _candidates(meta, x, w, g)
    if ("dx", "mma_default") in fns and ("dW", "mma_default") in fns:
        steps["warp_train_mma"] = lambda: (fwd(), cands["dx"]["mma_default"](), cands["dW"]["mma_default"]())
    if best["dx"] is not None and best["dW"] is not None:
        bx, bw = cands["dx"][best["dx"]["impl"]], cands["dW"][best["dW"]["impl"]]
        steps["warp_train_best"] = lambda: (fwd(), bx(), bw())
    for name, fn in torch_steps(meta).items():
        steps[name] = (lambda f: lambda: f(x, w, g))(fn)
    step_fns = {}
    for impl, step in steps.items():
        step = bump(step)
        rec = dict(kind="adjoint_paths", layer=layer, B=batch, dtype="fp16", what="step", impl=impl,
                   flops=3 * flops, ms=None, ms_graph=None, tflops=None, bitwise=None, note=None,
                   dx_impl=best["dx"]["impl"] if impl == "warp_train_best" else None,
                   dw_impl=best["dW"]["impl"] if impl == "warp_train_best" else None)
        _log(f"{layer} B={batch} step {impl}: checking")
        try:
            rec["note"] = _error(step(), refs, tols)
        except Exception as exc:
            rec["note"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        recs.append(rec)
        if rec["note"] is None:
            step_fns[impl] = (step, rec)
    _time_interleaved(step_fns, device, rounds, reps, 3 * flops)
    for k, (fn, rec) in step_fns.items():
        _log(f"{layer} B={batch} step {k}: {rec['ms']:.3f} ms eager")
        if graphs and torch.device(device).type == "cuda":
            try:
                cap = capture(fn)
                rec["ms_graph"] = time_fn(cap.replay, device, warmup=2, reps=reps).ms
                del cap
                _log(f"{layer} B={batch} step {k}: {rec['ms_graph']:.3f} ms replayed")
            except Exception as exc:
                rec["note"] = f"capture: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return recs


def summary(recs: List[dict]) -> str:
    """One line per shape: each gradient's rule time against its fastest tensor-core config, and the steps."""
    ok = [r for r in recs if r["ms"] is not None]
    layer, b = recs[0]["layer"], recs[0]["B"]
    parts = [f"{layer:<15s} B={b:<4d}"]
    for what in ("dx", "dW"):
        rule = [r for r in ok if r["what"] == what and r["impl"].startswith("warp_")]
        mma = sorted((r for r in ok if r["what"] == what and r["impl"].startswith("mma")), key=lambda r: r["ms"])
        if rule and mma:
            parts.append(f"{what} {rule[0]['impl'][5:]} {rule[0]['ms']:.3f} / mma {mma[0]['ms']:.3f} ms "
                         f"({mma[0]['impl']}, {rule[0]['ms'] / mma[0]['ms']:.2f}x)")
    step = {r["impl"]: r for r in ok if r["what"] == "step"}
    theirs = [r for k, r in step.items() if not k.startswith("warp_")]
    for key, label in (("ms", "eager"), ("ms_graph", "replayed")):
        pt = min((r[key] for r in theirs if r[key] is not None), default=None)
        ours = {k: r[key] for k, r in step.items() if k.startswith("warp_") and r[key] is not None}
        if pt and ours:
            parts.append(f"step {label}: " + " ".join(f"{k[5:] or 'rule'} {v:.3f}" for k, v in ours.items())
                         + f" | PyTorch {pt:.3f} ms")
    return "  ".join(parts)


#: The help text of ``python -m fovi_lab bench adjoints``.
DESCRIPTION = """\
The tensor-core adjoints beside the fused or staged ones and PyTorch's fastest train step, in one run.

For each layer and batch (fp16 operands, each candidate's gradient first checked against the fp32 oracle and
computed twice to compare bit for bit) it times dx and dW on the rule's Warp kernels and on the tensor-core
forward of the transposed and tap layers (the default config and every split config), and the train step:
warp_train on its rule, on the tensor cores for both gradients, on the fastest of each gradient measured here,
and every PyTorch step; eager (the median over interleaved rounds) and replayed from a CUDA graph. --out appends
the records as JSON lines. The benchmark times every path itself, so it refuses to run while one of the
FOVI_KNN_DX_PATH, FOVI_KNN_DW_PATH or FOVI_KNN_GRAD_PATH switches is set.

  python -m fovi_lab bench adjoints --layers res18_layer1 alex_L1 --batches 16 64 --out adjoints.jsonl
"""

PROG = "python -m fovi_lab bench adjoints"


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab bench adjoints``, each checked as it is parsed."""
    from fovi_lab.ops.arguments import (COUNT, LayersAction, add_device_option, add_out_option, layer_names,
                                        positive_float)

    parser.add_argument("--layers", nargs="+", type=layer_names(), action=LayersAction, default=list(LAYERS),
                        metavar="LAYER", help="layer names, or all (default: every layer of the table)")
    parser.add_argument("--batches", nargs="+", type=COUNT, default=[16, 64, 512], metavar="B",
                        help="batch sizes to time on each layer")
    parser.add_argument("--rounds", type=COUNT, default=3, help="interleaved rounds of the eager step timings")
    parser.add_argument("--reps", type=COUNT, default=20, help="timed calls per candidate and round")
    parser.add_argument("--no-graphs", action="store_true", help="skip the CUDA-graph replays")
    add_device_option(parser)
    add_out_option(parser, "the summary is printed")
    parser.add_argument("--shape-timeout", type=positive_float, default=None, metavar="S",
                        help="run each (layer, batch) in its own process, stopped after S seconds: a kernel that "
                             "hangs costs its shape (recorded with a note), not the sweep (default: one process)")


def run(args) -> int:
    """Run the adjoint benchmark as ``args`` say (the options of :func:`add_arguments`; ``args.argv``, the command's
    words when known, goes into the records). Returns 0; a path switch in the environment is a usage error (exit
    status 2)."""
    from fovi_lab.ops.arguments import command_words, usage_error

    for var in _SWITCHES:            # the rule path must be the rule's: no switch may redirect it
        if settings.raw(var):
            usage_error(PROG, f"{var} is set to {settings.raw(var)!r}: unset it (the benchmark times every path "
                              f"itself)")
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    words = command_words(getattr(args, "argv", None), "bench", "adjoints")
    env = dict(env_info(device), command=" ".join([PROG] + words))
    for layer in args.layers:
        for b in args.batches:
            if args.shape_timeout:
                _isolated(layer, b, args, env)
                continue
            recs = [dict(env, **r) for r in bench_shape(layer, b, device, args.rounds, args.reps, not args.no_graphs)]
            print(summary(recs), flush=True)
            if args.out:
                append_jsonl(args.out, recs)
    if args.out:
        print(f"records appended to {os.path.abspath(args.out)}", flush=True)
    return 0


def main(argv=None) -> int:
    """``python -m fovi_lab bench adjoints``: see :data:`DESCRIPTION`. Returns the exit status; a usage error exits
    with status 2."""
    from fovi_lab.ops.arguments import CommandParser

    parser = CommandParser(prog=PROG, description=DESCRIPTION)
    add_arguments(parser)
    args = parser.parse_args(argv)
    args.argv = argv
    return run(args)


def _isolated(layer: str, batch: int, args, env: dict) -> None:
    """One shape in a child process (same options, no ``--shape-timeout``). Past the timeout the child gets
    SIGABRT (its faulthandler prints the Python stack) and a record with ``what = "shape"`` stands for it: the
    last candidate it had checked (its verbose log) in ``note``, the innermost frames in ``stack``."""
    import signal
    import subprocess
    cmd = [sys.executable, "-m", "fovi_lab", "bench", "adjoints", "--layers", layer, "--batches", str(batch),
           "--rounds", str(args.rounds), "--reps", str(args.reps), "--device", args.device]
    cmd += ["--no-graphs"] * args.no_graphs + (["--out", args.out] if args.out else [])
    child = subprocess.Popen(cmd, env=dict(os.environ, FOVI_BENCH_VERBOSE="1", PYTHONFAULTHANDLER="1"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stack = None
    try:
        out, err = child.communicate(timeout=args.shape_timeout)
        sys.stdout.write(out)
        if not child.returncode:
            return
        why = f"exit status {child.returncode}: {(err.strip().splitlines() or [''])[-1][:200]}"
    except subprocess.TimeoutExpired:
        child.send_signal(signal.SIGABRT)
        try:
            out, err = child.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
        last = [ln[2:] for ln in err.splitlines() if ln.startswith("# ")]
        stack = [ln.strip() for ln in err.splitlines() if ln.strip().startswith("File ")][:8]
        why = f"stopped after {args.shape_timeout:g} s; last checked: {last[-1] if last else 'none'}"
    print(f"{layer:<15s} B={batch:<4d}  {why}", flush=True)
    if args.out:
        append_jsonl(args.out, [dict(env, kind="adjoint_paths", layer=layer, B=batch, dtype="fp16", what="shape",
                                     impl=None, ms=None, ms_graph=None, tflops=None, bitwise=None, note=why,
                                     stack=stack)])


if __name__ == "__main__":
    raise SystemExit(main())
