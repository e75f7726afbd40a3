"""Tensor cores fed by a ``cp.async`` pipeline: gathered rows staged in shared memory, ``ldmatrix``, ``mma.sync``.

One kernel, :func:`fovi_lab.kernels.forward.mma_pipe.make_mma_pipe_kernel`. A block owns ``channels`` x
``rows`` outputs of one node; ``stages`` shared buffers of ``k`` p entries of both operands are in flight while
the warps multiply the oldest (for large batches, where each node's GEMM is large). ``split``: the p range is
cut into fp32 partials summed in a fixed order (layers with few nodes).
"""

from __future__ import annotations

import re
from typing import List, Optional

from fovi_lab.kernels.families.base import DeviceSpec, Family, Param, Point, Problem, check_shared, needs_arch, words_of


class Pipelined(Family):
    key = "pipelined"
    title = "tensor cores, cp.async pipeline"
    module = "fovi_lab.kernels.forward.mma_pipe"
    tensor_cores = True
    training = True
    params = (
        Param("channels", "output channels per block", (64, 128, 256)),
        Param("rows", "batch rows per block", (64, 128, 256)),
        Param("k", "p entries per stage", (16, 32, 64), words=lambda v: f"{v} p entries per stage"),
        Param("stages", "stages in flight", (2, 3, 4, 5, 6), words=lambda v: f"{v} stages"),
        Param("warps", "warps per block", (4, 8), words=lambda v: f"{v} warps per block", default=4),
        Param("split", "p range split", (False, True), words=words_of({False: None, True: "p range split"})),
    )
    variants = {"mmap": {"split": False}, "mmaps": {"split": True}}

    head_params = 2

    def head(self, point: Point) -> str:
        return f"{point['channels']} channels x {point['rows']} rows per block"

    def shared_bytes(self, point: Point) -> int:
        return point["stages"] * point["k"] * (point["channels"] + point["rows"]) * 2

    def combine_reasons(self, point: Point) -> List[str]:
        from fovi_lab.kernels.forward.mma_pipe import pipe_layout
        reasons = super().combine_reasons(point)
        try:
            _, _, mt, nt = pipe_layout(point["channels"], point["rows"], point["k"], point["stages"], point["warps"] * 32)
        except ValueError as exc:
            return reasons + [str(exc).replace("mmap kernel: ", "")]
        if 4 * mt * nt > 128:
            reasons.append(f"each thread would keep {4 * mt * nt} fp32 accumulators, over the 128 that leave room "
                           f"for its fragments in 255 registers")
        return reasons

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        return needs_arch(80, device, "cp.async and mma.sync") + check_shared(self.shared_bytes(point), device,
                                                                               "the stages")

    def format_id(self, point: Point, explicit: bool = False) -> str:
        bd = point["warps"] * 32
        return (f"{self.variant(point)}_o{point['channels']}b{point['rows']}k{point['k']}s{point['stages']}"
                + (f"b{bd}" if bd != 128 or explicit else ""))

    _ID = re.compile(r"^(mmaps?)_o(\d+)b(\d+)k(\d+)s(\d+)(?:b(\d+))?$")

    def parse_id(self, text: str) -> Optional[Point]:
        m = self._ID.match(text)
        if not m:
            return None
        return self.point(channels=int(m.group(2)), rows=int(m.group(3)), k=int(m.group(4)), stages=int(m.group(5)),
                          warps=int(m.group(6) or 128) // 32, **self.variants[m.group(1)])

    def config_fields(self, point: Point):
        return point["rows"], point["channels"], point["k"], point["stages"], point["warps"] * 32

    def from_config(self, cfg) -> Point:
        return self.point(channels=cfg.tile_n, rows=cfg.tile_m, k=cfg.tile_k, stages=cfg.r, warps=cfg.block_dim // 32,
                          **self.variants[cfg.family])

    unit = "block"

    def dataflow(self, cfg) -> str:
        return "in_place"

    def dense_kind(self, cfg) -> str:
        return "mmap"

    def fp32_output(self, cfg) -> bool:
        return bool(self.variants[cfg.family]["split"])

    def make_kernel(self, cfg, mathdx=None, dense=False, bf16=False):
        from fovi_lab.kernels.forward.mma_pipe import make_mma_pipe_kernel
        return make_mma_pipe_kernel(cfg.tile_n, cfg.tile_m, cfg.tile_k, cfg.r, cfg.block_dim, dense=dense,
                                    split=self.variants[cfg.family]["split"] and not dense)

    def block_shape(self, point: Point):
        return point["rows"], point["channels"]

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        s = problem.itemsize
        extra = 2.0 * s * (problem.batch * problem.cin * problem.nin + problem.cout * problem.q)   # x^T and W^T copies
        if point["split"]:
            extra += 2.0 * 4 * problem.batch * problem.cout * problem.nout
        return extra


FAMILY = Pipelined()
