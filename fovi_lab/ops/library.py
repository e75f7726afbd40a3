"""The operator as PyTorch custom ops (``torch.library``), so ``torch.compile`` sees it whole (docs/operator.md §4).

    torch.ops.fovi_lab.knn_conv(x, weight, bias, layer, backend, compute_dtype, training)  -> y  [B, Cout, Nout]
    torch.ops.fovi_lab.knn_conv_grad_input(grad_y, weight, layer, backend, compute_dtype)  -> dx [B, Cin, Nin]
    torch.ops.fovi_lab.knn_conv_grad_weight(grad_y, x, layer, backend, compute_dtype)      -> dW [Cout, Q]
    torch.ops.fovi_lab.knn_conv_backward(grad_y, x, weight, layer, backend, compute_dtype) -> (dx, dW)

(the gradients in fp32, or in the compute dtype where it is wider: fp64 stays fp64)

Each op casts its tensor inputs to ``compute_dtype`` (the dtype the kernels run in: fp16 for the Warp
backends, or the autocast dtype) and calls the registered ops object (:mod:`fovi_lab.ops.registry`), so
every backend's kernels run unchanged under ``torch.compile``: the op is opaque to Dynamo and Inductor,
and each op has a fake (meta) implementation that gives the output's shape, dtype and device.

A layer's index tables are not tensors an op could take (a :class:`~fovi_lab.graph.meta.TrainingMeta`
also carries per-device copies and the kernels' plans), so each layer registers its meta once
(:func:`register_layer`) and the ops take the integer handle. ``backend`` may be ``"auto"``: the op then
resolves it when it runs (:func:`fovi_lab.ops.dispatch.select_backend`), with ``training`` saying whether
gradients will be asked for, and its backward resolves it again the same way.

The autograd formula (``register_autograd``) saves the inputs as given, casts them again in the backward,
and returns each gradient in its input's dtype straight from the fp32 (or fp64) adjoint (fp32 master weights under
AMP keep fp32 gradients, never rounded through fp16). The bias gradient is the fp32 sum of ``grad_y`` over
batch and nodes.
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import Optional, Tuple

import torch

from fovi_lab.graph.meta import TrainingMeta, meta_aux
from fovi_lab.ops.checks import FLOAT_DTYPES, check_operands
from fovi_lab.ops.dispatch import select_backend
from fovi_lab.ops.registry import get_ops

__all__ = ["register_layer", "layer_meta", "knn_conv", "knn_conv_grad_input", "knn_conv_grad_weight",
           "knn_conv_backward"]

_LAYERS: "weakref.WeakValueDictionary[int, TrainingMeta]" = weakref.WeakValueDictionary()
_next_handle = itertools.count(1)
_lock = threading.Lock()


def register_layer(meta: TrainingMeta) -> int:
    """The handle the ops know ``meta`` by (one per meta, kept while the meta lives)."""
    if not isinstance(meta, TrainingMeta):
        raise TypeError(f"meta: expected a TrainingMeta, got {type(meta).__name__}")
    with _lock:
        aux = meta_aux(meta)
        if "op_handle" not in aux:
            aux["op_handle"] = next(_next_handle)
            _LAYERS[aux["op_handle"]] = meta
        return aux["op_handle"]


def layer_meta(layer: int) -> TrainingMeta:
    """The meta registered under handle ``layer``; a handle of a layer that is gone raises."""
    meta = _LAYERS.get(layer)
    if meta is None:
        raise ValueError(f"layer: no KNN layer is registered under handle {layer} (register_layer gives one)")
    return meta


def _ops(layer: int, backend: str, x: torch.Tensor, training: bool):
    meta = layer_meta(layer).to(x.device)
    try:
        return meta, get_ops(select_backend(backend, meta, x, training))
    except KeyError as exc:
        raise ValueError(f"backend: {exc.args[0].split(': ', 1)[-1]}") from None


def _cast(t: Optional[torch.Tensor], dtype: torch.dtype) -> Optional[torch.Tensor]:
    return None if t is None else t.contiguous().to(dtype)


def _autocast_off(t: torch.Tensor):
    """Autocast off for t's device type inside an op: the op has cast its inputs to the compute dtype, and the
    backends' fp32 accumulations must stay fp32."""
    return torch.autocast(device_type=t.device.type, enabled=False)


