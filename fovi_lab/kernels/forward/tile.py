"""Tile-GEMM forward kernel factories (Warp ``tile_matmul``): gather, node-major, i2c, cached, dense.

Each factory returns a Warp kernel for one tile shape (closure constants are compile-time; every kernel
gets its own module, ``module="unique"``). Grid ``(Nout, ceil(B / (tile_m*r)), ceil(Cout / tile_n))``:
one CTA per (output node, batch-tile group, output-channel tile). Operand layouts are in
:mod:`fovi_lab.kernels.forward.plans`; what each family computes is in :mod:`fovi_lab.kernels.forward.configs`.
"""

from __future__ import annotations

from typing import Optional

from fovi_lab.kernels import common as _wc
from fovi_lab.kernels.built import built
from fovi_lab.kernels.common import init_warp, wp
from fovi_lab.kernels.families.table import GATHER_TILE_K as _GATHER_TILE_K


def _module_options(block_dim: int, mathdx: Optional[bool]) -> dict:
    opts = {"enable_backward": False, "fast_math": True, "block_dim": int(block_dim)}
    if mathdx is not None:
        opts["enable_mathdx_gemm"] = bool(mathdx)
    return opts


def _kernel_decorator(name: str, block_dim: int, mathdx: Optional[bool]):
    if _wc.SHARED_KERNEL_MODULE is not None:           # the AOT tests' shared module (kernels.common)
        return wp.kernel(enable_backward=False, module=_wc.SHARED_KERNEL_MODULE, name=name)
    return wp.kernel(enable_backward=False, module="unique", name=name,
                     module_options=_module_options(block_dim, mathdx))


def make_gather_kernel(tile_m: int, tile_n: int, r: int, block_dim: int, mathdx: Optional[bool] = None,
                        name: Optional[str] = None):
    """Gather-family kernel: ``r`` batch tiles of ``tile_m`` rows share each gathered W tile.

    Args (kernel): ``xt [Cin*Nin, B]`` f16, ``wt [Q, Cout]`` f16, ``il``/``wl [Nout, P64]`` int32,
    ``bias [>= Cout]`` f32, ``y [Nout, B, Cout]`` f16 (any strides), ``n_ptiles = P64/64``, ``batch``.
    """
    init_warp()
    TM, TN, TK, R = int(tile_m), int(tile_n), _GATHER_TILE_K, int(r)
    assert R in (1, 2, 4)
    kname = name or f"fovi_fwd_gather_m{TM}n{TN}r{R}b{block_dim}"

    @_kernel_decorator(kname, block_dim, mathdx)
    def kernel(xt: wp.array2d(dtype=wp.float16), wt: wp.array2d(dtype=wp.float16),
               il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32),
               bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=wp.float16),
               n_ptiles: int, batch: int):
        n, bt, ot = wp.tid()
        b0 = bt * (TM * R)
        o0 = ot * TN
        acc0 = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
        if wp.static(R >= 2):
            acc1 = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
        if wp.static(R >= 4):
            acc2 = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
            acc3 = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
        il_n = il[n]
        wl_n = wl[n]
        for pt in range(n_ptiles):
            ii = wp.tile_load(il_n, shape=TK, offset=pt * TK, storage="shared")
            wi = wp.tile_load(wl_n, shape=TK, offset=pt * TK, storage="shared")
            w = wp.tile_load_indexed(wt, indices=wi, shape=(TK, TN), offset=(0, o0), axis=0, storage="shared")
            a0 = wp.tile_load_indexed(xt, indices=ii, shape=(TK, TM), offset=(0, b0), axis=0, storage="shared")
            wp.tile_matmul(wp.tile_transpose(a0), w, acc0)
            if wp.static(R >= 2):
                if b0 + TM < batch:
                    a1 = wp.tile_load_indexed(xt, indices=ii, shape=(TK, TM), offset=(0, b0 + TM), axis=0,
                                              storage="shared")
                    wp.tile_matmul(wp.tile_transpose(a1), w, acc1)
            if wp.static(R >= 4):
                if b0 + 2 * TM < batch:
                    a2 = wp.tile_load_indexed(xt, indices=ii, shape=(TK, TM), offset=(0, b0 + 2 * TM), axis=0,
                                              storage="shared")
                    wp.tile_matmul(wp.tile_transpose(a2), w, acc2)
                if b0 + 3 * TM < batch:
                    a3 = wp.tile_load_indexed(xt, indices=ii, shape=(TK, TM), offset=(0, b0 + 3 * TM), axis=0,
                                              storage="shared")
                    wp.tile_matmul(wp.tile_transpose(a3), w, acc3)
        bb = wp.tile_broadcast(wp.tile_load(bias, shape=TN, offset=o0), shape=(TM, TN))
        y_n = y[n]
        wp.tile_store(y_n, wp.tile_astype(acc0 + bb, wp.float16), offset=(b0, o0))
        if wp.static(R >= 2):
            wp.tile_store(y_n, wp.tile_astype(acc1 + bb, wp.float16), offset=(b0 + TM, o0))
        if wp.static(R >= 4):
            wp.tile_store(y_n, wp.tile_astype(acc2 + bb, wp.float16), offset=(b0 + 2 * TM, o0))
            wp.tile_store(y_n, wp.tile_astype(acc3 + bb, wp.float16), offset=(b0 + 3 * TM, o0))

    kernel.fovi_tiles = ("gather", TM, TN, TK, R, int(block_dim))
    return kernel


