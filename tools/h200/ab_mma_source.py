"""A/B of two ``fovi_lab.kernels.forward.mma`` sources on one lease (session 10, run 61): the same mma configs on the same
layers and batches, each whole op replayed from a CUDA graph, the two sources interleaved round by round (so
clock and lease drift hit both), medians per (layer, B, config, source).

    python tools/h200/ab_mma_source.py --old .device/ab/warp_mma_s9.py --configs mma_o64b16 mmat_o64b16 ...
        --layers res18_layer1 --batches 16 128 --out ab.jsonl

``--old`` is another version of ``fovi_lab/warp_mma.py`` (e.g. ``git show db404c0:fovi_lab/warp_mma.py``), loaded
as ``fovi_lab.kernels.forward.mma`` in place of the package's while its side is timed; the kernel, runner and canary caches
are emptied at each switch so each side builds its own kernels."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import statistics
import sys
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True)
    ap.add_argument("--configs", nargs="+", required=True)
    ap.add_argument("--layers", nargs="+", required=True)
    ap.add_argument("--batches", nargs="+", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--tag", default="ab")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import fovi_lab.kernels.forward.mma as new_mod
    from fovi_lab.kernels import forward as F
    from fovi_lab.kernels.forward import api as fwd_api
    from fovi_lab.kernels.forward import build as fwd_build
    from fovi_lab.bench.common import env_info, time_fn
    from fovi_lab.ops.graphs import capture
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.ops.reference import oracle_forward

    spec = importlib.util.spec_from_file_location("fovi_lab.kernels.forward.mma", args.old)
    old_mod = importlib.util.module_from_spec(spec)
    sources = {"new": new_mod, "old": old_mod}
    sys.modules["fovi_lab.kernels.forward.mma"] = old_mod
    spec.loader.exec_module(old_mod)
    sys.modules["fovi_lab.kernels.forward.mma"] = new_mod
    old_make = old_mod.make_mma_kernel

    def make_old(*a, k_steps=1, **kw):        # the session-9 source has one k-step per iteration only
        if k_steps != 1:
            raise ValueError("the old source has no k_steps")
        return old_make(*a, **kw)
    old_mod.make_mma_kernel = make_old

    def use(side):
        sys.modules["fovi_lab.kernels.forward.mma"] = sources[side]
        fwd_build._KERNELS.clear()
        fwd_api._CALLS.clear()
        F.VALIDATED._store.clear()
        F.VALIDATED._why.clear()

    env = env_info("cuda")
    date = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    times = {}
    g = torch.Generator().manual_seed(5)
    for layer in args.layers:
        meta = layer_meta(layer, "rf2", device="cuda")
        for b in args.batches:
            x = torch.randn(b, meta.cin, meta.nin, generator=g).half().cuda()
            w = (torch.randn(meta.cout, meta.q, generator=g) / math.sqrt(meta.p)).half().cuda()
            bias = torch.randn(meta.cout, generator=g).half().cuda()
            ref = oracle_forward(x, w, bias, meta.idx, meta.rf_index, meta.v)
            for rnd in range(args.rounds):
                for side in (("new", "old") if rnd % 2 == 0 else ("old", "new")):
                    use(side)
                    for cfg in args.configs:
                        fn = lambda cfg=cfg: F.run_uncached(x, w, bias, meta.input_linear, meta.weight_linear,  # noqa: E731
                                                            config=cfg)
                        cap = capture(fn)
                        y = cap.replay()
                        err = float((y.float() - ref).abs().max())
                        t = time_fn(cap.replay, "cuda", warmup=3, reps=args.reps).ms
                        times.setdefault((layer, b, cfg, side), []).append((t, err))
                        del cap
            line = []
            for cfg in args.configs:
                m = {s: statistics.median(v[0] for v in times[(layer, b, cfg, s)]) for s in ("new", "old")}
                line.append(f"{cfg} new {m['new']:.4f} old {m['old']:.4f} x{m['old'] / m['new']:.2f}")
            print(f"{layer} B={b}: " + " | ".join(line), flush=True)
    use("new")
    with open(args.out, "a") as f:
        for (layer, b, cfg, side), v in times.items():
            f.write(json.dumps(dict(env, layer=layer, B=b, config=cfg, source=side, impl="warp_uncached_graphed",
                                    ms=statistics.median(t for t, _ in v), samples=[t for t, _ in v],
                                    err=max(e for _, e in v), tag=args.tag, date=date,
                                    note_run="A/B of the warp_mma source: new = session 10, old = db404c0")) + "\n")


if __name__ == "__main__":
    main()
