"""Autotune on the user's device: time each candidate of a problem, keep the fastest correct one.

    python -m fovi_lab tune [--layers res18_layer1 alex_L1 | all] [--batches 16 64] [--modes forward train-step]
    python -m fovi_lab tune --show          # the cache: path, and every entry with its timings
    python -m fovi_lab tune --clear         # delete the cache file (the recorded rule answers again)

The candidates of a forward problem are the Warp forward with the config the rule picks
(:func:`fovi_lab.kernels.forward.rules.select_config`), the Warp forward with the configs that ran fastest on
that shape in the shipped sweeps (any device; at most ``--recorded`` of them), ``torch_compact``, ``torch_binned``
and ``torch_dense``; of a train-step problem, ``warp_train`` and the same PyTorch backends (forward and both
gradients). Each candidate runs once and is checked against the fp32 oracle before it is timed (median of
``--reps`` calls, CUDA events on a GPU): every output within 3x the error of ``torch_compact`` on the same
inputs plus 2e-3, the adjoints' criterion of docs/operator.md §5, here applied to y too. One that fails or cannot
launch is listed with why, never picked. When the fastest is not what the rule runs, the two are timed again in
``AB_ROUNDS`` = 5 alternating rounds, and the pick is kept only if it beats the rule there by more than
``AB_MARGIN`` = 2 % (entry field ``ab``); else the rule's choice is kept, so tuning never swaps in a noise
win. While it tunes, the Warp forward ignores earlier tuned configs (the rule's kernel is what a candidate times). The winner goes into the cache of
:mod:`fovi_lab.ops.tune_cache` with every candidate's time and what the untuned ``auto`` would have run (``rule``),
so each entry shows whether tuning changed anything.

Under ``torch.distributed`` (a process group the caller initialised; ``python -m fovi_lab tune`` does so under
``torchrun``) rank 0 tunes and broadcasts the entries, or its error; every rank keeps them and rank 0 writes the
file, so the ranks of one job run the same kernels. ``--show`` lists the cache and, on a device the shipped
records cover (an H200), what ``auto`` runs there untuned (the records' picks; they are not copied into the cache,
so a newer package's records are never shadowed by an old copy).
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

import torch

import fovi_lab.settings as settings
from fovi_lab.bench.common import time_fn
from fovi_lab.graph.layers import layer_meta
from fovi_lab.ops import tune_cache
from fovi_lab.ops.arguments import command_main
from fovi_lab.ops.dispatch import pick_backend, recorded_table
from fovi_lab.ops.records import iter_records
from fovi_lab.ops.reference import CompactTorchOps, oracle_forward
from fovi_lab.ops.registry import OPS_REGISTRY, get_ops, load_optional_backends

__all__ = ["candidates", "tune_problem", "tune", "recorded_picks", "main", "add_arguments", "run", "DESCRIPTION"]

Candidate = Tuple[str, Optional[str]]         # (backend, Warp forward config or None: the backend's own choice)
_SHAPE_KEYS = ("cin", "cout", "nin", "nout", "k", "p64", "v")


def _shape(meta) -> tuple:
    return tuple(int(getattr(meta, a)) for a in _SHAPE_KEYS)


def recorded_configs(meta, batch: int, limit: int = 3) -> List[str]:
    """The Warp forward configs that ran fastest on this layer shape in the shipped sweeps, at the recorded
    batch nearest to ``batch`` (log2 distance at most 1), fastest first."""
    best: Dict[str, float] = {}
    near = None
    shape = _shape(meta)
    rows = []
    for r in iter_records(auto=True):
        if r.get("impl") != "warp_uncached" or not r.get("config") or not r.get("ms") \
                or any(k not in r for k in _SHAPE_KEYS) or tuple(int(r[k]) for k in _SHAPE_KEYS) != shape:
            continue
        rows.append(r)
        d = abs(math.log2(int(r["B"])) - math.log2(batch))
        if d <= 1 and (near is None or d < near[0]):
            near = (d, int(r["B"]))
    if near is None:
        return []
    for r in rows:
        if int(r["B"]) == near[1]:
            best[r["config"]] = min(best.get(r["config"], math.inf), float(r["ms"]))
    return sorted(best, key=best.get)[:limit]


def _rule_config(meta, x, w) -> Optional[str]:
    from fovi_lab.kernels.forward.api import prepare_uncached
    return prepare_uncached(x, w, None, meta.input_linear, meta.weight_linear).config


def candidates(meta, batch: int, mode: str, x=None, w=None, recorded: int = 3) -> List[Candidate]:
    """The candidates of a problem (see the module docstring); the first Warp one is the rule's."""
    load_optional_backends()
    torch_ones = [(b, None) for b in ("torch_compact", "torch_binned", "torch_dense") if b in OPS_REGISTRY]
    if mode == "train-step":
        return ([("warp_train", None)] if "warp_train" in OPS_REGISTRY else []) + torch_ones
    if "warp_compact" not in OPS_REGISTRY:
        return torch_ones
    rule = _rule_config(meta, x, w)
    return [("warp_compact", rule)] + [("warp_compact", c) for c in recorded_configs(meta, batch, recorded)
                                       if c != rule] + torch_ones