def make_uncached_kernel(tile_m: int, tile_n: int, block_dim: int = 128, mathdx: Optional[bool] = None):
    """Single-accumulator uncached (gather-family) kernel."""
    return make_gather_kernel(tile_m, tile_n, 1, block_dim, mathdx)


def make_uncached_r2_kernel(tile_m: int, tile_n: int, block_dim: int = 256, mathdx: Optional[bool] = None):
    """Uncached kernel with a 2-way batch-tile weight-reuse loop: each gathered W tile feeds two
    consecutive batch tiles (half the weight-gather traffic of one accumulator at equal tile_m)."""
    return make_gather_kernel(tile_m, tile_n, 2, block_dim, mathdx)


def make_uncached_r4_kernel(tile_m: int, tile_n: int, block_dim: int = 128, mathdx: Optional[bool] = None):
    """Uncached kernel with a 4-way batch-tile weight-reuse loop."""
    return make_gather_kernel(tile_m, tile_n, 4, block_dim, mathdx)


def _reuse_chunks(tile_m: int, tile_n: int, tile_k: int, r: int):
    """The contraction loop of the node-major and dense kernels as an inlined Warp function, built once per tile
    shape::

        chunks(x, w, xrow, wrow, n_chunks, b0, o0, batch, acc)

    For each of ``n_chunks`` steps ``c`` it loads the ``[tile_k, tile_n]`` tile of ``w`` at ``(wrow + c*tile_k,
    o0)`` once and, for each of the ``r`` batch tiles ``j`` at ``b0 + j*tile_m`` (past the first, only those that
    start below ``batch``), the ``[tile_k, tile_m]`` tile of ``x`` at ``(xrow + c*tile_k, b0 + j*tile_m)``, and
    accumulates ``A_j^T W`` into ``acc[j]`` (``acc``: the kernel's fp32 ``[r, tile_m, tile_n]`` tile in shared
    memory). Each A tile is its own tile expression (a variable reassigned across the unrolled ``j`` would make
    Warp select between the copies into a further tile): the function reserves ``r`` A tiles and one W tile.
    """
    TM, TN, TK, R = int(tile_m), int(tile_n), int(tile_k), int(r)

    def make():
        @wp.func(name=f"fovi_fwd_chunks_m{TM}n{TN}k{TK}r{R}", inline=True)
        def chunks(x: wp.array2d(dtype=wp.float16), w: wp.array2d(dtype=wp.float16), xrow: int, wrow: int,
                   n_chunks: int, b0: int, o0: int, batch: int, acc: wp.tile(dtype=wp.float32, shape=(R, TM, TN))):
            for c in range(n_chunks):
                row = xrow + c * TK
                wc = wp.tile_load(w, shape=(TK, TN), offset=(wrow + c * TK, o0), storage="shared")
                a = wp.tile_load(x, shape=(TK, TM), offset=(row, b0), storage="shared")
                wp.tile_matmul(wp.tile_transpose(a), wc, acc[0])
                for j in range(1, R):       # constant trip count: unrolled, one A tile expression per j
                    if b0 + j * TM < batch:
                        wp.tile_matmul(wp.tile_transpose(wp.tile_load(x, shape=(TK, TM), offset=(row, b0 + j * TM),
                                                                      storage="shared")), wc, acc[j])
        return chunks
    return built(("tile", "chunks", TM, TN, TK, R), make)


