"""An im2col stage and a plain tile GEMM: for the stems (Cin < 32) and the DINOv3 patch embed.

Kernels: :func:`fovi_lab.kernels.forward.tile.make_i2c_kernel`. Per call, a SIMT row copy stages each node's
gathered input rows (and, unless ``w_gathered``, its effective weight rows) densely; the kernel is then a tile
loop over contiguous tiles, ``tile_k`` p entries per step.
"""

from __future__ import annotations

from typing import List, Optional

from fovi_lab.kernels.families.base import (BLOCK, DeviceSpec, Family, IdField, Param, Point, Problem, check_shared,
                                            switch, warps_param)
from fovi_lab.kernels.families.tile_gemm import TILE_FIELDS, TILE_HEAD, dense_tile_kernel, tile_bill, tile_shape


class Im2col(Family):
    key = "im2col"
    title = "im2col stage + tile GEMM"
    module = "fovi_lab.kernels.forward.tile"
    tensor_cores = True
    params = (*tile_shape((16, 32, 64, 128), (64, 96, 128)), Param("tile_k", "p entries per step", (64, 128)),
              warps_param((2, 4, 8), default=4), switch("w_gathered", "W gathered in the kernel"))
    variants = {"i2c": {"w_gathered": False}, "i2cg": {"w_gathered": True}}
    head_words = TILE_HEAD
    id_fields = (*TILE_FIELDS, IdField("k", "tile_k"), BLOCK)
    config_params = ("tile_m", "tile_n", "tile_k", 1)

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        return check_shared(tile_bill(point["tile_m"], point["tile_n"], point["tile_k"], 1, index_tiles=0), device,
                            "its tiles")

    def problem_reasons(self, point: Point, problem: Problem) -> List[str]:
        reasons = super().problem_reasons(point, problem)
        if problem.p64 % point["tile_k"]:
            reasons.append(f"steps {point['tile_k']} p entries at a time, but P64={problem.p64} is not a multiple of "
                           f"{point['tile_k']}; pick a 64-deep config or leave config=None")
        return reasons

    def dataflow(self, cfg) -> str:
        return "im2col"

    def canary_p64(self, cfg) -> int:
        return max(64, cfg.tile_k)

    def make_kernel(self, source, cfg, mathdx=None, dense=False, bf16=False):
        if dense:
            return dense_tile_kernel(source, cfg, mathdx, self.dense_kind(cfg))
        return source.make_i2c_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim,
                                 self.variant_values(cfg)["w_gathered"], mathdx)

    def block_shape(self, point: Point):
        return point["tile_m"], point["tile_n"]

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        s = problem.itemsize
        rows = 2.0 * s * problem.batch * problem.p64 * problem.nout               # the staged rows, written and read
        weff = 0.0 if point["w_gathered"] else 2.0 * s * problem.nout * problem.p64 * problem.cout
        return rows + weff


FAMILY = Im2col()
