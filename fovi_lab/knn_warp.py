"""Warp kernels for compact KNN convolution inference and training: the public API surface.

Forward kernels (:mod:`fovi_lab.warp_forward`) plus explicit adjoint kernels
(:mod:`fovi_lab.warp_adjoint`). Warp autodiff is never used (``enable_backward=False`` everywhere);
gradients are explicit adjoint kernels, registered with the :mod:`fovi_lab.knn_autograd` ops registry
as ``warp_train``. ``warp_compact`` is the forward-only ops object (its gradients raise and point to
``warp_train``).

Importing this module registers both ops objects. All Warp ops compute in fp16 (``compute_dtypes``)
and reject other dtypes with an error naming the argument.
"""

from __future__ import annotations

import torch

from .knn_autograd import register_ops
from .meta import TrainingMeta
from .warp_adjoint import (  # noqa: F401  (re-exported seed API)
    _canary_grad_stage_ok,
    _get_grad_kernel,
    _make_grad_input_stage2_kernel,
    _make_grad_weight_stage2_kernel,
    _make_grad_weight_stage3_kernel,
    _make_grad_weight_stage4_kernel,
    _pad_flat_input_fp16,
    grad_input,
    grad_weight,
)
from .warp_forward import (  # noqa: F401  (re-exported seed API)
    _UNCACHED_BATCH_CONFIG_SPECS,
    _canary_launch_ok,
    _get_uncached_batch_config,
    _make_uncached_kernel,
    _make_uncached_r2_kernel,
    _make_uncached_r4_kernel,
    _make_cached_kernel,
    _pad_bias_to_tiles,
    _select_uncached_batch_config,
    run_cached,
    run_uncached,
)

__all__ = [
    "run_uncached", "run_cached", "grad_input", "grad_weight", "WarpCompactOps", "WarpTrainOps",
    "_register_ops",
]


def _forward(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    meta = meta.to(x.device)
    return run_uncached(x, weight, bias, meta.input_linear, meta.weight_linear)


class WarpCompactOps:
    """Forward-only ops object (registry name ``warp_compact``): the uncached Warp forward."""

    name = "warp_compact"
    compute_dtypes = (torch.float16,)
    forward = staticmethod(_forward)

    @staticmethod
    def grad_input(meta, grad_y, weight):
        raise NotImplementedError("warp_compact is forward-only; use the 'warp_train' backend to train")

    @staticmethod
    def grad_weight(meta, grad_y, x):
        raise NotImplementedError("warp_compact is forward-only; use the 'warp_train' backend to train")


class WarpTrainOps:
    """Train-capable Warp ops (``warp_train``): fp16 compute, fp32 deterministic gradients."""

    name = "warp_train"
    compute_dtypes = (torch.float16,)
    forward = staticmethod(_forward)

    @staticmethod
    def grad_input(meta, grad_y, weight):
        return grad_input(meta.to(grad_y.device), grad_y, weight)

    @staticmethod
    def grad_weight(meta, grad_y, x):
        return grad_weight(meta.to(grad_y.device), grad_y, x)


def _register_ops(ops) -> None:
    """Register a kernel backend's ops object (must expose name/forward/grad_input/grad_weight)."""
    register_ops(ops)


_register_ops(WarpCompactOps)
_register_ops(WarpTrainOps)
