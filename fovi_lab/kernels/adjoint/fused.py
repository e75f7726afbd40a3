"""The fused node-major adjoints: dx and dW with no stage, their configs and kernel factories.

When the tables have the form :func:`fovi_lab.graph.meta.build_meta` builds (``input_linear[n, c*K+k] =
c*Nin + idx[n, k]``, ``weight_linear[n, c*K+k] = c*V + rf[n, k]``), both reductions fold into the GEMM's K loop::

    dx[b, c, m]   = sum over (n, k) with idx[n,k] = m of  sum_o g[b, o, n] * W[o, c*V + rf[n,k]]
    dW[o, c*V+v]  = sum over (n, k) with rf[n,k] = v, idx[n,k] < Nin of  sum_b g[b, o, n] * x[b, c, idx[n,k]]

* dx (``dxn_*``): one CTA per (input node m, batch tile, Cin tile) walks m's reverse list and accumulates
  ``g_n^T @ W_v`` over Cout chunks, from node-major ``gn [Nout*Op, Bx]`` and tap-major ``wr [V*Op, Cin_p]``.
* dW (``dwn_*``): one CTA per (tap v, split s, o tile, c tile) walks v's list of (n, m) pairs (pads left out)
  and accumulates ``g_n @ x_m^T`` over batch chunks; a split's fp32 partials are summed in a fixed order.
* balanced segments (``dxs`` / ``dws``): the lists cut into segments of at most ``L`` tile GEMMs
  (:func:`segment_table`), one CTA per segment, the segment partials summed in order by a finish that
  reads and writes through a shared-memory tile (:func:`seg_finish_tiled_kernel`, tiles of 32 or 64 lists:
  :func:`seg_finish_lists`). On the H200, replayed, the train steps of ResNet-18 layers 4.0, 3.0 and 3 ran faster
  with it than with the SIMT finish in one run (data/h200/finish_ab.jsonl.gz).

No stage and no atomics: both gradients are bitwise deterministic. Every kernel has an fp16 and a bf16 form
(``bf16=True``: bf16 gn / wr / xn, the same tiles and fp32 accumulation).
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

from typing import Dict, Optional, Tuple

import torch

import fovi_lab.settings as settings
from fovi_lab.kernels.common import built_once, init_warp, wp
from fovi_lab.kernels.built import built
from fovi_lab.kernels.families.fused_adjoints import FUSED_DW, FUSED_DX
from fovi_lab.kernels.families.registry import adjoint_kernels, adjoint_point, family, lookup_adjoint, presets

#: The fused adjoint families and their kinds (dxn, dxs, dwn, dws).
FUSED_FAMILIES = (FUSED_DX, FUSED_DW)
FUSED_KINDS = tuple(k for f in FUSED_FAMILIES for k in f.kinds)


def _tiles_by_name(family_key: str) -> Dict[str, Tuple[int, int, int, int]]:
    fam = family(family_key)
    return {p.name: fam.tiles(p.point) for p in presets(family_key)}


# The fused configs are the presets of the fused families (fovi_lab.kernels.families.fused_adjoints) in
# fovi_lab/kernels/adjoint/configs.toml; these dicts are their tiles as the sweeps and notebooks read them.
#: dx: name -> (tile_m = batch rows, tile_n = Cin columns, tile_k = Cout chunk, block_dim)
DX_NM_CONFIG_SPECS: Dict[str, Tuple[int, int, int, int]] = _tiles_by_name("fused_dx")
#: dW: name -> (tile_o = Cout rows, tile_c = Cin columns, tile_kb = batch chunk, block_dim)
DW_NM_CONFIG_SPECS: Dict[str, Tuple[int, int, int, int]] = _tiles_by_name("fused_dw")


def config_tiles(kind: str, name: str) -> Tuple[int, int, int, int]:
    """The tiles of the fused kernel ``(kind, name)`` (``kind`` in dxn, dxs, dwn, dws): ``(rows, columns, step,
    block_dim)`` as the factories take them. A ValueError names a bad kind, a KeyError a name that is no config."""
    if kind not in FUSED_KINDS:
        raise ValueError(f"kind: expected one of {', '.join(map(repr, FUSED_KINDS))}, got {kind!r}")
    point = adjoint_point(kind, name)
    return point.owner.tiles(point)


def nm_config_words(name: str) -> Optional[str]:
    """A fused config's tiles in words (``dxn_m64n16k64``: "64 batch rows x 16 input channels per tile, 64 output
    channels per step"); None for another name."""
    try:
        point = lookup_adjoint(name)
    except (TypeError, ValueError):
        return None
    return point.owner.tile_words(point) if point.owner in FUSED_FAMILIES else None


