"""Eager calls with the backends' own graph replay (``FOVI_KNN_REPLAY=auto``, :mod:`fovi_lab.ops.replay`) beside the
direct calls (``off``) and every PyTorch form of the same op, interleaved: each implementation of a shape is timed
once per round, rounds alternate, the median over rounds is kept (at 0.1-1 ms per call the host's drift between
runs is as large as the effects). Outputs are checked first: the replayed ones bitwise against the direct ones,
all against the fp32 oracle within 3x ``torch_compact``'s error + 2e-3.

    python tools/gpu/replay_ab.py --mode train-step --layers ... --batches 16 64 [--rounds 5] [--out F]
    python tools/gpu/replay_ab.py --mode forward --batches 1 4 16 64

Train steps bump the weight's version every step (as an optimiser's in-place update does); forwards keep it
(inference: PyTorch's ``cached_bmm`` reuses its effective weight, the Warp forward its weight layout).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from fovi_lab.bench.backward_impls import torch_forwards, torch_steps
from fovi_lab.bench.common import append_jsonl, compact_flops, env_info, pipelined_ms, time_fn, tflops
from fovi_lab.bench.dtypes import _error, checked_operands
from fovi_lab.bench.forward import torch_baselines
from fovi_lab.graph.layers import LAYERS, layer_meta
from fovi_lab.ops.reference import BinnedTorchOps, CompactTorchOps, build_effective_weight


def _with_replay(mode: str, fn):
    def run():
        old = os.environ.get("FOVI_KNN_REPLAY")
        os.environ["FOVI_KNN_REPLAY"] = mode
        try:
            return fn()
        finally:
            if old is None:
                os.environ.pop("FOVI_KNN_REPLAY", None)
            else:
                os.environ["FOVI_KNN_REPLAY"] = old
    return run


def impls(meta, x, w, g, mode, replay="auto"):
    from fovi_lab.knn_warp import WarpCompactOps, WarpTrainOps
    if mode == "forward":
        fns = {"warp_compact": lambda: (WarpCompactOps.forward(meta, x, w, None),)}
        weff = build_effective_weight(meta, w, cout_multiple=8)
        for name, f in torch_baselines(meta, w, weff).items():
            fns[name] = (lambda f: lambda: (f(x, None),))(f)
        fns["torch_binned"] = lambda: (BinnedTorchOps.forward(meta, x, w, None),)
    else:
        fns = {"warp_train": lambda: (WarpTrainOps.forward(meta, x, w, None),) + tuple(
            WarpTrainOps.backward_combined(meta, g, x, w))}
        for name, ops in (("torch_compact", CompactTorchOps), ("torch_binned", BinnedTorchOps)):
            fns[name] = (lambda o: lambda: (o.forward(meta, x, w, None), o.grad_input(meta, g, w),
                                            o.grad_weight(meta, g, x)))(ops)
        for name, f in torch_steps(meta).items():
            fns["torch_" + name] = (lambda f: lambda: f(x, w, g))(f)
        xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        for name, f in torch_forwards(meta).items():
            def autograd(f=f):
                y = f(xr, wr)
                return (y.detach(),) + torch.autograd.grad(y, (xr, wr), g)
            fns["torch_autograd_" + name] = autograd

        def bumped(step):
            def run():
                torch.autograd.graph.increment_version(w)
                torch.autograd.graph.increment_version(wr)
                return step()
            return run
        fns = {k: bumped(f) for k, f in fns.items()}
    warp = next(iter(fns))
    fns[warp + "_direct"] = _with_replay("off", fns[warp])
    fns[warp] = _with_replay(replay, fns[warp])
    return fns, warp


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("train-step", "forward"), default="train-step")
    ap.add_argument("--layers", nargs="*", default=None)
    ap.add_argument("--batches", nargs="+", type=int, default=[16, 64])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--replay", choices=("auto", "on"), default="auto",
                    help="FOVI_KNN_REPLAY of the replayed calls (on: also over the default rule's batch and size)")
    ap.add_argument("--device", default="cuda", help="cuda (cpu: a smoke run of the script itself)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    env = dict(env_info(dev), commit=os.environ.get("FOVI_COMMIT"),
               command="python tools/gpu/replay_ab.py " + " ".join(sys.argv[1:]))
    n_out = 1 if args.mode == "forward" else 3
    for layer in args.layers or list(LAYERS):
        meta = layer_meta(layer).to(dev)
        for b in args.batches:
            x, w, g, refs, tols = checked_operands(meta, b, torch.float16, dev)
            fns, warp = impls(meta, x, w, g, args.mode, args.replay)
            recs, ok = [], {}
            for k, fn in fns.items():
                try:
                    why = _error(fn()[:n_out], refs[:n_out], tols[:n_out])
                except Exception as exc:  # noqa: BLE001 - one failing baseline must not end the run
                    why = f"{type(exc).__name__}: {str(exc)[:200]}"
                if why is None:
                    ok[k] = fn
                else:
                    recs.append(dict(env, kind="replay_ab", mode=args.mode, layer=layer, B=b, impl=k, ms=None,
                                     note=why))
            if warp in ok and warp + "_direct" in ok:
                a, d = fns[warp](), fns[warp + "_direct"]()
                bitwise = all(torch.equal(p, q) for p, q in zip(a[:n_out], d[:n_out]))
            else:
                bitwise = None
            times = {k: [] for k in ok}
            pipes = {k: [] for k in ok}
            for _ in range(args.rounds):
                for k, fn in ok.items():
                    times[k].append(time_fn(fn, dev, warmup=2, reps=args.reps).ms)
                    pipes[k].append(pipelined_ms(fn, dev, warmup=1, reps=args.reps))
            flops = compact_flops(b, meta.p64, meta.cout, meta.nout) * (1 if args.mode == "forward" else 3)
            med = {k: statistics.median(v) for k, v in times.items()}
            pmed = {k: statistics.median(v) for k, v in pipes.items()}
            torch_best = min((k for k in med if k.startswith("torch")), key=med.get, default=None)
            for k in ok:
                r = dict(env, kind="replay_ab", mode=args.mode, layer=layer, B=b, impl=k, ms=med[k],
                         pipelined_ms=pmed[k], tflops=tflops(flops, med[k]), rounds=args.rounds, reps=args.reps,
                         ms_rounds=times[k], flops=flops, weight_version_bumped=args.mode == "train-step",
                         replay="off" if k.endswith("_direct") else args.replay if k.startswith("warp") else None)
                if k.startswith("warp"):
                    r["bitwise_equal_direct"] = bitwise
                    if torch_best:
                        r.update(strongest=torch_best, speedup_vs_strongest=med[torch_best] / med[k])
                recs.append(r)
            if torch_best and warp in med:
                print(f"{args.mode:<10s} {layer:<15s} B={b:<4d} {warp} replayed {med[warp]:.3f} ms "
                      f"(back to back {pmed[warp]:.3f}), direct {med.get(warp + '_direct', float('nan')):.3f} ms, "
                      f"PyTorch fastest {torch_best} {med[torch_best]:.3f} ms -> {med[torch_best] / med[warp]:.2f}x, "
                      f"bitwise {bitwise}", flush=True)
            if args.out:
                append_jsonl(args.out, recs)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
