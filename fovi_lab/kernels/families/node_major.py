"""Warp tile GEMMs on node-major operands: each neighbour's channel run is one contiguous tile load.

Kernels: :func:`fovi_lab.kernels.forward.tile.make_nm_kernel`, its split form
:func:`~fovi_lab.kernels.forward.tile.make_nms_kernel` and its prefetching form
:func:`~fovi_lab.kernels.forward.tile.make_nmp_kernel`. For tables of the fovi form (docs/operator.md §2.1,
``input_linear[n, c*K+k] = c*Nin + idx[n, k]``), x node-major and W tap-major: a block walks the node's
neighbours and ``tile_k`` channels at a time, and skips pad neighbours. ``split``: the neighbour loop is cut
across blocks into fp32 partials summed in a fixed order (few output nodes).
"""

from __future__ import annotations

from typing import List, Optional

from fovi_lab.graph.meta import pad_to
from fovi_lab.kernels.families.base import (BLOCK, DeviceSpec, Family, IdField, Param, Point, Problem, check_shared,
                                            switch, warps_param)
from fovi_lab.kernels.families.tile_gemm import (PREFETCH, R_FIELD, R_PARAM, TILE_FIELDS, TILE_HEAD, dense_tile_kernel,
                                                 tile_bill, tile_shape)


class NodeMajor(Family):
    key = "node_major"
    title = "node-major tile GEMM"
    module = "fovi_lab.kernels.forward.tile"
    tensor_cores = True
    params = (*tile_shape((16, 32, 64, 128), (16, 32, 64, 128)),
              Param("tile_k", "channels per step", (16, 32, 64, 128)), R_PARAM,
              warps_param((2, 4, 8), default=4), switch("split", "neighbour loop split"), PREFETCH)
    variants = {"nm": {"split": False, "prefetch": False}, "nms": {"split": True, "prefetch": False},
                "nmp": {"split": False, "prefetch": True}}
    head_words = TILE_HEAD
    id_fields = (*TILE_FIELDS, IdField("k", "tile_k"), R_FIELD, BLOCK)
    config_params = ("tile_m", "tile_n", "tile_k", "r")

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

    def dataflow(self, cfg) -> str:
        return "node_major_lists" if self.variant_values(cfg)["prefetch"] else "node_major"

    def dense_kind(self, cfg) -> str:
        return "pipelined" if self.variant_values(cfg)["prefetch"] else "tile"

    def make_kernel(self, source, cfg, mathdx=None, dense=False, bf16=False):
        if dense:
            return dense_tile_kernel(source, cfg, mathdx, self.dense_kind(cfg))
        v = self.variant_values(cfg)
        if v["prefetch"]:
            return source.make_nmp_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, mathdx)
        if v["split"]:
            return source.make_nms_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim, mathdx)
        return source.make_nm_kernel(cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim, mathdx)

    def block_shape(self, point: Point):
        return point["tile_m"] * point["r"], point["tile_n"]

    def padded_flops(self, point: Point, problem: Problem) -> float:
        # the channel runs are padded to tile_k too
        return super().padded_flops(point, problem) * pad_to(problem.cin, point["tile_k"]) / problem.cin

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        return 2.0 * problem.itemsize * (problem.batch * problem.cin * problem.nin + problem.cout * problem.q)


FAMILY = NodeMajor()
