"""One plan per call signature: what ``warp_train`` runs for a call, decided on the first call and looked up after.

A call signature is the layer (its index tables), the batch, the compute dtype, the device and the settings the
decisions read (:data:`SWITCHES`), with the tune cache's state. Its :class:`CallPlan` holds:

* the forward kernel: the tune cache's pick where a tune measured this problem on this device
  (``python -m fovi_lab tune``), else the forward rule's (:func:`fovi_lab.kernels.forward.rules.pick`), or the
  first of its fallbacks that launches here;
* the adjoint plan (:class:`~fovi_lab.kernels.adjoint.rule.AdjointPlan`): the dx and dW paths, the tensor-core
  config, the fused kernels' tiles, segments and splits.

The forward of a call looks its plan up once and runs the plan's kernel; the backward of the same signature finds
the same plan. ``fovi_lab.call_plan(layer, batch, dtype, device)`` returns the plan a call would take, and printing
it says what runs, in words.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import torch

import fovi_lab.settings as settings
import fovi_lab.ops.tune_cache as tune_cache
from fovi_lab.graph.meta import TrainingMeta, meta_aux
from fovi_lab.kernels.adjoint import rule
from fovi_lab.kernels.families.registry import describe
from fovi_lab.kernels.forward import api
from fovi_lab.kernels.forward.build import VALIDATED

__all__ = ["CallPlan", "SWITCHES", "call_plan", "plan_of_call", "forget_tuned", "forward_path"]

#: Every setting a call's decisions read: the forward's, the adjoints' and the forward path's.
SWITCHES = tuple(dict.fromkeys(api._CALL_SWITCHES + rule.SWITCHES + ("FOVI_KNN_FWD_PATH",)))

_STALE_TUNED: set = set()


@dataclass(frozen=True)
class CallPlan:
    """What one call signature runs.

    Attributes:
        batch, dtype, device: the signature's batch, compute dtype and device (``"cpu"`` / ``"cuda:0"``...).
        forward: the forward kernel's id (a config name), or ``"binned"`` under ``FOVI_KNN_FWD_PATH=binned``.
        forward_source: ``"tune cache"``, ``"rule"`` or ``"FOVI_KNN_FWD_PATH"``.
        adjoint: the :class:`~fovi_lab.kernels.adjoint.rule.AdjointPlan` of dx and dW.
    """

    batch: int
    dtype: torch.dtype
    device: str
    forward: str
    forward_source: str
    adjoint: rule.AdjointPlan

    def __str__(self) -> str:
        dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(self.dtype, str(self.dtype))
        if self.forward == "binned":
            fwd = "the binned form (inputs binned by weight column, one shared-weight GEMM)"
        else:
            fwd = f"{describe(self.forward)}  [{self.forward}]"
        src = {"tune cache": "the tune cache's pick for this problem on this device",
               "rule": "the forward rule's pick", "FOVI_KNN_FWD_PATH": "FOVI_KNN_FWD_PATH"}[self.forward_source]
        return "\n".join([f"call plan at B = {self.batch} in {dtype} on {self.device}",
                          f"forward: {fwd}  ({src})",
                          f"dx: {rule.gradient_words(self.adjoint, 'dx')}",
                          f"dW: {rule.gradient_words(self.adjoint, 'dW')}"])

    __repr__ = __str__


def forward_path() -> str:
    """The forward path of a ``warp_compact`` / ``warp_train`` call: ``"compact"`` (a GEMM per output node: the
    forward kernels' rule) unless ``FOVI_KNN_FWD_PATH=binned`` asks for the binned form (bin the inputs by weight
    column, then one shared-weight tensor-core GEMM: :mod:`fovi_lab.kernels.forward.binned`). ``auto`` (the
    default) is ``compact``: on the H200, replayed, the binned form lost to PyTorch's fastest forward at every B from
    1 to 16 on all 13 layers but the ResNet-18 stem, and to the compact kernels but for small gains on three AlexNet
    layers at B = 1 (data/h200/forward_binned.jsonl.gz)."""
    return "binned" if settings.get("FOVI_KNN_FWD_PATH") == "binned" else "compact"


def _key(x: torch.Tensor):
    return ("call_plan", int(x.shape[0]), x.dtype, str(x.device), settings.snapshot(SWITCHES),
            tune_cache.generation, tune_cache.bypassed(), VALIDATED.generation)


def plan_of_call(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor) -> CallPlan:
    """The :class:`CallPlan` of a call with these operands (``x`` and ``weight`` in the compute dtype, ``meta`` on
    their device), decided on the signature's first call and looked up after (cached with ``meta``)."""
    key = _key(x)
    aux = meta_aux(meta)
    plan = aux.get(key)
    if plan is None:
        plan = aux[key] = _decide(meta, x, weight)
    return plan


