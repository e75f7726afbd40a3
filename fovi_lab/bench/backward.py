"""Backward and train-step benchmark: Warp adjoints vs PyTorch, on the real fovi layer table.

``python -m fovi_lab.bench.backward [backward|train-step] [--layers alex_L1 res18_layer1]
[--batches 64 128 512] [--sweep] [--out data/backward_xxx.jsonl]``
(also ``python -m fovi_lab bench backward`` / ``python -m fovi_lab bench train-step``).

Per (layer, B), in one process on identical fp16 inputs (``x [B, Cin, Nin]``, ``W [Cout, Q]``, an
upstream gradient ``g [B, Cout, Nout]``):

mode ``backward`` (both gradients, dx and dW):
    * ``warp``: :func:`fovi_lab.kernels.adjoint.staged_plans.grad_input` + :func:`grad_weight` with the default
      configs, timed as the whole ops (operand layouts, every chunk, output copies), plus each
      pipeline's kernels alone (``gi_stage_ms``, ``dx_reduce_ms``, ``gw_stage_ms``, ``dw_reduce_ms``)
      on prepared operands, the stage GEMMs' TFLOP/s and fraction of Warp's dense tile-GEMM ceiling
      for the same tile shape (:func:`fovi_lab.kernels.forward.api.make_dense_ceiling`: the same GEMM sizes
      with plain loads, no gathers), and the reductions' GB/s and fraction of HBM bandwidth;
    * ``torch_compact``: :class:`fovi_lab.ops.reference.CompactTorchOps` explicit backward (bmm + fp32
      ``index_add_``; atomics on CUDA); ``torch_binned``: :class:`fovi_lab.ops.reference.BinnedTorchOps`, the
      binned form's explicit backward (matmul + ``index_add_``; G binned again for dW);
    * ``torch_autograd_gather_bmm`` / ``torch_autograd_tgather_bmm`` / ``torch_autograd_binned_mm``:
      ``torch.autograd.grad`` through the strongest PyTorch forwards (gather + bmm; the transposed gather
      whose gathered rows are contiguous batch runs; the binned form of :func:`fovi_lab.ops.reference.
      binned_forward`, index_add into the Q taps + one shared-weight matmul), backward only (the graph
      is built once, ``retain_graph=True``).
mode ``train-step`` (forward + both gradients):
    * ``warp_train``: the ``warp_train`` backend as a user gets it (:class:`fovi_lab.knn_warp.WarpTrainOps`:
      the default forward config and, per :func:`fovi_lab.knn_warp.grad_path`, the fused node-major
      adjoints of :mod:`fovi_lab.kernels.adjoint.fused` or the staged ones), with each fused kernel timed alone
      and against the dense ceiling of its tiles; ``warp_train_staged``: the staged pipelines with the
      per-stage numbers above; ``warp_train_fused``: the fused path forced where the rule picks staged;
    * ``torch_compact`` / ``torch_binned``: the registered PyTorch backends, forward + explicit backward;
    * ``torch_autograd_*``: the PyTorch forward + ``torch.autograd.grad``.
    * ``torch_explicit_tgather`` (both modes; ``_compiled`` with ``--compile-steps``): the hand-written PyTorch step of
      :func:`fovi_lab.bench.backward_impls.torch_steps` (x^T layout, bmm + fp32 ``index_add_`` adjoints).
    * ``fovi_<backend>`` (train step, where fovi is installed; ``--no-fovi`` leaves them out): what a fovi user
      has, fovi's own layer of the same table layer with ``kernel_backend`` = ``auto``, ``cuda`` (its fused CuPy
      kernel), ``baseline``, ``torch_compact`` and ``warp_train`` (its copy of the seed's kernels), on the same fp16
      operands as ours (:func:`fovi_lab.integrations.fovi.fovi_steps`: the layer set up once, its weight's version
      bumped per step); judged, eager and replayed, against that layer's fp32 result (fovi's tables are its own). Our ``warp_train`` records carry ``fastest_fovi`` and ``speedup_vs_fovi``; a
      backend fovi refuses on the device is recorded with fovi's reason.
(In ``backward`` mode the same Warp records are named ``warp``, ``warp_staged``, ``warp_fused``.)
``--sweep`` (either mode) also measures every gi/gw config (v2/v2p, v2/v3/v3p/v4, tile sizes, fp16
and fp32 staging; gw also with the ``index_add`` finish) on each shape, op and kernels alone;
``--sweep-fused`` every fused dx config and dW config x list split; ``--graphs`` also replays
``warp_train`` and every PyTorch step from a CUDA graph (``*_graphed`` records: no per-call host work).

Every Warp result is checked against ``torch_compact`` in fp32 (``err_dx``, ``err_dw``: max abs error
over the reference's max abs), and run twice to check bitwise determinism (``deterministic``). Peak
memory is ``torch.cuda.max_memory_allocated`` during one call minus what was allocated before it
(``peak_mib``; inputs excluded, outputs included); warp_train's records add what stays: ``tables_mib`` (the index
tables the layer keeps on the device, its own and the adjoints' derived layers) and the replay cache's
``replay_resident_mib`` / ``replay_shape_mib``. FLOPs are ``2*B*P64*Cout*Nout`` per GEMM (two for
backward, three for a train step); bytes the fewest each op must move. Fractions of the roofline use
the datasheet ceilings of the device measured (:class:`fovi_lab.bench.common.Roofline`). A train step bumps the
weight's version first (as the optimizer's in-place update does), so no backend reuses a weight layout
cached from the previous step (records carry ``weight_version_bumped``). The fovi library's own Warp
train step, as measured on an H200 outside this repository (one run each), is printed beside ours where
the shape matches.

Suggested H200 runs (each fits one 10-minute call; the MathDx precompile is ~1 min per round of
``--jobs`` modules)::

    python -m fovi_lab.bench.backward train-step --batches 64 128 512 --time-budget-s 480
    python -m fovi_lab.bench.backward backward --layers alex_L0 alex_L1 alex_L3 res18_layer1 res18_layer3 \
        --batches 64 512 --sweep --time-budget-s 480

Robustness: on CUDA every needed Warp module (grads, forward, dense ceilings) is compiled first by a
pool of spawned processes (``--jobs``; MathDx links take ~50 s each and in-process workers do not
overlap them); a failing shape or implementation is recorded with a ``note`` and the run goes on;
records are appended after every shape; ``--time-budget-s`` stops starting new shapes.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback
from pathlib import Path
from typing import List

import torch

from fovi_lab.bench.common import (Progress, roofline_of, append_jsonl, default_record_path, env_info,
                                   records_note)
from fovi_lab.bench.backward_impls import FOVIS_WEIGHT, _against_fovi, _DenseCache, _fovi_wanted  # noqa: F401
from fovi_lab.bench.backward_shape import NOTES_TORCH_TRAIN_STEP, run_shape, SEED_TRAIN_STEP_MS  # noqa: F401
from fovi_lab.bench.precompile import _jobs_for, precompile
from fovi_lab.bench.backward_report import _print_shape, _summary


__all__ = ["main", "add_arguments", "run", "MODES", "DESCRIPTIONS", "SEED_TRAIN_STEP_MS", "run_shape", "precompile"]


MODES = ("backward", "train-step")

#: The help text of ``python -m fovi_lab bench backward`` and ``bench train-step``, per mode.
DESCRIPTIONS = {
    "backward": """\
