"""Warp kernels for compact KNN convolution inference and training: the public API surface.

Forward kernels (:mod:`fovi_lab.kernels.forward`) plus explicit adjoint kernels
(:mod:`fovi_lab.kernels.adjoint`). Warp autodiff is never used (``enable_backward=False`` everywhere);
gradients are explicit adjoint kernels, registered with the :mod:`fovi_lab.ops.registry` ops registry
as ``warp_train``. ``warp_compact`` is the forward-only ops object (its gradients raise and point to
``warp_train``).

Importing this module registers both ops objects. Both compute in fp16 or bf16 (``compute_dtypes``; a bf16
forward runs on the tensor-core kernels, bf16 gradients on the fused adjoints' bf16 form); other dtypes are
refused with an error naming the argument.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Optional

import torch

import fovi_lab.settings as settings
import fovi_lab.kernels.adjoint.rule as _rule
from fovi_lab.ops.registry import register_estimator, register_ops
from fovi_lab.ops.replay import replayed, replayed_after, replayed_keep
from fovi_lab.graph.meta import TrainingMeta, pad_to
from fovi_lab.ops.reference import (CompactTorchOps, check_forward_args, check_grad_args,  # noqa: F401  (CompactTorchOps: importable here too)
                                    explicit_grads)
from fovi_lab.ops.tune_cache import cache_path as tune_cache_path, tuned_forward_config  # noqa: F401
from fovi_lab.kernels.cost_pick import estimator as _cost_model_estimator
from fovi_lab.kernels.call_plan import forget_tuned, forward_path, plan_of_call  # noqa: F401  (forward_path: public here)
from fovi_lab.kernels.adjoint import (grad_input_nm, grad_weight_nm, node_major,  # noqa: F401
                                      plan_grad_input_nm, plan_grad_weight_nm)
from fovi_lab.kernels.adjoint import grad_input as staged_grad_input, grad_weight as staged_grad_weight
# fovi's private names for the staged adjoints' factories, canary and cache (kept importable)
from fovi_lab.kernels.adjoint import (canary_grad_stage_ok as _canary_grad_stage_ok,  # noqa: F401
                                      get_grad_kernel as _get_grad_kernel,
                                      make_grad_input_stage2_kernel as _make_grad_input_stage2_kernel,
                                      make_grad_weight_stage2_kernel as _make_grad_weight_stage2_kernel,
                                      make_grad_weight_stage3_kernel as _make_grad_weight_stage3_kernel,
                                      make_grad_weight_stage4_kernel as _make_grad_weight_stage4_kernel,
                                      pad_flat_input_fp16 as _pad_flat_input_fp16)
from fovi_lab.kernels.forward import run_cached, run_uncached  # noqa: F401  (re-exported seed API)
from fovi_lab.kernels.forward.configs import _UNCACHED_BATCH_CONFIG_SPECS  # noqa: F401
# fovi's private names for the forward's factories, canary, config lookup and rule (kept importable)
from fovi_lab.kernels.forward import (make_cached_kernel as _make_cached_kernel,  # noqa: F401
                                      make_uncached_kernel as _make_uncached_kernel,
                                      make_uncached_r2_kernel as _make_uncached_r2_kernel,
                                      make_uncached_r4_kernel as _make_uncached_r4_kernel,
                                      canary_launch_ok as _canary_launch_ok,
                                      get_uncached_config as _get_uncached_batch_config,
                                      pad_bias_to_tiles as _pad_bias_to_tiles,
                                      select_config as _select_uncached_batch_config)

__all__ = [
    "run_uncached", "run_cached", "grad_input", "grad_weight", "WarpCompactOps", "WarpTrainOps",
    "grad_input_kernels", "grad_weight_kernels", "grad_paths", "forward_path", "step_forward", "step_backward",
    "_register_ops",
]


#: id(meta) -> (x, weight, replay entry, its generation, x's and weight's versions) of the layer's last replayed
#: forward, all held weakly (a dropped signature frees its copies): an adjoint call on those same tensors, unchanged
#: since, reads the forward's copies of them (:func:`_after_forward`).
_LAST_FORWARD: dict = {}


def _forward(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    # run_uncached sees only the tables, so it cannot tell an x of another layer: check against the meta
    check_forward_args(meta, x, weight, bias)
    meta = meta.to(x.device)
    y, handle = replayed_keep("forward", meta, lambda x, w, b: _forward_direct(meta, x, w, b), x, weight, bias)
    if handle is not None:
        _LAST_FORWARD[id(meta)] = (weakref.ref(x), weakref.ref(weight), weakref.ref(handle[0]), handle[1],
                                   x._version, weight._version)
    return y


def _after_forward(op: str, meta, fn, grad_y, *operands):
    """An adjoint call (``operands``: the forward's x and / or weight, by position: ``("x", x)``...) replayed after the
    layer's last forward: where that forward was replayed on these very tensors, not changed in place since (their
    versions), the adjoint's graph reads the forward's copies of them (:func:`fovi_lab.ops.replay.replayed_after`:
    while they still hold them) and copies in ``grad_y`` alone; otherwise an ordinary replayed call. A backend called
    by another package's autograd Function (fovi's, :mod:`fovi_lab.integrations.fovi`) passes the tensors its forward
    took, and gets the sharing too."""
    last = _LAST_FORWARD.get(id(meta))
    args = (grad_y,) + tuple(t for _, t in operands)
    if last is not None:
        held = {"x": last[0](), "weight": last[1](), "entry": last[2]()}
        version = {"x": last[4], "weight": last[5]}
        # the same tensors, unchanged since (an in-place update, an optimizer's step, bumps the version)
        if held["entry"] is not None and all(held[name] is t and t._version == version[name] for name, t in operands):
            shared = {i + 1: 0 if name == "x" else 1 for i, (name, _) in enumerate(operands)}
            return replayed_after((held["entry"], last[3]), shared, op, meta, fn, *args)
    return replayed(op, meta, fn, *args)


def _adjoint_call(op: str, direct, meta, grad_y, **operands):
    """An adjoint of ``warp_train``: ``grad_y`` and the ``operands`` (``x=`` and / or ``weight=``, in ``direct``'s
    order) checked against the meta, the meta moved to ``grad_y``'s device, then ``direct(meta, grad_y,
    *operands)`` through :func:`_after_forward`."""
    check_grad_args(meta, grad_y, **operands)
    meta = meta.to(grad_y.device)
    return _after_forward(op, meta, lambda *args: direct(meta, *args), grad_y, *operands.items())


def _forward_direct(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
    plan = plan_of_call(meta, x, weight)            # decided on the signature's first call, looked up after
    if plan.forward == "binned":
        from fovi_lab.kernels.forward.binned import run_binned
        return run_binned(meta, x, weight, bias)
    if plan.forward_source == "tune cache":
        try:
            return run_uncached(x, weight, bias, meta.input_linear, meta.weight_linear, config=plan.forward)
        except (ValueError, RuntimeError) as exc:       # no longer launchable since the plan took it
            forget_tuned(meta, x, plan.forward)
            warnings.warn(f"the tuned forward config {plan.forward!r} of the tune cache {tune_cache_path()} does not "
                          f"run here ({exc}); running the rule's pick (tune again, or delete the cache)",
                          RuntimeWarning, stacklevel=3)
            plan = plan_of_call(meta, x, weight)
    return run_uncached(x, weight, bias, meta.input_linear, meta.weight_linear, config=plan.forward)


class WarpCompactOps:
    """Forward-only ops object (registry name ``warp_compact``): the uncached Warp forward, in fp16 or, on the
    tensor-core kernels, in bf16."""

    name = "warp_compact"
    compute_dtypes = (torch.float16, torch.bfloat16)
    forward_only = True
    forward = staticmethod(_forward)

    @staticmethod
    def grad_input(meta, grad_y, weight):
        raise NotImplementedError("warp_compact is forward-only; use the 'warp_train' backend to train")

    @staticmethod
    def grad_weight(meta, grad_y, x):
        raise NotImplementedError("warp_compact is forward-only; use the 'warp_train' backend to train")


#: Below this many input channels the staged adjoints win on the H200 (fovi_lab/records/h200/train_step.jsonl.gz: the
#: Cin = 3 stems ran slower fused, because a 16-wide Cin tile is 13/16 padding and every reverse
#: entry is a tiny GEMM; every layer with Cin >= 64 ran faster fused). Decided in :mod:`fovi_lab.kernels.adjoint.rule`.
FUSED_MIN_CIN = _rule.FUSED_MIN_CIN


def grad_path(meta: Optional[TrainingMeta] = None, dtype: Optional[torch.dtype] = None) -> str:
    """Adjoint path of ``warp_train`` for a layer off the tensor cores: ``"fused"`` (the node-major kernels of
    :mod:`fovi_lab.kernels.adjoint.fused`: one launch per gradient, no stage) when ``Cin >= FUSED_MIN_CIN``,
    else ``"staged"`` (fovi's stage + reverse-index design, the kernels of :mod:`fovi_lab.kernels.adjoint.staged`).
    ``FOVI_KNN_GRAD_PATH=fused|staged|auto`` overrides (``auto``: this rule). Both families have an fp16 and a
    bf16 form, so ``dtype`` (the gradients' compute dtype) does not change the path."""
    return _rule.kernels_path(meta)


def mma_path(which: str) -> str:
    """``FOVI_KNN_DX_PATH`` (``which="dx"``) / ``FOVI_KNN_DW_PATH`` (``"dW"``): ``"mma"`` (that gradient of
    ``warp_train`` on the tensor-core forward of a derived layer, :mod:`fovi_lab.kernels.adjoint.as_forward`),
    ``"taps"`` (dx only, fp16 calls: the forward of the tap-expanded layer and a reverse-list sum,
    :func:`~fovi_lab.kernels.adjoint.as_forward.grad_input_taps`), ``"off"`` (:func:`grad_path`'s fused / staged
    kernels) or ``"auto"`` (the default: the tensor cores where
    :func:`fovi_lab.kernels.adjoint.as_forward.select_grad_mma` picks them, and a stem's dW where
    :func:`~fovi_lab.kernels.adjoint.as_forward.select_stem_dw_mma` does)."""
    return settings.get("FOVI_KNN_DX_PATH" if which == "dx" else "FOVI_KNN_DW_PATH")


def grad_paths(meta: TrainingMeta, batch: int, dtype: torch.dtype = torch.float16) -> tuple:
    """``(dx path, dW path)`` of a ``warp_train`` call at ``batch`` in ``dtype``: ``"mma"`` (tensor cores, by
    :func:`mma_path`'s switch or rule), ``"taps"`` (dx on the tap-expanded layer, by the switch) or
    :func:`grad_path`'s ``"fused"`` / ``"staged"`` (before any fallback); the call signature's
    :class:`~fovi_lab.kernels.adjoint.rule.AdjointPlan`, decided once."""
    plan = _rule.adjoint_plan(meta, batch, dtype)
    return plan.dx, plan.dw


def _on_mma(which: str, meta, grad_y, operand, plan):
    """The tensor-core gradient, or None where it is not the plan's path or its kernel cannot launch here (a
    warning when a switch asked for it: under the rule the fused / staged kernels simply take over)."""
    from fovi_lab.kernels.adjoint import as_forward
    if plan.path(which) not in ("mma", "taps"):
        return None
    try:
        if which == "dx" and plan.dx == "taps":
            return as_forward.grad_input_taps(meta, grad_y, operand, plan.dx_config)
        if which == "dx":
            return as_forward.grad_input_mma(meta, grad_y, operand, plan.mma_config)
        return as_forward.grad_weight_mma(meta, grad_y, operand, plan.config("dW"), plan.dw_batch_chunk)
    except RuntimeError as exc:
        if plan.forced[0 if which == "dx" else 1]:
            warnings.warn(f"the tensor-core {which} cannot run here ({exc}); using the {plan.kernels} kernels",
                          RuntimeWarning, stacklevel=3)
        return None


def _fused_or_staged(which: str, fused, staged, meta, grad_y, operand, kernels: Optional[str] = None, pick=None):
    """The fused kernel's gradient where the layer takes the fused path (``kernels``, default
    :func:`grad_path`) and it can launch, else the staged kernel's (with a warning when the fused one could not
    launch here; the staged ones fall back to torch_compact, warning, when they cannot launch either).
    ``pick``: the fused kernel's :class:`~fovi_lab.kernels.adjoint.rule.FusedPick` from the call's plan."""
    meta = meta.to(grad_y.device)
    if (kernels or grad_path(meta, grad_y.dtype)) == "fused":
        out = fused(meta, grad_y, operand, pick=pick)
        if out is not None:
            return out
        warnings.warn(f"the fused Warp {which} kernel cannot launch on this device; using the staged kernels",
                      RuntimeWarning, stacklevel=4)
    return staged(meta, grad_y, operand)


def grad_input_kernels(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor,
                       kernels: Optional[str] = None, pick=None) -> torch.Tensor:
    """``dx`` on :func:`grad_path`'s fused / staged kernels, never the tensor cores (what the rule compares)."""
    return _fused_or_staged("dx", grad_input_nm, staged_grad_input, meta, grad_y, weight, kernels, pick)


def grad_weight_kernels(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor,
                        kernels: Optional[str] = None, pick=None) -> torch.Tensor:
    """``dW`` on :func:`grad_path`'s fused / staged kernels, never the tensor cores."""
    return _fused_or_staged("dW", grad_weight_nm, staged_grad_weight, meta, grad_y, x, kernels, pick)


class WarpTrainOps:
    """Train-capable Warp ops (``warp_train``): fp16 or bf16 compute, fp32 deterministic gradients.

    Each gradient runs on tensor cores where the rule picks them (fp16 calls of at least 1 GFLOP at B >= 16 on layers
    with Cin >= 16: :func:`fovi_lab.kernels.adjoint.as_forward.select_grad_mma`; the stems' dW from B = 16 in batch
    chunks: :func:`~fovi_lab.kernels.adjoint.as_forward.select_stem_dw_mma`; :func:`mma_path` overrides), else on
    the fused node-major kernels or the staged ones per layer (see :func:`grad_path`), each in the compute
    dtype's form; bf16 runs the forward on the tensor-core kernels. Every path is deterministic.
    When a fused kernel cannot launch here the staged kernels take over, and when those cannot either,
    ``torch_compact``; each fallback warns (a tensor-core pick of the rule that cannot run here gives way to
    the fused / staged kernels quietly).
    """

    name = "warp_train"
    compute_dtypes = (torch.float16, torch.bfloat16)
    forward = staticmethod(_forward)

    @staticmethod
    def grad_input(meta, grad_y, weight):
        return _adjoint_call("grad_input", _grad_input_direct, meta, grad_y, weight=weight)

    @staticmethod
    def grad_weight(meta, grad_y, x):
        return _adjoint_call("grad_weight", _grad_weight_direct, meta, grad_y, x=x)

    @staticmethod
    def backward_combined(meta, grad_y, x, weight):
        """``(dx, dW)``; the fused path lays out ``grad_y`` node-major once for both kernels."""
        return _adjoint_call("backward", _backward_direct, meta, grad_y, x=x, weight=weight)


# -- the eager train step (KNNConvFunction): one replayed call per direction, casts and the bias gradient inside ----

_STEP_OPS = {}          # (compute dtype, needs, bias dtype) -> the step's two calls' op names (replay signatures)


def _step_names(dtype, needs=None, bias_dtype=None):
    key = (dtype, needs, bias_dtype)
    name = _STEP_OPS.get(key)
    if name is None:
        tag = str(dtype)[6:]
        name = _STEP_OPS[key] = (
            f"step_forward[{tag}]" if needs is None else
            f"step_backward[{tag}:{''.join('xwb'[i] for i, n in enumerate(needs) if n)}"
            f"{':' + str(bias_dtype)[6:] if needs[2] else ''}]")
    return name


def step_forward(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, bias, dtype: torch.dtype):
    """The forward of an eager train step: ``(y, token)``, ``y`` in ``dtype`` (the compute dtype: autocast's, else
    x's). x, weight and bias come in their own dtypes (fp32 master weights under autocast): the casts run inside the
    one call, so a replayed step (:mod:`fovi_lab.ops.replay`) issues them from its graph, not from the host. ``token``:
    what :func:`step_backward` reads the replay's copies of x and weight through (None where the call ran directly).
    """
    check_forward_args(meta, x, weight, bias, same_dtype=False)
    if dtype not in WarpTrainOps.compute_dtypes:
        raise TypeError(f"x: warp_train computes in float16 or bfloat16 (autocast's dtype, else x's), got "
                        f"{str(dtype)[6:]}; call it under torch.autocast or pass half-precision tensors")
    meta = meta.to(x.device)

    def run(x, w, b):                    # (not run on a replay: the graph holds its kernels)
        with torch.autocast(device_type=x.device.type, enabled=False):
            return _forward_direct(meta, x.contiguous().to(dtype), w.contiguous().to(dtype),
                                   None if b is None else b.contiguous().to(dtype))
    return replayed_keep(_step_names(dtype), meta, run, x, weight, bias)


def step_backward(meta: TrainingMeta, token, grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                  bias_dtype, dtype: torch.dtype, needs: tuple):
    """The backward of an eager train step: ``(dx, dW, db)`` in x's, weight's and ``bias_dtype`` (None: no bias),
    each None where ``needs`` (x, weight, bias) says it is not wanted. ``grad_y``, x and weight as the forward saw
    them (x and weight in their own dtypes, cast to ``dtype`` inside); the gradients accumulate in fp32 and are cast
    inside the call too. Replayed, it reads x and weight from the forward's copies (``token``) while they still hold
    them, so only ``grad_y`` is copied in (:func:`fovi_lab.ops.replay.replayed_after`)."""
    need_x, need_w, need_b = needs[0], needs[1], needs[2] and bias_dtype is not None
    needs = (need_x, need_w, need_b)
    meta = meta.to(grad_y.device)
    x_dtype, w_dtype = x.dtype, weight.dtype

    def run(g, x, w):                    # the gradients asked for (a graph's outputs are tensors)
        got = explicit_grads(g, x, w, dtype, needs, (x_dtype, w_dtype, bias_dtype),
                             lambda g, x, w: _backward_direct(meta, g, x, w),
                             lambda g, w: _grad_input_direct(meta, g, w), lambda g, x: _grad_weight_direct(meta, g, x))
        return tuple(t for t in got if t is not None)
    got = iter(replayed_after(token, {1: 0, 2: 1}, _step_names(dtype, needs, bias_dtype), meta, run, grad_y, x,
                              weight))
    return tuple(next(got) if n else None for n in needs)


# the train step's two calls, which KNNConvFunction takes where an ops object has them (fovi_lab.ops.registry)
WarpTrainOps.step_forward = staticmethod(step_forward)
WarpTrainOps.step_backward = staticmethod(step_backward)


def _grad_input_direct(meta, grad_y, weight, plan=None):
    plan = plan or _rule.adjoint_plan(meta, grad_y.shape[0], grad_y.dtype)
    dx = _on_mma("dx", meta, grad_y, weight, plan)
    return dx if dx is not None else grad_input_kernels(meta, grad_y, weight, plan.kernels,
                                                        plan.fused[0] if plan.fused else None)


def _grad_weight_direct(meta, grad_y, x, plan=None):
    plan = plan or _rule.adjoint_plan(meta, grad_y.shape[0], grad_y.dtype)
    dw = _on_mma("dW", meta, grad_y, x, plan)
    return dw if dw is not None else grad_weight_kernels(meta, grad_y, x, plan.kernels,
                                                         plan.fused[1] if plan.fused else None)


def _backward_direct(meta, grad_y, x, weight):
    plan = plan_of_call(meta, x, weight).adjoint          # the plan the forward of this signature took
    if "mma" in (plan.dx, plan.dw) or plan.dx == "taps":
        return _grad_input_direct(meta, grad_y, weight, plan), _grad_weight_direct(meta, grad_y, x, plan)
    if plan.kernels != "fused":
        return staged_grad_input(meta, grad_y, weight), staged_grad_weight(meta, grad_y, x)
    dx_pick, dw_pick = plan.fused
    pw = plan_grad_weight_nm(meta, grad_y, x, pick=dw_pick)
    # dx contracts Cout in 64-row chunks: share g's node-major copy when the Cout padding agrees
    share = pw is not None and pw.op == pad_to(meta.cout, 64)
    px = plan_grad_input_nm(meta, grad_y, weight, gn=pw.gn if share else None, pick=dx_pick)
    dx = px.run() if px is not None else _grad_input_direct(meta, grad_y, weight, plan)
    dw = pw.run() if pw is not None else _grad_weight_direct(meta, grad_y, x, plan)
    return dx, dw


def grad_input(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor, config: Optional[str] = None,
               **staged_options) -> torch.Tensor:
    """``dx [B, Cin, Nin]`` fp32, deterministic (fovi's public name; docs/operator.md §4).

    With no ``config`` and no staged options: the path ``warp_train`` takes for this call (the tensor cores where
    :func:`mma_path`'s rule picks them, else :func:`grad_path`: the fused node-major kernel where the layer takes
    it and it launches here, else the staged kernels).
    A ``config`` (a ``GRAD_INPUT_CONFIG_SPECS`` name) or staged options (``stage_fp32``, ``dx_direct``): the
    staged kernels (:func:`fovi_lab.kernels.adjoint.grad_input`), as fovi's own library runs them.
    """
    if config is None and not staged_options:
        return WarpTrainOps.grad_input(meta, grad_y, weight)
    check_grad_args(meta, grad_y, weight=weight)
    return staged_grad_input(meta, grad_y, weight, config, **staged_options)


def grad_weight(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor, config: Optional[str] = None,
                **staged_options) -> torch.Tensor:
    """``dW [Cout, Q]`` fp32, deterministic (fovi's public name; docs/operator.md §4): as :func:`grad_input`, the
    path ``warp_train`` takes without a ``config`` or staged options (``stage_fp32``, ``finish``), else the staged
    kernels (:func:`fovi_lab.kernels.adjoint.grad_weight`)."""
    if config is None and not staged_options:
        return WarpTrainOps.grad_weight(meta, grad_y, x)
    check_grad_args(meta, grad_y, x=x)
    return staged_grad_weight(meta, grad_y, x, config, **staged_options)


def _register_ops(ops) -> None:
    """Register a kernel backend's ops object (must expose name/forward/grad_input/grad_weight)."""
    register_ops(ops)


_register_ops(WarpCompactOps)
_register_ops(WarpTrainOps)
# auto on a GPU no record covers: the backend the cost model prices lowest (fovi_lab.ops.dispatch.estimated_backend)
register_estimator(_cost_model_estimator)
