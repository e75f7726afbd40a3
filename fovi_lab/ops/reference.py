"""Reference implementations of the compact KNN convolution (docs/operator.md §1.4, §2.3, §2.4, §3.2).

* :func:`oracle_forward`: the fp32 (or fp64) definition, gather + one-hot binning + einsum, written
  from the layer-level math and independent of the compact index tables.
* :class:`CompactTorchOps` (``torch_compact``): the gather-GEMM in PyTorch, chunked over nodes under
  a memory budget; forward plus both explicit adjoints. Works on CPU/GPU, fp32/fp16/bf16/fp64.
* :func:`build_effective_weight`: the inference-only ``Weff[Nout, P64, Cout_pad]`` cache.
* :func:`binned_forward` (``torch_binned_mm`` in the benchmarks): docs/operator.md §1.4's binned form with the
  compact tables, differentiable: bin the gathered inputs into the ``Q`` taps (``index_add``), then one
  shared-weight matmul per image. :class:`BinnedTorchOps` (``torch_binned``) is the same with explicit
  adjoints, a registered backend: the fastest PyTorch form for small layers at small batch.
"""

from __future__ import annotations

from typing import Tuple

import torch

import fovi_lab.settings as settings
from fovi_lab.graph.meta import TrainingMeta, meta_aux, pad_to, validate_meta
from fovi_lab.ops.checks import check_operands

__all__ = [
    "oracle_forward", "pad_flat_input", "grad_accum_dtype", "stage_budget_bytes", "node_chunk",
    "CompactTorchOps", "build_effective_weight", "check_forward_args", "check_grad_args", "NOT_GIVEN", "binned_forward",
    "batch_chunk", "explicit_grads",
    "BinnedTorchOps", "shared_matmul", "FOLD_BELOW_NODES", "THIN_COLUMNS", "take_last",
]


def stage_budget_bytes() -> int:
    """Stage/temporary memory budget: ``FOVI_KNN_STAGE_MIB`` MiB (default 512)."""
    return int(settings.get("FOVI_KNN_STAGE_MIB") * (1 << 20))


