"""The forward configs: one frozen :class:`FwdConfig` per named tile configuration, and the families.

A config name fixes a kernel at compile time (tile sizes are template constants: one Warp module per
config, built lazily and validated once per device, see :mod:`fovi_lab.kernels.forward.build`).

The operator, per output node ``n`` (one small GEMM per node)::

    y[b, o, n] = bias[o] + sum_{p < P64} xpad[b, input_linear[n, p]] * W[o, weight_linear[n, p]]

with ``xpad = [x.reshape(B, Cin*Nin) | 0]`` (the pad column ``Cin*Nin`` reads an exact zero). fp16 operands,
fp32 accumulation, the bias added in fp32 before the one rounding to fp16; ``y [B, Cout, Nout]``.

The families (the prefix of a config's name):

* ``gather`` (``m64n64r1b256``): any tables. ``xt = x_flat^T [Cin*Nin, B]`` and ``wt = W^T [Q, Cout]``, so
  each p tile is two indexed row gathers (``tile_load_indexed``); the pad index is one row past the end of
  ``xt`` and reads 0 through the bounds check. ``r2``/``r4``: that many batch tiles share each W tile.
* ``nm`` / ``nms`` (node-major, ``nm_m64n64k128``): tables of the fovi form (``input_linear[n, c*K+k] =
  c*Nin + idx[n, k]``), so with x node-major and W tap-major each neighbour's channel run is a plain
  contiguous tile load, and pad neighbours are skipped. ``nms`` splits the neighbour loop across CTAs into
  fp32 partials summed in a fixed order.
* ``i2c`` / ``i2cg`` (``i2c_m64n96k128``): for Cin < 32 (stems): the rows are staged per call by a SIMT row
  copy and the kernel is a dense tile loop (``i2cg`` keeps W gathered).
* ``simt`` / ``simtp`` / ``simtw`` / ``simts`` / ``simtsw`` / ``simtv`` (``sd_b8o8u4``): no tile GEMM. Each
  thread keeps a ``tile_b x tile_o`` block of y in fp32 registers; ``s`` splits the p loop, ``v`` reads fp32
  operands as vec4, ``p`` prefetches the next step's indices, ``w`` reads W as vectors.
* ``mma`` / ``mmas`` / ``mmaw`` / ``mmasw`` / ``mmat`` / ``mmao`` / ``mmato`` (``mma_o96b16``,
  :mod:`fovi_lab.kernels.forward.mma`): hand-issued ``mma.sync.m16n8k16`` tensor-core MMAs on fragments each
  lane gathers itself. ``s``: p loop split; ``w``: W read in place; ``t``: x^T per call; ``o``: y stored
  through a shared tile; ``k32``/``k64``: 2 or 4 k-steps per iteration.
* ``cached`` (``c_m32n64``): inference from the effective-weight cache ``Weff[n] [P64, Cout_pad]``.
* dense ceilings (benchmarks only): the same loop over dense operands of the same GEMM sizes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple


# p-tile width of the gather family: the index tables are padded to P64, a multiple of 64.
_GATHER_TILE_K = 64


@dataclass(frozen=True)
class FwdConfig:
    """One compile-time forward configuration.

    Attributes:
        name: registry name (``m64n64r2b256``, ``nm_m64n128k64``, ...).
        family: ``"gather"`` (any tables), ``"nm"`` / ``"nms"`` (node-major, spec §2.1 tables), ``"i2c"`` /
            ``"i2cg"`` (im2col stage), ``"simt"`` / ``"simtp"`` / ``"simtv"`` / ``"simts"`` (SIMT register
            blocks; ``simts`` splits the p loop) or ``"cached"`` (and the experimental ``"nmp"`` / ``"gp"``).
        tile_m, tile_n, tile_k: batch rows, output channels, contraction depth of one tile GEMM (``simt``:
            a thread's batch rows and output channels, and the p entries per loop step).
        r: batch tiles per CTA sharing each weight tile (1, 2 or 4).
        block_dim: threads per CTA.
    """

    name: str
    family: str
    tile_m: int
    tile_n: int
    tile_k: int
    r: int
    block_dim: int

    @property
    def rows_per_cta(self) -> int:
        return self.tile_m * self.r


# name -> (family, tile_m, tile_n, tile_k, r, block_dim)
_UNCACHED_BATCH_CONFIG_SPECS: Dict[str, Tuple[str, int, int, int, int, int]] = {
    # gather family (seed names; tile_k = 64 = one p tile)
    "m16n32": ("gather", 16, 32, 64, 1, 64),
    "m16n64": ("gather", 16, 64, 64, 1, 128),
    "m32n64": ("gather", 32, 64, 64, 1, 128),
    "m64n64r1": ("gather", 64, 64, 64, 1, 128),
    "m64n64r1b256": ("gather", 64, 64, 64, 1, 256),
    "m64n64r2": ("gather", 64, 64, 64, 2, 128),
    "m64n64r2b256": ("gather", 64, 64, 64, 2, 256),
    "m64n128r1": ("gather", 64, 128, 64, 1, 256),
    "m64n128r2": ("gather", 64, 128, 64, 2, 256),
    "m32n64r2": ("gather", 32, 64, 64, 2, 128),
    "m32n64r4": ("gather", 32, 64, 64, 4, 128),
    "m32n128r2": ("gather", 32, 128, 64, 2, 256),
    # 96-wide output tiles: Cout = 96 (alexnet stem) without a ragged tile
    "m64n96b256": ("gather", 64, 96, 64, 1, 256),
    "m128n96b256": ("gather", 128, 96, 64, 1, 256),
    # node-major family
    "nm_m16n32k64": ("nm", 16, 32, 64, 1, 64),
    "nm_m16n64k32": ("nm", 16, 64, 32, 1, 128),
    "nm_m16n64k64": ("nm", 16, 64, 64, 1, 128),
    "nm_m32n64k64": ("nm", 32, 64, 64, 1, 128),
    "nm_m64n64k64": ("nm", 64, 64, 64, 1, 128),
    "nm_m64n64k64b256": ("nm", 64, 64, 64, 1, 256),
    "nm_m64n64k64r2": ("nm", 64, 64, 64, 2, 256),
    "nm_m64n128k64": ("nm", 64, 128, 64, 1, 256),
    "nm_m64n128k64r2": ("nm", 64, 128, 64, 2, 256),
    "nm_m128n128k64": ("nm", 128, 128, 64, 1, 256),
    "nm_m64n64k32": ("nm", 64, 64, 32, 1, 128),
    "nm_m64n128k32": ("nm", 64, 128, 32, 1, 256),
    "nm_m32n64k32r4": ("nm", 32, 64, 32, 4, 128),
    "nm_m64n64k128": ("nm", 64, 64, 128, 1, 128),
    "nm_m64n128k128": ("nm", 64, 128, 128, 1, 256),
    # node-major with the neighbour loop split across CTAs (layers with few output nodes)
    "nms_m16n32k64": ("nms", 16, 32, 64, 1, 64),
    "nms_m64n64k64": ("nms", 64, 64, 64, 1, 128),
    # im2col stage + plain-load tile GEMM, for the Cin = 3 stems and the DINOv3 patch embed ("i2c": W
    # staged too, one Weff gather per call; "i2cg": W gathered in the kernel)
    "i2c_m16n64k64": ("i2c", 16, 64, 64, 1, 64),
    "i2c_m32n64k64": ("i2c", 32, 64, 64, 1, 128),
    "i2c_m64n64k64": ("i2c", 64, 64, 64, 1, 128),
    "i2c_m64n64k128": ("i2c", 64, 64, 128, 1, 128),
    "i2c_m16n96k64": ("i2c", 16, 96, 64, 1, 128),
    "i2c_m64n96k64": ("i2c", 64, 96, 64, 1, 128),
    "i2c_m64n96k128": ("i2c", 64, 96, 128, 1, 128),
    "i2c_m128n96k64": ("i2c", 128, 96, 64, 1, 256),
    "i2c_m64n128k64": ("i2c", 64, 128, 64, 1, 256),
    "i2c_m128n128k64": ("i2c", 128, 128, 64, 1, 256),
    "i2cg_m64n64k64": ("i2cg", 64, 64, 64, 1, 256),
    "i2cg_m64n96k64": ("i2cg", 64, 96, 64, 1, 256),
    "i2cg_m64n128k64": ("i2cg", 64, 128, 64, 1, 256),
    # SIMT register-blocked kernel (no tile GEMM, no staging): each thread owns a tile_m x tile_n block
    # of (batch, output channel) in fp32 registers, for the stems at small batch
    "sd_b4o4u1": ("simt", 4, 4, 1, 1, 128),
    "sd_b4o4u4": ("simt", 4, 4, 4, 1, 128),
    "sd_b4o8u2": ("simt", 4, 8, 2, 1, 128),
    "sd_b8o4u2": ("simt", 8, 4, 2, 1, 128),
    "sd_b8o8u1": ("simt", 8, 8, 1, 1, 128),
    "sd_b8o8u2": ("simt", 8, 8, 2, 1, 128),
    "sd_b8o8u4": ("simt", 8, 8, 4, 1, 128),
    "sd_b16o4u2": ("simt", 16, 4, 2, 1, 128),
    "sd_b16o8u2": ("simt", 16, 8, 2, 1, 128),
    "sd_b8o8u8": ("simt", 8, 8, 8, 1, 128),
    "sd_b16o8u4": ("simt", 16, 8, 4, 1, 128),
    "sd_b8o4u4": ("simt", 8, 4, 4, 1, 128),
    "sd_b8o8u4b64": ("simt", 8, 8, 4, 1, 64),
    # 4x4 blocks with the next step's indices prefetched: the B <= 4 pick (run 42)
    "sdp_b4o4u4": ("simtp", 4, 4, 4, 1, 128),
    # the same register blocks over fp32 operands read as 16-byte vec4s (x^T and a channel-permuted W^T):
    # no fp16 -> fp32 conversions and 1/4 of the load instructions
    "sv_b4o4u4": ("simtv", 4, 4, 4, 1, 128),
    "sv_b4o8u4": ("simtv", 4, 8, 4, 1, 128),
    "sv_b8o4u4": ("simtv", 8, 4, 4, 1, 128),
    "sv_b8o8u2": ("simtv", 8, 8, 2, 1, 128),
    "sv_b8o8u4": ("simtv", 8, 8, 4, 1, 128),
    "sv_b8o8u8": ("simtv", 8, 8, 8, 1, 128),
    "sv_b16o8u2": ("simtv", 16, 8, 2, 1, 128),
    "sv_b8o16u2": ("simtv", 8, 16, 2, 1, 128),
    "sv_b8o8u4b64": ("simtv", 8, 8, 4, 1, 64),
    # the fp16 SIMT loop with the p range split across threads (fp32 partials, then a fixed-order sum):
    # every layer at B <= 4, the few-node layers up to B = 32 (runs 44-46)
    "ss_b4o8u4": ("simts", 4, 8, 4, 1, 128),
    "ss_b8o8u4": ("simts", 8, 8, 4, 1, 128),
    # tensor cores by hand (fovi_lab.kernels.forward.mma): one warp per (node, 8*NT batch rows, 16*MT channels), PTX
    # mma.sync.m16n8k16 on fragments each lane gathers itself; x read and y written in place, no stage.
    # tile_m = batch rows per warp, tile_n = channels per warp, tile_k = 16 p entries per step.
    "mma_o64b8": ("mma", 8, 64, 16, 1, 128),
    "mma_o64b16": ("mma", 16, 64, 16, 1, 128),
    "mma_o96b16": ("mma", 16, 96, 16, 1, 128),
    # the same with the p range split S ways (fp32 partials, then the fixed-order nms reduction)
    "mmas_o32b8": ("mmas", 8, 32, 16, 1, 128),
    "mmas_o64b8": ("mmas", 8, 64, 16, 1, 128),
    "mmas_o32b16": ("mmas", 16, 32, 16, 1, 128),
    "mmas_o64b16": ("mmas", 16, 64, 16, 1, 128),
    # W read in place ([Cout, Q], no per-call W^T layout: training steps and graph replays)
    "mmasw_o32b8": ("mmasw", 8, 32, 16, 1, 128),
    "mmasw_o32b16": ("mmasw", 16, 32, 16, 1, 128),
    "mmasw_o64b8": ("mmasw", 8, 64, 16, 1, 128),
    "mmasw_o64b16": ("mmasw", 16, 64, 16, 1, 128),
    # x^T per call (batch rows adjacent: one vector load per p entry), for large batches
    "mmat_o64b32": ("mmat", 32, 64, 16, 1, 128),
    "mmat_o96b32": ("mmat", 32, 96, 16, 1, 128),
    # loops of 2 (k32) or 4 (k64) k-steps per iteration: every load of an iteration issued before its MMAs
    "mma_o32b8k32": ("mma", 8, 32, 32, 1, 128),
    "mma_o96b16k32": ("mma", 16, 96, 32, 1, 128),
    "mma_o64b16k32": ("mma", 16, 64, 32, 1, 128),
    "mmat_o96b32k32": ("mmat", 32, 96, 32, 1, 128),
    # the staged store (mmao / mmato: a block's warps are consecutive nodes and write y through a shared tile,
    # runs of block_dim/32 adjacent outputs instead of one 2-byte store per 32-byte sector), and the picks in
    # 1- and 2-warp blocks (b32 / b64: grids of a few hundred warps spread over all 132 SMs); run 63
    "mma_o32b8k64b64": ("mma", 8, 32, 64, 1, 64),
    "mmao_o64b16k32": ("mmao", 16, 64, 32, 1, 128),
    "mmao_o64b16k32b256": ("mmao", 16, 64, 32, 1, 256),
    "mmao_o96b16": ("mmao", 16, 96, 16, 1, 128),
    "mmasw_o32b16b64": ("mmasw", 16, 32, 16, 1, 64),
    "mmat_o64b16k64b32": ("mmat", 16, 64, 64, 1, 32),
    "mmato_o64b16k64": ("mmato", 16, 64, 64, 1, 128),
    "mmato_o64b32": ("mmato", 32, 64, 16, 1, 128),
    "mmato_o64b32b256": ("mmato", 32, 64, 16, 1, 256),
    "mmato_o96b32": ("mmato", 32, 96, 16, 1, 128),
    "mmato_o96b32k32": ("mmato", 32, 96, 32, 1, 128),
}

# Measured and never the fastest on the H200 sweep (kept runnable by name for benchmarks, but not
# compiled by warmup, not swept by default, not selected): register-prefetch ("pipelined") kernels,
# 512-thread gathers, 16x96 gathers.
_EXPERIMENTAL_CONFIG_SPECS: Dict[str, Tuple[str, int, int, int, int, int]] = {
    "m16n96": ("gather", 16, 96, 64, 1, 128),
    "m64n64b512": ("gather", 64, 64, 64, 1, 512),
    "m64n96b512": ("gather", 64, 96, 64, 1, 512),
    "nmp_m16n64k64": ("nmp", 16, 64, 64, 1, 128),
    "nmp_m32n64k64": ("nmp", 32, 64, 64, 1, 128),
    "nmp_m64n64k64": ("nmp", 64, 64, 64, 1, 128),
    "nmp_m64n128k64": ("nmp", 64, 128, 64, 1, 256),
    "nmp_m64n64k32": ("nmp", 64, 64, 32, 1, 128),
    "nmp_m64n128k32": ("nmp", 64, 128, 32, 1, 256),
    "nmp_m128n128k64": ("nmp", 128, 128, 64, 1, 256),
    # node-major tiles that only the fused adjoints use (their dense ceilings: 16x16 dx tiles, 16-deep
    # dW batch chunks)
    "nm_m16n16k64": ("nm", 16, 16, 64, 1, 64),
    "nm_m64n64k16": ("nm", 64, 64, 16, 1, 128),
    # the fp16 SIMT kernel with the next step's indices prefetched, 8-wide blocks (run 42: within 5 % of
    # sd_* at B = 1-32, never faster: with 8x8 blocks the index -> operand round trip is not the bound)
    "sdp_b8o8u4": ("simtp", 8, 8, 4, 1, 128),
    "sdp_b4o8u4": ("simtp", 4, 8, 4, 1, 128),
    "sdp_b8o8u2": ("simtp", 8, 8, 2, 1, 128),
    # the fp16 SIMT loops with W read as fp32 vec4 words of a cached, channel-permuted W^T (x still in place).
    # Run 47: never faster than the fp16 W^T loads (sw_b8o8u4 0.129 against sd_b8o8u4 0.124 ms replayed on
    # alexnet's stem at B = 16; ssw_* 0-25 % slower than ss_*): the W loads and their conversions are not what
    # bounds these loops.
    "sw_b8o8u4": ("simtw", 8, 8, 4, 1, 128),
    "sw_b8o8u2": ("simtw", 8, 8, 2, 1, 128),
    "sw_b4o8u4": ("simtw", 4, 8, 4, 1, 128),
    "sw_b8o16u2": ("simtw", 8, 16, 2, 1, 128),
    "ssw_b8o8u4": ("simtsw", 8, 8, 4, 1, 128),
    "ssw_b4o8u4": ("simtsw", 4, 8, 4, 1, 128),
    # split SIMT blocks that were never the fastest (run 44: within 5-15 % of ss_b4o8u4 / ss_b8o8u4 at best)
    "ss_b4o4u4": ("simts", 4, 4, 4, 1, 128),
    "ss_b16o8u2": ("simts", 16, 8, 2, 1, 128),
    # registered in session 9, not picked by session 10's rule (runs 59-63): kept runnable for sweeps and teaching
    "mma_o32b16": ("mma", 16, 32, 16, 1, 128),
    "mma_o32b32": ("mma", 32, 32, 16, 1, 128),
    "mma_o32b8": ("mma", 8, 32, 16, 1, 128),
    "mma_o32b8k64": ("mma", 8, 32, 64, 1, 128),
    "mma_o48b16": ("mma", 16, 48, 16, 1, 128),
    "mma_o64b32": ("mma", 32, 64, 16, 1, 128),
    "mmas_o64b32": ("mmas", 32, 64, 16, 1, 128),
    "mmat_o64b16": ("mmat", 16, 64, 16, 1, 128),
    "mmat_o64b16k64": ("mmat", 16, 64, 64, 1, 128),
    "mmat_o96b16": ("mmat", 16, 96, 16, 1, 128),
    "mmaw_o64b16": ("mmaw", 16, 64, 16, 1, 128),
    # more mma register blocks, for sweeps
    "mma_o128b16": ("mma", 16, 128, 16, 1, 128),
    "mma_o96b32": ("mma", 32, 96, 16, 1, 128),
    "mma_o64b16b64": ("mma", 16, 64, 16, 1, 64),
    "mma_o64b16b256": ("mma", 16, 64, 16, 1, 256),
    "mmas_o96b16": ("mmas", 16, 96, 16, 1, 128),
    "mmas_o128b16": ("mmas", 16, 128, 16, 1, 128),
    # mma loops of 2 (k32) or 4 (k64) k-steps per iteration: every load of the iteration issued before its
    # MMAs (session 10, run 59 sweep)
    "mma_o64b8k32": ("mma", 8, 64, 32, 1, 128),
    "mma_o32b16k32": ("mma", 16, 32, 32, 1, 128),
    "mma_o64b32k32": ("mma", 32, 64, 32, 1, 128),
    "mma_o32b16k64": ("mma", 16, 32, 64, 1, 128),
    "mmas_o32b8k32": ("mmas", 8, 32, 32, 1, 128),
    "mmas_o32b8k64": ("mmas", 8, 32, 64, 1, 128),
    "mmas_o64b8k32": ("mmas", 8, 64, 32, 1, 128),
    "mmas_o32b16k32": ("mmas", 16, 32, 32, 1, 128),
    "mmas_o64b16k32": ("mmas", 16, 64, 32, 1, 128),
    "mmasw_o32b8k32": ("mmasw", 8, 32, 32, 1, 128),
    "mmasw_o32b16k32": ("mmasw", 16, 32, 32, 1, 128),
    "mmasw_o64b16k32": ("mmasw", 16, 64, 32, 1, 128),
    "mmasw_o32b8k64": ("mmasw", 8, 32, 64, 1, 128),
    "mmaw_o64b16k32": ("mmaw", 16, 64, 32, 1, 128),
    "mmat_o64b16k32": ("mmat", 16, 64, 32, 1, 128),
    "mmat_o64b32k32": ("mmat", 32, 64, 32, 1, 128),
    "mmat_o96b16k32": ("mmat", 16, 96, 32, 1, 128),
    # the picks with 2-warp (b64) and 1-warp (b32) blocks: a grid of a few hundred warps in 4-warp blocks leaves
    # SMs idle (run 62: res18 layer3 at B = 64 ran 64 blocks on the 132 SMs); session 10, run 63
    "mmat_o64b16k64b64": ("mmat", 16, 64, 64, 1, 64),
    "mmat_o96b32k32b64": ("mmat", 32, 96, 32, 1, 64),
    "mmat_o96b32b64": ("mmat", 32, 96, 16, 1, 64),
    "mma_o32b8k32b64": ("mma", 8, 32, 32, 1, 64),
    "mmas_o32b8b64": ("mmas", 8, 32, 16, 1, 64),
    "mmas_o64b8b64": ("mmas", 8, 64, 16, 1, 64),
    "mma_o96b16b64": ("mma", 16, 96, 16, 1, 64),
    # the staged store (mmao / mmato: a block's warps are consecutive nodes and write y through a shared tile,
    # runs of block_dim/32 adjacent outputs instead of one 2-byte store per sector); session 10, run 63
    "mmato_o64b16": ("mmato", 16, 64, 16, 1, 128),
    "mmao_o64b32": ("mmao", 32, 64, 16, 1, 128),
    "mmao_o32b8k32": ("mmao", 8, 32, 32, 1, 128),
    # gather with register prefetch
    "gp_m16n32": ("gp", 16, 32, 64, 1, 64),
    "gp_m32n64": ("gp", 32, 64, 64, 1, 128),
    "gp_m64n64": ("gp", 64, 64, 64, 1, 128),
    "gp_m64n128": ("gp", 64, 128, 64, 1, 256),
}

_CACHED_CONFIG_SPECS: Dict[str, Tuple[str, int, int, int, int, int]] = {
    "c_m16n32": ("cached", 16, 32, 64, 1, 64),
    "c_m32n64": ("cached", 32, 64, 64, 1, 128),
    "c_m64n64": ("cached", 64, 64, 64, 1, 128),
}

# Configs that exist only to exercise the canary (never selected, never in warmup).
# test_oversized: 4 accumulators of 256x256 fp32 (1 MiB of tiles) exceed both a GPU CTA's shared memory
# (227 KiB on sm_90) and Warp's 256 KiB CPU tile arena.
_TEST_CONFIG_SPECS: Dict[str, Tuple[str, int, int, int, int, int]] = {
    "test_oversized": ("gather", 256, 256, 64, 4, 64),
}


def config_spec(name: str) -> FwdConfig:
    """The :class:`FwdConfig` registered under ``name`` (uncached, experimental, cached or test)."""
    for table in (_UNCACHED_BATCH_CONFIG_SPECS, _EXPERIMENTAL_CONFIG_SPECS, _CACHED_CONFIG_SPECS,
                  _TEST_CONFIG_SPECS):
        if name in table:
            return FwdConfig(name, *table[name])
    known = ", ".join(sorted(_UNCACHED_BATCH_CONFIG_SPECS) + sorted(_CACHED_CONFIG_SPECS))
    raise ValueError(f"config: unknown forward config {name!r}; known configs: {known}")


# Every registered config by name (uncached, experimental, cached; not the canary's test configs).
FORWARD: Dict[str, FwdConfig] = {name: FwdConfig(name, *spec) for table in (
    _UNCACHED_BATCH_CONFIG_SPECS, _EXPERIMENTAL_CONFIG_SPECS, _CACHED_CONFIG_SPECS) for name, spec in table.items()}


def uncached_config_names(family: Optional[str] = None, experimental: bool = False):
    """Registered uncached config names (of one family), plus the experimental ones if asked."""
    table = dict(_UNCACHED_BATCH_CONFIG_SPECS)
    if experimental:
        table.update(_EXPERIMENTAL_CONFIG_SPECS)
    return [n for n, s in table.items() if family is None or s[0] == family]


def cached_config_names():
    return list(_CACHED_CONFIG_SPECS)


def mathdx_default() -> Optional[bool]:
    """``FOVI_WARP_MATHDX=0`` builds the scalar-GEMM variant (fast compile, slow kernel); default:
    Warp's own setting (MathDx/cuBLASDx on CUDA)."""
    env = os.environ.get("FOVI_WARP_MATHDX")
    if env is None or env == "":
        return None
    return env not in ("0", "false", "False", "no")


# The tensor-core families (fovi_lab.kernels.forward.mma): "mma" + "s" (p loop split) + "w" (W read in place) + "t" (x^T).
MMA_FAMILIES = ("mma", "mmas", "mmaw", "mmasw", "mmat", "mmao", "mmato")


def mma_flags(family: str) -> Tuple[bool, bool, bool]:
    """(split, W in place, x^T) of an mma family name."""
    tail = family[3:]
    return "s" in tail, "w" in tail, "t" in tail


def mma_staged(family: str) -> bool:
    """Whether an mma family writes y through a shared tile (``mmao`` / ``mmato``: the staged store)."""
    return family in MMA_FAMILIES and family.endswith("o")


def dense_kind(cfg: FwdConfig) -> Tuple:
    """What identifies a config's dense-ceiling kernel: configs with equal kinds share one ceiling (the tile
    shape, and the loop and operand layouts where a family has its own: SIMT, vec4, each mma layout)."""
    fam = cfg.family
    if fam in ("simt", "simtp", "simts", "simtw", "simtsw"):
        fam = "simt"
    elif fam in MMA_FAMILIES:
        fam = fam.replace("mmas", "mma")
        fam = fam[:-1] if fam.endswith("o") else fam        # the staged store shares its loop's ceiling
    elif fam in ("nmp", "gp"):
        fam = "pipelined"
    elif fam != "simtv":
        fam = "tile"
    return (fam, cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim)


DENSE_FAMILIES = ("dense", "densep", "simt_dense", "simtv_dense", "mma_dense", "mmaw_dense", "mmat_dense")