def make_nm_kernel(tile_m: int, tile_n: int, tile_k: int, r: int, block_dim: int,
                    mathdx: Optional[bool] = None, name: Optional[str] = None):
    """Node-major kernel: plain vectorised tile loads at a per-(node, neighbour) row offset.

    Args (kernel): ``xn [Nin*Cp, Bx]`` f16, ``wv [V*Cp, Cout_p]`` f16, ``idxn``/``rfn [Nout, K]`` int32
    (neighbour node, ``nin`` = pad; tap), ``bias`` f32, ``y [Nout, B, Cout]`` f16, ``nk = K``,
    ``n_cchunks = Cp/tile_k``, ``cp``, ``nin``, ``batch``.
    """
    init_warp()
    TM, TN, TK, R = int(tile_m), int(tile_n), int(tile_k), int(r)
    assert R in (1, 2, 4)
    kname = name or f"fovi_fwd_nm_m{TM}n{TN}k{TK}r{R}b{block_dim}"
    chunks = _reuse_chunks(TM, TN, TK, R)

    @_kernel_decorator(kname, block_dim, mathdx)
    def kernel(xn: wp.array2d(dtype=wp.float16), wv: wp.array2d(dtype=wp.float16),
               idxn: wp.array2d(dtype=wp.int32), rfn: wp.array2d(dtype=wp.int32),
               bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=wp.float16),
               nk: int, n_cchunks: int, cp: int, nin: int, batch: int):
        n, bt, ot = wp.tid()
        b0 = bt * (TM * R)
        o0 = ot * TN
        acc = wp.tile_zeros(shape=(R, TM, TN), dtype=wp.float32, storage="shared")
        for k in range(nk):
            m = idxn[n, k]
            if m < nin:  # pad neighbours gather exact zeros: skip them (uniform per CTA)
                chunks(xn, wv, m * cp, rfn[n, k] * cp, n_cchunks, b0, o0, batch, acc)
        bb = wp.tile_broadcast(wp.tile_load(bias, shape=TN, offset=o0), shape=(TM, TN))
        for j in range(R):
            wp.tile_store(y[n], wp.tile_astype(acc[j] + bb, wp.float16), offset=(b0 + j * TM, o0))

    kernel.fovi_tiles = ("nm", TM, TN, TK, R, int(block_dim))
    return kernel


