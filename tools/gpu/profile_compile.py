"""Where a compiled train step's time goes beside the eager one: torch.profiler over a few steps of
``fovi_lab.bench.compile_step``'s networks, per mode, the GPU kernels by total time and the step's wall time.

    python tools/gpu/profile_compile.py [--net digits|stack] [--backends warp_train torch_compact] [--batch 256]
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from fovi_lab.bench.compile_step import DTYPES, _problem, train_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", default="digits")
    ap.add_argument("--backends", nargs="+", default=["warp_train", "torch_compact"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--dtype", default="fp16")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rows", type=int, default=14)
    args = ap.parse_args()
    dev = torch.device("cuda")
    for backend in args.backends:
        make, inputs, loss_of = _problem(args.net, backend, args.batch, dev, DTYPES[args.dtype])
        for mode in ("eager", "compiled"):
            _, step = train_step(make, inputs, loss_of, dev, mode == "compiled")
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step()
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / args.steps * 1e3
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(args.steps):
                    step()
                torch.cuda.synchronize()
            ev = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
            gpu = sum(e.self_device_time_total for e in ev) / args.steps / 1e3
            print(f"==== {args.net} {backend} {mode}: wall {wall:.3f} ms/step, GPU kernels {gpu:.3f} ms/step", flush=True)
            for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:args.rows]:
                print(f"  {e.self_device_time_total / args.steps / 1e3:8.3f} ms  {e.count // args.steps:3d}x  {e.key[:110]}")
            cpu = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:6]
            print("  host: " + "; ".join(f"{e.key[:40]} {e.self_cpu_time_total / args.steps / 1e3:.2f} ms" for e in cpu))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
