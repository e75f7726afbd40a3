"""Kernel-level profile of train steps or forwards (torch.profiler / CUPTI: Warp's launches on torch's stream are
captured too).

    OUT=<dir> python tools/h200/profile_step.py alex_L0:64 res18_layer4_0:512 [--forward] [--reps 10]

For each ``layer:B`` target: the CUDA kernels of ``reps`` warp_train steps (forward + backward_combined, the
weight's version bumped each step) and of the same steps of torch autograd through the transposed gather + bmm,
per kernel name: calls, total and mean GPU time; with ``--forward`` the forward op alone (``warp_train``'s
forward against the transposed gather + bmm). Prints the configs the rules pick and writes
``$OUT/profile_<layer>_<B>[_fwd].txt``."""
import argparse
import os

import torch
from torch.profiler import ProfilerActivity, profile

from fovi_lab.bench.backward_impls import torch_forwards
from fovi_lab.graph.layers import layer_meta
from fovi_lab.kernels.common import init_warp
from fovi_lab.knn_warp import WarpTrainOps


def _profile(name, fn, reps):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    lines = [prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70)]
    ev = [e for e in prof.events() if e.device_type.name == "CUDA"]
    if ev:
        t0 = min(e.time_range.start for e in ev)
        t1 = max(e.time_range.end for e in ev)
        busy = sum(e.time_range.end - e.time_range.start for e in ev)
        lines.append(f"{name}: GPU span {(t1 - t0) / reps / 1e3:.4f} ms/call, kernels busy "
                     f"{busy / reps / 1e3:.4f} ms/call")
    return "\n".join(lines)


def profile_target(layer: str, b: int, reps: int, forward_only: bool) -> str:
    from fovi_lab.kernels import forward as F
    from fovi_lab.kernels.adjoint.as_forward import select_grad_mma
    from fovi_lab.knn_warp import grad_paths
    torch.manual_seed(0)
    meta = layer_meta(layer, device="cuda")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(b, meta.cin, meta.nin, generator=g).cuda().half()
    w = (0.05 * torch.randn(meta.cout, meta.q, generator=g)).cuda().half()
    gy = torch.randn(b, meta.cout, meta.nout, generator=g).cuda().half()
    node_major = F.analyse_tables(meta.input_linear, meta.weight_linear, meta.cin, meta.nin, meta.q).nm is not None
    head = (f"=== {layer} B={b}: forward pick "
            f"{F.select_config(b, meta.cout, meta.nout, meta.p64, in_channels=meta.cin, node_major=node_major, q=meta.q)}"
            f", grad paths {grad_paths(meta, b, torch.float16)}, grad mma {select_grad_mma(meta, b)}")

    def warp_step():
        torch.autograd.graph.increment_version(w)
        WarpTrainOps.forward(meta, x, w, None)
        if not forward_only:
            WarpTrainOps.backward_combined(meta, gy, x, w)

    fwd = torch_forwards(meta)["tgather_bmm"]
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()

    def torch_step():
        if forward_only:
            with torch.no_grad():
                fwd(xr, wr)
        else:
            torch.autograd.grad(fwd(xr, wr), (xr, wr), gy)

    out = [head]
    for name, fn in (("warp_train", warp_step), ("torch_tgather_bmm", torch_step)):
        out.append(f"--- {name}, {reps} {'forwards' if forward_only else 'steps'}")
        out.append(_profile(name, fn, reps))
    return "\n".join(out)


def transpose_probe(reps: int = 20) -> str:
    """GPU time of the x -> x^T layout copy (``x [B, R]`` fp16 to ``[R, B]``): PyTorch's strided copy against
    :func:`fovi_lab.kernels.layout.transpose_into`, both checked equal."""
    from fovi_lab.kernels.layout import transpose_into

    def timed(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(reps):
            fn()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / reps

    out = ["=== x^T copy [B, R] -> [R, B] fp16: PyTorch's copy_ of the transposed view vs the layout kernel"]
    for b, r in ((512, 96 * 964), (512, 256 * 230), (512, 256 * 60), (64, 256 * 60), (512, 256 * 16), (16, 96 * 964)):
        x = torch.randn(b, r, device="cuda", dtype=torch.float16)
        xt = torch.empty(r, b, device="cuda", dtype=torch.float16)
        xt2 = torch.empty(r, b, device="cuda", dtype=torch.float16)
        t_torch = timed(lambda: xt.copy_(x.t()))
        t_ours = timed(lambda: transpose_into(x, xt2))
        gb = 2 * x.numel() * 2 / 1e9
        out.append(f"B={b} R={r}: torch {t_torch:.4f} ms ({gb / t_torch * 1e3:.0f} GB/s), layout kernel {t_ours:.4f} ms "
                   f"({gb / t_ours * 1e3:.0f} GB/s), equal {torch.equal(xt, xt2)}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="+", help="layer:B")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--forward", action="store_true", help="the forward op alone")
    ap.add_argument("--transpose", action="store_true", help="also time the x^T layout copy")
    args = ap.parse_args()
    init_warp()
    texts = []
    for t in args.targets:
        layer, b = t.split(":")
        text = profile_target(layer, int(b), args.reps, args.forward)
        print(text, flush=True)
        texts.append(text)
        with open(os.path.join(os.environ.get("OUT", "."),
                               f"profile_{layer}_{b}{'_fwd' if args.forward else ''}.txt"), "w") as f:
            f.write(text)
    if args.transpose:
        print(transpose_probe(), flush=True)


if __name__ == "__main__":
    main()
