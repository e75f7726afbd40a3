"""The command line: ``python -m fovi_lab COMMAND [options]`` (also the ``fovi-lab`` script), one argparse tree.

Commands: ``demo``, ``bench {forward, backward, train-step, dtypes, compile, adjoints, network, host, cpu-auto,
ddp}``, ``tune``, ``train``, ``warmup``, ``report`` and ``cost-model``. Each command's module exposes ``DESCRIPTION``,
``add_arguments(parser)`` and ``run(args) -> int``, and its own ``main(argv)`` builds the same parser from them, so
``python -m fovi_lab train`` and ``fovi_lab.train.main`` take the same options. Every parser is a :class:`fovi_lab.ops.arguments.CommandParser`:
a usage error is one line on stderr with exit status 2, and ``--help`` at every level shows the defaults.
"""

from __future__ import annotations

import importlib
import sys
from typing import Dict, List, Optional, Sequence

from fovi_lab.ops.arguments import CommandParser

__all__ = ["main", "build_parser", "COMMANDS", "BENCHMARKS"]

PROG = "python -m fovi_lab"

DESCRIPTION = """\
fovi-lab: the compact KNN convolution of foveated vision models in NVIDIA Warp, checked against PyTorch, timed,
tuned and trained from the command line.

  python -m fovi_lab demo
  python -m fovi_lab bench forward --layers res18_layer1 --batches 16
  python -m fovi_lab COMMAND --help
"""

#: name -> (module, one line for the command list).
COMMANDS: Dict[str, tuple] = {
    "demo": ("fovi_lab.demo", "run one real fovi layer through every backend, checked against the oracle and timed"),
    "bench": (None, "time the Warp kernels against PyTorch and append the records as JSON lines"),
    "configs": ("fovi_lab.kernels.families.listing", "list the kernel families, their parameters and presets"),
    "explain": ("fovi_lab.explanation", "say which kernels a layer runs at a batch size, and why the others are not"),
    "tune": ("fovi_lab.bench.tune", "time the candidates on this device and cache the fastest (auto reads it)"),
    "train": ("fovi_lab.train", "train the foveated digits network (data-parallel under torchrun)"),
    "warmup": ("fovi_lab.kernels.warmup", "compile every Warp kernel config for this device, in parallel"),
    "report": ("fovi_lab.bench.report", "make docs/results.md and the README's results table from the records"),
    "cost-model": ("fovi_lab.kernels.cost_model", "fit the forward cost model on one GPU, score its picks on another"),
}

#: benchmark -> (module, one line for the benchmark list).
BENCHMARKS: Dict[str, tuple] = {
    "forward": ("fovi_lab.bench.forward", "the Warp forward against the PyTorch baselines and the dense ceiling"),
    "backward": ("fovi_lab.bench.backward", "both gradients (dx, dW): the Warp adjoints against PyTorch"),
    "train-step": ("fovi_lab.bench.backward", "forward and both gradients: warp_train against PyTorch's steps"),
    "dtypes": ("fovi_lab.bench.dtypes", "bf16 beside fp16, each beside PyTorch in the same dtype"),
    "compile": ("fovi_lab.bench.compile_step", "torch.compile beside eager: the digits network, a layer stack"),
    "adjoints": ("fovi_lab.bench.adjoints", "the tensor-core adjoints beside the fused or staged ones and PyTorch"),
    "network": ("fovi_lab.bench.network", "fovi's own networks, a train step with fovi_lab inside beside fovi's backends"),
    "host": ("fovi_lab.bench.host", "the host work of an eager forward, backward and step: microseconds and launches"),
    "cpu-auto": ("fovi_lab.bench.cpu_auto", "on the CPU: each form and fovi's baseline per shape, beside auto's pick"),
    "ddp": ("fovi_lab.bench.ddp", "data-parallel training on the devices of one host: scaling, bitwise repeatable runs"),
}

