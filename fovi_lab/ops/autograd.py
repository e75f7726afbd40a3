"""The autograd Function and the ``KNNConv`` module (docs/operator.md §4), over the ops of :mod:`fovi_lab.ops.registry`.

``KNNConvFunction.apply(x, weight, bias, meta, ops_name)`` (eager) runs ``ops.forward`` in the compute dtype
(the autocast dtype when autocast is on for x's device type, CUDA or CPU, else ``x.dtype``) and, backward, the
explicit adjoints; gradients are cast back to the dtypes of x / weight / bias (fp32 master weights
under AMP keep fp32 grads), and the bias grad is an fp32 sum of ``grad_y`` over batch and nodes.
An ops object with ``step_forward`` / ``step_backward`` (``warp_train``) does all of that inside one call per
direction, which its replay layer issues as one CUDA graph (:mod:`fovi_lab.ops.replay`): the casts and the bias
gradient are not host operations, and the backward reads the forward's copies of x and weight. That path saves x and
the weight as given (not their casts), so autograd refuses an in-place change of either before the backward, as it
does for any op that saves its inputs.
The registry's names (``OPS_REGISTRY``, ``register_ops``, ``get_ops``) are re-exported here.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from fovi_lab.graph.meta import TrainingMeta, build_meta
from fovi_lab.ops.checks import check_operands
from fovi_lab.ops.dispatch import select_backend
from fovi_lab.ops.library import knn_conv, register_layer
from fovi_lab.ops.reference import CompactTorchOps, explicit_grads
from fovi_lab.ops.registry import OPS_REGISTRY, get_ops, register_ops

__all__ = [
    "OPS_REGISTRY", "register_ops", "get_ops", "CompactTorchOps", "KNNConvFunction", "KNNConv",
    "build_meta", "TrainingMeta", "select_backend",
]

def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the op computes in: the autocast dtype of x's device type (CUDA or CPU) when autocast is on
    there (the op is a GEMM, autocast's lower-precision list), else ``x.dtype``."""
    dev = x.device.type
    if dev in ("cuda", "cpu") and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return x.dtype