def _inputs(meta, batch: int, dtype, device, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, meta.cin, meta.nin, generator=gen)
    w = torch.randn(meta.cout, meta.q, generator=gen) / math.sqrt(meta.p)
    g = torch.randn(batch, meta.cout, meta.nout, generator=gen)
    return [t.to(device=device, dtype=dtype) for t in (x, w, g)]


def _runner(cand: Candidate, meta, mode, x, w, g):
    backend, config = cand
    if backend == "warp_compact" and config is not None:
        from fovi_lab.kernels.forward.api import run_uncached

        def fwd():
            return run_uncached(x, w, None, meta.input_linear, meta.weight_linear, config=config)
    else:
        ops = get_ops(backend)

        def fwd():
            return ops.forward(meta, x, w, None)
    if mode == "forward":
        return lambda: (fwd(),)
    ops = get_ops(backend)
    if hasattr(ops, "backward_combined"):
        return lambda: (fwd(),) + tuple(ops.backward_combined(meta, g, x, w))
    return lambda: (fwd(), ops.grad_input(meta, g, w), ops.grad_weight(meta, g, x))


def _check(outs, meta, mode, x, w, g) -> Optional[str]:
    """Why a candidate's outputs fail the accuracy criterion (docs/operator.md §5), or None."""
    xf = x.float().requires_grad_(mode != "forward")
    wf = w.float().requires_grad_(mode != "forward")
    y = oracle_forward(xf, wf, None, meta.idx, meta.rf_index, meta.v)
    refs = [y.detach()]
    torch_outs = [CompactTorchOps.forward(meta, x, w, None).float()]
    if mode != "forward":
        refs += list(torch.autograd.grad(y, (xf, wf), g.float()))
        torch_outs += [CompactTorchOps.grad_input(meta, g, w), CompactTorchOps.grad_weight(meta, g, x)]
    for name, got, want, tref in zip(("y", "dx", "dW"), outs, refs, torch_outs):
        got = got.float()
        if got.shape != want.shape or not torch.isfinite(got).all():
            return f"{name}: shape {tuple(got.shape)} or non-finite entries"
        err, tol = (got - want).abs().max().item(), 3 * (tref.float() - want).abs().max().item() + 2e-3
        if err > tol:
            return f"{name}: max error {err:.3g} > {tol:.3g}"
    return None


def _rule(meta, x, mode, rule_config) -> Candidate:
    """What ``auto`` runs without a tuned entry: the recorded pick, else torch_compact (the rule's config)."""
    backend = pick_backend(meta, x, mode == "train-step", candidates=tuple(OPS_REGISTRY)) or "torch_compact"
    return backend, (rule_config if backend == "warp_compact" else None)


def _label(c: Candidate) -> str:
    return c[0] if c[1] is None else f"{c[0]}:{c[1]}"


def _time_candidates(cands, meta, mode, x, w, g, device, reps, times: Dict[str, float], refused: Dict[str, str]):
    """Check each candidate against the oracle, then time it: ``times[label]`` (ms) or ``refused[label]`` (why)."""
    for cand in cands:
        label = _label(cand)
        try:
            fn = _runner(cand, meta, mode, x, w, g)
            why = _check(fn(), meta, mode, x, w, g)
        except Exception as e:                       # unlaunchable here, or a backend that refuses the dtype
            why = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if why is not None:
            refused[label] = why
            continue
        times[label] = time_fn(fn, device, warmup=2, reps=reps).ms


#: interleaved rounds of the pick against the rule, and the margin by which the pick must win them
AB_ROUNDS, AB_MARGIN = 5, 0.02


def _parse(label: str) -> Candidate:
    backend, _, config = label.partition(":")
    return backend, config or None


def _interleaved(fa, fb, device, reps: int, rounds: int = AB_ROUNDS) -> Tuple[float, float]:
    """Medians over ``rounds`` alternating timings of ``fa`` and ``fb`` (ms): drift hits both alike."""
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(time_fn(fa, device, warmup=1, reps=reps).ms)
        tb.append(time_fn(fb, device, warmup=1, reps=reps).ms)
    return statistics.median(ta), statistics.median(tb)


