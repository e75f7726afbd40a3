"""Where the host time of one eager warp_train step goes (cProfile), per layer and batch.

``OUT=<dir> python tools/gpu/host_profile_step.py alex_L0 64 [reps]``: per-call host issue time of the
forward, grad_input, grad_weight and the whole step (no sync inside the loop), then a cProfile of ``reps``
steps sorted by own time and by cumulative time (written to ``$OUT/host_profile_<layer>_<B>.txt``).
"""
import cProfile
import io
import os
import pstats
import sys
import time

import torch

from fovi_lab.knn_warp import WarpTrainOps
from fovi_lab.graph.layers import layer_meta

layer, b = sys.argv[1], int(sys.argv[2])
reps = int(sys.argv[3]) if len(sys.argv) > 3 else 100
dev = torch.device("cuda")
meta = layer_meta(layer, "rf2", device=dev)
g0 = torch.Generator().manual_seed(0)
x = torch.randn(b, meta.cin, meta.nin, generator=g0).to(dev, torch.float16)
w = (0.02 * torch.randn(meta.cout, meta.q, generator=g0)).to(dev, torch.float16)
g = torch.randn(b, meta.cout, meta.nout, generator=g0).to(dev, torch.float16)


def step():
    torch.autograd.graph.increment_version(w)
    return (WarpTrainOps.forward(meta, x, w, None),) + tuple(WarpTrainOps.backward_combined(meta, g, x, w))


def issue_ms(fn, n=reps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e3, (time.perf_counter() - t0) / n * 1e3


for _ in range(5):
    step()
lines = [f"{layer} B={b}: host issue / pipelined ms per call"]
for label, fn in (("forward", lambda: WarpTrainOps.forward(meta, x, w, None)),
                  ("grad_input", lambda: WarpTrainOps.grad_input(meta, g, w)),
                  ("grad_weight", lambda: WarpTrainOps.grad_weight(meta, g, x)),
                  ("step", step)):
    a, p = issue_ms(fn)
    lines.append(f"  {label:12s} issue {a:.3f}  pipelined {p:.3f}")
pr = cProfile.Profile()
pr.enable()
for _ in range(reps):
    step()
pr.disable()
torch.cuda.synchronize()
for key in ("tottime", "cumtime"):
    sio = io.StringIO()
    pstats.Stats(pr, stream=sio).sort_stats(key).print_stats(40)
    lines.append(f"---- cProfile of {reps} steps by {key}\n" + "\n".join(sio.getvalue().splitlines()[6:50]))
text = "\n".join(lines)
print(text)
with open(os.path.join(os.environ.get("OUT", "."), f"host_profile_{layer}_{b}.txt"), "w") as f:
    f.write(text + "\n")