def make_nms_kernel(tile_m: int, tile_n: int, tile_k: int, block_dim: int, mathdx: Optional[bool] = None,
                     name: Optional[str] = None):
    """Node-major kernel with the neighbour loop split ``nsplit`` ways across CTAs ("nms").

    A layer with few output nodes (resnet layer3/4: Nout = 16 / 2) gives the nm grid only 16-128
    CTAs of 36-72 sequential tile GEMMs each: latency-bound on 132 SMs. Here CTA ``(s*Nout + n, bt,
    ot)`` sums neighbours ``k = s, s + nsplit, ...`` into an fp32 partial ``part[s*Nout + n]``
    ``[B, Cout]``; the plan then sums the ``nsplit`` partials in a fixed order, adds the bias in fp32
    and rounds once to fp16 (the same arithmetic contract as the other kernels).

    Args (kernel): ``xn``, ``wv``, ``idxn``, ``rfn`` as :func:`make_nm_kernel`, ``part [S*Nout, B,
    Cout]`` f32, ``nk = K``, ``n_cchunks``, ``cp``, ``nin``, ``nsplit = S``, ``nout``.
    """
    init_warp()
    TM, TN, TK = int(tile_m), int(tile_n), int(tile_k)
    kname = name or f"fovi_fwd_nms_m{TM}n{TN}k{TK}b{block_dim}"
    chunks = _reuse_chunks(TM, TN, TK, 1)

    @_kernel_decorator(kname, block_dim, mathdx)
    def kernel(xn: wp.array2d(dtype=wp.float16), wv: wp.array2d(dtype=wp.float16),
               idxn: wp.array2d(dtype=wp.int32), rfn: wp.array2d(dtype=wp.int32),
               part: wp.array3d(dtype=wp.float32), nk: int, n_cchunks: int, cp: int, nin: int,
               nsplit: int, nout: int):
        ns, bt, ot = wp.tid()
        n = ns % nout
        s = ns // nout
        b0 = bt * TM
        o0 = ot * TN
        acc = wp.tile_zeros(shape=(1, TM, TN), dtype=wp.float32, storage="shared")
        for k in range(s, nk, nsplit):
            m = idxn[n, k]
            if m < nin:  # pad neighbours gather exact zeros: skip them (uniform per CTA)
                chunks(xn, wv, m * cp, rfn[n, k] * cp, n_cchunks, b0, o0, part.shape[1], acc)
        wp.tile_store(part[ns], acc[0], offset=(b0, o0))

    kernel.fovi_tiles = ("nms", TM, TN, TK, 1, int(block_dim))
    return kernel


def make_i2c_kernel(tile_m: int, tile_n: int, tile_k: int, block_dim: int, w_gathered: bool = False,
                     mathdx: Optional[bool] = None, name: Optional[str] = None):
    """im2col-stage kernel ("i2c" / "i2cg"): the gathers leave the GEMM loop.

    For a stem (Cin = 3) every neighbour contributes only 3 of the contraction's rows, so the node-major
    trick (contiguous channel runs) does not apply and the gather family's scalar, bounds-checked
    ``tile_load_indexed`` of both operands costs more than the tile GEMM itself (the gather kernels' fraction of
    the dense ceiling is the ``frac_dense`` field of fovi_lab/records/h200/forward_sweep.jsonl.gz). Here the plan
    first gathers a chunk of nodes' ``A_n^T`` into a staging buffer with one row copy per (node, p)
    (``at[nl*P64 + p, :] = xpad[:, il[n0+nl, p]]``, 8-byte elements), and, for ``i2c``, every node's weight rows
    once per call (``weff[n*P64 + p, :] = W^T[wl[n, p], :]``); the kernel then runs the dense tile loop with plain,
    vectorised tile loads.

    Args (kernel): ``at [Nc*P64, Bx]`` f16, ``w`` = ``weff [Nout*P64, Cout_p]`` (``i2c``) or
    ``W^T [Q, Cout]`` (``i2cg``, gathered by ``wl``) f16, ``wl [Nout, P64]`` int32, ``bias`` f32,
    ``y [Nout, B, Cout]`` f16, ``n_ktiles = P64/tile_k``, ``p64``, ``n0`` (first node of the chunk).
    """
    init_warp()
    TM, TN, TK, WG = int(tile_m), int(tile_n), int(tile_k), bool(w_gathered)
    kname = name or f"fovi_fwd_i2c{'g' if WG else ''}_m{TM}n{TN}k{TK}b{block_dim}"

    @_kernel_decorator(kname, block_dim, mathdx)
    def kernel(at: wp.array2d(dtype=wp.float16), w: wp.array2d(dtype=wp.float16),
               wl: wp.array2d(dtype=wp.int32), bias: wp.array1d(dtype=wp.float32),
               y: wp.array3d(dtype=wp.float16), n_ktiles: int, p64: int, n0: int):
        nl, bt, ot = wp.tid()
        n = n0 + nl
        b0 = bt * TM
        o0 = ot * TN
        acc = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
        arow = nl * p64
        for kt in range(n_ktiles):
            if wp.static(WG):
                wi = wp.tile_load(wl[n], shape=TK, offset=kt * TK, storage="shared")
                wk = wp.tile_load_indexed(w, indices=wi, shape=(TK, TN), offset=(0, o0), axis=0, storage="shared")
            else:
                wk = wp.tile_load(w, shape=(TK, TN), offset=(n * p64 + kt * TK, o0), storage="shared")
            a = wp.tile_load(at, shape=(TK, TM), offset=(arow + kt * TK, b0), storage="shared")
            wp.tile_matmul(wp.tile_transpose(a), wk, acc)
        bb = wp.tile_broadcast(wp.tile_load(bias, shape=TN, offset=o0), shape=(TM, TN))
        wp.tile_store(y[n], wp.tile_astype(acc + bb, wp.float16), offset=(b0, o0))

    kernel.fovi_tiles = ("i2cg" if WG else "i2c", TM, TN, TK, 1, int(block_dim))
    return kernel