def _grad_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """The adjoints' dtype: fp32, or the compute dtype where it is wider (fp64 stays fp64)."""
    return torch.promote_types(compute_dtype, torch.float32)


def _check_compute_dtype(compute_dtype) -> None:
    if compute_dtype not in FLOAT_DTYPES:
        raise TypeError(f"compute_dtype: expected a floating-point torch.dtype "
                        f"({', '.join(str(d) for d in FLOAT_DTYPES)}), got {compute_dtype!r}")


def _check_shapes(x: torch.Tensor, weight: torch.Tensor, meta) -> None:
    """The fake's shape checks (the real op's are the backends'), naming the argument."""
    torch._check(x.dim() == 3 and x.shape[1] == meta.cin and x.shape[2] == meta.nin,
                 lambda: f"x: expected shape [B, Cin={meta.cin}, Nin={meta.nin}], got {tuple(x.shape)}")
    torch._check(weight.dim() == 2 and weight.shape[0] == meta.cout and weight.shape[1] == meta.q,
                 lambda: f"weight: expected shape [Cout={meta.cout}, Q={meta.q}], got {tuple(weight.shape)}")


@torch.library.custom_op("fovi_lab::knn_conv", mutates_args=())
def knn_conv(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], layer: int, backend: str,
             compute_dtype: torch.dtype, training: bool) -> torch.Tensor:
    """``y [B, Cout, Nout]`` in ``compute_dtype``: the layer's forward on the backend (``"auto"`` resolved here)."""
    check_operands(x=x, weight=weight, bias=bias)
    _check_compute_dtype(compute_dtype)
    with _autocast_off(x):
        x_c = _cast(x, compute_dtype)
        meta, ops = _ops(layer, backend, x_c, training)
        y = ops.forward(meta, x_c, _cast(weight, compute_dtype), _cast(bias, compute_dtype))
    return y.contiguous()           # the fake promises a contiguous y


@knn_conv.register_fake
def _knn_conv_fake(x, weight, bias, layer, backend, compute_dtype, training):
    # the fakes check as the ops do: torch.compile's fake tensors report the device they stand for, and a plain
    # meta tensor (the op called on one) is refused, so the op does not serve shape inference on meta tensors
    check_operands(x=x, weight=weight, bias=bias)
    _check_compute_dtype(compute_dtype)
    meta = layer_meta(layer)
    _check_shapes(x, weight, meta)
    return x.new_empty((x.shape[0], meta.cout, meta.nout), dtype=compute_dtype)


def _adjoint(which: str, grad_y: torch.Tensor, operand: torch.Tensor, layer: int, backend: str,
             compute_dtype: torch.dtype) -> torch.Tensor:
    """One adjoint (``which``: ``"grad_input"`` with the weight, ``"grad_weight"`` with x), contiguous, in
    :func:`_grad_dtype`."""
    check_operands(grad_y=grad_y, **{"weight" if which == "grad_input" else "x": operand})
    _check_compute_dtype(compute_dtype)
    with _autocast_off(grad_y):
        g = _cast(grad_y, compute_dtype)
        meta, ops = _ops(layer, backend, g, True)
        out = getattr(ops, which)(meta, g, _cast(operand, compute_dtype))
    return out.to(_grad_dtype(compute_dtype)).contiguous()


def _grad_like(grad_y: torch.Tensor, layer: int, which: str, compute_dtype: torch.dtype, **operands) -> torch.Tensor:
    """An empty gradient of the layer's x (``"dx"``: ``[B, Cin, Nin]``) or weight (``"dW"``: ``[Cout, Q]``);
    ``operands``: the op's other tensors, checked as the real op checks them."""
    check_operands(grad_y=grad_y, **operands)
    _check_compute_dtype(compute_dtype)
    meta = layer_meta(layer)
    torch._check(grad_y.dim() == 3 and grad_y.shape[1] == meta.cout and grad_y.shape[2] == meta.nout,
                 lambda: f"grad_y: expected shape [B, Cout={meta.cout}, Nout={meta.nout}], got {tuple(grad_y.shape)}")
    shape = (grad_y.shape[0], meta.cin, meta.nin) if which == "dx" else (meta.cout, meta.q)
    return grad_y.new_empty(shape, dtype=_grad_dtype(compute_dtype))


