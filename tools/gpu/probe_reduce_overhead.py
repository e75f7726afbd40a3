"""Does ``torch.compile(mode="reduce-overhead")`` (CUDA graphs under Inductor) run a train step of KNN layers, and
what does it refuse? The AlexNet L2-L4 stack of ``fovi_lab.bench.compile_step``, compiled fresh, with and without
one eager step first (which moves the layers' tables to the GPU and fills the kernels' caches outside any graph
pool); prints each outcome and, where it runs, the time per step beside eager.

    python tools/gpu/probe_reduce_overhead.py [--batch 64] [--backend warp_train]
"""

from __future__ import annotations

import argparse
import time
import traceback

import torch

from fovi_lab.bench.compile_step import _problem


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--backend", default="warp_train")
    args = ap.parse_args()
    dev = torch.device("cuda")
    for eager_first in (True, False):
        torch._dynamo.reset()
        make, x, loss_of = _problem("stack", args.backend, args.batch, dev, torch.float16)
        torch.manual_seed(0)
        model = make().to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step(fn):
            loss = loss_of(fn(x))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if eager_first:
            step(model)
        fn = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        try:
            for _ in range(5):
                torch.compiler.cudagraph_mark_step_begin()
                step(fn)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(50):
                torch.compiler.cudagraph_mark_step_begin()
                step(fn)
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) / 50 * 1e3
            t0 = time.perf_counter()
            for _ in range(50):
                step(model)
            torch.cuda.synchronize()
            print(f"eager step first={eager_first}: reduce-overhead runs, {ms:.3f} ms/step; eager "
                  f"{(time.perf_counter() - t0) / 50 * 1e3:.3f} ms/step", flush=True)
        except Exception as exc:  # noqa: BLE001 - report what it refused
            print(f"eager step first={eager_first}: {type(exc).__name__}: {str(exc)[:1500]}", flush=True)
            print("".join(traceback.format_exc().splitlines(True)[-12:]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
