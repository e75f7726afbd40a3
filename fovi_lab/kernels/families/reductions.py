"""Reverse-list sums: the second kernel of the staged adjoints, one thread per output element (kind ``csr``).

Kernels: :func:`fovi_lab.kernels.adjoint.staged.make_dx_csr_kernel`,
:func:`~fovi_lab.kernels.adjoint.staged.make_dw_csr_kernel` and
:func:`~fovi_lab.kernels.adjoint.staged.make_dx_taps_kernel`. dx: each input entry sums the stage rows of the
(node, table column) pairs that read it, walking the reverse lists in a fixed order; dW: each weight column sums the
stage rows that multiply it; the tap-expanded form sums the tensor cores' outputs of the tap-expanded layer (dx on
the taps path). The stage dtype is the staged kernel's (fp16 or fp32; the tap-expanded outputs are fp32). No tile
GEMM and no shared memory: SIMT, 256 threads a block. An id is the target and the stage dtype (``dx_f32``), or
``dx_taps``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from fovi_lab.kernels.families.adjoint_base import AdjointFamily, stage_param
from fovi_lab.kernels.families.base import Param, Point, Problem, warps_param, words_of

_FACTORY = {"dx": "make_dx_csr_kernel", "dw": "make_dw_csr_kernel", "dx_taps": "make_dx_taps_kernel"}


class Reductions(AdjointFamily):
    key = "reductions"
    title = "reverse-list sums"
    module = "fovi_lab.kernels.adjoint.staged"
    kinds = ("csr",)
    sums = True
    params = (
        Param("target", "what it sums", ("dx", "dw", "dx_taps"), words=words_of({
            "dx": "dx from the stage of the staged dx", "dw": "dW from the stage of the staged dW",
            "dx_taps": "dx from the outputs of the tap-expanded layer"})),
        stage_param(),
        warps_param((8,), default=8),
    )
    variants = {"dx": {"target": "dx"}, "dw": {"target": "dw"}, "dx_taps": {"target": "dx_taps"}}
    row_params = ("stage",)

    def combine_reasons(self, point: Point) -> List[str]:
        reasons = super().combine_reasons(point)
        if point["target"] == "dx_taps" and point["stage"] == "fp16":
            reasons.append("the tap-expanded layer's outputs are fp32, and its sum reads them as they are")
        return reasons

    def format_id(self, point: Point, explicit: bool = False) -> str:
        variant = self.variant(point)
        return variant if variant == "dx_taps" else f"{variant}_f{point['stage'][2:]}"

    def parse_id(self, text: str) -> Optional[Point]:
        if text == "dx_taps":
            return self.point(target="dx_taps", stage="fp32", warps=8)
        variant, _, stage = text.partition("_")
        if variant not in ("dx", "dw") or stage not in ("f16", "f32"):
            return None
        return self.point(target=variant, stage="fp" + stage[1:], warps=8)

    def factory(self, point: Point) -> Tuple[str, Tuple, Dict[str, Any]]:
        return _FACTORY[point["target"]], (point["stage"] == "fp32",), {}

    def spec(self, point: Point) -> Dict[str, Any]:
        return {"target": point["target"], "fp32_stage": point["stage"] == "fp32", "block_dim": point["warps"] * 32}

    def sums(self, point: Point, problem: Problem) -> Tuple[float, float]:
        """``(stage entries read, outputs written)`` of one call."""
        rows = problem.batch if point["target"] != "dw" else problem.cout
        outputs = problem.batch * problem.cin * problem.nin if point["target"] != "dw" else problem.cout * problem.q
        return float(problem.nout * problem.p64 * rows), float(outputs)

    def padded_flops(self, point: Point, problem: Problem) -> float:
        return self.sums(point, problem)[0]             # one add per stage entry

    def fewest_bytes(self, problem: Problem) -> float:
        return 0.0                                      # (the estimate's bytes are the stage's: extra_bytes)

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        read, written = self.sums(point, problem)
        return (4 if point["stage"] == "fp32" else 2) * read + 4.0 * written    # the stage read, fp32 written


FAMILY = Reductions()

__all__ = ["Reductions", "FAMILY"]
