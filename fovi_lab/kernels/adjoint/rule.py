"""The adjoint rule of ``warp_train``: which kernels compute dx and dW of a call, decided once per (layer, batch,
dtype, switches) and held in a frozen :class:`AdjointPlan`.

Each gradient runs on one of four paths:

* ``"mma"``: the tensor cores, as the forward of a derived layer (dx: the transposed layer; dW: the tap layer;
  :mod:`fovi_lab.kernels.adjoint.as_forward`), where :func:`~fovi_lab.kernels.adjoint.as_forward.select_grad_mma`
  picks them (fp16 calls of at least ``MMA_GRAD_MIN_GFLOP`` at B >= 16 on layers with Cin >= 16 and little list
  padding), or where ``FOVI_KNN_DX_PATH`` / ``FOVI_KNN_DW_PATH`` = ``mma`` forces them;
* ``"fused"``: the node-major kernels of :mod:`fovi_lab.kernels.adjoint.fused` (one launch per gradient, no
  stage) on layers with ``Cin >= FUSED_MIN_CIN``;
* ``"taps"`` (dx only, where ``FOVI_KNN_DX_PATH=taps`` asks, fp16 calls): the tensor cores, as the forward of
  the tap-expanded layer (output channels ``c*V + t``), then a reverse-list sum
  (:func:`~fovi_lab.kernels.adjoint.as_forward.grad_input_taps`): the stems' dx on the tensor cores;
* ``"staged"``: fovi's stage + reverse-index design (:mod:`fovi_lab.kernels.adjoint.staged`), on the stems: dx
  always, dW where the stems' tensor-core rule does not take it
  (:func:`~fovi_lab.kernels.adjoint.as_forward.select_stem_dw_mma`: fp16 from 16 rows, in batch chunks).

``FOVI_KNN_GRAD_PATH`` (``fused`` / ``staged`` / ``auto``) overrides the fused-or-staged choice.

Where the fused kernels are the layer's (its own path, or the fallback of ``"mma"``), the plan also holds what
they run with (:class:`FusedPick`): each gradient's tiles, its segment length and dW's interleaved splits, from the
fused family's rules (:func:`~fovi_lab.kernels.adjoint.fused.select_dx_nm_config`,
:func:`~fovi_lab.kernels.adjoint.fused_plans.default_dx_seg_steps` and their dW forms), so a call runs them
without deciding again.

The plan is cached with the layer's tables (:func:`fovi_lab.graph.meta.meta_aux`), keyed by batch, dtype, the
device type and the values of :data:`SWITCHES`, so a training step looks it up instead of deciding again; where a
path cannot launch on the device, the caller falls back (:mod:`fovi_lab.knn_warp`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

import fovi_lab.settings as settings
from fovi_lab.graph.meta import meta_aux
from fovi_lab.kernels.families.fused_adjoints import SEGMENTS, WHOLE
from fovi_lab.kernels.families.registry import describe, lookup_adjoint

#: Layers with at least this many input channels take the fused node-major adjoints; the stems (Cin = 3) the staged
#: ones (their 3-channel rows make a fused tile mostly padding).
FUSED_MIN_CIN = 16

#: The settings the plan reads (a change decides anew).
SWITCHES = ("FOVI_KNN_GRAD_PATH", "FOVI_KNN_DX_PATH", "FOVI_KNN_DW_PATH", "FOVI_KNN_FUSED_PARTIAL_MIB",
            "FOVI_KNN_TAP_TABLE_MIB", "FOVI_KNN_GRAD_STAGE_MIB", "FOVI_KNN_STAGE_MIB")


@dataclass(frozen=True)
class FusedPick:
    """What one gradient's fused node-major kernel runs with.

    Attributes:
        config: its tiles, a ``dxn_`` / ``dwn_`` name (a preset of the fused families, ``fused_dx`` / ``fused_dw``); the
            segmented kernel (``dxs`` / ``dws``) of the same tiles where ``seg_steps`` is not 0.
        seg_steps: 0 for whole lists (dx) or the interleaved splits (dW); L >= 1 for segments of L steps.
        nsplit: dW's interleaved splits (1 for dx and for segments).
    """

    config: str
    seg_steps: int = 0
    nsplit: int = 1

    @property
    def point(self):
        """The kernel's point of its fused family (:func:`fovi_lab.kernels.families.registry.adjoint_point`)."""
        point = lookup_adjoint(self.config)
        return point.replace(walk=SEGMENTS if self.seg_steps else WHOLE)

    @property
    def kind(self) -> str:
        """The kernel kind: ``dxn`` / ``dxs`` / ``dwn`` / ``dws`` (the variant of its point)."""
        point = self.point
        return point.owner.variant(point)

    def words(self) -> str:
        """The pick in words (its tiles, and the segments or splits)."""
        point = self.point
        if self.seg_steps:
            lists = f"segments of {self.seg_steps} steps"
        elif point.owner.gradient == "dx":
            lists = "whole reverse lists"
        else:
            lists = f"{self.nsplit} interleaved split{'s' if self.nsplit != 1 else ''} per tap"
        return f"{point.owner.tile_words(point)}, {lists}"