def forget_tuned(meta: TrainingMeta, x: torch.Tensor, config: str) -> None:
    """Mark a tuned forward ``config`` that failed to run as stale (the rule picks from now on) and drop the plan
    of ``x``'s signature, so the next call decides again."""
    _STALE_TUNED.add(config)
    meta_aux(meta).pop(_key(x), None)


def _decide(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor) -> CallPlan:
    adjoint = rule.adjoint_plan(meta, x.shape[0], x.dtype, x.device)
    common = dict(batch=int(x.shape[0]), dtype=x.dtype, device=str(x.device), adjoint=adjoint)
    if forward_path() == "binned":
        return CallPlan(forward="binned", forward_source="FOVI_KNN_FWD_PATH", **common)
    tables = (meta.input_linear, meta.weight_linear)
    tuned = tune_cache.tuned_forward_config(meta, x)
    if tuned is not None and tuned not in _STALE_TUNED:
        try:
            built = api.resolve_uncached(x, weight, None, *tables, config=tuned)[0]
            return CallPlan(forward=built.config.name, forward_source="tune cache", **common)
        except (ValueError, RuntimeError) as exc:       # renamed, or no longer launchable, since the tune
            _STALE_TUNED.add(tuned)
            warnings.warn(f"the tuned forward config {tuned!r} of the tune cache {tune_cache.cache_path()} does not "
                          f"run here ({exc}); running the rule's pick (tune again, or delete the cache)",
                          RuntimeWarning, stacklevel=5)
    built = api.resolve_uncached(x, weight, None, *tables)[0]
    return CallPlan(forward=built.config.name, forward_source="rule", **common)


def call_plan(layer, batch: int, dtype="fp16", device=None, rf: Optional[str] = None) -> CallPlan:
    """The :class:`CallPlan` a ``warp_train`` call of ``layer`` (a name of :data:`fovi_lab.graph.layers.LAYERS` or a
    :class:`~fovi_lab.graph.meta.TrainingMeta`) at ``batch`` in ``dtype`` (``"fp16"`` / ``"bf16"`` or the torch
    dtype) on ``device`` (default: the current CUDA device, else the CPU) takes. Decides it (building and checking
    the forward kernel, as a first call does) where no call of that signature has."""
    from fovi_lab.graph.layers import LAYERS, layer_meta
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16, torch.float16: torch.float16,
              torch.bfloat16: torch.bfloat16}
    if dtype not in dtypes:
        raise ValueError(f"dtype: expected 'fp16' or 'bf16' (warp_train's compute dtypes), got {dtype!r}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch: expected an integer >= 1, got {batch!r}")
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if isinstance(layer, str):
        if layer not in LAYERS:
            raise ValueError(f"layer: unknown {layer!r}; known: {', '.join(LAYERS)}")
        meta = layer_meta(layer, rf, device=device) if rf is not None else layer_meta(layer, device=device)
    elif isinstance(layer, TrainingMeta):
        meta = layer.to(device)
    else:
        raise TypeError(f"layer: expected a layer name or a TrainingMeta, got {type(layer).__name__}")
    dt = dtypes[dtype]
    x = torch.empty(batch, meta.cin, meta.nin, dtype=dt, device=device)
    w = torch.empty(meta.cout, meta.q, dtype=dt, device=device)
    return plan_of_call(meta, x, w)
