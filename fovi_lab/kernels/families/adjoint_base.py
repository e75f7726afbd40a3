"""What the adjoint kernel families share: the gradient each computes, the *kinds* that name their kernels in the
build and plan modules, the rows of the adjoint configs table, and the gradient's roofline.

The build and plan modules of :mod:`fovi_lab.kernels.adjoint` name an adjoint kernel by a kind and a name:
``("gi", "gi3_p64b128_f32")``, ``("dxs", "dxn_m64n64k64")``, ``("csr", "dx_f32")``. The kind names the family (and
for the fused families also the walk over the lists: ``dxn`` whole lists, ``dxs`` balanced segments); the name is an
id of the family. A fused family's names are those of its tiles (the presets' ``dxn_`` / ``dwn_`` names) and the
kind says the walk, so ``("dxs", "dxn_m64n64k64")`` is the point whose own id is ``dxs_m64n64k64``.
:func:`fovi_lab.kernels.families.registry.adjoint_point` is the point of such a pair, :meth:`AdjointFamily.kernel_key`
the pair of a point.

The checks and the roofline take the forward call's :class:`~fovi_lab.kernels.families.base.Problem`: its gradients
have the same shapes (dx is ``[B, Cin, Nin]``, dW ``[Cout, Q]``, both from ``grad_y [B, Cout, Nout]``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch

from fovi_lab.kernels.families.base import Family, Param, Point, Problem, words_of


class AdjointFamily(Family):
    """An adjoint kernel family. Beyond :class:`~fovi_lab.kernels.families.base.Family`, it declares the gradient it
    computes (:attr:`gradient`), the kinds of the build and plan modules that name its kernels (:attr:`kinds`; with
    :attr:`kind_is_variant` each kind is also one of :attr:`variants` and fixes its values), and the parameters of
    its rows in ``fovi_lab/kernels/adjoint/configs.toml`` (:attr:`row_params`, between the variant and the block
    size, and :attr:`row_fixed`)."""

    gradient: str = ""                              # "dx" or "dW"
    kinds: Tuple[str, ...] = ()
    kind_is_variant: bool = False
    sums: bool = False                              # its kernels sum a stage (no tile GEMM: the reductions)
    row_params: Tuple[str, ...] = ()
    #: the values a table row does not give (the presets' own: the staged families' fp16 stage and operands)
    row_fixed: Dict[str, Any] = {}
    dtypes = (torch.float16, torch.bfloat16)

    # -- the configs table -------------------------------------------------------------------------------------
    def from_row(self, row: Tuple) -> Point:
        """The point of a row ``(variant, *fields, block_dim)`` of the adjoint configs table."""
        variant, *fields, block_dim = row
        if variant not in self.variants:
            raise ValueError(f"{self.key}: unknown variant {variant!r}; variants: {', '.join(self.variants)}")
        if len(fields) != len(self.row_params):
            raise ValueError(f"{self.key}: a row holds the variant, {', '.join(self.row_params)} and the block size")
        return self.point(**dict(zip(self.row_params, fields)), warps=int(block_dim) // 32, **self.row_fixed,
                          **self.variants[variant])

    def to_row(self, point: Point) -> Tuple:
        """The table row of ``point`` (:meth:`from_row` read back; the values of :attr:`row_fixed` left out)."""
        return (self.variant(point), *(point[p] for p in self.row_params), point["warps"] * 32)

    # -- the kernels of the build and plan modules ---------------------------------------------------------------
    #: what an unknown name's error adds after the presets (the staged families: the dtype suffixes)
    name_hint: str = ""
    #: the kernels each preset names beside its own, in words (the listing's last line of the family)
    forms_words: str = ""

    def forms(self, points: List[Point]) -> List[Point]:
        """The kernels the build modules make of these points (the presets), in the order they list them: the points
        themselves (the staged families add each one's fp32-stage and bf16 forms, the fused ones each walk)."""
        return list(points)

    def usual_block(self, point: Point) -> Point:
        """``point`` with the block its ids leave out for its tiles (the default of its ids' block field)."""
        field = next((f for f in self.id_fields if f.param == "warps"), None)
        default = None if field is None else field.default_of(point.as_dict())
        return point if default is None else point.replace(warps=default // field.scale)

    def kernel_key(self, point: Point) -> Tuple[str, str]:
        """The ``(kind, name)`` of ``point`` in the build and plan modules."""
        return self.kinds[0], point.id

    def factory(self, point: Point) -> Tuple[str, Tuple, Dict[str, Any]]:
        """``(name, args, kwargs)``: the kernel factory of :attr:`module` that builds ``point``, and its arguments."""
        raise NotImplementedError

    def spec(self, point: Point) -> Any:
        """The record the build and plan modules read the point's fields from: the values of the configs dicts of
        :mod:`fovi_lab.kernels.adjoint` (a dict for the staged families and the sums, the tiles for the fused)."""
        raise NotImplementedError

    # -- the checks and the roofline ---------------------------------------------------------------------------
    def taps(self, problem: Problem) -> int:
        """The taps of one output node (the list entries a fused kernel walks per node: ``K``, or ``P64 / Cin``)."""
        return problem.k or max(1, problem.p64 // max(1, problem.cin))

    def fewest_bytes(self, problem: Problem) -> float:
        """The gradient's fewest bytes: grad_y, the other operand (W for dx, x for dW), both int32 tables and the fp32
        gradient, each moved once."""
        s = problem.itemsize
        g = problem.batch * problem.cout * problem.nout
        x = problem.batch * problem.cin * problem.nin
        w = problem.cout * problem.q
        operand, out = (w, x) if self.gradient == "dx" else (x, w)
        return float(s * (g + operand) + 4 * out + 2 * 4 * problem.nout * problem.p64)


def stage_param(label: str = "stage dtype") -> Param:
    """The ``stage`` parameter of the staged families: the dtype of the stage between the GEMM and the sum."""
    return Param("stage", label, ("fp16", "fp32"), words=lambda v: f"{v} stage")


def operands_param() -> Param:
    """The ``operands`` parameter of the staged families: fp16, or bf16 (whose kernels stage in fp32)."""
    return Param("operands", "operand dtype", ("fp16", "bf16"), words=words_of({"fp16": None, "bf16": "bf16 operands"}))


__all__ = ["AdjointFamily", "stage_param", "operands_param"]
