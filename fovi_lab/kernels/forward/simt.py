"""SIMT forward kernel factories (no tile GEMM): for small batches and few input channels.

Each thread keeps a ``tile_b x tile_o`` block of ``y`` in fp32 registers and reads x and W^T straight from
L2, one p entry at a time: at small batch a tensor-core tile is mostly padding, and staging the stems'
weights costs more than their math.
"""

from __future__ import annotations

from typing import Optional, Tuple

from fovi_lab.kernels import common as _wc
from fovi_lab.kernels.common import built_once, init_warp, wp
from fovi_lab.kernels.built import built


def _simt_decorator(name: str, block_dim: int, w_vec4: bool = False, vec4_args: Tuple[str, ...] = ()):
    """A SIMT kernel has no tile expression: no MathDx link, so it compiles in seconds (not ~50 s).
    ``w_vec4``: the kernel's ``wt`` parameter is declared ``array2d(vec4)`` instead of its source's fp16 (the
    vec4-W variants share their body with the fp16 ones); ``vec4_args``: the same for the parameters named."""
    vec4_args = tuple(vec4_args) + (("wt",) if w_vec4 else ())
    if _wc.SHARED_KERNEL_MODULE is not None:
        deco = wp.kernel(enable_backward=False, module=_wc.SHARED_KERNEL_MODULE, name=name)
    else:
        deco = wp.kernel(enable_backward=False, module="unique", name=name,
                         module_options={"enable_backward": False, "fast_math": True, "block_dim": int(block_dim)})
    if not vec4_args:
        return deco

    def with_vec4_args(fn):
        for arg in vec4_args:
            fn.__annotations__[arg] = wp.array2d(dtype=wp.vec4)  # an object: Warp evaluates only strings
        return deco(fn)
    return with_vec4_args


def simt_step(tile_b: int, tile_o: int, wvec: bool = False):
    """One p entry of the SIMT register-blocked loops (``simt``, ``simtp``, ``simts`` and their vec4-W
    variants) as an inlined Warp function, built once per block shape::

        step(x, wt, r, q, b0, bmax, og, n_og) = outer(x[b0 + i, r] for i < tile_b,
                                                      W^T[q, og + j*n_og] for j < tile_o)

    x is read in place (``[B, Cin*Nin]``; rows past B clamped, computed and never stored) and the pad index
    ``r = Cin*Nin`` selects an exact 0 (a select, not a multiply by 0, so an inf in x cannot leak into a pad
    entry). ``wvec=True``: ``wt`` is the fp32 channel-permuted W^T read as ``tile_o/4`` vec4 words per row
    (``wperm[q, og*tile_o + j] = W^T[q, og + j*n_og]``)."""
    TB, TO, WV = int(tile_b), int(tile_o), bool(wvec)

    def make():
        if WV and TO % 4:
            raise ValueError(f"vec4 W loads: tile_o={TO} must be a multiple of 4")
        TO4 = TO // 4
        WT = wp.vec4 if WV else wp.float16        # W's element type (a closure type: the body must name it)
        vec_b = wp.types.vector(length=TB, dtype=wp.float32)
        vec_o = wp.types.vector(length=TO, dtype=wp.float32)

        # a name per block shape: the kernels of several shapes share one module in the AOT builds
        @wp.func(name=f"fovi_simt_step_b{TB}o{TO}{'w' if WV else ''}", inline=True)
        def step(x: wp.array2d(dtype=wp.float16), wt: wp.array2d(dtype=WT), r: int, q: int, b0: int, bmax: int,
                 og: int, n_og: int):
            real = r < x.shape[1]      # the pad index Cin*Nin selects an exact 0
            rr = wp.min(r, x.shape[1] - 1)
            xv = vec_b()
            wv = vec_o()
            for i in range(TB):        # tail rows clamped into x (computed, never stored)
                xv[i] = wp.where(real, wp.float32(x[wp.min(b0 + i, bmax), rr]), 0.0)
            if wp.static(WT == wp.vec4):   # TO/4 vec4 words of the permuted fp32 W^T
                for k in range(TO4):
                    w4 = wt[q, og * TO4 + k]
                    for i in range(4):
                        wv[k * 4 + i] = w4[i]
            else:
                for j in range(TO):
                    wv[j] = wp.float32(wt[q, og + j * n_og])
            return wp.outer(xv, wv)
        return step
    return built(("simt", "step", TB, TO, WV), make)


