"""The binned forward on tensor cores: bin the inputs by weight column, then one shared-weight GEMM.

The compact GEMM (every other forward family) gives each output node its own gathered weight
``W_n [P64, Cout]``, so a call reads ``Nout * P64 * Cout`` weight values whatever the batch: at B = 1 that
read is the whole cost. The binned form (docs/operator.md §1.4) moves the gather to the input side and
shares ``W`` across nodes::

    G[b*Nout + n, q] = sum_{p : weight_linear[n, p] = q, input_linear[n, p] != pad} x_flat[b, input_linear[n, p]]
    y[b, :, n]       = bias + W [Cout, Q] @ G[b*Nout + n, :]

one GEMM of ``B*Nout x Q x Cout`` that reads ``W`` once. It does ``Q / P64`` times the compact FLOPs (about
4 with rf2 tables, where each node uses a quarter of the taps, and under 1 with rf1), so it pays only where
the compact form is bound by its weight reads: small batches.

Two launches and a transpose, all deterministic:

1. :func:`bin_kernel` (SIMT, one thread per ``(n, q)`` looping over the images): ``G`` in the compute dtype. Each thread follows the
   chain of entries ``(n, p)`` that land in its column in p order (:func:`binned_tables`; most chains have
   one entry, the collisions of the tables two or more), sums them in fp32 and rounds once. No atomics, no
   zero fill: every element of ``G`` is written.
2. The GEMM is the compact forward of a *one-node layer*: ``x' = G`` seen as ``[B*Nout, 1, Q]``, tables
   ``input_linear = weight_linear = 0 .. Q-1`` (padded to a multiple of 64 with the pad column ``Q``) and the
   layer's own ``W``, on the tensor-core kernels (:func:`~fovi_lab.kernels.forward.api.run_uncached`).
3. ``y' [B*Nout, Cout]`` is transposed into ``y [B, Cout, Nout]``.

``G`` is rounded to the compute dtype once per element; an element with a collision (two entries of one node
on the same weight column) rounds its sum where the compact form rounds nothing, so the binned y can differ
from the compact one in the last bits, within the forward's tolerance of the fp32 oracle.

Measured (one H200, fp16, ``python -m fovi_lab bench forward --binned --graphs``, data/h200/forward_binned.jsonl.gz):
replayed from CUDA graphs, the binned op was slower than PyTorch's fastest forward on every measured shape but the
ResNet-18 stem, and slower than the compact kernels everywhere but AlexNet L1, L2 and L4 at B = 1, where it saved
a little and still lost clearly to PyTorch's binned form, whose GEMM is cuBLAS's. At B = 16 AlexNet L1's binned
GEMM is 18.1 GFLOP against the compact kernels' 4.6 GFLOP, and the op (bin pass included) ran it at a lower
rate than the compact kernels ran theirs: 4x the work at a lower rate. The mma kernels are built for many small
per-node GEMMs, not one ``B*Nout x Q x Cout`` GEMM; a dense-GEMM kernel of cuBLAS's class is what this form would
need. Replayed per GEMM config (data/h200/forward_binned_replayed.jsonl.gz), the pipelined split config gave the
fastest binned op at B = 1 on AlexNet L1-L3, a little ahead of the compact kernels and still well behind
PyTorch's binned form; in a profile of AlexNet L2 at B = 1 (tools/gpu/profile_step.py --forward --baseline
binned_mm) cuBLAS's split-K GEMM took a fraction of the time of the one-node GEMM of the rule's pick (a split
config with W in place). At B = 4 the compact kernels were faster everywhere. So
:func:`fovi_lab.knn_warp.forward_path` runs the compact kernels unless
``FOVI_KNN_FWD_PATH=binned`` asks for this form.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import warp as wp

from fovi_lab.graph.meta import TrainingMeta, meta_aux, pad_to
from fovi_lab.kernels.common import built_once, fast_launch, warp_ct, warp_device

__all__ = ["binned_tables", "one_node_tables", "bin_inputs", "run_binned", "binned_flops", "bin_kernel",
           "bin_bf16_kernel"]


def binned_tables(meta: TrainingMeta) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(first [Nout, Q], next [Nout, P64])`` int32 on the meta's device (built once per meta).

    ``first[n, q]``: the smallest p with ``weight_linear[n, p] = q`` and a real ``input_linear[n, p]``, or -1;
    ``next[n, p]``: the next such p of the same ``(n, q)`` after p, or -1. Together they list, for each
    ``(n, q)``, the entries :func:`bin_kernel` sums, in p order."""
    aux = meta_aux(meta)
    got = aux.get("binned_tables")
    if got is None:
        nout, p64, q = meta.nout, meta.p64, meta.q
        il, wl = meta.input_linear.long(), meta.weight_linear.long()
        real = (il != meta.pad_column).reshape(-1)
        flat = torch.arange(nout * p64, device=il.device)[real]                      # (n, p) in order
        node = flat // p64
        key = node * q + wl.reshape(-1)[real]                                        # (n, q) of each entry
        key, order = torch.sort(key, stable=True)                                    # p order within a key
        flat = flat[order]
        first = torch.full((nout * q,), -1, dtype=torch.int64, device=il.device)
        head = torch.ones_like(key, dtype=torch.bool)
        head[1:] = key[1:] != key[:-1]
        first[key[head]] = flat[head] % p64
        nxt = torch.full((nout * p64,), -1, dtype=torch.int64, device=il.device)
        same = ~head[1:]                                                             # entry i+1 follows i
        nxt[flat[:-1][same]] = flat[1:][same] % p64
        got = aux["binned_tables"] = (first.view(nout, q).to(torch.int32).contiguous(),
                                      nxt.view(nout, p64).to(torch.int32).contiguous())
    return got


