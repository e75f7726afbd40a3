"""Command line: ``python -m fovi_lab {demo, bench, tune, train, warmup, report}``.

    python -m fovi_lab demo                  # every backend on a real fovi layer, checked and timed
    python -m fovi_lab bench forward         # forward benchmark (records JSON lines under data/)
    python -m fovi_lab bench backward        # adjoint benchmark
    python -m fovi_lab bench train-step      # forward + both grads
    python -m fovi_lab bench dtypes          # bf16 beside fp16, each beside PyTorch in the same dtype
    python -m fovi_lab bench compile         # torch.compile beside eager: the digits network, a stack of fovi layers
    python -m fovi_lab bench adjoints        # tensor-core adjoints beside the fused / staged ones and PyTorch
    python -m fovi_lab tune                  # time the candidates on this device, cache the fastest (auto reads it)
    python -m fovi_lab train                 # train the foveated digits network (torchrun: DDP)
    python -m fovi_lab warmup                # compile every Warp config for this device, in parallel
    python -m fovi_lab report                # docs/results.md and the README's table from the records
"""

from __future__ import annotations

import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd == "demo":
        from fovi_lab.demo import main as run
        return run(rest)
    if cmd == "bench":
        if not rest or rest[0] not in ("forward", "backward", "train-step", "dtypes", "compile", "adjoints"):
            print("usage: python -m fovi_lab bench {forward,backward,train-step,dtypes,compile,adjoints} [options]",
                  file=sys.stderr)
            return 2
        if rest[0] == "forward":
            from fovi_lab.bench.forward import main as run
            return run(rest[1:]) or 0
        if rest[0] == "dtypes":
            from fovi_lab.bench.dtypes import main as run
            return run(rest[1:]) or 0
        if rest[0] == "adjoints":
            from fovi_lab.bench.adjoints import main as run
            return run(rest[1:]) or 0
        if rest[0] == "compile":
            from fovi_lab.bench.compile_step import main as run
            return run(rest[1:]) or 0
        from fovi_lab.bench.backward import main as run
        return run(rest) or 0
    if cmd == "tune":
        from fovi_lab.bench.tune import main as run
        return run(rest)
    if cmd == "train":
        from fovi_lab.train import main as run
        return run(rest)
    if cmd == "report":
        from fovi_lab.bench.report import main as run
        return run(rest)
    if cmd == "warmup":
        from fovi_lab.kernels.warmup import main as run
        return run(rest) or 0
    print(f"unknown command {cmd!r}\n{__doc__}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