def make_cached_kernel(tile_m: int, tile_n: int, block_dim: int = 128, mathdx: Optional[bool] = None,
                        name: Optional[str] = None):
    """Cached kernel: A gathered from ``xt`` as in the gather family, W plain-loaded from ``Weff[n]``.

    Args (kernel): ``xt [Cin*Nin, B]``, ``weff [Nout, P64, Cout_pad]`` f16, ``il [Nout, P64]`` int32,
    ``bias`` f32, ``y [Nout, B, Cout]`` f16, ``n_ptiles``, ``batch``.
    """
    init_warp()
    TM, TN, TK = int(tile_m), int(tile_n), _GATHER_TILE_K
    kname = name or f"fovi_fwd_cached_m{TM}n{TN}b{block_dim}"

    @_kernel_decorator(kname, block_dim, mathdx)
    def kernel(xt: wp.array2d(dtype=wp.float16), weff: wp.array3d(dtype=wp.float16),
               il: wp.array2d(dtype=wp.int32), bias: wp.array1d(dtype=wp.float32),
               y: wp.array3d(dtype=wp.float16), n_ptiles: int, batch: int):
        n, bt, ot = wp.tid()
        b0 = bt * TM
        o0 = ot * TN
        acc = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
        il_n = il[n]
        weff_n = weff[n]
        for pt in range(n_ptiles):
            ii = wp.tile_load(il_n, shape=TK, offset=pt * TK, storage="shared")
            w = wp.tile_load(weff_n, shape=(TK, TN), offset=(pt * TK, o0), storage="shared")
            a = wp.tile_load_indexed(xt, indices=ii, shape=(TK, TM), offset=(0, b0), axis=0, storage="shared")
            wp.tile_matmul(wp.tile_transpose(a), w, acc)
        bb = wp.tile_broadcast(wp.tile_load(bias, shape=TN, offset=o0), shape=(TM, TN))
        wp.tile_store(y[n], wp.tile_astype(acc + bb, wp.float16), offset=(b0, o0))

    kernel.fovi_tiles = ("cached", TM, TN, TK, 1, int(block_dim))
    return kernel


