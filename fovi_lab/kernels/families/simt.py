"""SIMT register blocks: no tile GEMM, no shared memory; each thread keeps a block of y in fp32 registers.

Kernels: :func:`fovi_lab.kernels.forward.simt.make_simt_kernel` (and its split and fp32-vector forms in the
same module). A thread owns ``tile_b`` batch rows x ``tile_o`` output channels of one node and walks the p
loop ``unroll`` entries per step, reading x in place and W^T (or W as vectors) straight from L2. For the
stems (Cin = 3) and for tiny batches, where a 16-row tensor-core tile would be mostly padding.
"""

from __future__ import annotations

from typing import List

from fovi_lab.kernels.families.base import BLOCK, Family, IdField, Param, Point, Problem, switch, warps_param


class Simt(Family):
    key = "simt"
    title = "SIMT register blocks"
    module = "fovi_lab.kernels.forward.simt"
    params = (
        Param("tile_b", "batch rows per thread", (4, 8, 16)),
        Param("tile_o", "output channels per thread", (4, 8, 16)),
        Param("unroll", "p entries per step", (1, 2, 4, 8),
              words=lambda v: f"{v} p entr{'y' if v == 1 else 'ies'} per step"),
        warps_param((2, 4), default=4),
        switch("split", "p loop split"),
        switch("prefetch", "index prefetch", "next indices prefetched"),
        switch("w_vectors", "W read as vectors", "W read as 4-vectors"),
        switch("fp32_vectors", "fp32 operands as 4-vectors"),
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
    id_prefixes = {"simt": "sd_", "simtp": "sdp_", "simtw": "sw_", "simts": "ss_", "simtsw": "ssw_", "simtv": "sv_"}
    head_words = "{tile_b} rows x {tile_o} channels per thread"
    id_fields = (IdField("b", "tile_b"), IdField("o", "tile_o"), IdField("u", "unroll"), BLOCK)
    config_params = ("tile_b", "tile_o", "unroll", 1)

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

    unit = "thread"

    def dataflow(self, cfg) -> str:
        return "vec4" if self.variant_values(cfg)["fp32_vectors"] else "in_place"

    def dense_kind(self, cfg) -> str:
        return "simtv" if self.variant_values(cfg)["fp32_vectors"] else "simt"

    def make_kernel(self, source, cfg, mathdx=None, dense=False, bf16=False):
        v = self.variant_values(cfg)
        args = (cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.block_dim)
        if v["fp32_vectors"]:
            return source.make_simtv_kernel(*args, dense=dense)
        if v["split"] and not dense:
            return source.make_simts_kernel(*args, wvec=v["w_vectors"])
        # (a split kernel's dense ceiling is the unsplit loop with scalar W loads)
        return source.make_simt_kernel(*args, dense=dense, prefetch=v["prefetch"],
                                       wvec=v["w_vectors"] and not v["split"])

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
