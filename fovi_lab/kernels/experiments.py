"""Kernels that exist to teach, not to run the operator: each isolates one of Warp's rules about what a kernel
reserves or does (notebook 03, :mod:`fovi_lab.lab.canary`). The production kernels are not built this way."""

from __future__ import annotations

import functools

from fovi_lab.kernels.common import init_warp, wp

_TILE_K = 64
#: The tile sizes, weight-reuse factors and block sizes the experiments (and notebook 03's widget) take.
TILE_CHOICES = (8, 16, 32, 64, 128, 256)
R_CHOICES = (1, 2, 4)
BLOCK_DIM_CHOICES = (32, 64, 128, 256, 512, 1024)


def check_config(tile_m, tile_n, r, block_dim) -> None:
    """A ValueError naming the argument that is not one of the choices above."""
    if tile_m not in TILE_CHOICES or tile_n not in TILE_CHOICES:
        raise ValueError(f"tile_m/tile_n: expected one of {TILE_CHOICES}, got {tile_m}/{tile_n}")
    if r not in R_CHOICES:
        raise ValueError(f"r: expected one of {R_CHOICES}, got {r}")
    if block_dim not in BLOCK_DIM_CHOICES:
        raise ValueError(f"block_dim: expected one of {BLOCK_DIM_CHOICES} (a multiple of the 32-thread "
                         f"warp, at most 1024 threads per block), got {block_dim}")


def make_budget_experiment(tile_m: int, tile_n: int, block_dim: int = 64, *, dead_branch: bool = False,
                           unroll: int = 0, backward: bool = False):
    """A plain tile GEMM ``C[M, N] (fp32) = A[M, K] @ B[K, N]`` (fp16), built to isolate one of Warp's
    shared-memory counting rules (the production kernels are not built this way):

    * ``dead_branch``: a branch never taken at run time (``k_tiles < 0``) holds one more A and B tile;
    * ``unroll = U > 0``: the K loop's trip count is the compile-time constant ``U`` (Warp unrolls constant
      loops of at most 16 trips, and each copy's tiles reserve again);
    * ``backward``: built with ``enable_backward=True`` (Warp compiles an adjoint kernel beside it).

    With no switch on it is the baseline the other three are compared with.
    """
    check_config(tile_m, tile_n, 1, block_dim)
    init_warp()
    TM, TN, TK, DEAD, KT = int(tile_m), int(tile_n), _TILE_K, bool(dead_branch), int(unroll)
    opts = {"block_dim": int(block_dim), "enable_backward": bool(backward), "enable_mathdx_gemm": False}
    name = f"fovi_budget_m{TM}n{TN}b{block_dim}{'_dead' if DEAD else ''}{f'_u{KT}' if KT else ''}{'_bwd' if backward else ''}"

    @wp.kernel(enable_backward=bool(backward), module="unique", module_options=opts, name=name)
    def kernel(a: wp.array2d(dtype=wp.float16), b: wp.array2d(dtype=wp.float16),
               c: wp.array2d(dtype=wp.float32), k_tiles: int):
        i, j = wp.tid()
        acc = wp.tile_zeros(shape=(TM, TN), dtype=wp.float32)
        if wp.static(KT > 0):
            for kt in range(KT):  # a compile-time trip count
                wp.tile_matmul(wp.tile_load(a, shape=(TM, TK), offset=(i * TM, kt * TK), storage="shared"),
                               wp.tile_load(b, shape=(TK, TN), offset=(kt * TK, j * TN), storage="shared"), acc)
        else:
            for kt in range(k_tiles):  # a run-time trip count: not unrolled
                wp.tile_matmul(wp.tile_load(a, shape=(TM, TK), offset=(i * TM, kt * TK), storage="shared"),
                               wp.tile_load(b, shape=(TK, TN), offset=(kt * TK, j * TN), storage="shared"), acc)
        if wp.static(DEAD):
            if k_tiles < 0:  # never true: dead at run time, not at compile time
                bt2 = wp.tile_load(b, shape=(TK, TN), offset=(0, j * TN), storage="shared")
                at2 = wp.tile_load(a, shape=(TM, TK), offset=(i * TM, 0), storage="shared")
                wp.tile_matmul(at2, bt2, acc)
        wp.tile_store(c, acc, offset=(i * TM, j * TN))

    return kernel


@functools.lru_cache(maxsize=None)
def make_oversized_kernel(rows: int = 256, cols: int = 256, block_dim: int = 256):
    """``y = 2 x`` through one fp32 shared tile of ``rows x cols`` (256 x 256 = 256 KiB: over an H200
    block's budget; exactly the CPU arena, so never launch a bigger one on the CPU)."""
    init_warp()
    R, C = int(rows), int(cols)

    @wp.kernel(enable_backward=False, module="unique", module_options={"block_dim": int(block_dim),
               "enable_backward": False, "enable_mathdx_gemm": False}, name=f"fovi_canary_oversized_{R}x{C}b{block_dim}")
    def kernel(x: wp.array2d(dtype=wp.float32), y: wp.array2d(dtype=wp.float32)):
        t = wp.tile_load(x, shape=(R, C), storage="shared")
        wp.tile_store(y, t + t)

    return kernel



__all__ = ["make_budget_experiment", "make_oversized_kernel", "check_config", "TILE_CHOICES", "R_CHOICES",
           "BLOCK_DIM_CHOICES"]
