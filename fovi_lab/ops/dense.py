"""``torch_dense``: the compact KNN convolution as dense matrix products, with explicit adjoints.

Each output node ``n`` gathers its neighbours' inputs ``f[b, c, n, k] = xp[b, c, idx[n, k]]`` (``xp``: x with a zero
pad column at ``Nin``), bins them into the reference taps with a dense one-hot matrix ``S[n] [K, V]``
(``S[n, k, v] = 1`` where ``rf_index[n, k] = v``; a batched GEMM over nodes, so taps that collide sum), and one GEMM
with the weight ``W [Cout, Cin*V]`` gives ``y``::

    G[n, (b, c), v] = f[n, (b, c), :] @ S[n]                 per node: [B*Cin, K] x [K, V]
    y[b, o, n]      = sum_{c, v} W[o, c*V + v] G[n, (b, c), v]   one GEMM: [Nout*B, Cin*V] x [Cin*V, Cout]

The adjoints run the same products backwards: ``dG = g W`` then ``df = dG S[n]^T`` summed into ``dx`` through the
neighbour table (``index_add_``), and ``dW = g^T G`` with ``G`` binned again from ``x``. Nodes are processed in
chunks whose temporaries fit the stage budget (``FOVI_KNN_STAGE_MIB``).

It does ``V / (P64 / Cin)`` (about 4 with the doubled reference frame) times the compact GEMM's multiply-adds in the
weight GEMM, plus the binning GEMMs, but every product is a large GEMM: on a CPU, at small batch, that is faster
than the compact form's many small per-node products (which gather the weight once per node) and than the binned
form's scalar scatter. The gradients accumulate in fp32 (fp64 for fp64 inputs); on a CPU ``index_add_`` sums in a
fixed order.
"""

from __future__ import annotations

import torch

from fovi_lab.graph.meta import TrainingMeta, meta_aux
from fovi_lab.ops.reference import (check_forward_args, check_grad_args, grad_accum_dtype, stage_budget_bytes,
                                    take_last)

__all__ = ["DenseTorchOps", "dense_node_chunk"]

#: The one-hot tables ``S`` of a layer are kept with its meta up to this many bytes (built per chunk above it).
ONEHOT_KEEP_BYTES = 64 << 20


def dense_node_chunk(meta: TrainingMeta, batch: int, itemsize: int, budget: int | None = None) -> int:
    """Nodes per chunk of the dense form: its gathered inputs, binned taps, their gradients and one-hot rows
    (``B*Cin*(K + V)*2 + K*V`` values per node) within the stage budget, at least 1."""
    budget = stage_budget_bytes() if budget is None else budget
    per_node = (2 * batch * meta.cin * (meta.k + meta.v) + meta.k * meta.v) * itemsize
    return max(1, min(meta.nout, budget // max(1, per_node)))


def _node_ranges(meta: TrainingMeta, batch: int, itemsize: int):
    """``(n0, n1)`` of each chunk of output nodes (:func:`dense_node_chunk` nodes, the last one shorter)."""
    nc = dense_node_chunk(meta, batch, itemsize)
    return [(n0, min(meta.nout, n0 + nc)) for n0 in range(0, meta.nout, nc)]


def _onehot(meta: TrainingMeta, dtype: torch.dtype, n0: int, n1: int) -> torch.Tensor:
    """``S[n0:n1] [n, K, V]`` in ``dtype`` on the meta's device (the whole table kept with the meta when small)."""
    whole = meta.nout * meta.k * meta.v * torch.empty((), dtype=dtype).element_size()
    if whole > ONEHOT_KEEP_BYTES:
        return torch.nn.functional.one_hot(meta.rf_index[n0:n1].long(), meta.v).to(dtype)
    aux = meta_aux(meta)
    key = ("dense_onehot", dtype, str(meta.device))
    s = aux.get(key)
    if s is None:
        s = aux[key] = torch.nn.functional.one_hot(meta.rf_index.long(), meta.v).to(dtype).contiguous()
    return s[n0:n1]


def _padded(x: torch.Tensor) -> torch.Tensor:
    """``[B, Cin, Nin + 1]``: x and a zero column, the pad neighbour's value."""
    return torch.cat([x, x.new_zeros(x.shape[0], x.shape[1], 1)], dim=2)


def _binned(meta: TrainingMeta, xp: torch.Tensor, n0: int, n1: int) -> torch.Tensor:
    """``G [n, B*Cin, V]`` of nodes ``n0:n1`` from the padded input."""
    b, nc = xp.shape[0], n1 - n0
    f = take_last(xp, meta.idx[n0:n1].reshape(-1).long()).view(b * meta.cin, nc, meta.k).transpose(0, 1)
    return torch.bmm(f, _onehot(meta, xp.dtype, n0, n1))


class DenseTorchOps:
    """Ops object ``torch_dense``: the dense form of the module docstring (registry, ``auto``)."""

    name = "torch_dense"

    @staticmethod
    def forward(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
        check_forward_args(meta, x, weight, bias)
        meta = meta.to(x.device)
        b, xp, wt = x.shape[0], _padded(x), weight.t()                              # wt: [Cin*V, Cout]
        y = x.new_empty(b, meta.cout, meta.nout)
        for n0, n1 in _node_ranges(meta, b, x.element_size()):
            g = _binned(meta, xp, n0, n1).reshape((n1 - n0) * b, meta.q)             # [(n, b), Cin*V]
            y[:, :, n0:n1] = torch.mm(g, wt).view(n1 - n0, b, meta.cout).permute(1, 2, 0)
        return y if bias is None else y.add_(bias.to(y.dtype).view(1, -1, 1))

    @staticmethod
    def grad_input(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        check_grad_args(meta, grad_y, weight=weight)
        meta = meta.to(grad_y.device)
        b, acc = grad_y.shape[0], grad_accum_dtype(grad_y.dtype)
        dxp = torch.zeros(b, meta.cin, meta.nin + 1, dtype=acc, device=grad_y.device)
        for n0, n1 in _node_ranges(meta, b, grad_y.element_size()):
            g = grad_y[:, :, n0:n1].permute(2, 0, 1).reshape((n1 - n0) * b, meta.cout)
            dg = torch.mm(g, weight).view(n1 - n0, b * meta.cin, meta.v)             # [n, B*Cin, V]
            df = torch.bmm(dg, _onehot(meta, grad_y.dtype, n0, n1).transpose(1, 2))  # [n, B*Cin, K]
            src = df.transpose(0, 1).reshape(b, meta.cin, (n1 - n0) * meta.k)
            dxp.index_add_(2, meta.idx[n0:n1].reshape(-1).long(), src.to(acc))
        return dxp[:, :, :meta.nin].contiguous()

    @staticmethod
    def grad_weight(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        check_grad_args(meta, grad_y, x=x)
        meta = meta.to(grad_y.device)
        b, acc = grad_y.shape[0], grad_accum_dtype(grad_y.dtype)
        xp = _padded(x)
        dw = None                               # the first chunk's product is dW (no zeroed [Cout, Q] to add it to)
        for n0, n1 in _node_ranges(meta, b, grad_y.element_size()):
            g = grad_y[:, :, n0:n1].permute(1, 2, 0).reshape(meta.cout, (n1 - n0) * b)  # [Cout, (n, b)]
            gb = _binned(meta, xp, n0, n1).reshape((n1 - n0) * b, meta.q)
            part = torch.mm(g, gb).to(acc)
            dw = part if dw is None else dw.add_(part)
        return dw