def fused_picks(meta, batch: int, device: str) -> Tuple[FusedPick, FusedPick]:
    """``(dx, dW)`` picks of the fused kernels for ``meta`` at ``batch`` on ``device`` (``"cpu"`` / ``"cuda..."``):
    the fused family's rules, under the partial budget (``FOVI_KNN_FUSED_PARTIAL_MIB``)."""
    from fovi_lab.kernels.adjoint import fused_plans as fp
    from fovi_lab.kernels.adjoint.fused import select_dw_nm_config, select_dx_nm_config
    from fovi_lab.kernels.adjoint.fused_build import _spec

    seg = fp.default_dx_seg_steps(meta, batch, device)
    dx = FusedPick(select_dx_nm_config(batch, meta.cin, meta.nin, segments=bool(seg)), int(seg))
    name = select_dw_nm_config(meta.cout, meta.cin, batch)
    tiles = _spec("dwn", name)
    seg = fp.default_dw_seg_steps(meta, batch, tiles, device)
    dw = FusedPick(name, int(seg), 1 if seg else fp.default_dw_nsplit(meta, batch, tiles, device))
    return dx, dw


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
        fused: ``(dx, dW)`` :class:`FusedPick` where ``kernels`` is ``"fused"``, else None.
        dw_config: a stem's dW on the tensor cores (the stems' rule): its config (None elsewhere: dW takes
            ``mma_config``).
        dw_batch_chunk: a dW on the tensor cores: the batch rows of each chunk, whose tap tables fit
            :data:`~fovi_lab.kernels.adjoint.as_forward.STEM_DW_TABLE_MIB` (0: the whole batch at once).
        dx_config: dx's config on the ``"taps"`` path (the tap-expanded layer's split config), else None.
    """

    dx: str
    dw: str
    kernels: str
    mma_config: Optional[str]
    forced: Tuple[bool, bool] = (False, False)
    fused: Optional[Tuple[FusedPick, FusedPick]] = None
    dw_config: Optional[str] = None
    dw_batch_chunk: int = 0
    dx_config: Optional[str] = None

    def path(self, which: str) -> str:
        return self.dx if which == "dx" else self.dw

    def config(self, which: str) -> Optional[str]:
        """The tensor-core config of ``which`` (``"dx"`` / ``"dW"``) where it runs there."""
        if which == "dx" and self.dx == "taps":
            return self.dx_config
        return self.dw_config if which != "dx" and self.dw_config else self.mma_config

    def mma_configs(self) -> Tuple[str, ...]:
        """The tensor-core configs the plan names (what a precompile builds; a forced path without a pick of
        the rule names none)."""
        picked = [self.config(w) for w in ("dx", "dW") if self.path(w) in ("mma", "taps")]
        return tuple(dict.fromkeys(c for c in picked if c))


def gradient_words(plan: AdjointPlan, which: str) -> str:
    """What ``plan`` runs for ``which`` (``"dx"`` / ``"dW"``), in words, with the kernel's id in brackets."""
    path = plan.path(which)
    if path == "taps":
        cfg = plan.config("dx")
        return (f"tensor cores, as the forward of the tap-expanded layer (Cin x V output channels), then a "
                f"reverse-list sum: {describe(cfg)}  [{cfg}]")
    if path == "mma":
        cfg = plan.config(which)
        what = f"{describe(cfg)}  [{cfg}]" if cfg else "the split tensor-core configs' default rule"
        layer = "the transposed layer" if which == "dx" else "the tap layer"
        chunks = f" in batch chunks of {plan.dw_batch_chunk} rows" if which != "dx" and plan.dw_batch_chunk else ""
        return f"tensor cores, as the forward of {layer}{chunks}: {what}"
    if path == "fused":
        pick = plan.fused[0 if which == "dx" else 1]
        return f"fused node-major kernel, no stage: {pick.words()}  [{pick.config}]  (Cin >= {FUSED_MIN_CIN})"
    words = f"staged kernels: a stage and a reverse-index reduction  (Cin < {FUSED_MIN_CIN})"
    if which == "dx":       # the opt-in that puts a stem's dx on the tensor cores (fp16 calls)
        words += "; FOVI_KNN_DX_PATH=taps: fp16 calls on the tensor cores, through the tap-expanded layer (notebook 12)"
    return words