BENCH_DESCRIPTION = """\
The benchmarks. Each times the Warp kernels against the alternatives (PyTorch's forms, fovi's backends): per layer
on the real fovi layers, in fovi's whole networks (network), the host's part of a call (host) or data-parallel
training (ddp); and appends its records as JSON lines: forward, backward and train-step by default to
data/<kind>_<device>.jsonl under the current folder, the others to their --out.

  python -m fovi_lab bench forward --layers res18_layer1 --batches 16 64
  python -m fovi_lab bench BENCHMARK --help
"""


def _fill(parser: CommandParser, module_name: str, leaf: str) -> None:
    """Give a leaf parser its module's description, options and ``run``."""
    module = importlib.import_module(module_name)
    if leaf in ("backward", "train-step"):
        parser.description = module.DESCRIPTIONS[leaf]
        module.add_arguments(parser, leaf)
    else:
        parser.description = module.DESCRIPTION
        module.add_arguments(parser)
    parser.set_defaults(command_run=module.run)


def build_parser(argv: Optional[Sequence[str]] = None) -> CommandParser:
    """The parser tree of ``python -m fovi_lab``. With ``argv``, only the command it names gets its options (its
    module alone is imported, so the other commands' imports cost nothing); without, every command gets them."""
    words = None if argv is None else [w for w in argv if not w.startswith("-")]

    def wanted(*path: str) -> bool:
        return words is None or words[:len(path)] == list(path)

    parser = CommandParser(prog=PROG, description=DESCRIPTION)
    parser.leaves = {}                  # (command, [benchmark]) -> its parser: the prog its usage errors name
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    for name, (module_name, summary) in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, description=summary)
        parser.leaves[(name,)] = sub
        if name == "bench":
            sub.description = BENCH_DESCRIPTION
            benchmarks = sub.add_subparsers(title="benchmarks", metavar="BENCHMARK", dest="benchmark")
            for bench, (bench_module, bench_summary) in BENCHMARKS.items():
                leaf = benchmarks.add_parser(bench, help=bench_summary, description=bench_summary)
                parser.leaves[("bench", bench)] = leaf
                if wanted("bench", bench):
                    _fill(leaf, bench_module, bench)
        elif wanted(name):
            _fill(sub, module_name, name)
    return parser


def _words_after(argv: List[str], path: Sequence[str]) -> List[str]:
    """The words of ``argv`` after the command's names (``bench``, ``adjoints``), for the records."""
    i = 0
    for name in path:
        i = argv.index(name, i) + 1
    return argv[i:]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m fovi_lab COMMAND [options]``: parse, then run the command; returns its exit status. A usage error
    exits with status 2 and one line on stderr; no command prints the help."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    if not argv:
        parser.print_help()
        return 0
    args, extra = parser.parse_known_args(argv)
    if extra:                           # said by the command's own parser: "python -m fovi_lab tune: error: ..."
        path = (args.command,) + ((args.benchmark,) if args.command == "bench" and args.benchmark else ())
        parser.leaves.get(path, parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.error(f"expected a command: {', '.join(COMMANDS)}")
    if args.command == "bench" and args.benchmark is None:
        parser.exit(2, f"{PROG} bench: error: expected a benchmark: {', '.join(BENCHMARKS)} (see --help)\n")
    path = [args.command] + ([args.benchmark] if args.command == "bench" else [])
    args.argv = _words_after(argv, path)
    try:
        return args.command_run(args) or 0
    except (MemoryError, RuntimeError) as exc:     # torch.OutOfMemoryError is a RuntimeError
        if not _out_of_memory(exc):
            raise
        words = " ".join(str(exc).split()) or type(exc).__name__
        hint = ("; try a smaller --batch" if getattr(args, "batch", None) else
                "; try smaller --batches" if getattr(args, "batches", None) else "")
        parser.exit(2, f"{PROG} {' '.join(path)}: error: out of memory ({words[:240]}){hint}\n")


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed: Python's MemoryError, torch's CUDA out-of-memory error, or its
    CPU allocator's refusal (a RuntimeError saying it cannot allocate)."""
    import torch

    return (isinstance(exc, (MemoryError, torch.OutOfMemoryError))
            or "DefaultCPUAllocator: can't allocate memory" in str(exc))


if __name__ == "__main__":
    sys.exit(main())
