"""``torch.compile`` beside eager: the train step of the foveated digits network (:mod:`fovi_lab.train`) and of a
stack of real fovi layers.

    python -m fovi_lab bench compile [--net digits|stack] [--backends warp_train torch_compact] [--batch 256]
                                     [--dtype fp16|bf16] [--out F.jsonl]

``--net digits``: :class:`fovi_lab.train.FoveatedDigitsNet` (two small KNN layers, GroupNorm, a linear head) on
the digits, cross-entropy. ``--net stack``: :class:`LayerStack`, AlexNet's foveated L2 -> L3 -> L4 (Cin 256 ->
384 -> 384 -> 256 on 60 nodes, GELU between) under autocast in ``--dtype`` with fp32 master weights, loss the
mean square of the output: there the KNN layers are most of the GPU time.

Per backend, one record each for the eager step and the compiled one (``torch.compile(model)``, Inductor,
``fullgraph=True``: the KNN layers are the custom ops of :mod:`fovi_lab.ops.library`): the step (forward,
loss, backward, Adam) timed back to back (``ms``: wall time per step of a loop with one synchronisation at the
end) and one at a time (``ms_one``: CUDA events, median); ``compile_s``: the wall time of the compiled model's
first forward and first train step (compiling forward + backward); ``max_out_diff``: the largest difference of
the compiled model's output from eager's on one batch, from the training graph's forward. Records carry device, versions, date, commit and command.
"""

from __future__ import annotations

import os
import time

import torch
import torch.nn.functional as F

from fovi_lab.bench.common import append_jsonl, env_info, pipelined_ms, time_fn
from fovi_lab.graph.layers import layer_meta
from fovi_lab.ops.arguments import command_main
from fovi_lab.ops.autograd import KNNConv
from fovi_lab.train import FoveatedDigitsNet, load_digits_tensors

__all__ = ["LayerStack", "bench_compile", "train_step", "main", "add_arguments", "run", "DESCRIPTION"]

STACK_LAYERS = ("alex_L2", "alex_L3", "alex_L4")
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class LayerStack(torch.nn.Module):
    """Real fovi layers in a row, GELU between: ``x [B, Cin_0, N] -> [B, Cout_last, N]``, each layer computing in
    ``dtype`` under autocast (fp32 master weights)."""

    def __init__(self, layers=STACK_LAYERS, backend: str = "warp_train", dtype=torch.float16):
        super().__init__()
        metas = [layer_meta(n) for n in layers]
        for a, b in zip(metas, metas[1:]):
            if (a.cout, a.nout) != (b.cin, b.nin):
                raise ValueError(f"layers: {layers} do not chain ([Cout, Nout] of one = [Cin, Nin] of the next)")
        self.convs = torch.nn.ModuleList(
            KNNConv(m.idx, m.rf_index, nin=m.nin, v=m.v, cin=m.cin, cout=m.cout, bias=True, backend=backend)
            for m in metas)
        self.dtype = dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, dtype=self.dtype):
            for i, conv in enumerate(self.convs):
                x = conv(x if i == 0 else F.gelu(x))
        return x.float()


def _problem(net: str, backend: str, batch: int, device, dtype):
    """``(model factory, inputs, loss(out))`` of one network."""
    if net == "digits":
        xtr, ytr, _, _ = load_digits_tensors(seed=0)
        images, labels = xtr[:batch].to(device), ytr[:batch].to(device)
        return (lambda: FoveatedDigitsNet(backend=backend)), images, (lambda out: F.cross_entropy(out, labels))
    m0 = layer_meta(STACK_LAYERS[0])
    x = torch.randn(batch, m0.cin, m0.nin, generator=torch.Generator().manual_seed(1)).to(device)
    return (lambda: LayerStack(STACK_LAYERS, backend, dtype)), x, (lambda out: out.square().mean())


def train_step(make, inputs, loss_of, device, compiled: bool):
    """``(model, step)``: a fresh model (seed 0) on ``device`` and its Adam train step, through
    ``torch.compile(model, fullgraph=True)`` where ``compiled``."""
    torch.manual_seed(0)
    model = make().to(device)
    fn = torch.compile(model, fullgraph=True) if compiled else model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        loss = loss_of(fn(inputs))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return fn, step


