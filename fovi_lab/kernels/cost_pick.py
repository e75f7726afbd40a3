"""What ``backend="auto"`` takes on a GPU where neither a tune entry nor a record covers the call: the backend that
the cost model (:mod:`fovi_lab.kernels.cost_model`) prices lowest, and the estimates :func:`fovi_lab.explain` shows.

The model is fitted once per process on every GPU's forward records in the ``backends`` scope (per layer and batch,
the latest run: the rules' Warp kernel beside ``torch_compact`` and ``torch_binned``), the scope whose picks it
makes within 10% of the fastest on 95-97% of the shapes of a GPU it was not fitted on (docs/cost_model.md). A call
is priced on the device's datasheet peaks (:data:`fovi_lab.ops.devices.DEVICES`): a GPU without them (a model
:data:`~fovi_lab.ops.devices.DEVICES` does not list) gets no estimate, and ``auto`` keeps ``torch_compact``.

The model prices forwards. For a train step it ranks the backends by their forwards (each backward is two products
of the forward's size, gathered like it), which :func:`estimate_words` says where it answers.
"""

from __future__ import annotations

import functools
from typing import Dict, Optional

import torch

from fovi_lab.kernels.cost_model import CostModel, fit, latest, timed_shapes
from fovi_lab.kernels.families.base import Problem
from fovi_lab.kernels.forward.rules import pick
from fovi_lab.ops.devices import DeviceSpec, device_spec

__all__ = ["WARP_BACKENDS", "calibrated", "backend_estimates", "estimated_pick", "estimate_words", "estimator",
           "lowest", "words"]

#: The Warp backend of each mode, priced by the rules' forward kernel for the call.
WARP_BACKENDS = {"forward": "warp_compact", "train-step": "warp_train"}
#: The PyTorch backends the model prices, by the form it fitted.
_FORMS = {"torch_compact": "torch_compact", "torch_binned": "torch_binned"}


@functools.lru_cache(maxsize=1)
def calibrated() -> Optional[CostModel]:
    """The model fitted on every GPU's forward records (``backends`` scope, the latest run of each layer and
    batch), once per process; None where the records give no group to fit."""
    from fovi_lab.ops.records import iter_records
    try:
        return fit(latest(timed_shapes(iter_records(auto=True), scope="backends"), "backends"))
    except ValueError:
        return None


def backend_estimates(meta, batch: int, spec: DeviceSpec, training: bool,
                      model: Optional[CostModel] = None) -> Dict[str, float]:
    """``{backend: estimated ms of its forward}`` for an fp16 call of ``meta``'s layer at ``batch`` on ``spec``:
    the Warp backend of the mode (priced by the kernel the forward rules pick) and the PyTorch backends; empty on
    the CPU, on a GPU without datasheet peaks, or without a fitted model (``model``: default :func:`calibrated`)."""
    if spec.is_cpu or not spec.tensor_tflops or not spec.hbm_tbps:
        return {}
    model = model if model is not None else calibrated()
    if model is None:
        return {}
    problem = Problem.of(meta, batch)
    kernel = pick(problem.batch, problem.cout, problem.nout, problem.p64, problem.cin, problem.node_major,
                  q=problem.q)
    priced = {WARP_BACKENDS["train-step" if training else "forward"]: model.ms(kernel, problem, spec)}
    priced.update({backend: model.ms(form, problem, spec) for backend, form in _FORMS.items()})
    return {b: ms for b, ms in priced.items() if ms is not None}


def estimated_pick(meta, batch: int, spec: DeviceSpec, training: bool, candidates=None) -> Optional[str]:
    """The backend among ``candidates`` (default: every one priced) with the lowest estimate, or None where none
    is priced."""
    return lowest(backend_estimates(meta, batch, spec, training), candidates)


def lowest(estimates: Dict[str, float], candidates=None) -> Optional[str]:
    """The backend of ``estimates`` (among ``candidates``, default all) with the lowest estimate, or None."""
    est = {b: ms for b, ms in estimates.items() if candidates is None or b in candidates}
    return min(est, key=lambda b: (est[b], b)) if est else None


def estimate_words(meta, batch: int, spec: DeviceSpec, training: bool) -> str:
    """The estimates in one phrase (``""`` where there are none): each backend's forward, the lowest first."""
    return words(backend_estimates(meta, batch, spec, training), spec, training)


def words(estimates: Dict[str, float], spec: DeviceSpec, training: bool) -> str:
    """:func:`estimate_words` of estimates already made (:func:`backend_estimates`)."""
    if not estimates:
        return ""
    shown = ", ".join(f"{b} {ms:.3g} ms" for b, ms in sorted(estimates.items(), key=lambda kv: (kv[1], kv[0])))
    what = " (their forwards: the model prices forwards)" if training else ""
    return f"the cost model's estimates on {spec.name}'s datasheet peaks{what}: {shown}"


def estimator(meta, batch: int, device, training: bool, candidates) -> Optional[str]:
    """The estimator :mod:`fovi_lab.knn_warp` registers (:func:`fovi_lab.ops.registry.register_estimator`):
    :func:`estimated_pick` on ``device``'s spec (a CUDA device: its driver name, with the datasheet peaks of
    :data:`~fovi_lab.ops.devices.DEVICES` where it is one of their models)."""
    return estimated_pick(meta, batch, device_spec(device), training, candidates)
