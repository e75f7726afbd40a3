"""Index tables of the compact KNN convolution (docs/operator.md §2.1, §3.1).

A KNN-conv layer is fully described, for the kernels, by two integer tables of shape
``[Nout, K]``:

* ``idx[n, k]``: the input node read by neighbour ``k`` of output node ``n``; the value
  ``nin`` is the pad token (the neighbour carries no data and gathers an exact zero);
* ``rf_index[n, k]``: the reference-grid tap in ``[0, V)`` that neighbour falls into.

From them :func:`build_meta` derives everything a backend needs, for ``p = c*K + k``
(channel-major inside a node) and ``P = Cin*K`` padded to ``P64`` (next multiple of 64)::

    input_linear [n, p] = c*Nin + idx[n, k]   if idx[n, k] < Nin   else  Cin*Nin   (pad column)
    weight_linear[n, p] = c*V   + rf[n, k]                                          (always real)
    (p >= P:  input_linear = Cin*Nin, weight_linear = 0)

so that, with ``xpad = [x.reshape(B, Cin*Nin) | 0]``, one output node is one small GEMM::

    y[b, o, n] = bias[o] + sum_p xpad[b, input_linear[n, p]] * W[o, weight_linear[n, p]]

The reverse CSR (over *input nodes*, channels excluded) lists, for every input node ``m``,
the packed ``j = k*Nout + n`` of every non-pad (k, n) that reads ``m``; it lets the
grad-input reduction gather instead of scatter, so it is deterministic without atomics.
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List

import numpy as np
import torch

import fovi_lab.settings as settings

__all__ = ["TrainingMeta", "build_meta", "validate_meta", "transposed_meta", "tap_meta", "tap_table_bytes",
           "held_bytes", "pad_to", "synthetic_graph", "SYNTHETIC_SHAPES", "meta_aux", "expanded_meta", "reverse_taps"]


# Re-entrant: a weak-reference callback (``_drop``) can run inside the locked region on the same thread, when an
# allocation there starts the cyclic garbage collector and it frees another meta (a plain Lock deadlocked the
# H200 benchmark that way, intermittently: the stack ended in ``_drop`` under ``meta_aux``).
_AUX_LOCK = threading.RLock()
_AUX: Dict[int, tuple] = {}


def meta_aux(meta: "TrainingMeta") -> dict:
    """A dict cached alongside ``meta`` (keyed by identity, dropped when the meta is collected): where the
    backends keep index tables they derive from a meta once (reverse lists, binned indices, descriptors)."""
    key = id(meta)
    with _AUX_LOCK:
        ent = _AUX.get(key)
        if ent is not None and ent[0]() is meta:
            return ent[1]

        def _drop(ref, key=key, lock=_AUX_LOCK, aux=_AUX):   # globals may be gone at interpreter exit
            with lock:
                cur = aux.get(key)
                if cur is not None and cur[0] is ref:
                    del aux[key]

        d: dict = {}
        _AUX[key] = (weakref.ref(meta, _drop), d)
        return d


def held_bytes(metas, device=None, derived: bool = True) -> int:
    """The bytes of index tables that the layers of ``metas`` (a meta or several) hold on ``device`` (default: every
    device): their own tables on it and everything the backends derived from them and keep (:func:`meta_aux`: the
    transposed and tap layers of the tensor-core adjoints with what is derived from those in turn, reverse lists,
    binned tables, plans' constant tensors), each storage counted once. What a layer keeps between calls, beside
    its weights: the benchmarks record it as ``tables_mib``. ``derived=False``: the metas' own tables alone."""
    want = None if device is None else torch.device(device)
    seen_storage, seen_obj = set(), set()
    total = 0
    todo = list(metas) if isinstance(metas, (list, tuple, set)) else [metas]
    while todo:
        o = todo.pop()
        if id(o) in seen_obj or o is None or isinstance(o, (str, bytes, int, float, bool, torch.device, torch.dtype)):
            continue
        seen_obj.add(id(o))
        if isinstance(o, torch.Tensor):
            if want is not None and (o.device.type != want.type or (want.index is not None
                                                                    and o.device.index != want.index)):
                continue
            st = o.untyped_storage()
            key = (str(o.device), st.data_ptr())
            if st.data_ptr() and key not in seen_storage:
                seen_storage.add(key)
                total += st.nbytes()
        elif isinstance(o, TrainingMeta):
            todo += [getattr(o, f) for f in _TENSOR_FIELDS] + [o.__dict__.get("_input_linear_flat"),
                                                               o.__dict__.get("_weight_linear_flat")]
            if derived:
                todo += [meta_aux(o)] + list(o._per_device.values())
        elif isinstance(o, dict):
            todo += list(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            todo += list(o)
        elif hasattr(o, "__dict__") and not isinstance(o, type) and type(o).__module__.startswith("fovi_lab"):
            todo += list(vars(o).values())      # the package's own plans; not Warp's objects (its runtime beyond)
    return total


def pad_to(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n`` (and >= ``multiple``)."""
    return max(multiple, -(-int(n) // multiple) * multiple)


class _FlatCopy:
    """``input_linear_flat`` / ``weight_linear_flat``: the int64 flat copy of an int32 table, for the PyTorch ops'
    ``index_select`` / ``index_add_``, made on its first read (the Warp kernels read the int32 tables alone, so the
    copies, twice the tables' bytes, exist only where a PyTorch op or the staged stems' reverse rows ask for them);
    one set by hand is kept (and checked by :func:`validate_meta`)."""

    def __init__(self, table: str):
        self.table = table

    def __set_name__(self, owner, name: str) -> None:
        self.slot = "_" + name

    def __get__(self, meta, owner=None):
        if meta is None:
            return self
        got = meta.__dict__.get(self.slot)
        if got is None:
            got = meta.__dict__[self.slot] = getattr(meta, self.table).reshape(-1).to(torch.int64)
        return got

    def __set__(self, meta, value) -> None:
        meta.__dict__[self.slot] = value


@dataclass
class TrainingMeta:
    """Everything a compact backend needs about one layer's graph (docs/operator.md §3.1).

    Attributes:
        cin, cout, nin, nout, k, v: layer sizes.
        p, p64, q: ``Cin*K``, ``P`` padded to a multiple of 64, ``Cin*V``.
        input_linear, weight_linear: ``[Nout, P64]`` int32, contiguous.
        input_linear_flat, weight_linear_flat: ``[Nout*P64]`` int64 copies (index_select/index_add_), made on their
            first read.
        rev_rowptr: ``[Nin+1]`` int32 reverse-CSR row pointers over input nodes.
        rev_col: ``[nnz]`` int32 packed ``j = k*Nout + n``, grouped by input node, stable in j.
        idx, rf_index: ``[Nout, K]`` int64 source tables (kept for oracles and drawings).
        device: the torch device every tensor lives on.
    """

    cin: int
    cout: int
    nin: int
    nout: int
    k: int
    v: int
    p: int
    p64: int
    q: int
    input_linear: torch.Tensor
    weight_linear: torch.Tensor
    rev_rowptr: torch.Tensor
    rev_col: torch.Tensor
    idx: torch.Tensor
    rf_index: torch.Tensor
    device: torch.device
    _per_device: Dict[str, "TrainingMeta"] = field(default_factory=dict, repr=False, compare=False)

    input_linear_flat = _FlatCopy("input_linear")
    weight_linear_flat = _FlatCopy("weight_linear")

    @property
    def pad_column(self) -> int:
        """Flat index of the zero pad column of ``xpad`` (``Cin*Nin``)."""
        return self.cin * self.nin

    @property
    def nnz(self) -> int:
        return int(self.rev_col.numel())

    def to(self, device) -> "TrainingMeta":
        """This meta on ``device`` (cached: each device's copy is built once)."""
        device = _placed(device)
        if device == self.input_linear.device:        # (a meta made for "cuda" is the current device's)
            return self
        key = str(device)
        cached = self._per_device.get(key)
        if cached is None:
            tensors = {
                name: getattr(self, name).to(device)
                for name in ("input_linear", "weight_linear", "rev_rowptr", "rev_col", "idx", "rf_index")
            }
            # every copy holds the meta it was made from (build_meta hands out one meta per graph while any holds it)
            self._per_device.setdefault(str(self.input_linear.device), self)
            cached = replace(self, device=device, _per_device=self._per_device, **tensors)
            if meta_aux(self).get("validated"):
                meta_aux(cached)["validated"] = True      # a copy of checked tables
            self._per_device[key] = cached
        return cached


def _placed(device) -> torch.device:
    """``device`` as a tensor placed there reports it: ``cuda`` is the current CUDA device, with its index."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _as_int_table(name: str, t, nout_k=None) -> torch.Tensor:
    t = torch.as_tensor(t)
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"{name}: expected an integer tensor, got dtype {t.dtype}")
    if t.dim() != 2:
        raise ValueError(f"{name}: expected shape [Nout, K], got {tuple(t.shape)}")
    if nout_k is not None and tuple(t.shape) != tuple(nout_k):
        raise ValueError(f"{name}: expected shape {tuple(nout_k)} (same as idx), got {tuple(t.shape)}")
    return t.to(torch.int64).cpu()


def build_meta(idx, rf_index, *, cin: int, cout: int, v: int, nin: int, device=None) -> TrainingMeta:
    """Build the compact-operator meta of one layer (docs/operator.md §2.1, §3.1).

    Args:
        idx: ``[Nout, K]`` integer neighbour ids in ``[0, nin]``; ``nin`` is the pad token.
        rf_index: ``[Nout, K]`` integer taps in ``[0, v)``.
        cin, cout: channel counts. v: taps of the reference grid. nin: input node count.
        device: where the tables live (default: CPU).

    Returns:
        A :class:`TrainingMeta` whose tables are int32 ``[Nout, P64]`` (their flat int64 copies made on first
        read) and a reverse CSR over input nodes. The same graph and sizes give the same meta (one object, while any
        holds it): the layers of one graph share the tables the backends derive from it (the transposed and tap
        layers of the tensor-core adjoints, their plans), which they would otherwise each build and keep. A meta is
        not to be changed in place.
    """
    for name, val in (("cin", cin), ("cout", cout), ("v", v), ("nin", nin)):
        if not isinstance(val, (int, np.integer)) or int(val) < 1:
            raise ValueError(f"{name}: expected a positive int, got {val!r}")
    cin, cout, v, nin = int(cin), int(cout), int(v), int(nin)
    idx = _as_int_table("idx", idx)
    rf = _as_int_table("rf_index", rf_index, idx.shape)
    nout, k = idx.shape
    if nout < 1 or k < 1:
        raise ValueError(f"idx: expected a non-empty [Nout, K] table, got {tuple(idx.shape)}")
    if idx.min() < 0 or idx.max() > nin:
        raise ValueError(f"idx: entries must lie in [0, nin={nin}] (nin = pad token), "
                         f"got range [{int(idx.min())}, {int(idx.max())}]")
    if rf.min() < 0 or rf.max() >= v:
        raise ValueError(f"rf_index: entries must lie in [0, v={v}), got range "
                         f"[{int(rf.min())}, {int(rf.max())}]; is v too small for this graph?")
    if cin * nin + 1 >= 2**31 or cin * v >= 2**31:
        raise ValueError("cin*nin and cin*v must fit in int32")

    key = (cin, cout, v, nin, tuple(idx.shape), hashlib.sha256(idx.numpy().tobytes()).hexdigest(),
           hashlib.sha256(rf.numpy().tobytes()).hexdigest())
    with _AUX_LOCK:
        meta = _INTERNED.get(key)
    if meta is None:
        meta = _built(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
        with _AUX_LOCK:
            meta = _INTERNED.setdefault(key, meta)
    return meta if device is None else meta.to(device)


#: The metas built so far, by their graph and sizes (held weakly): :func:`build_meta` of the same graph returns the
#: same meta, so every layer of one graph shares what the backends derive from it (:func:`meta_aux`).
_INTERNED: "weakref.WeakValueDictionary[tuple, TrainingMeta]" = weakref.WeakValueDictionary()


def _built(idx: torch.Tensor, rf: torch.Tensor, *, cin: int, cout: int, v: int, nin: int) -> TrainingMeta:
    """A new CPU meta of checked int64 tables (:func:`build_meta`'s work)."""
    nout, k = idx.shape
    p = cin * k
    p64 = pad_to(p, 64)
    q = cin * v
    c = torch.arange(cin, dtype=torch.int64).view(1, cin, 1)
    is_pad = (idx >= nin).unsqueeze(1)                                    # [Nout, 1, K]
    il = torch.where(is_pad, torch.tensor(cin * nin), c * nin + idx.unsqueeze(1))  # [Nout, Cin, K]
    wl = c * v + rf.unsqueeze(1)
    input_linear = torch.full((nout, p64), cin * nin, dtype=torch.int64)
    weight_linear = torch.zeros((nout, p64), dtype=torch.int64)
    input_linear[:, :p] = il.reshape(nout, p)
    weight_linear[:, :p] = wl.reshape(nout, p)

    # Reverse CSR over input nodes: j = k*Nout + n, i.e. pad_token[K, Nout] flattened row-major.
    flat = idx.t().reshape(-1)
    keep = torch.nonzero(flat < nin).squeeze(1)
    m = flat[keep]
    order = torch.sort(m, stable=True).indices
    rev_col = keep[order].to(torch.int32)
    counts = torch.bincount(m, minlength=nin)
    rev_rowptr = torch.zeros(nin + 1, dtype=torch.int64)
    rev_rowptr[1:] = torch.cumsum(counts, 0)

    meta = TrainingMeta(
        cin=cin, cout=cout, nin=nin, nout=nout, k=k, v=v, p=p, p64=p64, q=q,
        input_linear=input_linear.to(torch.int32).contiguous(),
        weight_linear=weight_linear.to(torch.int32).contiguous(),
        rev_rowptr=rev_rowptr.to(torch.int32), rev_col=rev_col,
        idx=idx, rf_index=rf, device=torch.device("cpu"),
    )
    meta_aux(meta)["validated"] = True
    return meta


_RELEASE_HOOKS: List[Callable[[TrainingMeta], None]] = []


def on_derived_meta_released(hook: Callable[[TrainingMeta], None]) -> None:
    """Call ``hook(meta)`` when a derived layer (a tap layer) leaves its cache, so that caches keyed on its
    tables (the forward's per-call plans) drop it too and its tables are freed."""
    _RELEASE_HOOKS.append(hook)


def derived_table_limit() -> int:
    """The byte budget for one derived layer's index tables: ``FOVI_KNN_TAP_TABLE_MIB`` (default 512 MiB)."""
    return settings.get("FOVI_KNN_TAP_TABLE_MIB") << 20


def _check_table_budget(what: str, rows: int, slots: int, detail: str) -> None:
    table_bytes = 24 * rows * pad_to(slots, 64)                 # two int32 and two int64 tables
    limit = derived_table_limit()
    if table_bytes > limit:
        raise RuntimeError(f"{what}: its index tables would take {table_bytes >> 20} MiB ({detail}), "
                           f"over FOVI_KNN_TAP_TABLE_MIB={limit >> 20}")


def transposed_meta(meta: TrainingMeta) -> TrainingMeta:
    """The transposed layer, whose forward is ``meta``'s input gradient (built once per meta, on its device).

    Its output nodes are ``meta``'s input nodes, its inputs ``meta``'s outputs: node ``m`` lists the entries
    ``(n, k)`` with ``idx[n, k] = m`` in reverse-list order (ascending ``k*Nout + n``), each with the tap
    ``rf_index[n, k]``, padded with the pad token ``Nout`` to the largest in-degree. Channels swap (Cin' = Cout,
    Cout' = Cin, V' = V), so with ``W'[c, o*V + t] = W[o, c*V + t]``::

        dx[b, c, m] = sum_{(n, k): idx[n, k] = m} sum_o g[b, o, n] W[o, c*V + rf[n, k]]
                    = forward'(g, W')[b, c, m]

    An input node no output reads has only pads (its dx is 0).
    """
    aux = meta_aux(meta)
    got = aux.get("transposed")
    if got is None:
        rowptr, col = meta.rev_rowptr.cpu().long(), meta.rev_col.cpu().long()
        counts = rowptr[1:] - rowptr[:-1]
        kt = max(1, int(counts.max()) if counts.numel() else 1)
        _check_table_budget("transposed layer", meta.nin, meta.cout * kt,
                            f"Nin={meta.nin} nodes x Cout={meta.cout} x largest in-degree {kt}")
        node = torch.repeat_interleave(torch.arange(meta.nin), counts)           # the input node of each entry
        slot = torch.arange(col.numel()) - rowptr[:-1][node]                     # its place in the node's list
        n, k = col % meta.nout, col // meta.nout
        idx_t = torch.full((meta.nin, kt), meta.nout, dtype=torch.int64)
        rf_t = torch.zeros((meta.nin, kt), dtype=torch.int64)
        idx_t[node, slot] = n
        rf_t[node, slot] = meta.rf_index.cpu()[n, k].long()
        got = aux["transposed"] = build_meta(idx_t, rf_t, cin=meta.cout, cout=meta.cin, v=meta.v, nin=meta.nout,
                                             device=meta.device)
    return got


def expanded_meta(meta: TrainingMeta) -> TrainingMeta:
    """The tap-expanded layer, whose forward stages ``meta``'s input gradient over every tap (built once per meta,
    on its device).

    Each output node ``n`` reads its own node of ``grad_y`` (K' = 1, V' = 1, Nin' = Nout) over all Cout channels
    (Cin' = Cout), and its output channels are ``meta``'s tap-channels ``c*V + t`` (Cout' = Q), so with the weight
    ``W' = W^T [Q, Cout]``::

        S[b, c*V + t, n] = sum_o g[b, o, n] W[o, c*V + t] = forward'(g, W')[b, c*V + t, n]

    and ``dx[b, c, m]`` is the sum, over ``m``'s reverse list ``(n, k)``, of ``S[b, c*V + rf[n, k], n]``
    (:func:`fovi_lab.kernels.adjoint.as_forward.grad_input_taps`). One dense GEMM: V / K times the stage's useful
    work, on 64-wide tiles of the Q output channels where the transposed layer would fill Cin of them.
    """
    aux = meta_aux(meta)
    got = aux.get("expanded")
    if got is None:
        own = torch.arange(meta.nout, dtype=torch.int64).unsqueeze(1)
        got = aux["expanded"] = build_meta(own, torch.zeros_like(own), cin=meta.cout, cout=meta.q, v=1,
                                           nin=meta.nout, device=meta.device)
    return got


def reverse_taps(meta: TrainingMeta) -> torch.Tensor:
    """``[nnz]`` int32 on the meta's device: for each reverse-list entry ``(n, k)`` (``rev_col``'s order), the
    column ``rf[n, k]*Nout + n`` of the tap-expanded stage's rows (:func:`expanded_meta`), built once per meta."""
    aux = meta_aux(meta)
    got = aux.get("reverse_taps")
    if got is None:
        col = meta.rev_col.cpu().long()
        n, k = col % meta.nout, col // meta.nout
        got = (meta.rf_index.cpu().long()[n, k] * meta.nout + n).to(torch.int32).to(meta.device)
        aux["reverse_taps"] = got
    return got


_TAP_METAS_KEPT = 4      # tap layers kept per meta (one per batch size; each holds V x pad64(B*K') index pairs)


def _longest_tap_list(meta: TrainingMeta) -> int:
    aux = meta_aux(meta)
    got = aux.get("longest_tap_list")
    if got is None:
        got = aux["longest_tap_list"] = int(torch.bincount(meta.rf_index[meta.idx < meta.nin].cpu(),
                                                           minlength=meta.v).max())
    return got


def tap_table_bytes(meta: TrainingMeta, batch: int) -> int:
    """The bytes of the index tables of ``meta``'s tap layer at batch ``batch`` (:func:`tap_meta`) as the rules and
    budgets count them: V rows of ``pad64(B x the longest tap list)`` slots at 24 bytes a slot, the two int32
    tables the kernels read and the two int64 flat copies a PyTorch op would make of them (on a device they are made
    only where read: :class:`TrainingMeta`), so a tap layer the Warp kernels run holds a third of it."""
    return 24 * meta.v * pad_to(int(batch) * max(1, _longest_tap_list(meta)), 64)


def tap_meta(meta: TrainingMeta, batch: int) -> TrainingMeta:
    """The tap layer of ``meta`` at batch ``batch``, whose forward is ``meta``'s weight gradient.

    ``dW[o, c*V + t] = sum_b sum_{(n, k): rf[n, k] = t} g[b, o, n] x[b, c, idx[n, k]]`` is one GEMM per tap over
    the pairs (b, entry), which is the compact forward of a layer whose output nodes are the taps: with the
    batch rows ``c`` (Cin of them), input channels ``b`` (B), inputs ``x'[c, b, m] = x[b, c, m]`` (Nin nodes)
    and the weight ``W'[o, b*Nout + n] = g[b, o, n]`` (V' = Nout "taps", one per output node), tap ``t`` lists
    its real entries ``(n, k)`` in ascending ``n*K + k``: ``idx'[t, j] = idx[n, k]``, ``rf'[t, j] = n``, padded
    with the pad token ``Nin`` to the longest list. Then ``forward'(x', W')[c, o, t] = dW[o, c*V + t]``.
    A tap no entry uses has only pads (its dW is 0). Built once per (meta, batch), on the meta's device.
    """
    aux = meta_aux(meta)
    cache = aux.setdefault("tap_metas", {})
    got = cache.get(int(batch))
    if got is None:
        longest = _longest_tap_list(meta)
        _check_table_budget(f"tap layer at batch {batch}", meta.v, int(batch) * max(1, longest),
                            f"V={meta.v} taps x B*{longest} entries")
        idx, rf = meta.idx.cpu().long(), meta.rf_index.cpu().long()
        flat_idx, flat_rf = idx.reshape(-1), rf.reshape(-1)
        real = torch.nonzero(flat_idx < meta.nin).squeeze(1)                     # ascending n*K + k
        taps = flat_rf[real]
        order = torch.sort(taps, stable=True).indices
        entry, tap = real[order], taps[order]
        counts = torch.bincount(taps, minlength=meta.v)
        kt = max(1, int(counts.max()) if counts.numel() else 1)
        start = torch.zeros(meta.v + 1, dtype=torch.int64)
        start[1:] = torch.cumsum(counts, 0)
        slot = torch.arange(entry.numel()) - start[:-1][tap]
        idx_t = torch.full((meta.v, kt), meta.nin, dtype=torch.int64)
        rf_t = torch.zeros((meta.v, kt), dtype=torch.int64)
        idx_t[tap, slot] = flat_idx[entry]
        rf_t[tap, slot] = entry // meta.k                                       # the output node n
        got = build_meta(idx_t, rf_t, cin=int(batch), cout=meta.cout, v=meta.nout, nin=meta.nin, device=meta.device)
        if len(cache) >= _TAP_METAS_KEPT:
            gone = cache.pop(next(iter(cache)))
            for hook in _RELEASE_HOOKS:
                hook(gone)
        cache[int(batch)] = got
    return got


_TENSOR_FIELDS = ("input_linear", "weight_linear", "rev_rowptr", "rev_col", "idx", "rf_index")
_TABLE_FIELDS = ("input_linear", "weight_linear", "input_linear_flat", "weight_linear_flat", "rev_rowptr",
                 "rev_col")


def validate_meta(meta) -> None:
    """Refuse a meta whose tables are not the ones :func:`build_meta` makes from its ``idx`` / ``rf_index``.

    Every kernel entry point calls this. A meta made by :func:`build_meta` (or a device copy of one) is
    marked and passes at once; any other (built by hand, or a dataclass copy with a table swapped) is
    checked once, completely: sizes, then ``idx`` / ``rf_index`` in range, then every derived table
    (``input_linear``, ``weight_linear``, their flat copies, the reverse lists ``rev_rowptr`` / ``rev_col``)
    equal to the one rebuilt from them. A meta that passes is marked. Tables edited in place after that are
    not re-checked: treat a meta as read-only.

    Raises:
        TypeError: ``meta`` is not a :class:`TrainingMeta`.
        ValueError: names the first table that disagrees, and how.
    """
    if not isinstance(meta, TrainingMeta):
        raise TypeError(f"meta: expected a TrainingMeta (fovi_lab.graph.meta.build_meta), got {type(meta).__name__}")
    aux = meta_aux(meta)
    if aux.get("validated"):
        return
    for name in _TABLE_FIELDS + ("idx", "rf_index"):
        t = getattr(meta, name)
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"meta.{name}: expected a tensor, got {type(t).__name__}")
        if t.device != meta.device:
            raise ValueError(f"meta.{name}: expected device {meta.device} (meta.device), got {t.device}")
    try:
        ref = build_meta(meta.idx, meta.rf_index, cin=meta.cin, cout=meta.cout, v=meta.v, nin=meta.nin)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"meta: its idx / rf_index do not make a valid layer: {exc}") from None
    for name in ("nout", "k", "p", "p64", "q"):
        if getattr(meta, name) != getattr(ref, name):
            raise ValueError(f"meta.{name}: expected {getattr(ref, name)} for idx {tuple(meta.idx.shape)}, "
                             f"cin={meta.cin}, v={meta.v}, got {getattr(meta, name)}")
    for name in _TABLE_FIELDS:
        got, want = getattr(meta, name), getattr(ref, name)
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            raise ValueError(f"meta.{name}: expected {want.dtype} {tuple(want.shape)}, got {got.dtype} {tuple(got.shape)}")
        if not got.is_contiguous():
            raise ValueError(f"meta.{name}: expected a contiguous tensor")
        diff = torch.nonzero(got.cpu() != want)
        if diff.numel():
            at = tuple(int(i) for i in diff[0])
            n = diff.shape[0]
            raise ValueError(f"meta.{name}: {n} {'entry differs' if n == 1 else 'entries differ'} from the table "
                             f"built from idx and rf_index (first at {at[0] if len(at) == 1 else at}: {got.cpu()[at].item()}, "
                             f"expected {want[at].item()}); build the meta with fovi_lab.graph.meta.build_meta")
    aux["validated"] = True


# (cin, cout, nin, nout, k, v, pads) from fovi's tests (docs/operator.md §5): 19 p-tiles / Cout below one
# tile / heavy padding.
SYNTHETIC_SHAPES = {
    "MAIN": (48, 96, 128, 40, 25, 100, 37),
    "ODD": (17, 7, 300, 33, 11, 25, 13),
    "PAD_HEAVY": (9, 33, 90, 45, 13, 30, 200),
}


def synthetic_graph(nin: int, nout: int, k: int, v: int, pads: int, seed: int = 0):
    """Random ``(idx, rf_index)`` tables with ``pads`` entries set to the pad token ``nin``.

    Fine for correctness (fovi's tests use it); it lacks the locality of real foveated graphs.
    """
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, nin, (nout, k), generator=g)
    rf = torch.randint(0, v, (nout, k), generator=g)
    pads = min(int(pads), nout * k)
    if pads:
        where = torch.randperm(nout * k, generator=g)[:pads]
        idx.view(-1)[where] = nin
    return idx, rf