def simt_store(tile_b: int, tile_o: int, nodes_first: bool):
    """The epilogue of the SIMT register blocks as an inlined Warp function, built once per block shape and
    layout: a thread's ``tile_b x tile_o`` fp32 accumulators plus the bias (in fp32, one rounding to fp16) into
    ``y``, guarded by ``y``'s shape (the batch and Cout tails)::

        y[b0 + i, og + j*n_og, n] = fp16(acc[i, j] + bias[og + j*n_og])     (the op's y [B, Cout, Nout])
        y[n, b0 + i, og + j*n_og] = ...                                     (nodes_first: [Nout, B, Cout])
    """
    TB, TO, NF = int(tile_b), int(tile_o), bool(nodes_first)

    def make():
        mat_bo = wp.types.matrix(shape=(TB, TO), dtype=wp.float32)

        def store(y: wp.array3d(dtype=wp.float16), acc: None, bias: wp.array1d(dtype=wp.float32), n: int,
                  b0: int, og: int, n_og: int):
            if wp.static(NF):
                nb = y.shape[1]
                nc = y.shape[2]
            else:
                nb = y.shape[0]
                nc = y.shape[1]
            for i in range(TB):
                if b0 + i < nb:
                    for j in range(TO):
                        o = og + j * n_og
                        if o < nc:
                            if wp.static(NF):
                                y[n, b0 + i, o] = wp.float16(acc[i, j] + bias[o])
                            else:
                                y[b0 + i, o, n] = wp.float16(acc[i, j] + bias[o])

        store.__annotations__["acc"] = mat_bo       # an object: Warp evaluates only string annotations
        return wp.func(name=f"fovi_simt_store_b{TB}o{TO}{'_nbo' if NF else ''}", inline=True)(store)
    return built(("simt", "store", TB, TO, NF), make)


def simt_dense_step(tile_b: int, tile_o: int):
    """One k entry of the fp16 SIMT ceiling: ``outer(at[r, b0 + i] for i < tile_b, w[q, og + j*n_og] for j < tile_o)``
    with ``b0 = bg*tile_b`` over the dense operands ``at [Kd, Bx]``, ``w [Kd, Cout_p]`` (``r = q = k``)."""
    TB, TO = int(tile_b), int(tile_o)

    def build():
        vec_b = wp.types.vector(length=TB, dtype=wp.float32)
        vec_o = wp.types.vector(length=TO, dtype=wp.float32)

        @wp.func(name=f"fovi_simt_dense_step_b{TB}o{TO}", inline=True)
        def step(at: wp.array2d(dtype=wp.float16), w: wp.array2d(dtype=wp.float16), r: int, q: int, bg: int,
                 og: int, n_og: int):
            xv = vec_b()
            wv = vec_o()
            for i in range(TB):
                xv[i] = wp.float32(at[r, bg * TB + i])
            for j in range(TO):
                wv[j] = wp.float32(w[q, og + j * n_og])
            return wp.outer(xv, wv)
        return step
    return built(("simt", "dense_step", TB, TO), build)


def simtv_step(tile_b: int, tile_o: int):
    """One p entry of the ``simtv`` loops: the thread's ``tile_b/4`` vec4 words of the fp32 x^T row ``r`` and
    ``tile_o/4`` of the channel-permuted W^T row ``q``, their outer product (``n_og`` unused: the permutation
    already made the thread's channels adjacent)."""
    TB, TO = int(tile_b), int(tile_o)
    TB4, TO4 = TB // 4, TO // 4

    def build():
        vec_b = wp.types.vector(length=TB, dtype=wp.float32)
        vec_o = wp.types.vector(length=TO, dtype=wp.float32)

        @wp.func(name=f"fovi_simtv_step_b{TB}o{TO}", inline=True)
        def step(xp: wp.array2d(dtype=wp.vec4), wt: wp.array2d(dtype=wp.vec4), r: int, q: int, bg: int, og: int,
                 n_og: int):
            xv = vec_b()
            wv = vec_o()
            for k in range(TB4):
                x4 = xp[r, bg * TB4 + k]
                for i in range(4):
                    xv[k * 4 + i] = x4[i]
            for k in range(TO4):
                w4 = wt[q, og * TO4 + k]
                for i in range(4):
                    wv[k * 4 + i] = w4[i]
            return wp.outer(xv, wv)
        return step
    return built(("simt", "simtv_step", TB, TO), build)


