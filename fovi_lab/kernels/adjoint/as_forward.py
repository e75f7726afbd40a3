"""The adjoints on tensor cores: each gradient is the compact forward of a layer derived from the tables.

dx is the forward of the transposed layer; dW the forward of the tap layer.

Every term of ``dx[b, c, m]`` pairs an entry ``(n, k)`` of input node ``m``'s reverse list with an output
channel ``o``::

    dx[b, c, m] = sum_{(n, k): idx[n, k] = m} sum_o g[b, o, n] W[o, c*V + rf[n, k]]

which is the compact forward of a layer whose output nodes are the input nodes, whose neighbour lists are
the reverse lists and whose channels swap (:func:`fovi_lab.graph.meta.transposed_meta`), on ``grad_y`` with
the weight ``W'[c, o*V + t] = W[o, c*V + t]``. So the hand-written ``mma.sync`` forward kernels compute dx as
they compute y: fp16 (or bf16) products, fp32 accumulation, no atomics. The split configs (``mmas`` /
``mmasw`` / ``mmaps``, fp16 only) write fp32 partials and sum them in a fixed order, and here that sum is the output, never rounded
to fp16: dx is fp32 and bitwise repeatable. The cost is the reverse lists' padding to the largest
in-degree (:func:`padding`).

dW is a GEMM per tap over the pairs (batch row, entry of that tap), the forward of the tap layer
(:func:`fovi_lab.graph.meta.tap_meta`): output nodes the taps, batch rows the input channels, input channels
the batch, inputs ``x'[c, b, m] = x[b, c, m]`` and weight ``W'[o, b*Nout + n] = g[b, o, n]``; its fp32 output
``[Cin, Cout, V]`` is dW's. Its lists are the taps' entry lists, padded to the longest.

Not the rule's pick: ``warp_train`` runs them when ``FOVI_KNN_DX_PATH=mma`` / ``FOVI_KNN_DW_PATH=mma``. On the H200
(``python -m fovi_lab bench adjoints``, records in ``data/h200/adjoint_paths.jsonl``) the fastest split config beat
the rule's kernel on dx at B = 16 on the 5 layers measured (1.18-1.90x) and at B = 64 on 3 of 4, but lost at
B = 512 on the ResNet layers (0.66-0.86x); on dW it won 6 of 14 shapes (0.63-1.66x); in the replayed step their
per-call copies (``W'``, ``x'``, the partials' sum) often cost what the kernels saved.
"""

from __future__ import annotations

from typing import Optional

import torch

from fovi_lab.graph.meta import TrainingMeta, tap_meta, transposed_meta, validate_meta
from fovi_lab.kernels.common import check_tensor
from fovi_lab.ops.reference import check_grad_args

__all__ = ["grad_input_mma", "grad_weight_mma", "transposed_weight", "padding", "tap_padding"]


def transposed_weight(weight: torch.Tensor, meta: TrainingMeta) -> torch.Tensor:
    """``W' [Cin, Cout*V]`` with ``W'[c, o*V + t] = W[o, c*V + t]`` (contiguous, weight's dtype)."""
    return weight.view(meta.cout, meta.cin, meta.v).transpose(0, 1).reshape(meta.cin, meta.cout * meta.v)


def padding(meta: TrainingMeta) -> float:
    """The transposed layer's reverse-list padding: slots (Nin * largest in-degree) over real entries."""
    t = transposed_meta(meta)
    real = int(meta.rev_rowptr[-1])
    return t.nout * t.k / max(1, real)


def tap_padding(meta: TrainingMeta) -> float:
    """The tap layer's padding: slots (V * longest tap list) over real entries."""
    t = tap_meta(meta, 1)
    return t.nout * t.k / max(1, int((meta.idx < meta.nin).sum()))


def grad_input_mma(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor,
                   config: Optional[str] = None) -> torch.Tensor:
    """``dx [B, Cin, Nin]`` fp32 on the tensor-core forward of the transposed layer.

    Args:
        meta: the layer's :class:`TrainingMeta`.
        grad_y: ``[B, Cout, Nout]`` fp16 or bf16, contiguous.
        weight: ``[Cout, Q]`` in grad_y's dtype.
        config: a split tensor-core forward config (``mmas_*`` / ``mmasw_*`` / ``mmaps_*``) for the transposed layer; None:
            :func:`fovi_lab.kernels.forward.api.select_mma_split` for (B, Cin).
    """
    from fovi_lab.kernels.forward.api import run_uncached
    validate_meta(meta)
    check_tensor("grad_y", grad_y, dtype=(torch.float16, torch.bfloat16))
    check_grad_args(meta, grad_y, weight=weight)
    meta = meta.to(grad_y.device)
    mt = transposed_meta(meta)
    wt = transposed_weight(weight, meta)            # one copy of W per call (Cout*Q elements: small beside g)
    g = grad_y if grad_y.is_contiguous() else grad_y.contiguous()
    return run_uncached(g, wt, None, mt.input_linear, mt.weight_linear, config=config, out_dtype=torch.float32)


def grad_weight_mma(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor,
                    config: Optional[str] = None) -> torch.Tensor:
    """``dW [Cout, Q]`` fp32 on the tensor-core forward of the tap layer.

    Args:
        meta: the layer's :class:`TrainingMeta`.
        grad_y: ``[B, Cout, Nout]`` fp16 or bf16. x: ``[B, Cin, Nin]`` in grad_y's dtype.
        config: a split tensor-core forward config for the tap layer; None: ``select_mma_split(Cin, Cout)``
            (the tap layer's batch rows are the input channels).
    """
    from fovi_lab.kernels.forward.api import run_uncached
    validate_meta(meta)
    check_tensor("grad_y", grad_y, dtype=(torch.float16, torch.bfloat16))
    check_grad_args(meta, grad_y, x=x)
    meta = meta.to(grad_y.device)
    b = grad_y.shape[0]
    mt = tap_meta(meta, b)
    xt = x.permute(1, 0, 2).contiguous()                                  # x' [Cin, B, Nin]
    gt = grad_y.permute(1, 0, 2).reshape(meta.cout, b * meta.nout)       # W' [Cout, B*Nout]
    y = run_uncached(xt, gt, None, mt.input_linear, mt.weight_linear, config=config, out_dtype=torch.float32)
    return y.permute(1, 0, 2).reshape(meta.cout, meta.q)                 # [Cin, Cout, V] -> [Cout, Cin*V]
