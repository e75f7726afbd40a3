"""Tensor-core forward through a shared-memory pipeline: the ``mmap`` family (``mmap_o128b128k16s4``).

The register kernels of :mod:`fovi_lab.kernels.forward.mma` give every lane its own gathered loads: no shared
memory, but each 2-16 byte load waits a full memory round trip and every W row is fetched once per warp. At large
batch the GEMM per node is big (alexnet L1 at B = 512: 256 channels x 512 rows x 2400 p entries), and the shape
that fits it is the classic one: a CTA owns a ``BM x BN`` block of (channels, batch rows) of one node, and both
operands are *whole-row gathers along the reduction axis*::

    y[b, o, n] = bias[o] + sum_p  W^T[wl[n, p], o] * x^T[il[n, p], b]        (x^T row Cin*Nin: the zero pad)
                          (A: row wl[n,p] of W^T, BM channels)  (B: row il[n,p] of x^T, BN batch rows)

so one p entry of a stage is two contiguous runs of ``2*BM`` and ``2*BN`` bytes. Per CTA of ``T`` threads:

* **cp.async stages.** ``S`` stages of ``BK`` p entries, each ``[BK, BM]`` of A and ``[BK, BN]`` of B in
  shared memory, filled with 16-byte ``cp.async.cg`` copies (global -> shared, no registers). While the warps
  multiply stage ``k``, the copies of stages ``k+1 .. k+S-1`` are in flight: ``S-1`` stages of both operands
  per memory round trip, instead of one lane's few words. A pad row of x^T is a copy of 0 source bytes
  (``cp.async``'s zero fill): an exact +0, nothing read, so an inf or NaN in x cannot leak in. Each thread loads
  the table entries of the stage after the one it issues, so an index is never on the copy's critical path.
* **ldmatrix fragments.** Both tiles are k-major (a row is one p entry), and the m16n8k16 fragments want pairs
  of adjacent k: ``ldmatrix.x4.trans`` reads four 8x8 blocks and transposes them into exactly the A fragment
  (or two B fragments) of a lane. Rows are 128-512 bytes apart, so the 16-byte chunk ``c`` of row ``r`` is
  stored at chunk ``c ^ (r % 8)`` (an XOR swizzle): the 8 rows one ldmatrix phase reads land in 8 different
  bank groups, and a row's copies stay 16-byte chunks.
* **Warp tiles.** ``T/32`` warps in a ``WM x WN`` grid (2 x 2 at 128 threads, 2 x 4 at 256), each
  ``16*MT`` channels x ``8*NT`` rows of fp32 accumulators (64 x 64 in ``mmap_o128b128k16s4``: 128 registers).
  Per ``k16`` of a stage a warp issues ``MT + NT/2`` ldmatrix and ``MT*NT`` MMAs.

Stores: each lane writes its own accumulators (the bias added in fp32, one rounding) into ``y [B, Cout, Nout]``,
guarded by B and Cout (x^T's columns past B and W^T's zero columns past Cout are computed, never stored).

The summation order is fixed (p ascending within a thread's MMAs), so y is the same every run.

On Warp's CPU device the same kernel runs the snippet's C++ branch: each thread computes its own D elements
(the same warp grid, lane mapping, pad select, bounds and store) by a scalar loop over ``[p_lo, p_hi)``. CI
checks the mapping on the CPU; the ldmatrix / cp.async packing is checked on a GPU
(``tests/kernels/forward/test_warp_mma.py``) and the PTX compiled for sm_80/89/90 ahead of time. Before sm_80 the
loop compiles out, the canary's oracle check fails and the rule's other kernels run.

``dense=True`` builds the same pipeline over dense operands (p entry k reads row k of both): the ceiling of this
CTA shape without gathers, written ``[Nout, B, Cout]``.
"""

# (no "from __future__ import annotations": Warp needs the stubs' annotations as objects)

from typing import Any

from fovi_lab.kernels.common import init_warp, wp
from fovi_lab.kernels.built import built
from fovi_lab.kernels.families.pipelined import PIPE_SMEM_LIMIT, pipe_layout
from fovi_lab.kernels.forward.mma import _decorator, _indent, mma_sync_snippet

__all__ = ["make_mma_pipe_kernel", "pipe_layout", "pipe_snippet", "PIPE_SMEM_LIMIT"]

