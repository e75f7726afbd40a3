"""Warp tile GEMMs on node-major operands: each neighbour's channel run is one contiguous tile load.

Kernels: :func:`fovi_lab.kernels.forward.tile.make_nm_kernel`, its split form
:func:`~fovi_lab.kernels.forward.tile.make_nms_kernel` and its prefetching form
:func:`~fovi_lab.kernels.forward.tile.make_nmp_kernel`. For tables of the fovi form (docs/operator.md §2.1,
``input_linear[n, c*K+k] = c*Nin + idx[n, k]``), x node-major and W tap-major: a block walks the node's
neighbours and ``tile_k`` channels at a time, and skips pad neighbours. ``split``: the neighbour loop is cut
across blocks into fp32 partials summed in a fixed order (few output nodes).
"""

from __future__ import annotations

import re
from typing import List, Optional

from fovi_lab.graph.meta import pad_to
from fovi_lab.kernels.families.base import DeviceSpec, Family, Param, Point, Problem, check_shared, words_of
from fovi_lab.kernels.families.tile_gemm import tile_bill


class NodeMajor(Family):
    key = "node_major"
    title = "node-major tile GEMM"
    module = "fovi_lab.kernels.forward.tile"
    tensor_cores = True
    params = (
        Param("tile_m", "batch rows per tile", (16, 32, 64, 128)),
        Param("tile_n", "output channels per tile", (16, 32, 64, 128)),
        Param("tile_k", "channels per step", (16, 32, 64, 128), words=lambda v: f"{v} channels per step"),
        Param("r", "batch tiles per weight tile", (1, 2, 4),
              words=lambda v: None if v == 1 else f"{v} batch tiles share each weight tile"),
        Param("warps", "warps per block", (2, 4, 8), words=lambda v: f"{v} warps per block", default=4),
        Param("split", "neighbour loop split", (False, True),
              words=words_of({False: None, True: "neighbour loop split"})),
        Param("prefetch", "prefetch", (False, True), words=words_of({False: None, True: "next tiles prefetched"})),
    )
    variants = {"nm": {"split": False, "prefetch": False}, "nms": {"split": True, "prefetch": False},
                "nmp": {"split": False, "prefetch": True}}
    _PREFIX = {"nm": "nm", "nms": "nms", "nmp": "nmp"}

    head_params = 2

    def head(self, point: Point) -> str:
        return f"{point['tile_m']} rows x {point['tile_n']} channels per tile"

    def combine_reasons(self, point: Point) -> List[str]:
        reasons = super().combine_reasons(point)
        if (point["split"] or point["prefetch"]) and point["r"] != 1:
            reasons.append("the split and prefetching kernels have one batch tile per weight tile")
        return reasons

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        bill = tile_bill(point["tile_m"], point["tile_n"], point["tile_k"], point["r"], index_tiles=0)
        return check_shared(bill * (2 if point["prefetch"] else 1), device, "its tiles")

    def problem_reasons(self, point: Point, problem: Problem) -> List[str]:
        reasons = super().problem_reasons(point, problem)
        if not problem.node_major:
            reasons.append("needs node-major index tables, built as in docs/operator.md §2.1 (input_linear[n, c*K+k] = "
                           "c*Nin + idx[n, k]); these are not")
        return reasons

    def format_id(self, point: Point, explicit: bool = False) -> str:
        bd, r = point["warps"] * 32, point["r"]
        return (f"{self.variant(point)}_m{point['tile_m']}n{point['tile_n']}k{point['tile_k']}"
                + (f"r{r}" if r != 1 or explicit else "") + (f"b{bd}" if bd != 128 or explicit else ""))

    _ID = re.compile(r"^(nm|nms|nmp)_m(\d+)n(\d+)k(\d+)(?:r(\d+))?(?:b(\d+))?$")

    def parse_id(self, text: str) -> Optional[Point]:
        m = self._ID.match(text)
        if not m:
            return None
        return self.point(tile_m=int(m.group(2)), tile_n=int(m.group(3)), tile_k=int(m.group(4)),
                          r=int(m.group(5) or 1), warps=int(m.group(6) or 128) // 32, **self.variants[m.group(1)])

    def config_fields(self, point: Point):
        return point["tile_m"], point["tile_n"], point["tile_k"], point["r"], point["warps"] * 32

    def from_config(self, cfg) -> Point:
        return self.point(tile_m=cfg.tile_m, tile_n=cfg.tile_n, tile_k=cfg.tile_k, r=cfg.r,
                          warps=cfg.block_dim // 32, **self.variants[cfg.family])

    def dataflow(self, cfg) -> str:
        return "node_major_lists" if self.variants[cfg.family]["prefetch"] else "node_major"

    def dense_kind(self, cfg) -> str:
        return "pipelined" if self.variants[cfg.family]["prefetch"] else "tile"

    def make_kernel(self, cfg, mathdx=None, dense=False, bf16=False):
        import fovi_lab.kernels.forward.tile as T
        v = self.variants[cfg.family]
        if dense:
            return (T.make_densep_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, mathdx) if v["prefetch"]
                    else T.make_dense_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim, mathdx))
        if v["prefetch"]:
            return T.make_nmp_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, mathdx)
        if v["split"]:
            return T.make_nms_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, mathdx)
        return T.make_nm_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim, mathdx)

    def block_shape(self, point: Point):
        return point["tile_m"] * point["r"], point["tile_n"]

    def padded_flops(self, point: Point, problem: Problem) -> float:
        # the channel runs are padded to tile_k too
        return super().padded_flops(point, problem) * pad_to(problem.cin, point["tile_k"]) / problem.cin

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        return 2.0 * problem.itemsize * (problem.batch * problem.cin * problem.nin + problem.cout * problem.q)


FAMILY = NodeMajor()
