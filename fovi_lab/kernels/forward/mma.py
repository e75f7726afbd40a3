"""Tensor-core forward by hand: warp-level ``mma.sync`` gather-GEMM kernels (the ``mma`` families: ``mma``,
``mmas`` with the p loop split, ``mmaw`` / ``mmasw`` with W read in place, ``mmat`` with x^T; each with loops of
1, 2 or 4 k-steps per iteration; see :func:`make_mma_kernel`).

Why a native snippet: Warp's only tensor-core path is ``tile_matmul`` (cuBLASDx), which wants both
operands in shared tiles, links MathDx for every config (tens of seconds each on the H200 machine:
fovi_lab/records/h200/compile_latency.jsonl.gz), and tops out far below the tensor cores' peak there (the tile
families' rows of fovi_lab/records/h200/forward_sweep.jsonl.gz). Its tiles are also at least 16 batch rows deep,
so at B <= 16 most of a tile is padding. A ``@wp.func_native`` snippet can issue PTX
``mma.sync.aligned.m16n8k16`` directly from registers that each lane fills with its own gathered loads: no shared
memory, no stage, no layout copy of x or y, and a plain NVRTC compile (seconds).

The operator (docs/operator.md §2.2), transposed so that the *channels* are the MMA's M side::

    y[b, o, n]^T = bias[o] + sum_p  W[o, wl[n, p]] * xpad[b, il[n, p]]
                   (A = gathered W rows, M = channels)   (B = gathered x, N = batch rows)

One warp computes one node's block of ``16*MT`` output channels x ``8*NT`` batch rows, as ``MT x NT``
m16n8 accumulator tiles in fp32 registers, over ``k``-steps of 16 p entries. PTX fixes which elements
each lane holds (lane = 4*g + t)::

    A (16 x 16, rows m, cols k):  {m = g, g+8} x {k = 2t, 2t+1, 2t+8, 2t+9}   (4 registers of 2 fp16)
    B (16 x 8,  rows k, cols n):  {k = 2t, 2t+1, 2t+8, 2t+9} x {n = g}       (2 registers)
    D (16 x 8, fp32):             {m = g, g+8} x {n = 2t, 2t+1}              (4 registers)

so per k-step a lane needs the indices of its four p entries (two 8-byte loads per table) and:

* **W** (the A side): the tile row ``m`` of m-tile ``mi`` is channel ``o0 + (m % 8)*2*MT + 2*mi + m // 8``.
  This permutation puts all ``2*MT`` channels a lane multiplies, for one p entry, next to each other in
  the row ``W^T[wl[n, p]]``: one 16-byte (``MT % 4 == 0``), 8-byte or 4-byte vector load per p entry, and
  two byte-permutes per register pair repack them into the A fragments. (Unpermuted, the lane's channels
  are 8 apart: ``2*MT`` scalar loads per p entry.)
* **x** (the B side), read in place as ``[B, Cin*Nin]``: one fp16 load per (p entry, batch tile); the pad
  column ``Cin*Nin`` is not loaded but selected as an exact +0 (so an inf or NaN in x cannot leak in).
  Batch rows past B are clamped into x (computed, never stored).
* the accumulators are stored with the bias added in fp32 and one rounding to fp16, straight into
  ``y [B, Cout, Nout]`` (``mma``) or as fp32 partials of one of ``S`` contiguous chunks of the p range
  (``mmas``: ``part [S*Nout, B, Cout]``, summed in a fixed order by the nms reduction: deterministic).

The loop walks ``k_steps`` k-steps (``tile_k = 16*k_steps``: 16, 32 or 64 p entries) per iteration: the
iteration's indices were loaded during the previous one, then every W and x load of its ``k_steps`` steps is
issued before the first of its ``k_steps*MT*NT`` MMAs. So an iteration waits on one memory round trip for
``k_steps`` steps' operands: these kernels are latency-bound, and a 4-deep loop keeps 4x the bytes in flight per
warp, for two to four times the operand registers (the deeper loops ran faster on the H200 where grids are a few
hundred warps, fovi_lab/records/h200/mma_sweep.jsonl.gz; where the extra registers cost a wave of residency, the
1-deep loop stays ahead; ``rules.select_mma`` says where).

On Warp's CPU device the same kernels run with the snippet's C++ branch: each lane computes its own D
elements (the same channel permutation, batch tiles, pad select, loop bounds and stores) by a scalar
loop over the 16 p entries of the step. So CI checks everything but the PTX fragment packing on the CPU;
``tests/kernels/forward/test_warp_mma.py`` checks the packing against the oracle on a GPU, and the AOT tests
compile the PTX for sm_80/89/90 with no GPU. ``mma.sync.m16n8k16`` needs sm_80+: on older GPUs the loop is compiled out,
the outputs hold only the bias, the NaN canary's oracle check finds the config unusable and the call takes
the tile / SIMT rule instead.

``dense=True`` builds the same loop, with the same operand layouts, over dense operands (no index loads,
output ``[Nout, B, Cout]``): the ceiling of these register blocks without the gathers.

``bf16=True`` builds every kernel for bf16 x, W and y: bf16 fills the fragments with 16-bit elements in the same
layout as fp16, so only the MMA's operand type (``.bf16.bf16``), the CPU branch's conversions and the final
rounding change. They are the forward's only bf16 kernels (the tile and SIMT families have none).
"""