def _simt_dense_kernel(kname: str, tile_b: int, tile_o: int, unroll: int, block_dim: int, step, vec4: bool):
    """The SIMT ceiling of a register block: its loop over dense operands ``at [Kd, Bx]``, ``w [Kd, Cout_p]``
    shared by every node (no index loads), ``step`` per k entry, output ``[Nout, B, Cout]`` (``vec4``: fp32
    operands read as vec4 words, the ``simtv`` layout; else fp16)."""
    TB, TO, U = int(tile_b), int(tile_o), int(unroll)
    mat_bo = wp.types.matrix(shape=(TB, TO), dtype=wp.float32)
    store = simt_store(TB, TO, nodes_first=True)

    @_simt_decorator(kname, block_dim, vec4_args=("at", "w") if vec4 else ())
    def kernel(at: wp.array2d(dtype=wp.float16), w: wp.array2d(dtype=wp.float16), bias: wp.array1d(dtype=wp.float32),
               y: wp.array3d(dtype=wp.float16), kd: int, n_og: int):
        n, bg, og = wp.tid()
        acc = mat_bo()
        for p0 in range(0, kd, U):
            for u in range(U):
                acc += step(at, w, p0 + u, p0 + u, bg, og, n_og)
        store(y, acc, bias, n, bg * TB, og, n_og)
    return kernel


