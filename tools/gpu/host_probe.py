"""Host-overhead probe on the GPU box: where the per-call host time of the eager ops goes, and whether
CUDA graphs capture the ops (and replay a weight updated in place between replays).

``OUT=<dir> python tools/gpu/host_probe.py``: prints and writes ``$OUT/host_probe.json``.

Per layer and batch: the forward's host issue time (N calls, no sync: what an eager loop pays when the
GPU keeps up) and pipelined time (N calls then one sync); the same split into its parts (the call's
Python + tensor set-up without the launch, the launch alone of an already prepared call, a bare
``torch.empty`` and the node-major copy of x as PyTorch ops); the train step's host issue and pipelined
times (the weight's version bumped per step, as an optimizer's in-place update does); its CUDA-graph
replay, checked against eager and, after an in-place update of the weight, against eager again.
"""
import cProfile
import io
import json
import os
import pstats
import time

import torch

from fovi_lab.kernels import forward as F
from fovi_lab.knn_warp import WarpTrainOps
from fovi_lab.graph.layers import layer_meta

dev = torch.device("cuda")
out = {}


def per_call_ms(fn, n=300, sync=False):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if sync:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e3


for name, b in [("res18_layer1", 16), ("res18_layer1", 64), ("alex_L4", 16), ("alex_L1", 16), ("alex_L0", 64),
                ("res18_stem", 64)]:
    meta = layer_meta(name, "rf2", device=dev)
    g0 = torch.Generator().manual_seed(0)
    x = torch.randn(b, meta.cin, meta.nin, generator=g0).to(dev, torch.float16)
    w = (0.02 * torch.randn(meta.cout, meta.q, generator=g0)).to(dev, torch.float16)
    g = torch.randn(b, meta.cout, meta.nout, generator=g0).to(dev, torch.float16)

    def step():
        torch.autograd.graph.increment_version(w)
        return (WarpTrainOps.forward(meta, x, w, None),) + tuple(WarpTrainOps.backward_combined(meta, g, x, w))

    fwd = lambda: WarpTrainOps.forward(meta, x, w, None)  # noqa: E731
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    rec = {}
    for label, fn in (("fwd", fwd), ("step", step)):
        rec[label] = dict(host_issue_ms=per_call_ms(fn), pipelined_ms=per_call_ms(fn, sync=True))
    il, wl = meta.input_linear, meta.weight_linear
    plan = F.prepare_uncached(x, w, None, il, wl)
    rec["fwd_parts"] = dict(
        prepare_ms=per_call_ms(lambda: F.prepare_uncached(x, w, None, il, wl)),
        launch_only_ms=per_call_ms(plan.launch),
        torch_empty_ms=per_call_ms(lambda: torch.empty(b, meta.cout, meta.nout, dtype=torch.float16, device=dev)),
        torch_permute_copy_ms=per_call_ms(lambda: x.permute(2, 1, 0).contiguous()),
        config=F.resolve_uncached(x, w, None, il, wl)[0].config.name,
    )
    try:
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = step()
        graph.replay()
        torch.cuda.synchronize()
        ref = step()
        torch.cuda.synchronize()
        same = all(torch.equal(a, r) for a, r in zip(outs, ref))
        with torch.no_grad():
            w.mul_(-0.5)                                  # an in-place update between replays
        graph.replay()
        ref2 = step()
        torch.cuda.synchronize()
        same2 = all(torch.equal(a, r) for a, r in zip(outs, ref2))
        rec["graph"] = dict(replay_ms=per_call_ms(graph.replay, sync=True), matches_eager=same,
                            matches_eager_after_inplace_weight_update=same2)
        del graph, outs
    except Exception as exc:  # noqa: BLE001
        rec["graph"] = dict(error=f"{type(exc).__name__}: {str(exc)[:300]}")
    out[f"{name} B={b}"] = rec
    print(name, b, json.dumps(rec), flush=True)
    if (name, b) == ("res18_layer1", 16):
        for label, fn in (("fwd", fwd), ("step", step)):
            pr = cProfile.Profile()
            pr.enable()
            for _ in range(300):
                fn()
            pr.disable()
            torch.cuda.synchronize()
            sio = io.StringIO()
            pstats.Stats(pr, stream=sio).sort_stats("tottime").print_stats(25)
            print(f"---- cProfile {label} (300 calls)\n" + "\n".join(sio.getvalue().splitlines()[6:36]), flush=True)

import warp  # noqa: E402

doc = dict(device=torch.cuda.get_device_name(), warp=warp.config.version, torch=torch.__version__,
           cuda=torch.version.cuda, date=time.strftime("%Y-%m-%d"), script="tools/gpu/host_probe.py",
           note="per-call host issue and pipelined ms of the eager forward and train step (weight version "
                "bumped per step), the forward's parts, and the CUDA-graph replay of the step",
           results=out)
with open(os.path.join(os.environ.get("OUT", "."), "host_probe.json"), "w") as f:
    json.dump(doc, f, indent=1)
