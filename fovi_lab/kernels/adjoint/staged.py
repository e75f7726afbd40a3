"""The staged adjoint kernel factories: a per-node GEMM into a stage, then a reverse-CSR reduction.

grad_input, per output node ``n`` (``g_n = grad_y[:, :, n]``, ``W_n`` the gathered weight rows)::

    dA[n, p, b]   = sum_o W[o, weight_linear[n, p]] * g[b, o, n]          (stage: [Nout, P64, B])
    dx[b, j]      = sum over the (n, p) with input_linear[n, p] = j of dA[n, p, b]

grad_weight, per node::

    dWeff[n, p, o] = sum_b xpad[b, input_linear[n, p]] * g[b, o, n]        (stage: [Nout, P64, Cout])
    dW[o, q]       = sum over the (n, p) with weight_linear[n, p] = q of dWeff[n, p, o]

The reductions walk the meta's reverse CSR lists in a fixed order (no atomics), so dx and dW are bitwise
repeatable. Operands are fp16, or bf16 (``bf16=True``, config names ``<base>_bf16``: bf16 kernels stage in fp32);
the GEMMs accumulate in fp32 either way. Every stage entry the reduction reads is written by the GEMM (the pad column p >= P is never
listed), and outputs are prefilled with NaN in the tests so an unwritten entry shows.
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

from typing import Optional

import fovi_lab.settings as settings
from fovi_lab.kernels.common import init_warp, wp
from fovi_lab.kernels.built import built
from fovi_lab.kernels.adjoint.configs import _GI_TILE_O, _GW_TILE_B, _MODULE_OPTIONS
from fovi_lab.kernels.families.registry import ADJOINT_FAMILIES, adjoint_point


def _mathdx_env() -> Optional[bool]:
    """``FOVI_WARP_MATHDX=0/1`` forces the scalar / cuBLASDx tile GEMM (shared with the forward kernels);
    unset: Warp's own default (cuBLASDx on CUDA)."""
    return settings.get("FOVI_WARP_MATHDX")


def _kernel_options(block_dim: Optional[int], module_options: Optional[dict]) -> dict:
    # no backward pass in the module: these kernels have none, and tile_matmul takes bf16 tiles only without one
    opts = dict(_MODULE_OPTIONS, enable_backward=False)
    mathdx = _mathdx_env()
    if mathdx is not None:
        opts["enable_mathdx_gemm"] = mathdx
    if block_dim is not None:
        # The module's block_dim is what an AOT compile targets; launches pass it again anyway.
        opts["block_dim"] = int(block_dim)
    if module_options:
        opts.update(module_options)
    return opts


def _kernel_decorator(tag: str, opts: dict, module: Optional[str]):
    """``@wp.kernel`` in its own unique module (the default), or in the named shared ``module``.

    A shared module (used by the AOT test to compile many kernels in one NVRTC call) takes its options
    from ``wp.set_module_options(..., module=name)``; per-kernel names keep the kernels apart.
    """
    if module is None:
        return wp.kernel(enable_backward=False, module="unique", module_options=opts, name=tag)
    return wp.kernel(enable_backward=False, module=module, name=tag)


def _tag(kernel, fp32_stage: bool, bf16: bool = False):
    # Remember the stage and operand dtypes on the kernel (the canaries need them; the signature is fixed by the seed).
    kernel.fovi_fp32_stage = bool(fp32_stage)
    kernel.fovi_bf16 = bool(bf16)
    return kernel


def _stage_dtype(fp32_stage: bool):
    return wp.float32 if fp32_stage else wp.float16


def _elem(bf16: bool, fp32_stage: bool):
    """The operands' element type: fp16, or bf16 (``bf16=True``), whose kernels stage in fp32 only: a bf16 stage
    would round each staged product sum to 8 mantissa bits before the reduction adds them."""
    if bf16 and not fp32_stage:
        raise ValueError("bf16: the bf16 staged kernels stage in fp32 (fp32_stage=True)")
    return wp.bfloat16 if bf16 else wp.float16


