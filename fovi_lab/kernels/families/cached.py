"""Inference from the effective-weight cache ``Weff[n] [P64, Cout_pad]``: one gather (x) per p tile.

Kernel: :func:`fovi_lab.kernels.forward.tile.make_cached_kernel`, run by
:func:`fovi_lab.kernels.forward.api.run_cached` (the ``warp_cached`` backend); never a training forward.
"""

from __future__ import annotations

import re
from typing import List, Optional

from fovi_lab.kernels.families.base import DeviceSpec, Family, Param, Point, Problem, check_shared
from fovi_lab.kernels.families.tile_gemm import tile_bill


class Cached(Family):
    key = "cached"
    title = "tile GEMM on the cached effective weight"
    module = "fovi_lab.kernels.forward.tile"
    tensor_cores = True
    inference_only = True
    params = (
        Param("tile_m", "batch rows per tile", (16, 32, 64)),
        Param("tile_n", "output channels per tile", (32, 64, 128)),
        Param("warps", "warps per block", (2, 4, 8), words=lambda v: f"{v} warps per block"),
    )
    variants = {"cached": {}}

    head_params = 2

    def head(self, point: Point) -> str:
        return f"{point['tile_m']} rows x {point['tile_n']} channels per tile"

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        return check_shared(tile_bill(point["tile_m"], point["tile_n"], 64, 1, index_tiles=1), device, "its tiles")

    def format_id(self, point: Point, explicit: bool = False) -> str:
        bd = point["warps"] * 32
        return f"c_m{point['tile_m']}n{point['tile_n']}" + (f"b{bd}" if bd != 128 or explicit else "")

    _ID = re.compile(r"^c_m(\d+)n(\d+)(?:b(\d+))?$")

    def parse_id(self, text: str) -> Optional[Point]:
        m = self._ID.match(text)
        if not m:
            return None
        return self.point(tile_m=int(m.group(1)), tile_n=int(m.group(2)), warps=int(m.group(3) or 128) // 32)

    def config_fields(self, point: Point):
        return point["tile_m"], point["tile_n"], 64, 1, point["warps"] * 32

    def from_config(self, cfg) -> Point:
        return self.point(tile_m=cfg.tile_m, tile_n=cfg.tile_n, warps=cfg.block_dim // 32)

    def dataflow(self, cfg) -> str:
        return "cached"

    def make_kernel(self, cfg, mathdx=None, dense=False, bf16=False):
        import fovi_lab.kernels.forward.tile as T
        if dense:
            return T.make_dense_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim, mathdx)
        return T.make_cached_kernel(cfg.tile_m, cfg.tile_n, cfg.block_dim, mathdx)

    def block_shape(self, point: Point):
        return point["tile_m"], point["tile_n"]

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        # Weff [Nout, P64, Cout] is read instead of W
        return problem.itemsize * (problem.nout * problem.p64 * problem.cout - problem.cout * problem.q)


FAMILY = Cached()