def one_node_tables(meta: TrainingMeta) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(input_linear, weight_linear)`` ``[1, Q64]`` int32 of the one-node layer whose forward is the binned
    GEMM: ``p`` for ``p < Q``, then the pad column ``Q`` (input) and 0 (weight) up to ``Q64 = pad_to(Q, 64)``.
    Built once per meta, so the forward's call cache sees the same table objects every call."""
    aux = meta_aux(meta)
    got = aux.get("one_node_tables")
    if got is None:
        q64 = pad_to(meta.q, 64)
        ar = torch.arange(q64, dtype=torch.int32, device=meta.input_linear.device)
        il = torch.where(ar < meta.q, ar, torch.full_like(ar, meta.q)).view(1, q64).contiguous()
        wl = torch.where(ar < meta.q, ar, torch.zeros_like(ar)).view(1, q64).contiguous()
        got = aux["one_node_tables"] = (il, wl)
    return got


def _make_bin_kernel(et, name: str):
    def fovi_bin(x: wp.array2d(dtype=et), il: wp.array2d(dtype=wp.int32), first: wp.array2d(dtype=wp.int32),
                 nxt: wp.array2d(dtype=wp.int32), nout: int, batch: int, g: wp.array2d(dtype=et)):
        n, q = wp.tid()
        p = first[n, q]
        if p < 0:                      # no entry of node n on column q
            for b in range(batch):
                g[b * nout + n, q] = et(0.0)
            return
        c0 = il[n, p]                  # the chain's head, read once for every image
        p1 = nxt[n, p]
        for b in range(batch):
            acc = float(x[b, c0])
            p2 = p1
            while p2 >= 0:             # collisions: the rest of (n, q)'s entries in p order (fixed-order fp32 sum)
                acc += float(x[b, il[n, p2]])
                p2 = nxt[n, p2]
            g[b * nout + n, q] = et(acc)
    for arg in ("x", "g"):             # objects, not strings: this module's annotations are postponed
        fovi_bin.__annotations__[arg] = wp.array2d(dtype=et)
    for arg in ("il", "first", "nxt"):
        fovi_bin.__annotations__[arg] = wp.array2d(dtype=wp.int32)
    fovi_bin.__annotations__["nout"] = int
    fovi_bin.__annotations__["batch"] = int
    fovi_bin.__name__ = name
    return wp.kernel(enable_backward=False, module="unique")(fovi_bin)


@built_once
def bin_kernel():
    """``G[b*Nout + n, q]`` (fp16) of the module docstring: one thread per ``(n, q)``, q fastest (coalesced
    stores and ``first`` reads), looping over the images so that the chain's indices are read once per thread;
    each element sums its chain of entries in p order in fp32."""
    return _make_bin_kernel(wp.float16, "fovi_bin_fp16")


@built_once
def bin_bf16_kernel():
    """:func:`bin_kernel` in bf16."""
    return _make_bin_kernel(wp.bfloat16, "fovi_bin_bf16")


def bin_inputs(meta: TrainingMeta, x: torch.Tensor) -> torch.Tensor:
    """``G [B*Nout, Q]`` in x's dtype (fp16 or bf16): x binned by weight column (the module docstring).

    Args:
        meta: the layer's :class:`TrainingMeta`, on x's device.
        x: ``[B, Cin, Nin]`` fp16 or bf16.
    """
    b = x.shape[0]
    first, nxt = binned_tables(meta)
    x2 = x.reshape(b, meta.cin * meta.nin)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    g = torch.empty(b * meta.nout, meta.q, dtype=x.dtype, device=x.device)
    if g.numel():
        kernel = bin_bf16_kernel() if x.dtype == torch.bfloat16 else bin_kernel()
        # x is read through input_linear, whose pad entries are never followed (first/next skip them)
        fast_launch(kernel, (meta.nout, meta.q),
                    [warp_ct(x2), warp_ct(meta.input_linear), warp_ct(first), warp_ct(nxt), meta.nout, b, warp_ct(g)],
                    256, warp_device(x), tiled=False)
    return g


def binned_flops(meta: TrainingMeta, batch: int) -> int:
    """FLOPs of the binned GEMM: ``2 B Nout Q64 Cout`` (the compact form's ``2 B Nout P64 Cout`` times
    ``Q64 / P64``)."""
    return 2 * batch * meta.nout * pad_to(meta.q, 64) * meta.cout


def run_binned(meta: TrainingMeta, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
               config: Optional[str] = None) -> torch.Tensor:
    """``y [B, Cout, Nout]`` in x's dtype by the binned form (the module docstring).

    Args:
        meta: the layer's :class:`TrainingMeta` (on any device: its copy on x's device is used).
        x: ``[B, Cin, Nin]`` fp16 or bf16. weight: ``[Cout, Q]`` in x's dtype. bias: ``[Cout]`` or None.
        config: the forward config of the one-node GEMM (``B*Nout`` batch rows, ``Q64`` deep), or None for
            the forward rule's pick at that shape.

    The caller checks x, weight and bias against the layer (:func:`fovi_lab.ops.reference.check_forward_args`).
    """
    from fovi_lab.kernels.forward.api import run_uncached
    meta = meta.to(x.device)
    b = x.shape[0]
    g = bin_inputs(meta, x)
    il1, wl1 = one_node_tables(meta)
    y1 = run_uncached(g.view(b * meta.nout, 1, meta.q), weight, bias, il1, wl1, config=config)  # [B*Nout, Cout, 1]
    return y1.view(b, meta.nout, meta.cout).transpose(1, 2).contiguous()

