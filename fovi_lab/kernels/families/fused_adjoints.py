"""Fused node-major adjoints: dx and dW with no stage, each list's sum folded into the tile GEMM's loop.

Kernels: :func:`fovi_lab.kernels.adjoint.fused.make_dx_kernel` and
:func:`~fovi_lab.kernels.adjoint.fused.make_dw_kernel`.
dx: a block per (input node, batch tile, Cin tile) walks the node's reverse list, accumulating ``g_n^T @ W_v`` over
Cout steps; dW: a block per (tap, output-channel tile, Cin tile) walks the tap's list of (output node, input node)
pairs, accumulating ``g_n @ x_m^T`` over batch steps. The walk: whole lists (``dxn`` / ``dwn``; dW's lists in
interleaved splits), or balanced segments of at most L tile GEMMs, one block each, summed in a fixed order by a
finish (``dxs`` / ``dws``). The kinds ``dxn`` / ``dxs`` / ``dwn`` / ``dws`` are the variants; a name is the
tiles' (the presets' ``dxn_`` / ``dwn_`` names), so ``("dxs", "dxn_m64n64k64")`` is the segment kernel of those
tiles, whose own id is ``dxs_m64n64k64``. Both walk lists built from the layer's graph (its reverse lists and tap
lists, from ``idx`` and ``rf_index``), not its index tables, so any table layout of a layer runs.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from fovi_lab.kernels.families.adjoint_base import AdjointFamily
from fovi_lab.kernels.families.base import (DeviceSpec, IdField, Param, Point, Problem, check_shared, warps_param,
                                            words_of)

WHOLE, SEGMENTS = "whole lists", "segments"


def _pad(n: int, m: int) -> int:
    return -(-int(n) // int(m)) * int(m)


def _walk(whole: str, segments: str) -> Param:
    """The walk parameter, its two values in words."""
    return Param("walk", "walk", (WHOLE, SEGMENTS), words=words_of({WHOLE: whole, SEGMENTS: segments}))


class _Fused(AdjointFamily):
    """What the two fused families share: the walk, the tiles' names, the checks."""

    module = "fovi_lab.kernels.adjoint.fused"
    tensor_cores = True             # (tile_matmul: MathDx on the tensor cores where Warp has it)
    kind_is_variant = True
    #: the tile parameters in the order of the kernel factory's arguments (rows, columns, step), and the problem's
    #: sizes each pads (:class:`~fovi_lab.kernels.families.base.Problem` fields)
    tile_params: Tuple[str, str, str] = ("", "", "")
    tile_dims: Tuple[str, str, str] = ("", "", "")
    factory_name: str = ""

    def __init_subclass__(cls, **kwargs):
        """A fused family's variants are its two kinds, the whole-list walk and the segment one; its table rows are
        its tiles."""
        super().__init_subclass__(**kwargs)
        whole, segments = cls.kinds
        cls.variants = {whole: {"walk": WHOLE}, segments: {"walk": SEGMENTS}}
        cls.forms_words = (f"Each preset is the whole-list kernel of its tiles (kind `{whole}`); kind `{segments}` "
                           f"with the same name is the balanced-segment kernel of those tiles (its own id: "
                           f"`{segments}_...`).")
        cls.row_params = cls.tile_params

    def padded_flops(self, point: Point, problem: Problem) -> float:
        return 2.0 * problem.nout * self.taps(problem) * math.prod(
            _pad(getattr(problem, dim), point[tile]) for dim, tile in zip(self.tile_dims, self.tile_params))

    def forms(self, points: List[Point]) -> List[Point]:
        """Every point in each walk: the whole-list kernels of all the points first, the segment ones after."""
        return [p.replace(**fixed) for fixed in self.variants.values() for p in points]

    def kernel_key(self, point: Point) -> Tuple[str, str]:
        """``(kind, name)``: the kind is the variant (the walk), the name the tiles' (the whole-list point's id)."""
        return self.variant(point), point.replace(walk=WHOLE).id

    def tiles(self, point: Point) -> Tuple[int, int, int, int]:
        """``(rows, columns, step, block_dim)``: the kernel factory's tile arguments."""
        return (*(point[p] for p in self.tile_params), point["warps"] * 32)

    def spec(self, point: Point) -> Tuple[int, int, int, int]:
        """The tiles (:meth:`tiles`)."""
        return self.tiles(point)

    def factory(self, point: Point) -> Tuple[str, Tuple, Dict[str, Any]]:
        """(``mathdx`` and ``bf16`` are the build's: a fused kernel's operand dtype is no parameter of its name.)"""
        return self.factory_name, self.tiles(point), {"segments": point["walk"] == SEGMENTS}

    def tile_words(self, point: Point) -> str:
        """The tiles in words: the tile and the step (``64 batch rows x 16 input channels per tile, 64 output
        channels per step``)."""
        step = self.tile_params[2]
        return f"{self.head(point)}, {self.param(step).phrase(point[step])}"

    def walk_words(self, point: Point) -> str:
        return self.param("walk").phrase(point["walk"])

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        rows, cols, step, _ = self.tiles(point)
        bill = (rows + cols) * step * 2 + rows * cols * 4          # both operand tiles, the fp32 accumulator
        return check_shared(bill, device, f"{rows} x {cols} tiles of {step}-deep steps")

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        s = problem.itemsize
        layouts = problem.batch * problem.cout * problem.nout + (
            problem.cout * problem.q if self.gradient == "dx" else problem.batch * problem.cin * problem.nin)
        return 2.0 * s * layouts                     # grad_y and the operand in the node-major layouts, once each