# The stage GEMM of every gi and gw config is one gathered-row tile GEMM per node ``n``::
#
#     out[n, p, c] = sum_k src[table[n, p], k] * g[n, k, c]          (fp32 accumulate; fp16 or fp32 stored)
#
# gi: table = weight_linear, src = W^T [Q, Cout_pad], g = g_nob [Nout, Cout_pad, Bpad], out = dA (k: Cout, c: batch);
# gw: table = input_linear, src = x^T [Cin*Nin+1, Bpad], g = g_nbo [nc, Bpad, Cout_pad], out = dWeff (k: batch,
# c: Cout). A config's version picks the CTA loop (below); its tiles are (tile_p, the contraction tile, the output
# column tile). Every kernel takes ``(table, src, g, n_p_tiles, n_k_tiles, out)``.
_GRID3 = ("3", "3p", "4")       # grid (n, p_tile, c_tile); the others (n, c_tile) with the p loop in the CTA


#: Per kind: the letters of its column tile and its contraction tile in a kernel's name (gi: batch rows ``b``, output
#: channels ``o``; gw: output channels ``n``, batch rows ``b``), and the contraction tile's default.
_TILES_OF_KIND = {"gi": ("b", "o", _GI_TILE_O), "gw": ("n", "b", _GW_TILE_B)}


def _stage_tag(kind: str, version, tile_p: int, tile_wide: int, tile_k: int, fp32_stage: bool, bf16: bool) -> str:
    """The kernel name: ``fovi_gi<version>_p<tile_p>b<tile_b>o<tile_o>_<f16|f32>[_bf16]`` (gi) or
    ``fovi_gw<version>_p<tile_p>n<tile_n>b<tile_kb>_<f16|f32>[_bf16]`` (gw)."""
    wide, inner, _ = _TILES_OF_KIND[kind]
    tiles = f"{wide}{tile_wide}{inner}{tile_k}"
    return f"fovi_{kind}{version}_p{tile_p}{tiles}_{'f32' if fp32_stage else 'f16'}" + ("_bf16" if bf16 else "")


