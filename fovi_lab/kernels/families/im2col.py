"""An im2col stage and a plain tile GEMM: for the stems (Cin < 32) and the DINOv3 patch embed.

Kernels: :func:`fovi_lab.kernels.forward.tile.make_i2c_kernel`. Per call, a SIMT row copy stages each node's
gathered input rows (and, unless ``w_gathered``, its effective weight rows) densely; the kernel is then a tile
loop over contiguous tiles, ``tile_k`` p entries per step.
"""

from __future__ import annotations

import re
from typing import List, Optional

from fovi_lab.kernels.families.base import DeviceSpec, Family, Param, Point, Problem, check_shared, words_of
from fovi_lab.kernels.families.tile_gemm import tile_bill


class Im2col(Family):
    key = "im2col"
    title = "im2col stage + tile GEMM"
    module = "fovi_lab.kernels.forward.tile"
    tensor_cores = True
    params = (
        Param("tile_m", "batch rows per tile", (16, 32, 64, 128)),
        Param("tile_n", "output channels per tile", (64, 96, 128)),
        Param("tile_k", "p entries per step", (64, 128), words=lambda v: f"{v} p entries per step"),
        Param("warps", "warps per block", (2, 4, 8), words=lambda v: f"{v} warps per block", default=4),
        Param("w_gathered", "W gathered in the kernel", (False, True),
              words=words_of({False: None, True: "W gathered in the kernel"})),
    )
    variants = {"i2c": {"w_gathered": False}, "i2cg": {"w_gathered": True}}

    head_params = 2

    def head(self, point: Point) -> str:
        return f"{point['tile_m']} rows x {point['tile_n']} channels per tile"

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        return check_shared(tile_bill(point["tile_m"], point["tile_n"], point["tile_k"], 1, index_tiles=0), device,
                            "its tiles")

    def problem_reasons(self, point: Point, problem: Problem) -> List[str]:
        reasons = super().problem_reasons(point, problem)
        if problem.p64 % point["tile_k"]:
            reasons.append(f"steps {point['tile_k']} p entries at a time, but P64={problem.p64} is not a multiple of "
                           f"{point['tile_k']}; pick a 64-deep config or leave config=None")
        return reasons

    def format_id(self, point: Point, explicit: bool = False) -> str:
        bd = point["warps"] * 32
        return (f"{self.variant(point)}_m{point['tile_m']}n{point['tile_n']}k{point['tile_k']}"
                + (f"b{bd}" if bd != 128 or explicit else ""))

    _ID = re.compile(r"^(i2cg?)_m(\d+)n(\d+)k(\d+)(?:b(\d+))?$")

    def parse_id(self, text: str) -> Optional[Point]:
        m = self._ID.match(text)
        if not m:
            return None
        return self.point(tile_m=int(m.group(2)), tile_n=int(m.group(3)), tile_k=int(m.group(4)),
                          warps=int(m.group(5) or 128) // 32, **self.variants[m.group(1)])

    def config_fields(self, point: Point):
        return point["tile_m"], point["tile_n"], point["tile_k"], 1, point["warps"] * 32

    def from_config(self, cfg) -> Point:
        return self.point(tile_m=cfg.tile_m, tile_n=cfg.tile_n, tile_k=cfg.tile_k, warps=cfg.block_dim // 32,
                          **self.variants[cfg.family])

    def dataflow(self, cfg) -> str:
        return "im2col"

    def canary_p64(self, cfg) -> int:
        return max(64, cfg.tile_k)

    def make_kernel(self, cfg, mathdx=None, dense=False, bf16=False):
        import fovi_lab.kernels.forward.tile as T
        if dense:
            return T.make_dense_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim, mathdx)
        return T.make_i2c_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim,
                                 self.variants[cfg.family]["w_gathered"], mathdx)

    def block_shape(self, point: Point):
        return point["tile_m"], point["tile_n"]

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        s = problem.itemsize
        rows = 2.0 * s * problem.batch * problem.p64 * problem.nout               # the staged rows, written and read
        weff = 0.0 if point["w_gathered"] else 2.0 * s * problem.nout * problem.p64 * problem.cout
        return rows + weff


FAMILY = Im2col()