def make_simt_kernel(tile_b: int, tile_o: int, unroll: int, block_dim: int, name: Optional[str] = None,
                      dense: bool = False, prefetch: bool = False, wvec: bool = False):
    """SIMT register-blocked kernel ("simt", ``sd_b8o8u4``-style): no tile GEMM, no staging, no layout copy
    of x or y.

    Why: at small batch the stems' per-node GEMM ``[B, P] @ [P, Cout]`` has B <= 16 rows, so a tensor-core
    tile is mostly padding and Warp's tile GEMM runs at a few TFLOP/s on it, while the i2c family also
    stages every node's weight rows (``Nout*P64*Cout`` fp16: 71 MB written and read back at alexnet's
    stem, ~6x the gathered x at B = 16). Here one thread keeps a ``tile_b x tile_o`` block of
    ``y[b, o, n]`` in fp32 registers and reads its operands straight from L2::

        acc[i, j] = sum_{p < p_len} xpad[b0 + i, il[n, p]] * wt[wl[n, p], og + j*n_og]

    * x is read in place as ``[B, Cin*Nin]`` (batch rows clamped into range: the extra rows of a tail block
      are computed but never stored); the pad index ``Cin*Nin`` selects an exact 0 (a select, not a
      multiply, so an inf in x cannot leak into a pad entry);
    * ``wt = W^T`` ``[Q, Cout_p]`` (zero columns past Cout; cached between calls while W is unchanged);
    * ``y [B, Cout, Nout]`` is written in place, guarded by its shape.

    Threads are launched over ``(Nout, ceil(B/tile_b), n_og = Cout_p/tile_o)`` with the channel group
    fastest, and a thread's channels are strided by ``n_og``: for each ``j`` neighbouring threads read
    neighbouring ``wt`` entries (one coalesced row segment) and share (broadcast) the same x entries. Per
    ``p`` a thread issues ``2 + tile_b + tile_o`` loads for ``tile_b*tile_o`` FMAs; ``unroll`` p entries
    are handled per loop step so their loads are in flight together (``p_len``: the tables' last real
    column plus one, rounded up to ``unroll`` inside P64; the extra columns are pads). Bias is added in
    fp32, one rounding to fp16.

    ``prefetch=True`` ("simtp", ``sdp_*``): the next step's ``unroll`` index pairs are loaded before this
    step's operands, so each step waits on one memory round trip (operands) instead of two (indices, then
    the operands they point at). Measured on the H200 (fovi_lab/records/h200/forward_sweep.jsonl.gz): with 4x4
    blocks (twice the index loads per FMA of 8x8) it is the fastest forward at B <= 4 (ahead of ``sd_b8o8u4`` on
    resnet's stem); with 8x8 blocks about even with the plain loop, so those stay experimental.

    ``dense=True``: the same loop over dense operands ``at [Kd, Bx]``, ``w [Kd, Cout_p]`` shared by every
    node (no index loads; output ``[Nout, B, Cout]``): the SIMT ceiling of these register blocks.

    ``wvec=True`` ("simtw", ``sw_*``): W is read as fp32 ``vec4`` words of the channel-permuted ``W^T``
    (``wperm[q, og*tile_o + j] = W^T[q, og + j*n_og]``, the ``simtv`` layout), cached between calls like
    ``W^T``: per ``p`` ``tile_o/4`` 16-byte loads and no conversions instead of ``tile_o`` fp16 loads and
    conversions, while x is still read in place (no per-call prep launch, unlike ``simtv``).
    """
    init_warp()
    TB, TO, U = int(tile_b), int(tile_o), int(unroll)
    PF = bool(prefetch) and not dense
    WV = bool(wvec) and not dense and not PF
    kname = name or (f"fovi_fwd_simt{'p' if PF else 'w' if WV else ''}{'_dense' if dense else ''}"
                     f"_b{TB}o{TO}u{U}b{block_dim}")
    vec_u = wp.types.vector(length=U, dtype=wp.int32)
    mat_bo = wp.types.matrix(shape=(TB, TO), dtype=wp.float32)

    step = None if dense else simt_step(TB, TO, WV)     # one p entry (shared with make_simts_kernel)
    store = simt_store(TB, TO, nodes_first=dense)       # the dense ceiling writes [Nout, B, Cout]
    if not dense:
        @_simt_decorator(kname, block_dim, w_vec4=WV)
        def kernel(x: wp.array2d(dtype=wp.float16), wt: wp.array2d(dtype=wp.float16),
                   il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32),
                   bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=wp.float16), p_len: int, n_og: int):
            n, bg, og = wp.tid()
            b0 = bg * TB
            bmax = x.shape[0] - 1
            acc = mat_bo()
            if wp.static(PF):
                last = il.shape[1] - U         # the next step's indices are read from inside the table
                rn = vec_u()
                qn = vec_u()
                for u in range(U):
                    rn[u] = il[n, u]
                    qn[u] = wl[n, u]
                for p0 in range(0, p_len, U):
                    rc = rn
                    qc = qn
                    pn = wp.min(p0 + U, last)
                    for u in range(U):         # next step's indices: in flight while this step computes
                        rn[u] = il[n, pn + u]
                        qn[u] = wl[n, pn + u]
                    for u in range(U):
                        acc += step(x, wt, rc[u], qc[u], b0, bmax, og, n_og)
            else:
                for p0 in range(0, p_len, U):
                    for u in range(U):         # constant trip counts: unrolled, registers only
                        acc += step(x, wt, il[n, p0 + u], wl[n, p0 + u], b0, bmax, og, n_og)
            store(y, acc, bias, n, b0, og, n_og)
    else:
        kernel = _simt_dense_kernel(kname, TB, TO, U, block_dim, simt_dense_step(TB, TO), vec4=False)

    kernel.fovi_tiles = ("simt_dense" if dense else "simtp" if PF else "simtw" if WV else "simt", TB, TO, U, 1,
                          int(block_dim))
    return kernel