def bench_compile(backend: str, batch: int = 256, device="cuda", reps: int = 50, net: str = "digits",
                  dtype: str = "fp16") -> list:
    """The eager and the compiled record of ``backend``'s train step (see the module docstring)."""
    device = torch.device(device)
    make, inputs, loss_of = _problem(net, backend, batch, device, DTYPES[dtype])
    out = []
    outs = {}
    for mode in ("eager", "compiled"):
        fn, step = train_step(make, inputs, loss_of, device, mode == "compiled")
        t0 = time.perf_counter()
        outs[mode] = fn(inputs).detach().float()    # the training graph's forward (no-grad would compile, and on
        step()                                       # the GPU run, the inference kernels: another graph)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        first_s = time.perf_counter() - t0
        one = time_fn(step, device, warmup=3, reps=reps)
        out.append(dict(env_info(device), kind="compile_step", net=net,
                        dtype=dtype if net == "stack" else None, backend=backend, mode=mode, B=batch,
                        ms=pipelined_ms(step, device, warmup=3, reps=reps), ms_one=one.ms, reps=one.reps,
                        compile_s=first_s if mode == "compiled" else None, first_call_s=first_s))
    diff = (outs["compiled"] - outs["eager"]).abs().max().item()
    for r in out:
        r["max_out_diff"] = diff
    return out


#: The help text of ``python -m fovi_lab bench compile``.
DESCRIPTION = """\
torch.compile beside eager: the train step of the foveated digits network and of a stack of real fovi layers.

--net digits trains the foveated digits network of python -m fovi_lab train (two small KNN layers, group norm, a
linear head) on the digits. --net stack trains AlexNet's foveated L2, L3 and L4 under autocast in --dtype with fp32
master weights, where the KNN layers are most of the GPU time. Per backend it times the eager step and the compiled
one (torch.compile of the model, the KNN layers as custom ops), back to back and one at a time, and records the
compile time and the largest difference of the compiled output from eager's; --out appends the records as JSON
lines.

  python -m fovi_lab bench compile --net stack --backends warp_train torch_compact --batch 64
"""


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab bench compile``, each checked as it is parsed."""
    from fovi_lab.ops.arguments import COUNT, add_device_option, add_out_option, backend_name

    parser.add_argument("--backends", nargs="+", type=backend_name(trains=True),
                        default=["warp_train", "torch_compact"], metavar="BACKEND",
                        help="registered backends that train, each timed eager and compiled")
    parser.add_argument("--net", choices=("digits", "stack"), default="digits",
                        help="the network: the foveated digits network, or AlexNet's L2-L4 stack")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="fp16", help="the stack's autocast dtype")
    parser.add_argument("--batch", type=COUNT, default=256, help="images per train step")
    parser.add_argument("--reps", type=COUNT, default=50, help="timed train steps per mode")
    add_device_option(parser)
    add_out_option(parser, "the lines are printed")


def run(args) -> int:
    """Run the compile benchmark as ``args`` say (the options of :func:`add_arguments`); returns 0."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    recs = []
    for backend in args.backends:
        rows = bench_compile(backend, args.batch, device, args.reps, args.net, args.dtype)
        recs += rows
        eager, comp = rows
        print(f"{args.net} {args.dtype if args.net == 'stack' else ''} {backend:<14s} B={args.batch}: eager {eager['ms']:.3f} ms/step (one at a time {eager['ms_one']:.3f}), "
              f"compiled {comp['ms']:.3f} ms/step ({comp['ms_one']:.3f}), compiled/eager {comp['ms'] / eager['ms']:.2f}, "
              f"compile {comp['compile_s']:.1f} s, max output diff {comp['max_out_diff']:.2e}", flush=True)
    if args.out:
        append_jsonl(args.out, recs)
        print(f"{len(recs)} records appended to {os.path.abspath(args.out)}", flush=True)
    return 0


main = command_main("python -m fovi_lab bench compile", DESCRIPTION, add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