Backward benchmark: both gradients (dx and dW) of the Warp adjoints against PyTorch, on the real fovi layers.

Per layer and batch, in one process on identical fp16 inputs (x, W and an upstream gradient), it times the staged
and the fused Warp adjoints (as whole ops and each pipeline's kernels alone, beside Warp's dense tile-GEMM ceiling
of the same tiles), the registered PyTorch backends' explicit adjoints, and autograd through the strongest
PyTorch forwards. Every Warp result is checked against torch_compact in fp32 and run twice for bitwise
determinism. Records (JSON lines) are appended to --out, by default to data/backward_<device>.jsonl under the
current folder.

  python -m fovi_lab bench backward --layers alex_L1 res18_layer1 --batches 64 512
  python -m fovi_lab bench backward --sweep --gi-configs gi2_p64b64
""",
    "train-step": """\
Train-step benchmark: the forward and both gradients of the warp_train backend against PyTorch's train steps,
on the real fovi layers.

Per layer and batch, in one process on identical fp16 inputs, it times warp_train as a user gets it (the rule's
forward config and adjoint path), the staged and the fused Warp paths, the registered PyTorch backends (forward
and explicit adjoints), autograd through the PyTorch forwards and the hand-written PyTorch step; each step bumps
the weight's version first, as an optimizer's update does. Every Warp result is checked against torch_compact in
fp32. Records (JSON lines) are appended to --out, by default to data/train_step_<device>.jsonl under the current
folder.

  python -m fovi_lab bench train-step --batches 64 128 512 --graphs
