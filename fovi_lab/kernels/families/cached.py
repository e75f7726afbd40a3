"""Inference from the effective-weight cache ``Weff[n] [P64, Cout_pad]``: one gather (x) per p tile.

Kernel: :func:`fovi_lab.kernels.forward.tile.make_cached_kernel`, run by
:func:`fovi_lab.kernels.forward.api.run_cached` (the ``warp_cached`` backend); never a training forward.
"""

from __future__ import annotations

from typing import List, Optional

from fovi_lab.kernels.families.base import BLOCK, DeviceSpec, Family, Point, Problem, check_shared, warps_param
from fovi_lab.kernels.families.tile_gemm import TILE_FIELDS, TILE_HEAD, dense_tile_kernel, tile_bill, tile_shape


class Cached(Family):
    key = "cached"
    title = "tile GEMM on the cached effective weight"
    module = "fovi_lab.kernels.forward.tile"
    tensor_cores = True
    inference_only = True
    params = (*tile_shape((16, 32, 64), (32, 64, 128)), warps_param((2, 4, 8)))
    variants = {"cached": {}}
    head_words = TILE_HEAD
    id_prefixes = {"cached": "c_"}
    id_fields = (*TILE_FIELDS, BLOCK)
    config_params = ("tile_m", "tile_n", 64, 1)

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        return check_shared(tile_bill(point["tile_m"], point["tile_n"], 64, 1, index_tiles=1), device, "its tiles")

    def dataflow(self, cfg) -> str:
        return "cached"

    def make_kernel(self, source, cfg, mathdx=None, dense=False, bf16=False):
        if dense:
            return dense_tile_kernel(source, cfg, mathdx, self.dense_kind(cfg))
        return source.make_cached_kernel(cfg.tile_m, cfg.tile_n, cfg.block_dim, mathdx)

    def block_shape(self, point: Point):
        return point["tile_m"], point["tile_n"]

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        # Weff [Nout, P64, Cout] is read instead of W
        return problem.itemsize * (problem.nout * problem.p64 * problem.cout - problem.cout * problem.q)


FAMILY = Cached()