def _stage_body(tag: str, loop: str, staged_rows: bool, P: int, K: int, C: int, et, sd, fp32_stage: bool):
    """The CTA body of a stage kernel (an inlined Warp function, built once per kernel name) for one node:
    ``body(table_n, src, g_n, row0, p_lo, p_hi, ct, n_k_tiles, out_n)`` computes its p tiles ``[p_lo, p_hi)``
    of output column tile ``ct`` (``ct`` pairs of tiles for loop "4"). ``loop``:

    * "2" / "3": load a p tile's table entries, then per k tile gather the ``[P, K]`` rows of ``src`` and load
      the ``[K, C]`` tile of ``g`` into shared tiles and accumulate their product (``staged_rows``: the rows were
      gathered beforehand, ``src[row0 + p]``, and are plain-loaded);
    * "3p" / "2p": the same with a register prefetch of the next k step's (2p: the next (p, k) step's) gather
      and g tile, issued before the current ``tile_matmul`` and copied into the shared operand tiles after it;
    * "4": two adjacent column tiles per CTA, each gathered tile feeding both accumulators.
    """
    def make():
        def store(out_n: wp.array2d(dtype=sd), acc: wp.tile(dtype=wp.float32, shape=(P, C)), p_off: int,
                  c_off: int):
            if wp.static(fp32_stage):
                wp.tile_store(out_n, acc, offset=(p_off, c_off))
            else:
                wp.tile_store(out_n, wp.tile_astype(acc, wp.float16), offset=(p_off, c_off))

        store = wp.func(name=f"{tag}_store", inline=True)(store)

        def tiles(table_n, src, g_n, row0, p_lo, p_hi, ct, n_k_tiles, out_n):
            c_off = ct * C
            for pt in range(p_lo, p_hi):
                p_off = pt * P
                if wp.static(not staged_rows):
                    rows = wp.tile_load(table_n, shape=P, offset=p_off)
                acc = wp.tile_zeros(shape=(P, C), dtype=wp.float32)
                for kt in range(n_k_tiles):
                    k_off = kt * K
                    if wp.static(staged_rows):
                        a = wp.tile_load(src, shape=(P, K), offset=(row0 + p_off, k_off), storage="shared")
                    else:
                        a = wp.tile_load_indexed(src, indices=rows, shape=(P, K), offset=(0, k_off), axis=0,
                                                 storage="shared")
                    b = wp.tile_load(g_n, shape=(K, C), offset=(k_off, c_off), storage="shared")
                    wp.tile_matmul(a, b, acc)
                store(out_n, acc, p_off, c_off)

        def prefetch_k(table_n, src, g_n, row0, p_lo, p_hi, ct, n_k_tiles, out_n):
            p_off = p_lo * P
            c_off = ct * C
            rows = wp.tile_load(table_n, shape=P, offset=p_off, storage="shared")
            a_sh = wp.tile_zeros(shape=(P, K), dtype=et, storage="shared")
            b_sh = wp.tile_zeros(shape=(K, C), dtype=et, storage="shared")
            a_r = wp.tile_load_indexed(src, indices=rows, shape=(P, K), offset=(0, 0), axis=0)
            b_r = wp.tile_load(g_n, shape=(K, C), offset=(0, c_off))
            acc = wp.tile_zeros(shape=(P, C), dtype=wp.float32)
            for kt in range(n_k_tiles):
                wp.tile_assign(a_sh, a_r)
                wp.tile_assign(b_sh, b_r)
                k1 = wp.min(kt + 1, n_k_tiles - 1) * K
                a_r = wp.tile_load_indexed(src, indices=rows, shape=(P, K), offset=(0, k1), axis=0)
                b_r = wp.tile_load(g_n, shape=(K, C), offset=(k1, c_off))
                wp.tile_matmul(a_sh, b_sh, acc)
            store(out_n, acc, p_off, c_off)

        def prefetch_pk(table_n, src, g_n, row0, p_lo, p_hi, ct, n_k_tiles, out_n):
            c_off = ct * C
            a_sh = wp.tile_zeros(shape=(P, K), dtype=et, storage="shared")
            b_sh = wp.tile_zeros(shape=(K, C), dtype=et, storage="shared")
            rows = wp.tile_load(table_n, shape=P, offset=0, storage="shared")
            a_r = wp.tile_load_indexed(src, indices=rows, shape=(P, K), offset=(0, 0), axis=0)
            b_r = wp.tile_load(g_n, shape=(K, C), offset=(0, c_off))
            n_steps = p_hi * n_k_tiles
            for pt in range(p_hi):
                acc = wp.tile_zeros(shape=(P, C), dtype=wp.float32)
                for kt in range(n_k_tiles):
                    wp.tile_assign(a_sh, a_r)
                    wp.tile_assign(b_sh, b_r)
                    # prefetch the next step (the last step re-loads itself: unconditional loads keep
                    # the register consumers after the matmul)
                    s1 = wp.min(pt * n_k_tiles + kt + 1, n_steps - 1)
                    pt1 = s1 // n_k_tiles
                    kt1 = s1 - pt1 * n_k_tiles
                    rows1 = wp.tile_load(table_n, shape=P, offset=pt1 * P, storage="shared")
                    a_r = wp.tile_load_indexed(src, indices=rows1, shape=(P, K), offset=(0, kt1 * K), axis=0)
                    b_r = wp.tile_load(g_n, shape=(K, C), offset=(kt1 * K, c_off))
                    wp.tile_matmul(a_sh, b_sh, acc)
                store(out_n, acc, pt * P, c_off)

        def pair(table_n, src, g_n, row0, p_lo, p_hi, ct, n_k_tiles, out_n):
            p_off = p_lo * P
            c0 = ct * (2 * C)
            c1 = c0 + C
            rows = wp.tile_load(table_n, shape=P, offset=p_off)
            acc0 = wp.tile_zeros(shape=(P, C), dtype=wp.float32)
            acc1 = wp.tile_zeros(shape=(P, C), dtype=wp.float32)
            for kt in range(n_k_tiles):
                k_off = kt * K
                a = wp.tile_load_indexed(src, indices=rows, shape=(P, K), offset=(0, k_off), axis=0,
                                         storage="shared")
                b0 = wp.tile_load(g_n, shape=(K, C), offset=(k_off, c0), storage="shared")
                wp.tile_matmul(a, b0, acc0)
                b1 = wp.tile_load(g_n, shape=(K, C), offset=(k_off, c1), storage="shared")
                wp.tile_matmul(a, b1, acc1)
            store(out_n, acc0, p_off, c0)
            store(out_n, acc1, p_off, c1)

        fn = {"2": tiles, "3": tiles, "3p": prefetch_k, "2p": prefetch_pk, "4": pair}[loop]
        fn.__annotations__ = dict(table_n=wp.array(dtype=wp.int32), src=wp.array2d(dtype=et), g_n=wp.array2d(dtype=et),
                                  row0=int, p_lo=int, p_hi=int, ct=int, n_k_tiles=int, out_n=wp.array2d(dtype=sd))
        return wp.func(name=f"{tag}_body", inline=True)(fn)
    return built(("staged", tag, loop, staged_rows), make)


