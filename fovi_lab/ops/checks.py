"""The check every entry point makes first: is each operand a floating-point tensor that holds data?

Every way into the operator (each backend's ops, the seed's functional API in :mod:`fovi_lab.knn_warp`, the
forward kernels' ``run_uncached`` / ``run_cached``, :class:`~fovi_lab.ops.autograd.KNNConv`,
:class:`~fovi_lab.ops.autograd.KNNConvFunction` and the custom ops of :mod:`fovi_lab.ops.library`) calls
:func:`check_operands` before it computes anything, so that

* an integer, bool, complex or float8 tensor is refused (PyTorch would cast the weights to an integer x's dtype and
  return zeros; no kernel computes in complex or float8),
* a tensor on the ``meta`` device is refused (it has a shape but no values to compute with),
* anything that is not a tensor (a NumPy array, a list) is refused,

each with an error that names the argument and says what was expected. The shape, device and dtype checks
against the layer follow (:func:`fovi_lab.ops.reference.check_forward_args`, ``check_grad_args``).
"""

from __future__ import annotations

import torch

__all__ = ["check_operand", "check_operands", "FLOAT_DTYPES"]

#: The dtypes the operator is defined for (the Warp backends take float16 and bfloat16 of these).
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_operand(name: str, t, *, optional: bool = False) -> None:
    """Raise a clear error naming ``name`` unless ``t`` is a floating-point ``torch.Tensor`` with values.

    Args:
        name: the argument's name as the caller's signature spells it (``"x"``, ``"weight"``, ``"bias"``, ...).
        t: the value passed.
        optional: ``None`` is accepted (a layer without bias).

    Raises:
        TypeError: ``t`` is not a tensor (a NumPy array, a list, ...), or its dtype is not floating point.
        ValueError: ``t`` lives on the ``meta`` device.
    """
    if t is None and optional:
        return
    if not isinstance(t, torch.Tensor):
        kind = type(t).__name__ if type(t).__module__ == "builtins" else f"{type(t).__module__}.{type(t).__name__}"
        hint = "; convert it with torch.from_numpy" if type(t).__module__ == "numpy" else ""
        raise TypeError(f"{name}: expected a torch.Tensor{' or None' if optional else ''}, got {kind}{hint}")
    if t.device.type == "meta":
        raise ValueError(f"{name}: expected a tensor with values on cpu or cuda, got one on the meta device "
                         f"(shape {tuple(t.shape)}), which holds no values to compute with; materialise it first "
                         f"(a module built on the meta device: module.to_empty(device=...), then initialise it or "
                         f"load_state_dict)")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected a floating-point tensor ({', '.join(map(_dtype_name, FLOAT_DTYPES))}), "
                        f"got {_dtype_name(t.dtype)}; convert it first, e.g. {name}.float()")


def check_operands(**operands) -> None:
    """:func:`check_operand` on each keyword, in order (``bias`` may be None), e.g.
    ``check_operands(x=x, weight=weight, bias=bias)`` or ``check_operands(grad_y=grad_y, weight=weight)``."""
    for name, t in operands.items():
        check_operand(name, t, optional=name == "bias")