def make_simts_kernel(tile_b: int, tile_o: int, unroll: int, block_dim: int, name: Optional[str] = None,
                       wvec: bool = False):
    """SIMT register-blocked kernel with the p loop split across threads ("simts", ``ss_b8o8u4``-style),
    for layers with few output nodes at small batch (any Cin).

    Why: at B <= 16 the per-node GEMM ``[B, P] @ [P, Cout]`` has at most 16 rows, so a tensor-core tile
    is 16 rows deep at best and the node-major kernels reach a small fraction of the tensor cores' rate on it
    (res18 layer3's 0.3 GFLOP among them: fovi_lab/records/h200/forward_sweep.jsonl.gz), after a node-major copy
    of x that costs a launch of host time per call. The ``simt`` kernel's loop reads x in place and needs no
    copy, but on these layers it has too few threads:
    resnet's layer3 (Nout = 16, Cout = 256) gives 16 x 2 x 32 = 1024 threads of 8x8 blocks for 132 SMs.
    So the p range is cut into ``S`` contiguous chunks (``p_chunk`` entries each, a multiple of
    ``unroll``), thread ``(s*Nout + n, bg, og)`` sums chunk ``s`` into the fp32 partial
    ``part[s*Nout + n, b, o]`` (``[S*Nout, B, Cout]``), and one SIMT launch
    (:func:`nms_reduce_kernel`) sums the ``S`` partials in a fixed order, adds the bias in fp32 and
    rounds once to fp16 into ``y [B, Cout, Nout]`` (deterministic, the same contract as every kernel).

    Each p entry is :func:`simt_step`, the function :func:`make_simt_kernel`'s loops call: x read in place
    as ``[B, Cin*Nin]`` with the pad index selecting an exact 0, ``wt = W^T [Q, Cout_p]`` cached between
    calls, a thread's channels strided by ``n_og`` (coalesced ``wt`` rows and partial stores), ``unroll``
    p entries per step. ``wvec=True``
    ("simtsw", ``ssw_*``): W read as fp32 ``vec4`` words of the channel-permuted ``W^T``, as ``simtw``.
    """
    init_warp()
    TB, TO, U = int(tile_b), int(tile_o), int(unroll)
    WV = bool(wvec)
    kname = name or f"fovi_fwd_simts{'w' if WV else ''}_b{TB}o{TO}u{U}b{block_dim}"
    mat_bo = wp.types.matrix(shape=(TB, TO), dtype=wp.float32)
    step = simt_step(TB, TO, WV)                       # one p entry (shared with make_simt_kernel)

    @_simt_decorator(kname, block_dim, w_vec4=WV)
    def kernel(x: wp.array2d(dtype=wp.float16), wt: wp.array2d(dtype=wp.float16),
               il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32),
               part: wp.array3d(dtype=wp.float32), p_len: int, p_chunk: int, n_og: int, nout: int):
        ns, bg, og = wp.tid()
        n = ns % nout
        s = ns // nout
        b0 = bg * TB
        bmax = x.shape[0] - 1
        p_lo = s * p_chunk
        p_hi = wp.min(p_lo + p_chunk, p_len)
        acc = mat_bo()
        for p0 in range(p_lo, p_hi, U):
            for u in range(U):                 # constant trip counts: unrolled, registers only
                acc += step(x, wt, il[n, p0 + u], wl[n, p0 + u], b0, bmax, og, n_og)
        for i in range(TB):                    # guarded by the partial's shape: batch and Cout tails
            if b0 + i < part.shape[1]:
                for j in range(TO):
                    o = og + j * n_og
                    if o < part.shape[2]:
                        part[ns, b0 + i, o] = acc[i, j]

    kernel.fovi_tiles = ("simtsw" if WV else "simts", TB, TO, U, 1, int(block_dim))
    return kernel


