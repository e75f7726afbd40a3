"""The analysis of the index tables: their range, whether they have the node-major form (docs/operator.md §2.1),
and the facts the forward plans and the kernel families read off them.

The analysis is cached per table object and version, so a call pays it once per table.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from fovi_lab.kernels.common import warp_ct


@dataclass
class TableInfo:
    """Per-table facts: node-major tables ``(idx [Nout,K] i32 (nin = pad), rf [Nout,K] i32, K)`` when the
    tables have the docs/operator.md §2.1 structure (else None), and, built on first use, the same lists compacted
    per node (real neighbours first) with their counts, for the pipelined node-major kernels.
    ``p_used``: one past the last column of ``input_linear`` that holds a real entry in some row (the
    SIMT kernel's loop length: the P64 fillers after it are skipped)."""

    nm: Optional[Tuple[torch.Tensor, torch.Tensor, int]]
    nin: int = 0
    p_used: int = 0
    _compact: Optional[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None
    _warp: Optional[dict] = None

    def wa(self, t: torch.Tensor, flat: bool = False):
        """Warp array descriptor (:func:`~fovi_lab.kernels.common.warp_ct`) of one of these persistent tables,
        made once and kept with the tensor it describes; ``flat=True``: the table flattened to 1-D (the
        index of the i2c row gathers)."""
        if self._warp is None:
            self._warp = {}
        key = ("flat", id(t)) if flat else id(t)
        a = self._warp.get(key)
        if a is None:
            v = t.view(-1) if flat else t
            a = self._warp[key] = (warp_ct(v), v)
        return a[0]

    def compact(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(idxc, rfc, cnt)``: ``idxc[n, :cnt[n]]`` are node n's real neighbours (pads dropped)."""
        if self._compact is None:
            idx, rf, _ = self.nm
            real = idx < self.nin
            order = torch.sort((~real).to(torch.int8), dim=1, stable=True).indices
            keep = torch.gather(real, 1, order)
            idxc = torch.where(keep, torch.gather(idx, 1, order), torch.zeros_like(idx))
            rfc = torch.where(keep, torch.gather(rf, 1, order), torch.zeros_like(rf))
            self._compact = (idxc.to(torch.int32).contiguous(), rfc.to(torch.int32).contiguous(),
                             real.sum(1).to(torch.int32).contiguous())
        return self._compact


_table_lock = threading.RLock()      # re-entrant: the weak-reference callbacks below may run under it (a GC pass)
_TABLES: Dict[Tuple, Tuple] = {}


def analyse_tables(il: torch.Tensor, wl: Optional[torch.Tensor], cin: int, nin: int, q: Optional[int]) -> TableInfo:
    """Range-check the index tables and derive the node-major tables, once per table version.

    Cached by object identity (weak reference) and ``_version``, so an in-place edit or a new table
    at a recycled address is re-analysed. Raises a ValueError naming the table on out-of-range ids.
    """
    import weakref
    key = (id(il), id(wl), cin, nin, q)
    with _table_lock:
        hit = _TABLES.get(key)
    if hit is not None:
        ref_il, ref_wl, ver, info = hit
        if ref_il() is il and (wl is None or ref_wl() is wl) and ver == (il._version, None if wl is None else wl._version):
            return info
    pad_col = cin * nin
    lo, hi = int(il.min()), int(il.max())
    if lo < 0 or hi > pad_col:
        raise ValueError(f"input_linear: entries must lie in [0, Cin*Nin={pad_col}] (Cin*Nin = pad column), "
                         f"got range [{lo}, {hi}]")
    nm = None
    if wl is not None:
        lo, hi = int(wl.min()), int(wl.max())
        if lo < 0 or hi >= q:
            raise ValueError(f"weight_linear: entries must lie in [0, Q={q}), got range [{lo}, {hi}]")
        nm = _derive_node_major(il, wl, cin, nin, q // cin)
    real_cols = torch.nonzero((il != pad_col).any(0))
    p_used = int(real_cols[-1, 0]) + 1 if real_cols.numel() else 0
    info = TableInfo(nm=nm, nin=nin, p_used=p_used)
    with _table_lock:
        # (the lock and table are bound as defaults: at interpreter exit the module's globals are gone
        # before the last weak-reference callbacks run)
        def _drop(_ref, key=key, lock=_table_lock, tables=_TABLES):
            with lock:
                ent = tables.get(key)
                if ent is not None and (ent[0] is _ref or ent[1] is _ref):
                    del tables[key]
        _TABLES[key] = (weakref.ref(il, _drop), weakref.ref(wl, _drop) if wl is not None else None,
                        (il._version, None if wl is None else wl._version), info)
    return info


def _derive_node_major(il: torch.Tensor, wl: torch.Tensor, cin: int, nin: int, v: int):
    """``(idx [Nout,K], rf [Nout,K], K)`` int32 when the tables have the docs/operator.md §2.1 structure, else None.

    ``K`` is read off the first column whose weight id lies in channel 1's block; the tables are then
    rebuilt from (idx, rf) and compared exactly, so a table of any other layout is never mistaken
    for one. With Cin == 1 every column is one neighbour (P64 fillers become pad neighbours).
    """
    nout, p64 = il.shape
    if cin == 1:
        k = p64
    else:
        c_of_p = (wl[0] // v)
        nz = torch.nonzero(c_of_p == 1)
        if nz.numel() == 0:
            return None
        k = int(nz[0, 0])
        if k < 1 or cin * k > p64:
            return None
    idx = il[:, :k].to(torch.int64)
    rf = wl[:, :k].to(torch.int64)
    pad_col = cin * nin
    is_pad = idx == pad_col
    if bool(((idx >= nin) & ~is_pad).any()) or bool((rf >= v).any()):
        return None
    node = torch.where(is_pad, torch.full_like(idx, nin), idx)
    c = torch.arange(cin, device=il.device, dtype=torch.int64).view(1, cin, 1)
    il_exp = torch.full((nout, p64), pad_col, dtype=torch.int64, device=il.device)
    wl_exp = torch.zeros((nout, p64), dtype=torch.int64, device=il.device)
    il_exp[:, :cin * k] = torch.where(is_pad.unsqueeze(1), torch.tensor(pad_col, device=il.device),
                                      c * nin + node.unsqueeze(1)).reshape(nout, cin * k)
    wl_exp[:, :cin * k] = (c * v + rf.unsqueeze(1)).reshape(nout, cin * k)
    if not (torch.equal(il_exp, il.to(torch.int64)) and torch.equal(wl_exp, wl.to(torch.int64))):
        return None
    return node.to(torch.int32).contiguous(), rf.to(torch.int32).contiguous(), k