def make_dense_kernel(tile_m: int, tile_n: int, tile_k: int, r: int, block_dim: int,
                       mathdx: Optional[bool] = None, name: Optional[str] = None):
    """Dense tile-GEMM ceiling: the same CTA loop with plain tile loads of dense operands.

    Every CTA computes ``y[n, b-tile, o-tile] = at[:, b-tile]^T @ w[:, o-tile] + bias`` over
    ``n_ktiles`` K tiles: ``at [Kd, Bx]``, ``w [Kd, Cout_p]`` shared by all nodes (L2-resident, as
    x and W are for the compact kernels), so it is the compact GEMM minus every gather.
    """
    init_warp()
    TM, TN, TK, R = int(tile_m), int(tile_n), int(tile_k), int(r)
    kname = name or f"fovi_fwd_dense_m{TM}n{TN}k{TK}r{R}b{block_dim}"
    chunks = _reuse_chunks(TM, TN, TK, R)

    @_kernel_decorator(kname, block_dim, mathdx)
    def kernel(at: wp.array2d(dtype=wp.float16), w: wp.array2d(dtype=wp.float16),
               bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=wp.float16),
               n_ktiles: int, batch: int):
        n, bt, ot = wp.tid()
        b0 = bt * (TM * R)
        o0 = ot * TN
        acc = wp.tile_zeros(shape=(R, TM, TN), dtype=wp.float32, storage="shared")
        chunks(at, w, 0, 0, n_ktiles, b0, o0, batch, acc)
        bb = wp.tile_broadcast(wp.tile_load(bias, shape=TN, offset=o0), shape=(TM, TN))
        for j in range(R):
            wp.tile_store(y[n], wp.tile_astype(acc[j] + bb, wp.float16), offset=(b0 + j * TM, o0))

    kernel.fovi_tiles = ("dense", TM, TN, TK, R, int(block_dim))
    return kernel


#: The register-prefetch kernels by how a step finds its rows (node-major neighbour lists, the index tables, dense
#: operands): the kernels' names.
_PIPELINED = {"lists": "nmp", "indexed": "gp", "dense": "densep"}