""",
}


def add_arguments(parser, mode: str = "backward") -> None:
    """The options of ``python -m fovi_lab bench <mode>`` (``backward`` or ``train-step``), each checked as it is
    parsed; the parsed ``mode`` is ``mode``."""
    import fovi_lab.integrations.fovi  # noqa: F401  (its layer source: --layers fovi:resnet18@64, ...)
    from fovi_lab.graph.layers import SYNTHETIC
    from fovi_lab.ops.arguments import (COUNT, LayersAction, add_device_option, int_at_least, layer_names, out_file,
                                        positive_float)

    kind = "backward" if mode == "backward" else "train_step"
    parser.set_defaults(mode=mode)

    def impl_name(text: str) -> str:
        if not re.fullmatch(r"warp(_train)?(_staged|_fused)?|warp_d[xw]|torch_\w+|fovi_\w+", text):
            raise argparse.ArgumentTypeError(
                f"expected an implementation this benchmark times (warp_train, warp_train_staged, warp_train_fused, "
                f"warp, warp_staged, warp_fused, torch_..., fovi_...), got {text!r}")
        return text
    parser.add_argument("--layers", nargs="+", type=layer_names(synthetic=True), action=LayersAction, default=None,
                        metavar="LAYER", help=f"layer names, all, the layers of fovi's own networks "
                                              f"(fovi:resnet18@64, fovi:alexnet@128:1, fovi:all), or the synthetic "
                                              f"test shapes {', '.join(SYNTHETIC)} (default: every layer of the "
                                              f"table)")
    parser.add_argument("--batches", nargs="+", type=COUNT, default=[64, 128, 512], metavar="B",
                        help="batch sizes to time on each layer")
    parser.add_argument("--rf", default=None, choices=["rf1", "rf2"],
                        help="reference frame (default: each layer's network frame; the record's rf says which)")
    parser.add_argument("--sweep", action="store_true", help="also time every gi/gw config (fp16 and fp32 staging)")
    parser.add_argument("--graphs", action="store_true",
                        help="also time warp_train and the PyTorch baselines replayed from CUDA graphs")
    parser.add_argument("--sweep-fused", action="store_true",
                        help="also time every fused dx config and every dW config x list split (kernels alone)")
    parser.add_argument("--fused-only", action="store_true",
                        help="with --sweep-fused: time only the fused sweep (no baselines, no other Warp paths)")
    parser.add_argument("--gi-configs", nargs="+", default=None, metavar="CONFIG",
                        help="restrict the sweep's grad-input configs to these (default: every one)")
    parser.add_argument("--gw-configs", nargs="+", default=None, metavar="CONFIG",
                        help="restrict the sweep's grad-weight configs to these (default: every one)")
    parser.add_argument("--only", nargs="+", type=impl_name, default=None, metavar="IMPL",
                        help="time only these implementations, with their replayed forms under --graphs (warp_train, "
                             "say, to time a switch such as FOVI_KNN_DX_PATH=taps beside a run of the rule; the "
                             "records then carry no ratio to PyTorch's, and the dense ceilings compile only where a "
                             "record needs one; default: every one)")
    parser.add_argument("--no-fovi", action="store_true",
                        help="train-step: leave out fovi's own backends (timed by default where fovi is installed)")
    parser.add_argument("--compile-steps", action="store_true",
                        help="also time torch.compile of the hand-written PyTorch steps (train-step; slow to compile)")
    parser.add_argument("--reps", type=COUNT, default=15, help="timed calls per implementation, whose median is kept")
    parser.add_argument("--warmup", type=int_at_least(0), default=3, help="untimed calls before the timed ones")
    parser.add_argument("--jobs", type=COUNT, default=min(16, os.cpu_count() or 1),
                        help="processes that precompile the Warp modules in parallel on a GPU (default: the CPU "
                             "count, at most 16)")
    parser.add_argument("--no-precompile", action="store_true", help="skip the parallel precompile (CUDA)")
    parser.add_argument("--out", type=out_file, default=None,
                        help=f"JSON-lines file to append the records to (default: data/{kind}_<device>.jsonl under "
                             f"the current folder)")
    add_device_option(parser)
    parser.add_argument("--time-budget-s", type=positive_float, default=None, metavar="S",
                        help="start no new shape after this many seconds (the records so far are kept; default: "
                             "no limit)")
    parser.add_argument("--verbose", action="store_true", help="print the traceback of a failing implementation")


def run(args) -> int:
    """Run the benchmark of ``args.mode`` as ``args`` say (the options of :func:`add_arguments`); returns 0."""
    from fovi_lab.graph.layers import LAYERS, SYNTHETIC, layer_meta, synthetic_meta

    _check_only(args)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    env = env_info(device)
    kind = "backward" if args.mode == "backward" else "train_step"
    out = args.out or default_record_path(kind, env["device"])
    if args.out is None:                               # the default file: refused here, not after the timings
        from fovi_lab.ops.arguments import unwritable, usage_error
        why = unwritable(out)
        if why is not None:
            usage_error(f"python -m fovi_lab bench {args.mode}",
                        f"--out: the default {out} cannot be written ({why}); name a file with --out")
    fovi_missing = None
    if args.mode == "train-step" and not getattr(args, "no_fovi", False):
        from fovi_lab.integrations.fovi import _fovi
        try:
            _fovi()
        except ImportError as exc:
            fovi_missing = str(exc)
    only = getattr(args, "only", None) or []
    if fovi_missing and any(n.startswith("fovi_") for n in only):
        from fovi_lab.ops.arguments import usage_error
        usage_error(f"python -m fovi_lab bench {args.mode}", f"--only: fovi's backends need fovi: {fovi_missing}")
    layers = args.layers or list(LAYERS)
    roof = roofline_of(device)
    print(f"# {args.mode} benchmark on {env['device']} (warp {env['warp']}, torch {env['torch']}), "
          f"records -> {out}", flush=True)
    print(f"# ceilings: {roof.words()}; "
          f"Warp's dense tile GEMM measured per stage tile shape", flush=True)
    if fovi_missing and not only:
        print(f"# fovi's own backends are not timed: {fovi_missing} (--no-fovi leaves them out without this line)",
              flush=True)
    t_start = time.perf_counter()
    metas = {}
    for name in layers:
        try:
            # fovi's synthetic test shapes (MAIN, ODD, PAD_HEAVY) are accepted too: quick smoke runs; fovi's own
            # network layers (fovi:...) are built from fovi's tables
            if name.startswith("fovi:"):
                from fovi_lab.integrations.fovi import network_layer_meta
                metas[name] = network_layer_meta(name, device)
            else:
                metas[name] = (synthetic_meta(name, device=device) if name in SYNTHETIC
                               else layer_meta(name, args.rf, device=device))
        except Exception as exc:  # noqa: BLE001
            print(f"# layer {name}: meta failed ({type(exc).__name__}: {exc}); skipped", flush=True)
    from fovi_lab.kernels.common import warp_device
    if device.type == "cuda" and not args.no_precompile:
        wdev = warp_device(torch.empty(0, device=device))
        precompile(_jobs_for(metas, args.batches, args.mode, args, wdev), args.jobs)
    prog = Progress(len(metas) * len(args.batches), "shapes")
    dense = _DenseCache()
    all_recs: List[dict] = []
    for name, meta in metas.items():
        for b in args.batches:
            if args.time_budget_s and time.perf_counter() - t_start > args.time_budget_s:
                print(f"# time budget of {args.time_budget_s:.0f}s spent: stopping before {name} B={b}", flush=True)
                break
            try:
                recs = run_shape(name, meta, b, args.mode, device, env, args, roof, dense)
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                recs = [dict(env, layer=name, B=b, mode=args.mode, impl="shape", ms=None, note="out of memory")]
            except Exception as exc:  # noqa: BLE001 - one failing shape must not end the run
                recs = [dict(env, layer=name, B=b, mode=args.mode, impl="shape", ms=None,
                             note=f"{type(exc).__name__}: {str(exc)[:300]}")]
                if args.verbose:
                    traceback.print_exc()
            append_jsonl(out, recs)
            all_recs += recs
            _print_shape(recs, args.mode)
            prog.step(f"{name} B={b}")
            if device.type == "cuda":
                torch.cuda.empty_cache()
        else:
            continue
        break
    _summary(all_recs, args.mode)
    if all_recs:
        print(f"# {len(all_recs)} records appended to {Path(out).resolve()}", flush=True)
        print(records_note(out), flush=True)
    return 0


def _check_only(args) -> None:
    """``--only`` names of the other mode's implementations (``warp_train`` in ``bench backward``, say), fovi's
    backends outside the train step, or the fused sweep's kernels without ``--sweep-fused``: a usage error, since
    the run would time nothing of them."""
    only = getattr(args, "only", None) or []
    ours = ("warp", "warp_staged", "warp_fused") if args.mode == "backward" else \
        ("warp_train", "warp_train_staged", "warp_train_fused")
    wrong = [n for n in only if (n.startswith("warp") and n not in ours and n not in ("warp_dx", "warp_dw"))
             or (n in ("warp_dx", "warp_dw") and not getattr(args, "sweep_fused", False))
             or (n.startswith("fovi_") and args.mode != "train-step")]
    if wrong:
        from fovi_lab.ops.arguments import usage_error
        usage_error(f"python -m fovi_lab bench {args.mode}",
                    f"--only: {', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} not timed by bench {args.mode} "
                    f"(its own: {', '.join(ours)}; warp_dx / warp_dw with --sweep-fused; torch_...; "
                    f"fovi_... in train-step)")


def main(argv=None) -> int:
    """``python -m fovi_lab.bench.backward [backward|train-step] [options]``: the benchmark of that mode
    (``backward`` when the first argument names none); see :data:`DESCRIPTIONS`. The same as
    ``python -m fovi_lab bench backward`` / ``bench train-step``. Returns the exit status; a usage error exits with
    status 2."""
    from fovi_lab.ops.arguments import CommandParser

    argv = list(sys.argv[1:] if argv is None else argv)
    mode = argv.pop(0) if argv and argv[0] in MODES else "backward"
    parser = CommandParser(prog=f"python -m fovi_lab bench {mode}", description=DESCRIPTIONS[mode])
    add_arguments(parser, mode)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
