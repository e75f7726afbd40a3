"""Kernel-level profile of train steps or forwards (torch.profiler / CUPTI: Warp's launches on torch's stream are
captured too).

    OUT=<dir> python tools/gpu/profile_step.py alex_L0:64 res18_layer4_0:512 [--forward] [--reps 10]

For each ``layer:B`` target: the CUDA kernels of ``reps`` warp_train steps (forward + backward_combined, the
weight's version bumped each step) and of the same steps of torch autograd through the transposed gather + bmm,
per kernel name: calls, total and mean GPU time (``--baseline binned_mm``: PyTorch's binned form instead); with ``--forward`` the forward op alone (``warp_train``'s
forward against the transposed gather + bmm). Prints the configs the rules pick and writes
``$OUT/profile_<layer>_<B>[_fwd].txt``."""
import argparse
import datetime
import json
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


def profile_target(layer: str, b: int, reps: int, forward_only: bool, baseline: str = "tgather_bmm") -> str:
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

    fwd = torch_forwards(meta)[baseline]
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()

    def torch_step():
        if forward_only:
            with torch.no_grad():
                fwd(xr, wr)
        else:
            torch.autograd.grad(fwd(xr, wr), (xr, wr), gy)

    out = [head]
    for name, fn in (("warp_train", warp_step), (f"torch_{baseline}", torch_step)):
        out.append(f"--- {name}, {reps} {'forwards' if forward_only else 'steps'}")
        out.append(_profile(name, fn, reps))
    return "\n".join(out)


def transpose_probe(reps: int = 20) -> str:
    """GPU time of the layout copies a step makes, replayed from a CUDA graph of ``reps`` copies (no host time):
    PyTorch's strided copy against :func:`fovi_lab.kernels.layout.swap_axes_into`, both checked equal."""
    from fovi_lab.kernels.layout import swap_axes_into

    def replayed(fn):
        fn()
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            fn()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                for _ in range(reps):
                    fn()
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(5):
            g.replay()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / (5 * reps)

    out = ["=== layout copies src [A, R, C] -> [C, R, A], replayed (GPU time per copy): PyTorch's copy_ vs the kernel"]
    records = []
    cases = [((512, 1, 4096), torch.float16), ((512, 1, 7680), torch.float16), ((512, 1, 14720), torch.float16),
             ((512, 1, 58880), torch.float16), ((512, 1, 92544), torch.float16), ((64, 1, 92544), torch.float16),
             ((16, 1, 92544), torch.float16), ((64, 1, 15360), torch.float16), ((512, 1, 2304), torch.float16),
             ((384, 1, 3456), torch.float16), ((512, 256, 16), torch.float16), ((512, 128, 60), torch.float16),
             ((512, 64, 230), torch.float16), ((16, 384, 60), torch.float16), ((64, 256, 60), torch.float16),
             ((16, 512, 256), torch.float32), ((60, 512, 128), torch.float32)]
    for shape, dtype in cases:
        src = torch.randn(*shape, device="cuda").to(dtype)
        a, r, c = shape
        o1 = torch.empty(c, r, a, device="cuda", dtype=dtype)
        o2 = torch.empty(c, r, a, device="cuda", dtype=dtype)
        t_torch = replayed(lambda: o1.copy_(src.permute(2, 1, 0)))
        t_ours = replayed(lambda: swap_axes_into(src, o2))
        mb = 2 * src.numel() * src.element_size() / 1e6
        records.append(dict(kind="layout_copy", shape=list(shape), dtype=str(dtype)[6:], mb=mb / 2, torch_us=t_torch * 1e3,
                            kernel_us=t_ours * 1e3, equal=torch.equal(o1, o2), reps=reps, dispatch="rule",
                            **_provenance()))
        out.append(f"{str(list(shape)):18s} {str(dtype)[6:]:8s} {mb / 2:7.1f} MB: torch {t_torch * 1e3:7.1f} us "
                   f"({mb / t_torch / 1e3:5.2f} TB/s), kernel {t_ours * 1e3:7.1f} us ({mb / t_ours / 1e3:5.2f} TB/s), "
                   f"x{t_torch / t_ours:.2f}, equal {torch.equal(o1, o2)}")
    with open(os.path.join(os.environ.get("OUT", "."), "layout_copies.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    return "\n".join(out)


def _provenance() -> dict:
    """device, versions, date and commit of a record (the commit from ``FOVI_COMMIT``: the device has no git)."""
    import platform
    import warp as wp
    return dict(device=torch.cuda.get_device_name(), warp=wp.config.version, torch=torch.__version__,
                cuda=torch.version.cuda, python=platform.python_version(), commit=os.environ.get("FOVI_COMMIT"),
                date=_START, command="python tools/gpu/profile_step.py ... --transpose")


_START = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="+", help="layer:B")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--forward", action="store_true", help="the forward op alone")
    ap.add_argument("--transpose", action="store_true", help="also time the layout copies")
    ap.add_argument("--grad-mma", action="store_true",
                    help="both gradients on the rule's tensor-core config whatever the work, batch and padding")
    ap.add_argument("--baseline", default="tgather_bmm", choices=("tgather_bmm", "gather_bmm", "binned_mm"),
                    help="the PyTorch autograd forward profiled beside warp_train")
    args = ap.parse_args()
    init_warp()
    if args.grad_mma:
        from fovi_lab.kernels.adjoint import as_forward
        as_forward.MMA_GRAD_MIN_GFLOP, as_forward.MMA_GRAD_MAX_PADDING = 0.0, float("inf")
        as_forward.MMA_GRAD_MIN_BATCH = 1
    texts = []
    for t in args.targets:
        layer, b = t.split(":")
        text = profile_target(layer, int(b), args.reps, args.forward, args.baseline)
        print(text, flush=True)
        texts.append(text)
        with open(os.path.join(os.environ.get("OUT", "."),
                               f"profile_{layer}_{b}{'_fwd' if args.forward else ''}.txt"), "w") as f:
            f.write(text)
    if args.transpose:
        print(transpose_probe(), flush=True)


if __name__ == "__main__":
    main()
