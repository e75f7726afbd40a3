"""``fovi_lab.explain``: what ``warp_train`` runs for a layer at a batch size, and why each other kernel family is
not what it runs.

    >>> import fovi_lab
    >>> print(fovi_lab.explain("alex_L1", 64, device="h200"))   # doctest: +SKIP

or ``python -m fovi_lab explain --layer alex_L1 --batch 64 --device h200``.

prints the call's shape, the forward kernel the rules pick (in words, with its id and the rule that picked
it), the paths of dx and dW, and for every kernel family (forward, and adjoint after them) either the reasons none
of its points can run the call (the xformers ``not_supported_reasons`` idea) or that it can, with its best
registered point by the roofline and why the rules take another. The decisions are the production ones
(:func:`fovi_lab.kernels.forward.rules.pick`, :func:`fovi_lab.knn_warp.grad_paths`), read, not re-derived.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Tuple, Union

import torch

from fovi_lab.kernels.families import DeviceSpec, Estimate, Point, Problem, describe, device_spec, family, lookup
from fovi_lab.kernels.families.registry import ADJOINT_FAMILIES, FAMILIES, presets
from fovi_lab.ops.arguments import command_main

_DTYPES = {"fp16": torch.float16, "float16": torch.float16, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class FamilyVerdict:
    """One family's answer for the call: ``chosen``, ``runs`` (how many of its registered points can, and the
    lowest roofline among them) or ``cannot run`` (the reasons, one per distinct cause)."""

    family: str
    title: str
    status: str
    reasons: Tuple[str, ...] = ()
    runnable: int = 0
    estimate: Optional[Estimate] = None


@dataclass(frozen=True)
class Explanation:
    problem: Problem
    device: DeviceSpec
    forward: Point
    forward_rule: str
    forward_estimate: Estimate
    fallback: Optional[Point]
    dx: str
    dw: str
    families: Tuple[FamilyVerdict, ...] = field(default=())
    auto: str = ""
    tables: str = ""
    adjoints: Tuple[FamilyVerdict, ...] = field(default=())

    def __str__(self) -> str:
        p = self.problem
        lines = [f"{p.words()}", f"on {self.device.words()}", "",
                 f"forward: {describe(self.forward)}  [{self.forward.id}]",
                 f"  picked by {self.forward_rule}",
                 f"  roofline: {self.forward_estimate.words()}"]
        if self.fallback is not None:
            lines.append(f"  where the tensor cores cannot launch (before sm_80) or FOVI_WARP_MMA=off: "
                         f"{describe(self.fallback)}  [{self.fallback.id}]")
        lines += [f"dx: {self.dx}", f"dW: {self.dw}"]
        if self.tables:
            lines.append(f"index tables kept on the device: {self.tables}")
        if self.auto:
            lines.append(f"backend auto: {self.auto}")
        lines += ["", "families:"]
        for v in self.families:
            head = f"  {v.title}: {v.status}"
            if v.status == "runs":
                head += f" ({v.runnable} registered point{'s' if v.runnable != 1 else ''} can"
                if v.estimate is not None and v.estimate.ms is not None:
                    head += f"; roofline {v.estimate.words()}"
                head += ")"
            lines.append(head)
            lines += [f"    - {r}" for r in v.reasons]
        if self.adjoints:
            lines += ["", "adjoint families:"]
        for v in self.adjoints:
            parts = [f"{v.runnable} registered point{'s' if v.runnable != 1 else ''} can"] if v.runnable else []
            if v.estimate is not None and v.estimate.ms is not None:
                parts.append(f"roofline {v.estimate.words()}")
            lines.append(f"  {v.title}: {v.status}" + (f" ({'; '.join(parts)})" if parts else ""))
            lines += [f"    - {r}" for r in v.reasons]
        return "\n".join(lines)

    __repr__ = __str__


def _problem(layer, batch: int, dtype, rf: Optional[str]) -> Tuple[Problem, object]:
    from fovi_lab.graph.meta import TrainingMeta
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPES:
            raise ValueError(f"dtype: expected fp16 or bf16, got {dtype!r}")
        dtype = _DTYPES[dtype.lower()]
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype: warp_train computes in fp16 or bf16, got {dtype}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch: expected an integer >= 1, got {batch!r}")
    if isinstance(layer, str) and layer.startswith("fovi:"):       # a layer of fovi's own networks
        from fovi_lab.integrations.fovi import _expand_with_fovi, network_layer_meta
        try:
            if _expand_with_fovi(layer) != [layer]:
                raise ValueError(f"layer: {layer!r} names several layers of fovi's network; give one (its :<i>)")
        except ImportError as exc:
            raise ValueError(f"layer: {exc}") from None
        meta, name = network_layer_meta(layer), layer
    elif isinstance(layer, str):
        from fovi_lab.graph.layers import LAYERS, layer_meta, resolve_layer
        try:
            resolve_layer(layer, rf)
        except KeyError:
            raise ValueError(f"layer: unknown {layer!r}; known: {', '.join(LAYERS)} (or <layer>_rf1 / _rf2)") from None
        meta, name = layer_meta(layer, rf), layer
    elif isinstance(layer, TrainingMeta):
        meta, name = layer, None
    else:
        raise TypeError(f"layer: expected a layer name or a TrainingMeta, got {type(layer).__name__}")
    meta = meta.to("cpu")
    return Problem.of(meta, batch, dtype, layer=name), meta


def _grad_words(meta, problem: Problem, spec: DeviceSpec) -> Tuple[str, str]:
    from fovi_lab.kernels.adjoint.rule import adjoint_plan, gradient_words
    plan = adjoint_plan(meta, problem.batch, problem.dtype, device="cpu" if spec.is_cpu else "cuda")
    return gradient_words(plan, "dx"), gradient_words(plan, "dW")


def _adjoint_verdicts(meta, problem: Problem, spec: DeviceSpec) -> Tuple[FamilyVerdict, ...]:
    """Each adjoint family's answer for the call: the gradients the adjoint plan runs on it (a path's families are
    those whose kernel factories are in the module of its name: ``fused``, ``staged``), else how many of its
    registered points can run the call, or the reasons none can."""
    from fovi_lab.kernels.adjoint.rule import adjoint_plan
    plan = adjoint_plan(meta, problem.batch, problem.dtype, device="cpu" if spec.is_cpu else "cuda")
    picked = {pick.point.family: pick.point for pick in plan.fused or ()}       # the fused picks' own points
    out = []
    for fam in ADJOINT_FAMILIES:
        runs = [w for w in ("dx", "dW") if fam.module.rsplit(".", 1)[1] == plan.path(w) and fam.gradient in ("", w)]
        points = [p.point for p in presets(fam.key)]
        checked = [(pt, fam.check(pt, problem, spec)) for pt in points]
        runnable = [pt for pt, reasons in checked if not reasons]
        best = min((fam.estimate(pt, problem, spec) for pt in runnable), default=None,
                   key=lambda e: e.ms if e.ms is not None else 0.0)
        pick = picked.get(fam.key)
        cannot = fam.check(pick, problem, spec) if pick is not None else [] if runnable else \
            list(dict.fromkeys(r for _, rs in checked for r in rs))
        if runs and cannot:
            out.append(FamilyVerdict(fam.key, fam.title, "cannot run", tuple(cannot) + (
                f"the plan's path for {' and '.join(runs)}: where it cannot launch, a call falls back (warning)",)))
        elif runs:
            est = fam.estimate(pick, problem, spec) if pick is not None else best
            named = f": {describe(pick)}  [{pick.id}]" if pick is not None else ""
            out.append(FamilyVerdict(fam.key, fam.title, f"runs {' and '.join(runs)}{named}", (), len(runnable), est))
        elif runnable:
            out.append(FamilyVerdict(fam.key, fam.title, "can run", ("not the plan's path for dx or dW",),
                                     len(runnable), best))
        else:
            reasons = tuple(dict.fromkeys(r for _, rs in checked for r in rs))
            out.append(FamilyVerdict(fam.key, fam.title, "cannot run", reasons))
    return tuple(out)


def _tables_words(meta, problem: Problem, spec: DeviceSpec) -> str:
    """What the layer keeps between calls for this call's plan: its own tables and the derived layers its adjoints
    build (:func:`fovi_lab.graph.meta.held_bytes` of each, built here on the CPU), in MiB."""
    from fovi_lab.graph.meta import expanded_meta, held_bytes, tap_meta, transposed_meta
    from fovi_lab.kernels.adjoint.rule import adjoint_plan
    plan = adjoint_plan(meta, problem.batch, problem.dtype, device="cpu" if spec.is_cpu else "cuda")
    parts = [f"its own {held_bytes(meta, derived=False) / 2**20:.1f} MiB"]
    if plan.dx == "mma":
        parts.append(f"the transposed layer (dx on tensor cores) {held_bytes(transposed_meta(meta)) / 2**20:.1f} MiB")
    elif plan.dx == "taps":
        parts.append(f"the tap-expanded layer (dx) {held_bytes(expanded_meta(meta)) / 2**20:.1f} MiB")
    if plan.dw == "mma":
        rows = plan.dw_batch_chunk or problem.batch
        which = f"of a {rows}-row batch chunk" if rows < problem.batch else f"at B = {rows}"
        parts.append(f"the tap layer {which} (dW on tensor cores) {held_bytes(tap_meta(meta, rows)) / 2**20:.1f} MiB")
    return "; ".join(parts) + " (shared by every layer of the same graph)"


def _auto_words(meta, problem: Problem, spec: DeviceSpec) -> str:
    """What ``backend="auto"`` takes for a training call on ``spec`` from the records (a tune on the device itself
    comes first and is not read here)."""
    if spec.is_cpu:           # this machine's measurement (the tune cache) or the estimate; nothing runs here
        from fovi_lab.ops.cpu_auto import known_choice
        picks = [known_choice(meta, problem.batch, d, True).words()
                 for d in dict.fromkeys((torch.float32, problem.dtype))]
        return "on this CPU:\n  " + "\n  ".join(picks)
    if problem.dtype != torch.float16:
        return "torch_compact (the records are fp16 runs; python -m fovi_lab tune --dtype bf16 tunes bf16)"
    from fovi_lab.kernels.cost_pick import backend_estimates, lowest, words
    from fovi_lab.ops.dispatch import lookup_records, recorded_table
    shape = (meta.cin, meta.cout, meta.nin, meta.nout, meta.k, meta.p64, meta.v)
    backend, dev = lookup_records(recorded_table(), spec.name, spec.arch, "train-step", shape, problem.batch,
                                  ("warp_train", "torch_compact", "torch_binned"))
    estimates = backend_estimates(meta, problem.batch, spec, True)
    est = words(estimates, spec, True)
    if backend is None:
        none = (f"no train-step record of {spec.name} or of another sm_{spec.arch} GPU covers this layer within a "
                f"factor 2 of B (python -m fovi_lab tune measures it on the GPU)")
        picked = lowest(estimates)
        if picked is None:
            return f"torch_compact: {none}, and the cost model prices nothing on this device (no datasheet peaks)"
        return f"{picked}: {none}; {est}"
    src = "its own records" if dev == spec.name else f"the records of the {dev} (the same sm_{spec.arch})"
    tail = f"\n  beside it, {est}" if est else ""
    return f"{backend} for training, the fastest in {src}, unless a tune on the device says otherwise{tail}"


def explain(layer: Union[str, object], batch: int, dtype: Union[str, torch.dtype] = "fp16",
            device: Union[None, str, torch.device, DeviceSpec] = None, rf: Optional[str] = None) -> Explanation:
    """What ``warp_train`` runs for ``layer`` at ``batch`` in ``dtype`` on ``device``, and why.

    Args:
        layer: a layer name of :data:`fovi_lab.graph.layers.LAYERS`, a layer of fovi's own networks
            (``fovi:resnet18@64:0``: :func:`fovi_lab.integrations.fovi.network_layers`) or a
            :class:`~fovi_lab.graph.meta.TrainingMeta`.
        batch: B. dtype: ``"fp16"`` / ``"bf16"`` (or the torch dtype).
        device: ``"h200"`` / ``"h100"`` / ``"a100"`` (their datasheet peaks and limits), ``"cpu"``, a CUDA device,
            or None (the current one). The forward and the adjoint paths are decided the same on every device;
            the fused adjoints' segments and splits differ between a GPU and the CPU (whole lists and one split
            there); the checks and the roofline read the device.
        rf: the reference frame of a named layer (default: its network's).

    Returns an :class:`Explanation`; printing it (or its repr in a notebook) gives the text.
    """
    from fovi_lab.kernels.forward.rules import pick, pick_reason
    problem, meta = _problem(layer, batch, dtype, rf)
    spec = device_spec(device)
    bf16 = problem.dtype == torch.bfloat16
    args = (problem.batch, problem.cout, problem.nout, problem.p64, problem.cin, problem.node_major)
    name = pick(*args, q=problem.q, bf16=bf16)
    chosen = lookup(name)
    fallback = None if bf16 else lookup(pick(*args, q=problem.q, mma=False))
    chosen_family = family(chosen.family)
    verdicts: List[FamilyVerdict] = []
    for fam in FAMILIES:
        if fam.inference_only:
            verdicts.append(FamilyVerdict(fam.key, fam.title, "not a training kernel",
                                          ("it reads the cached effective weight: inference only (warp_cached)",)))
            continue
        candidates = [p.point for p in presets(fam.key, experimental=False)] or \
                     [p.point for p in presets(fam.key)]
        runnable, why_not = [], []
        for pt in candidates:
            reasons = fam.check(pt, problem, spec)
            if reasons:
                why_not.extend(reasons)
            else:
                runnable.append(pt)
        if not runnable:
            distinct = tuple(dict.fromkeys(why_not))
            verdicts.append(FamilyVerdict(fam.key, fam.title, "cannot run", distinct))
            continue
        best_est = min((fam.estimate(pt, problem, spec) for pt in runnable),
                       key=lambda e: e.ms if e.ms is not None else 0.0)
        if fam is chosen_family:
            verdicts.append(FamilyVerdict(fam.key, fam.title, "chosen", (), len(runnable),
                                          fam.estimate(chosen, problem, spec)))
            continue
        if bf16:
            why = "not chosen: bf16 runs on the register tensor-core kernels alone"
        elif fallback is not None and fam.key == fallback.family:
            why = (f"not chosen: the tensor-core kernels are the pick wherever mma.sync can launch; this family is the "
                   f"rules' choice without them ({describe(fallback)}  [{fallback.id}])")
        elif fam.mma_sync:                                    # the other mma.sync family: the rule's line
            why = f"not chosen: {pick_reason(*args, name=name)}"
        else:
            why = "not chosen: the tensor-core kernels are the pick wherever mma.sync can launch"
        verdicts.append(FamilyVerdict(fam.key, fam.title, "runs", (why,), len(runnable), best_est))
    return Explanation(problem, spec, chosen, pick_reason(*args, name=name, bf16=bf16),
                       chosen_family.estimate(chosen, problem, spec), fallback, *_grad_words(meta, problem, spec),
                       families=tuple(verdicts), auto=_auto_words(meta, problem, spec),
                       tables=_tables_words(meta, problem, spec), adjoints=_adjoint_verdicts(meta, problem, spec))




# ------------------------------------------------------------------------------------------------ command line

#: The help text of ``python -m fovi_lab explain``.
DESCRIPTION = """\
Say what warp_train runs for a layer at a batch size, and why: the forward kernel the rules pick (in words, with
its id and the rule), the paths of dx and dW, and for every kernel family (forward and adjoint) either why none of
its points can run the call or that it can, with its roofline on the device. Nothing is compiled or launched.

  python -m fovi_lab explain --layer res18_layer1 --batch 16
  python -m fovi_lab explain --layer alex_L1 --batch 64 --dtype bf16 --device h200
"""


def add_arguments(parser) -> None:
    from fovi_lab.graph.layers import LAYERS
    from fovi_lab.kernels.families.registry import DEVICES
    from fovi_lab.ops.arguments import COUNT, layer_name

    import fovi_lab.integrations.fovi  # noqa: F401  (its layer source: --layer fovi:resnet18@64:0)
    parser.add_argument("--layer", type=layer_name, default="res18_layer1",
                        help=f"one of {', '.join(LAYERS)}, a variant <layer>_rf1 / <layer>_rf2, or a layer of "
                             f"fovi's own networks, fovi:<net>@<in_res>:<i> (fovi:resnet18@64:0, its stem)")
    parser.add_argument("--batch", type=COUNT, default=16, help="images in the batch")
    parser.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16", help="the compute dtype")
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help=f"{', '.join(k for k in DEVICES if k != 'cpu')} (their datasheet limits and peaks), "
                             f"cpu, or cuda[:i] (default: the current device)")


def run(args) -> int:
    from fovi_lab.ops.arguments import usage_error
    try:
        text = str(explain(args.layer, args.batch, args.dtype, args.device))
    except ValueError as exc:
        usage_error("python -m fovi_lab explain", f"--{str(exc).split(':', 1)[0]}: {str(exc).split(': ', 1)[1]}")
    print(text)
    return 0


main = command_main("python -m fovi_lab explain", DESCRIPTION, add_arguments, run)


__all__ = ["explain", "Explanation", "FamilyVerdict", "DESCRIPTION", "add_arguments", "run", "main"]