def _pipelined_body(tile_m: int, tile_n: int, tile_k: int, rows: str):
    """The CTA of the register-prefetch kernels (``rows`` "lists": nmp, "indexed": gp, "dense": densep) as an
    inlined Warp function, built once per tile shape and kind of rows::

        body(x, w, rows_x, rows_w, cp, n_chunks, nsteps, bias, y_n, b0, o0)

    computes ``y_n[b0:b0+tile_m, o0:o0+tile_n] = fp16(bias[o0:] + sum_{s < nsteps} A_s^T W_s)`` (fp32 sum, one
    rounding), step ``s`` reading the ``[tile_k, tile_m]`` tile ``A_s`` of ``x`` (columns from ``b0``) and the
    ``[tile_k, tile_n]`` tile ``W_s`` of ``w`` (columns from ``o0``):

    * "lists" (nmp): ``s = k*n_chunks + c``; rows from ``rows_x[k]*cp + c*tile_k`` of ``x`` and
      ``rows_w[k]*cp + c*tile_k`` of ``w``, plain unchecked loads (``bounds_check=False``);
    * "indexed" (gp): the rows of ``x`` and ``w`` that entries ``s*tile_k ..`` of ``rows_x`` and ``rows_w`` index,
      bounds-checked indexed loads (``cp``, ``n_chunks`` unused);
    * "dense" (densep): rows from ``s*tile_k`` of both, plain unchecked loads (``rows_x``, ``rows_w``, ``cp``,
      ``n_chunks`` unused).

    The next step's tiles are loaded into registers before the current step's ``tile_matmul`` and copied into the
    shared operand tiles after it (the last step re-loads itself: an unconditional load keeps the registers'
    consumer after the matmul instead of a select before it). The indexed loads are written out at both places (a
    function called at both would have its tiles reserved once): the CTA reserves two index tiles for each.
    """
    if rows not in _PIPELINED:
        raise ValueError(f"rows: expected one of {', '.join(map(repr, _PIPELINED))}, got {rows!r}")
    TM, TN, TK, GP, LISTS = int(tile_m), int(tile_n), int(tile_k), rows == "indexed", rows == "lists"

    def make():
        tag = f"fovi_fwd_{_PIPELINED[rows]}_body_m{TM}n{TN}k{TK}"

        def fetch(x: wp.array2d(dtype=wp.float16), w: wp.array2d(dtype=wp.float16), rows_x: None, rows_w: None,
                  cp: int, n_chunks: int, s: int, b0: int, o0: int):
            if wp.static(LISTS):
                k = s // n_chunks
                c = (s - k * n_chunks) * TK
                xrow = rows_x[k] * cp + c
                wrow = rows_w[k] * cp + c
            else:
                xrow = s * TK
                wrow = xrow
            return (wp.tile_load(x, shape=(TK, TM), offset=(xrow, b0), bounds_check=False),
                    wp.tile_load(w, shape=(TK, TN), offset=(wrow, o0), bounds_check=False))

        def body(x: wp.array2d(dtype=wp.float16), w: wp.array2d(dtype=wp.float16), rows_x: None, rows_w: None,
                 cp: int, n_chunks: int, nsteps: int, bias: wp.array1d(dtype=wp.float32),
                 y_n: wp.array2d(dtype=wp.float16), b0: int, o0: int):
            acc = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
            a_sh = wp.tile_zeros(shape=(TK, TM), dtype=wp.float16, storage="shared")
            w_sh = wp.tile_zeros(shape=(TK, TN), dtype=wp.float16, storage="shared")
            if nsteps > 0:
                if wp.static(GP):
                    ii0 = wp.tile_load(rows_x, shape=TK, offset=0, storage="shared")
                    wi0 = wp.tile_load(rows_w, shape=TK, offset=0, storage="shared")
                    a_r = wp.tile_load_indexed(x, indices=ii0, shape=(TK, TM), offset=(0, b0), axis=0)
                    w_r = wp.tile_load_indexed(w, indices=wi0, shape=(TK, TN), offset=(0, o0), axis=0)
                else:
                    a_r, w_r = fetch(x, w, rows_x, rows_w, cp, n_chunks, 0, b0, o0)
                for s in range(nsteps):
                    wp.tile_assign(a_sh, a_r)
                    wp.tile_assign(w_sh, w_r)
                    s1 = wp.min(s + 1, nsteps - 1)
                    if wp.static(GP):
                        ii1 = wp.tile_load(rows_x, shape=TK, offset=s1 * TK, storage="shared")
                        wi1 = wp.tile_load(rows_w, shape=TK, offset=s1 * TK, storage="shared")
                        a_r = wp.tile_load_indexed(x, indices=ii1, shape=(TK, TM), offset=(0, b0), axis=0)
                        w_r = wp.tile_load_indexed(w, indices=wi1, shape=(TK, TN), offset=(0, o0), axis=0)
                    else:
                        a_r, w_r = fetch(x, w, rows_x, rows_w, cp, n_chunks, s1, b0, o0)
                    wp.tile_matmul(wp.tile_transpose(a_sh), w_sh, acc)
            bb = wp.tile_broadcast(wp.tile_load(bias, shape=TN, offset=o0), shape=(TM, TN))
            wp.tile_store(y_n, wp.tile_astype(acc + bb, wp.float16), offset=(b0, o0))

        row_type = int if rows == "dense" else wp.array1d(dtype=wp.int32)   # objects: Warp evaluates strings only
        for fn in (fetch, body):
            fn.__annotations__.update(rows_x=row_type, rows_w=row_type)
        fetch = wp.func(name=f"{tag}_fetch", inline=True)(fetch)
        return wp.func(name=tag, inline=True)(body)
    return built(("tile", "pipelined", rows, TM, TN, TK), make)


