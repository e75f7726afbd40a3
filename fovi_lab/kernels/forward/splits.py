"""How a forward call's work is split: the split families' partial counts and the i2c family's node chunks.

The split families cut each output's loop over the P64 entries into ``S`` parts, each writing an fp32 partial that
one more launch sums in a fixed order (:func:`fovi_lab.kernels.forward.plans.nms_reduce_kernel`): :func:`simts_split`
(``simts`` / ``simtsw``), :func:`mmas_split` (``mmas`` / ``mmasw``), :func:`pipe_split` (``mmaps``) and
:func:`_nms_split` (``nms``) choose ``S`` from the grid and the loop's length. The ``i2c`` family gathers its im2col
stage in chunks of nodes that fit ``FOVI_WARP_I2C_MIB`` (:func:`_i2c_static`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Tuple

import fovi_lab.settings as settings
from fovi_lab.graph.meta import pad_to
from fovi_lab.kernels.forward.configs import FwdConfig


# The simts split: about _SIMTS_THREADS threads in all (the H200 holds 132 x 2048 resident), but never fewer
# than _SIMTS_MIN_STEPS loop steps per thread (each split adds a partial of B*Cout*Nout fp32 to write and sum).
# The H200 sweep (fovi_lab/records/h200/forward.jsonl.gz, the records with ``simts_threads``) tried
# 8192 / 32768 / 131072: 8x8 blocks were best at 32768 (res18 layer3 at B = 16 among them), 4x8 blocks at
# 131072 (alexnet L2 at B = 1 among them; on the small layers the three were close).
_SIMTS_THREADS = 32768
_SIMTS_THREADS_BY_BLOCK = {(4, 8): 131072}
_SIMTS_MIN_STEPS = 8


def simts_split(threads: int, steps: int, block: Tuple[int, int] = (8, 8)) -> Tuple[int, int]:
    """``(S, steps per split)`` for a simts launch of ``threads`` threads per split over ``steps`` loop
    steps (``unroll`` p entries each) with ``block = (tile_b, tile_o)`` register blocks; every split gets
    at least one step when there are any."""
    return _split(_SIMTS_THREADS_BY_BLOCK.get(tuple(block), _SIMTS_THREADS), threads, steps, _SIMTS_MIN_STEPS)


def _split(total: int, per_split: int, steps: int, min_steps: int) -> Tuple[int, int]:
    """``(S, steps per split)``: about ``total`` threads (warps, CTAs) in all from ``per_split`` each, never fewer than
    ``min_steps`` steps per split; every split gets at least one step when there are any."""
    if steps <= 0:
        return 1, 0
    s = max(1, min(-(-total // max(1, per_split)), steps // min_steps))
    per = -(-steps // s)
    return -(-steps // per), per


# The mmas split: about MMAS_WARPS warps in all (132 SMs x 16 resident warps of these ~128-register threads would be
# 2112), never fewer than _MMAS_MIN_STEPS k-steps of 16 p entries per split.
MMAS_WARPS = 2048
_MMAS_MIN_STEPS = 4


def mmas_split(warps: int, steps: int) -> Tuple[int, int]:
    """``(S, k-steps per split)`` for an mmas launch of ``warps`` warps per split over ``steps`` k-steps."""
    return _split(MMAS_WARPS, warps, steps, _MMAS_MIN_STEPS)


# The mmaps split: about MMAPS_CTAS CTAs in all (132 SMs x 2 resident CTAs of 128 threads at ~200 registers), never
# fewer than _PIPE_MIN_STEPS stages of tile_k p entries per split (the pipeline's prologue is S-1 of them).
MMAPS_CTAS = 264
_PIPE_MIN_STEPS = 8


def pipe_split(ctas: int, steps: int) -> Tuple[int, int]:
    """``(S, stages per split)`` for an mmaps launch of ``ctas`` CTAs per split over ``steps`` stages."""
    return _split(MMAPS_CTAS, ctas, steps, _PIPE_MIN_STEPS)


def _nms_split(dims, k: int) -> int:
    """Neighbour-loop split of the nms family: enough CTAs for ~2 waves on the H200 (256), at most K."""
    grid = dims[0] * dims[1] * dims[2]
    return int(max(1, min(k, -(-256 // max(1, grid)))))


# Budget of the i2c family's im2col staging buffer (``FOVI_WARP_I2C_MIB``, default 32 MiB): nodes are gathered
# and multiplied in chunks that fit it (alexnet's stem at B=64 needs 47 MB for all 964 nodes, 379 MB at 512).
def _i2c_stage_bytes() -> int:
    return int(settings.get("FOVI_WARP_I2C_MIB") * (1 << 20))


@dataclass(frozen=True)
class _I2cStatic:
    """What an i2c call derives from its shapes and tables alone (memoised per call signature)."""
    bx: int                     # batch padded to 8 (16-byte stage rows)
    coutp: int                  # Cout padded to 8 (16-byte weff rows)
    nc: int                     # nodes per chunk
    chunks: tuple               # ((n0, cnt, launch dims), ...)


def _i2c_static(cfg: FwdConfig, b: int, cout: int, nout: int, p64: int, budget: int) -> _I2cStatic:
    if p64 % cfg.tile_k:
        raise ValueError(f"config: {cfg.name!r} steps {cfg.tile_k} rows of P64 at a time, but P64={p64} is "
                         f"not a multiple of {cfg.tile_k}; pick a k64 config or leave config=None")
    bx = pad_to(b, 8)
    nc = max(1, min(nout, budget // (p64 * bx * 2)))
    chunks = tuple((n0, min(nc, nout - n0), (min(nc, nout - n0), -(-b // cfg.tile_m), -(-cout // cfg.tile_n)))
                   for n0 in range(0, nout, nc))
    return _I2cStatic(bx=bx, coutp=pad_to(cout, 8), nc=nc, chunks=chunks)