def pipe_snippet(bm: int, bn: int, bk: int, stages: int, threads: int, dense: bool = False) -> str:
    """The native body: thread ``thr``'s accumulators over p in ``[p_lo, p_hi)`` (multiples of ``bk``) for the
    CTA block at channel ``o0``, batch row ``b0`` of node ``n``, returned as ``4*MT*NT`` floats (index
    ``(mi*NT + nj)*4 + e``; see :func:`make_mma_pipe_kernel` for the element mapping)."""
    wm, wn, mt, nt = pipe_layout(bm, bn, bk, stages, threads)
    acc = 4 * mt * nt
    ca, cb = bk * bm // 8 // threads, bk * bn // 8 // threads      # 16-byte copies per thread and stage
    ra, rb = threads // (bm // 8), threads // (bn // 8)             # rows apart of a thread's copies
    if dense:
        idx = {"a": "p", "b": "p"}
        tables = ""
        cpu_rq = "const int r = p; const int q = p;"
    else:
        idx = {"a": "wlr[p]", "b": "ilr[p]"}
        tables = """
    const int* ilr = (const int*)((const char*)il.data + (size_t)n * (size_t)il.strides[0]);
    const int* wlr = (const int*)((const char*)wl.data + (size_t)n * (size_t)wl.strides[0]);"""
        cpu_rq = "const int r = ilr[p]; const int q = wlr[p];"
    def issue(kt: str, st: str) -> str:
        """C++ issuing stage ``kt`` into buffer ``st`` (16-byte ``cp.async.cg``; a pad row of x^T copies 0 bytes,
        cp.async's zero fill), then loading the table entries of stage ``kt + 1``."""
        return f"""#pragma unroll
for (int i = 0; i < {ca}; ++i) {{
    const int row = a_r + {ra} * i;
    const unsigned dst = sa0 + (unsigned)(((({st}) * {bk} + row) * {bm} + ((a_c ^ (row & 7)) << 3)) * 2);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\\n" :: "r"(dst), "l"(wcol + (size_t)qa[i] * ws));
}}
#pragma unroll
for (int i = 0; i < {cb}; ++i) {{
    const int row = b_r + {rb} * i;
    const unsigned dst = sb0 + (unsigned)(((({st}) * {bk} + row) * {bn} + ((b_c ^ (row & 7)) << 3)) * 2);
    const int r = rx[i];
    const char* src = r < ncols ? xcol + (size_t)r * xs : xb;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\\n" :: "r"(dst), "l"(src), "r"(r < ncols ? 16 : 0));
}}
if (({kt}) + 1 < kt_n) {{
    #pragma unroll
    for (int i = 0; i < {ca}; ++i) {{ const int p = p_lo + (({kt}) + 1) * {bk} + a_r + {ra} * i; qa[i] = {idx["a"]}; }}
    #pragma unroll
    for (int i = 0; i < {cb}; ++i) {{ const int p = p_lo + (({kt}) + 1) * {bk} + b_r + {rb} * i; rx[i] = {idx["b"]}; }}
}}"""

    return f"""
    const int warp = thr >> 5, lane = thr & 31;
    const int wm = warp % {wm}, wn = warp / {wm};
    const int g = lane >> 2, t = lane & 3;
    const int ncols = x.shape[0];              // x^T rows: Cin*Nin (row ncols is the zero pad)
    const char* xb = (const char*)x.data;
    const size_t xs = (size_t)x.strides[0];
    const char* wb = (const char*)wt.data;
    const size_t ws = (size_t)wt.strides[0];{tables}
    float d[{acc}];
    for (int i = 0; i < {acc}; ++i) d[i] = 0.0f;
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800
    __shared__ __align__(128) unsigned short sa[{stages * bk * bm}];
    __shared__ __align__(128) unsigned short sb[{stages * bk * bn}];
    const int a_c = thr % {bm // 8}, a_r = thr / {bm // 8};      // this thread's chunk column and first row
    const int b_c = thr % {bn // 8}, b_r = thr / {bn // 8};
    const char* wcol = wb + (size_t)(o0 + 8 * a_c) * 2;
    const char* xcol = xb + (size_t)(b0 + 8 * b_c) * 2;
    const unsigned sa0 = (unsigned)__cvta_generic_to_shared(sa), sb0 = (unsigned)__cvta_generic_to_shared(sb);
    const int kt_n = (p_hi - p_lo) / {bk};
    int qa[{ca}], rx[{cb}];                     // the table entries of the next stage to issue
    if (kt_n > 0) {{
        #pragma unroll
        for (int i = 0; i < {ca}; ++i) {{ const int p = p_lo + a_r + {ra} * i; qa[i] = {idx["a"]}; }}
        #pragma unroll
        for (int i = 0; i < {cb}; ++i) {{ const int p = p_lo + b_r + {rb} * i; rx[i] = {idx["b"]}; }}
    }}
    #pragma unroll
    for (int s = 0; s < {stages - 1}; ++s) {{                  // the prologue: stages 0 .. S-2 in flight
        if (s < kt_n) {{
{_indent(issue("s", "s"), 12)}
        }}
        asm volatile("cp.async.commit_group;\\n" ::: "memory");
    }}
    const int lj = lane & 7, li = lane >> 3;                   // ldmatrix: this lane's row of block li
    for (int kt = 0; kt < kt_n; ++kt) {{
        asm volatile("cp.async.wait_group {stages - 2};\\n" ::: "memory");   // stage kt has landed (this thread's copies)
        __syncthreads();                                        // ... everyone's; and stage kt-1 is consumed
        {{
            const int nk = kt + {stages - 1};
            if (nk < kt_n) {{
{_indent(issue("nk", f"nk % {stages}"), 16)}
            }}
            asm volatile("cp.async.commit_group;\\n" ::: "memory");
        }}
        const int s = kt % {stages};
        #pragma unroll
        for (int kk = 0; kk < {bk // 16}; ++kk) {{
            unsigned int af[{mt}][4], bf[{nt}][2];
            #pragma unroll
            for (int mi = 0; mi < {mt}; ++mi) {{      // blocks: (m 0-7 | 8-15) x (k 0-7 | 8-15) -> a0 a1 a2 a3
                const int k = kk * 16 + (li >> 1) * 8 + lj;
                const int c = ((wm * {16 * mt} + mi * 16 + (li & 1) * 8) >> 3) ^ lj;
                const unsigned addr = sa0 + (unsigned)(((s * {bk} + k) * {bm} + (c << 3)) * 2);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];\\n"
                             : "=r"(af[mi][0]), "=r"(af[mi][1]), "=r"(af[mi][2]), "=r"(af[mi][3]) : "r"(addr));
            }}
            #pragma unroll
            for (int nj = 0; nj < {nt}; nj += 2) {{  // blocks: (k 0-7 | 8-15) x (n-tile nj | nj+1) -> b0 b1 b0' b1'
                const int k = kk * 16 + (li & 1) * 8 + lj;
                const int c = ((wn * {8 * nt} + nj * 8 + (li >> 1) * 8) >> 3) ^ lj;
                const unsigned addr = sb0 + (unsigned)(((s * {bk} + k) * {bn} + (c << 3)) * 2);
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{%0,%1,%2,%3}}, [%4];\\n"
                             : "=r"(bf[nj][0]), "=r"(bf[nj][1]), "=r"(bf[nj + 1][0]), "=r"(bf[nj + 1][1])
                             : "r"(addr));
            }}
            #pragma unroll
            for (int mi = 0; mi < {mt}; ++mi)
                #pragma unroll
                for (int nj = 0; nj < {nt}; ++nj) {{
{_indent(mma_sync_snippet(nt, [f"af[mi][{i}]" for i in range(4)], ("bf[nj][0]", "bf[nj][1]")), 20)}
                }}
        }}
    }}
    asm volatile("cp.async.wait_group 0;\\n" ::: "memory");
    __syncthreads();                 // the buffers are refilled by this CTA's next grid-stride block
#endif      // (before sm_80: no cp.async / ldmatrix / m16n8k16; the accumulators stay 0 and the canary refuses it)
#else
    // Warp's CPU device: this thread's D elements by a scalar loop (same warp grid, mapping, pads and bounds)
    for (int p = p_lo; p < p_hi; ++p) {{
        {cpu_rq}
        for (int mi = 0; mi < {mt}; ++mi)
            for (int nj = 0; nj < {nt}; ++nj)
                for (int e = 0; e < 4; ++e) {{
                    const int ch = o0 + wm * {16 * mt} + mi * 16 + g + 8 * (e >> 1);
                    const int b = b0 + wn * {8 * nt} + nj * 8 + 2 * t + (e & 1);
                    const float wv = wp::half_to_float(((const wp::float16*)(wb + (size_t)q * ws))[ch]);
                    const float xv = r < ncols ? wp::half_to_float(((const wp::float16*)(xb + (size_t)r * xs))[b])
                                               : 0.0f;
                    d[(mi * {nt} + nj) * 4 + e] += wv * xv;
                }}
    }}
#endif
    wp::vec_t<{acc}, wp::float32> out;
    for (int i = 0; i < {acc}; ++i) out[i] = d[i];
    return out;
"""