def tune_problem(meta, batch: int, mode: str, device, dtype=torch.float16, reps: int = 20,
                 recorded: int = 3) -> Tuple[str, dict]:
    """(entry key, entry) of one problem: every candidate checked and timed on ``device``."""
    device = torch.device(device)
    meta = meta.to(device)
    x, w, g = _inputs(meta, batch, dtype, device)
    cands = candidates(meta, batch, mode, x, w, recorded)
    rule_cfg = next((c for b, c in cands if b == "warp_compact"), None)
    times: Dict[str, float] = {}
    refused: Dict[str, str] = {}
    with tune_cache.bypass():
        _time_candidates(cands, meta, mode, x, w, g, device, reps, times, refused)
    if not times:
        raise RuntimeError(f"no candidate ran correctly for {tune_cache.problem_key(meta, batch, dtype, mode)} "
                           f"on {device}: {refused}")
    winner = min(times, key=times.get)
    rule = _label(_rule(meta, x, mode, rule_cfg))
    ab = None
    if winner != rule and rule in times:
        # confirm a win over the rule with interleaved timings: one pass over the candidates is as noisy as
        # the margins it finds; keep the rule unless the pick beats it by more than AB_MARGIN
        with tune_cache.bypass():
            pick_ms, rule_ms = _interleaved(_runner(_parse(winner), meta, mode, x, w, g),
                                            _runner(_parse(rule), meta, mode, x, w, g), device, reps)
        ab = {"pick": winner, "pick_ms": pick_ms, "rule_ms": rule_ms, "rounds": AB_ROUNDS}
        if not pick_ms < (1.0 - AB_MARGIN) * rule_ms:
            winner = rule
    backend, config = _parse(winner)
    entry = {"backend": backend, "config": config, "ms": times[winner], "candidates": times,
             "refused": refused, "rule": rule, "rule_ms": times.get(rule), "ab": ab, "reps": reps, "source": "tuned",
             "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    key = tune_cache.entry_key(tune_cache.setup_key(device), tune_cache.problem_key(meta, batch, dtype, mode))
    return key, entry


def recorded_picks(device) -> Dict[str, dict]:
    """What ``auto`` runs untuned on this device's name, from the shipped records: ``{entry key: {backend, ms,
    candidates}}`` (for ``--show``; never written into the cache)."""
    device = torch.device(device)
    if device.type != "cuda":
        return {}
    name, setup = torch.cuda.get_device_name(device), tune_cache.setup_key(device)
    out = {}
    for (dev, mode, shape, b), backends in recorded_table().items():
        options = {be: ms for be, (_, ms) in backends.items() if be in OPS_REGISTRY}
        if dev == name and options:
            best = min(options, key=options.get)
            problem = "/".join((mode, "float16", "x".join(map(str, shape)), f"B{b}"))
            out[tune_cache.entry_key(setup, problem)] = {"backend": best, "ms": options[best], "candidates": options}
    return out


def tune(problems: Sequence[Tuple[object, int, str]], device, dtype=torch.float16, reps: int = 20,
         recorded: int = 3, log=print) -> Dict[str, dict]:
    """Tune ``[(meta, batch, mode), ...]`` and store the winners (see the module docstring for DDP)."""
    dist = torch.distributed
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() \
        else (0, 1)
    entries: Dict[str, dict] = {}
    error = None
    if rank == 0:
        try:
            for meta, batch, mode in problems:
                key, entry = tune_problem(meta, batch, mode, device, dtype, reps, recorded)
                entries[key] = entry
                if log:
                    log(_line(key, entry))
        except Exception as exc:  # noqa: BLE001 - every rank must leave the broadcast, and raise
            error = f"{type(exc).__name__}: {exc}"
            if world == 1:
                raise
    if world > 1:
        box = [(entries, error)]
        dist.broadcast_object_list(box, src=0)
        entries, error = box[0]
        if error is not None:
            raise RuntimeError(f"tuning on rank 0 failed: {error}")
    tune_cache.store(entries, write=(rank == 0))
    return entries


def _line(key: str, e: dict) -> str:
    problem = key.split("|", 1)[1]
    pick = e["backend"] + (f":{e['config']}" if e.get("config") else "")
    rule = e.get("rule")
    vs = f"rule {rule} {e['rule_ms']:.3f} ms" if e.get("rule_ms") else f"rule {rule} (not timed)"
    return f"{problem:<48s} {pick:<34s} {e['ms']:.3f} ms   {vs}"


#: The help text of ``python -m fovi_lab tune``.
DESCRIPTION = """\
Autotune on this device: time each candidate of a problem (a layer, a batch, forward or train step), keep the
fastest correct one in the tune cache, which the auto backend reads first.

The candidates are the Warp forward with the rule's config and with the configs that ran fastest on that shape in
the shipped sweeps, and the PyTorch backends (for a train step, warp_train and the PyTorch backends). Each runs
once and is checked against the fp32 oracle before it is timed; one that fails is listed with why, never picked. A
pick that is not the rule's is kept only if it also wins interleaved rounds against the rule by more than 2 %.
Under torchrun rank 0 tunes and every rank gets its picks.

  python -m fovi_lab tune --layers all --batches 1 64
  python -m fovi_lab tune --show
  python -m fovi_lab tune --clear
"""

PROG = "python -m fovi_lab tune"


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab tune``, each checked as it is parsed."""
    from fovi_lab.ops.arguments import COUNT, LayersAction, add_device_option, int_at_least, layer_names, out_file

    parser.add_argument("--layers", nargs="+", type=layer_names(), action=LayersAction, default=["res18_layer1"],
                        metavar="LAYER", help="layer names, or all")
    parser.add_argument("--batches", nargs="+", type=COUNT, default=[16, 64], metavar="B",
                        help="batch sizes to tune each layer at")
    parser.add_argument("--modes", nargs="+", choices=("forward", "train-step"), default=["forward", "train-step"],
                        help="the problems to tune: the forward (inference) and the train step")
    add_device_option(parser)
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16", help="the compute dtype to tune for")
    parser.add_argument("--reps", type=COUNT, default=20, help="timed calls per candidate, whose median is kept")
    parser.add_argument("--recorded", type=int_at_least(0), default=3,
                        help="configs from the shipped sweeps to try beside the rule's")
    parser.add_argument("--show", action="store_true", help="print the cache and exit")
    parser.add_argument("--clear", action="store_true", help="delete the cache file and exit")
    parser.add_argument("--out", type=out_file, default=None,
                        help="also append the new entries to this file as JSON lines (default: only the cache)")


def run(args) -> int:
    """Tune, show or clear the cache as ``args`` say (the options of :func:`add_arguments`; ``args.argv``, the
    command's words when known, goes into the ``--out`` records). Returns 0."""
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    path = tune_cache.cache_path()
    if args.clear:
        existed = path.is_file()
        path.unlink(missing_ok=True)
        print(f"{'deleted' if existed else 'no cache at'} {path}")
        return 0
    if args.show:
        entries = tune_cache.load()
        print(f"{path}: {len(entries)} entries")
        for key, e in sorted(entries.items()):
            print(f"  {key}\n    -> {e['backend']}{':' + e['config'] if e.get('config') else ''} "
                  f"{e.get('ms', float('nan')):.3f} ms ({e.get('source')}); candidates {e.get('candidates')}")
        picks = {k: e for k, e in recorded_picks(args.device).items() if k not in entries}
        if picks:
            print(f"untuned, auto runs the shipped records' picks for this device ({len(picks)} problems):")
            for key, e in sorted(picks.items()):
                print(f"  {key.split('|', 1)[1]} -> {e['backend']} {e['ms']:.3f} ms (recorded)")
        return 0
    problems = [(layer_meta(n), b, m) for n in args.layers for b in args.batches for m in args.modes]
    device = torch.device(args.device)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:                         # under torchrun: one tune on rank 0, shared with every rank
        if device.type == "cuda":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[args.dtype]
        entries = tune(problems, device, dtype, reps=args.reps, recorded=args.recorded)
    finally:
        if world > 1:
            torch.distributed.barrier()          # no rank tears gloo down while another still talks
            torch.distributed.destroy_process_group()
    print(f"{len(entries)} entries written to {path}")
    if args.out:
        from fovi_lab.bench.common import append_jsonl, env_info
        from fovi_lab.ops.arguments import command_words
        words = command_words(getattr(args, "argv", None), "tune")
        prov = dict(commit=settings.get("FOVI_COMMIT"), command=" ".join([PROG] + words))
        append_jsonl(args.out, [dict(env_info(args.device), kind="tune", key=k, **prov, **e) for k, e in entries.items()])
        print(f"{len(entries)} entries appended to {os.path.abspath(args.out)}")
    return 0


main = command_main(PROG, DESCRIPTION, add_arguments, run)


if __name__ == "__main__":
    raise SystemExit(main())
