"""Eager one-call times of bf16 beside fp16, interleaved: ``fovi_lab.bench.dtypes`` times each implementation once
in a row, and at 0.05-0.6 ms per call the host's drift between those runs is as large as the effect. Here every
(dtype, mode, implementation) of a shape is timed once per round, rounds alternate, and the median over rounds
is kept (checked against the oracle first, as in the benchmark).

    python tools/gpu/eager_ab.py --shapes res18_layer2_0:16 res18_layer3:16 [--rounds 7] [--reps 30] [--out F]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

from fovi_lab.bench.common import append_jsonl, env_info, time_fn
from fovi_lab.bench.dtypes import DTYPES, _error, _impls, checked_operands
from fovi_lab.graph.layers import layer_meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", required=True, help="layer:B")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)
    env = dict(env_info(dev), commit=os.environ.get("FOVI_COMMIT"),
               command="python tools/gpu/eager_ab.py " + " ".join(sys.argv[1:]))
    recs = []
    for shape in args.shapes:
        layer, b = shape.split(":")
        b = int(b)
        meta = layer_meta(layer).to(dev)
        fns = {}
        for dname, dtype in DTYPES.items():
            x, w, g, refs, tols = checked_operands(meta, b, dtype, dev)
            for mode, impls in _impls(meta, x, w, g).items():
                n = 1 if mode == "forward" else 3
                for impl, fn in impls.items():
                    if _error(fn()[:n], refs[:n], tols[:n]) is None:
                        fns[(dname, mode, impl)] = fn
        times = {k: [] for k in fns}
        for _ in range(args.rounds):
            for k, fn in fns.items():
                times[k].append(time_fn(fn, dev, warmup=2, reps=args.reps).ms)
        for mode in ("forward", "train-step"):
            med = {k: statistics.median(v) for k, v in times.items() if k[1] == mode}
            ours = {d: min(t for (dd, _, i), t in med.items() if dd == d and i.startswith("warp_")) for d in DTYPES}
            theirs = {d: min(t for (dd, _, i), t in med.items() if dd == d and not i.startswith("warp_")) for d in DTYPES}
            print(f"{mode:<10s} {layer:<15s} B={b:<4d} bf16/fp16 {ours['bf16'] / ours['fp16']:.2f}  "
                  + "  ".join(f"{d}: ours {ours[d]:.3f} ms, PyTorch fastest {theirs[d]:.3f} ms "
                              f"({theirs[d] / ours[d]:.2f}x)" for d in DTYPES), flush=True)
            for (d, md, impl), t in med.items():
                recs.append(dict(env, kind="dtype_eager_ab", layer=layer, B=b, dtype=d, mode=md, impl=impl, ms=t,
                                 rounds=args.rounds, reps=args.reps, ms_rounds=times[(d, md, impl)]))
    if args.out:
        append_jsonl(args.out, recs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
