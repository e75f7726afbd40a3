"""The staged adjoints' operands, plans and entry points: :func:`grad_input` and :func:`grad_weight`.

A plan holds the prepared operands and launches of one call (``plan.launch()``, then ``plan.finish()``),
so benchmarks and CUDA-graph capture can run the kernels without the host work.
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

import functools
import warnings
from typing import Optional

import torch

from fovi_lab.graph.meta import TrainingMeta, meta_aux, pad_to, validate_meta
from fovi_lab.ops.reference import NOT_GIVEN, CompactTorchOps, check_grad_args
from fovi_lab.kernels.common import check_tensor, fast_launch, gather_rows, warp_ct, warp_device
from fovi_lab.kernels.layout import swap_axes_into, transpose_into
from fovi_lab.kernels.adjoint.configs import (_BF16_SUFFIX, select_gi_config, select_gw_config, stage_fp32_default,
                                              grad_stage_budget_bytes)
from fovi_lab.kernels.adjoint.staged_build import GradKernel, GRAD_KERNELS, get_grad_kernel
from fovi_lab.kernels.families.registry import adjoint_point


#: Tests set this to NaN: every buffer this module allocates uninitialised is then pre-filled with it,
#: so an entry a kernel fails to write poisons the result instead of passing by luck.
_EMPTY_FILL: Optional[float] = None


def _empty(shape, dtype, device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    if _EMPTY_FILL is not None:
        t.fill_(_EMPTY_FILL)
    return t


def pad_flat_input_fp16(x: torch.Tensor, meta: TrainingMeta) -> torch.Tensor:
    """``[B, Cin, Nin]`` fp16 -> ``[B, Cin*Nin + 1]`` fp16 with a trailing zero pad column (contiguous)."""
    check_tensor("x", x, dtype=torch.float16, dim=3, shape=(None, meta.cin, meta.nin))
    b = x.shape[0]
    out = _empty((b, meta.pad_column + 1), x.dtype, x.device)
    out[:, :-1] = x.reshape(b, meta.pad_column)
    out[:, -1] = 0
    return out


def _transposed_padded_input(x: torch.Tensor, meta: TrainingMeta, bpad: int) -> torch.Tensor:
    """``xt[Cin*Nin + 1, Bpad]``: ``xt[r, b] = xpad[b, r]``; zero pad row and zero batch padding."""
    b = x.shape[0]
    xt = _empty((meta.pad_column + 1, bpad), x.dtype, x.device)
    return transpose_into(x.reshape(b, meta.pad_column), xt)          # (the pad row and columns: zeros)


def _padded_weight_t(weight: torch.Tensor, cpad: int) -> torch.Tensor:
    """``W^T`` as ``[Q, Cout_pad]`` fp16, zero columns for ``o >= Cout`` (contiguous)."""
    cout, q = weight.shape
    return transpose_into(weight, _empty((q, cpad), weight.dtype, weight.device))


_meta_aux = meta_aux      # per-meta cache of derived tables (fovi_lab.graph.meta.meta_aux)


def _decoded_reverse_csr(meta: TrainingMeta):
    """``(rev_rowptr, rev_row)`` with ``rev_row[i] = n_i*P64 + k_i`` (int32, on the meta's device).

    Decoding ``j = k*Nout + n`` once saves a division per gathered element; also checks the CSR is the
    real one (a meta built with an empty CSR would silently give dx = 0).
    """
    aux = _meta_aux(meta)
    got = aux.get("rev_row")
    if got is None:
        expected = int((meta.idx < meta.nin).sum())
        if meta.nnz != expected or int(meta.rev_rowptr[-1]) != expected:
            raise ValueError(f"meta: reverse CSR has {meta.nnz} entries but the graph has {expected} non-pad "
                             "(k, n) pairs; build the meta with fovi_lab.graph.meta.build_meta")
        col = meta.rev_col.to(torch.int64)
        kk, nn = col // meta.nout, col % meta.nout
        rev_row = (nn * meta.p64 + kk).to(torch.int32).contiguous()
        got = (meta.rev_rowptr.to(torch.int32).contiguous(), rev_row)
        aux["rev_row"] = got
    return got


def weight_row_csr(meta: TrainingMeta):
    """Reverse index over weight rows: ``(w_rowptr [Q+1] i32, w_col [nnz_w] i32)`` (cached per meta).

    Row ``q`` lists, ascending, every flat ``j = n*P64 + p`` with ``weight_linear[n, p] = q`` whose input
    is *not* the pad column (pad entries carry exactly-zero dWeff, docs/operator.md §3, so leaving them out is exact).
    """
    aux = _meta_aux(meta)
    got = aux.get("w_csr")
    if got is None:
        il = meta.input_linear_flat
        wl = meta.weight_linear_flat
        keep = torch.nonzero(il != meta.pad_column).squeeze(1)
        rows = wl[keep]
        order = torch.sort(rows, stable=True).indices           # stable: ascending j within a row
        w_col = keep[order].to(torch.int32).contiguous()
        counts = torch.bincount(rows, minlength=meta.q)
        rowptr = torch.zeros(meta.q + 1, dtype=torch.int64, device=il.device)
        rowptr[1:] = torch.cumsum(counts, 0)
        if meta.nout * meta.p64 >= 2**31 - 1:
            raise ValueError("meta: Nout*P64 must fit in int32 for the weight-row index")
        got = (rowptr.to(torch.int32).contiguous(), w_col)
        aux["w_csr"] = got
    return got

_MAX_STAGE_ELEMS = 2**31 - 1    # keep every stage index in int32 range
_STAGED_DTYPES = (torch.float16, torch.bfloat16)


def _check_common(meta: TrainingMeta, grad_y: torch.Tensor, weight=NOT_GIVEN, x=NOT_GIVEN) -> None:
    # shapes against the layer, and a table or reverse list that disagrees with idx / rf_index is refused
    validate_meta(meta)
    check_tensor("grad_y", grad_y, dtype=_STAGED_DTYPES)     # the dtype first: the Warp kernels are fp16 or bf16
    check_grad_args(meta, grad_y, weight=weight, x=x)
    check_tensor("grad_y", grad_y, dim=3, shape=(None, meta.cout, meta.nout), contiguous=True)
    if grad_y.shape[0] < 1:
        raise ValueError("grad_y: batch must be >= 1")
    if grad_y.device.type not in ("cpu", "cuda"):
        raise ValueError(f"grad_y: expected a cpu or cuda tensor, got device {grad_y.device}")


def _resolve(kind: str, config: Optional[str], default: str, fp32_stage: Optional[bool], bf16: bool = False):
    """-> (kernel name, explicit?). bf16 operands take the config's bf16 form (``<base>_bf16``, fp32 staging)."""
    fp32 = stage_fp32_default() if fp32_stage is None else bool(fp32_stage)
    if config is None:
        name = default
        explicit = False
    else:
        if not isinstance(config, str):
            raise TypeError(f"config: expected a config name (str) or None, got {type(config).__name__}")
        name = config
        explicit = True
    return _kernel_name(kind, name, fp32, bool(bf16)), explicit


@functools.lru_cache(maxsize=None)
def _kernel_name(kind: str, name: str, fp32: bool, bf16: bool) -> str:
    """The name of the kernel of config ``name`` for the call: its bf16 form for bf16 operands (which stages in
    fp32), else its fp32-stage form where the name or the call asks for one (a KeyError: no kernel of ``kind``)."""
    point = adjoint_point(kind, name)
    fp32 = bf16 or fp32 or point["stage"] == "fp32"
    return point.replace(stage="fp32" if fp32 else "fp16", operands="bf16" if bf16 else "fp16").id


def _kernels_or_fallback(kind: str, name: str, explicit: bool, device: str, finish: str = "csr"):
    """(stage GradKernel, reduction GradKernel or None, fallback reason or None)."""
    stage = get_grad_kernel(kind, name, device)
    red = None
    if stage is not None and finish == "csr":
        red_kind, red_name = stage.point.owner.sum_key(stage.point)
        red = get_grad_kernel(red_kind, red_name, device)
        if red is None:
            bad = (red_kind, red_name)
        else:
            return stage, red, None
    elif stage is not None:
        return stage, None, None
    else:
        bad = (kind, name)
    why = GRAD_KERNELS.why(bad, device)
    if explicit:
        raise RuntimeError(f"config: Warp {bad[0]} kernel {bad[1]!r} is not launchable on {device}: {why}")
    return None, None, f"Warp {bad[0]} kernel {bad[1]!r} is not launchable on {device} ({why})"


def _same_dtype(stage: GradKernel, grad_y: torch.Tensor) -> None:
    """The kernels read array descriptors, unchecked: a kernel's operand dtype must be the call's."""
    if bool(getattr(stage.kernel, "fovi_bf16", False)) != (grad_y.dtype == torch.bfloat16):
        raise ValueError(f"config: {stage.name!r} is a {'bf16' if stage.kernel.fovi_bf16 else 'fp16'} kernel; "
                         f"the operands are {grad_y.dtype} (name the bf16 form with the suffix {_BF16_SUFFIX!r})")


def _warn_fallback(why: str):
    warnings.warn(f"{why}; falling back to torch_compact (CompactTorchOps)", RuntimeWarning, stacklevel=3)


# Array descriptors (:func:`~fovi_lab.kernels.common.warp_ct`): they do not own memory, so the plans keep
# every tensor alive while they launch, and they skip Warp's dtype check, so only tensors of the dtypes
# the kernels declare are passed (the canary launches, with checked ``wp.array`` views, validate the
# signatures once per device).
_ct = warp_ct


def _wp_cached(meta: TrainingMeta, key: str, t: torch.Tensor):
    """Warp view of a per-meta constant tensor, made once (saves a from_torch per launch)."""
    aux = _meta_aux(meta)
    got = aux.get(("wp", key))
    if got is None or got[0] is not t:
        got = (t, _ct(t))
        aux[("wp", key)] = got
    return got[1]


def _launch_tiled(kernel, dim, inputs, block_dim: int, device: str):
    """A recorded tile launch on torch's current stream (:func:`~fovi_lab.kernels.common.fast_launch`):
    ``inputs`` are array descriptors (:func:`_ct`) and ints. A staged step makes 4+ launches per gradient,
    and re-setting a recorded launch costs less host time than packing every argument anew (``wp.launch``);
    the host time of a recorded launch, among the forward's parts, is in
    fovi_lab/records/h200/logs/host_probe_*.json."""
    fast_launch(kernel, tuple(dim), inputs, block_dim, device)


def _launch(kernel, dim, inputs, device: str):
    """The SIMT counterpart of :func:`_launch_tiled` (block 256, Warp's default)."""
    fast_launch(kernel, tuple(dim), inputs, 256, device, tiled=False)


class _GradInputPlan:
    """Operands and launches of one ``grad_input`` call, one batch chunk at a time.

    ``chunks`` lists ``(b0, b1, bcp)``; ``prepare(i)`` lays out chunk i's ``g_nob``; ``stage(i)`` and
    ``reduce(i)`` launch its two kernels; ``finish(i)`` moves its result into ``dx``. :func:`grad_input`
    runs them in order; the benchmark times ``stage``/``reduce`` alone on prepared operands.
    """

    def __init__(self, meta, grad_y, weight, stage: GradKernel, red: GradKernel, device: str, dx_direct: bool):
        self.meta, self.grad_y, self.stage_k, self.red_k, self.device = meta, grad_y, stage, red, device
        self.dx_direct = dx_direct
        spec = stage.spec
        b = grad_y.shape[0]
        self.tile_b = tile_b = spec["tile_b"]
        self.cpad = pad_to(meta.cout, spec["tile_o"])
        self.wt = _padded_weight_t(weight, self.cpad)                           # [Q, Cout_pad]
        if stage.point["staged_rows"]:                                        # stems: W rows staged once
            weff = _empty((meta.nout * meta.p64, self.cpad), self.wt.dtype, grad_y.device)
            gather_rows(self.wt, meta.weight_linear.view(-1), weff)
            self.wt = weff                                                     # [Nout*P64, Cout_pad]
        rowptr, rev_row = _decoded_reverse_csr(meta)
        self.w_rowptr = _wp_cached(meta, "rev_rowptr32", rowptr)
        self.w_rev_row = _wp_cached(meta, "rev_row", rev_row)
        self.w_wl = _wp_cached(meta, "weight_linear", meta.weight_linear)
        self.w_wt = _ct(self.wt)
        itemsize = 4 if stage.fp32_stage else 2
        per_b = meta.nout * meta.p64 * itemsize
        bchunk = max(tile_b, (grad_stage_budget_bytes() // max(1, per_b)) // tile_b * tile_b)
        cap = max(tile_b, (_MAX_STAGE_ELEMS // (meta.nout * meta.p64)) // tile_b * tile_b)
        bchunk = min(bchunk, pad_to(b, tile_b), cap)
        self.bchunk = bchunk = min(bchunk, pad_to(-(-b // -(-b // bchunk)), tile_b))     # chunks as even as tiles allow
        self.chunks = [(b0, min(b, b0 + bchunk), pad_to(min(b, b0 + bchunk) - b0, tile_b))
                       for b0 in range(0, b, bchunk)]
        sdt = torch.float32 if stage.fp32_stage else torch.float16
        self.stage_buf = _empty((meta.nout * meta.p64 * bchunk,), sdt, grad_y.device)
        self.dx = _empty((b, meta.cin, meta.nin), torch.float32, grad_y.device)
        self.n_p = meta.p64 // spec["tile_p"]
        self.n_o = self.cpad // spec["tile_o"]
        self._cur = {}

    @property
    def stage_bytes(self) -> int:
        return self.stage_buf.numel() * self.stage_buf.element_size()

    def prepare(self, i: int) -> None:
        meta, (b0, b1, bcp) = self.meta, self.chunks[i]
        bc = b1 - b0
        g_nob = swap_axes_into(self.grad_y[b0:b1], self.grad_y.new_empty(meta.nout, self.cpad, bcp))  # zero pads
        da = self.stage_buf[: meta.nout * meta.p64 * bcp].view(meta.nout, meta.p64, bcp)
        if self.dx_direct:
            out = self.dx[b0:b1].permute(1, 2, 0)                              # [Cin, Nin, bc] strided view
        else:
            out = _empty((meta.cin, meta.nin, bc), torch.float32, self.grad_y.device)
        self._cur = dict(i=i, g_nob=g_nob, da=da, out=out, w_g=_ct(g_nob), w_da=_ct(da),
                         w_da2=_ct(da.view(meta.nout * meta.p64, bcp)), w_out=_ct(out))

    def stage(self) -> None:
        c, meta = self._cur, self.meta
        bcp = c["da"].shape[2]
        _launch_tiled(self.stage_k.kernel, self.stage_k.grid(meta.nout, meta.p64, bcp),
                      [self.w_wl, self.w_wt, c["w_g"], self.n_p, self.n_o, c["w_da"]],
                      self.stage_k.spec["block_dim"], self.device)

    def reduce(self) -> None:
        c, meta = self._cur, self.meta
        b0, b1, _ = self.chunks[c["i"]]
        _launch(self.red_k.kernel, (meta.nin, meta.cin, b1 - b0),
                [self.w_rowptr, self.w_rev_row, c["w_da2"], int(meta.k), c["w_out"]], self.device)

    def finish(self) -> None:
        c = self._cur
        if not self.dx_direct:
            b0, b1, _ = self.chunks[c["i"]]
            self.dx[b0:b1] = c["out"].permute(2, 0, 1)

    def run(self) -> torch.Tensor:
        for i in range(len(self.chunks)):
            self.prepare(i)
            self.stage()
            self.reduce()
            self.finish()
        self._cur = {}
        return self.dx


class _GradWeightPlan:
    """Operands and launches of one ``grad_weight`` call, one node chunk at a time (see _GradInputPlan)."""

    def __init__(self, meta, grad_y, x, stage: GradKernel, red: Optional[GradKernel], device: str, finish: str):
        self.meta, self.grad_y, self.stage_k, self.red_k, self.device = meta, grad_y, stage, red, device
        self.finish_mode = finish
        spec = stage.spec
        b = grad_y.shape[0]
        self.cpad = pad_to(meta.cout, spec["tile_n"] * stage.point.owner.pairs(stage.point))
        self.tile_kb = tkb = spec["tile_kb"]
        self.bpad = pad_to(b, tkb)
        self.xt = _transposed_padded_input(x, meta, self.bpad)                 # [Cin*Nin+1, Bpad]
        self.w_xt = _ct(self.xt)
        itemsize = 4 if stage.fp32_stage else 2
        self.staged_x = stage.point["staged_rows"]                            # stems: x rows staged per chunk
        per_node = meta.p64 * self.cpad * itemsize + (meta.p64 * self.bpad * 2 if self.staged_x else 0)
        self.nc = nc = max(1, min(meta.nout, grad_stage_budget_bytes() // max(1, per_node),
                                  _MAX_STAGE_ELEMS // (meta.p64 * self.cpad),
                                  _MAX_STAGE_ELEMS // (meta.p64 * self.bpad) if self.staged_x else meta.nout))
        self.nc = nc = -(-meta.nout // -(-meta.nout // nc))                    # chunks as even as the nodes allow
        if self.staged_x:
            self.at = _empty((nc * meta.p64, self.bpad), x.dtype, grad_y.device)
        self.chunks = [(n0, min(meta.nout, n0 + nc)) for n0 in range(0, meta.nout, nc)]
        sdt = torch.float32 if stage.fp32_stage else torch.float16
        self.stage_buf = _empty((nc * meta.p64 * self.cpad,), sdt, grad_y.device)
        if finish == "csr":
            w_rowptr, w_col = weight_row_csr(meta)
            self.w_wrowptr = _wp_cached(meta, "w_rowptr", w_rowptr)
            self.w_wcol = _wp_cached(meta, "w_col", w_col)
            self.dwt = _empty((meta.q, self.cpad), torch.float32, grad_y.device)
        else:
            self.dwt = torch.zeros(meta.q, self.cpad, dtype=torch.float32, device=grad_y.device)
        self.w_dwt = _ct(self.dwt)
        self.n_p = meta.p64 // spec["tile_p"]
        self.n_b = self.bpad // tkb
        self._cur = {}

    @property
    def stage_bytes(self) -> int:
        return self.stage_buf.numel() * self.stage_buf.element_size()

    def prepare(self, i: int) -> None:
        meta, (n0, n1) = self.meta, self.chunks[i]
        m = n1 - n0
        b = self.grad_y.shape[0]
        g_nbo = self.grad_y.new_zeros(m, self.bpad, self.cpad)                 # zero pads: batch and Cout
        g_nbo[:, :b, :meta.cout] = self.grad_y[:, :, n0:n1].permute(2, 0, 1)
        dweff = self.stage_buf[: m * meta.p64 * self.cpad].view(m, meta.p64, self.cpad)
        flat = dweff.view(m * meta.p64, self.cpad)
        il = meta.input_linear[n0:n1]
        self._cur = dict(i=i, g_nbo=g_nbo, dweff=dweff, flat=flat, w_g=_ct(g_nbo), w_dweff=_ct(dweff),
                         w_flat=_ct(flat), w_il=_ct(il) if m < meta.nout else
                         _wp_cached(meta, "input_linear", meta.input_linear), w_x=self.w_xt)
        if self.staged_x:
            at = self.at[: m * meta.p64]
            gather_rows(self.xt, meta.input_linear.view(-1), at, n0 * meta.p64)
            self._cur["w_x"] = _ct(at)

    def stage(self) -> None:
        c, meta = self._cur, self.meta
        m = c["dweff"].shape[0]
        spec = self.stage_k.spec
        _launch_tiled(self.stage_k.kernel, self.stage_k.grid(m, meta.p64, self.cpad),
                      [c["w_il"], c["w_x"], c["w_g"], self.n_p, self.n_b, c["w_dweff"]],
                      spec["block_dim"], self.device)

    def reduce(self) -> None:
        c, meta = self._cur, self.meta
        n0, n1 = self.chunks[c["i"]]
        if self.finish_mode == "csr":
            j_lo = n0 * meta.p64
            j_hi = n1 * meta.p64 if n1 < meta.nout else 2147483647            # sentinel: no upper search
            _launch(self.red_k.kernel, (meta.q, meta.cout),
                    [self.w_wrowptr, self.w_wcol, c["w_flat"], int(j_lo), int(j_hi), int(n0 > 0), self.w_dwt],
                    self.device)
        else:
            self.dwt.index_add_(0, meta.weight_linear_flat[n0 * meta.p64: n1 * meta.p64], c["flat"].float())

    def run(self) -> torch.Tensor:
        for i in range(len(self.chunks)):
            self.prepare(i)
            self.stage()
            self.reduce()
        self._cur = {}
        return self.dwt[:, :self.meta.cout].t().contiguous()


def plan_grad_input(meta, grad_y, weight, config=None, *, stage_fp32=None, dx_direct=False):
    """Validate, pick kernels; returns a :class:`_GradInputPlan` or ``(None, why)`` for the fallback."""
    _check_common(meta, grad_y, weight=weight)
    check_tensor("weight", weight, dtype=grad_y.dtype, dim=2, shape=(meta.cout, meta.q),
                 device=grad_y.device, contiguous=True)
    name, explicit = _resolve("gi", config, select_gi_config(grad_y.shape[0], meta.nout, grad_y.device, meta.cin,
                                                                meta.p64, meta.cout),
                              stage_fp32, grad_y.dtype == torch.bfloat16)
    try:
        device = warp_device(grad_y)
    except ImportError as exc:
        return None, f"Warp is unavailable ({exc})"
    stage, red, why = _kernels_or_fallback("gi", name, explicit, device)
    if stage is None:
        return None, why
    _same_dtype(stage, grad_y)
    return _GradInputPlan(meta.to(grad_y.device), grad_y, weight, stage, red, device, dx_direct), None


def plan_grad_weight(meta, grad_y, x, config=None, *, stage_fp32=None, finish=None):
    """Validate, pick kernels; returns a :class:`_GradWeightPlan` or ``(None, why)`` for the fallback."""
    _check_common(meta, grad_y, x=x)
    check_tensor("x", x, dtype=grad_y.dtype, dim=3, shape=(grad_y.shape[0], meta.cin, meta.nin),
                 device=grad_y.device, contiguous=True)
    finish = "csr" if finish is None else finish
    if finish not in ("csr", "index_add"):
        raise ValueError(f"finish: expected 'csr' or 'index_add', got {finish!r}")
    name, explicit = _resolve("gw", config, select_gw_config(meta.cout, meta.cin, grad_y.shape[0], meta.nout,
                                                                      meta.p64), stage_fp32,
                              grad_y.dtype == torch.bfloat16)
    try:
        device = warp_device(grad_y)
    except ImportError as exc:
        return None, f"Warp is unavailable ({exc})"
    stage, red, why = _kernels_or_fallback("gw", name, explicit, device, finish)
    if stage is None:
        return None, why
    _same_dtype(stage, grad_y)
    return _GradWeightPlan(meta.to(grad_y.device), grad_y, x, stage, red, device, finish), None


def grad_input(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor, config: Optional[str] = None, *,
               stage_fp32: Optional[bool] = None, dx_direct: bool = False) -> torch.Tensor:
    """``dx [B, Cin, Nin]`` fp32 of the compact operator; deterministic reverse-CSR reduction.

    Args:
        meta: the layer's :class:`TrainingMeta` (moved to grad_y's device; needs the real reverse CSR).
        grad_y: ``[B, Cout, Nout]`` fp16 or bf16, contiguous.
        weight: ``[Cout, Q]`` in grad_y's dtype, contiguous, same device.
        config: a ``GRAD_INPUT_CONFIG_SPECS`` name (``_f32`` suffix: fp32 staging; bf16 operands run its
            ``_bf16`` form, which stages in fp32); None picks by
            batch (:func:`select_gi_config`) and falls back to torch_compact with a warning when that
            kernel cannot launch; an explicit config that cannot launch raises ``RuntimeError``.
        stage_fp32: stage dA in fp32 (None: the config's ``_f32`` suffix, else fp16).
        dx_direct: let the reduction write ``dx[b, c, m]`` in place (strided 4-byte stores) instead of
            a coalesced ``[Cin, Nin, Bc]`` buffer plus one torch transpose copy (the default).

    Returns:
        ``dx[b, c, m] = sum_{(n, p): input_linear[n, p] = c*Nin + m} sum_o g[b, o, n] W[o, weight_linear[n, p]]``
        (pad entries never reach dx). Batch chunks keep the stage within ``FOVI_KNN_STAGE_MIB``
        (at least one b tile: ``Nout*P64*tile_b*itemsize`` bytes).
    """
    plan, why = plan_grad_input(meta, grad_y, weight, config, stage_fp32=stage_fp32, dx_direct=dx_direct)
    if plan is None:
        _warn_fallback(why)
        return CompactTorchOps.grad_input(meta, grad_y, weight)
    return plan.run()


def grad_weight(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor, config: Optional[str] = None, *,
                stage_fp32: Optional[bool] = None, finish: Optional[str] = None) -> torch.Tensor:
    """``dW [Cout, Q]`` fp32; per-node ``dWeff`` staged by a tile GEMM, reduced deterministically.

    Mirrors :meth:`CompactTorchOps.grad_weight` semantics exactly: input-pad entries gather the zero pad
    row (exact-zero contributions) and weight-pad entries would scatter zeros into row 0 of the
    ``[Q, Cout]`` accumulator (the ``csr`` finish skips them; ``index_add`` adds the zeros).

    Args:
        meta: the layer's :class:`TrainingMeta`.
        grad_y: ``[B, Cout, Nout]`` fp16 or bf16, contiguous.
        x: ``[B, Cin, Nin]`` in grad_y's dtype, contiguous, same device (the forward's compute-dtype input).
        config: a ``GRAD_WEIGHT_CONFIG_SPECS`` name (``_f32`` suffix: fp32 staging); None picks by
            Cout (:func:`select_gw_config`), with the same fallback rules as :func:`grad_input`.
        stage_fp32: stage dWeff in fp32 (None: the config's ``_f32`` suffix, else fp16).
        finish: ``"csr"`` (deterministic weight-row gather, default) or ``"index_add"`` (the seed's
            torch fp32 ``index_add_``; atomics on CUDA). None: ``"csr"``.

    Returns:
        ``dW[o, q] = sum_{(n, p): weight_linear[n, p] = q} sum_b xpad[b, input_linear[n, p]] g[b, o, n]``.
        Node chunks keep the stage within ``FOVI_KNN_STAGE_MIB`` (at least one node).
    """
    plan, why = plan_grad_weight(meta, grad_y, x, config, stage_fp32=stage_fp32, finish=finish)
    if plan is None:
        _warn_fallback(why)
        return CompactTorchOps.grad_weight(meta, grad_y, x)
    return plan.run()
