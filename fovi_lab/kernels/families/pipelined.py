"""Tensor cores fed by a ``cp.async`` pipeline: gathered rows staged in shared memory, ``ldmatrix``, ``mma.sync``.

One kernel, :func:`fovi_lab.kernels.forward.mma_pipe.make_mma_pipe_kernel`, laid out by :func:`pipe_layout` (which
refuses what cannot be built). A block owns ``channels`` x ``rows`` outputs of one node; ``stages`` shared buffers
of ``k`` p entries of both operands are in flight while the warps multiply the oldest (for large batches, where each
node's GEMM is large). ``split``: the p range is cut into fp32 partials summed in a fixed order (layers with few
nodes).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from fovi_lab.kernels.families.base import (BLOCK, DeviceSpec, Family, IdField, Param, Point, Problem, check_shared,
                                            needs_arch, switch, warps_param)


#: Static shared memory the stages may take: a CTA may declare 48 KiB without a dynamic opt-in, and every Warp
#: kernel declares 512 bytes of its own (ptxas: 0xc200 bytes for 48 KiB of stages).
PIPE_SMEM_LIMIT = 48 * 1024 - 512


def pipe_layout(bm: int, bn: int, bk: int, stages: int, threads: int) -> Tuple[int, int, int, int]:
    """``(WM, WN, MT, NT)`` of a CTA of ``threads`` threads over ``bm`` channels x ``bn`` batch rows: the warp
    grid and each warp's m16 / n8 tile counts. A ValueError names what cannot be built (tile sizes, shared
    memory over :data:`PIPE_SMEM_LIMIT`, a copy that does not divide among the threads)."""
    if threads not in (128, 256):
        raise ValueError(f"mmap kernel: block_dim={threads} must be 128 or 256")
    wm, wn = (2, 2) if threads == 128 else (2, 4)
    if bm % 64 or bn % 64 or bm // wm % 16 or bn // wn % 16:
        raise ValueError(f"mmap kernel: {bm} channels x {bn} rows must be multiples of 64 that split into "
                         f"{wm} x {wn} warp tiles of 16-multiples")
    if bk not in (16, 32, 64) or stages < 2:
        raise ValueError(f"mmap kernel: tile_k={bk} must be 16, 32 or 64 and stages={stages} at least 2")
    smem = stages * bk * (bm + bn) * 2
    if smem > PIPE_SMEM_LIMIT:
        raise ValueError(f"mmap kernel: {stages} stages of {bk} x ({bm} + {bn}) fp16 need {smem} bytes of shared "
                         f"memory, over the {PIPE_SMEM_LIMIT} a CTA may declare")
    if bk * bm // 8 % threads or bk * bn // 8 % threads:
        raise ValueError(f"mmap kernel: a stage's 16-byte copies ({bk * bm // 8} + {bk * bn // 8}) must divide "
                         f"among {threads} threads")
    return wm, wn, bm // wm // 16, bn // wn // 8


class Pipelined(Family):
    key = "pipelined"
    title = "tensor cores, cp.async pipeline"
    module = "fovi_lab.kernels.forward.mma_pipe"
    tensor_cores = True
    mma_sync = True
    training = True
    params = (
        Param("channels", "output channels per block", (64, 128, 256)),
        Param("rows", "batch rows per block", (64, 128, 256)),
        Param("k", "p entries per stage", (16, 32, 64)),
        Param("stages", "stages in flight", (2, 3, 4, 5, 6), words=lambda v: f"{v} stages"),
        warps_param((4, 8), default=4),
        switch("split", "p range split"),
    )
    variants = {"mmap": {"split": False}, "mmaps": {"split": True}}
    head_words = "{channels} channels x {rows} rows per block"
    id_fields = (IdField("o", "channels"), IdField("b", "rows"), IdField("k", "k"), IdField("s", "stages"), BLOCK)
    config_params = ("rows", "channels", "k", "stages")

    def shared_bytes(self, point: Point) -> int:
        return point["stages"] * point["k"] * (point["channels"] + point["rows"]) * 2

    def combine_reasons(self, point: Point) -> List[str]:
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

    unit = "block"

    def dataflow(self, cfg) -> str:
        return "in_place"

    def dense_kind(self, cfg) -> str:
        return "mmap"

    def fp32_output(self, cfg) -> bool:
        return bool(self.variant_values(cfg)["split"])

    def make_kernel(self, source, cfg, mathdx=None, dense=False, bf16=False):
        return source.make_mma_pipe_kernel(cfg.tile_n, cfg.tile_m, cfg.tile_k, cfg.r, cfg.block_dim, dense=dense,
                                    split=self.variant_values(cfg)["split"] and not dense)

    def block_shape(self, point: Point):
        return point["rows"], point["channels"]

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        s = problem.itemsize
        extra = 2.0 * s * (problem.batch * problem.cin * problem.nin + problem.cout * problem.q)   # x^T and W^T copies
        if point["split"]:
            extra += 2.0 * 4 * problem.batch * problem.cout * problem.nout
        return extra


FAMILY = Pipelined()
