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

import re

import torch
from typing import List, Optional

from fovi_lab.kernels.families.base import DeviceSpec, Family, Param, Point, Problem, needs_arch, words_of


class TensorCores(Family):
    key = "tensor_cores"
    title = "tensor cores"
    module = "fovi_lab.kernels.forward.mma"
    tensor_cores = True
    training = True
    dtypes = (torch.float16, torch.bfloat16)
    params = (
        Param("tile_o", "output channels per warp", (16, 32, 48, 64, 80, 96, 112, 128)),
        Param("tile_b", "batch rows per warp", (8, 16, 32, 64)),
        Param("k", "p entries per step", (16, 32, 64), words=lambda v: f"{v} p entries per step", default=16),
        Param("warps", "warps per block", (1, 2, 4, 8),
              words=lambda v: f"{v} warp{'s' if v > 1 else ''} per block", default=4),
        Param("x_layout", "x layout", ("in place", "transposed"),
              words=words_of({"in place": None, "transposed": "x^T layout"})),
        Param("w_layout", "W layout", ("transposed", "in place"),
              words=words_of({"transposed": None, "in place": "W read in place"})),
        Param("split", "p loop split", (False, True), words=words_of({False: None, True: "p loop split"})),
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

    head_params = 2

    def head(self, point: Point) -> str:
        return f"{point['tile_o']} channels x {point['tile_b']} rows per warp"

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

    def format_id(self, point: Point, explicit: bool = False) -> str:
        k, bd = point["k"], point["warps"] * 32
        return (f"{self.variant(point)}_o{point['tile_o']}b{point['tile_b']}" + (f"k{k}" if k != 16 or explicit else "")
                + (f"b{bd}" if bd != 128 or explicit else ""))

    _ID = re.compile(r"^(mma[swto]*)_o(\d+)b(\d+)(?:k(\d+))?(?:b(\d+))?$")

    def parse_id(self, text: str) -> Optional[Point]:
        m = self._ID.match(text)
        if not m or m.group(1) not in self.variants:
            return None
        bd = int(m.group(5) or 128)
        if bd % 32:
            return None
        return self.point(tile_o=int(m.group(2)), tile_b=int(m.group(3)), k=int(m.group(4) or 16), warps=bd // 32,
                          **self.variants[m.group(1)])

    def config_fields(self, point: Point):
        return point["tile_b"], point["tile_o"], point["k"], 1, point["warps"] * 32

    def from_config(self, cfg) -> Point:
        return self.point(tile_o=cfg.tile_n, tile_b=cfg.tile_m, k=cfg.tile_k, warps=cfg.block_dim // 32,
                          **self.variants[cfg.family])

    unit = "warp"

    def dataflow(self, cfg) -> str:
        return "in_place"

    def dense_kind(self, cfg) -> str:
        v = self.variants[cfg.family]
        return "mma" + ("w" if v["w_layout"] == "in place" else "") + ("t" if v["x_layout"] == "transposed" else "")

    def fp32_output(self, cfg) -> bool:
        return bool(self.variants[cfg.family]["split"])

    def make_kernel(self, cfg, mathdx=None, dense=False, bf16=False):
        from fovi_lab.kernels.forward.mma import make_mma_kernel
        v = self.variants[cfg.family]
        return make_mma_kernel(cfg.tile_n // 16, cfg.tile_m // 8, cfg.block_dim, split=v["split"] and not dense,
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
