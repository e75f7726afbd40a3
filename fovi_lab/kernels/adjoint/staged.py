"""The staged adjoint kernel factories: a per-node GEMM into a stage, then a reverse-CSR reduction.

grad_input, per output node ``n`` (``g_n = grad_y[:, :, n]``, ``W_n`` the gathered weight rows)::

    dA[n, p, b]   = sum_o W[o, weight_linear[n, p]] * g[b, o, n]          (stage: [Nout, P64, B])
    dx[b, j]      = sum over the (n, p) with input_linear[n, p] = j of dA[n, p, b]

grad_weight, per node::

    dWeff[n, p, o] = sum_b xpad[b, input_linear[n, p]] * g[b, o, n]        (stage: [Nout, P64, Cout])
    dW[o, q]       = sum over the (n, p) with weight_linear[n, p] = q of dWeff[n, p, o]

The reductions walk the meta's reverse CSR lists in a fixed order (no atomics), so dx and dW are bitwise
repeatable. Every stage entry the reduction reads is written by the GEMM (the pad column p >= P is never
listed), and outputs are prefilled with NaN in the tests so an unwritten entry shows.
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

import os
from typing import Optional

from fovi_lab.kernels.common import init_warp, wp
from fovi_lab.kernels.adjoint.configs import (CSR_KERNEL_SPECS, _F32_SUFFIX, _GI_TILE_O, GRAD_INPUT_CONFIG_SPECS,
                                              GRAD_WEIGHT_CONFIG_SPECS, _GW_TILE_B, _MODULE_OPTIONS, _split_name)


def _mathdx_env() -> Optional[bool]:
    """``FOVI_WARP_MATHDX=0/1`` forces the scalar / cuBLASDx tile GEMM (shared with the forward kernels);
    unset: Warp's own default (cuBLASDx on CUDA)."""
    env = os.environ.get("FOVI_WARP_MATHDX")
    if env is None or env.strip() == "":
        return None
    return env.strip().lower() not in ("0", "false", "no", "off")


def _kernel_options(block_dim: Optional[int], module_options: Optional[dict]) -> dict:
    opts = dict(_MODULE_OPTIONS)
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


def _tag(kernel, fp32_stage: bool):
    # Remember the stage dtype on the kernel (the canaries need it; the signature is fixed by the seed).
    kernel.fovi_fp32_stage = bool(fp32_stage)
    return kernel


def _stage_dtype(fp32_stage: bool):
    return wp.float32 if fp32_stage else wp.float16


