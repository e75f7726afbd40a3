"""Kernel-level profile of one train step (torch.profiler / CUPTI: Warp's launches on torch's stream are
captured too). ``OUT=<dir> python tools/h200/profile_step.py alex_L0 64``: prints the CUDA kernels of
``reps`` warp_train steps (forward + backward_combined) and of the same steps of torch autograd through the
transposed gather + bmm, per kernel name: calls, total and mean GPU time; writes ``$OUT/profile_<layer>_<B>.txt``."""
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from fovi_lab.bench.backward_impls import torch_forwards
from fovi_lab.knn_warp import WarpTrainOps
from fovi_lab.graph.layers import layer_meta
from fovi_lab.kernels.common import init_warp


def main():
    layer, b = sys.argv[1], int(sys.argv[2])
    reps = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    init_warp()
    torch.manual_seed(0)
    meta = layer_meta(layer, device="cuda")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, meta.cin, meta.nin, generator=g).cuda().half()
    w = (0.05 * torch.randn(meta.cout, meta.q, generator=g)).cuda().half()
    gy = torch.randn(b, meta.cout, meta.nout, generator=g).cuda().half()

    def warp_step():
        torch.autograd.graph.increment_version(w)
        WarpTrainOps.forward(meta, x, w, None)
        WarpTrainOps.backward_combined(meta, gy, x, w)

    fwd = torch_forwards(meta)["tgather_bmm"]
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()

    def torch_step():
        torch.autograd.grad(fwd(xr, wr), (xr, wr), gy)

    out = []
    for name, fn in (("warp_train", warp_step), ("torch_autograd_tgather_bmm", torch_step)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                fn()
            torch.cuda.synchronize()
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)
        out.append(f"=== {layer} B={b} {name}, {reps} steps\n{table}")
        ev = [e for e in prof.events() if e.device_type.name == "CUDA"] if hasattr(prof, "events") else []
        if ev:
            t0 = min(e.time_range.start for e in ev)
            t1 = max(e.time_range.end for e in ev)
            busy = sum(e.time_range.end - e.time_range.start for e in ev)
            out.append(f"{name}: GPU span {(t1 - t0) / reps / 1e3:.3f} ms/step, kernels busy {busy / reps / 1e3:.3f} ms/step")
    text = "\n".join(out)
    print(text)
    with open(os.path.join(os.environ.get("OUT", "."), f"profile_{layer}_{b}.txt"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
