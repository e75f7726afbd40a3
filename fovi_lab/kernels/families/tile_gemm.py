"""Warp tile GEMMs over gathered rows: any index tables.

Kernels: :func:`fovi_lab.kernels.forward.tile.make_gather_kernel` and its prefetching form
:func:`~fovi_lab.kernels.forward.tile.make_gp_kernel`. A block owns ``tile_m`` batch rows (``r`` such tiles
sharing each weight tile) x ``tile_n`` output channels of one node; each 64-wide p tile is two indexed row
gathers (``tile_load_indexed``) from x^T and W^T, then ``tile_matmul`` into fp32 tiles. The pad index is one
row past x^T's end and reads 0 through the bounds check.

The module also holds what the tile families (this one, node_major, im2col and cached) declare alike: the shared
memory bill of a tile block, the tile-shape parameters and id fields, ``r`` and ``prefetch``, and the dense ceiling.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from fovi_lab.kernels.families.base import (BLOCK, DeviceSpec, Family, IdField, Param, Point, Problem, check_shared,
                                            switch, warps_param)


def tile_bill(tile_m: int, tile_n: int, tile_k: int, r: int = 1, index_tiles: int = 2) -> int:
    """A lower bound of the shared memory a tile-GEMM block reserves: ``r`` fp16 A tiles, one W tile, ``r`` fp32
    accumulators, the index tiles and the bias (Warp's own count, read after codegen, is at least this)."""
    return int(r * tile_m * tile_k * 2 + tile_k * tile_n * 2 + r * tile_m * tile_n * 4 + index_tiles * tile_k * 4
               + tile_n * 4)


#: The readable name's first phrase of the tile families (tile_gemm, node_major, im2col, cached).
TILE_HEAD = "{tile_m} rows x {tile_n} channels per tile"
#: Their ids' tile fields: ``m<tile_m>n<tile_n>``.
TILE_FIELDS = (IdField("m", "tile_m"), IdField("n", "tile_n"))
#: Their ``r``: batch tiles sharing each weight tile, written in the ids where it is not 1.
R_PARAM = Param("r", "batch tiles per weight tile", (1, 2, 4),
                words=lambda v: None if v == 1 else f"{v} batch tiles share each weight tile")
R_FIELD = IdField("r", "r", default=1)
PREFETCH = switch("prefetch", "prefetch", "next tiles prefetched")


def tile_shape(rows: Tuple[int, ...], channels: Tuple[int, ...]) -> Tuple[Param, Param]:
    """The ``tile_m`` and ``tile_n`` parameters of a tile family: batch rows and output channels per tile."""
    return Param("tile_m", "batch rows per tile", rows), Param("tile_n", "output channels per tile", channels)


def dense_tile_kernel(source, cfg, mathdx=None, kind: str = "tile"):
    """The dense ceiling of a tile family's configs-table entry ``cfg`` whose :meth:`~Family.dense_kind` is
    ``kind``: the plain tile loop (``tile``) or the prefetching one (``pipelined``), from the factories of
    ``source`` (the tile kernels' module)."""
    if kind == "pipelined":
        return source.make_densep_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, mathdx)
    return source.make_dense_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim, mathdx)


class TileGemm(Family):
    key = "tile_gemm"
    title = "tile GEMM over gathered rows"
    module = "fovi_lab.kernels.forward.tile"
    tensor_cores = True          # (tile_matmul: MathDx on the tensor cores where Warp has it)
    params = (*tile_shape((16, 32, 64, 128), (32, 64, 96, 128)), R_PARAM, warps_param((2, 4, 8, 16), default=4),
              PREFETCH)
    variants = {"gather": {"prefetch": False}, "gp": {"prefetch": True}}
    tile_k = 64
    head_words = TILE_HEAD
    id_prefixes = {"gather": ""}
    id_fields = (*TILE_FIELDS, R_FIELD, BLOCK)
    config_params = ("tile_m", "tile_n", tile_k, "r")

    def combine_reasons(self, point: Point) -> List[str]:
        reasons = super().combine_reasons(point)
        if point["prefetch"] and point["r"] != 1:
            reasons.append("the prefetching kernel has one batch tile per weight tile")
        return reasons

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        bill = tile_bill(point["tile_m"], point["tile_n"], self.tile_k, point["r"]) * (2 if point["prefetch"] else 1)
        return check_shared(bill, device, "its tiles")

    def dataflow(self, cfg) -> str:
        return "gather"

    def dense_kind(self, cfg) -> str:
        return "pipelined" if self.variant_values(cfg)["prefetch"] else "tile"

    def make_kernel(self, source, cfg, mathdx=None, dense=False, bf16=False):
        if dense:
            return dense_tile_kernel(source, cfg, mathdx, self.dense_kind(cfg))
        if self.variant_values(cfg)["prefetch"]:
            return source.make_gp_kernel(cfg.tile_m, cfg.tile_n, cfg.block_dim, mathdx)
        return source.make_gather_kernel(cfg.tile_m, cfg.tile_n, cfg.r, cfg.block_dim, mathdx)

    def block_shape(self, point: Point):
        return point["tile_m"] * point["r"], point["tile_n"]

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        return 2.0 * problem.itemsize * (problem.batch * problem.cin * problem.nin + problem.cout * problem.q)


FAMILY = TileGemm()
