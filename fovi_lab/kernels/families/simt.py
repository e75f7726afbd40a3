"""SIMT register blocks: no tile GEMM, no shared memory; each thread keeps a block of y in fp32 registers.

Kernels: :func:`fovi_lab.kernels.forward.simt.make_simt_kernel` (and its split and fp32-vector forms in the
same module). A thread owns ``tile_b`` batch rows x ``tile_o`` output channels of one node and walks the p
loop ``unroll`` entries per step, reading x in place and W^T (or W as vectors) straight from L2. For the
stems (Cin = 3) and for tiny batches, where a 16-row tensor-core tile would be mostly padding.
"""

from __future__ import annotations

import re
from typing import List, Optional

from fovi_lab.kernels.families.base import Family, Param, Point, Problem, words_of


class Simt(Family):
    key = "simt"
    title = "SIMT register blocks"
    module = "fovi_lab.kernels.forward.simt"
    params = (
        Param("tile_b", "batch rows per thread", (4, 8, 16)),
        Param("tile_o", "output channels per thread", (4, 8, 16)),
        Param("unroll", "p entries per step", (1, 2, 4, 8),
              words=lambda v: f"{v} p entr{'y' if v == 1 else 'ies'} per step"),
        Param("warps", "warps per block", (2, 4), words=lambda v: f"{v} warps per block", default=4),
        Param("split", "p loop split", (False, True), words=words_of({False: None, True: "p loop split"})),
        Param("prefetch", "index prefetch", (False, True),
              words=words_of({False: None, True: "next indices prefetched"})),
        Param("w_vectors", "W read as vectors", (False, True),
              words=words_of({False: None, True: "W read as 4-vectors"})),
        Param("fp32_vectors", "fp32 operands as 4-vectors", (False, True),
              words=words_of({False: None, True: "fp32 operands as 4-vectors"})),
    )
    _BASE = dict(split=False, prefetch=False, w_vectors=False, fp32_vectors=False)
    variants = {
        "simt": _BASE,
        "simtp": {**_BASE, "prefetch": True},
        "simtw": {**_BASE, "w_vectors": True},
        "simts": {**_BASE, "split": True},
        "simtsw": {**_BASE, "split": True, "w_vectors": True},
        "simtv": {**_BASE, "fp32_vectors": True},
    }
    _PREFIX = {"simt": "sd", "simtp": "sdp", "simtw": "sw", "simts": "ss", "simtsw": "ssw", "simtv": "sv"}

    head_params = 2

    def head(self, point: Point) -> str:
        return f"{point['tile_b']} rows x {point['tile_o']} channels per thread"

    def combine_reasons(self, point: Point) -> List[str]:
        reasons = super().combine_reasons(point)
        if (point["w_vectors"] or point["fp32_vectors"]) and point["tile_o"] % 4:
            reasons.append(f"vector loads need a multiple of 4 output channels per thread, got {point['tile_o']}")
        if point["fp32_vectors"] and point["tile_b"] % 4:
            reasons.append(f"vector loads need a multiple of 4 batch rows per thread, got {point['tile_b']}")
        if point["tile_b"] * point["tile_o"] > 128:
            reasons.append(f"a {point['tile_b']} x {point['tile_o']} block keeps {point['tile_b'] * point['tile_o']} "
                           f"fp32 accumulators per thread, over the 128 that leave room for its operands")
        return reasons

    def format_id(self, point: Point, explicit: bool = False) -> str:
        bd = point["warps"] * 32
        return (f"{self._PREFIX[self.variant(point)]}_b{point['tile_b']}o{point['tile_o']}u{point['unroll']}"
                + (f"b{bd}" if bd != 128 or explicit else ""))

    _ID = re.compile(r"^(sd|sdp|sw|ss|ssw|sv)_b(\d+)o(\d+)u(\d+)(?:b(\d+))?$")

    def parse_id(self, text: str) -> Optional[Point]:
        m = self._ID.match(text)
        if not m:
            return None
        variant = {v: k for k, v in self._PREFIX.items()}[m.group(1)]
        return self.point(tile_b=int(m.group(2)), tile_o=int(m.group(3)), unroll=int(m.group(4)),
                          warps=int(m.group(5) or 128) // 32, **self.variants[variant])

    def config_fields(self, point: Point):
        return point["tile_b"], point["tile_o"], point["unroll"], 1, point["warps"] * 32

    def from_config(self, cfg) -> Point:
        return self.point(tile_b=cfg.tile_m, tile_o=cfg.tile_n, unroll=cfg.tile_k, warps=cfg.block_dim // 32,
                          **self.variants[cfg.family])

    unit = "thread"

    def dataflow(self, cfg) -> str:
        return "vec4" if self.variants[cfg.family]["fp32_vectors"] else "in_place"

    def dense_kind(self, cfg) -> str:
        return "simtv" if self.variants[cfg.family]["fp32_vectors"] else "simt"

    def make_kernel(self, cfg, mathdx=None, dense=False, bf16=False):
        from fovi_lab.kernels.forward.simt import make_simt_kernel, make_simts_kernel, make_simtv_kernel
        v = self.variants[cfg.family]
        args = (cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim)
        if v["fp32_vectors"]:
            return make_simtv_kernel(*args, dense=dense)
        if v["split"] and not dense:
            return make_simts_kernel(*args, wvec=v["w_vectors"])
        # (a split kernel's dense ceiling is the unsplit loop with scalar W loads)
        return make_simt_kernel(*args, dense=dense, prefetch=v["prefetch"], wvec=v["w_vectors"] and not v["split"])

    def block_shape(self, point: Point):
        return point["tile_b"], point["tile_o"]

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        extra = 2.0 * problem.itemsize * problem.cout * problem.q           # the W^T copy (cached between calls)
        if point["fp32_vectors"]:                                           # fp32 copies of x and W
            extra += 2.0 * 4 * (problem.batch * problem.cin * problem.nin + problem.cout * problem.q)
        if point["split"]:
            extra += 2.0 * 4 * problem.batch * problem.cout * problem.nout
        return extra


FAMILY = Simt()
