"""Staged adjoints: a per-node gathered-row tile GEMM into a stage, summed by the reverse-list sums (``reductions``).

Kernels: :func:`fovi_lab.kernels.adjoint.staged.make_grad_stage_kernel`. dx (kind ``gi``): per output node, the
gathered rows of W^T times that node's grad_y into ``dA [Nout, P64, B]``; dW (kind ``gw``): the gathered rows of
x^T times grad_y into ``dWeff [Nout, P64, Cout]``. A block computes ``tile_p`` table entries x ``tile_b`` batch rows
(dx) or x ``tile_n`` output channels (dW), contracting ``tile_o`` output channels (dx) or ``tile_kb`` batch rows
(dW) per step. The parameters beside the tiles: the grid (a block per node and column tile with the p tiles in a
loop, or one per p tile too, or for dW two column tiles a block), a register prefetch of the next step's operands,
the operand's rows staged by a row copy (the stems, Cin = 3), the stage's dtype and the operands' dtype (bf16 kernels
stage in fp32). An id is the variant (the version of the loop: ``gi3p``), the tiles, and ``_f32`` for an fp32
stage or ``_bf16`` for bf16 operands (``gi3_p64b128_f32``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from fovi_lab.kernels.families.adjoint_base import AdjointFamily, operands_param, stage_param
from fovi_lab.kernels.families.base import (DeviceSpec, IdField, Param, Point, Problem, check_shared, switch,
                                            warps_param)
from fovi_lab.kernels.families.reductions import FAMILY as REDUCTIONS

_LOOP = "nodes x column tiles"              # a block per (node, column tile), its p tiles in a loop
_GRID3 = "nodes x p tiles x column tiles"   # a block per (node, p tile, column tile)
_PAIRS = "nodes x p tiles x tile pairs"     # the same with two adjacent column tiles a block (dW)
_GRID_WORDS = {_LOOP: "a block per node and {cols} tile, its p tiles in a loop",
               _GRID3: "a block per node, p tile and {cols} tile",
               _PAIRS: "a block per node, p tile and two {cols} tiles"}
#: The suffix of the ids of each (stage, operands) besides (fp16, fp16).
_SUFFIX = {("fp32", "fp16"): "_f32", ("fp32", "bf16"): "_bf16"}


def grid_param(values: Tuple[str, ...], cols: str) -> Param:
    return Param("grid", "grid", values, words=lambda v: _GRID_WORDS[v].format(cols=cols))


PREFETCH = switch("prefetch", "register prefetch", "operands prefetched into registers")


def _variants(prefix: str, versions: Tuple[str, ...]) -> Dict[str, Dict[str, Any]]:
    """The versions of the loop, ``<prefix><version>``: its grid (2: the p tiles in a loop, 3: a block per p tile,
    4: and two column tiles), and ``p`` (register prefetch) or ``i`` (rows staged by a row copy)."""
    grids = {"2": _LOOP, "3": _GRID3, "4": _PAIRS}
    return {f"{prefix}{v}": dict(grid=grids[v[0]], prefetch=v[1:] == "p", staged_rows=v[1:] == "i") for v in versions}


class _Staged(AdjointFamily):
    """What the two staged families share: the grid, the stage, the operands, the ids' suffix and the spec."""

    module = "fovi_lab.kernels.adjoint.staged"
    tensor_cores = True             # (tile_matmul: MathDx on the tensor cores where Warp has it)
    sum_target: str = ""            # the target of the reverse-list sum of its stage (dx, dw)
    wide: str = ""                  # the parameter of the block's columns (tile_b for dx, tile_n for dW)
    inner: str = ""                 # the parameter of the contraction step (tile_o for dx, tile_kb for dW)

    row_fixed = {"stage": "fp16", "operands": "fp16"}
    name_hint = " with _f32 for an fp32 stage or _bf16 for bf16 operands"
    forms_words = ("Each preset also names its kernel with an fp32 stage (`<name>_f32`) and with bf16 operands "
                   "(`<name>_bf16`, an fp32 stage).")

    def forms(self, points: List[Point]) -> List[Point]:
        """Each point followed by its fp32-stage form and its bf16 form (which stages in fp32)."""
        return [form for p in points for form in (p, p.replace(stage="fp32"), p.replace(stage="fp32", operands="bf16"))]

    def combine_reasons(self, point: Point) -> List[str]:
        reasons = super().combine_reasons(point)
        if point["operands"] == "bf16" and point["stage"] == "fp16":
            reasons.append("bf16 operands stage in fp32 (a bf16 stage would round each product sum to 8 mantissa "
                           "bits before the reduction adds them)")
        return reasons

    def format_id(self, point: Point, explicit: bool = False) -> str:
        return super().format_id(point, explicit) + _SUFFIX.get((point["stage"], point["operands"]), "")

    def parse_id(self, text: str, **values_beside) -> Optional[Point]:
        stage, operands = "fp16", "fp16"
        for (st, op), suffix in _SUFFIX.items():
            if text.endswith(suffix):
                text, stage, operands = text[: -len(suffix)], st, op
                break
        return super().parse_id(text, stage=stage, operands=operands)

    def version(self, point: Point):
        """The loop's version as the build and plan modules spell it (``2``, ``"3p"``, ``"2i"``, ``4``)."""
        digits = self.variant(point)[2:]
        return int(digits) if digits.isdigit() else digits

    def pairs(self, point: Point) -> int:
        """Column tiles per block: 2 on the pairs grid, else 1."""
        return 2 if point["grid"] == _PAIRS else 1

    def grid(self, spec: Dict[str, Any], nodes: int, p64: int, wide: int) -> Tuple[int, ...]:
        """The launch grid of the kernel of a spec record (:meth:`spec`; any tiles and block, as the canaries build
        them) over ``nodes`` nodes of ``p64`` table columns and ``wide`` padded output columns."""
        grid = self.variants[f"{self.kinds[0]}{spec['version']}"]["grid"]
        cols = wide // (spec[self.spec_wide] * (2 if grid == _PAIRS else 1))
        return (nodes, cols) if grid == _LOOP else (nodes, p64 // spec["tile_p"], cols)

    def sum_key(self, point: Point) -> Tuple[str, str]:
        """The ``(kind, name)`` of the reverse-list sum of the point's stage (:mod:`.reductions`)."""
        sums = REDUCTIONS.point(target=self.sum_target, stage=point["stage"], warps=8)
        return REDUCTIONS.kernel_key(sums)

    def factory(self, point: Point) -> Tuple[str, Tuple, Dict[str, Any]]:
        return "make_grad_stage_kernel", (
            self.kinds[0], self.version(point), point["tile_p"], point[self.wide], point["stage"] == "fp32"), {
            "tile_k": point[self.inner], "block_dim": point["warps"] * 32, "bf16": point["operands"] == "bf16"}

    def from_spec(self, spec: Dict[str, Any], stage: str = "fp16", operands: str = "fp16") -> Point:
        """The point of a spec record (:meth:`spec` read back) with this stage and operand dtype."""
        variant = f"{self.kinds[0]}{spec['version']}"
        if variant not in self.variants:
            raise ValueError(f"spec: {self.key} has no version {spec['version']!r}")
        return self.point(tile_p=spec["tile_p"], **{self.wide: spec[self.spec_wide]},
                          **{self.inner: spec.get(self.spec_inner, 64)}, warps=spec["block_dim"] // 32,
                          stage=stage, operands=operands, **self.variants[variant])

    spec_wide: str = ""
    spec_inner: str = ""

    def spec(self, point: Point) -> Dict[str, Any]:
        return {"version": self.version(point), "tile_p": point["tile_p"], self.spec_wide: point[self.wide],
                self.spec_inner: point[self.inner], "block_dim": point["warps"] * 32}

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        p, c, k = point["tile_p"], point[self.wide], point[self.inner]
        pairs = self.pairs(point)
        bill = p * k * 2 + pairs * (k * c * 2 + p * c * 4) + p * 4   # gathered rows, g tiles, fp32 tiles, indices
        return check_shared(bill, device, f"{p} x {c} tiles" + (" in pairs" if pairs > 1 else ""))

    def stage_bytes(self, point: Point, problem: Problem) -> float:
        """The stage written by the GEMM (the reduction reads it back)."""
        s = 4 if point["stage"] == "fp32" else 2
        cols = problem.batch if self.gradient == "dx" else problem.cout
        return float(s * problem.nout * problem.p64 * cols)


def _usual_block_dx(values: Dict[str, Any]) -> int:
    """The block of a dx tile in its ids' short form: 8 warps from 8192 entries a tile (64 x 128), else 4."""
    return 256 if values["tile_p"] * values["tile_b"] >= 8192 else 128


def _usual_block_dw(values: Dict[str, Any]) -> int:
    """The block of a dW tile in its ids' short form: 8 warps from 128 output channels a block, else 4."""
    return 256 if values["tile_n"] * (2 if values["grid"] == _PAIRS else 1) >= 128 else 128


class StagedDx(_Staged):
    key = "staged_dx"
    title = "staged dx"
    gradient = "dx"
    kinds = ("gi",)
    sum_target = "dx"
    wide, inner, spec_wide, spec_inner = "tile_b", "tile_o", "tile_b", "tile_o"
    params = (
        Param("tile_p", "table entries per tile", (32, 64)),
        Param("tile_b", "batch rows per tile", (16, 32, 64, 128, 256)),
        Param("tile_o", "output channels per step", (64, 96, 128)),
        warps_param((4, 8)),
        grid_param((_LOOP, _GRID3), "batch"),
        PREFETCH,
        switch("staged_rows", "W rows staged", "W's rows staged by a row copy"),
        stage_param(),
        operands_param(),
    )
    variants = _variants("gi", ("2", "2p", "3", "3p", "2i", "3i"))
    head_words = "{tile_p} table entries x {tile_b} batch rows per tile"
    id_fields = (IdField("p", "tile_p"), IdField("b", "tile_b"), IdField("o", "tile_o", default=64),
                 IdField("b", "warps", default=_usual_block_dx, scale=32))
    row_params = ("tile_p", "tile_b", "tile_o")

    def padded_flops(self, point: Point, problem: Problem) -> float:
        return 2.0 * problem.nout * problem.p64 * _pad(problem.batch, point["tile_b"]) * \
            _pad(problem.cout, point["tile_o"])

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        extra = self.stage_bytes(point, problem)
        if point["staged_rows"]:                        # W's rows gathered, written and read once more
            extra += 2.0 * problem.itemsize * problem.nout * problem.p64 * _pad(problem.cout, point["tile_o"])
        return extra


class StagedDw(_Staged):
    key = "staged_dw"
    title = "staged dW"
    gradient = "dW"
    kinds = ("gw",)
    sum_target = "dw"
    wide, inner, spec_wide, spec_inner = "tile_n", "tile_kb", "tile_n", "tile_kb"
    params = (
        Param("tile_p", "table entries per tile", (32, 64)),
        Param("tile_n", "output channels per tile", (64, 96, 128)),
        Param("tile_kb", "batch rows per step", (16, 32, 64)),
        warps_param((4, 8)),
        grid_param((_LOOP, _GRID3, _PAIRS), "output channel"),
        PREFETCH,
        switch("staged_rows", "x rows staged", "x's rows staged by a row copy"),
        stage_param(),
        operands_param(),
    )
    variants = _variants("gw", ("2", "3", "4", "3p", "3i"))
    head_words = "{tile_p} table entries x {tile_n} output channels per tile"
    id_fields = (IdField("p", "tile_p"), IdField("n", "tile_n"), IdField("k", "tile_kb", default=64),
                 IdField("b", "warps", default=_usual_block_dw, scale=32))
    row_params = ("tile_p", "tile_n", "tile_kb")

    def padded_flops(self, point: Point, problem: Problem) -> float:
        return 2.0 * problem.nout * problem.p64 * _pad(problem.batch, point["tile_kb"]) * \
            _pad(problem.cout, point["tile_n"] * self.pairs(point))

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        extra = self.stage_bytes(point, problem)
        if point["staged_rows"]:                        # x's rows gathered, written and read once more
            extra += 2.0 * problem.itemsize * problem.nout * problem.p64 * _pad(problem.batch, point["tile_kb"])
        return extra


def _pad(n: int, m: int) -> int:
    return -(-int(n) // int(m)) * int(m)


STAGED_DX = StagedDx()
STAGED_DW = StagedDw()

__all__ = ["StagedDx", "StagedDw", "STAGED_DX", "STAGED_DW", "grid_param"]