def _pipelined_kernel(rows: str, tile_m: int, tile_n: int, tile_k: int, block_dim: int, mathdx: Optional[bool],
                      name: Optional[str]):
    """The ``nmp``, ``gp`` or ``densep`` kernel (``rows`` as :func:`_pipelined_body`) of one tile shape: grid
    ``(node n, batch tile, Cout tile)``, each CTA :func:`_pipelined_body` over node ``n``'s operands (the arguments
    of :func:`make_nmp_kernel`, :func:`make_gp_kernel`, :func:`make_densep_kernel`)."""
    init_warp()
    TM, TN, TK = int(tile_m), int(tile_n), int(tile_k)
    body = _pipelined_body(TM, TN, TK, rows)                          # (a ValueError names a bad ``rows``)
    kind = _PIPELINED[rows]
    kname = name or f"fovi_fwd_{kind}_m{TM}n{TN}{'' if rows == 'indexed' else f'k{TK}'}b{block_dim}"
    decorate = _kernel_decorator(kname, block_dim, mathdx)

    if rows == "lists":
        @decorate
        def kernel(xn: wp.array2d(dtype=wp.float16), wv: wp.array2d(dtype=wp.float16),
                   idxc: wp.array2d(dtype=wp.int32), rfc: wp.array2d(dtype=wp.int32), cnt: wp.array1d(dtype=wp.int32),
                   bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=wp.float16),
                   n_cchunks: int, cp: int):
            n, bt, ot = wp.tid()
            body(xn, wv, idxc[n], rfc[n], cp, n_cchunks, cnt[n] * n_cchunks, bias, y[n], bt * TM, ot * TN)
    elif rows == "indexed":
        @decorate
        def kernel(xt: wp.array2d(dtype=wp.float16), wt: wp.array2d(dtype=wp.float16),
                   il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32),
                   bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=wp.float16),
                   n_ptiles: int, batch: int):
            n, bt, ot = wp.tid()
            body(xt, wt, il[n], wl[n], 0, 0, n_ptiles, bias, y[n], bt * TM, ot * TN)
    else:
        @decorate
        def kernel(at: wp.array2d(dtype=wp.float16), w: wp.array2d(dtype=wp.float16),
                   bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=wp.float16),
                   n_ktiles: int, batch: int):
            n, bt, ot = wp.tid()
            body(at, w, 0, 0, 0, n_ktiles, n_ktiles, bias, y[n], bt * TM, ot * TN)

    kernel.fovi_tiles = (kind, TM, TN, TK, 1, int(block_dim))
    return kernel


def make_nmp_kernel(tile_m: int, tile_n: int, tile_k: int, block_dim: int, mathdx: Optional[bool] = None,
                     name: Optional[str] = None):
    """Node-major kernel with a register prefetch (software pipelining) of the next step's tiles.

    Warp's tile GEMM does not overlap loads with math inside a CTA: load, sync, matmul, sync. Here the
    next (neighbour, channel-chunk) step's A and W tiles are loaded into *registers* before the current
    step's ``tile_matmul`` and copied into the shared operand tiles after it, so their global-load
    latency hides behind the math. Loads are unchecked (``bounds_check=False``): the plan pads the
    batch to a multiple of ``tile_m`` and the output channels to a multiple of ``tile_n``. Neighbour
    lists are compacted per node (``idxc[n, :cnt[n]]`` real neighbours, pads dropped).

    Args (kernel): ``xn [Nin*Cp, Bx]``, ``wv [V*Cp, Cout_p]``, ``idxc``/``rfc [Nout, K]`` int32,
    ``cnt [Nout]`` int32, ``bias``, ``y``, ``n_cchunks``, ``cp``.
    """
    return _pipelined_kernel("lists", tile_m, tile_n, tile_k, block_dim, mathdx, name)


def make_gp_kernel(tile_m: int, tile_n: int, block_dim: int, mathdx: Optional[bool] = None,
                    name: Optional[str] = None):
    """Gather-family kernel with the register prefetch of :func:`make_nmp_kernel`: the next p tile's
    indexed gathers are issued into registers before the current ``tile_matmul``. Same arguments as
    the gather kernel (bounds-checked gathers, so no padding is needed)."""
    return _pipelined_kernel("indexed", tile_m, tile_n, _GATHER_TILE_K, block_dim, mathdx, name)


def make_densep_kernel(tile_m: int, tile_n: int, tile_k: int, block_dim: int, mathdx: Optional[bool] = None,
                        name: Optional[str] = None):
    """Dense ceiling of the pipelined (register-prefetch) kernels: :func:`make_dense_kernel`'s loop with
    the next K tile loaded into registers before the current ``tile_matmul``. Operands must be padded
    to whole tiles (``at [Kd, Bx]`` with ``Bx`` a multiple of ``tile_m``, ``w`` columns of ``tile_n``)."""
    return _pipelined_kernel("dense", tile_m, tile_n, tile_k, block_dim, mathdx, name)
