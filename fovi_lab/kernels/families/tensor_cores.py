"""Tensor cores from registers: each warp gathers its own fragments and issues ``mma.sync.m16n8k16``.

One kernel, :func:`fovi_lab.kernels.forward.mma.make_mma_kernel`. A warp owns ``tile_o`` output channels x
``tile_b`` batch rows of one node (fp32 accumulators in registers) and walks the node's p loop ``k`` entries
per iteration, each lane loading the A (weight) and B (input) fragment elements PTX assigns it. The
parameters: the warp's tile, the loop depth, warps per block, where x and W are read from (in place, or a
per-call transposed copy whose rows are contiguous for vector loads), whether the p loop is split across
warps into fp32 partials summed in a fixed order (few-node layers: more warps in flight), and whether y is
stored straight from the registers or through a shared tile (runs of consecutive nodes per store).
"""

from __future__ import annotations

from dataclasses import replace
from typing import List, Optional

import torch

from fovi_lab.kernels.families.base import (BLOCK, DeviceSpec, Family, IdField, Param, Point, Problem, needs_arch,
                                            switch, warps_param, words_of)


class TensorCores(Family):
    key = "tensor_cores"
    title = "tensor cores"
    module = "fovi_lab.kernels.forward.mma"
    tensor_cores = True
    mma_sync = True
    training = True
    dtypes = (torch.float16, torch.bfloat16)
    params = (
        Param("tile_o", "output channels per warp", (16, 32, 48, 64, 80, 96, 112, 128)),
        Param("tile_b", "batch rows per warp", (8, 16, 32, 64)),
        Param("k", "p entries per step", (16, 32, 64), default=16),
        warps_param((1, 2, 4, 8), default=4),
        Param("x_layout", "x layout", ("in place", "transposed"),
              words=words_of({"in place": None, "transposed": "x^T layout"})),
        Param("w_layout", "W layout", ("transposed", "in place"),
              words=words_of({"transposed": None, "in place": "W read in place"})),
        switch("split", "p loop split"),
        Param("store", "store", ("direct", "shared tile"),
              words=words_of({"direct": None, "shared tile": "stores through a shared tile"})),
    )
    _BASE = dict(x_layout="in place", w_layout="transposed", split=False, store="direct")
    variants = {
        "mma": _BASE,
        "mmas": {**_BASE, "split": True},
        "mmaw": {**_BASE, "w_layout": "in place"},
        "mmasw": {**_BASE, "split": True, "w_layout": "in place"},
        "mmat": {**_BASE, "x_layout": "transposed"},
        "mmao": {**_BASE, "store": "shared tile"},
        "mmato": {**_BASE, "x_layout": "transposed", "store": "shared tile"},
    }

    head_words = "{tile_o} channels x {tile_b} rows per warp"
    id_fields = (IdField("o", "tile_o"), IdField("b", "tile_b"), IdField("k", "k", default=16),
                 replace(BLOCK, exact=True))          # (a block size that is not whole warps names no point)
    config_params = ("tile_b", "tile_o", "k", 1)

    def combine_reasons(self, point: Point) -> List[str]:
        reasons = super().combine_reasons(point)
        acc = point["tile_o"] // 16 * point["tile_b"] // 8 * 4
        if acc > 128:
            reasons.append(f"a {point['tile_o']} x {point['tile_b']} warp tile keeps {acc} fp32 accumulators per "
                           f"lane, over the 128 that leave room for its fragments in 255 registers")
        return reasons

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        reasons = needs_arch(80, device, "mma.sync.m16n8k16")
        if point["warps"] * 32 > 1024:
            reasons.append("more than 1024 threads per block")
        return reasons

    unit = "warp"

    def dataflow(self, cfg) -> str:
        return "in_place"

    def dense_kind(self, cfg) -> str:
        v = self.variant_values(cfg)
        return "mma" + ("w" if v["w_layout"] == "in place" else "") + ("t" if v["x_layout"] == "transposed" else "")

    def fp32_output(self, cfg) -> bool:
        return bool(self.variant_values(cfg)["split"])

    def make_kernel(self, source, cfg, mathdx=None, dense=False, bf16=False):
        v = self.variant_values(cfg)
        return source.make_mma_kernel(cfg.tile_n // 16, cfg.tile_m // 8, cfg.block_dim, split=v["split"] and not dense,
                               dense=dense, w_native=v["w_layout"] == "in place", x_t=v["x_layout"] == "transposed",
                               k_steps=cfg.tile_k // 16, stage=v["store"] == "shared tile" and not dense, bf16=bf16)

    def block_shape(self, point: Point):
        return point["tile_b"], point["tile_o"]

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        s = problem.itemsize
        extra = 0.0
        if point["x_layout"] == "transposed":             # x^T written and read once more
            extra += 2.0 * s * problem.batch * problem.cin * problem.nin
        if point["w_layout"] == "transposed":             # W^T written and read once more
            extra += 2.0 * s * problem.cout * problem.q
        if point["split"]:                                # fp32 partials written and read back
            extra += 2.0 * 4 * problem.batch * problem.cout * problem.nout
        return extra


FAMILY = TensorCores()