def node_chunk(meta: TrainingMeta, batch: int, itemsize: int, budget: int | None = None) -> int:
    """Nodes per chunk: ``min(Nout, budget // ((P64*Cout + 2*B*P64) * itemsize))``, at least 1 (docs/operator.md §3.4)."""
    budget = stage_budget_bytes() if budget is None else budget
    per_node = (meta.p64 * meta.cout + 2 * batch * meta.p64) * itemsize
    return max(1, min(meta.nout, budget // max(1, per_node)))


def grad_accum_dtype(dtype: torch.dtype) -> torch.dtype:
    """Gradients accumulate in fp32 (fp64 for fp64 inputs, so gradcheck sees exact adjoints)."""
    return torch.promote_types(dtype, torch.float32)


def explicit_grads(grad_y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, dtype: torch.dtype, needs: tuple,
                   dtypes: tuple, combined, grad_input, grad_weight) -> tuple:
    """``(dx, dW, db)`` of a compact layer from its explicit adjoints, each None where ``needs`` (x, weight, bias)
    does not ask for it: what :class:`fovi_lab.ops.autograd.KNNConvFunction`'s backward returns.

    ``grad_y``, x and weight are cast to the compute ``dtype``; ``combined(g, x, w) -> (dx, dW)`` (None: the op has
    none) runs when both are needed, else ``grad_input(g, w)`` / ``grad_weight(g, x)``, all with autocast off (the
    adjoints accumulate in fp32). dx and dW come back in ``dtypes[0]`` / ``dtypes[1]`` (x's, weight's), db is the
    fp32 sum of ``grad_y`` over batch and nodes in ``dtypes[2]`` (None: no bias)."""
    need_x, need_w, need_b = needs
    x_dtype, w_dtype, b_dtype = dtypes
    g = grad_y.contiguous().to(dtype)
    dx = dw = db = None
    with torch.autocast(device_type=g.device.type, enabled=False):
        xc = x.contiguous().to(dtype) if need_w else None
        wc = weight.contiguous().to(dtype) if need_x else None
        if need_x and need_w and combined is not None:
            dx, dw = combined(g, xc, wc)
        else:
            if need_x:
                dx = grad_input(g, wc)
            if need_w:
                dw = grad_weight(g, xc)
    if dx is not None:
        dx = dx.to(x_dtype)
    if dw is not None:
        dw = dw.to(w_dtype)
    if need_b and b_dtype is not None:
        db = grad_y.sum((0, 2), dtype=torch.promote_types(grad_y.dtype, torch.float32)).to(b_dtype)
    return dx, dw, db


def check_forward_args(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, bias, *,
                       same_dtype: bool = True) -> None:
    """Raise a clear error when x / weight / bias do not match the meta (names the argument); the meta's
    tables are checked once (:func:`fovi_lab.graph.meta.validate_meta`). First of all each operand must be a
    floating-point tensor with values (:func:`fovi_lab.ops.checks.check_operands`). ``same_dtype=False``: the
    weight's dtype may differ from x's (a call that casts both to its compute dtype itself)."""
    check_operands(x=x, weight=weight, bias=bias)
    validate_meta(meta)
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[1] != meta.cin or x.shape[2] != meta.nin:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected shape [B, Cin={meta.cin}, Nin={meta.nin}], got {shape}")
    if x.shape[0] < 1:
        raise ValueError("x: batch must be >= 1")
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (meta.cout, meta.q):
        shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight: expected shape [Cout={meta.cout}, Q=Cin*V={meta.q}], got {shape}")
    if weight.device != x.device:
        raise ValueError(f"weight: expected device {x.device} (same as x), got {weight.device}")
    if same_dtype and weight.dtype != x.dtype:
        raise TypeError(f"weight: expected dtype {x.dtype} (same as x), got {weight.dtype}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (meta.cout,):
            shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"bias: expected shape [Cout={meta.cout}] or None, got {shape}")
        if bias.device != x.device:
            raise ValueError(f"bias: expected device {x.device} (same as x), got {bias.device}")


def _shape_of(t) -> object:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__


#: The default of :func:`check_grad_args`' operands: not part of this call (an operand passed as None is refused).
NOT_GIVEN = object()


def check_grad_args(meta: TrainingMeta, grad_y: torch.Tensor, weight=NOT_GIVEN, x=NOT_GIVEN) -> None:
    """Raise a clear error when grad_y / weight / x of an adjoint call do not match the meta (names the
    argument): ``grad_y [B, Cout, Nout]``, ``weight [Cout, Q]``, ``x [B, Cin, Nin]``, one device and dtype, each a
    floating-point tensor with values (:func:`fovi_lab.ops.checks.check_operands`). ``weight`` / ``x``: pass the
    ones the call takes (dx takes the weight, dW takes x); one passed as None is refused."""
    check_operands(grad_y=grad_y, **{n: t for n, t in (("weight", weight), ("x", x)) if t is not NOT_GIVEN})
    validate_meta(meta)
    if not isinstance(grad_y, torch.Tensor) or grad_y.dim() != 3 or tuple(grad_y.shape[1:]) != (meta.cout, meta.nout):
        raise ValueError(f"grad_y: expected shape [B, Cout={meta.cout}, Nout={meta.nout}], got {_shape_of(grad_y)}")
    if grad_y.shape[0] < 1:
        raise ValueError("grad_y: batch must be >= 1")
    for name, t, shape in (("weight", weight, (meta.cout, meta.q)), ("x", x, (grad_y.shape[0], meta.cin, meta.nin))):
        if t is NOT_GIVEN:
            continue
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            want = "[Cout={}, Q=Cin*V={}]".format(*shape) if name == "weight" else \
                "[B={} (as grad_y), Cin={}, Nin={}]".format(*shape)
            raise ValueError(f"{name}: expected shape {want}, got {_shape_of(t)}")
        if t.device != grad_y.device:
            raise ValueError(f"{name}: expected device {grad_y.device} (same as grad_y), got {t.device}")
        if t.dtype != grad_y.dtype:
            raise TypeError(f"{name}: expected dtype {grad_y.dtype} (same as grad_y), got {t.dtype}")


def oracle_forward(x: torch.Tensor, weight: torch.Tensor, bias, idx: torch.Tensor,
                   rf_index: torch.Tensor, v: int, dtype=torch.float32) -> torch.Tensor:
    """The operator's definition (docs/operator.md §1.4), computed in ``dtype`` (fp32 by default).

    Args:
        x: ``[B, Cin, Nin]``. weight: ``[Cout, Cin*V]``. bias: ``[Cout]`` or None.
        idx: ``[Nout, K]`` neighbour ids, ``Nin`` = pad. rf_index: ``[Nout, K]`` taps in [0, V).

    Returns:
        ``y[b, o, n] = bias[o] + sum_{c,k} xp[b, c, idx[n,k]] * W[o, c*V + rf[n,k]]`` as ``[B, Cout, Nout]``.
    """
    b, cin, nin = x.shape
    cout = weight.shape[0]
    idx = idx.to(x.device)
    rf = rf_index.to(x.device)
    xp = torch.cat([x.to(dtype), x.new_zeros(b, cin, 1, dtype=dtype)], dim=2)     # [B, Cin, Nin+1]
    f = xp[:, :, idx]                                                              # [B, Cin, Nout, K]
    onehot = torch.nn.functional.one_hot(rf, v).to(dtype)                          # [Nout, K, V]
    g = torch.einsum("bcnk,nkv->bcnv", f, onehot)                                  # binning (collisions sum)
    w = weight.to(dtype).view(cout, cin, v)
    y = torch.einsum("bcnv,ocv->bon", g, w)
    if bias is not None:
        y = y + bias.to(dtype).view(1, cout, 1)
    return y


def pad_flat_input(x: torch.Tensor, meta: TrainingMeta) -> torch.Tensor:
    """``[B, Cin, Nin]`` -> ``xpad[B, Cin*Nin + 1]`` with the trailing zero pad column (contiguous)."""
    b = x.shape[0]
    xpad = x.new_empty(b, meta.pad_column + 1)
    xpad[:, :-1] = x.reshape(b, meta.pad_column)
    xpad[:, -1] = 0
    return xpad


class CompactTorchOps:
    """``torch_compact``: the compact gather-GEMM in PyTorch, chunked over output nodes.

    forward: per node chunk, ``A = xpad[:, input_linear]`` viewed ``[nc, B, P64]``,
    ``W_n = W^T[weight_linear]`` viewed ``[nc, P64, Cout]``, ``y[:, :, chunk] = bmm(A, W_n)``.
    grad_input: ``dA = bmm(g_n, W_n^T)`` scattered by ``index_add_`` into ``dx_flat[B, Cin*Nin+1]``;
    the pad column is dropped. grad_weight: ``dWeff = bmm(A^T, g_n)`` scattered into ``dW^T[Q, Cout]``.
    On CUDA ``index_add_`` uses atomics, so the fp32 summation order (and the last bits) vary.
    """

    name = "torch_compact"

    @staticmethod
    def forward(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
        check_forward_args(meta, x, weight, bias)
        meta = meta.to(x.device)
        b = x.shape[0]
        xpad = pad_flat_input(x, meta)
        wt = weight.t().contiguous()                                                # [Q, Cout]
        y = x.new_empty(b, meta.cout, meta.nout)
        nc = node_chunk(meta, b, x.element_size())
        for n0 in range(0, meta.nout, nc):
            n1 = min(meta.nout, n0 + nc)
            sl = slice(n0 * meta.p64, n1 * meta.p64)
            a = xpad.index_select(1, meta.input_linear_flat[sl]).view(b, n1 - n0, meta.p64).transpose(0, 1)
            w = wt.index_select(0, meta.weight_linear_flat[sl]).view(n1 - n0, meta.p64, meta.cout)
            y[:, :, n0:n1] = torch.bmm(a, w).permute(1, 2, 0)
        if bias is not None:
            y += bias.to(y.dtype).view(1, -1, 1)
        return y

    @staticmethod
    def grad_input(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        check_grad_args(meta, grad_y, weight=weight)
        meta = meta.to(grad_y.device)
        b = grad_y.shape[0]
        wt = weight.t().contiguous()
        acc = grad_accum_dtype(grad_y.dtype)
        dx = torch.zeros(b, meta.pad_column + 1, dtype=acc, device=grad_y.device)
        nc = node_chunk(meta, b, grad_y.element_size())
        for n0 in range(0, meta.nout, nc):
            n1 = min(meta.nout, n0 + nc)
            sl = slice(n0 * meta.p64, n1 * meta.p64)
            g = grad_y[:, :, n0:n1].permute(2, 0, 1)                                 # [nc, B, Cout]
            w = wt.index_select(0, meta.weight_linear_flat[sl]).view(n1 - n0, meta.p64, meta.cout)
            da = torch.bmm(g, w.transpose(1, 2))                                     # [nc, B, P64]
            dx.index_add_(1, meta.input_linear_flat[sl], da.transpose(0, 1).reshape(b, -1).to(acc))
        return dx[:, :-1].reshape(b, meta.cin, meta.nin)

    @staticmethod
    def grad_weight(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        check_grad_args(meta, grad_y, x=x)
        meta = meta.to(grad_y.device)
        b = grad_y.shape[0]
        xpad = pad_flat_input(x, meta)
        acc = grad_accum_dtype(grad_y.dtype)
        dwt = torch.zeros(meta.q, meta.cout, dtype=acc, device=grad_y.device)
        nc = node_chunk(meta, b, grad_y.element_size())
        for n0 in range(0, meta.nout, nc):
            n1 = min(meta.nout, n0 + nc)
            sl = slice(n0 * meta.p64, n1 * meta.p64)
            at = xpad.index_select(1, meta.input_linear_flat[sl]).view(b, n1 - n0, meta.p64).permute(1, 2, 0)
            g = grad_y[:, :, n0:n1].permute(2, 0, 1)                                 # [nc, B, Cout]
            dweff = torch.bmm(at, g)                                                 # [nc, P64, Cout]
            dwt.index_add_(0, meta.weight_linear_flat[sl], dweff.reshape(-1, meta.cout).to(acc))
        return dwt.t().contiguous()


def build_effective_weight(meta: TrainingMeta, weight: torch.Tensor, cout_multiple: int = 64) -> torch.Tensor:
    """Inference cache ``Weff[Nout, P64, Cout_pad]`` (docs/operator.md §2.4), in ``weight``'s dtype and device.

    ``Weff[n, p, o] = W[o, weight_linear[n, p]]`` for ``p < P`` and ``o < Cout``; true zero rows for
    ``p >= P`` (unlike ``weight_linear``'s row-0 pointer) and zero columns for ``o >= Cout``
    (``Cout_pad`` = Cout rounded up to ``cout_multiple`` so tile loads never run past the buffer).
    """
    if tuple(weight.shape) != (meta.cout, meta.q):
        raise ValueError(f"weight: expected shape [Cout={meta.cout}, Q={meta.q}], got {tuple(weight.shape)}")
    meta = meta.to(weight.device)
    cpad = pad_to(meta.cout, cout_multiple)
    wt = torch.zeros(meta.q, cpad, dtype=weight.dtype, device=weight.device)
    wt[:, :meta.cout] = weight.t()
    weff = wt.index_select(0, meta.weight_linear_flat).view(meta.nout, meta.p64, cpad)
    weff[:, meta.p:, :] = 0
    return weff.contiguous()


def _binned_index(meta: TrainingMeta) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(src, dst)`` int64 over the non-pad entries of the tables, in (n, p) order: input column
    ``c*Nin + m`` and binned position ``q*Nout + n`` (cached with the meta)."""
    aux = meta_aux(meta)
    got = aux.get("binned_index")
    if got is None:
        il, wl = meta.input_linear_flat, meta.weight_linear_flat
        keep = torch.nonzero(il != meta.pad_column).squeeze(1)
        node = keep // meta.p64
        got = aux["binned_index"] = (il[keep].contiguous(), (wl[keep] * meta.nout + node).contiguous())
    return got


def batch_chunk(meta: TrainingMeta, batch: int, itemsize: int, budget: int | None = None) -> int:
    """Images per chunk of the binned form: its stage ``G`` (``Q*Nout``) and gathered values (``nnz*Cin``)
    per image within the stage budget (:func:`stage_budget_bytes`), at least 1."""
    budget = stage_budget_bytes() if budget is None else budget
    per_image = (meta.q * meta.nout + meta.nnz * meta.cin) * itemsize
    return max(1, min(batch, budget // max(1, per_image)))


def _one_tap(meta: TrainingMeta):
    """For a layer of one tap and one weight per channel (``K = V = 1``, a 1x1 convolution over the graph):
    ``(nodes, inputs)``, the output nodes that have a neighbour (None: all of them) and their input nodes, int64
    (cached with the meta); else None. There ``G[b, c, n] = x[b, c, idx[n]]``: binning is a gather along the node
    axis, and its adjoint an ``index_add`` along it, instead of both over the flattened channel-node columns."""
    if meta.k != 1 or meta.v != 1:
        return None
    aux = meta_aux(meta)
    got = aux.get("one_tap")
    if got is None:
        idx = meta.idx[:, 0].long()
        real = idx < meta.nin
        nodes = None if bool(real.all()) else torch.nonzero(real).squeeze(1)
        got = aux["one_tap"] = (nodes, (idx if nodes is None else idx[nodes]).contiguous())
    return got


def take_last(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x.index_select(-1, index)`` (a 1-D int64 ``index``), the same values: on the CPU as ``torch.gather`` over
    the index broadcast to x's leading axes, which PyTorch's CPU kernels run faster (2 threads, fp32: ``[8, 96,
    1470]`` at 36,725 indices 57 against 111 ms, at B = 32 183 against 978 ms; ``[8, 141120]`` at 3.5 M indices 61
    against 89 ms)."""
    if x.device.type != "cpu":
        return x.index_select(x.dim() - 1, index)
    lead = x.shape[:-1]
    return torch.gather(x, x.dim() - 1, index.view(*([1] * len(lead)), -1).expand(*lead, index.numel()))


def _bin(meta: TrainingMeta, x_flat: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """``G [b, Q, Nout]``: the gathered inputs summed into their taps (``index_add``: atomics on CUDA); a gather
    along the node axis where the layer has one tap (:func:`_one_tap`)."""
    b = x_flat.shape[0]
    one = _one_tap(meta)
    if one is not None:
        nodes, inputs = one
        # (torch.gather over a broadcast index: 2-14x faster than index_select along the last axis on the CPU)
        gathered = torch.gather(x_flat.view(b, meta.cin, meta.nin), 2,
                                inputs.view(1, 1, -1).expand(b, meta.cin, inputs.numel()))  # [b, Cin, real nodes]
        if nodes is None:
            return gathered
        return gathered.new_zeros(b, meta.cin, meta.nout).index_copy_(2, nodes, gathered)
    vals = take_last(x_flat, src)                                                    # [b, nnz*Cin]
    return vals.new_zeros(b, meta.q * meta.nout).index_add(1, dst, vals).view(b, meta.q, meta.nout)


def _unbin(meta: TrainingMeta, dg: torch.Tensor, out: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """The adjoint of :func:`_bin`: ``out [b, Cin*Nin]`` (in its dtype) += each entry of ``dG [b, Q, Nout]`` at its
    input column, entries in (n, p) order (``index_add``: atomics on CUDA)."""
    one = _one_tap(meta)
    if one is not None:
        nodes, inputs = one
        vals = dg if nodes is None else dg.index_select(2, nodes)                   # [b, Cin, real nodes]
        out.view(out.shape[0], meta.cin, meta.nin).index_add_(2, inputs, vals.to(out.dtype))
        return
    vals = take_last(dg.reshape(dg.shape[0], -1), dst)                               # [b, nnz*Cin]
    out.index_add_(1, src, vals.to(out.dtype))


#: Below this many output nodes a CPU product of the shared weight with a batch of ``[K, Nout]`` matrices is one GEMM
#: over the images side by side (:func:`shared_matmul`): PyTorch's CPU ``matmul`` runs the batch as that many thin
#: GEMMs, 25-35x slower at Nout = 2 (W 512 x 256, B = 32, 2 threads).
FOLD_BELOW_NODES = 8
#: A folded CPU product with 2 to this many columns (``B * Nout``) runs transposed, ``side^T [B*Nout, K] @ weight^T``:
#: the CPU BLAS takes a slow path for a right operand of so few columns (W 512 x 9216, 2 columns, 2 threads: 7.6 ms
#: with W transposed, 3.1 with W as stored; the transposed product 1.2-2.0 ms; at 16 columns the direct one is faster).
THIN_COLUMNS = 16


def shared_matmul(weight: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``weight [M, K] @ t[b]`` for every ``b`` of ``t [B, K, N]``: ``[B, M, N]``. On the CPU with ``N`` below
    :data:`FOLD_BELOW_NODES`, one GEMM over the images side by side (the same products and sums, one call), as
    ``(side^T @ weight^T)^T`` where the side has fewer than :data:`THIN_COLUMNS` columns."""
    b, k, n = t.shape
    if t.device.type != "cpu" or n >= FOLD_BELOW_NODES:
        return torch.matmul(weight, t)
    if 2 <= b * n < THIN_COLUMNS:
        rows = torch.mm(t.transpose(1, 2).reshape(b * n, k), weight.t())            # [(b, n), M]
        return rows.view(b, n, weight.shape[0]).transpose(1, 2).contiguous()
    side = t.transpose(0, 1).reshape(k, b * n)                                      # [K, (b, n)]
    return torch.mm(weight, side).view(weight.shape[0], b, n).transpose(0, 1).contiguous()


def binned_forward(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
    """``y [B, Cout, Nout]`` by binning (docs/operator.md §1.4 with the compact tables), differentiable by autograd::

        G[b, q, n] = sum_{p: weight_linear[n,p] = q, input_linear[n,p] != pad} x_flat[b, input_linear[n,p]]
        y[b]       = W [Cout, Q] @ G[b] [Q, Nout]   (+ bias)

    Same math as the compact GEMM (collisions sum in ``G`` instead of as repeated ``W_n`` rows; ``G`` is
    rounded to the compute dtype once). ``index_add`` uses atomics on CUDA (so its last bits vary), and
    its backward is a gather while the gather's backward is an ``index_add``. The batch is chunked so that
    ``G`` stays within the stage budget (:func:`batch_chunk`; one chunk at the benchmarks' B <= 64).
    The strongest PyTorch form for small layers at small batch, where the shared-weight matmul runs on
    cuBLAS; it does ``Q / P64`` times the compact work (about 4 with rf2 tables, 1 with rf1).
    """
    check_forward_args(meta, x, weight, bias)
    meta = meta.to(x.device)
    b = x.shape[0]
    src, dst = _binned_index(meta)
    x_flat = x.reshape(b, -1)
    bc = batch_chunk(meta, b, x.element_size())
    ys = [shared_matmul(weight, _bin(meta, x_flat[b0:b0 + bc], src, dst)) for b0 in range(0, b, bc)]
    y = ys[0] if len(ys) == 1 else torch.cat(ys)                                     # [B, Cout, Nout]
    if bias is not None:
        y = y + bias.to(y.dtype).view(1, -1, 1)
    return y


class BinnedTorchOps:
    """Ops object ``torch_binned``: :func:`binned_forward` with explicit adjoints (registry, ``auto``).

    forward: :func:`binned_forward`. grad_input: ``dG[b] = W^T g[b]`` (``matmul``), then each non-pad
    entry ``(n, p)`` adds ``dG[b, weight_linear[n,p], n]`` into ``dx[b, input_linear[n,p]]`` (``index_add``
    in fp32). grad_weight: ``G`` is binned again from x (it is not kept from the forward), then
    ``dW = sum_b g[b] G[b]^T``, one contraction over images and nodes in the compute dtype (fp32
    accumulation in cuBLAS), returned in fp32. Batch chunks keep ``G`` / ``dG`` within the stage budget.
    On CUDA the ``index_add`` steps use atomics, so the last bits of dx (and of the forward's ``G``) vary
    from run to run, as with ``torch_compact``.
    """

    name = "torch_binned"

    @staticmethod
    def forward(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, bias) -> torch.Tensor:
        return binned_forward(meta, x, weight, bias)

    @staticmethod
    def _prepare(meta: TrainingMeta, grad_y: torch.Tensor, **operand):
        """Checked arguments and what both adjoints need: (meta on g's device, B, src, dst, accumulation
        dtype, batch chunk)."""
        check_grad_args(meta, grad_y, **operand)
        meta = meta.to(grad_y.device)
        b = grad_y.shape[0]
        return (meta, b, *_binned_index(meta), grad_accum_dtype(grad_y.dtype),
                batch_chunk(meta, b, grad_y.element_size()))

    @staticmethod
    def grad_input(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        meta, b, src, dst, acc, bc = BinnedTorchOps._prepare(meta, grad_y, weight=weight)
        wt = weight.t()
        dx = torch.zeros(b, meta.cin * meta.nin, dtype=acc, device=grad_y.device)
        for b0 in range(0, b, bc):
            _unbin(meta, shared_matmul(wt, grad_y[b0:b0 + bc]), dx[b0:b0 + bc], src, dst)   # dG [bc, Q, Nout]
        return dx.view(b, meta.cin, meta.nin)

    @staticmethod
    def grad_weight(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        meta, b, src, dst, acc, bc = BinnedTorchOps._prepare(meta, grad_y, x=x)
        x_flat = x.reshape(b, -1)
        dw = None
        for b0 in range(0, b, bc):
            g = _bin(meta, x_flat[b0:b0 + bc], src, dst)                              # [bc, Q, Nout]
            part = torch.einsum("bon,bqn->oq", grad_y[b0:b0 + bc], g).to(acc)        # [Cout, Q]
            dw = part if dw is None else dw + part
        return dw
