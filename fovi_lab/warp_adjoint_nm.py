"""Fused node-major adjoint kernels: dx and dW of the compact KNN convolution with no staging buffer.

The staged adjoints of :mod:`fovi_lab.warp_adjoint` (the seed's design) write a per-node GEMM result
``dA [Nout, P64, B]`` / ``dWeff [Nout, P64, Cout]`` to memory and reduce it through a reverse index
in a second kernel. When the tables have the structure of spec §2.1 (every table built by
:func:`fovi_lab.meta.build_meta` has it: ``input_linear[n, c*K+k] = c*Nin + idx[n, k]``,
``weight_linear[n, c*K+k] = c*V + rf[n, k]``), both reductions fold into the GEMM's own K loop::

    dx[b, c, m]   = sum_{(n, k): idx[n,k] = m} sum_o g[b, o, n] * W[o, c*V + rf[n,k]]
    dW[o, c*V+v]  = sum_{(n, k): rf[n,k] = v, idx[n,k] < Nin} sum_b g[b, o, n] * x[b, c, idx[n,k]]

* **dx** (``dxn_*``): one CTA per (input node m, batch tile, Cin tile). It walks m's reverse list
  (the meta's reverse CSR: every (n, k) that reads m) and, per entry, accumulates
  ``g_n^T [B, Cout] @ W_v [Cout, Cin]`` over Cout chunks. Operands: ``gn[n*Op + o, b] = g[b, o, n]``
  ``[Nout*Op, Bx]`` (node-major g: the rows one entry needs are contiguous) and
  ``wr[v*Op + o, c] = W[o, c*V + v]`` ``[V*Op, Cin_p]`` (tap-major W). It is the forward's node-major
  kernel with the roles of (x, Cin) and (g, Cout) swapped and the neighbour list replaced by the
  reverse list.
* **dW** (``dwn_*``): one CTA per (tap v, split s, (o tile, c tile)). It walks the list of
  (n, m = idx[n,k]) with rf[n,k] = v (pad neighbours left out: they contribute exact zeros) and, per
  entry, accumulates ``g_n [Cout, B] @ x_m^T [B, Cin]`` over batch chunks, from ``gn`` and the
  forward's node-major input ``xn[m*Cp + c, b] = x[b, c, m]`` ``[Nin*Cp, Bx]``. Layers with few taps
  (V*tiles small next to the SM count) split each list ``S`` ways (entry j goes to split j mod S);
  the ``S`` fp32 partials ``[S, V, Op, Cp]`` (within a 64 MiB budget) are summed in a fixed order and
  laid out as dW ``[Cout, Cin*V]``: by one tiled kernel straight into dW when dW is 8 MiB or more (no
  temporary), else by a torch sum and transposing copy.

* **Balanced segments** (kernel kinds ``dxs`` / ``dws``, the same tile configs): a CTA above walks a
  whole list, so the longest list sets the time. The segment kernels flatten the lists into steps (tile
  GEMMs), cut them into contiguous segments of at most ``L`` steps (:func:`segment_table`), run one CTA
  per segment and sum each list's fp32 segment partials in segment order with a SIMT finish. The default rules
  (:func:`default_dx_seg_steps`, :func:`default_dw_seg_steps`) pick them where the H200 sweep of run 25
  found them faster: uneven or long lists on small grids (the stride-2 and small-Nout ResNet layers).

No stage buffer, no atomics: both gradients are **bitwise deterministic**, and memory
is the operands (g and x in node-major order, the size of g and x) plus dx and dW. The summation
order differs from the staged kernels' (fp32 either way).

Pads: every tile that a contraction reads is zero-padded (Cout to ``Op``, Cin to ``Cp``, batch to a
multiple of 8 and beyond that read as 0 by the bounds-checked loads), and ``Op``/``Cp`` are multiples
of the tiles that index rows inside one node's block, so no load crosses into another node's rows.

Kernels are built lazily per config (``module="unique"``, ``enable_backward=False``) and validated
once per device by a NaN canary against :class:`fovi_lab.reference.CompactTorchOps`; an unlaunchable
default makes :func:`grad_input_nm` / :func:`grad_weight_nm` return None (the caller falls back).
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

import os
import threading
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from .meta import TrainingMeta, pad_to, validate_meta
from .reference import check_grad_args
from .warp_common import (ValidatedCache, built_once, check_tensor, fast_launch, init_warp, nan_canary, warp_ct,
                          warp_device, wp)
from .warp_forward import _DIRECT_STORE_MAX_BYTES, _mathdx_default

__all__ = [
    "grad_input_nm", "grad_weight_nm", "DX_NM_CONFIG_SPECS", "DW_NM_CONFIG_SPECS",
    "select_dx_nm_config", "select_dw_nm_config", "get_nm_grad_kernel", "nm_grad_kernel_names",
    "make_dx_nm_kernel", "make_dw_nm_kernel", "plan_grad_input_nm", "plan_grad_weight_nm",
    "make_dx_seg_kernel", "make_dw_seg_kernel", "segment_table", "default_dx_seg_steps", "default_dw_seg_steps",
    "dw_seg_steps_for",
]

# dx: name -> (tile_m = batch rows, tile_n = Cin columns, tile_k = Cout chunk, block_dim)
DX_NM_CONFIG_SPECS: Dict[str, Tuple[int, int, int, int]] = {
    "dxn_m16n16k64": (16, 16, 64, 64),
    "dxn_m64n16k64": (64, 16, 64, 64),
    "dxn_m16n64k64": (16, 64, 64, 128),
    "dxn_m32n64k64": (32, 64, 64, 128),
    "dxn_m64n64k64": (64, 64, 64, 128),
    "dxn_m64n128k64": (64, 128, 64, 256),
}
# dW: name -> (tile_o = Cout rows, tile_c = Cin columns, tile_kb = batch chunk, block_dim)
DW_NM_CONFIG_SPECS: Dict[str, Tuple[int, int, int, int]] = {
    "dwn_o64c16k64": (64, 16, 64, 64),
    "dwn_o64c64k16": (64, 64, 16, 128),
    "dwn_o64c64k32": (64, 64, 32, 128),
    "dwn_o64c32k64": (64, 32, 64, 128),
    "dwn_o64c64k64": (64, 64, 64, 128),
    "dwn_o128c64k64": (128, 64, 64, 256),
}


def nm_grad_kernel_names():
    """Every ``(kind, name)`` of this module (``kind`` in {dxn, dxs, dwn, dws}: whole lists and balanced
    segments, same tiles): what warmup compiles."""
    return ([(k, n) for k in ("dxn", "dxs") for n in DX_NM_CONFIG_SPECS]
            + [(k, n) for k in ("dwn", "dws") for n in DW_NM_CONFIG_SPECS])


# One wave of CTAs on the H200 (132 SMs): below it a 64x64 dx tile leaves SMs idle.
_WAVE_CTAS = 128


def select_dx_nm_config(batch: int, cin: int, nin: Optional[int] = None, segments: bool = False) -> str:
    """dx tiles, fit to the H200 sweeps (run 3: every layer at B = 64, 128, 512; run 25: B = 16, 64, 512
    with and without segments). B <= 16: 16x16 tiles, 1.3-2.6x faster than 16x64 on every layer in
    run 25 (alexnet L1 0.22 against 0.58 ms). Above: 64x64 was the fastest or within 5% everywhere with
    Cin >= 64 *unless* its whole-list grid ``Nin * ceil(B/64) * ceil(Cin/64)`` is under one wave (res18
    layer3/4 at B = 64: Nin = 16), where 16x16 tiles ran 1.4-1.7x faster; with ``segments`` the grid
    is the segments' and 64x64 stays (res18 layer3 B=64: 0.056 against 16x16 whole lists' 0.085 ms).
    Cin < 16 (stems): 16-wide Cin tiles (the staged path is faster there anyway, see
    ``knn_warp.grad_path``)."""
    if cin <= 16:
        return "dxn_m16n16k64" if batch <= 16 else "dxn_m64n16k64"
    if batch <= 16:
        return "dxn_m16n16k64"
    if batch <= 32:
        return "dxn_m32n64k64"
    if not segments and nin is not None and nin * -(-batch // 64) * -(-cin // 64) < _WAVE_CTAS:
        return "dxn_m16n16k64"
    return "dxn_m64n64k64"


def select_dw_nm_config(cout: int, cin: int, batch: Optional[int] = None) -> str:
    """dW tiles from the same sweep: 64x64 (o x c) was the fastest or within 3% on every layer with
    Cin >= 64 (Cin = 96 included: its 32-wide tile tied); 128-wide o tiles were 10-60% slower. The
    contraction runs over the batch, so at B <= 16 (B <= 32) a 64-deep batch chunk is 3/4 (1/2) zero
    padding: there the 16-deep (32-deep) chunk."""
    if cin <= 16:
        return "dwn_o64c16k64"
    if batch is not None and batch <= 16:
        return "dwn_o64c64k16"
    if batch is not None and batch <= 32:
        return "dwn_o64c64k32"
    return "dwn_o64c64k64"


def _budget_bytes() -> int:
    """Budget of the dW partial sums (``FOVI_KNN_FUSED_PARTIAL_MIB``, default 64 MiB)."""
    try:
        return int(float(os.environ.get("FOVI_KNN_FUSED_PARTIAL_MIB", "64")) * (1 << 20))
    except ValueError:
        raise ValueError("FOVI_KNN_FUSED_PARTIAL_MIB: expected a number of MiB") from None


# --------------------------------------------------------------------------------------------
# Kernel factories
# --------------------------------------------------------------------------------------------

def _decorator(name: str, block_dim: int, mathdx: Optional[bool]):
    opts = {"enable_backward": False, "fast_math": True, "block_dim": int(block_dim)}
    if mathdx is not None:
        opts["enable_mathdx_gemm"] = bool(mathdx)
    return wp.kernel(enable_backward=False, module="unique", name=name, module_options=opts)


def make_dx_nm_kernel(tile_m: int, tile_n: int, tile_k: int, block_dim: int, mathdx: Optional[bool] = None):
    """dx kernel. Args: ``gn [Nout*Op, Bx]`` f16, ``wr [V*Op, Cin_p]`` f16, ``rowptr [Nin+1]``,
    ``rn``/``rv [nnz]`` int32 (output node and tap of each reverse entry), ``dx [Nin, B, Cin]`` f32
    (any strides), ``n_ochunks = Op/tile_k``, ``op``. Grid ``(Nin, ceil(B/tile_m), ceil(Cin/tile_n))``."""
    init_warp()
    TM, TN, TK = int(tile_m), int(tile_n), int(tile_k)

    @_decorator(f"fovi_dxn_m{TM}n{TN}k{TK}b{block_dim}", block_dim, mathdx)
    def dxn(gn: wp.array2d(dtype=wp.float16), wr: wp.array2d(dtype=wp.float16),
            rowptr: wp.array1d(dtype=wp.int32), rn: wp.array1d(dtype=wp.int32), rv: wp.array1d(dtype=wp.int32),
            dx: wp.array3d(dtype=wp.float32), n_ochunks: int, op: int):
        m, bt, ct = wp.tid()
        b0 = bt * TM
        c0 = ct * TN
        acc = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
        for j in range(rowptr[m], rowptr[m + 1]):
            grow = rn[j] * op
            wrow = rv[j] * op
            for oc in range(n_ochunks):
                w = wp.tile_load(wr, shape=(TK, TN), offset=(wrow + oc * TK, c0), storage="shared")
                a = wp.tile_load(gn, shape=(TK, TM), offset=(grow + oc * TK, b0), storage="shared")
                wp.tile_matmul(wp.tile_transpose(a), w, acc)
        wp.tile_store(dx[m], acc, offset=(b0, c0))

    dxn._fovi_tiles = ("dxn", TM, TN, TK, int(block_dim))
    return dxn


def make_dw_nm_kernel(tile_o: int, tile_c: int, tile_kb: int, block_dim: int, mathdx: Optional[bool] = None):
    """dW kernel. Args: ``gn [Nout*Op, Bx]`` f16, ``xn [Nin*Cp, Bx]`` f16, ``vrowptr [V+1]``,
    ``vn``/``vm [nnz]`` int32 (output node and input node of each entry of tap v's list),
    ``part [S, V, Op, Cp]`` f32, ``n_bchunks = ceil(Bx/tile_kb)``, ``op``, ``cp``, ``nsplit = S``,
    ``n_ct = Cp/tile_c``. Grid ``(V, S, (Op/tile_o) * n_ct)``."""
    init_warp()
    TO, TC, TKB = int(tile_o), int(tile_c), int(tile_kb)

    @_decorator(f"fovi_dwn_o{TO}c{TC}k{TKB}b{block_dim}", block_dim, mathdx)
    def dwn(gn: wp.array2d(dtype=wp.float16), xn: wp.array2d(dtype=wp.float16),
            vrowptr: wp.array1d(dtype=wp.int32), vn: wp.array1d(dtype=wp.int32), vm: wp.array1d(dtype=wp.int32),
            part: wp.array4d(dtype=wp.float32), n_bchunks: int, op: int, cp: int, nsplit: int, n_ct: int):
        v, s, t = wp.tid()
        o0 = (t // n_ct) * TO
        c0 = (t % n_ct) * TC
        acc = wp.tile_zeros(shape=(TO, TC), dtype=wp.float32)
        for j in range(vrowptr[v] + s, vrowptr[v + 1], nsplit):
            grow = vn[j] * op + o0
            xrow = vm[j] * cp + c0
            for bc in range(n_bchunks):
                a = wp.tile_load(gn, shape=(TO, TKB), offset=(grow, bc * TKB), storage="shared")
                xx = wp.tile_load(xn, shape=(TC, TKB), offset=(xrow, bc * TKB), storage="shared")
                wp.tile_matmul(a, wp.tile_transpose(xx), acc)
        wp.tile_store(part[s, v], acc, offset=(o0, c0))

    dwn._fovi_tiles = ("dwn", TO, TC, TKB, int(block_dim))
    return dwn


# Balanced segments. A fused CTA walks one list (dx: an input node's readers; dW: a tap's pairs), so the
# longest list sets the kernel's critical path: res18 layer2_0's dx lists hold 1-4 entries (mean 2.1),
# and its fused dx ran at ~half the dense ceiling of the same tiles on the H200 (run 24). The "segment"
# kernels below flatten every list into steps (one step = one tile GEMM: an (entry, Cout chunk) for dx,
# an (entry, batch chunk) for dW), cut each list into contiguous segments of at most ``L`` steps and run
# one CTA per (segment, output tile). Each segment writes an fp32 partial; a SIMT finish sums a list's
# segments in segment order (fixed: bitwise deterministic) straight into dx / dW's own layout. Lists
# without entries get no segment and a zero from the finish.

def make_dx_seg_kernel(tile_m: int, tile_n: int, tile_k: int, block_dim: int, mathdx: Optional[bool] = None):
    """dx over balanced segments. Args: ``gn``, ``wr``, ``rn``, ``rv`` as :func:`make_dx_nm_kernel`;
    ``bounds [nseg+1]`` int32 (segment s covers steps ``bounds[s]..bounds[s+1]`` of the flattened
    reverse lists, step ``t`` = entry ``t // n_ochunks``, Cout chunk ``t % n_ochunks``), ``part
    [nseg, B, Cin]`` f32. Grid ``(nseg, ceil(B/tile_m), ceil(Cin/tile_n))``."""
    init_warp()
    TM, TN, TK = int(tile_m), int(tile_n), int(tile_k)

    @_decorator(f"fovi_dxs_m{TM}n{TN}k{TK}b{block_dim}", block_dim, mathdx)
    def dxs(gn: wp.array2d(dtype=wp.float16), wr: wp.array2d(dtype=wp.float16),
            bounds: wp.array1d(dtype=wp.int32), rn: wp.array1d(dtype=wp.int32), rv: wp.array1d(dtype=wp.int32),
            part: wp.array3d(dtype=wp.float32), n_ochunks: int, op: int):
        s, bt, ct = wp.tid()
        b0 = bt * TM
        c0 = ct * TN
        acc = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
        for t in range(bounds[s], bounds[s + 1]):
            j = t // n_ochunks
            oc = t - j * n_ochunks
            w = wp.tile_load(wr, shape=(TK, TN), offset=(rv[j] * op + oc * TK, c0), storage="shared")
            a = wp.tile_load(gn, shape=(TK, TM), offset=(rn[j] * op + oc * TK, b0), storage="shared")
            wp.tile_matmul(wp.tile_transpose(a), w, acc)
        wp.tile_store(part[s], acc, offset=(b0, c0))

    dxs._fovi_tiles = ("dxs", TM, TN, TK, int(block_dim))
    return dxs


def make_dw_seg_kernel(tile_o: int, tile_c: int, tile_kb: int, block_dim: int, mathdx: Optional[bool] = None):
    """dW over balanced segments. Args: ``gn``, ``xn``, ``vn``, ``vm`` as :func:`make_dw_nm_kernel`;
    ``bounds [nseg+1]`` int32 (segment s covers steps ``bounds[s]..bounds[s+1]`` of the flattened tap
    lists, step ``t`` = entry ``t // n_bchunks``, batch chunk ``t % n_bchunks``), ``part [nseg, Op, Cp]``
    f32, ``n_ct = Cp/tile_c``. Grid ``(nseg, (Op/tile_o) * n_ct)``."""
    init_warp()
    TO, TC, TKB = int(tile_o), int(tile_c), int(tile_kb)

    @_decorator(f"fovi_dws_o{TO}c{TC}k{TKB}b{block_dim}", block_dim, mathdx)
    def dws(gn: wp.array2d(dtype=wp.float16), xn: wp.array2d(dtype=wp.float16),
            bounds: wp.array1d(dtype=wp.int32), vn: wp.array1d(dtype=wp.int32), vm: wp.array1d(dtype=wp.int32),
            part: wp.array3d(dtype=wp.float32), n_bchunks: int, op: int, cp: int, n_ct: int):
        s, t = wp.tid()
        o0 = (t // n_ct) * TO
        c0 = (t % n_ct) * TC
        acc = wp.tile_zeros(shape=(TO, TC), dtype=wp.float32)
        for st in range(bounds[s], bounds[s + 1]):
            j = st // n_bchunks
            bc = st - j * n_bchunks
            a = wp.tile_load(gn, shape=(TO, TKB), offset=(vn[j] * op + o0, bc * TKB), storage="shared")
            xx = wp.tile_load(xn, shape=(TC, TKB), offset=(vm[j] * cp + c0, bc * TKB), storage="shared")
            wp.tile_matmul(a, wp.tile_transpose(xx), acc)
        wp.tile_store(part[s], acc, offset=(o0, c0))

    dws._fovi_tiles = ("dws", TO, TC, TKB, int(block_dim))
    return dws


@built_once
def _seg_finish_kernel():
    """``out[i, j, g] = sum_{s in segptr[g]..segptr[g+1]} part[s, i, j]`` (fp32, segment order; 0 for a
    list without segments): the finish of both segment kernels, dx (``[B, Cin, Nin]`` from
    ``part [nseg, B, Cin]``, g = input node) and dW (``[Cout, Cin, V]`` from ``part [nseg, Op, Cp]``,
    g = tap). One thread per output, g fastest: coalesced stores into the gradient's own layout."""
    @wp.kernel(enable_backward=False, module="unique")
    def fovi_seg_finish(segptr: wp.array1d(dtype=wp.int32), part: wp.array3d(dtype=wp.float32),
                        out: wp.array3d(dtype=wp.float32)):
        i, j, g = wp.tid()
        acc = float(0.0)
        for s in range(segptr[g], segptr[g + 1]):
            acc += part[s, i, j]
        out[i, j, g] = acc
    return fovi_seg_finish


def segment_table(rowptr: torch.Tensor, steps_per_entry: int, seg_steps: int):
    """Cut CSR lists into balanced segments.

    Args:
        rowptr: ``[G+1]`` int CSR row pointer (G lists: input nodes for dx, taps for dW).
        steps_per_entry: tile GEMMs per entry (Cout chunks for dx, batch chunks for dW).
        seg_steps: ``L``, the most steps one segment (one CTA) takes.

    Returns:
        ``(bounds [nseg+1], segptr [G+1], longest)`` int32 on rowptr's device: segment s covers the
        flattened steps ``bounds[s]..bounds[s+1]``; list g owns segments ``segptr[g]..segptr[g+1]``
        (``ceil(len_g * steps_per_entry / L)`` of them, contiguous, in step order); ``longest`` is the
        most steps any segment takes.
    """
    if seg_steps < 1 or steps_per_entry < 1:
        raise ValueError(f"seg_steps: expected >= 1 (and steps_per_entry >= 1), got {seg_steps}, {steps_per_entry}")
    rp = rowptr.to(torch.int64)
    steps = (rp[1:] - rp[:-1]) * steps_per_entry                       # [G]
    nseg_g = (steps + seg_steps - 1) // seg_steps                      # 0 for an empty list
    segptr = torch.zeros(rp.numel(), dtype=torch.int64, device=rp.device)
    segptr[1:] = torch.cumsum(nseg_g, 0)
    nseg = int(segptr[-1])
    g = torch.repeat_interleave(torch.arange(steps.numel(), device=rp.device), nseg_g)
    lo = rp[:-1][g] * steps_per_entry + (torch.arange(nseg, device=rp.device) - segptr[:-1][g]) * seg_steps
    bounds = torch.cat([lo, rp[-1:] * steps_per_entry])
    if nseg and int(bounds[-1]) >= 2 ** 31:
        raise ValueError("segment_table: more than 2^31 steps; split the batch")
    longest = int((bounds[1:] - bounds[:-1]).max()) if nseg else 0
    return bounds.to(torch.int32).contiguous(), segptr.to(torch.int32).contiguous(), longest


# --------------------------------------------------------------------------------------------
# Build, canary, per-device cache
# --------------------------------------------------------------------------------------------

@dataclass
class NmGradKernel:
    kind: str           # "dxn" | "dwn"
    name: str
    kernel: object
    tiles: Tuple[int, int, int, int]


_build_lock = threading.Lock()
_KERNELS: Dict[Tuple[str, str, Optional[bool]], object] = {}
_VALIDATED = ValidatedCache("Warp node-major grad kernel")


# kind -> (config table, factory): "dxn"/"dwn" walk whole lists, "dxs"/"dws" balanced segments (same tiles)
def _kinds():
    return {"dxn": (DX_NM_CONFIG_SPECS, make_dx_nm_kernel), "dwn": (DW_NM_CONFIG_SPECS, make_dw_nm_kernel),
            "dxs": (DX_NM_CONFIG_SPECS, make_dx_seg_kernel), "dws": (DW_NM_CONFIG_SPECS, make_dw_seg_kernel)}


def _spec(kind: str, name: str) -> Tuple[int, int, int, int]:
    table = _kinds().get(kind, (None,))[0]
    if table is None:
        raise ValueError(f"kind: expected one of 'dxn', 'dwn', 'dxs', 'dws', got {kind!r}")
    if name not in table:
        raise KeyError(f"config: unknown {kind} config {name!r}; known: {sorted(table)}")
    return table[name]


def _build(kind: str, name: str):
    mathdx = _mathdx_default()
    key = (kind, name, mathdx)
    with _build_lock:
        k = _KERNELS.get(key)
        if k is None:
            tiles = _spec(kind, name)
            k = _kinds()[kind][1](*tiles, mathdx=mathdx)
            _KERNELS[key] = k
        return k


def _canary_problem(device: str, b: int, cout: int, cin: int):
    from .meta import build_meta
    g = torch.Generator().manual_seed(4321)
    nin, nout, k, v = 7, 3, 5, 6
    idx = torch.randint(0, nin + 1, (nout, k), generator=g)
    idx[0, 0] = nin                                                   # at least one pad neighbour
    rf = torch.randint(0, v, (nout, k), generator=g)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin, device=device)
    x = torch.randn(b, cin, nin, generator=g).to(device=device, dtype=torch.float16)
    w = (0.5 * torch.randn(cout, cin * v, generator=g)).to(device=device, dtype=torch.float16)
    gy = torch.randn(b, cout, nout, generator=g).to(device=device, dtype=torch.float16)
    return meta, x, w, gy


def _canary(kind: str, name: str, kernel, device: str) -> Tuple[bool, str]:
    """One NaN-prefilled launch on a problem of exactly one tile per axis, checked against torch_compact."""
    from .reference import CompactTorchOps
    t = _spec(kind, name)
    k = NmGradKernel(kind, name, kernel, t)
    if kind in ("dxn", "dxs"):
        meta, x, w, gy = _canary_problem(device, b=t[0], cout=t[2], cin=t[1])
        plan = (_GradInputNmPlan(meta, gy, w, k, device, store="staged") if kind == "dxn" else
                _GradInputNmPlan(meta, gy, w, None, device, seg=k, seg_steps=1))
        ref = CompactTorchOps.grad_input(meta, gy.float(), w.float())
    else:
        meta, x, w, gy = _canary_problem(device, b=t[2], cout=t[0], cin=t[1])
        plan = (_GradWeightNmPlan(meta, gy, x, k, device, nsplit=2) if kind == "dwn" else
                _GradWeightNmPlan(meta, gy, x, None, device, seg=k, seg_steps=1))
        ref = CompactTorchOps.grad_weight(meta, gy.float(), x.float())
    ok, why = nan_canary(plan.launch, plan.out)
    if not ok:
        return ok, why
    got = plan.finish()
    err = float((got.float() - ref).abs().max())
    if not err <= 2e-2 * max(1.0, float(ref.abs().max())):
        return False, f"launch ran but the canary result is wrong (max abs error {err:.3g})"
    return True, "ok"


def get_nm_grad_kernel(kind: str, name: str, device) -> Optional[NmGradKernel]:
    """The built, canary-validated kernel of ``(kind, name)`` on ``device``; None when unlaunchable."""
    dev = str(device)
    tiles = _spec(kind, name)

    def build():
        try:
            kernel = _build(kind, name)
        except Exception as exc:
            return None, f"build failed: {type(exc).__name__}: {exc}"
        ok, why = _canary(kind, name, kernel, dev)
        return (NmGradKernel(kind, name, kernel, tiles) if ok else None), why

    return _VALIDATED.get((kind, name, _mathdx_default()), dev, build)


def warm_nm_grad_kernel(kind: str, name: str, device: str):
    """Build, compile and canary one kernel (a top-level function for spawned warm-up processes)."""
    import time
    t0 = time.perf_counter()
    init_warp()
    k = get_nm_grad_kernel(kind, name, device)
    return k is not None, (_VALIDATED.why((kind, name, _mathdx_default()), device) or "ok"), time.perf_counter() - t0


# --------------------------------------------------------------------------------------------
# Per-meta index lists (cached alongside the meta)
# --------------------------------------------------------------------------------------------

def _aux(meta: TrainingMeta) -> dict:
    from .warp_adjoint import _meta_aux
    return _meta_aux(meta)


def reverse_lists(meta: TrainingMeta):
    """``(rowptr [Nin+1], rn [nnz], rv [nnz])`` int32: input node m's readers (n, tap), in CSR order."""
    aux = _aux(meta)
    got = aux.get("nm_rev")
    if got is None:
        col = meta.rev_col.to(torch.int64)
        kk, nn = col // meta.nout, col % meta.nout
        rv = meta.rf_index.to(col.device)[nn, kk]
        got = (meta.rev_rowptr.to(torch.int32).contiguous(), nn.to(torch.int32).contiguous(),
               rv.to(torch.int32).contiguous())
        if int(got[0][-1]) != int((meta.idx < meta.nin).sum()):
            raise ValueError("meta: reverse CSR does not list every non-pad (k, n) pair; "
                             "build the meta with fovi_lab.meta.build_meta")
        aux["nm_rev"] = got
    return got


def tap_lists(meta: TrainingMeta):
    """``(vrowptr [V+1], vn [nnz], vm [nnz], maxlen)``: int32 lists of tap v's (output node, input node)
    pairs, non-pad neighbours only, in (n, k) order, and the length of the longest list."""
    aux = _aux(meta)
    got = aux.get("nm_tap")
    if got is None:
        idx = meta.idx.to(meta.device)
        rf = meta.rf_index.to(meta.device)
        real = (idx < meta.nin).reshape(-1)
        flat = torch.nonzero(real).squeeze(1)                         # ascending j = n*K + k
        taps = rf.reshape(-1)[flat]
        order = torch.sort(taps, stable=True).indices
        j = flat[order]
        counts = torch.bincount(taps, minlength=meta.v)
        rowptr = torch.zeros(meta.v + 1, dtype=torch.int64, device=idx.device)
        rowptr[1:] = torch.cumsum(counts, 0)
        got = (rowptr.to(torch.int32).contiguous(), (j // meta.k).to(torch.int32).contiguous(),
               idx.reshape(-1)[j].to(torch.int32).contiguous(), int(counts.max()) if counts.numel() else 0)
        aux["nm_tap"] = got
    return got


# --------------------------------------------------------------------------------------------
# Operand layouts
# --------------------------------------------------------------------------------------------

def node_major(t: torch.Tensor, rows_pad: int, bx: int) -> torch.Tensor:
    """``[B, R, N]`` -> ``[N*rows_pad, Bx]`` fp16 with ``out[n*rows_pad + r, b] = t[b, r, n]``, zero padded."""
    b, r, n = t.shape
    if rows_pad == r and bx == b:
        return t.permute(2, 1, 0).contiguous().view(n * r, b)
    out = torch.empty(n, rows_pad, bx, dtype=torch.float16, device=t.device)
    out[:, :r, :b].copy_(t.permute(2, 1, 0))
    if rows_pad > r:                                   # pads are contracted: they must be exact zeros
        out[:, r:, :].zero_()
    if bx > b:
        out[:, :r, b:].zero_()
    return out.view(n * rows_pad, bx)


def _weight_tap_major_t(weight: torch.Tensor, cin: int, op: int, cinp: int) -> torch.Tensor:
    """``wr[v*Op + o, c] = W[o, c*V + v]`` ``[V*Op, Cin_p]`` fp16, zero padded."""
    cout, q = weight.shape
    v = q // cin
    src = weight.view(cout, cin, v).permute(2, 0, 1)
    if op == cout and cinp == cin:
        return src.contiguous().view(v * op, cinp)
    wr = torch.zeros(v, op, cinp, dtype=torch.float16, device=weight.device)
    wr[:, :cout, :cin] = src
    return wr.view(v * op, cinp)


_ct = warp_ct
_launch = fast_launch


# dx outputs up to the forward's direct-store size (_DIRECT_STORE_MAX_BYTES) are stored straight into dx
# (strided); larger ones through a contiguous buffer and one transposing copy.


class _GradInputNmPlan:
    """Operands and launches of one fused dx call; ``launch()`` then ``finish()`` -> dx.

    ``k`` (kind ``dxn``): one CTA per (input node, batch tile, Cin tile) walks the node's whole reverse
    list and stores into dx. ``seg`` (kind ``dxs``) with ``seg_steps`` = L: one CTA per (segment of at most
    L steps, batch tile, Cin tile) into fp32 partials ``out [nseg, B, Cin]``, then the SIMT finish sums
    each node's segments into dx; both launches are in ``launch()``."""

    def __init__(self, meta, grad_y, weight, k: Optional[NmGradKernel], device: str, store: Optional[str] = None,
                 gn: Optional[torch.Tensor] = None, seg: Optional[NmGradKernel] = None,
                 seg_steps: Optional[int] = None):
        kk = seg if seg is not None else k
        tm, tn, tk, bd = kk.tiles
        b = grad_y.shape[0]
        self.k, self.device, self.block_dim = kk, device, bd
        self.op = op = pad_to(meta.cout, tk)
        bx = pad_to(b, 8)
        self.gn = gn if gn is not None else node_major(grad_y, op, bx)
        self.wr = _weight_tap_major_t(weight, meta.cin, op, pad_to(meta.cin, 8))
        rowptr, rn, rv = reverse_lists(meta)
        n_oc = op // tk
        self.seg_steps = None
        if seg is not None:
            self.seg_steps = int(seg_steps)
            bounds, segptr, self.longest = _segments(meta, "dx", rowptr, n_oc, self.seg_steps,
                                                     partial_bytes=4 * b * meta.cin)
            nseg = bounds.numel() - 1
            self.dx = torch.empty(b, meta.cin, meta.nin, dtype=torch.float32, device=grad_y.device)
            self.out = torch.empty(max(1, nseg), b, meta.cin, dtype=torch.float32, device=grad_y.device)
            self.direct = True
            self._keep = (rowptr, rn, rv, bounds, segptr)
            self.dims = (nseg, -(-b // tm), -(-meta.cin // tn))
            self.inputs = [_ct(self.gn), _ct(self.wr), _ct(bounds), _ct(rn), _ct(rv), _ct(self.out), n_oc, op]
            self.fin_dims = (b, meta.cin, meta.nin)
            self.fin_inputs = [_ct(segptr), _ct(self.out), _ct(self.dx)]
            return
        self._keep = (rowptr, rn, rv)
        nbytes = 4 * b * meta.cin * meta.nin
        store = store or ("direct" if nbytes <= _DIRECT_STORE_MAX_BYTES else "staged")
        # (no closures over self here: a plan -> lambda -> plan cycle would keep every buffer of the call
        # alive until the cyclic garbage collector runs)
        self.direct = store == "direct"
        if self.direct:
            self.dx = torch.empty(b, meta.cin, meta.nin, dtype=torch.float32, device=grad_y.device)
            self.out = self.dx.permute(2, 0, 1)
        else:
            self.out = torch.empty(meta.nin, b, meta.cin, dtype=torch.float32, device=grad_y.device)
        self.dims = (meta.nin, -(-b // tm), -(-meta.cin // tn))
        self.inputs = [_ct(self.gn), _ct(self.wr), _ct(rowptr), _ct(rn), _ct(rv),
                       _ct(self.out), n_oc, op]

    def launch(self) -> None:
        if self.dims[0]:
            _launch(self.k.kernel, self.dims, self.inputs, self.block_dim, self.device)
        if self.seg_steps is not None:
            _launch(_seg_finish_kernel(), self.fin_dims, self.fin_inputs, 256, self.device, tiled=False)

    def finish(self) -> torch.Tensor:
        return self.dx if self.direct else self.out.permute(1, 2, 0).contiguous()

    def run(self) -> torch.Tensor:
        self.launch()
        return self.finish()


def _segments(meta: TrainingMeta, which: str, rowptr: torch.Tensor, steps_per_entry: int, seg_steps: int,
              partial_bytes: int = 0):
    """:func:`segment_table` of one meta's lists, cached with the meta. ``partial_bytes``: the fp32 partial
    of one segment; a table whose partials would exceed 4x the partial budget
    (``FOVI_KNN_FUSED_PARTIAL_MIB``, 64 MiB by default) is refused with a clear error (the default rules
    never ask for one; an explicit short ``seg_steps`` on a big layer could)."""
    aux = _aux(meta)
    key = ("nm_seg", which, int(steps_per_entry), int(seg_steps))
    got = aux.get(key)
    if got is None:
        got = aux[key] = segment_table(rowptr, steps_per_entry, seg_steps)
    nseg = got[0].numel() - 1
    if partial_bytes and nseg * partial_bytes > 4 * _budget_bytes():
        raise ValueError(
            f"seg_steps: {seg_steps} steps per segment cut this layer's {which} lists into {nseg} segments, "
            f"{nseg * partial_bytes / 2**20:.0f} MiB of fp32 partials, over 4x the partial budget "
            f"({_budget_bytes() / 2**20:.0f} MiB, FOVI_KNN_FUSED_PARTIAL_MIB); use longer segments or "
            f"seg_steps=None for the rule")
    return got


def _default_nsplit(meta: TrainingMeta, n_tiles: int, maxlen: int, device: str, part_bytes: int,
                    batch: int = 0) -> int:
    """How many ways to split each tap's list (H200 sweep: splitting 8-16 ways was fastest on every layer
    with few taps x tiles, e.g. res18 layer1 dW 0.29 -> 0.08 ms at B=64 from 1 to 16 ways, and never
    more than 10% slower elsewhere), bounded by the partial-sum budget (one ``[V, Cout, Cin]`` fp32
    partial per split) and by the longest list. Unsplit when the lists are short (under 4 entries per
    tap on average: res18 layer3/3_0/4_0) at B <= 128, where splitting bought nothing in the sweep and
    each split costs a dW-sized partial. 1 on the CPU."""
    if not device.startswith("cuda"):
        return 1
    if meta.nnz < 4 * meta.v and batch <= 128:
        return 1
    want = 16 if meta.v * n_tiles < _WAVE_CTAS else 8
    cap = max(1, _budget_bytes() // max(1, part_bytes))
    s = max(1, min(want, cap, max(1, maxlen)))
    return 1 << (s.bit_length() - 1)                  # a power of two


class _GradWeightNmPlan:
    """Operands and launches of one fused dW call; ``launch()`` then ``finish()`` -> dW.

    ``k`` (kind ``dwn``): one CTA per (tap, split s of ``nsplit``, tile) walks every ``nsplit``-th entry
    of the tap's list into partials ``out [S, V, Op, Cp]``. ``seg`` (kind ``dws``) with ``seg_steps`` = L:
    one CTA per (segment of at most L steps, tile) into ``out [nseg, Op, Cp]``; ``finish()`` sums each
    tap's segments into dW with one SIMT launch."""

    def __init__(self, meta, grad_y, x, k: Optional[NmGradKernel], device: str, nsplit: Optional[int] = None,
                 gn: Optional[torch.Tensor] = None, xn: Optional[torch.Tensor] = None,
                 seg: Optional[NmGradKernel] = None, seg_steps: Optional[int] = None):
        kk = seg if seg is not None else k
        to, tc, tkb, bd = kk.tiles
        b = grad_y.shape[0]
        self.meta, self.k, self.device, self.block_dim = meta, kk, device, bd
        self.op = op = pad_to(meta.cout, to)
        self.cp = cp = pad_to(meta.cin, tc)
        bx = pad_to(b, 8)
        self.gn = gn if gn is not None else node_major(grad_y, op, bx)
        self.xn = xn if xn is not None else node_major(x, cp, bx)
        vrowptr, vn, vm, maxlen = tap_lists(meta)
        n_ct = cp // tc
        n_tiles = (op // to) * n_ct
        n_bc = -(-bx // tkb)
        self.seg_steps = None
        if seg is not None:
            self.seg_steps = int(seg_steps)
            bounds, segptr, self.longest = _segments(meta, "dw", vrowptr, n_bc, self.seg_steps,
                                                     partial_bytes=4 * op * cp)
            nseg = bounds.numel() - 1
            self.nsplit = nseg                     # partials written (reported by the benchmark)
            self._keep = (vrowptr, vn, vm, bounds, segptr)
            self.out = torch.empty(max(1, nseg), op, cp, dtype=torch.float32, device=grad_y.device)
            self.dims = (nseg, n_tiles)
            self.inputs = [_ct(self.gn), _ct(self.xn), _ct(bounds), _ct(vn), _ct(vm), _ct(self.out),
                           n_bc, op, cp, n_ct]
            self._segptr = segptr
            return
        self._keep = (vrowptr, vn, vm)
        self.nsplit = s = int(nsplit) if nsplit is not None else _default_nsplit(
            meta, n_tiles, maxlen, device, 4 * meta.v * op * cp, batch=b)
        # contiguous [S, V, Op, Cp] partials: coalesced tile stores. (Storing straight into dW's own
        # [Cout, Cin, V] order through a strided view saves the finishing copy but made the stores
        # V-strided: 2-4x slower dW on the wide resnet layers on the H200, run 5.)
        self.out = torch.empty(s, meta.v, op, cp, dtype=torch.float32, device=grad_y.device)
        self.dims = (meta.v, s, n_tiles)
        self.inputs = [_ct(self.gn), _ct(self.xn), _ct(vrowptr), _ct(vn), _ct(vm), _ct(self.out),
                       n_bc, op, cp, s, n_ct]

    def launch(self) -> None:
        if self.dims[0]:
            _launch(self.k.kernel, self.dims, self.inputs, self.block_dim, self.device)

    def finish(self) -> torch.Tensor:
        """``dW[o, c*V + v]`` = the fixed-order sum of tap v's partials (fp32).

        Segments: one SIMT launch (:func:`_seg_finish_kernel`). Splits: dW of
        ``_FINISH_TILED_MIN_BYTES`` or more (alexnet L1-L4, res18 layer3/4_0): one tiled launch straight
        into dW's layout (:func:`_dw_finish_kernel`), no ``[V, Op, Cp]`` temporary. On the H200 (runs 13
        and 17) that cut the alexnet steps' peak by 12-21 MiB at the same GPU time. Smaller dW: PyTorch's
        sum and transposing copy. The tile kernel was 5-14 % slower there (res18 layer1/2/2_0 with 8-16
        partials), and the temporary is only 0.6-4.7 MB."""
        m = self.meta
        if self.seg_steps is not None:
            dw = torch.empty(m.cout, m.cin, m.v, dtype=torch.float32, device=self.out.device)
            _launch(_seg_finish_kernel(), (m.cout, m.cin, m.v), [_ct(self._segptr), _ct(self.out), _ct(dw)],
                    256, self.device, tiled=False)
            return dw.view(m.cout, m.q)
        if 4 * m.cout * m.q < _FINISH_TILED_MIN_BYTES:
            part = self.out[0] if self.nsplit == 1 else self.out.sum(0)    # [V, Op, Cp]; fixed-order sum
            return part[:, :m.cout, :m.cin].permute(1, 2, 0).reshape(m.cout, m.q).contiguous()
        dw = torch.empty(m.cout, m.cin, m.v, dtype=torch.float32, device=self.out.device)
        part = self.out.view(self.nsplit, m.v, -1)                              # [S, V, Op*Cp]
        _launch(_dw_finish_kernel(), (m.cout, -(-m.v // _FIN_TV), -(-m.cin // _FIN_TC)),
                [_ct(part), _ct(dw), self.nsplit, self.cp], _FIN_BLOCK, self.device)
        return dw.view(m.cout, m.q)

    def run(self) -> torch.Tensor:
        self.launch()
        return self.finish()


#: dW size (fp32 bytes) from which the fused dW finishes with :func:`_dw_finish_kernel` (see
#: ``_GradWeightNmPlan.finish``)
_FINISH_TILED_MIN_BYTES = 8 << 20
# tile of the dW finish: 32 taps x 32 input channels (one 128-byte row of the partials per tap)
_FIN_TV, _FIN_TC, _FIN_BLOCK = 32, 32, 64


@built_once
def _dw_finish_kernel():
    """Tile kernel ``dw[o, c, v] = sum_{s < S} part[s, v, o*Cp + c]`` (fp32, split order) over a
    ``(Cout, ceil(V/32), ceil(Cin/32))`` grid: each CTA loads 32x32 ``(v, c)`` tiles of the partials
    (rows of c, coalesced), sums them, transposes in shared memory and stores ``(c, v)`` rows of dW
    (coalesced). Columns past Cin (channel padding, or the next o's run) land outside ``dw[o]`` and are
    dropped by the bounds-checked store."""
    TV, TC = _FIN_TV, _FIN_TC

    @wp.kernel(enable_backward=False, module="unique")
    def fovi_dw_finish(part: wp.array3d(dtype=wp.float32), dw: wp.array3d(dtype=wp.float32), nsplit: int,
                       cp: int):
        o, vt, ct = wp.tid()
        v0 = vt * TV
        c0 = o * cp + ct * TC
        acc = wp.tile_load(part[0], shape=(TV, TC), offset=(v0, c0), storage="shared")
        for s in range(1, nsplit):
            acc = wp.tile_map(wp.add, acc, wp.tile_load(part[s], shape=(TV, TC), offset=(v0, c0),
                                                        storage="shared"))
        wp.tile_store(dw[o], wp.tile_transpose(acc), offset=(ct * TC, v0))
    return fovi_dw_finish


# --------------------------------------------------------------------------------------------
# Public entry points
# --------------------------------------------------------------------------------------------

def _check(meta, grad_y, weight=None, x=None):
    # shapes against the layer; the reverse lists must agree with the tables (the kernels read only them)
    validate_meta(meta)
    check_tensor("grad_y", grad_y, dtype=torch.float16)     # the dtype first: the Warp kernels are fp16 only
    check_grad_args(meta, grad_y, weight=weight, x=x)
    check_tensor("grad_y", grad_y, dtype=torch.float16, dim=3, shape=(None, meta.cout, meta.nout))
    if grad_y.shape[0] < 1:
        raise ValueError("grad_y: batch must be >= 1")


def _kernel(kind: str, config: Optional[str], default: str, device: str) -> Optional[NmGradKernel]:
    if config is None:
        return get_nm_grad_kernel(kind, default, device)
    if not isinstance(config, str):
        raise TypeError(f"config: expected a config name (str) or None, got {type(config).__name__}")
    k = get_nm_grad_kernel(kind, config, device)
    if k is None:
        why = _VALIDATED.why((kind, config, _mathdx_default()), device)
        raise RuntimeError(f"config: Warp {kind} kernel {config!r} is not launchable on {device}: {why}")
    return k


def _seg_request(env: str, arg) -> Optional[object]:
    """``seg_steps`` argument or ``env`` override: None/"auto" -> the default rule, 0/"off" -> whole lists,
    an int >= 1 -> segments of that many steps."""
    v = arg if arg is not None else (os.environ.get(env) or "auto")
    if v in ("auto", None):
        return "auto"
    if v in ("off", 0, "0"):
        return 0
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = -1
    if n < 1 or isinstance(v, bool):
        raise ValueError(f"seg_steps: expected None, 'auto', 0/'off' or an int >= 1 (or {env} likewise), got {v!r}")
    return n


def _list_stats(meta: TrainingMeta, which: str) -> Tuple[float, int, int, int]:
    """``(mean, longest, total, non-empty)`` entry counts of the meta's reverse lists (``which="dx"``) or
    tap lists (``"dw"``), computed once per meta on the host: the default rules run on every call,
    also inside CUDA-graph capture, where reading a device tensor back would break the capture."""
    aux = _aux(meta)
    key = ("nm_list_stats", which)
    got = aux.get(key)
    if got is None:
        rowptr = (reverse_lists(meta)[0] if which == "dx" else tap_lists(meta)[0]).to("cpu", torch.int64)
        lens = rowptr[1:] - rowptr[:-1]
        busy = lens[lens > 0]
        got = aux[key] = ((float(busy.float().mean()), int(busy.max()), int(busy.sum()), int(busy.numel()))
                          if busy.numel() else (0.0, 0, 0, 0))
    return got


#: The shortest longest-list (entries) for which uneven reverse lists call for dx segments.
_DX_UNEVEN_MIN_ENTRIES = 3


def default_dx_seg_steps(meta: TrainingMeta, batch: int, device: str) -> int:
    """Segment length (steps) of the fused dx by default; 0: whole reverse lists.

    The H200 sweep (run 25, ``data/fused_sweep_h200_run25.jsonl``) found segments faster where the
    reverse lists are uneven (longest >= 1.5x the mean: the stride-2 layers res18 layer2_0/3_0, 1-4
    readers per input node) or long while the whole-list grid is small (mean >= 12 steps and under 256
    CTAs of 64x64 tiles, 1024 of 16x16: res18 layer2/3, alexnet L2): 1.1-1.9x there. Elsewhere whole
    lists tied or won (alexnet L1/L3/L4, res18 layer1, every layer at B = 512, where the grid is big
    and the partials are pure cost). A segment takes about a quarter of the mean list, in whole entries
    (a multiple of the Cout chunks) and at least 4 steps: the best or within 7% in the sweep. 0 on the
    CPU, for B > 128 and for the stems.

    "Uneven" also needs a longest list of at least ``_DX_UNEVEN_MIN_ENTRIES`` = 3 entries: the sweep saw
    segments pay on lists of 1-4 entries, never on a longest list of 2, where they save at most one entry
    per CTA. That is res18 layer4_0 (11 reverse lists of one entry, one of two); the sweep measured whole
    lists there 13% ahead of the best segments at B = 64 (on its tables of that time, all lists of one)."""
    if not str(device).startswith("cuda") or batch > 128 or meta.cin <= 16:
        return 0
    tm, tn, tk, _ = DX_NM_CONFIG_SPECS[select_dx_nm_config(batch, meta.cin, meta.nin, segments=True)]
    n_oc = pad_to(meta.cout, tk) // tk
    mean, longest, _, _ = _list_stats(meta, "dx")
    if longest == 0:
        return 0
    mean_steps = mean * n_oc
    grid = meta.nin * -(-batch // tm) * -(-meta.cin // tn)
    small = 1024 if tm == 16 and tn == 16 else 256
    uneven = longest >= 1.5 * mean and longest >= _DX_UNEVEN_MIN_ENTRIES
    if not uneven and not (mean_steps >= 12 and grid < small):
        return 0
    return max(4, n_oc * max(1, int(round(mean_steps / (4 * n_oc)))))


def _dw_seg_target_ctas(batch: int) -> int:
    """CTAs the dW segments aim for: 512 at B <= 64, 1024 above (run 25: the fastest dW op, kernel and
    finish, or within 5% on every res18 layer)."""
    return 512 if batch <= 64 else 1024


def default_dw_seg_steps(meta: TrainingMeta, batch: int, tiles, device: str, target: Optional[int] = None) -> int:
    """Segment length (steps) of the fused dW by default; 0: the interleaved splits (:func:`_default_nsplit`).

    Interleaved splits give each tap ``S`` CTAs whatever its list's length, so the longest tap sets the
    time when there are few tap x tile CTAs (res18: 36 taps, 1-32 tiles; lists of 23-95 pairs in layer1)
    or the lists are short (res18 layer3/3_0/4_0: under 4 pairs per tap on average, 24 of layer4_0's 36
    taps empty; an interleaved CTA with no pair still stores a partial). Segments of ``L`` equal steps there ran 1.1-1.6x faster on the H200 (run 25: res18
    layer1 B=512 0.27 against 0.38 ms, layer4_0 0.074 against 0.116). With many tap x tile CTAs (alexnet
    L1-L4: 800-1300) the interleaved splits tied or won by up to 4 % with their cheaper finish, so they
    stay. ``L`` aims at ``target`` CTAs (:func:`_dw_seg_target_ctas`), bounded by the partial-sum budget
    (one ``[Op, Cp]`` fp32 partial per segment). 0 on the CPU and for the stems."""
    if not str(device).startswith("cuda") or meta.cin <= 16:
        return 0
    to, tc = tiles[:2]
    n_tiles = (pad_to(meta.cout, to) // to) * (pad_to(meta.cin, tc) // tc)
    if meta.v * n_tiles >= 512 and meta.nnz >= 4 * meta.v:
        return 0
    return dw_seg_steps_for(meta, batch, tiles, target or _dw_seg_target_ctas(batch))


def dw_seg_steps_for(meta: TrainingMeta, batch: int, tiles, target: int) -> int:
    """The dW segment length that gives about ``target`` CTAs (all tiles), within the partial budget."""
    to, tc, tkb, _ = tiles
    op, cp = pad_to(meta.cout, to), pad_to(meta.cin, tc)
    n_tiles = (op // to) * (cp // tc)
    _, _, entries, busy = _list_stats(meta, "dw")
    n_bc = -(-pad_to(batch, 8) // tkb)
    total = entries * n_bc
    if total == 0:
        return 1
    want = max(1, int(target) // n_tiles)
    cap = max(1, _budget_bytes() // (4 * op * cp) - busy)
    return max(1, -(-total // min(want, cap)))


def plan_grad_input_nm(meta, grad_y, weight, config=None, *, store=None, gn=None, seg_steps=None):
    """The prepared fused dx call, or None when the (default) kernel cannot launch here.

    ``seg_steps``: None (``FOVI_KNN_DX_SEG`` or the default rule :func:`default_dx_seg_steps`), 0 for
    whole reverse lists, or the segment length in steps (kernel ``dxs``)."""
    if config is not None and not isinstance(config, str):
        raise TypeError(f"config: expected a config name (str) or None, got {type(config).__name__}")
    _check(meta, grad_y, weight=weight)
    check_tensor("weight", weight, dtype=torch.float16, dim=2, shape=(meta.cout, meta.q), device=grad_y.device,
                 contiguous=True)
    device = warp_device(grad_y)
    meta = meta.to(grad_y.device)
    req = _seg_request("FOVI_KNN_DX_SEG", seg_steps)
    if req == "auto":
        req = default_dx_seg_steps(meta, grad_y.shape[0], device)
    name = config if config is not None else select_dx_nm_config(grad_y.shape[0], meta.cin, meta.nin,
                                                                 segments=bool(req))
    if req:
        k = _kernel("dxs", config, name, device)
        return None if k is None else _GradInputNmPlan(meta, grad_y, weight, None, device, gn=gn, seg=k,
                                                       seg_steps=req)
    k = _kernel("dxn", config, name, device)
    return None if k is None else _GradInputNmPlan(meta, grad_y, weight, k, device, store=store, gn=gn)


def plan_grad_weight_nm(meta, grad_y, x, config=None, *, nsplit=None, gn=None, xn=None, seg_steps=None):
    """The prepared fused dW call, or None when the (default) kernel cannot launch here.

    ``nsplit`` (an int) asks for the interleaved splits (kernel ``dwn``); otherwise ``seg_steps``: None
    (``FOVI_KNN_DW_SEG`` or :func:`default_dw_seg_steps`), 0 for the interleaved splits, or the segment
    length in steps (kernel ``dws``)."""
    if config is not None and not isinstance(config, str):
        raise TypeError(f"config: expected a config name (str) or None, got {type(config).__name__}")
    _check(meta, grad_y, x=x)
    check_tensor("x", x, dtype=torch.float16, dim=3, shape=(grad_y.shape[0], meta.cin, meta.nin),
                 device=grad_y.device)
    if nsplit is not None and (not isinstance(nsplit, int) or nsplit < 1):
        raise ValueError(f"nsplit: expected a positive int or None, got {nsplit!r}")
    device = warp_device(grad_y)
    meta = meta.to(grad_y.device)
    name = config if config is not None else select_dw_nm_config(meta.cout, meta.cin, grad_y.shape[0])
    req = 0 if nsplit is not None else _seg_request("FOVI_KNN_DW_SEG", seg_steps)
    if req == "auto":
        req = default_dw_seg_steps(meta, grad_y.shape[0], _spec("dwn", name), device)
    if req:
        k = _kernel("dws", config, name, device)
        return None if k is None else _GradWeightNmPlan(meta, grad_y, x, None, device, gn=gn, xn=xn, seg=k,
                                                        seg_steps=req)
    k = _kernel("dwn", config, name, device)
    return None if k is None else _GradWeightNmPlan(meta, grad_y, x, k, device, nsplit=nsplit, gn=gn, xn=xn)


def grad_input_nm(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor, config: Optional[str] = None, *,
                  store: Optional[str] = None, seg_steps=None) -> Optional[torch.Tensor]:
    """``dx [B, Cin, Nin]`` fp32 by the fused node-major kernel (one launch, no stage); None when the
    default kernel cannot launch on this device (an explicit ``config`` that cannot raises)."""
    plan = plan_grad_input_nm(meta, grad_y, weight, config, store=store, seg_steps=seg_steps)
    return None if plan is None else plan.run()


def grad_weight_nm(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor, config: Optional[str] = None, *,
                   nsplit: Optional[int] = None, seg_steps=None) -> Optional[torch.Tensor]:
    """``dW [Cout, Q]`` fp32 by the fused per-tap kernel (one launch + a fixed-order sum of ``nsplit``
    partials); None when the default kernel cannot launch on this device."""
    plan = plan_grad_weight_nm(meta, grad_y, x, config, nsplit=nsplit, seg_steps=seg_steps)
    return None if plan is None else plan.run()
