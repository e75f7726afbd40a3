"""Where the host time of a replayed eager step goes: per ``layer:B``, the wall time per step back to back, the
same with each piece alone (the signature, a copy in, the graph's replay, a copy out), and cProfile's top
functions over the steps.

    python tools/gpu/replay_host_profile.py res18_layer4_0:16 res18_layer1:64 [--steps 300] [--out F]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time

import torch

from fovi_lab.bench.common import env_info
from fovi_lab.graph.layers import layer_meta
from fovi_lab.knn_warp import WarpTrainOps
from fovi_lab import settings
from fovi_lab.ops import replay


def per_call_us(fn, n):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t0) * 1e6 / n
    torch.cuda.synchronize()
    return host, (time.perf_counter() - t0) * 1e6 / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="+")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    env = dict(env_info(torch.device("cuda")), commit=os.environ.get("FOVI_COMMIT"),
               command="python tools/gpu/replay_host_profile.py " + " ".join(sys.argv[1:]))
    out = []
    for shape in args.shapes:
        layer, b = shape.split(":")
        b = int(b)
        meta = layer_meta(layer, device="cuda")
        x = torch.randn(b, meta.cin, meta.nin, device="cuda").half()
        w = (torch.randn(meta.cout, meta.q, device="cuda") * 0.01).half()
        g = torch.randn(b, meta.cout, meta.nout, device="cuda").half()

        def step():
            torch.autograd.graph.increment_version(w)
            return (WarpTrainOps.forward(meta, x, w, None),) + tuple(WarpTrainOps.backward_combined(meta, g, x, w))

        rec = dict(env, kind="replay_host_profile", layer=layer, B=b, steps=args.steps)
        rec["step_host_us"], rec["step_wall_us"] = per_call_us(step, args.steps)
        os.environ["FOVI_KNN_REPLAY"] = "off"
        rec["direct_host_us"], rec["direct_wall_us"] = per_call_us(step, args.steps)
        os.environ.pop("FOVI_KNN_REPLAY")
        entries = [e for e in replay._entries.values() if e.step is not None and e.meta is meta]
        if entries:
            e = entries[-1]
            rec["graph_replay_us"] = per_call_us(e.step.graph.replay, args.steps)[0]
            s = next(t for t in e.static if t is not None)
            rec["copy_in_us"] = per_call_us(lambda: s.copy_(s), args.steps)[0]
            o = e.step.outputs[0]
            rec["clone_out_us"] = per_call_us(lambda: o.clone(), args.steps)[0]
        rec["switches_us"] = per_call_us(settings.snapshot, args.steps)[0]
        rec["capturing_check_us"] = per_call_us(torch.cuda.is_current_stream_capturing, args.steps)[0]
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(args.steps):
            step()
        pr.disable()
        torch.cuda.synchronize()
        buf = io.StringIO()
        pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(30)
        rec["profile_top"] = buf.getvalue()
        print(json.dumps({k: v for k, v in rec.items() if k.endswith("_us")}, indent=1))
        print(rec["profile_top"])
        out.append(rec)
    if args.out:
        with open(args.out, "a") as fh:
            for r in out:
                fh.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