def make_grad_stage_kernel(kind: str, version, tile_p: int, tile_wide: int, fp32_stage: bool, *,
                           tile_k: Optional[int] = None, block_dim: Optional[int] = None,
                           module_options: Optional[dict] = None, module: Optional[str] = None, bf16: bool = False):
    """The stage kernel of a gi (``kind="gi"``: ``tile_wide`` = batch tile, ``tile_k`` = Cout chunk, default 64) or
    gw (``"gw"``: ``tile_wide`` = Cout tile, ``tile_k`` = batch chunk, default 64) config of ``version`` 2, 3, 4,
    "2p", "3p", "2i" or "3i" (the per-version factories below describe each).

    Launch ``wp.launch_tiled(k, dim=..., block_dim=...)`` (the grid:
    :func:`fovi_lab.kernels.adjoint.staged_build._stage_dims`) with inputs ``(table [N, P64] i32, src, g,
    n_p_tiles = P64 // tile_p, n_k_tiles)`` and output ``out [N, P64, wide]`` (fp16, or fp32 with ``fp32_stage``);
    operands fp16, or bf16 with ``bf16`` (which stages in fp32 only).

    Staged-operand ("i") versions, for the Cin = 3 stems: there every neighbour contributes 3 contraction rows, so
    the gathered operand tile (rows of W^T for gi, rows of x^T for gw) is a scalar, bounds-checked
    ``tile_load_indexed`` that costs more than the tile GEMM. Here the plan copies those rows once into a dense
    operand (``weff[n*P64 + p] = W^T[weight_linear[n, p]]`` per call for gi; ``at[nl*P64 + p] =
    xt[input_linear[n0+nl, p]]`` per node chunk for gw, :func:`fovi_lab.kernels.common.gather_rows`) and the kernel
    plain-loads it (vectorised): "2i" mirrors gi2's grid, "3i" gi3's or gw3's; the table argument is unused, and
    the row of node ``n``'s tile ``p`` is ``n * n_p_tiles * tile_p + p``. Memory: gw's staged rows count against
    the stage budget (they shrink the node chunk); gi's ``weff`` is ``Nout*P64*Cout_pad*2`` bytes whatever the
    batch (alexnet L0: 95 MB), outside it.
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    et = _elem(bf16, fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    P, C, K = int(tile_p), int(tile_wide), int(_TILES_OF_KIND[kind][2] if tile_k is None else tile_k)
    tag = _stage_tag(kind, version, P, C, K, fp32_stage, bf16)
    loop = str(version).rstrip("i")
    GRID3 = loop in _GRID3
    body = _stage_body(tag, loop, str(version).endswith("i"), P, K, C, et, sd, fp32_stage)

    @_kernel_decorator(tag, opts, module)
    def stage(table: wp.array2d(dtype=wp.int32), src: wp.array2d(dtype=et), g: wp.array3d(dtype=et),
              n_p_tiles: int, n_k_tiles: int, out: wp.array3d(dtype=sd)):
        if wp.static(GRID3):
            n, pt, ct = wp.tid()
            p_lo = pt
            p_hi = pt + 1
        else:
            n, ct = wp.tid()
            p_lo = 0
            p_hi = n_p_tiles
        body(table[n], src, g[n], n * n_p_tiles * P, p_lo, p_hi, ct, n_k_tiles, out[n])

    return _tag(stage, fp32_stage, bf16)


#: Every version takes the staged-operand ("i") ones too.
make_grad_staged_operand_kernel = make_grad_stage_kernel


def _named(factory, name: str, doc: str):
    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = doc
    return factory


def _gi_version(version, doc: str):
    """The public factory of one gi version: ``(tile_p, tile_b, fp32_stage, *, tile_o=64, ...)`` (``block_dim``,
    ``module_options``, ``module``, ``bf16`` as :func:`make_grad_stage_kernel`)."""
    def factory(tile_p: int, tile_b: int, fp32_stage: bool, *, tile_o: int = _GI_TILE_O, **kw):
        return make_grad_stage_kernel("gi", version, tile_p, tile_b, fp32_stage, tile_k=tile_o, **kw)
    return _named(factory, f"make_grad_input_stage{version}_kernel", doc)


def _gw_version(version, doc: str):
    """The public factory of one gw version: ``(tile_p, tile_n, fp32_stage, *, tile_b=64, ...)``."""
    def factory(tile_p: int, tile_n: int, fp32_stage: bool, *, tile_b: int = _GW_TILE_B, **kw):
        return make_grad_stage_kernel("gw", version, tile_p, tile_n, fp32_stage, tile_k=tile_b, **kw)
    return _named(factory, f"make_grad_weight_stage{version}_kernel", doc)


make_grad_input_stage2_kernel = _gi_version(2, """
    v2 gi staging: one CTA per ``(n, b_tile)``, the P64 loop inside the CTA.

    Launch ``wp.launch_tiled(k, dim=(Nout, Bpad // tile_b), block_dim=...)`` with inputs
    ``(weight_linear [Nout, P64] i32, wt [Q, Cout_pad] f16, g_nob [Nout, Cout_pad, Bpad] f16,
    n_p_tiles = P64 // tile_p, n_o_tiles = Cout_pad // tile_o)`` and output
    ``dA_stage [Nout, P64, Bpad]`` (fp16 or fp32)::

        dA_stage[n, p, b] = sum_o W^T[weight_linear[n, p], o] * g_nob[n, o, b]     (fp32 accumulate)

    Keeping the P loop in the CTA amortises per-CTA fixed costs over P64/tile_p accumulator
    rounds; the gathered W tile is directly the left operand (rows of W^T), so no transpose.
    """)
make_grad_input_stage3_kernel = _gi_version(3, """
    v3 gi staging: a 3-D ``(n, p_tile, b_tile)`` grid, the o loop inside the CTA.

    Launch ``dim=(Nout, P64 // tile_p, Bpad // tile_b)``; same arguments as gi2 (``n_p_tiles`` unused).
    gi2's ``(n, b_tile)`` grid has only ``Nout * B / tile_b`` CTAs, each walking all P64/tile_p tiles:
    for small-Nout layers (alexnet L2-L4: 60 nodes, resnet layer3: 16) that is fewer CTAs than the GPU
    has SMs. Here every output tile is its own CTA (the gw3 idea applied to dA).
    """)
make_grad_input_stage3p_kernel = _gi_version("3p", """
    gi3 with a register prefetch of the next o step's W gather and g tile (see gi2p).""")
make_grad_input_stage2p_kernel = _gi_version("2p", """
    gi2 with a register prefetch (software pipelining): same arguments, grid and result as gi2.

    Warp's tile GEMM does not overlap loads with math inside a CTA (load, sync, matmul, sync). Here
    the next (p tile, o tile) step's W gather and g tile are issued into *registers* before the
    current step's ``tile_matmul`` and copied into the shared operand tiles after it, so their
    global-load latency hides behind the math (the forward's ``gp``/``nmp`` idea).
    """)
make_grad_weight_stage2_kernel = _gw_version(2, """
    v2 gw staging: one CTA per ``(n, o_tile)``, P64 loop in the CTA, transposed-x operand.

    Launch ``dim=(nc, Cout_pad // tile_n)`` with inputs ``(input_linear [nc, P64] i32,
    xt [Cin*Nin+1, Bpad] f16, g_nbo [nc, Bpad, Cout_pad] f16, n_p_tiles, n_b_tiles)`` and output
    ``dWeff [nc, P64, Cout_pad]``::

        dWeff[n, p, o] = sum_b xt[input_linear[n, p], b] * g_nbo[n, b, o]          (fp32 accumulate)

    ``xt`` is batch-contiguous, so the indexed gather reads contiguous 128-byte rows and is
    directly the ``A_n^T`` tile (no ``tile_transpose``).
    """)
make_grad_weight_stage3_kernel = _gw_version(3, """
    v3 gw staging: a 3-D ``(n, p_tile, o_tile)`` grid with the v2 transposed-x operand.

    Launch ``dim=(nc, P64 // tile_p, Cout_pad // tile_n)``; same arguments as v2 (``n_p_tiles`` is
    unused). For small-Nout shapes the v2 ``(n, o_tile)`` grid under-occupies the GPU; this keeps
    per-CTA work small but parallel (one accumulator, B/64 GEMM steps per CTA).
    """)
make_grad_weight_stage4_kernel = _gw_version(4, """
    v4 gw staging: v3's 3-D grid, but each CTA computes TWO adjacent o tiles.

    Launch ``dim=(nc, P64 // tile_p, Cout_pad // (2*tile_n))``; ``g_nbo``/``dWeff`` must be padded to
    a multiple of ``2*tile_n`` columns. Each gathered ``xt`` tile feeds both accumulators, halving
    the x-gather stream (the forward's weight-reuse idea applied to the batch contraction).
    """)
make_grad_weight_stage3p_kernel = _gw_version("3p", """
    gw3 with a register prefetch of the next b step's ``xt`` gather and ``g`` tile (see gi2p).""")


def make_dx_csr_kernel(fp32_stage: bool, *, module_options: Optional[dict] = None, module: Optional[str] = None):
    """Reverse-CSR grad-input reduction (scalar, one thread per ``(m, c, b)``, b fastest).

    Launch ``wp.launch(k, dim=(Nin, Cin, Bc))`` with ``rev_rowptr [Nin+1] i32``, ``rev_row [nnz] i32``
    (decoded ``n_i*P64 + k_i``), ``da [Nout*P64, Bstage]`` (the stage viewed 2-D), ``k`` and output
    ``out[c, m, b]`` (any strides)::

        out[c, m, b] = sum_{i in [rowptr[m], rowptr[m+1])} da[rev_row[i] + c*K, b]      (fp32, in order)

    Threads of one warp share (m, c) and read consecutive b: broadcast index loads, coalesced
    stage loads. No atomics, so the result is deterministic.
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(None, module_options)
    tag = f"fovi_dx_csr_{'f32' if fp32_stage else 'f16'}"

    @_kernel_decorator(tag, opts, module)
    def dx_csr(rowptr: wp.array(dtype=wp.int32), rev_row: wp.array(dtype=wp.int32),
               da: wp.array2d(dtype=sd), k: int, out: wp.array3d(dtype=wp.float32)):
        m, c, b = wp.tid()
        ck = c * k
        i = rowptr[m]
        e = rowptr[m + 1]
        acc = wp.float32(0.0)
        # 8 (then 4) independent loads in flight, then the adds in index order: the same fp32 sum, bit for
        # bit, as one element at a time. (With 4 in flight the reductions used a small part of the H200's HBM
        # bandwidth; 8 made them faster: the CSR reductions of 2026-11-29 in fovi_lab/records/h200/backward.jsonl.gz.)
        while i + 8 <= e:
            v0 = wp.float32(da[rev_row[i] + ck, b])
            v1 = wp.float32(da[rev_row[i + 1] + ck, b])
            v2 = wp.float32(da[rev_row[i + 2] + ck, b])
            v3 = wp.float32(da[rev_row[i + 3] + ck, b])
            v4 = wp.float32(da[rev_row[i + 4] + ck, b])
            v5 = wp.float32(da[rev_row[i + 5] + ck, b])
            v6 = wp.float32(da[rev_row[i + 6] + ck, b])
            v7 = wp.float32(da[rev_row[i + 7] + ck, b])
            acc = (((((((acc + v0) + v1) + v2) + v3) + v4) + v5) + v6) + v7
            i += 8
        while i + 4 <= e:
            v0 = wp.float32(da[rev_row[i] + ck, b])
            v1 = wp.float32(da[rev_row[i + 1] + ck, b])
            v2 = wp.float32(da[rev_row[i + 2] + ck, b])
            v3 = wp.float32(da[rev_row[i + 3] + ck, b])
            acc = (((acc + v0) + v1) + v2) + v3
            i += 4
        while i < e:
            acc += wp.float32(da[rev_row[i] + ck, b])
            i += 1
        out[c, m, b] = acc

    return _tag(dx_csr, fp32_stage)


def row_sum_func():
    """``row_sum(rowptr, cols, vals, off, m)``: the fp32 sum of ``vals[off + cols[i]]`` over row ``m`` of a CSR list
    (``i`` in ``[rowptr[m], rowptr[m+1])``), in index order, as an inlined Warp function (built once). Four
    independent loads are issued before their adds, which keep the index order: the same fp32 sum, bit for bit, as
    one element at a time."""
    def make():
        @wp.func(name="fovi_csr_row_sum_f32", inline=True)
        def row_sum(rowptr: wp.array(dtype=wp.int32), cols: wp.array(dtype=wp.int32),
                    vals: wp.array(dtype=wp.float32), off: int, m: int):
            i = rowptr[m]
            e = rowptr[m + 1]
            acc = wp.float32(0.0)
            while i + 4 <= e:
                v0 = vals[off + cols[i]]
                v1 = vals[off + cols[i + 1]]
                v2 = vals[off + cols[i + 2]]
                v3 = vals[off + cols[i + 3]]
                acc = (((acc + v0) + v1) + v2) + v3
                i += 4
            while i < e:
                acc += vals[off + cols[i]]
                i += 1
            return acc
        return row_sum
    return built(("staged", "row_sum"), make)


def make_dx_taps_kernel(fp32_stage: bool = True, *, module_options: Optional[dict] = None,
                        module: Optional[str] = None):
    """Reverse-CSR grad-input reduction of the tap-expanded stage (scalar, one thread per ``(b, c, m)``, m fastest).

    Launch ``wp.launch(k, dim=(B, Cin, Nin))`` with ``rev_rowptr [Nin+1] i32``, ``rev_taps [nnz] i32`` (each entry
    ``(n, k)`` of the reverse lists as ``rf[n, k]*Nout + n``: :func:`fovi_lab.graph.meta.reverse_taps`), the stage
    ``s [B, Q*Nout]`` fp32 (``S[b, c*V + t, n]`` flattened: :func:`fovi_lab.graph.meta.expanded_meta`),
    ``vn = V*Nout`` and output ``out[b, c, m]`` (any strides)::

        out[b, c, m] = sum_{i in [rowptr[m], rowptr[m+1])} s[b, c*vn + rev_taps[i]]      (fp32, in order)

    Threads of one warp share (b, c) and take consecutive input nodes: coalesced stores, and stage reads within
    row b's slice of ``Q*Nout`` values (neighbouring nodes read neighbouring output nodes). No atomics, so the
    result is deterministic.
    """
    if not fp32_stage:
        raise ValueError("fp32_stage: the tap-expanded stage is fp32 (the split tensor-core configs' output)")
    init_warp()
    opts = _kernel_options(None, module_options)
    row_sum = row_sum_func()

    @_kernel_decorator("fovi_dx_taps_f32", opts, module)
    def dx_taps(rowptr: wp.array(dtype=wp.int32), rev_taps: wp.array(dtype=wp.int32),
                s: wp.array2d(dtype=wp.float32), vn: int, out: wp.array3d(dtype=wp.float32)):
        b, c, m = wp.tid()
        out[b, c, m] = row_sum(rowptr, rev_taps, s[b], c * vn, m)

    return _tag(dx_taps, True)


_SEARCH_FUNC = None


def _search_func():
    """``_first_not_below(arr, lo, hi, v)``: first i in [lo, hi) with arr[i] >= v, else hi.

    Not ``wp.lower_bound``: in Warp 1.19 it returns ``hi - 1`` (not ``hi``) when every element is
    below ``v``, which would drop or duplicate a term at a chunk boundary.
    """
    global _SEARCH_FUNC
    if _SEARCH_FUNC is None:
        @wp.func
        def _first_not_below(arr: wp.array(dtype=wp.int32), lo: int, hi: int, v: int):
            a = lo
            b = hi
            while a < b:
                mid = a + (b - a) // 2
                if arr[mid] < v:
                    a = mid + 1
                else:
                    b = mid
            return a

        _SEARCH_FUNC = _first_not_below
    return _SEARCH_FUNC


def make_dw_csr_kernel(fp32_stage: bool, *, module_options: Optional[dict] = None, module: Optional[str] = None):
    """Weight-row reverse-index grad-weight reduction (scalar, one thread per ``(q, o)``, o fastest).

    Launch ``wp.launch(k, dim=(Q, Cout))`` with ``w_rowptr [Q+1] i32``, ``w_col [nnz_w] i32``
    (flat ``j = n*P64 + p``, ascending within a row), the stage ``dweff [nc*P64, Cout_pad]`` holding
    the flat entries ``[j_lo, j_hi)``, ``j_lo``, ``j_hi``, ``accumulate`` and output
    ``dwt [Q, Cout_pad]`` fp32::

        dwt[q, o] (+)= sum_{i in row q, j_lo <= w_col[i] < j_hi} dweff[w_col[i] - j_lo, o]

    Chunks of nodes are processed in ascending order and each row's entries are ascending in j, so
    every ``dwt[q, o]`` sees the same fp32 addition sequence whatever the chunking: deterministic.
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(None, module_options)
    tag = f"fovi_dw_csr_{'f32' if fp32_stage else 'f16'}"
    _first_not_below = _search_func()

    @_kernel_decorator(tag, opts, module)
    def dw_csr(rowptr: wp.array(dtype=wp.int32), w_col: wp.array(dtype=wp.int32),
               dweff: wp.array2d(dtype=sd), j_lo: int, j_hi: int, accumulate: int,
               dwt: wp.array2d(dtype=wp.float32)):
        q, o = wp.tid()
        s = rowptr[q]
        e = rowptr[q + 1]
        if j_lo > 0:
            s = _first_not_below(w_col, s, e, j_lo)
        if j_hi < 2147483647:
            e = _first_not_below(w_col, s, e, j_hi)
        acc = wp.float32(0.0)
        if accumulate != 0:
            acc = dwt[q, o]
        i = s
        while i + 8 <= e:   # 8 (then 4) loads in flight, adds in index order (bitwise the sequential sum)
            v0 = wp.float32(dweff[w_col[i] - j_lo, o])
            v1 = wp.float32(dweff[w_col[i + 1] - j_lo, o])
            v2 = wp.float32(dweff[w_col[i + 2] - j_lo, o])
            v3 = wp.float32(dweff[w_col[i + 3] - j_lo, o])
            v4 = wp.float32(dweff[w_col[i + 4] - j_lo, o])
            v5 = wp.float32(dweff[w_col[i + 5] - j_lo, o])
            v6 = wp.float32(dweff[w_col[i + 6] - j_lo, o])
            v7 = wp.float32(dweff[w_col[i + 7] - j_lo, o])
            acc = (((((((acc + v0) + v1) + v2) + v3) + v4) + v5) + v6) + v7
            i += 8
        while i + 4 <= e:
            v0 = wp.float32(dweff[w_col[i] - j_lo, o])
            v1 = wp.float32(dweff[w_col[i + 1] - j_lo, o])
            v2 = wp.float32(dweff[w_col[i + 2] - j_lo, o])
            v3 = wp.float32(dweff[w_col[i + 3] - j_lo, o])
            acc = (((acc + v0) + v1) + v2) + v3
            i += 4
        while i < e:
            acc += wp.float32(dweff[w_col[i] - j_lo, o])
            i += 1
        dwt[q, o] = acc

    return _tag(dw_csr, fp32_stage)


#: The kernel factories of this module by name: a family's
#: :meth:`~fovi_lab.kernels.families.adjoint_base.AdjointFamily.factory` names the one that builds its point.
_FACTORIES = {"make_grad_stage_kernel": make_grad_stage_kernel, "make_dx_csr_kernel": make_dx_csr_kernel,
              "make_dw_csr_kernel": make_dw_csr_kernel, "make_dx_taps_kernel": make_dx_taps_kernel}

#: The kinds whose kernels this module builds (``gi``, ``gw``, ``csr``): those of the families whose factories are
#: here.
STAGED_KINDS = tuple(k for f in ADJOINT_FAMILIES if f.module == __name__ for k in f.kinds)


def _build_kernel(kind: str, name: str, module_options: Optional[dict] = None, module: Optional[str] = None):
    """Build (do not validate) the kernel for ``(kind, name)``; returns ``(kernel, spec, fp32_stage)``."""
    if kind not in STAGED_KINDS:
        raise ValueError(f"kind: expected one of {', '.join(map(repr, STAGED_KINDS))}, got {kind!r}")
    point = adjoint_point(kind, name)                 # a KeyError names a config that is no kernel of the kind
    fam = point.owner
    factory, args, kwargs = fam.factory(point)
    kernel = _FACTORIES[factory](*args, **kwargs, module_options=module_options, module=module)
    return kernel, fam.spec(point), point["stage"] == "fp32"