def _make_gi_kernel(tag: str, tile_p: int, tile_b: int, tile_o: int, fp32_stage: bool, *, grid3: bool,
                    prefetch: bool = False, staged_operand: bool = False, block_dim: Optional[int] = None,
                    module_options: Optional[dict] = None, module: Optional[str] = None):
    """The one gi staging kernel; every gi config is one setting of its compile-time switches.

    ``dA_stage[n, p, b] = sum_o W^T[weight_linear[n, p], o] * g_nob[n, o, b]`` (fp32 accumulate, then stored
    fp16 or fp32), over ``o`` in ``tile_o`` chunks. Arguments ``(weight_linear [Nout, P64] i32, wt, g_nob
    [Nout, Cout_pad, Bpad] f16, n_p_tiles = P64 // tile_p, n_o_tiles = Cout_pad // tile_o)``, output
    ``da [Nout, P64, Bpad]``.

    * ``grid3=False`` (v2): grid ``(Nout, Bpad // tile_b)``, the p loop inside the CTA (amortises per-CTA
      costs); ``grid3=True`` (v3): grid ``(Nout, P64 // tile_p, Bpad // tile_b)``, one p tile per CTA (enough
      CTAs for layers with few nodes).
    * ``staged_operand`` ("i"): ``wt`` is the per-call dense ``weff [Nout*P64, Cout_pad]`` (W's rows copied
      once, :func:`fovi_lab.kernels.common.gather_rows`), plain-loaded at row ``n*P64 + p`` instead of
      gathered from ``W^T [Q, Cout_pad]`` through ``weight_linear``: for the Cin = 3 stems.
    * ``prefetch`` ("p"): the next step's W gather and g tile are issued into registers before the current
      step's ``tile_matmul`` and copied into the shared operands after it (a software pipeline: Warp's tile
      GEMM does not overlap loads with math inside a CTA). The last step re-loads itself.

    The order of the fp32 sums is the same in every setting (o chunks in order), so each is deterministic.
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    GRID3, PREFETCH, STAGED = bool(grid3), bool(prefetch), bool(staged_operand)

    @_kernel_decorator(tag, opts, module)
    def gi(weight_linear: wp.array2d(dtype=wp.int32), wt: wp.array2d(dtype=wp.float16),
           g_nob: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_o_tiles: int,
           da: wp.array3d(dtype=sd)):
        if wp.static(GRID3):
            n, pt_lo, bt = wp.tid()
            pt_hi = pt_lo + 1
        else:
            n, bt = wp.tid()
            pt_lo = 0
            pt_hi = n_p_tiles
        b_off = bt * tile_b
        g_n = g_nob[n]
        if wp.static(PREFETCH):
            wl_n = weight_linear[n]
            w_sh = wp.tile_zeros(shape=(tile_p, tile_o), dtype=wp.float16, storage="shared")
            g_sh = wp.tile_zeros(shape=(tile_o, tile_b), dtype=wp.float16, storage="shared")
            rows = wp.tile_load(wl_n, shape=tile_p, offset=pt_lo * tile_p, storage="shared")
            w_r = wp.tile_load_indexed(wt, indices=rows, shape=(tile_p, tile_o), offset=(0, 0), axis=0)
            g_r = wp.tile_load(g_n, shape=(tile_o, tile_b), offset=(0, b_off))
            last = (pt_hi - pt_lo) * n_o_tiles - 1
        for pt in range(pt_lo, pt_hi):
            p_off = pt * tile_p
            acc = wp.tile_zeros(shape=(tile_p, tile_b), dtype=wp.float32)
            if wp.static(PREFETCH):
                for ot in range(n_o_tiles):
                    wp.tile_assign(w_sh, w_r)
                    wp.tile_assign(g_sh, g_r)
                    s1 = wp.min((pt - pt_lo) * n_o_tiles + ot + 1, last)
                    pt1 = pt_lo + s1 // n_o_tiles
                    ot1 = s1 - (pt1 - pt_lo) * n_o_tiles
                    rows1 = wp.tile_load(wl_n, shape=tile_p, offset=pt1 * tile_p, storage="shared")
                    w_r = wp.tile_load_indexed(wt, indices=rows1, shape=(tile_p, tile_o),
                                               offset=(0, ot1 * tile_o), axis=0)
                    g_r = wp.tile_load(g_n, shape=(tile_o, tile_b), offset=(ot1 * tile_o, b_off))
                    wp.tile_matmul(w_sh, g_sh, acc)
            else:
                if wp.static(not STAGED):
                    rows = wp.tile_load(weight_linear[n], shape=tile_p, offset=p_off)
                for ot in range(n_o_tiles):
                    o_off = ot * tile_o
                    if wp.static(STAGED):
                        w = wp.tile_load(wt, shape=(tile_p, tile_o), offset=(n * n_p_tiles * tile_p + p_off, o_off),
                                         storage="shared")
                    else:
                        w = wp.tile_load_indexed(wt, indices=rows, shape=(tile_p, tile_o), offset=(0, o_off),
                                                 axis=0, storage="shared")
                    g = wp.tile_load(g_n, shape=(tile_o, tile_b), offset=(o_off, b_off), storage="shared")
                    wp.tile_matmul(w, g, acc)
            if wp.static(fp32_stage):
                wp.tile_store(da[n], acc, offset=(p_off, b_off))
            else:
                wp.tile_store(da[n], wp.tile_astype(acc, wp.float16), offset=(p_off, b_off))

    return _tag(gi, fp32_stage)


def _make_gw_kernel(tag: str, tile_p: int, tile_n: int, tile_kb: int, fp32_stage: bool, *, grid3: bool,
                    pair: bool = False, prefetch: bool = False, staged_operand: bool = False,
                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                    module: Optional[str] = None):
    """The one gw staging kernel; every gw config is one setting of its compile-time switches.

    ``dWeff[n, p, o] = sum_b xt[input_linear[n, p], b] * g_nbo[n, b, o]`` (fp32 accumulate), over ``b`` in
    ``tile_kb`` chunks. Arguments ``(input_linear [nc, P64] i32, xt [Cin*Nin+1, Bpad] f16 (batch-contiguous,
    so each gathered row is 128 contiguous bytes and the tile is ``A_n^T`` with no transpose), g_nbo
    [nc, Bpad, Cout_pad] f16, n_p_tiles, n_b_tiles)``, output ``dweff [nc, P64, Cout_pad]``.

    * ``grid3=False`` (v2): grid ``(nc, Cout_pad // tile_n)``, the p loop inside the CTA; ``grid3=True``
      (v3): grid ``(nc, P64 // tile_p, Cout_pad // (tile_n * (2 if pair else 1)))``.
    * ``pair`` (v4): each CTA computes two adjacent o tiles from each gathered x tile (half the x-gather
      stream; ``g_nbo`` / ``dweff`` padded to ``2*tile_n`` columns).
    * ``staged_operand`` ("i"): ``xt`` is the node chunk's dense rows ``at [nc*P64, Bpad]``, plain-loaded at
      row ``n*P64 + p`` (the stems).
    * ``prefetch`` ("p"): the next b step's gather and g tile in registers during the current MMA.
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    GRID3, PAIR, PREFETCH, STAGED, TKB = bool(grid3), bool(pair), bool(prefetch), bool(staged_operand), int(tile_kb)
    WIDE = tile_n * (2 if PAIR else 1)

    @_kernel_decorator(tag, opts, module)
    def gw(input_linear: wp.array2d(dtype=wp.int32), xt: wp.array2d(dtype=wp.float16),
           g_nbo: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_b_tiles: int,
           dweff: wp.array3d(dtype=sd)):
        if wp.static(GRID3):
            n, pt_lo, ot = wp.tid()
            pt_hi = pt_lo + 1
        else:
            n, ot = wp.tid()
            pt_lo = 0
            pt_hi = n_p_tiles
        o0 = ot * WIDE
        g_n = g_nbo[n]
        for pt in range(pt_lo, pt_hi):
            p_off = pt * tile_p
            acc0 = wp.tile_zeros(shape=(tile_p, tile_n), dtype=wp.float32)
            if wp.static(PAIR):
                acc1 = wp.tile_zeros(shape=(tile_p, tile_n), dtype=wp.float32)
            if wp.static(PREFETCH):
                rows = wp.tile_load(input_linear[n], shape=tile_p, offset=p_off, storage="shared")
                a_sh = wp.tile_zeros(shape=(tile_p, TKB), dtype=wp.float16, storage="shared")
                g_sh = wp.tile_zeros(shape=(TKB, tile_n), dtype=wp.float16, storage="shared")
                a_r = wp.tile_load_indexed(xt, indices=rows, shape=(tile_p, TKB), offset=(0, 0), axis=0)
                g_r = wp.tile_load(g_n, shape=(TKB, tile_n), offset=(0, o0))
                for bt in range(n_b_tiles):
                    wp.tile_assign(a_sh, a_r)
                    wp.tile_assign(g_sh, g_r)
                    b1 = wp.min(bt + 1, n_b_tiles - 1) * TKB
                    a_r = wp.tile_load_indexed(xt, indices=rows, shape=(tile_p, TKB), offset=(0, b1), axis=0)
                    g_r = wp.tile_load(g_n, shape=(TKB, tile_n), offset=(b1, o0))
                    wp.tile_matmul(a_sh, g_sh, acc0)
            else:
                if wp.static(not STAGED):
                    rows = wp.tile_load(input_linear[n], shape=tile_p, offset=p_off)
                for bt in range(n_b_tiles):
                    b_off = bt * TKB
                    if wp.static(STAGED):
                        a = wp.tile_load(xt, shape=(tile_p, TKB), offset=(n * n_p_tiles * tile_p + p_off, b_off),
                                         storage="shared")
                    else:
                        a = wp.tile_load_indexed(xt, indices=rows, shape=(tile_p, TKB), offset=(0, b_off),
                                                 axis=0, storage="shared")
                    g0 = wp.tile_load(g_n, shape=(TKB, tile_n), offset=(b_off, o0), storage="shared")
                    wp.tile_matmul(a, g0, acc0)
                    if wp.static(PAIR):
                        g1 = wp.tile_load(g_n, shape=(TKB, tile_n), offset=(b_off, o0 + tile_n), storage="shared")
                        wp.tile_matmul(a, g1, acc1)
            if wp.static(fp32_stage):
                wp.tile_store(dweff[n], acc0, offset=(p_off, o0))
                if wp.static(PAIR):
                    wp.tile_store(dweff[n], acc1, offset=(p_off, o0 + tile_n))
            else:
                wp.tile_store(dweff[n], wp.tile_astype(acc0, wp.float16), offset=(p_off, o0))
                if wp.static(PAIR):
                    wp.tile_store(dweff[n], wp.tile_astype(acc1, wp.float16), offset=(p_off, o0 + tile_n))

    return _tag(gw, fp32_stage)


def _f(fp32_stage: bool) -> str:
    return "f32" if fp32_stage else "f16"


# The seed's factories (and their v3 / prefetch / staged-operand siblings): settings of the two kernels above.

def make_grad_input_stage2_kernel(tile_p: int, tile_b: int, fp32_stage: bool, *, tile_o: int = _GI_TILE_O,
                                   block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                   module: Optional[str] = None):
    """v2 gi staging: one CTA per ``(n, b_tile)``, the P64 loop inside the CTA (see :func:`_make_gi_kernel`).

    Launch ``wp.launch_tiled(k, dim=(Nout, Bpad // tile_b), block_dim=...)``; ``wt = W^T [Q, Cout_pad]``.
    """
    return _make_gi_kernel(f"fovi_gi2_p{tile_p}b{tile_b}o{tile_o}_{_f(fp32_stage)}", tile_p, tile_b, tile_o,
                           fp32_stage, grid3=False, block_dim=block_dim, module_options=module_options,
                           module=module)


def make_grad_input_stage3_kernel(tile_p: int, tile_b: int, fp32_stage: bool, *, tile_o: int = _GI_TILE_O,
                                   block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                   module: Optional[str] = None):
    """v3 gi staging: a 3-D ``(n, p_tile, b_tile)`` grid, the o loop inside the CTA (small-Nout layers)."""
    return _make_gi_kernel(f"fovi_gi3_p{tile_p}b{tile_b}o{tile_o}_{_f(fp32_stage)}", tile_p, tile_b, tile_o,
                           fp32_stage, grid3=True, block_dim=block_dim, module_options=module_options,
                           module=module)


def make_grad_input_stage2p_kernel(tile_p: int, tile_b: int, fp32_stage: bool, *, tile_o: int = _GI_TILE_O,
                                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                    module: Optional[str] = None):
    """gi2 with a register prefetch of the next (p tile, o tile) step's W gather and g tile."""
    return _make_gi_kernel(f"fovi_gi2p_p{tile_p}b{tile_b}o{tile_o}_{_f(fp32_stage)}", tile_p, tile_b, tile_o,
                           fp32_stage, grid3=False, prefetch=True, block_dim=block_dim,
                           module_options=module_options, module=module)


def make_grad_input_stage3p_kernel(tile_p: int, tile_b: int, fp32_stage: bool, *, tile_o: int = _GI_TILE_O,
                                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                    module: Optional[str] = None):
    """gi3 with a register prefetch of the next o step's W gather and g tile."""
    return _make_gi_kernel(f"fovi_gi3p_p{tile_p}b{tile_b}o{tile_o}_{_f(fp32_stage)}", tile_p, tile_b, tile_o,
                           fp32_stage, grid3=True, prefetch=True, block_dim=block_dim,
                           module_options=module_options, module=module)


def make_grad_weight_stage2_kernel(tile_p: int, tile_n: int, fp32_stage: bool, *, tile_b: int = _GW_TILE_B,
                                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                    module: Optional[str] = None):
    """v2 gw staging: one CTA per ``(n, o_tile)``, the P64 loop in the CTA (see :func:`_make_gw_kernel`)."""
    return _make_gw_kernel(f"fovi_gw2_p{tile_p}n{tile_n}b{tile_b}_{_f(fp32_stage)}", tile_p, tile_n, tile_b,
                           fp32_stage, grid3=False, block_dim=block_dim, module_options=module_options,
                           module=module)


def make_grad_weight_stage3_kernel(tile_p: int, tile_n: int, fp32_stage: bool, *, tile_b: int = _GW_TILE_B,
                                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                    module: Optional[str] = None):
    """v3 gw staging: a 3-D ``(n, p_tile, o_tile)`` grid (more, smaller CTAs for small-Nout shapes)."""
    return _make_gw_kernel(f"fovi_gw3_p{tile_p}n{tile_n}b{tile_b}_{_f(fp32_stage)}", tile_p, tile_n, tile_b,
                           fp32_stage, grid3=True, block_dim=block_dim, module_options=module_options,
                           module=module)


def make_grad_weight_stage4_kernel(tile_p: int, tile_n: int, fp32_stage: bool, *, tile_b: int = _GW_TILE_B,
                                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                    module: Optional[str] = None):
    """v4 gw staging: v3's grid, two adjacent o tiles per CTA (``dim=(nc, P64 // tile_p, Cout_pad // (2*tile_n))``)."""
    return _make_gw_kernel(f"fovi_gw4_p{tile_p}n{tile_n}b{tile_b}_{_f(fp32_stage)}", tile_p, tile_n, tile_b,
                           fp32_stage, grid3=True, pair=True, block_dim=block_dim, module_options=module_options,
                           module=module)


def make_grad_weight_stage3p_kernel(tile_p: int, tile_n: int, fp32_stage: bool, *, tile_b: int = _GW_TILE_B,
                                     block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                     module: Optional[str] = None):
    """gw3 with a register prefetch of the next b step's ``xt`` gather and ``g`` tile."""
    return _make_gw_kernel(f"fovi_gw3p_p{tile_p}n{tile_n}b{tile_b}_{_f(fp32_stage)}", tile_p, tile_n, tile_b,
                           fp32_stage, grid3=True, prefetch=True, block_dim=block_dim,
                           module_options=module_options, module=module)


def make_grad_staged_operand_kernel(kind: str, version: str, tile_p: int, tile_wide: int, fp32_stage: bool, *,
                                     tile_o: int = _GI_TILE_O, block_dim: Optional[int] = None,
                                     module_options: Optional[dict] = None, module: Optional[str] = None,
                                     tile_kb: int = _GW_TILE_B):
    """Staged-operand ("i") variants of gi2 / gi3 / gw3 for the Cin = 3 stems (``version`` "2i", "3i").

    There every neighbour contributes 3 contraction rows, so the gathered operand tile is a scalar,
    bounds-checked ``tile_load_indexed`` that costs more than the tile GEMM. The plan copies those rows once
    into a dense operand (gi: ``weff[n*P64 + p] = W^T[weight_linear[n, p]]`` per call; gw: ``at[nl*P64 + p]
    = xt[input_linear[n0+nl, p]]`` per node chunk) and the kernel plain-loads it. Same grid and arguments
    as the version it mirrors; the table argument is unused. gw's staged rows count against the stage
    budget; gi's ``weff`` is ``Nout*P64*Cout_pad*2`` bytes whatever the batch.
    """
    f = _f(fp32_stage)
    if kind == "gi":
        return _make_gi_kernel(f"fovi_gi{version}_p{tile_p}b{tile_wide}o{tile_o}_{f}", tile_p, tile_wide, tile_o,
                               fp32_stage, grid3=version == "3i", staged_operand=True, block_dim=block_dim,
                               module_options=module_options, module=module)
    return _make_gw_kernel(f"fovi_gw{version}_p{tile_p}n{tile_wide}b{int(tile_kb)}_{f}", tile_p, tile_wide,
                           tile_kb, fp32_stage, grid3=True, staged_operand=True, block_dim=block_dim,
                           module_options=module_options, module=module)


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
        # bit, as one element at a time. (With 4 in flight the reductions ran at 0.5-0.7 TB/s on the H200;
        # 8 made them 1.6x faster, run 13.)
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


_STAGE_FACTORIES = {
    ("gi", 2): make_grad_input_stage2_kernel,
    ("gi", "2p"): make_grad_input_stage2p_kernel,
    ("gi", 3): make_grad_input_stage3_kernel,
    ("gi", "3p"): make_grad_input_stage3p_kernel,
    ("gw", "3p"): make_grad_weight_stage3p_kernel,
    ("gw", 2): make_grad_weight_stage2_kernel,
    ("gw", 3): make_grad_weight_stage3_kernel,
    ("gw", 4): make_grad_weight_stage4_kernel,
}


def _build_kernel(kind: str, name: str, module_options: Optional[dict] = None, module: Optional[str] = None):
    """Build (do not validate) the kernel for ``(kind, name)``; returns ``(kernel, spec, fp32_stage)``."""
    if kind == "csr":
        if name not in CSR_KERNEL_SPECS:
            raise KeyError(f"config: unknown csr kernel {name!r}; known: {sorted(CSR_KERNEL_SPECS)}")
        spec = CSR_KERNEL_SPECS[name]
        factory = make_dx_csr_kernel if spec["target"] == "dx" else make_dw_csr_kernel
        return factory(spec["fp32_stage"], module_options=module_options, module=module), spec, spec["fp32_stage"]
    base, fp32 = _split_name(name)
    table = {"gi": GRAD_INPUT_CONFIG_SPECS, "gw": GRAD_WEIGHT_CONFIG_SPECS}.get(kind)
    if table is None:
        raise ValueError(f"kind: expected 'gi', 'gw' or 'csr', got {kind!r}")
    if base not in table:
        raise KeyError(f"config: unknown {kind} config {name!r}; known: {sorted(table)} "
                       f"(append {_F32_SUFFIX!r} for fp32 staging)")
    spec = table[base]
    if str(spec["version"]).endswith("i"):
        wide = spec["tile_b"] if kind == "gi" else spec["tile_n"]
        kernel = make_grad_staged_operand_kernel(kind, spec["version"], spec["tile_p"], wide, fp32,
                                                  tile_o=spec.get("tile_o", _GI_TILE_O), block_dim=spec["block_dim"],
                                                  module_options=module_options, module=module,
                                                  tile_kb=spec.get("tile_kb", _GW_TILE_B))
        return kernel, spec, fp32
    factory = _STAGE_FACTORIES[(kind, spec["version"])]
    if kind == "gi":
        kernel = factory(spec["tile_p"], spec["tile_b"], fp32, tile_o=spec["tile_o"],
                         block_dim=spec["block_dim"], module_options=module_options, module=module)
    else:
        kernel = factory(spec["tile_p"], spec["tile_n"], fp32, block_dim=spec["block_dim"],
                         module_options=module_options, module=module)
    return kernel, spec, fp32
