"""The ops registry: backend name -> ops object.

An *ops* object is a class of static methods with a ``name``::

    forward(meta, x, weight, bias)   -> y  [B, Cout, Nout]   (compute dtype; inputs contiguous)
    grad_input(meta, grad_y, weight) -> dx [B, Cin, Nin]     fp32
    grad_weight(meta, grad_y, x)     -> dW [Cout, Q]         fp32
    backward_combined(meta, g, x, weight) -> (dx, dW)        optional, used when both are needed
    forward_only = True                                       optional: its adjoints raise NotImplementedError
    step_forward(meta, x, weight, bias, dtype) -> (y, token)  optional, with step_backward: KNNConvFunction's
    step_backward(meta, token, g, x, weight, bias_dtype, dtype, needs) -> (dx, dW, db)
                                                              train step, operands in their own dtypes, the casts
                                                              and the bias gradient inside the op (warp_train:
                                                              one replayed CUDA graph per direction)

The PyTorch backends (``torch_compact``, ``torch_binned``, ``torch_dense``) are registered here. Optional backends
register themselves when their module is
imported; :func:`load_optional_backends` imports the ones this package ships (by name, so the registry
depends on none of them, and a machine without warp-lang keeps the PyTorch backends).

An *estimator* prices a GPU call that neither a tune entry nor a record covers, for ``backend="auto"``
(:func:`fovi_lab.ops.dispatch.select_backend`): a function ``(meta, batch, device, training, candidates) ->
backend or None`` that a backend's module registers (:func:`register_estimator`; ``fovi_lab.knn_warp`` registers
the cost model's, :mod:`fovi_lab.kernels.cost_pick`).
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, List

from fovi_lab.ops.dense import DenseTorchOps
from fovi_lab.ops.reference import BinnedTorchOps, CompactTorchOps

__all__ = ["OPS_REGISTRY", "OPTIONAL_BACKEND_MODULES", "ESTIMATORS", "register_ops", "register_estimator", "get_ops",
           "load_optional_backends", "trains"]

OPS_REGISTRY: Dict[str, type] = {"torch_compact": CompactTorchOps, "torch_binned": BinnedTorchOps,
                                 "torch_dense": DenseTorchOps}

#: Modules that register more backends when imported (the Warp ops: ``warp_compact``, ``warp_train``).
OPTIONAL_BACKEND_MODULES = ("fovi_lab.knn_warp",)

_IMPORT_ERRORS: Dict[str, str] = {}     # module -> why it did not import (named in get_ops's error)

#: The registered estimators (see the module docstring), asked in order; the first answer counts.
ESTIMATORS: List[Callable] = []


def trains(ops) -> bool:
    """Whether a registered ops object computes gradients (every backend but one that sets ``forward_only``)."""
    return not getattr(ops, "forward_only", False)


def register_ops(ops) -> None:
    """Register a backend's ops object under ``ops.name`` (must expose name/forward/grad_input/grad_weight)."""
    missing = [a for a in ("name", "forward", "grad_input", "grad_weight") if not hasattr(ops, a)]
    if missing:
        raise TypeError(f"ops: {ops!r} lacks {', '.join(missing)}")
    OPS_REGISTRY[ops.name] = ops


def register_estimator(fn: Callable) -> None:
    """Register an estimator (the module docstring): ``fn(meta, batch, device, training, candidates)`` returns the
    backend it prices lowest among ``candidates``, or None where it prices none. Registering one twice keeps one."""
    if not callable(fn):
        raise TypeError(f"fn: expected a callable (meta, batch, device, training, candidates), got {fn!r}")
    if fn not in ESTIMATORS:
        ESTIMATORS.append(fn)


def load_optional_backends() -> None:
    """Import :data:`OPTIONAL_BACKEND_MODULES` (each registers its ops); one that cannot import is skipped."""
    for name in OPTIONAL_BACKEND_MODULES:
        try:
            importlib.import_module(name)
            _IMPORT_ERRORS.pop(name, None)          # an earlier failure is no longer the reason
        except ImportError as exc:
            _IMPORT_ERRORS[name] = f"{type(exc).__name__}: {exc}"


def get_ops(name: str):
    """The ops object registered as ``name``; an unknown name raises listing the known ones."""
    if name not in OPS_REGISTRY:
        load_optional_backends()
    try:
        return OPS_REGISTRY[name]
    except KeyError:
        why = "".join(f" ({m} did not import: {e})" for m, e in _IMPORT_ERRORS.items())
        raise KeyError(f"ops_name: unknown backend {name!r}; registered: {sorted(OPS_REGISTRY)}{why}") from None
