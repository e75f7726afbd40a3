"""Warp tile GEMMs over gathered rows: any index tables.

Kernels: :func:`fovi_lab.kernels.forward.tile.make_gather_kernel` and its prefetching form
:func:`~fovi_lab.kernels.forward.tile.make_gp_kernel`. A block owns ``tile_m`` batch rows (``r`` such tiles
sharing each weight tile) x ``tile_n`` output channels of one node; each 64-wide p tile is two indexed row
gathers (``tile_load_indexed``) from x^T and W^T, then ``tile_matmul`` into fp32 tiles. The pad index is one
row past x^T's end and reads 0 through the bounds check.
"""

from __future__ import annotations

import re
from typing import List, Optional

from fovi_lab.kernels.families.base import DeviceSpec, Family, Param, Point, Problem, check_shared, words_of


def tile_bill(tile_m: int, tile_n: int, tile_k: int, r: int = 1, index_tiles: int = 2) -> int:
    """A lower bound of the shared memory a tile-GEMM block reserves: ``r`` fp16 A tiles, one W tile, ``r`` fp32
    accumulators, the index tiles and the bias (Warp's own count, read after codegen, is at least this)."""
    return int(r * tile_m * tile_k * 2 + tile_k * tile_n * 2 + r * tile_m * tile_n * 4 + index_tiles * tile_k * 4
               + tile_n * 4)


class TileGemm(Family):
    key = "tile_gemm"
    title = "tile GEMM over gathered rows"
    module = "fovi_lab.kernels.forward.tile"
    tensor_cores = True          # (tile_matmul: MathDx on the tensor cores where Warp has it)
    params = (
        Param("tile_m", "batch rows per tile", (16, 32, 64, 128)),
        Param("tile_n", "output channels per tile", (32, 64, 96, 128)),
        Param("r", "batch tiles per weight tile", (1, 2, 4),
              words=lambda v: None if v == 1 else f"{v} batch tiles share each weight tile"),
        Param("warps", "warps per block", (2, 4, 8, 16), words=lambda v: f"{v} warps per block", default=4),
        Param("prefetch", "prefetch", (False, True), words=words_of({False: None, True: "next tiles prefetched"})),
    )
    variants = {"gather": {"prefetch": False}, "gp": {"prefetch": True}}
    tile_k = 64

    head_params = 2

    def head(self, point: Point) -> str:
        return f"{point['tile_m']} rows x {point['tile_n']} channels per tile"

    def combine_reasons(self, point: Point) -> List[str]:
        reasons = super().combine_reasons(point)
        if point["prefetch"] and point["r"] != 1:
            reasons.append("the prefetching kernel has one batch tile per weight tile")
        return reasons

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        bill = tile_bill(point["tile_m"], point["tile_n"], self.tile_k, point["r"]) * (2 if point["prefetch"] else 1)
        return check_shared(bill, device, "its tiles")

    def format_id(self, point: Point, explicit: bool = False) -> str:
        bd, r = point["warps"] * 32, point["r"]
        return (("gp_" if point["prefetch"] else "") + f"m{point['tile_m']}n{point['tile_n']}"
                + (f"r{r}" if r != 1 or explicit else "") + (f"b{bd}" if bd != 128 or explicit else ""))

    _ID = re.compile(r"^(gp_)?m(\d+)n(\d+)(?:r(\d+))?(?:b(\d+))?$")

    def parse_id(self, text: str) -> Optional[Point]:
        m = self._ID.match(text)
        if not m:
            return None
        return self.point(tile_m=int(m.group(2)), tile_n=int(m.group(3)), r=int(m.group(4) or 1),
                          warps=int(m.group(5) or 128) // 32, prefetch=bool(m.group(1)))

    def config_fields(self, point: Point):
        return point["tile_m"], point["tile_n"], self.tile_k, point["r"], point["warps"] * 32

    def from_config(self, cfg) -> Point:
        return self.point(tile_m=cfg.tile_m, tile_n=cfg.tile_n, r=cfg.r, warps=cfg.block_dim // 32,
                          prefetch=cfg.family == "gp")

    def dataflow(self, cfg) -> str:
        return "gather"

    def dense_kind(self, cfg) -> str:
        return "pipelined" if self.variants[cfg.family]["prefetch"] else "tile"

    def make_kernel(self, cfg, mathdx=None, dense=False, bf16=False):
        import fovi_lab.kernels.forward.tile as T
        if self.variants[cfg.family]["prefetch"]:
            return (T.make_densep_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, mathdx) if dense
                    else T.make_gp_kernel(cfg.tile_m, cfg.tile_n, cfg.block_dim, mathdx))
        if dense:
            return T.make_dense_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim, mathdx)
        return T.make_gather_kernel(cfg.tile_m, cfg.tile_n, cfg.r, cfg.block_dim, mathdx)

    def block_shape(self, point: Point):
        return point["tile_m"] * point["r"], point["tile_n"]

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        return 2.0 * problem.itemsize * (problem.batch * problem.cin * problem.nin + problem.cout * problem.q)


FAMILY = TileGemm()