def kernels_path(meta=None) -> str:
    """The fused-or-staged path of a layer (``FOVI_KNN_GRAD_PATH`` overrides; ``auto``: by Cin)."""
    path = settings.get("FOVI_KNN_GRAD_PATH")
    if path == "auto":
        return "fused" if meta is None or meta.cin >= FUSED_MIN_CIN else "staged"
    return path


def _device_of(meta, device) -> str:
    return str(device) if device is not None else str(meta.device)


def decide(meta, batch: int, dtype: torch.dtype, device=None) -> AdjointPlan:
    """The plan of ``meta`` at ``batch`` in ``dtype`` on ``device`` (default: where the meta's tables are) under the
    current switches (no cache: :func:`adjoint_plan`)."""
    from fovi_lab.kernels.adjoint import as_forward as af
    kernels = kernels_path(meta)
    switches = {"dx": settings.get("FOVI_KNN_DX_PATH"), "dW": settings.get("FOVI_KNN_DW_PATH")}
    config = None
    if any(v != "off" for v in switches.values()):
        config = af.select_grad_mma(meta, batch, dtype)
    # the stems' dW: the tensor cores in batch chunks, where their rule takes them (their own kernels the staged
    # ones) or the switch forces them (fp16: the split configs' only dtype)
    stem = None
    if config is None and meta.cin < af.MMA_GRAD_MIN_CIN:
        if switches["dW"] == "mma" and dtype == torch.float16:
            stem = af.stem_dw_config(meta)
        elif switches["dW"] == "auto" and kernels == "staged":
            stem = af.select_stem_dw_mma(meta, batch, dtype)

    taps = None
    if switches["dx"] == "taps" and dtype == torch.float16:
        taps = af.select_taps_config(meta, batch)

    def one(which: str) -> str:
        sw = switches[which]
        if sw == "off" or (sw == "taps" and taps is None):
            return kernels
        if sw == "taps":
            return "taps"
        return "mma" if sw == "mma" or config is not None or (which == "dW" and stem) else kernels
    fused = fused_picks(meta, batch, _device_of(meta, device)) if kernels == "fused" else None
    dw = one("dW")
    # the tap layer's tables within their budget: the stems' chunks, and every other layer's where its batch needs
    chunk = af.stem_dw_batch_chunk(meta, batch) if stem else af.dw_batch_chunk(meta, batch) if dw == "mma" else 0
    return AdjointPlan(one("dx"), dw, kernels, config,
                       (switches["dx"] in ("mma", "taps"), switches["dW"] == "mma"), fused, stem, chunk, taps)


def adjoint_plan(meta, batch: int, dtype: torch.dtype, device=None) -> AdjointPlan:
    """The :class:`AdjointPlan` of a call, decided on its first call and then looked up (cached with ``meta``, keyed
    by batch, dtype, the device type and :data:`SWITCHES`). ``device``: where the call runs (default: where the
    meta's tables are)."""
    dev = _device_of(meta, device)
    key = ("adjoint_plan", int(batch), dtype, dev.split(":")[0], settings.snapshot(SWITCHES))
    aux = meta_aux(meta)
    plan = aux.get(key)
    if plan is None:
        plan = aux[key] = decide(meta, batch, dtype, dev)
    return plan


def forget_plans(meta) -> None:
    """Drop the plans cached with ``meta`` (for a caller that changed the rule's thresholds, such as a test)."""
    aux = meta_aux(meta)
    for key in [k for k in aux if isinstance(k, tuple) and k[:1] == ("adjoint_plan",)]:
        del aux[key]


__all__ = ["AdjointPlan", "FusedPick", "forget_plans", "FUSED_MIN_CIN", "SWITCHES", "adjoint_plan", "decide",
           "fused_picks", "gradient_words", "kernels_path"]
