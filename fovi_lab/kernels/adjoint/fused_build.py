"""Build the fused adjoint kernels once per config, and the per-meta lists they walk (cached beside the meta).
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

import threading
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from fovi_lab.graph.meta import TrainingMeta
from fovi_lab.kernels.common import ValidatedCache
from fovi_lab.kernels.forward.configs import mathdx_default
from fovi_lab.kernels.adjoint.fused import (DW_NM_CONFIG_SPECS, DX_NM_CONFIG_SPECS, make_dw_nm_kernel,
                                            make_dw_seg_kernel, make_dx_nm_kernel, make_dx_seg_kernel)


@dataclass
class NmGradKernel:
    kind: str           # "dxn" | "dwn"
    name: str
    kernel: object
    tiles: Tuple[int, int, int, int]


_build_lock = threading.Lock()
_KERNELS: Dict[Tuple[str, str, Optional[bool], bool], object] = {}
_VALIDATED = ValidatedCache("Warp node-major grad kernel")


# kind -> (config table, factory): "dxn"/"dwn" walk whole lists, "dxs"/"dws" balanced segments (same tiles)
def _kinds():
    return {"dxn": (DX_NM_CONFIG_SPECS, make_dx_nm_kernel), "dwn": (DW_NM_CONFIG_SPECS, make_dw_nm_kernel),
            "dxs": (DX_NM_CONFIG_SPECS, make_dx_seg_kernel), "dws": (DW_NM_CONFIG_SPECS, make_dw_seg_kernel)}


def _spec(kind: str, name: str) -> Tuple[int, int, int, int]:
    table = _kinds().get(kind, (None,))[0]
    if table is None:
        raise ValueError(f"kind: expected one of 'dxn', 'dwn', 'dxs', 'dws', got {kind!r}")
    if name not in table:
        raise KeyError(f"config: unknown {kind} config {name!r}; known: {sorted(table)}")
    return table[name]


def validated_key(kind: str, name: str, bf16: bool = False):
    """The per-device validation key of one kernel: ``(kind, name, mathdx)``, the name marked ``" (bf16)"`` for
    a bf16 kernel (validated apart from its fp16 twin)."""
    return (kind, f"{name} (bf16)" if bf16 else name, mathdx_default())


def _build(kind: str, name: str, bf16: bool = False):
    mathdx = mathdx_default()
    key = (kind, name, mathdx, bool(bf16))
    with _build_lock:
        k = _KERNELS.get(key)
        if k is None:
            tiles = _spec(kind, name)
            k = _kinds()[kind][1](*tiles, mathdx=mathdx, bf16=bool(bf16))
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