@torch.library.custom_op("fovi_lab::knn_conv_grad_input", mutates_args=())
def knn_conv_grad_input(grad_y: torch.Tensor, weight: torch.Tensor, layer: int, backend: str,
                        compute_dtype: torch.dtype) -> torch.Tensor:
    """``dx [B, Cin, Nin]`` from ``grad_y [B, Cout, Nout]`` and ``weight [Cout, Q]``."""
    return _adjoint("grad_input", grad_y, weight, layer, backend, compute_dtype)


@torch.library.custom_op("fovi_lab::knn_conv_grad_weight", mutates_args=())
def knn_conv_grad_weight(grad_y: torch.Tensor, x: torch.Tensor, layer: int, backend: str,
                         compute_dtype: torch.dtype) -> torch.Tensor:
    """``dW [Cout, Q]`` from ``grad_y [B, Cout, Nout]`` and ``x [B, Cin, Nin]``."""
    return _adjoint("grad_weight", grad_y, x, layer, backend, compute_dtype)


knn_conv_grad_input.register_fake(
    lambda grad_y, weight, layer, backend, compute_dtype: _grad_like(grad_y, layer, "dx", compute_dtype, weight=weight))
knn_conv_grad_weight.register_fake(
    lambda grad_y, x, layer, backend, compute_dtype: _grad_like(grad_y, layer, "dW", compute_dtype, x=x))


@torch.library.custom_op("fovi_lab::knn_conv_backward", mutates_args=())
def knn_conv_backward(grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, layer: int, backend: str,
                      compute_dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(dx, dW)``: both adjoints, through the backend's combined path where it has one."""
    check_operands(grad_y=grad_y, x=x, weight=weight)
    _check_compute_dtype(compute_dtype)
    with _autocast_off(grad_y):
        g = _cast(grad_y, compute_dtype)
        meta, ops = _ops(layer, backend, g, True)
        x_c, w_c = _cast(x, compute_dtype), _cast(weight, compute_dtype)
        if hasattr(ops, "backward_combined"):
            dx, dw = ops.backward_combined(meta, g, x_c, w_c)
        else:
            dx, dw = ops.grad_input(meta, g, w_c), ops.grad_weight(meta, g, x_c)
    gd = _grad_dtype(compute_dtype)
    return dx.to(gd).contiguous(), dw.to(gd).contiguous()   # (torch_compact's dx is a view of its pad)


@knn_conv_backward.register_fake
def _knn_conv_backward_fake(grad_y, x, weight, layer, backend, compute_dtype):
    return (_grad_like(grad_y, layer, "dx", compute_dtype, x=x, weight=weight),
            _grad_like(grad_y, layer, "dW", compute_dtype))


def _setup_context(ctx, inputs, output):
    x, weight, bias, layer, backend, compute_dtype, training = inputs
    ctx.save_for_backward(x, weight)
    ctx.args = (layer, backend, compute_dtype)
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward(ctx, grad_y):
    x, weight = ctx.saved_tensors
    layer, backend, compute_dtype = ctx.args
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    dx = dw = db = None
    if need_x and need_w:
        dx, dw = knn_conv_backward(grad_y, x, weight, layer, backend, compute_dtype)
    elif need_x:
        dx = knn_conv_grad_input(grad_y, weight, layer, backend, compute_dtype)
    elif need_w:
        dw = knn_conv_grad_weight(grad_y, x, layer, backend, compute_dtype)
    if dx is not None:
        dx = dx.to(x.dtype)
    if dw is not None:
        dw = dw.to(weight.dtype)
    if need_b and ctx.bias_dtype is not None:
        db = grad_y.sum((0, 2), dtype=torch.promote_types(grad_y.dtype, torch.float32)).to(ctx.bias_dtype)
    return dx, dw, db, None, None, None, None


knn_conv.register_autograd(_backward, setup_context=_setup_context)
