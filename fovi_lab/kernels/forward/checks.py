"""Argument checks for the forward entry points (the tables' analysis is :mod:`fovi_lab.kernels.tables`)."""

from __future__ import annotations

from typing import Optional

import torch

from fovi_lab.kernels.common import check_tensor
from fovi_lab.ops.checks import check_operand


def device_str(device) -> str:
    if device is None:
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"
    if isinstance(device, torch.device):
        if device.type == "cuda":
            return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
        return str(device)
    s = str(device)
    if s == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    return s


def _check_x(x, dtypes=(torch.float16,)) -> None:
    check_operand("x", x)
    if x.dtype not in dtypes:
        raise TypeError(f"x: expected dtype {' or '.join(map(str, dtypes))}, got {x.dtype}")
    check_tensor("x", x)
    if x.dim() != 3:
        raise ValueError(f"x: expected shape [B, Cin, Nin], got {tuple(x.shape)}")
    if x.shape[0] < 1 or x.shape[1] < 1 or x.shape[2] < 1:
        raise ValueError(f"x: expected a non-empty [B, Cin, Nin] tensor, got {tuple(x.shape)}")
    if x.device.type not in ("cpu", "cuda"):
        raise ValueError(f"x: Warp kernels run on cpu or cuda tensors, got device {x.device}")


def _check_table(name: str, t, x: torch.Tensor, nout: Optional[int] = None) -> None:
    check_tensor(name, t, dtype=torch.int32, dim=2, device=x.device, contiguous=True)
    if t.shape[0] < 1 or t.shape[1] < 64 or t.shape[1] % 64:
        raise ValueError(f"{name}: expected shape [Nout, P64] with P64 a positive multiple of 64, "
                         f"got {tuple(t.shape)}")
    if nout is not None and t.shape[0] != nout:
        raise ValueError(f"{name}: expected {nout} rows (Nout of input_linear), got {t.shape[0]}")


def _check_bias(bias, cout: int, x: torch.Tensor) -> None:
    check_operand("bias", bias, optional=True)
    if bias is not None:
        check_tensor("bias", bias, device=x.device, shape=(cout,))