def _pipe_steps(bm: int, bn: int, bk: int, stages: int, threads: int, dense: bool):
    """The native function of one CTA shape (built once)."""
    def make():
        _, _, mt, nt = pipe_layout(bm, bn, bk, stages, threads)
        vec_acc = wp.types.vector(length=4 * mt * nt, dtype=wp.float32)
        src = pipe_snippet(bm, bn, bk, stages, threads, dense)
        # (Warp recognises a native function by its literal ``@wp.func_native(...)`` decorator; the return
        # annotation resolves through this frame's locals)
        if dense:
            @wp.func_native(src)
            def steps(x: wp.array2d(dtype=wp.float16), wt: wp.array2d(dtype=wp.float16), thr: int, b0: int,
                      o0: int, n: int, p_lo: int, p_hi: int) -> vec_acc: ...
        else:
            @wp.func_native(src)
            def steps(x: wp.array2d(dtype=wp.float16), wt: wp.array2d(dtype=wp.float16),
                      il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32), thr: int, b0: int,
                      o0: int, n: int, p_lo: int, p_hi: int) -> vec_acc: ...
        return steps
    return built(("mma_pipe", "steps", bm, bn, bk, stages, threads, dense), make)


def _pipe_store(bm: int, bn: int, bk: int, stages: int, threads: int, layout: str):
    """Each thread's store of its accumulators, guarded by the output's batch and channel extents: element ``e`` of
    fragment ``(mi, nj)`` of warp ``(wm, wn)``, lane ``(g, t)`` is channel ``o0 + 16*MT*wm + 16*mi + g + 8*(e // 2)``
    and batch row ``b0 + 8*NT*wn + 8*nj + 2*t + e % 2``. ``store(y, acc, thr, b0, o0, n, bias)``; ``layout``:
    "op" (the op's fp16 ``y [B, Cout, Nout]``) or "nbo" (the dense ceiling's fp16 ``[Nout, B, Cout]``), the bias
    added in fp32 and one rounding; or "part" (the split loop's fp32 partials ``part [S*Nout, B, Cout]``, row ``n`` =
    split * Nout + node): the accumulators as they are, no bias."""
    def make():
        WM, _, MT, NT = pipe_layout(bm, bn, bk, stages, threads)
        PART, NBO = layout == "part", layout != "op"
        vec_acc = wp.types.vector(length=4 * MT * NT, dtype=wp.float32)
        YT = wp.float32 if PART else wp.float16

        def store(y: wp.array3d(dtype=YT), acc: None, thr: int, b0: int, o0: int, n: int, bias: Any = 0):
            warp = thr // 32
            lane = thr % 32
            c0 = o0 + (warp % WM) * (16 * MT) + lane // 4
            r0 = b0 + (warp // WM) * (8 * NT) + (lane % 4) * 2
            for mi in range(MT):
                for nj in range(NT):
                    for e in range(4):
                        ch = c0 + mi * 16 + (e // 2) * 8
                        b = r0 + nj * 8 + e % 2
                        if wp.static(PART):
                            if b < y.shape[1] and ch < y.shape[2]:
                                y[n, b, ch] = acc[(mi * NT + nj) * 4 + e]
                        elif wp.static(NBO):
                            if b < y.shape[1] and ch < y.shape[2]:
                                y[n, b, ch] = wp.float16(acc[(mi * NT + nj) * 4 + e] + bias[ch])
                        else:
                            if b < y.shape[0] and ch < y.shape[1]:
                                y[b, ch, n] = wp.float16(acc[(mi * NT + nj) * 4 + e] + bias[ch])

        store.__annotations__["acc"] = vec_acc      # an object: Warp evaluates only string annotations
        return wp.func(name=f"fovi_pipe_store_m{MT}n{NT}w{WM}_{layout}", inline=True)(store)
    return built(("mma_pipe", "store", bm, bn, bk, stages, threads, layout), make)


def make_mma_pipe_kernel(channels: int, rows: int, tile_k: int, stages: int, block_dim: int = 128,
                         dense: bool = False, split: bool = False):
    """The ``mmap`` kernel: a CTA of ``block_dim`` threads per (node, ``rows`` batch rows, ``channels``
    output channels), ``stages`` shared-memory stages of ``tile_k`` p entries (see the module docstring).

    Launch: ``wp.launch(kernel, dim=(Nout, ceil(B / rows), n_og*block_dim), block_dim=block_dim)`` with
    ``n_og = Cout_p / channels``: the last dimension is (channel block, thread), so a CTA is one (node, batch
    block, channel block). Arguments: ``x = x^T [Cin*Nin, Bx]`` fp16 (``Bx`` a multiple of ``rows``; columns
    past B are read, never stored), ``wt = W^T [Q, Cout_p]`` fp16 (zero columns past Cout), ``il, wl [Nout, P64]``
    int32, ``bias [Cout_p]`` fp32, ``y [B, Cout, Nout]`` fp16, ``p_len`` (a multiple of ``tile_k``), ``n_og``.

    ``split=True`` (``mmaps``, for layers with few nodes, whose grid would not fill the GPU): the p range in ``S``
    contiguous chunks, ``dim=(S*Nout, ...)``, fp32 partials ``part [S*Nout, B, Cout]`` instead of bias and y, then
    ``p_len``, ``p_chunk`` (a multiple of ``tile_k``), ``n_og``, ``nout``; the nms reduction sums them in a fixed
    order, adds the bias and rounds once (deterministic).

    ``dense=True``: the ceiling, ``xd [Kd, Bx]``, ``wd [Kd, Cout_p]``, ``bias``, ``y [Nout, B, Cout]``, ``kd``,
    ``n_og``.
    """
    init_warp()
    BM, BN, BK, S, T = int(channels), int(rows), int(tile_k), int(stages), int(block_dim)
    pipe_layout(BM, BN, BK, S, T)                  # raises on a shape that cannot be built
    if split and dense:
        raise ValueError("mmap kernel: a split kernel shares its unsplit ceiling (dense=True, split=False)")
    steps = _pipe_steps(BM, BN, BK, S, T, bool(dense))
    fam = "mmaps" if split else "mmap"
    kname = f"fovi_fwd_{fam}{'_dense' if dense else ''}_o{BM}b{BN}k{BK}s{S}b{T}"
    if split:
        pstore = _pipe_store(BM, BN, BK, S, T, "part")

        @_decorator(kname, T)
        def kernel(x: wp.array2d(dtype=wp.float16), wt: wp.array2d(dtype=wp.float16),
                   il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32),
                   part: wp.array3d(dtype=wp.float32), p_len: int, p_chunk: int, n_og: int, nout: int):
            ns, bg, tl = wp.tid()
            thr = tl % T
            b0 = bg * BN
            o0 = (tl // T) * BM
            p_lo = (ns // nout) * p_chunk
            acc = steps(x, wt, il, wl, thr, b0, o0, ns % nout, p_lo, wp.min(p_lo + p_chunk, p_len))
            pstore(part, acc, thr, b0, o0, ns)
        kernel.fovi_tiles = (fam, BN, BM, BK, S, T)
        kernel.fovi_dtype = "float16"
        return kernel
    store = _pipe_store(BM, BN, BK, S, T, "nbo" if dense else "op")
    if dense:
        @_decorator(kname, T)
        def kernel(xd: wp.array2d(dtype=wp.float16), wd: wp.array2d(dtype=wp.float16),
                   bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=wp.float16), kd: int, n_og: int):
            n, bg, tl = wp.tid()
            thr = tl % T
            b0 = bg * BN
            o0 = (tl // T) * BM
            acc = steps(xd, wd, thr, b0, o0, n, 0, kd)
            store(y, acc, thr, b0, o0, n, bias)
    else:
        @_decorator(kname, T)
        def kernel(x: wp.array2d(dtype=wp.float16), wt: wp.array2d(dtype=wp.float16),
                   il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32),
                   bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=wp.float16), p_len: int, n_og: int):
            n, bg, tl = wp.tid()
            thr = tl % T
            b0 = bg * BN
            o0 = (tl // T) * BM
            acc = steps(x, wt, il, wl, thr, b0, o0, n, 0, p_len)
            store(y, acc, thr, b0, o0, n, bias)
    kernel.fovi_tiles = (fam + ("_dense" if dense else ""), BN, BM, BK, S, T)
    kernel.fovi_dtype = "float16"
    return kernel