class KNNConvFunction(torch.autograd.Function):
    """``apply(x, weight, bias, meta, ops_name)`` -> ``y [B, Cout, Nout]`` with explicit adjoints."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x, weight, bias, meta: TrainingMeta, ops_name: str):
        ops = get_ops(ops_name)
        step_forward = getattr(ops, "step_forward", None)
        if step_forward is None:                               # (step_forward checks its operands first itself)
            check_operands(x=x, weight=weight, bias=bias)      # before any cast: an int x must not pass
        cd = _compute_dtype(x)
        ctx.meta, ctx.ops = meta, ops
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        if step_forward is not None:                           # casts inside the op's one (replayed) call
            y, ctx.token = step_forward(meta, x, weight, bias, cd)
            ctx.save_for_backward(x, weight)
            ctx.cd = cd
            return y
        with torch.autocast(device_type=x.device.type, enabled=False):
            x_c = x.contiguous().to(cd)
            w_c = weight.contiguous().to(cd)
            b_c = None if bias is None else bias.contiguous().to(cd)
            meta = meta.to(x.device)
            y = ops.forward(meta, x_c, w_c, b_c)
        ctx.save_for_backward(x_c, w_c)
        ctx.meta = meta                                        # on x's device
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x_c, w_c = ctx.saved_tensors
        meta, ops = ctx.meta, ctx.ops
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        if hasattr(ops, "step_backward"):                      # x_c, w_c: x and weight in their own dtypes
            # every cast explicit, the adjoints under autocast off: no autocast context to enter (custom_bwd's took
            # about a tenth of a replayed step's host work on a CPU)
            dx, dw, db = ops.step_backward(meta, ctx.token, grad_y, x_c, w_c, b_dtype, ctx.cd,
                                           (need_x, need_w, need_b))
            return dx, dw, db, None, None
        combined = getattr(ops, "backward_combined", None)
        # torch.amp.custom_bwd's contract for the other ops: the backward runs in the forward's CUDA autocast state
        with torch.autocast("cuda", enabled=ctx._fwd_used_autocast, dtype=ctx._dtype):
            dx, dw, db = explicit_grads(grad_y, x_c, w_c, x_c.dtype, (need_x, need_w, need_b), ctx.dtypes,
                                        None if combined is None else (lambda g, x, w: combined(meta, g, x, w)),
                                        lambda g, w: ops.grad_input(meta, g, w),
                                        lambda g, x: ops.grad_weight(meta, g, x))
        return dx, dw, db, None, None


class KNNConv(torch.nn.Module):
    """A compact KNN convolution layer: ``y = KNNConvFunction(x, weight, bias, meta, backend)``.

    Args:
        idx: ``[Nout, K]`` neighbour ids, ``nin`` = pad. rf_index: ``[Nout, K]`` taps in [0, v).
        nin, v: input node count and reference-grid taps. cin, cout: channels.
        bias: learnable bias. backend: a registered ops name or ``"auto"`` (an unknown name raises
            ``ValueError`` here, listing the registered ones).

    Shapes: ``x [B, Cin, Nin] -> y [B, Cout, Nout]``. The index tables (meta) are built once per device
    and never enter the state_dict. ``self.last_backend`` records the backend the last eager call used.

    Eager calls run :class:`KNNConvFunction` (the lighter host path); under ``torch.compile`` the layer is
    the custom op ``torch.ops.fovi_lab.knn_conv`` (:mod:`fovi_lab.ops.library`), which Dynamo keeps whole,
    so ``torch.compile(model, fullgraph=True)`` needs no graph break; ``"auto"`` is resolved when the op runs.
    """

    def __init__(self, idx, rf_index, *, nin: int, v: int, cin: int, cout: int, bias: bool = False,
                 backend: str = "torch_compact"):
        super().__init__()
        self.meta = build_meta(idx, rf_index, cin=cin, cout=cout, v=v, nin=nin)
        self.cin, self.cout, self.nin, self.nout, self.k, self.v = cin, cout, nin, self.meta.nout, self.meta.k, v
        self.weight = torch.nn.Parameter(torch.empty(cout, cin * v))
        self.bias = torch.nn.Parameter(torch.zeros(cout)) if bias else None
        # Kaiming-normal over the *effective* fan-in (Cin*K taps actually read), like a conv.
        torch.nn.init.normal_(self.weight, 0.0, math.sqrt(2.0 / (cin * self.k)))
        if not isinstance(backend, str):
            raise TypeError(f"backend: expected a backend name (str), got {type(backend).__name__}")
        if backend != "auto":
            try:
                get_ops(backend)
            except KeyError as exc:
                why = exc.args[0].split("; registered: ", 1)[-1]      # the registered names, and any import error
                raise ValueError(f"backend: unknown backend {backend!r}; registered: {why} or 'auto'") from None
        self.backend = backend
        self.last_backend: Optional[str] = None

    # The custom ops know a layer's tables by a handle to its meta (fovi_lab.ops.library), valid in this process
    # only: setting the meta, a copy (deepcopy) and an unpickled layer (torch.load, another process) register
    # theirs anew, so a handle never outlives its meta or names another layer's tables.
    @property
    def meta(self) -> TrainingMeta:
        return self._meta

    @meta.setter
    def meta(self, meta: TrainingMeta) -> None:
        self._meta = meta
        self._op_layer = register_layer(meta)

    def __setstate__(self, state):
        super().__setstate__(state)
        self._op_layer = register_layer(self._meta)

    @classmethod
    def from_graph(cls, graph, cin: int, cout: int, **kw) -> "KNNConv":
        """Build from a :class:`fovi_lab.graph.geometry.KNNGraph` (uses its idx, rf_index, nin, v)."""
        return cls(graph.idx, graph.rf_index, nin=graph.nin, v=graph.v, cin=cin, cout=cout, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_operands(x=x, weight=self.weight, bias=self.bias)
        bias = self.bias
        training = torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad
                                                 or (bias is not None and bias.requires_grad))
        if torch.compiler.is_compiling():
            return knn_conv(x, self.weight, bias, self._op_layer, self.backend, _compute_dtype(x), training)
        name = select_backend(self.backend, self.meta, x, training, dtype=_compute_dtype(x))
        self.__dict__["last_backend"] = name            # a plain attribute: skips Module.__setattr__ (~2 us a call)
        return KNNConvFunction.apply(x, self.weight, bias, self.meta.to(x.device), name)

    def extra_repr(self) -> str:
        return (f"cin={self.cin}, cout={self.cout}, nin={self.nin}, nout={self.nout}, k={self.k}, "
                f"v={self.v}, bias={self.bias is not None}, backend={self.backend!r}")
