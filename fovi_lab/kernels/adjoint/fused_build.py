"""Build the fused adjoint kernels once per config, and the per-meta lists they walk (cached beside the meta).
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

import functools
import threading
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from fovi_lab.graph.meta import TrainingMeta
from fovi_lab.kernels.common import ValidatedCache
from fovi_lab.kernels.forward.configs import mathdx_default
from fovi_lab.kernels.adjoint.fused import FUSED_FAMILIES, config_tiles, make_dw_kernel, make_dx_kernel
from fovi_lab.kernels.families.registry import adjoint_point, presets


@dataclass
class NmGradKernel:
    kind: str           # "dxn" | "dxs" | "dwn" | "dws"
    name: str
    kernel: object
    tiles: Tuple[int, int, int, int]


_build_lock = threading.Lock()
_KERNELS: Dict[Tuple[str, str, Optional[bool], bool], object] = {}
_VALIDATED = ValidatedCache("Warp node-major grad kernel")


#: The kernel factories of :mod:`fovi_lab.kernels.adjoint.fused` by name: a fused family's
#: :meth:`~fovi_lab.kernels.families.fused_adjoints.FusedDx.factory` names the one that builds its point.
_FACTORIES = {"make_dx_kernel": make_dx_kernel, "make_dw_kernel": make_dw_kernel}


def _factory(kind: str, name: str):
    """The factory of the kernel ``(kind, name)``, a function of its tiles (``mathdx`` and ``bf16`` by keyword)."""
    point = adjoint_point(kind, name)
    factory, _, kwargs = point.owner.factory(point)
    return functools.partial(_FACTORIES[factory], **kwargs)


def _kinds():
    """kind -> (its configs: name -> tiles, the factory of its tiles): "dxn"/"dwn" walk whole lists, "dxs"/"dws"
    balanced segments (the same tiles), from the fused families."""
    out = {}
    for fam in FUSED_FAMILIES:
        shown = presets(fam.key)
        for kind in fam.kinds:
            out[kind] = ({p.name: fam.tiles(p.point) for p in shown}, _factory(kind, shown[0].name))
    return out


#: The tiles of ``(kind, name)``: ``(rows, columns, step, block_dim)``.
_spec = config_tiles


def validated_key(kind: str, name: str, bf16: bool = False):
    """The per-device validation key of one kernel: ``(kind, name, mathdx)``, the name marked ``" (bf16)"`` for
    a bf16 kernel (validated apart from its fp16 twin)."""
    return (kind, f"{name} (bf16)" if bf16 else name, mathdx_default())


def build_fused_kernel(kind: str, name: str, bf16: bool = False):
    """The fused adjoint kernel ``(kind, name)`` (bf16 operands with ``bf16``), built once per MathDx setting."""
    mathdx = mathdx_default()
    key = (kind, name, mathdx, bool(bf16))
    with _build_lock:
        k = _KERNELS.get(key)
        if k is None:
            tiles = _spec(kind, name)                 # (a ValueError names a kind that is no fused one)
            k = _factory(kind, name)(*tiles, mathdx=mathdx, bf16=bool(bf16))
            _KERNELS[key] = k
        return k


def _aux(meta: TrainingMeta) -> dict:
    from fovi_lab.graph.meta import meta_aux as _meta_aux
    return _meta_aux(meta)


def reverse_lists(meta: TrainingMeta):
    """``(rowptr [Nin+1], rn [nnz], rv [nnz])`` int32: input node m's readers (n, tap), in CSR order."""
    aux = _aux(meta)
    got = aux.get("nm_rev")
    if got is None:
        col = meta.rev_col.to(torch.int64)
        kk, nn = col // meta.nout, col % meta.nout
        rv = meta.rf_index.to(col.device)[nn, kk]
        got = (meta.rev_rowptr.to(torch.int32).contiguous(), nn.to(torch.int32).contiguous(),
               rv.to(torch.int32).contiguous())
        if int(got[0][-1]) != int((meta.idx < meta.nin).sum()):
            raise ValueError("meta: reverse CSR does not list every non-pad (k, n) pair; "
                             "build the meta with fovi_lab.graph.meta.build_meta")
        aux["nm_rev"] = got
    return got


def tap_lists(meta: TrainingMeta):
    """``(vrowptr [V+1], vn [nnz], vm [nnz], maxlen)``: int32 lists of tap v's (output node, input node)
    pairs, non-pad neighbours only, in (n, k) order, and the length of the longest list."""
    aux = _aux(meta)
    got = aux.get("nm_tap")
    if got is None:
        idx = meta.idx.to(meta.device)
        rf = meta.rf_index.to(meta.device)
        real = (idx < meta.nin).reshape(-1)
        flat = torch.nonzero(real).squeeze(1)                         # ascending j = n*K + k
        taps = rf.reshape(-1)[flat]
        order = torch.sort(taps, stable=True).indices
        j = flat[order]
        counts = torch.bincount(taps, minlength=meta.v)
        rowptr = torch.zeros(meta.v + 1, dtype=torch.int64, device=idx.device)
        rowptr[1:] = torch.cumsum(counts, 0)
        got = (rowptr.to(torch.int32).contiguous(), (j // meta.k).to(torch.int32).contiguous(),
               idx.reshape(-1)[j].to(torch.int32).contiguous(), int(counts.max()) if counts.numel() else 0)
        aux["nm_tap"] = got
    return got