def _usual_block_dx(values: Dict[str, Any]) -> int:
    """The block of a dx tile in its ids' short form: a warp per 16 input channels of the tile, 2 to 8."""
    return max(2, min(8, values["tile_c"] // 16)) * 32


def _usual_block_dw(values: Dict[str, Any]) -> int:
    """The block of a dW tile in its ids' short form: a warp per 16 output channels of the tile (per 32 where the
    input-channel tile is 16 wide), 2 to 8."""
    return max(2, min(8, values["tile_o"] // (16 if values["tile_c"] >= 32 else 32))) * 32


class FusedDx(_Fused):
    key = "fused_dx"
    title = "fused dx"
    gradient = "dx"
    kinds = ("dxn", "dxs")
    params = (
        Param("tile_b", "batch rows per tile", (16, 32, 64)),
        Param("tile_c", "input channels per tile", (16, 32, 64, 128)),
        Param("step_o", "output channels per step", (16, 32, 64)),
        warps_param((2, 4, 8)),
        _walk("whole reverse lists", "balanced segments of the reverse lists"),
    )
    head_words = "{tile_b} batch rows x {tile_c} input channels per tile"
    id_fields = (IdField("m", "tile_b"), IdField("n", "tile_c"), IdField("k", "step_o"),
                 IdField("b", "warps", default=_usual_block_dx, scale=32))
    tile_params = ("tile_b", "tile_c", "step_o")
    tile_dims = ("batch", "cin", "cout")
    factory_name = "make_dx_kernel"


class FusedDw(_Fused):
    key = "fused_dw"
    title = "fused dW"
    gradient = "dW"
    kinds = ("dwn", "dws")
    params = (
        Param("tile_o", "output channels per tile", (32, 64, 128)),
        Param("tile_c", "input channels per tile", (16, 32, 64)),
        Param("step_b", "batch rows per step", (16, 32, 64)),
        warps_param((2, 4, 8)),
        _walk("whole tap lists in interleaved splits", "balanced segments of the tap lists"),
    )
    head_words = "{tile_o} output x {tile_c} input channels per tile"
    id_fields = (IdField("o", "tile_o"), IdField("c", "tile_c"), IdField("k", "step_b"),
                 IdField("b", "warps", default=_usual_block_dw, scale=32))
    tile_params = ("tile_o", "tile_c", "step_b")
    tile_dims = ("cout", "cin", "batch")
    factory_name = "make_dw_kernel"


FUSED_DX = FusedDx()
FUSED_DW = FusedDw()

__all__ = ["FusedDx", "FusedDw", "FUSED_DX", "FUSED_DW", "WHOLE", "SEGMENTS"]
