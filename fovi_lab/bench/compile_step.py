"""``torch.compile`` beside eager: the train step of the foveated digits network (:mod:`fovi_lab.train`).

    python -m fovi_lab.bench.compile_step [--backends warp_train torch_compact] [--batch 256] [--out F.jsonl]

Per backend, one record each for the eager step and the compiled one (``torch.compile(model)``, Inductor,
``fullgraph=True``: the KNN layers are the custom ops of :mod:`fovi_lab.ops.library`): the step (forward,
cross-entropy, backward, Adam) timed back to back (``ms``: wall time per step of a loop with one
synchronisation at the end) and one at a time (``ms_one``: CUDA events, median), the first compiled call's
wall time (``compile_s``), and the largest difference of the compiled model's logits from eager's on one
batch (``max_logit_diff``). Records carry device, versions, date and the commit from ``FOVI_COMMIT``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from fovi_lab.bench.common import append_jsonl, env_info, pipelined_ms, time_fn
from fovi_lab.train import FoveatedDigitsNet, load_digits_tensors

__all__ = ["bench_compile", "main"]


def bench_compile(backend: str, batch: int = 256, device="cuda", reps: int = 50) -> list:
    """The eager and the compiled record of ``backend``'s train step (see the module docstring)."""
    device = torch.device(device)
    xtr, ytr, _, _ = load_digits_tensors(seed=0)
    images, labels = xtr[:batch].to(device), ytr[:batch].to(device)
    out = []
    logits = {}
    for mode in ("eager", "compiled"):
        torch.manual_seed(0)
        model = FoveatedDigitsNet(backend=backend).to(device)
        net = torch.compile(model, fullgraph=True) if mode == "compiled" else model
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            loss = F.cross_entropy(net(images), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        t0 = time.perf_counter()
        with torch.no_grad():
            logits[mode] = net(images).float()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        first_s = time.perf_counter() - t0
        one = time_fn(step, device, warmup=3, reps=reps)
        out.append(dict(env_info(device), kind="compile_step", commit=os.environ.get("FOVI_COMMIT"),
                        backend=backend, mode=mode, B=batch, ms=pipelined_ms(step, device, warmup=3, reps=reps),
                        ms_one=one.ms, reps=one.reps, compile_s=first_s if mode == "compiled" else None,
                        first_call_s=first_s))
    diff = (logits["compiled"] - logits["eager"]).abs().max().item()
    for r in out:
        r["max_logit_diff"] = diff
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fovi_lab.bench.compile_step", description=__doc__.split("\n")[0])
    ap.add_argument("--backends", nargs="+", default=["warp_train", "torch_compact"])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None, help="append the records here (JSON lines)")
    args = ap.parse_args(argv)
    recs = []
    for backend in args.backends:
        rows = bench_compile(backend, args.batch, args.device, args.reps)
        recs += rows
        eager, comp = rows
        print(f"{backend:<14s} B={args.batch}: eager {eager['ms']:.3f} ms/step (one at a time {eager['ms_one']:.3f}), "
              f"compiled {comp['ms']:.3f} ms/step ({comp['ms_one']:.3f}), compiled/eager {comp['ms'] / eager['ms']:.2f}, "
              f"first compiled call {comp['compile_s']:.1f} s, max logit diff {comp['max_logit_diff']:.2e}", flush=True)
    if args.out:
        append_jsonl(args.out, recs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