# (no "from __future__ import annotations": Warp needs the stubs' annotations as objects)

from typing import Sequence, Tuple

from fovi_lab.kernels import common as _wc
from fovi_lab.kernels.common import init_warp, wp
from fovi_lab.kernels.built import built

__all__ = ["make_mma_kernel", "mma_channel", "MMA_K"]

#: p entries per k-step (the K of one m16n8k16 MMA).
MMA_K = 16


def mma_channel(m_tiles: int, o0: int, g: int, mi: int, h: int) -> int:
    """The output channel of accumulator row ``g + 8*h`` of m-tile ``mi`` in the warp whose channel block
    starts at ``o0`` (the permutation that makes a lane's W loads contiguous)."""
    return o0 + g * 2 * m_tiles + 2 * mi + h


def _w_loads(mt: int) -> str:
    """C++ that loads the lane's ``2*MT`` contiguous fp16 of one W^T row ``wr`` into ``wf[u][kk][0..MT)``."""
    if mt % 4 == 0:
        return "\n".join(
            f"            {{ const uint4 v = __ldg(((const uint4*)wr) + {i}); wf[u][kk][{4*i}] = v.x; "
            f"wf[u][kk][{4*i+1}] = v.y; wf[u][kk][{4*i+2}] = v.z; wf[u][kk][{4*i+3}] = v.w; }}" for i in range(mt // 4))
    if mt % 2 == 0:
        return "\n".join(
            f"            {{ const uint2 v = __ldg(((const uint2*)wr) + {i}); wf[u][kk][{2*i}] = v.x; "
            f"wf[u][kk][{2*i+1}] = v.y; }}" for i in range(mt // 2))
    return "\n".join(f"            wf[u][kk][{i}] = __ldg(((const unsigned int*)wr) + {i});" for i in range(mt))


def _indent(code: str, n: int) -> str:
    return "\n".join(" " * n + ln if ln.strip() else ln for ln in code.splitlines())


def mma_sync_snippet(nt: int, a: Sequence[str], b: Sequence[str], ptx_t: str = "f16") -> str:
    """C++ of the m16n8k16 MMA of m-tile ``mi``, n-tile ``nj`` into its 4 fp32 accumulators ``d[(mi*NT + nj)*4 ..]``
    (``c``): ``a`` the four A-fragment registers, ``b`` the two B-fragment registers (C++ expressions), ``ptx_t``
    the operand type (``f16`` or ``bf16``)."""
    regs = ", ".join(f'"r"({r})' for r in (*a, *b))
    return f"""float* c = d + (mi * {nt} + nj) * 4;
asm volatile(
    "mma.sync.aligned.m16n8k16.row.col.f32.{ptx_t}.{ptx_t}.f32 "
    "{{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};\\n"
    : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
    : {regs});"""


def _x_pair_loads(nt: int, u: int, j: int) -> str:
    """C++ that loads the lane's ``NT`` contiguous fp16 of the two x^T rows of p entries ``2j``, ``2j+1`` of
    sub-step ``u`` (``xt`` layout; a pad row reads as +0, not loaded) and packs them into the B fragments
    ``xf[u][nj][j]`` (low half: entry ``2j``)."""
    ra, rb = f"rk[{u}][{2 * j}]", f"rk[{u}][{2 * j + 1}]"
    if nt == 1:
        ld = lambda r: f"({r} < ncols ? (unsigned int)__ldg((const unsigned short*)(xb0 + (size_t){r} * xs + xcol)) : 0u)"  # noqa: E731,E501
        return f"            xf[{u}][0][{j}] = {ld(ra)} | ({ld(rb)} << 16);"
    vt = {2: "unsigned int", 4: "uint2", 8: "uint4"}[nt]
    zero = {2: "0u", 4: "make_uint2(0u, 0u)", 8: "make_uint4(0u, 0u, 0u, 0u)"}[nt]
    words = {2: [""], 4: [".x", ".y"], 8: [".x", ".y", ".z", ".w"]}[nt]
    ld = lambda r: f"{r} < ncols ? __ldg((const {vt}*)(xb0 + (size_t){r} * xs + xcol)) : {zero}"  # noqa: E731
    body = " ".join(f"xf[{u}][{2 * i}][{j}] = __byte_perm(va{w}, vb{w}, 0x5410); "
                    f"xf[{u}][{2 * i + 1}][{j}] = __byte_perm(va{w}, vb{w}, 0x7632);" for i, w in enumerate(words))
    return f"            {{ const {vt} va = {ld(ra)}; const {vt} vb = {ld(rb)}; {body} }}"


#: (PTX operand type, C++ element type, C++ element -> float) of the fp16 and the bf16 kernels: both fill the
#: m16n8k16 fragments with 16-bit elements in the same layout, so only the MMA's type and the CPU branch differ.
_ELEM = {False: ("f16", "wp::float16", "wp::half_to_float"), True: ("bf16", "wp::bfloat16", "wp::bfloat16_to_float")}


def mma_snippet(mt: int, nt: int, dense: bool, w_native: bool = False, x_t: bool = False, ku: int = 1,
                bf16: bool = False) -> str:
    """The native body: ``acc`` over p in ``[p_lo, p_hi)`` for one lane, returned as a vector of
    ``4*MT*NT`` floats (index ``(mi*NT + nj)*4 + e``).

    Layouts: ``wt`` is ``W^T [Q, Cout_p]`` (one vector load of the lane's ``2*MT`` channels per p entry) or,
    ``w_native``, W itself ``[Cout, Q]`` read in place (``2*MT`` scalar loads per p entry, rows past Cout
    clamped: computed, never stored). ``x`` is ``[B, Cin*Nin]`` read in place (``NT`` scalar loads per p entry,
    batch column ``n`` of n-tile ``nj`` = row ``b0 + 8*nj + n``) or, ``x_t``, ``x^T [Cin*Nin, Bx]`` with the
    batch permuted so that a lane's ``NT`` rows are adjacent (column ``n`` of n-tile ``nj`` = row
    ``b0 + NT*n + nj``: one vector load per p entry).

    ``ku`` k-steps of 16 p entries make one loop iteration: all their operand loads are issued before their
    ``ku*MT*NT`` MMAs, so a warp has ``ku`` steps' loads in flight per memory round trip (``p_lo`` and ``p_hi``
    are multiples of ``16*ku``). ``bf16``: x and W are bf16 (the same fragments; the MMA reads them as bf16)."""
    acc, ks = 4 * mt * nt, 16 * ku
    ptx_t, elem, to_float = _ELEM[bool(bf16)]
    if dense:       # dense ceiling: p entry k reads x column k and W^T row k
        gpu_idx = f"""
        int rk[{ku}][4], qk[{ku}][4];
        #pragma unroll
        for (int u = 0; u < {ku}; ++u) {{
            const int kb = k0 + 16 * u + 2 * t;
            rk[u][0] = qk[u][0] = kb; rk[u][1] = qk[u][1] = kb + 1;
            rk[u][2] = qk[u][2] = kb + 8; rk[u][3] = qk[u][3] = kb + 9;
        }}"""
        cpu_idx = "const int r = k0 + kk; const int q = r;"
        prefetch_init = ""
    else:
        prefetch_init = f"""
    int2 nr[{ku}][2], nq[{ku}][2];               // the next iteration's indices (p entries 2t, 2t+1 | 2t+8, 2t+9)
    #pragma unroll
    for (int u = 0; u < {ku}; ++u) {{
        nr[u][0] = nr[u][1] = nq[u][0] = nq[u][1] = make_int2(0, 0);
        if (p_lo < p_hi) {{
            const int kb = p_lo + 16 * u + 2 * t;
            nr[u][0] = *(const int2*)(ilr + kb); nr[u][1] = *(const int2*)(ilr + kb + 8);
            nq[u][0] = *(const int2*)(wlr + kb); nq[u][1] = *(const int2*)(wlr + kb + 8);
        }}
    }}"""
        gpu_idx = f"""
        int rk[{ku}][4], qk[{ku}][4];
        #pragma unroll
        for (int u = 0; u < {ku}; ++u) {{
            rk[u][0] = nr[u][0].x; rk[u][1] = nr[u][0].y; rk[u][2] = nr[u][1].x; rk[u][3] = nr[u][1].y;
            qk[u][0] = nq[u][0].x; qk[u][1] = nq[u][0].y; qk[u][2] = nq[u][1].x; qk[u][3] = nq[u][1].y;
        }}
        if (k0 + {ks} < p_hi) {{     // the next iteration's indices: in flight while this one loads and multiplies
            #pragma unroll
            for (int u = 0; u < {ku}; ++u) {{
                const int kb = k0 + {ks} + 16 * u + 2 * t;
                nr[u][0] = *(const int2*)(ilr + kb); nr[u][1] = *(const int2*)(ilr + kb + 8);
                nq[u][0] = *(const int2*)(wlr + kb); nq[u][1] = *(const int2*)(wlr + kb + 8);
            }}
        }}"""
        cpu_idx = "const int r = ilr[k0 + kk]; const int q = wlr[k0 + kk];"
    if w_native:
        w_setup = f"""
    const int cmax = wt.shape[0] - 1;
    const unsigned short* wrow[{mt}][2];
    #pragma unroll
    for (int mi = 0; mi < {mt}; ++mi)
        for (int h = 0; h < 2; ++h) {{
            const int ch = o0 + g * {2 * mt} + 2 * mi + h;
            wrow[mi][h] = (const unsigned short*)(wb + (size_t)(ch < cmax ? ch : cmax) * ws);
        }}"""
        w_load = f"""            #pragma unroll
            for (int mi = 0; mi < {mt}; ++mi)
                wf[u][kk][mi] = (unsigned int)__ldg(wrow[mi][0] + qk[u][kk])
                              | ((unsigned int)__ldg(wrow[mi][1] + qk[u][kk]) << 16);"""
        cpu_w = f"""const int chc = ch < cmax ? ch : cmax;
                        const float wv = {to_float}(((const {elem}*)(wb + (size_t)chc * ws))[q]);"""
        cpu_w_setup = "const int cmax = wt.shape[0] - 1;"
    else:
        w_setup = f"\n    const size_t wcol = (size_t)(o0 + g * {2 * mt}) * 2;"
        w_load = f"""            const char* wr = wb + (size_t)qk[u][kk] * ws + wcol;
{_w_loads(mt)}"""
        cpu_w = f"const float wv = {to_float}(((const {elem}*)(wb + (size_t)q * ws))[ch]);"
        cpu_w_setup = ""
    if x_t:
        x_setup = f"\n    const size_t xcol = (size_t)(b0 + g * {nt}) * 2;"
        x_load = "\n".join("        " + _x_pair_loads(nt, "u", j).strip() for j in (0, 1))
        ncols = "x.shape[0]"
        cpu_x = f"""const int b = b0 + (2 * t + (e & 1)) * {nt} + nj;
                        const float xv = r < ncols ? {to_float}(((const {elem}*)(xb0 + (size_t)r * xs))[b]) : 0.0f;"""
    else:
        x_setup = f"""
    const unsigned short* xr[{nt}];
    #pragma unroll
    for (int nj = 0; nj < {nt}; ++nj) {{
        const int b = b0 + nj * 8 + g;
        xr[nj] = (const unsigned short*)(xb0 + (size_t)(b < bmax ? b : bmax) * xs);
    }}"""
        x_load = f"""        #pragma unroll
        for (int nj = 0; nj < {nt}; ++nj)           // the pad column selects +0 (no load)
            #pragma unroll
            for (int j = 0; j < 2; ++j) {{
                const int ra = rk[u][2 * j], rb = rk[u][2 * j + 1];
                xf[u][nj][j] = (ra < ncols ? (unsigned int)__ldg(xr[nj] + ra) : 0u)
                             | ((rb < ncols ? (unsigned int)__ldg(xr[nj] + rb) : 0u) << 16);
            }}"""
        ncols = "x.shape[1]"
        cpu_x = f"""int b = b0 + nj * 8 + 2 * t + (e & 1);
                        b = b < bmax ? b : bmax;
                        const float xv = r < ncols ? {to_float}(((const {elem}*)(xb0 + (size_t)b * xs))[r]) : 0.0f;"""
    return f"""
    const int g = lane >> 2;
    const int t = lane & 3;
    const int ncols = {ncols};
    const int bmax = x.shape[0] - 1;
    const char* xb0 = (const char*)x.data;
    const size_t xs = (size_t)x.strides[0];
    const char* wb = (const char*)wt.data;
    const size_t ws = (size_t)wt.strides[0];
    const int* ilr = (const int*)((const char*)il.data + (size_t)n * (size_t)il.strides[0]);
    const int* wlr = (const int*)((const char*)wl.data + (size_t)n * (size_t)wl.strides[0]);
    float d[{acc}];
    for (int i = 0; i < {acc}; ++i) d[i] = 0.0f;
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 800{x_setup}{w_setup}{prefetch_init}
    for (int k0 = p_lo; k0 < p_hi; k0 += {ks}) {{{gpu_idx}
        unsigned int wf[{ku}][4][{mt}];          // wf[u][kk][mi]: channels (2mi, 2mi+1) of this lane at p entry kk
        unsigned int xf[{ku}][{nt}][2];          // xf[u][nj][j]: B fragment j (p entries 2j, 2j+1) of n-tile nj
        #pragma unroll
        for (int u = 0; u < {ku}; ++u) {{         // every load of the iteration first ...
            #pragma unroll
            for (int kk = 0; kk < 4; ++kk) {{
{_indent(w_load, 4)}
            }}
{_indent(x_load, 4)}
        }}
        #pragma unroll
        for (int u = 0; u < {ku}; ++u)            // ... then its MMAs
            #pragma unroll
            for (int mi = 0; mi < {mt}; ++mi) {{
                const unsigned int a0 = __byte_perm(wf[u][0][mi], wf[u][1][mi], 0x5410);  // row g,   k = 2t, 2t+1
                const unsigned int a1 = __byte_perm(wf[u][0][mi], wf[u][1][mi], 0x7632);  // row g+8, k = 2t, 2t+1
                const unsigned int a2 = __byte_perm(wf[u][2][mi], wf[u][3][mi], 0x5410);  // row g,   k = 2t+8, 2t+9
                const unsigned int a3 = __byte_perm(wf[u][2][mi], wf[u][3][mi], 0x7632);  // row g+8, k = 2t+8, 2t+9
                #pragma unroll
                for (int nj = 0; nj < {nt}; ++nj) {{
{_indent(mma_sync_snippet(nt, ("a0", "a1", "a2", "a3"), ("xf[u][nj][0]", "xf[u][nj][1]"), ptx_t), 20)}
                }}
            }}
    }}
#endif      // (before sm_80 there is no mma.sync.m16n8k16: the accumulators stay 0, the NaN canary's oracle check
            //  fails and the config is reported unusable; no trap, which would poison the CUDA context)
#else
    // Warp's CPU device: this lane's D elements by a scalar loop (same mapping, layouts, pads, bounds)
    {cpu_w_setup}
    for (int k0 = p_lo; k0 < p_hi; k0 += 16) {{
        for (int kk = 0; kk < 16; ++kk) {{
            {cpu_idx}
            for (int mi = 0; mi < {mt}; ++mi)
                for (int nj = 0; nj < {nt}; ++nj)
                    for (int e = 0; e < 4; ++e) {{
                        const int ch = o0 + g * {2 * mt} + 2 * mi + (e >> 1);
                        {cpu_w}
                        {cpu_x}
                        d[(mi * {nt} + nj) * 4 + e] += wv * xv;
                    }}
        }}
    }}
#endif
    wp::vec_t<{acc}, wp::float32> out;
    for (int i = 0; i < {acc}; ++i) out[i] = d[i];
    return out;
"""


def _native(key: Tuple, build):
    """The device function of ``key``, built once by ``build(vec_acc)`` (``vec_acc``: the vector of a lane's
    ``4*MT*NT`` accumulators, ``key[1:3] = (MT, NT)``)."""
    return built(("mma",) + key, lambda: build(wp.types.vector(length=4 * key[1] * key[2], dtype=wp.float32)))


def _elem(bf16: bool):
    """The Warp element type of the operands (and of y) of the fp16 or the bf16 kernels."""
    return wp.bfloat16 if bf16 else wp.float16


def _mma_steps(mt: int, nt: int, dense: bool = False, w_native: bool = False, x_t: bool = False, ku: int = 1,
               bf16: bool = False):
    """The native function running one lane's p loop (built once per block shape, operand layouts, k-steps
    per iteration and element type)."""
    return _native(("steps", mt, nt, dense, w_native, x_t, ku, bf16), lambda vec_acc: _build_steps(
        vec_acc, mma_snippet(mt, nt, dense, w_native, x_t, ku, bf16), dense, _elem(bf16)))


def _build_steps(vec_acc, src: str, dense: bool, et):
    """The p-loop native function of a generated snippet (dense: the ceiling's, without the tables)."""
    # (Warp recognises a native function by its literal ``@wp.func_native(...)`` decorator; the return
    # annotation resolves through this frame's locals)
    if dense:
        src = src.replace("const int* ilr", "// (dense: no tables) const int* ilr").replace(
            "const int* wlr", "// const int* wlr")

        @wp.func_native(src)
        def steps(x: wp.array2d(dtype=et), wt: wp.array2d(dtype=et), lane: int, b0: int,
                  o0: int, p_lo: int, p_hi: int) -> vec_acc: ...
    else:
        @wp.func_native(src)
        def steps(x: wp.array2d(dtype=et), wt: wp.array2d(dtype=et),
                  il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32), n: int, lane: int,
                  b0: int, o0: int, p_lo: int, p_hi: int) -> vec_acc: ...
    return steps


def store_snippet(mt: int, nt: int, x_t: bool, nb: int, bf16: bool = False) -> str:
    """The staged store of an unsplit block (``stage=True``): ``y [B, Cout, Nout]`` is contiguous only along the
    nodes, and one warp owns one node, so a lane's own stores hit a different 32-byte sector each (32 sectors per
    store instruction; Nsight Compute on the H200 counted about one store sector per 2-byte output on resnet's
    stem at B = 512: fovi_lab/records/h200/logs/ncu_mma_picks_summary.txt).
    Here the ``nb`` warps of a block, ``nb`` consecutive nodes of one (batch block, channel block), put their
    accumulators (bias added in fp32, one rounding) into a shared tile ``[nb][channel][row]``, and the block
    writes it out with the nodes fastest: runs of ``nb`` adjacent outputs, ``nb`` times fewer sectors.

    On Warp's CPU device (no shared memory across a block's threads there) each lane stores its own elements.
    ``bf16``: y is bf16 (the same 16-bit tile)."""
    oc, br = 16 * mt, 8 * nt
    to_bits = "wp::float_to_bfloat16" if bf16 else "wp::float_to_half"
    rs = br + 2                      # tile row stride (halves): +2 spreads a lane group's rows over the banks
    bs, ns = (nt, 1) if x_t else (1, 8)
    return f"""{_store_header((0, 1, 2))}
#if defined(__CUDA_ARCH__)
    __shared__ unsigned short tile[{nb * oc * rs}];
    const int nl = threadIdx.x >> 5;                  // this warp's node within the block's {nb}
    const int n0 = n - nl;
    for (int mi = 0; mi < {mt}; ++mi)
        for (int nj = 0; nj < {nt}; ++nj)
            for (int e = 0; e < 4; ++e) {{
                const int ch = g * {2 * mt} + 2 * mi + (e >> 1);
                const int b = (2 * t + (e & 1)) * {bs} + nj * {ns};
                tile[(nl * {oc} + ch) * {rs} + b] = {to_bits}(acc[(mi * {nt} + nj) * 4 + e] + bias[o0 + ch]).u;
            }}
    __syncthreads();
    for (int i = threadIdx.x; i < {nb * oc * br}; i += blockDim.x) {{   // nodes fastest: runs of {nb} outputs
        const int l = i % {nb}, r = i / {nb};
        const int b = r % {br}, ch = r / {br};
        const int bb = b0 + b, cc = o0 + ch, n2 = n0 + l;
        if (bb < nbat && cc < nc && n2 < nn)
            *(unsigned short*)(yb + bb * sb + cc * sc + n2 * sn) = tile[(l * {oc} + ch) * {rs} + b];
    }}
    __syncthreads();                                   // the tile is reused by the block's next grid-stride step
#else
{_direct_loop(mt, nt, x_t, False, bf16)}
#endif
"""


def _store_header(dims: Tuple[int, int, int]) -> str:
    """The lane's fragment coordinates and the output's batch / channel / node extents and byte strides (``dims``:
    which axis of ``y`` is the batch, the channel and the node)."""
    bd, cd, nd = dims
    return f"""
    const int g = lane >> 2;
    const int t = lane & 3;
    const int nbat = y.shape[{bd}], nc = y.shape[{cd}], nn = y.shape[{nd}];
    char* yb = (char*)y.data;
    const size_t sb = (size_t)y.strides[{bd}], sc = (size_t)y.strides[{cd}], sn = (size_t)y.strides[{nd}];"""


def _direct_loop(mt: int, nt: int, x_t: bool, fp32: bool, bf16: bool = False) -> str:
    """Each lane stores its own ``4*mt*nt`` accumulators, guarded by the output's extents: element ``e`` of
    fragment ``(mi, nj)`` is channel ``o0 + 2*mt*g + 2*mi + e/2`` and batch row ``b0 + (2t + e%2)*bs + nj*ns``
    (``bs, ns = nt, 1`` for x^T's adjacent rows, ``1, 8`` otherwise). fp16 outputs get the bias added in fp32 and
    one rounding (to bf16 where ``bf16``); fp32 partials (the split p loop) are stored as they are."""
    bs, ns = (nt, 1) if x_t else (1, 8)
    et, to = ("wp::bfloat16", "wp::float_to_bfloat16") if bf16 else ("wp::half", "wp::float_to_half")
    value = "acc[k]" if fp32 else f"{to}(acc[k] + bias[cc])"
    return f"""    for (int mi = 0; mi < {mt}; ++mi)
        for (int nj = 0; nj < {nt}; ++nj)
            for (int e = 0; e < 4; ++e) {{
                const int k = (mi * {nt} + nj) * 4 + e;
                const int cc = o0 + g * {2 * mt} + 2 * mi + (e >> 1);
                const int bb = b0 + (2 * t + (e & 1)) * {bs} + nj * {ns};
                if (n < nn && bb < nbat && cc < nc)
                    *({'float' if fp32 else et}*)(yb + bb * sb + cc * sc + n * sn) = {value};
            }}"""


def direct_store_snippet(mt: int, nt: int, x_t: bool, dims: Tuple[int, int, int] = (0, 1, 2),
                         fp32: bool = False) -> str:
    """The store of the unstaged blocks: each lane writes its own accumulators into ``y`` (``dims``: the batch,
    channel and node axes of ``y``; ``(0, 1, 2)`` for the op's ``y [B, Cout, Nout]``, ``(1, 2, 0)`` for the dense
    ceiling's ``[Nout, B, Cout]`` and the split loop's fp32 ``part [S*Nout, B, Cout]``). The same code on the GPU
    and on Warp's CPU device."""
    return _store_header(dims) + "\n" + _direct_loop(mt, nt, x_t, fp32) + "\n"


def _mma_partial_store(mt: int, nt: int, x_t: bool):
    """The native store of the split p loop's fp32 partials ``part [S*Nout, B, Cout]`` (built once)."""
    def build(vec_acc):
        @wp.func_native(direct_store_snippet(mt, nt, x_t, (1, 2, 0), fp32=True))
        def store(y: wp.array3d(dtype=wp.float32), acc: vec_acc, b0: int, o0: int, n: int, lane: int): ...
        return store
    return _native(("partial", mt, nt, x_t), build)


def mma_direct_store(mt: int, nt: int, x_t: bool, nodes_first: bool = False, bf16: bool = False):
    """The store of the unstaged, unsplit blocks as an inlined Warp function (built once per block shape and
    layout): each lane writes its own ``4*mt*nt`` accumulators, the bias added in fp32 and one rounding to fp16,
    guarded by y's shape. Element ``e`` of fragment ``(mi, nj)`` is channel ``o0 + 2*mt*g + 2*mi + e/2`` (the
    fragment's row permutation undone) and batch row ``b0 + (2t + e%2)*BS + nj*NS`` (``BS, NS = nt, 1`` for
    x^T's adjacent rows, ``1, 8`` for x in place); ``y`` is the op's ``[B, Cout, Nout]``, or ``[Nout, B, Cout]``
    (``nodes_first``: the dense ceiling's); ``bf16``: y is bf16."""
    MT, NT, NF, BF = int(mt), int(nt), bool(nodes_first), bool(bf16)
    et = _elem(BF)
    BS, NS = (NT, 1) if x_t else (1, 8)

    def build(vec_acc):
        def store(y: wp.array3d(dtype=et), bias: wp.array1d(dtype=wp.float32), acc: None, b0: int, o0: int,
                  n: int, lane: int):
            g = lane // 4
            t2 = (lane % 4) * 2
            for mi in range(MT):
                for nj in range(NT):
                    for e in range(4):
                        ch = o0 + g * (2 * MT) + 2 * mi + e // 2
                        b = b0 + (t2 + e % 2) * BS + nj * NS
                        if wp.static(NF):
                            if b < y.shape[1] and ch < y.shape[2]:
                                y[n, b, ch] = et(acc[(mi * NT + nj) * 4 + e] + bias[ch])
                        else:
                            if b < y.shape[0] and ch < y.shape[1]:
                                y[b, ch, n] = et(acc[(mi * NT + nj) * 4 + e] + bias[ch])

        store.__annotations__["acc"] = vec_acc      # an object: Warp evaluates only string annotations
        return wp.func(name=f"fovi_mma_store_m{MT}n{NT}{'t' if x_t else ''}{'_nbo' if NF else ''}{'_bf16' if BF else ''}",
                       inline=True)(store)
    return _native(("direct", MT, NT, bool(x_t), NF, BF), build)


def _mma_store(mt: int, nt: int, x_t: bool, nb: int, bf16: bool = False):
    """The native staged store of a block shape, layout, node count per block and element type (built once)."""
    et = _elem(bf16)

    def build(vec_acc):
        @wp.func_native(store_snippet(mt, nt, x_t, nb, bf16))
        def store(y: wp.array3d(dtype=et), bias: wp.array1d(dtype=wp.float32), acc: vec_acc, b0: int,
                  o0: int, n: int, lane: int): ...
        return store
    return _native(("store", mt, nt, x_t, nb, bool(bf16)), build)


def _decorator(name: str, block_dim: int):
    if _wc.SHARED_KERNEL_MODULE is not None:      # the AOT tests put several kernels in one module
        return wp.kernel(enable_backward=False, module=_wc.SHARED_KERNEL_MODULE, name=name)
    return wp.kernel(enable_backward=False, module="unique", name=name,
                     module_options={"enable_backward": False, "fast_math": True, "block_dim": int(block_dim)})


def make_mma_kernel(m_tiles: int, n_tiles: int, block_dim: int = 128, split: bool = False, dense: bool = False,
                    w_native: bool = False, x_t: bool = False, k_steps: int = 1, stage: bool = False,
                    bf16: bool = False):
    """The ``mma`` kernel with ``m_tiles`` 16-channel tiles and ``n_tiles`` 8-row batch tiles per warp, walking
    the p loop ``k_steps`` k-steps (``16*k_steps`` p entries) per iteration.

    Launch: ``wp.launch(kernel, dim=(S*Nout, ceil(B / (8*n_tiles)), n_og*32), block_dim=...)`` with
    ``n_og = Cout_p / (16*m_tiles)``: the last dimension is (channel block, lane), so each warp of 32
    consecutive threads owns one (split, node, batch block, channel block). Arguments:

    * ``mma``:  ``x [B, Cin*Nin]`` fp16, ``wt = W^T [Q, Cout_p]`` fp16 (zero columns past Cout),
      ``il, wl [Nout, P64]`` int32, ``bias [Cout_p]`` fp32, ``y [B, Cout, Nout]`` fp16, ``p_len`` (a multiple
      of 16: the tables' last real column rounded up), ``n_og``;
    * ``split=True`` (``mmas``): ``part [S*Nout, B, Cout]`` fp32 instead of bias and y, then ``p_len``,
      ``p_chunk`` (a multiple of 16), ``n_og``, ``nout``;
    * ``w_native=True`` (``mmaw`` / ``mmasw``): ``wt`` is W itself, ``[Cout, Q]``, read in place (no per-call
      layout: what a training step or a CUDA-graph replay with a changing weight wants);
    * ``x_t=True`` (``mmat``): ``x`` is ``x^T [Cin*Nin, Bx]`` (``Bx`` a multiple of ``8*n_tiles``), each lane's
      batch rows adjacent: one vector load per p entry instead of ``n_tiles`` scalar ones (for large batches,
      where the per-call transpose is cheap next to the GEMM);
    * ``dense=True``: the same loop and operand layouts over dense operands, p entry k reading x column (x^T
      row) k and W^T row (W column) k: ``xd [Bx, Kd]`` (``x_t``: ``[Kd, Bx]``), ``wd [Kd, Cout_p]``
      (``w_native``: ``[Cout_p, Kd]``), ``bias``, ``y [Nout, B, Cout]``, ``kd``, ``n_og``: the ceiling of that
      config without gathers.

    ``stage=True`` (``mmao`` / ``mmato``, unsplit only): the block's ``block_dim / 32`` warps are consecutive nodes
    of one (batch block, channel block) and write y through a shared tile (:func:`store_snippet`). Launch:
    ``dim=(ceil(B / (8*n_tiles)), n_og, Nout_b*32)`` with ``Nout_b`` = Nout rounded up to the block's node count
    (the warps past Nout load nothing and store nothing, but take part in the block's barriers).

    ``k_steps`` > 1 issues the loads of that many k-steps before their MMAs: twice (four times) the loads in
    flight per warp for 2x (4x) the operand registers. ``p_len`` and ``p_chunk`` (and ``kd``) must then be
    multiples of ``16*k_steps``; the tables' P64 columns always hold ``p_len`` rounded up to 64.

    ``bf16=True``: x, W (and y) are bf16 instead of fp16 (``mma.sync ... .bf16.bf16``, fp32 accumulation, the bias
    added in fp32, one rounding to bf16); the kernel's name ends in ``_bf16``.
    """
    init_warp()
    MT, NT = int(m_tiles), int(n_tiles)
    if MT < 1 or NT < 1 or block_dim % 32:
        raise ValueError(f"mma kernel: m_tiles={MT}, n_tiles={NT} must be >= 1 and block_dim={block_dim} a "
                         f"multiple of 32")
    KU = int(k_steps)
    if KU not in (1, 2, 4):
        raise ValueError(f"mma kernel: k_steps={KU} must be 1, 2 or 4")
    if x_t and NT not in (1, 2, 4, 8):
        raise ValueError(f"mma kernel: x^T loads need n_tiles in (1, 2, 4, 8), got {NT}")
    WN, XT, ST = bool(w_native), bool(x_t), bool(stage) and not dense and not split
    if stage and (split or dense):
        raise ValueError("mma kernel: the staged store is for unsplit, gathered kernels")
    BF = bool(bf16)
    et = _elem(BF)
    steps = _mma_steps(MT, NT, dense, WN, XT, KU, BF)
    OC, BR = 16 * MT, 8 * NT
    fam = "mma" + ("s" if split else "") + ("w" if WN else "") + ("t" if XT else "") + ("o" if ST else "")
    kname = (f"fovi_fwd_{fam}{'_dense' if dense else ''}_m{MT}n{NT}{f'k{16 * KU}' if KU > 1 else ''}b{block_dim}"
             f"{'_bf16' if BF else ''}")

    if ST:
        store = _mma_store(MT, NT, XT, int(block_dim) // 32, BF)
    elif split:                             # fp32 partials [S*Nout, B, Cout]
        store = _mma_partial_store(MT, NT, XT)
    else:                                   # the dense ceiling writes [Nout, B, Cout]; the op's y is [B, Cout, Nout]
        store = mma_direct_store(MT, NT, XT, nodes_first=dense, bf16=BF)
    if dense:
        @_decorator(kname, block_dim)
        def kernel(xd: wp.array2d(dtype=et), wd: wp.array2d(dtype=et),
                   bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=et), kd: int, n_og: int):
            n, bg, tl = wp.tid()
            lane = tl % 32
            b0 = bg * BR
            o0 = (tl // 32) * OC
            acc = steps(xd, wd, lane, b0, o0, 0, kd)
            store(y, bias, acc, b0, o0, n, lane)
    elif split:
        @_decorator(kname, block_dim)
        def kernel(x: wp.array2d(dtype=et), wt: wp.array2d(dtype=et),
                   il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32),
                   part: wp.array3d(dtype=wp.float32), p_len: int, p_chunk: int, n_og: int, nout: int):
            ns, bg, tl = wp.tid()
            lane = tl % 32
            n = ns % nout
            p_lo = (ns // nout) * p_chunk
            b0 = bg * BR
            o0 = (tl // 32) * OC
            acc = steps(x, wt, il, wl, n, lane, b0, o0, p_lo, wp.min(p_lo + p_chunk, p_len))
            store(part, acc, b0, o0, ns, lane)
    else:
        @_decorator(kname, block_dim)
        def kernel(x: wp.array2d(dtype=et), wt: wp.array2d(dtype=et),
                   il: wp.array2d(dtype=wp.int32), wl: wp.array2d(dtype=wp.int32),
                   bias: wp.array1d(dtype=wp.float32), y: wp.array3d(dtype=et), p_len: int, n_og: int):
            i, j, tl = wp.tid()
            lane = tl % 32
            if wp.static(ST):     # grid (batch block, channel block, node*32): a block's warps are consecutive nodes
                nout = y.shape[2]
                n = tl // 32
                b0 = i * BR
                o0 = j * OC
                p_hi = wp.where(n < nout, p_len, 0)       # the block's padding warps: no loads, no stores
                acc = steps(x, wt, il, wl, wp.min(n, nout - 1), lane, b0, o0, 0, p_hi)
            else:                 # grid (node, batch block, channel block*32)
                n = i
                b0 = j * BR
                o0 = (tl // 32) * OC
                acc = steps(x, wt, il, wl, n, lane, b0, o0, 0, p_len)
            store(y, bias, acc, b0, o0, n, lane)

    kernel.fovi_tiles = (fam + ("_dense" if dense else ""), BR, OC, MMA_K * KU, 1, int(block_dim))
    kernel.fovi_dtype = "bfloat16" if BF else "float16"
    return kernel