def nm_grad_kernel_names():
    """Every ``(kind, name)`` of this module (``kind`` in {dxn, dxs, dwn, dws}: whole lists and balanced
    segments, same tiles): what warmup compiles."""
    return [key for fam in FUSED_FAMILIES for key in adjoint_kernels(fam.key)]


# One wave of CTAs on the H200 (132 SMs): below it a 64x64 dx tile leaves SMs idle.
WAVE_CTAS = 128


def select_dx_nm_config(batch: int, cin: int, nin: Optional[int] = None, segments: bool = False) -> str:
    """dx tiles, fit to the H200 sweeps (every layer at B = 64, 128, 512: fovi_lab/records/h200/train_step.jsonl.gz,
    the fused sweep of 2026-11-29; B = 16, 64, 512 with and without segments:
    fovi_lab/records/h200/fused_sweep.jsonl.gz). B <= 16: 16x16 tiles, faster than 16x64 on every layer
    (alexnet L1 among them). Above: 64x64 was the fastest or close to it everywhere with Cin >= 64 *unless*
    its whole-list grid ``Nin * ceil(B/64) * ceil(Cin/64)`` is under one wave (res18 layer3/4 at B = 64:
    Nin = 16), where 16x16 tiles won; with ``segments`` the grid is the segments' and 64x64 stays (on res18
    layer3 at B=64 it beat 16x16 tiles over whole lists).
    Cin < 16 (stems): 16-wide Cin tiles (the staged path is faster there anyway, see
    ``knn_warp.grad_path``)."""
    if cin <= 16:
        return "dxn_m16n16k64" if batch <= 16 else "dxn_m64n16k64"
    if batch <= 16:
        return "dxn_m16n16k64"
    if batch <= 32:
        return "dxn_m32n64k64"
    if not segments and nin is not None and nin * -(-batch // 64) * -(-cin // 64) < WAVE_CTAS:
        return "dxn_m16n16k64"
    return "dxn_m64n64k64"


def select_dw_nm_config(cout: int, cin: int, batch: Optional[int] = None) -> str:
    """dW tiles from the same sweep: 64x64 (o x c) was the fastest or within 3% on every layer with
    Cin >= 64 (Cin = 96 included: its 32-wide tile tied); 128-wide o tiles were slower everywhere. The
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
    return int(settings.get("FOVI_KNN_FUSED_PARTIAL_MIB") * (1 << 20))

def _elem(bf16: bool):
    """(Warp element type, kernel-name suffix) of the fp16 or the bf16 kernels: bf16 tiles go through the same
    tile GEMM (fp32 accumulation); only the operand type changes."""
    return (wp.bfloat16, "_bf16") if bf16 else (wp.float16, "")


def _decorator(name: str, block_dim: int, mathdx: Optional[bool]):
    opts = {"enable_backward": False, "fast_math": True, "block_dim": int(block_dim)}
    if mathdx is not None:
        opts["enable_mathdx_gemm"] = bool(mathdx)
    return wp.kernel(enable_backward=False, module="unique", name=name, module_options=opts)


def _marked(kernel, kind: str, tiles, block_dim: int, bf16: bool):
    """The kernel, tagged with its operand dtype and ``(kind, tile, tile, tile, block_dim)``."""
    kernel.fovi_dtype = 'bfloat16' if bf16 else 'float16'
    kernel.fovi_tiles = (kind, *tiles, int(block_dim))
    return kernel


def make_dx_kernel(tile_m: int, tile_n: int, tile_k: int, block_dim: int, mathdx: Optional[bool] = None,
                   bf16: bool = False, segments: bool = False):
    """The dx kernel of both walks: one CTA per (list, batch tile, Cin tile) accumulating ``g_n^T @ W_v`` over
    Cout chunks of each entry ``j`` (output node ``rn[j]``, tap ``rv[j]``) of its list, then storing
    ``out[list]``. Args ``(gn [Nout*Op, Bx], wr [V*Op, Cin_p], lists, rn [nnz], rv [nnz], out, n_ochunks =
    Op/tile_k, op)``; grid ``(lists, ceil(B/tile_m), ceil(Cin/tile_n))``.

    Whole lists (``dxn``): ``lists`` is ``rowptr [Nin+1]`` and list m walks entries ``rowptr[m]..rowptr[m+1]``,
    every Cout chunk of each; ``out = dx [Nin, B, Cin]`` f32 (any strides). Balanced segments (``dxs``,
    ``segments=True``): ``lists`` is ``bounds [nseg+1]`` and segment s walks the flattened steps
    ``bounds[s]..bounds[s+1]`` (step ``t`` = entry ``t // n_ochunks``, Cout chunk ``t % n_ochunks``);
    ``out = part [nseg, B, Cin]`` f32."""
    init_warp()
    TM, TN, TK, SEG = int(tile_m), int(tile_n), int(tile_k), bool(segments)
    DT, sfx = _elem(bf16)
    kind = "dxs" if SEG else "dxn"

    @_decorator(f"fovi_{kind}_m{TM}n{TN}k{TK}b{block_dim}{sfx}", block_dim, mathdx)
    def dx(gn: wp.array2d(dtype=DT), wr: wp.array2d(dtype=DT),
           lists: wp.array1d(dtype=wp.int32), rn: wp.array1d(dtype=wp.int32), rv: wp.array1d(dtype=wp.int32),
           out: wp.array3d(dtype=wp.float32), n_ochunks: int, op: int):
        i, bt, ct = wp.tid()
        b0 = bt * TM
        c0 = ct * TN
        acc = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
        if wp.static(SEG):
            for t in range(lists[i], lists[i + 1]):
                j = t // n_ochunks
                oc = t - j * n_ochunks
                w = wp.tile_load(wr, shape=(TK, TN), offset=(rv[j] * op + oc * TK, c0), storage="shared")
                a = wp.tile_load(gn, shape=(TK, TM), offset=(rn[j] * op + oc * TK, b0), storage="shared")
                wp.tile_matmul(wp.tile_transpose(a), w, acc)
        else:
            for j in range(lists[i], lists[i + 1]):
                grow = rn[j] * op
                wrow = rv[j] * op
                for oc in range(n_ochunks):
                    w = wp.tile_load(wr, shape=(TK, TN), offset=(wrow + oc * TK, c0), storage="shared")
                    a = wp.tile_load(gn, shape=(TK, TM), offset=(grow + oc * TK, b0), storage="shared")
                    wp.tile_matmul(wp.tile_transpose(a), w, acc)
        wp.tile_store(out[i], acc, offset=(b0, c0))

    return _marked(dx, kind, (TM, TN, TK), block_dim, bf16)


def make_dx_nm_kernel(tile_m: int, tile_n: int, tile_k: int, block_dim: int, mathdx: Optional[bool] = None,
                      bf16: bool = False):
    """dx over whole reverse lists (:func:`make_dx_kernel`). Args: ``gn [Nout*Op, Bx]`` f16 (bf16 where ``bf16``),
    ``wr [V*Op, Cin_p]`` likewise, ``rowptr [Nin+1]``, ``rn``/``rv [nnz]`` int32 (output node and tap of each
    reverse entry), ``dx [Nin, B, Cin]`` f32 (any strides), ``n_ochunks = Op/tile_k``, ``op``. Grid ``(Nin,
    ceil(B/tile_m), ceil(Cin/tile_n))``."""
    return make_dx_kernel(tile_m, tile_n, tile_k, block_dim, mathdx, bf16, segments=False)


def make_dw_kernel(tile_o: int, tile_c: int, tile_kb: int, block_dim: int, mathdx: Optional[bool] = None,
                   bf16: bool = False, segments: bool = False):
    """The dW kernel of both walks: a CTA accumulates ``g_n @ x_m^T`` over batch chunks of the entries ``j``
    (output node ``vn[j]``, input node ``vm[j]``) of one tap's list into a ``(tile_o, tile_c)`` tile
    ``t = (o tile) * n_ct + (c tile)`` of fp32 partials. ``gn [Nout*Op, Bx]``, ``xn [Nin*Cp, Bx]`` (bf16 where
    ``bf16``), ``n_bchunks = ceil(Bx/tile_kb)``, ``n_ct = Cp/tile_c``.

    Whole lists split ``S`` ways (``dwn``; args ``(gn, xn, vrowptr [V+1], vn, vm, part [S, V, Op, Cp], n_bchunks,
    op, cp, nsplit = S, n_ct)``, grid ``(V, S, (Op/tile_o) * n_ct)``): split s takes entries ``s, s + S, ...``,
    every batch chunk of each. Balanced segments (``dws``, ``segments=True``; args ``(gn, xn, bounds [nseg+1], vn,
    vm, part [nseg, Op, Cp], n_bchunks, op, cp, n_ct)``, grid ``(nseg, (Op/tile_o) * n_ct)``): segment s walks the
    flattened steps ``bounds[s]..bounds[s+1]`` (step ``t`` = entry ``t // n_bchunks``, batch chunk
    ``t % n_bchunks``)."""
    init_warp()
    TO, TC, TKB = int(tile_o), int(tile_c), int(tile_kb)
    DT, sfx = _elem(bf16)
    kind = "dws" if segments else "dwn"
    deco = _decorator(f"fovi_{kind}_o{TO}c{TC}k{TKB}b{block_dim}{sfx}", block_dim, mathdx)
    if segments:
        @deco
        def dw(gn: wp.array2d(dtype=DT), xn: wp.array2d(dtype=DT),
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
    else:
        @deco
        def dw(gn: wp.array2d(dtype=DT), xn: wp.array2d(dtype=DT),
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
    return _marked(dw, kind, (TO, TC, TKB), block_dim, bf16)


def make_dw_nm_kernel(tile_o: int, tile_c: int, tile_kb: int, block_dim: int, mathdx: Optional[bool] = None,
                      bf16: bool = False):
    """dW over whole tap lists, split ``S`` ways (:func:`make_dw_kernel`). Args: ``gn [Nout*Op, Bx]`` f16 (bf16
    where ``bf16``), ``xn [Nin*Cp, Bx]`` likewise, ``vrowptr [V+1]``, ``vn``/``vm [nnz]`` int32 (output node and
    input node of each entry of tap v's list), ``part [S, V, Op, Cp]`` f32, ``n_bchunks = ceil(Bx/tile_kb)``,
    ``op``, ``cp``, ``nsplit = S``, ``n_ct = Cp/tile_c``. Grid ``(V, S, (Op/tile_o) * n_ct)``."""
    return make_dw_kernel(tile_o, tile_c, tile_kb, block_dim, mathdx, bf16, segments=False)


# Balanced segments. A fused CTA walks one list (dx: an input node's readers; dW: a tap's pairs), so the
# longest list sets the kernel's critical path: res18 layer2_0's dx lists hold 1-4 entries (mean 2.1),
# and its fused dx ran at ~half the dense ceiling of the same tiles on the H200. The "segment"
# kernels below flatten every list into steps (one step = one tile GEMM: an (entry, Cout chunk) for dx,
# an (entry, batch chunk) for dW), cut each list into contiguous segments of at most ``L`` steps and run
# one CTA per (segment, output tile). Each segment writes an fp32 partial; the finish sums a list's
# segments in segment order (fixed: bitwise deterministic) straight into dx / dW's own layout. Lists
# without entries get no segment and a zero from the finish.

def make_dx_seg_kernel(tile_m: int, tile_n: int, tile_k: int, block_dim: int, mathdx: Optional[bool] = None,
                      bf16: bool = False):
    """dx over balanced segments (:func:`make_dx_kernel`). Args: ``gn``, ``wr``, ``rn``, ``rv`` as
    :func:`make_dx_nm_kernel`; ``bounds [nseg+1]`` int32 (segment s covers steps ``bounds[s]..bounds[s+1]`` of the
    flattened reverse lists, step ``t`` = entry ``t // n_ochunks``, Cout chunk ``t % n_ochunks``), ``part
    [nseg, B, Cin]`` f32. Grid ``(nseg, ceil(B/tile_m), ceil(Cin/tile_n))``."""
    return make_dx_kernel(tile_m, tile_n, tile_k, block_dim, mathdx, bf16, segments=True)


def make_dw_seg_kernel(tile_o: int, tile_c: int, tile_kb: int, block_dim: int, mathdx: Optional[bool] = None,
                      bf16: bool = False):
    """dW over balanced segments (:func:`make_dw_kernel`). Args: ``gn``, ``xn``, ``vn``, ``vm`` as
    :func:`make_dw_nm_kernel`; ``bounds [nseg+1]`` int32 (segment s covers steps ``bounds[s]..bounds[s+1]`` of the
    flattened tap lists, step ``t`` = entry ``t // n_bchunks``, batch chunk ``t % n_bchunks``), ``part [nseg, Op,
    Cp]`` f32, ``n_ct = Cp/tile_c``. Grid ``(nseg, (Op/tile_o) * n_ct)``."""
    return make_dw_kernel(tile_o, tile_c, tile_kb, block_dim, mathdx, bf16, segments=True)


@built_once
def seg_finish_kernel():
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


#: Threads per CTA of the tiled segment finish (8 warps, one 32 x 32 tile each).
SEG_FINISH_BLOCK = 256


def seg_finish_snippet(lists: int = 32) -> str:
    """The native snippet of :func:`seg_finish_tiled_kernel` for tiles of ``lists`` (32 or 64) lists: for one ``i``
    and a tile of ``lists`` x 32 of ``(g, j)``, warp ``w`` sums lists ``g = g0 + w, g0 + w + 8, ...`` (all of them
    together, for loads in flight) with each lane on one ``j`` (a 128-byte row of ``part`` per partial), parks the
    sums in shared memory, then writes rows ``j`` of ``out[i]`` with each lane on one ``g`` (128-byte rows of the
    output; with 64 lists a warp writes a whole row of up to 64 in two stores, so no output sector is left half
    written for another CTA). A tile row is padded to 33 words, so the column reads hit 32 distinct banks. List
    ``g``'s partials are ``segptr[g] .. segptr[g+1] - 1`` (segments), or with ``nsplit > 0`` the ``nsplit``
    partials ``g, G + g, 2G + g, ...`` (splits: ``part`` is ``[S, G, I', J']`` seen as ``[S*G, I', J']``);
    ``segptr`` is contiguous (the snippet reads its data directly; :func:`segment_table` builds it so). The C++
    branch (Warp's CPU device) has each thread store its own sums directly."""
    if lists not in (32, 64):
        raise ValueError(f"seg finish: tiles of {lists} lists, expected 32 or 64")
    return f"""
    const int T = 32, TG = {lists}, TS = 33, KL = TG / 8;
    const int G = out.shape[2], J = out.shape[1];
    const size_t ps0 = (size_t)part.strides[0], ps2 = (size_t)part.strides[2];
    const size_t os1 = (size_t)out.strides[1], os2 = (size_t)out.strides[2];
    const int* sp = (const int*)segptr.data;
    const char* pb = (const char*)part.data + (size_t)i * (size_t)part.strides[1];
    char* ob = (char*)out.data + (size_t)i * (size_t)out.strides[0];
    // tid is the thread's index in its block (blocks of SEG_FINISH_BLOCK = 256 threads, a launch extent that is a
    // multiple of 256): every thread of a block runs the same grid-stride steps and reaches both barriers
    const int lane = tid & 31, wy = (tid >> 5) & 7;
#if defined(__CUDA_ARCH__)
    __shared__ float s[TG * TS];
    // sums: lists g = g0 + wy + 8k (k < KL) with lanes along j (coalesced partial rows); the lists advance
    // together, so each lane keeps KL independent loads in flight; each list is still summed in its own order
    const int j = j0 + lane, dq = nsplit > 0 ? G : 1;
    float acc[KL];
    int q[KL], qe[KL];
    #pragma unroll
    for (int k = 0; k < KL; ++k) {{
        const int g = g0 + wy + 8 * k;
        const bool on = g < G && j < J;
        q[k] = on ? (nsplit > 0 ? g : sp[g]) : 0;
        qe[k] = on ? (nsplit > 0 ? g + nsplit * G : sp[g + 1]) : 0;
        acc[k] = 0.0f;
    }}
    for (bool more = true; more;) {{
        more = false;
        #pragma unroll
        for (int k = 0; k < KL; ++k)
            if (q[k] < qe[k]) {{
                acc[k] += *(const float*)(pb + (size_t)q[k] * ps0 + (size_t)j * ps2);
                q[k] += dq;
                more = true;
            }}
    }}
    #pragma unroll
    for (int k = 0; k < KL; ++k) s[(wy + 8 * k) * TS + lane] = acc[k];
    __syncthreads();
    for (int r = 0; r < T / 8; ++r) {{                 // stores: row j of out[i], lanes along g
        const int jl = wy + 8 * r, jr = j0 + jl;
        if (jr >= J) continue;
        #pragma unroll
        for (int h = 0; h < TG / 32; ++h) {{
            const int gl = lane + 32 * h, g = g0 + gl;
            if (g < G) *(float*)(ob + (size_t)jr * os1 + (size_t)g * os2) = s[gl * TS + jl];
        }}
    }}
    __syncthreads();                                  // the tile is reused by the block's next grid-stride step
#else
    for (int k = 0; k < KL; ++k) {{
        const int g = g0 + wy + 8 * k, j = j0 + lane;
        if (g >= G || j >= J) continue;
        float acc = 0.0f;
        const int q0 = nsplit > 0 ? g : sp[g], q1 = nsplit > 0 ? g + nsplit * G : sp[g + 1], dq = nsplit > 0 ? G : 1;
        for (int q = q0; q < q1; q += dq) acc += *(const float*)(pb + (size_t)q * ps0 + (size_t)j * ps2);
        *(float*)(ob + (size_t)j * os1 + (size_t)g * os2) = acc;
    }}
#endif
"""


def _make_seg_finish_tiled(lists: int):
    @wp.func_native(seg_finish_snippet(lists))
    def seg_finish_tile(segptr: wp.array1d(dtype=wp.int32), part: wp.array3d(dtype=wp.float32),
                        out: wp.array3d(dtype=wp.float32), nsplit: int, i: int, g0: int, j0: int, tid: int): ...

    @wp.kernel(enable_backward=False, module="unique", name=f"fovi_seg_finish_tiled{lists}")
    def kernel(segptr: wp.array1d(dtype=wp.int32), part: wp.array3d(dtype=wp.float32),
               out: wp.array3d(dtype=wp.float32), nsplit: int):
        i, gt, tl = wp.tid()
        seg_finish_tile(segptr, part, out, nsplit, i, gt * lists, (tl // SEG_FINISH_BLOCK) * 32, tl % SEG_FINISH_BLOCK)
    return kernel


#: The fewest CTAs (output rows ``I`` x 32-column tiles) for which the tiled finish takes 64-list tiles.
SEG_FINISH_64_MIN_CTAS = 1024


def seg_finish_lists(out_shape) -> int:
    """Lists per tile of the tiled finish for an output ``[I, J, G]``: 64 where one tile covers every list
    (33-64: the rf2 layers' 36 taps) and the grid keeps at least :data:`SEG_FINISH_64_MIN_CTAS` CTAs, so each
    output row is written by one warp; 32 otherwise. On the H200 (torch.profiler, one run per build,
    data/h200/profiles/finish_kernels_*.txt and finish64_kernels_*.txt) the 64-list tile beat the SIMT finish on
    ResNet-18 layer 4.0's dW at B = 16 (4096 CTAs) and on layer 3's (2048), but lost to it on layer 1's (128 CTAs,
    long lists), where the 32-list tile was the fastest of the three."""
    i, j, g = (int(v) for v in out_shape)
    return 64 if 32 < g <= 64 and i * -(-j // 32) >= SEG_FINISH_64_MIN_CTAS else 32


def seg_finish_tiled_kernel(lists: int = 32):
    """``out[i, j, g]`` = the fixed-order fp32 sum of list g's partials ``part[q, i, j]`` (segments by ``segptr``,
    or ``nsplit`` interleaved splits) through a shared-memory tile of ``lists`` (32 or 64) lists x 32 columns
    (:func:`seg_finish_snippet`): the partial rows are read and the output rows written 128 bytes at a time, where
    :func:`seg_finish_kernel` reads one partial element per 32-byte sector. The same sums in the same order as that
    kernel (segments): bitwise the same output. Grid :func:`seg_finish_tiled_dims`, block :data:`SEG_FINISH_BLOCK`."""
    if lists not in (32, 64):
        raise ValueError(f"seg finish: tiles of {lists} lists, expected 32 or 64")
    return built(("fused", "seg_finish_tiled", lists), lambda: _make_seg_finish_tiled(lists))


def seg_finish_tiled_dims(out_shape, lists: int = 32) -> Tuple[int, int, int]:
    """The launch grid of :func:`seg_finish_tiled_kernel` (tiles of ``lists`` lists) for an output ``[I, J, G]``."""
    i, j, g = out_shape
    return (int(i), -(-int(g) // int(lists)), -(-int(j) // 32) * SEG_FINISH_BLOCK)


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
