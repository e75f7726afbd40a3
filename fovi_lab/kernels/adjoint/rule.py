"""The adjoint rule of ``warp_train``: which kernels compute dx and dW of a call, decided once per (layer, batch,
dtype, switches) and held in a frozen :class:`AdjointPlan`.

Each gradient runs on one of three paths:

* ``"mma"``: the tensor cores, as the forward of a derived layer (dx: the transposed layer; dW: the tap layer;
  :mod:`fovi_lab.kernels.adjoint.as_forward`), where :func:`~fovi_lab.kernels.adjoint.as_forward.select_grad_mma`
  picks them (fp16 calls of at least ``MMA_GRAD_MIN_GFLOP`` at B >= 16 on layers with Cin >= 16 and little list
  padding), or where ``FOVI_KNN_DX_PATH`` / ``FOVI_KNN_DW_PATH`` = ``mma`` forces them;
* ``"fused"``: the node-major kernels of :mod:`fovi_lab.kernels.adjoint.fused` (one launch per gradient, no
  stage) on layers with ``Cin >= FUSED_MIN_CIN``;
* ``"staged"``: fovi's stage + reverse-index design (:mod:`fovi_lab.kernels.adjoint.staged`), on the stems.

``FOVI_KNN_GRAD_PATH`` (``fused`` / ``staged`` / ``auto``) overrides the fused-or-staged choice. The plan is
cached with the layer's tables (:func:`fovi_lab.graph.meta.meta_aux`), keyed by batch, dtype and the values of
the three switches, so a training step looks it up instead of deciding again; where a path cannot launch on
the device, the caller falls back (:mod:`fovi_lab.knn_warp`), as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

import fovi_lab.settings as settings
from fovi_lab.graph.meta import meta_aux

#: Layers with at least this many input channels take the fused node-major adjoints; the stems (Cin = 3) the staged
#: ones (their 3-channel rows make a fused tile mostly padding).
FUSED_MIN_CIN = 16

#: The switches the plan reads (a change decides anew).
SWITCHES = ("FOVI_KNN_GRAD_PATH", "FOVI_KNN_DX_PATH", "FOVI_KNN_DW_PATH")


@dataclass(frozen=True)
class AdjointPlan:
    """The adjoint paths of one call signature.

    Attributes:
        dx, dw: ``"mma"``, ``"fused"`` or ``"staged"``.
        kernels: the fused / staged path (what a gradient off the tensor cores runs, and the fallback of ``"mma"``).
        mma_config: the tensor-core config the rule picked (None: no pick, or a forced ``mma`` path that takes the
            split configs' default rule).
        forced: ``(dx, dW)`` put on the tensor cores by a switch (a fallback then warns; the rule's pick gives way
            quietly).
    """

    dx: str
    dw: str
    kernels: str
    mma_config: Optional[str]
    forced: Tuple[bool, bool] = (False, False)

    def path(self, which: str) -> str:
        return self.dx if which == "dx" else self.dw


def kernels_path(meta=None) -> str:
    """The fused-or-staged path of a layer (``FOVI_KNN_GRAD_PATH`` overrides; ``auto``: by Cin)."""
    path = settings.get("FOVI_KNN_GRAD_PATH")
    if path == "auto":
        return "fused" if meta is None or meta.cin >= FUSED_MIN_CIN else "staged"
    return path


def decide(meta, batch: int, dtype: torch.dtype) -> AdjointPlan:
    """The plan of ``meta`` at ``batch`` in ``dtype`` under the current switches (no cache: :func:`adjoint_plan`)."""
    from fovi_lab.kernels.adjoint.as_forward import select_grad_mma
    kernels = kernels_path(meta)
    switches = {"dx": settings.get("FOVI_KNN_DX_PATH"), "dW": settings.get("FOVI_KNN_DW_PATH")}
    config = None
    if any(v != "off" for v in switches.values()):
        config = select_grad_mma(meta, batch, dtype)

    def one(which: str) -> str:
        sw = switches[which]
        if sw == "off":
            return kernels
        return "mma" if sw == "mma" or config is not None else kernels
    return AdjointPlan(one("dx"), one("dW"), kernels, config,
                       (switches["dx"] == "mma", switches["dW"] == "mma"))


def adjoint_plan(meta, batch: int, dtype: torch.dtype) -> AdjointPlan:
    """The :class:`AdjointPlan` of a call, decided on its first call and then looked up (cached with ``meta``, keyed
    by batch, dtype and :data:`SWITCHES`)."""
    key = ("adjoint_plan", int(batch), dtype, settings.snapshot(SWITCHES))
    aux = meta_aux(meta)
    plan = aux.get(key)
    if plan is None:
        plan = aux[key] = decide(meta, batch, dtype)
    return plan


def forget_plans(meta) -> None:
    """Drop the plans cached with ``meta`` (for a caller that changed the rule's thresholds, such as a test)."""
    aux = meta_aux(meta)
    for key in [k for k in aux if isinstance(k, tuple) and k[:1] == ("adjoint_plan",)]:
        del aux[key]


__all__ = ["AdjointPlan", "forget_plans", "FUSED_MIN_CIN", "SWITCHES", "adjoint_plan", "decide", "kernels_path"]