def make_simtv_kernel(tile_b: int, tile_o: int, unroll: int, block_dim: int, name: Optional[str] = None,
                       dense: bool = False):
    """SIMT register-blocked kernel with vectorised fp32 operands ("simtv", ``sv_b8o8u4``-style).

    :func:`make_simt_kernel`'s loop spends most of its instructions outside the FMAs: per ``p`` it issues
    ``tile_b + tile_o`` scalar fp16 loads and as many fp16 -> fp32 conversions for ``tile_b*tile_o`` FMAs.
    Here both operands are fp32 and read four at a time as ``vec4`` (16-byte loads):

    * ``xp32 [Cin*Nin + 1, Bx]`` (x^T, the zero pad row, zero batch columns): a thread's ``tile_b`` batch
      entries are ``tile_b/4`` consecutive vec4s;
    * ``wperm [Q, Cout_p]`` with ``wperm[q, og*tile_o + j] = W^T[q, og + j*n_og]``: the thread's strided
      channels (coalesced output stores, as in ``simt``) become ``tile_o/4`` consecutive vec4s, and
      neighbouring threads read neighbouring 16-byte words of one row.

    So per ``p``: 2 index loads and ``(tile_b + tile_o)/4`` vector loads for ``tile_b*tile_o`` FMAs, no
    conversions (8x8: 6 loads for 64 FMAs, against 18 loads and 16 conversions). Both operands are written
    per call by one SIMT launch (:func:`simtv_prep_kernel`: 4 bytes per element of x and of W).
    ``dense=True``: the same loop over dense ``at [Kd, Bx]``, ``w [Kd, Cout_p]`` (its ceiling).
    """
    init_warp()
    TB, TO, U = int(tile_b), int(tile_o), int(unroll)
    if TB % 4 or TO % 4:
        raise ValueError(f"simtv: tile_b={TB} and tile_o={TO} must be multiples of 4 (vec4 loads)")
    kname = name or f"fovi_fwd_simtv{'_dense' if dense else ''}_b{TB}o{TO}u{U}b{block_dim}"
    mat_bo = wp.types.matrix(shape=(TB, TO), dtype=wp.float32)
    step = simtv_step(TB, TO)
    store = simt_store(TB, TO, nodes_first=True)        # y [Nout, B, Cout]

    if not dense:
        @_simt_decorator(kname, block_dim)
        def kernel(xp: wp.array2d(dtype=wp.vec4), wt: wp.array2d(dtype=wp.vec4),
                   il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32),
                   bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=wp.float16), p_len: int, n_og: int):
            n, bg, og = wp.tid()
            b0 = bg * TB
            acc = mat_bo()
            for p0 in range(0, p_len, U):
                for u in range(U):             # constant trip counts: unrolled, registers only
                    acc += step(xp, wt, il[n, p0 + u], wl[n, p0 + u], bg, og, n_og)
            store(y, acc, bias, n, b0, og, n_og)
    else:
        kernel = _simt_dense_kernel(kname, TB, TO, U, block_dim, step, vec4=True)

    kernel.fovi_tiles = ("simtv_dense" if dense else "simtv", TB, TO, U, 1, int(block_dim))
    return kernel


@built_once
def simtv_prep_kernel():
    """Both operands of the ``simtv`` kernel in one SIMT launch (one thread per element written):

    * threads ``[0, n_x)``, ``n_x = (Cin*Nin + 1) * Bx/4``: ``xp[r, b] = x[b, r]`` as fp32 for ``r < Cin*Nin``,
      ``b < B``, four batch entries per thread (one vec4 store); 0 in the pad row ``r = Cin*Nin`` and the
      batch padding;
    * the rest: ``wperm[q, c] = W[o, q]`` with ``c = og*TO + j``, ``o = og + j*n_og`` (0 for ``o >= Cout``).

    One launch instead of three torch ops (zero-fill, transposing copy, permuted weight copy) on a path
    whose eager time is mostly host time; W is small ([Cout, Q] = 139K elements on alexnet's stem), so it
    is re-laid-out on every call rather than cached (a training step changes it anyway)."""
    @wp.kernel(enable_backward=False, module="unique")
    def fovi_simtv_prep(x: wp.array2d(dtype=wp.float16), w: wp.array2d(dtype=wp.float16),
                        xp: wp.array2d(dtype=wp.vec4), wperm: wp.array2d(dtype=wp.float32),
                        n_x: int, to: int, n_og: int):
        t = wp.tid()
        if t < n_x:
            # one thread per (row, 4 batch entries), rows fastest: a warp reads 32 consecutive entries of
            # each of 4 rows of x (coalesced) and writes one 16-byte vec4 per row of xp
            nr = xp.shape[0]
            b4 = t // nr
            r = t - b4 * nr
            v = wp.vec4(0.0)
            if r < x.shape[1]:
                for k in range(4):
                    b = b4 * 4 + k
                    if b < x.shape[0]:
                        v[k] = wp.float32(x[b, r])
            xp[r, b4] = v
        else:
            u = t - n_x
            coutp = wperm.shape[1]
            q = u // coutp
            c = u - q * coutp
            og = c // to
            o = og + (c - og * to) * n_og
            wval = float(0.0)
            if o < w.shape[0]:
                wval = wp.float32(w[o, q])
            wperm[q, c] = wval
    return fovi_simtv_prep
