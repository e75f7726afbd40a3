"""The fused adjoints' per-device validation, operand layouts, plans, partial-sum finishes and entry points.

:func:`get_nm_grad_kernel` builds a config once and validates it once per device: a NaN-prefilled canary
runs the production plan on a small layer and compares it with the PyTorch op.

:func:`grad_input_nm` / :func:`grad_weight_nm` return None when their kernel cannot run (the caller falls
back to the staged adjoints). The default rules for segments and splits are in
:mod:`fovi_lab.kernels.adjoint.fused_rules`.
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

from typing import Optional, Tuple

import torch

from fovi_lab.graph.meta import TrainingMeta, pad_to, validate_meta
from fovi_lab.ops.reference import NOT_GIVEN, CompactTorchOps, check_grad_args
from fovi_lab.kernels.common import (built_once, check_once, check_tensor, fast_launch, init_warp, nan_canary, warp_ct,
                                     warp_device, wp)
from fovi_lab.kernels.forward.plans import DIRECT_STORE_MAX_BYTES
from fovi_lab.kernels.layout import swap_axes_into
from fovi_lab.kernels.adjoint.fused import (SEG_FINISH_BLOCK, seg_finish_kernel, seg_finish_lists,
                                            seg_finish_tiled_dims, seg_finish_tiled_kernel, select_dw_nm_config,
                                            select_dx_nm_config)
from fovi_lab.kernels.adjoint.fused_build import (NmGradKernel, _VALIDATED, _spec, build_fused_kernel, reverse_lists,
                                                  tap_lists, validated_key)
from fovi_lab.kernels.families.fused_adjoints import SEGMENTS
from fovi_lab.kernels.families.registry import adjoint_point
from fovi_lab.kernels.adjoint.fused_rules import (_segments, default_dw_nsplit, default_dw_seg_steps,  # noqa: F401
                                                  default_dx_seg_steps, dw_seg_steps_for, list_stats)


def _canary_problem(device: str, b: int, cout: int, cin: int, dtype: torch.dtype = torch.float16):
    from fovi_lab.graph.meta import build_meta
    g = torch.Generator().manual_seed(4321)
    nin, nout, k, v = 7, 3, 5, 6
    idx = torch.randint(0, nin + 1, (nout, k), generator=g)
    idx[0, 0] = nin                                                   # at least one pad neighbour
    rf = torch.randint(0, v, (nout, k), generator=g)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin, device=device)
    x = torch.randn(b, cin, nin, generator=g).to(device=device, dtype=dtype)
    w = (0.5 * torch.randn(cout, cin * v, generator=g)).to(device=device, dtype=dtype)
    gy = torch.randn(b, cout, nout, generator=g).to(device=device, dtype=dtype)
    return meta, x, w, gy


def _canary_dx(k: NmGradKernel, segments: bool, device: str, dtype: torch.dtype):
    """The canary's dx plan (over whole lists with the staged store, or segments of one step) and its reference."""
    tm, tn, tk, _ = k.tiles
    meta, x, w, gy = _canary_problem(device, b=tm, cout=tk, cin=tn, dtype=dtype)
    plan = (_GradInputNmPlan(meta, gy, w, None, device, seg=k, seg_steps=1) if segments else
            _GradInputNmPlan(meta, gy, w, k, device, store="staged"))
    return plan, CompactTorchOps.grad_input(meta, gy.float(), w.float())


def _canary_dw(k: NmGradKernel, segments: bool, device: str, dtype: torch.dtype):
    """The canary's dW plan (two interleaved splits, or segments of one step) and its reference."""
    to, tc, tkb, _ = k.tiles
    meta, x, w, gy = _canary_problem(device, b=tkb, cout=to, cin=tc, dtype=dtype)
    plan = (_GradWeightNmPlan(meta, gy, x, None, device, seg=k, seg_steps=1) if segments else
            _GradWeightNmPlan(meta, gy, x, k, device, nsplit=2))
    return plan, CompactTorchOps.grad_weight(meta, gy.float(), x.float())


#: The canary plan of each gradient a fused family computes.
_CANARY_PLANS = {"dx": _canary_dx, "dW": _canary_dw}


def _canary(kind: str, name: str, kernel, device: str, bf16: bool = False) -> Tuple[bool, str]:
    """One NaN-prefilled launch on a problem of exactly one tile per axis, checked against torch_compact in
    fp32 on the same rounded operands."""
    point = adjoint_point(kind, name)
    k = NmGradKernel(kind, name, kernel, point.owner.tiles(point))
    plan, ref = _CANARY_PLANS[point.owner.gradient](k, point["walk"] == SEGMENTS, device,
                                                    torch.bfloat16 if bf16 else torch.float16)
    ok, why = nan_canary(plan.launch, plan.out)
    if not ok:
        return ok, why
    got = plan.finish()
    err = float((got.float() - ref).abs().max())
    if not err <= 2e-2 * max(1.0, float(ref.abs().max())):
        return False, f"launch ran but the canary result is wrong (max abs error {err:.3g})"
    return True, "ok"


def get_nm_grad_kernel(kind: str, name: str, device, bf16: bool = False) -> Optional[NmGradKernel]:
    """The built, canary-validated kernel of ``(kind, name)`` on ``device`` (its bf16 form where ``bf16``,
    validated apart); None when unlaunchable."""
    dev = str(device)
    tiles = _spec(kind, name)

    def build():
        try:
            kernel = build_fused_kernel(kind, name, bf16)
        except Exception as exc:
            return None, f"build failed: {type(exc).__name__}: {exc}"
        ok, why = _canary(kind, name, kernel, dev, bf16)
        return (NmGradKernel(kind, name, kernel, tiles) if ok else None), why

    return _VALIDATED.get(validated_key(kind, name, bf16), dev, build)


def warm_nm_grad_kernel(kind: str, name: str, device: str, bf16: bool = False):
    """Build, compile and canary one kernel (a top-level function for spawned warm-up processes)."""
    import time
    t0 = time.perf_counter()
    init_warp()
    k = get_nm_grad_kernel(kind, name, device, bf16)
    return k is not None, (_VALIDATED.why(validated_key(kind, name, bf16), device) or "ok"), time.perf_counter() - t0


def node_major(t: torch.Tensor, rows_pad: int, bx: int) -> torch.Tensor:
    """``[B, R, N]`` -> ``[N*rows_pad, Bx]`` (t's dtype) with ``out[n*rows_pad + r, b] = t[b, r, n]``, zero padded."""
    b, r, n = t.shape
    out = torch.empty(n, rows_pad, bx, dtype=t.dtype, device=t.device)
    return swap_axes_into(t, out).view(n * rows_pad, bx)  # pads are contracted: swap_axes_into zeroes them


def _weight_tap_major_t(weight: torch.Tensor, cin: int, op: int, cinp: int) -> torch.Tensor:
    """``wr[v*Op + o, c] = W[o, c*V + v]`` ``[V*Op, Cin_p]`` (the weight's dtype), zero padded."""
    cout, q = weight.shape
    v = q // cin
    wr = torch.empty(v, op, cinp, dtype=weight.dtype, device=weight.device)
    # wr[v, o, c] = W3[o, c, v]: the axes (c, v) of W3 [c, o, v] swapped around o
    return swap_axes_into(weight.view(cout, cin, v).permute(1, 0, 2), wr).view(v * op, cinp)


_ct = warp_ct
_launch = fast_launch

_SEG_FINISH_OK: dict = {}


#: How the fused adjoints sum their partials: ``"native"``, through :func:`seg_finish_tiled_kernel` where its check
#: passed on the device, or ``"warp"``, :func:`seg_finish_kernel` for segments and :func:`_dw_finish_kernel` /
#: PyTorch's sum for dW's splits: what a device whose check failed runs (the tests set it to compare the two; both
#: give the same bits).
FINISH = "native"


def _finish_mode() -> str:
    """:data:`FINISH`."""
    return FINISH


def seg_finish_ok(device: str) -> bool:
    """Whether :func:`seg_finish_tiled_kernel` sums correctly on ``device`` (checked once, NaN-prefilled outputs,
    odd extents and padded partials): segments bitwise equal to :func:`seg_finish_kernel` (empty lists included),
    splits bitwise equal to PyTorch's sums in split order. A failure warns once and the finishes there stay with
    :func:`seg_finish_kernel` and :func:`_dw_finish_kernel`."""

    def check() -> bool:
        g = torch.Generator().manual_seed(0)
        ok = True
        for n_lists, lists in ((45, 64), (45, 32), (20, 32)):          # both tile sizes, a partial last tile
            lens = torch.randint(0, 4, (n_lists,), generator=g)
            lens[3] = lens[-5] = 0                                     # empty lists: zeros
            segptr = torch.zeros(n_lists + 1, dtype=torch.int32)
            segptr[1:] = torch.cumsum(lens, 0)
            segd = segptr.to(device)
            part = torch.randn(max(1, int(segptr[-1])), 7, 70, generator=g).to(device)   # [nseg, I' = 7, J' = 70]
            shape = (5, 67, n_lists)
            outs = []
            for kernel, dims, extra in ((seg_finish_kernel(), shape, []),
                                        (seg_finish_tiled_kernel(lists), seg_finish_tiled_dims(shape, lists), [0])):
                out = torch.full(shape, float("nan"), device=device)
                _launch(kernel, dims, [_ct(segd), _ct(part), _ct(out)] + extra, SEG_FINISH_BLOCK, device,
                        tiled=False)
                outs.append(out)
            ok = ok and bool(torch.equal(outs[0], outs[1])) and not bool(torch.isnan(outs[1]).any())
            split = torch.randn(3, n_lists, 7, 70, generator=g).to(device)             # [S, G, I', J']
            want = ((split[0] + split[1]) + split[2])[:, :5, :67].permute(1, 2, 0)
            out = torch.full(shape, float("nan"), device=device)
            _launch(seg_finish_tiled_kernel(lists), seg_finish_tiled_dims(shape, lists),
                    [_ct(segd), _ct(split.view(3 * n_lists, 7, 70)), _ct(out), 3], SEG_FINISH_BLOCK, device,
                    tiled=False)
            ok = ok and bool(torch.equal(out, want))
        return ok

    return check_once(_SEG_FINISH_OK, device, check,
                      f"the tiled partial-sum finish does not run correctly on {device} ({{why}}); the fused adjoints' "
                      f"finishes there use the SIMT and Warp-tile kernels")


def _native_finish(device: str) -> bool:
    """Whether this call's finish runs :func:`seg_finish_tiled_kernel` (:func:`_finish_mode`, its check; under
    CUDA-graph capture before the check ran: no)."""
    if _finish_mode() != "native":
        return False
    ok = _SEG_FINISH_OK.get(device)
    if ok is None and not (device.startswith("cuda") and torch.cuda.is_current_stream_capturing()):
        ok = seg_finish_ok(device)
    return bool(ok)


_NO_SEGPTR: dict = {}


def _no_segptr(device: torch.device) -> torch.Tensor:
    """A one-element int32 tensor on ``device``: the ``segptr`` argument of a split finish, which never reads it."""
    got = _NO_SEGPTR.get(device)
    if got is None:
        got = _NO_SEGPTR[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return got


def _launch_seg_finish(segptr, part, out: torch.Tensor, device: str, nsplit: int = 0) -> None:
    """``out[i, j, g]`` = the fixed-order fp32 sum of list g's partials: ``part[s, i, j]`` for s in
    ``segptr[g]..segptr[g+1]`` (segments), or with ``nsplit`` > 0 ``part[s*G + g, i, j]`` for s < nsplit (splits;
    only where :func:`_native_finish`). ``segptr`` / ``part``: Warp descriptors (:func:`warp_ct`)."""
    if nsplit or _native_finish(device):
        lists = seg_finish_lists(out.shape)
        _launch(seg_finish_tiled_kernel(lists), seg_finish_tiled_dims(out.shape, lists),
                [segptr, part, _ct(out), int(nsplit)], SEG_FINISH_BLOCK, device, tiled=False)
    else:
        _launch(seg_finish_kernel(), tuple(out.shape), [segptr, part, _ct(out)], 256, device, tiled=False)


# dx outputs up to the forward's direct-store size (DIRECT_STORE_MAX_BYTES) are stored straight into dx
# (strided); larger ones through a contiguous buffer and one transposing copy.


class _GradInputNmPlan:
    """Operands and launches of one fused dx call; ``launch()`` then ``finish()`` -> dx.

    ``k`` (kind ``dxn``): one CTA per (input node, batch tile, Cin tile) walks the node's whole reverse
    list and stores into dx. ``seg`` (kind ``dxs``) with ``seg_steps`` = L: one CTA per (segment of at most
    L steps, batch tile, Cin tile) into fp32 partials ``out [nseg, B, Cin]``, then the finish
    (:func:`_launch_seg_finish`) sums each node's segments into dx; both launches are in ``launch()``."""

    def __init__(self, meta, grad_y, weight, k: Optional[NmGradKernel], device: str, store: Optional[str] = None,
                 gn: Optional[torch.Tensor] = None, seg: Optional[NmGradKernel] = None,
                 seg_steps: Optional[int] = None):
        kk = seg if seg is not None else k
        tm, tn, tk, bd = kk.tiles
        b = grad_y.shape[0]
        self.k, self.device, self.block_dim = kk, device, bd
        self.op = op = pad_to(meta.cout, tk)
        bx = pad_to(b, 8)
        self.gn = gn if gn is not None else node_major(grad_y, op, bx)
        self.wr = _weight_tap_major_t(weight, meta.cin, op, pad_to(meta.cin, 8))
        rowptr, rn, rv = reverse_lists(meta)
        n_oc = op // tk
        self.seg_steps = None
        if seg is not None:
            self.seg_steps = int(seg_steps)
            bounds, segptr, self.longest = _segments(meta, "dx", rowptr, n_oc, self.seg_steps,
                                                     partial_bytes=4 * b * meta.cin)
            nseg = bounds.numel() - 1
            self.dx = torch.empty(b, meta.cin, meta.nin, dtype=torch.float32, device=grad_y.device)
            self.out = torch.empty(max(1, nseg), b, meta.cin, dtype=torch.float32, device=grad_y.device)
            self.direct = True
            self._keep = (rowptr, rn, rv, bounds, segptr)
            self.dims = (nseg, -(-b // tm), -(-meta.cin // tn))
            self.inputs = [_ct(self.gn), _ct(self.wr), _ct(bounds), _ct(rn), _ct(rv), _ct(self.out), n_oc, op]
            self.fin_inputs = [_ct(segptr), _ct(self.out)]
            return
        self._keep = (rowptr, rn, rv)
        nbytes = 4 * b * meta.cin * meta.nin
        store = store or ("direct" if nbytes <= DIRECT_STORE_MAX_BYTES else "staged")
        # (no closures over self here: a plan -> lambda -> plan cycle would keep every buffer of the call
        # alive until the cyclic garbage collector runs)
        self.direct = store == "direct"
        if self.direct:
            self.dx = torch.empty(b, meta.cin, meta.nin, dtype=torch.float32, device=grad_y.device)
            self.out = self.dx.permute(2, 0, 1)
        else:
            self.out = torch.empty(meta.nin, b, meta.cin, dtype=torch.float32, device=grad_y.device)
        self.dims = (meta.nin, -(-b // tm), -(-meta.cin // tn))
        self.inputs = [_ct(self.gn), _ct(self.wr), _ct(rowptr), _ct(rn), _ct(rv),
                       _ct(self.out), n_oc, op]

    def launch(self) -> None:
        if self.dims[0]:
            _launch(self.k.kernel, self.dims, self.inputs, self.block_dim, self.device)
        if self.seg_steps is not None:
            _launch_seg_finish(*self.fin_inputs, self.dx, self.device)

    def finish(self) -> torch.Tensor:
        if self.direct:
            return self.dx
        n, b, c = self.out.shape                       # out [Nin, B, Cin] -> dx [B, Cin, Nin]
        dx = torch.empty(b, c, n, dtype=self.out.dtype, device=self.out.device)
        swap_axes_into(self.out, dx.permute(1, 0, 2))
        return dx

    def run(self) -> torch.Tensor:
        self.launch()
        return self.finish()


class _GradWeightNmPlan:
    """Operands and launches of one fused dW call; ``launch()`` then ``finish()`` -> dW.

    ``k`` (kind ``dwn``): one CTA per (tap, split s of ``nsplit``, tile) walks every ``nsplit``-th entry
    of the tap's list into partials ``out [S, V, Op, Cp]``. ``seg`` (kind ``dws``) with ``seg_steps`` = L:
    one CTA per (segment of at most L steps, tile) into ``out [nseg, Op, Cp]``; ``finish()`` sums each
    tap's segments into dW with one SIMT launch."""

    def __init__(self, meta, grad_y, x, k: Optional[NmGradKernel], device: str, nsplit: Optional[int] = None,
                 gn: Optional[torch.Tensor] = None, xn: Optional[torch.Tensor] = None,
                 seg: Optional[NmGradKernel] = None, seg_steps: Optional[int] = None):
        kk = seg if seg is not None else k
        to, tc, tkb, bd = kk.tiles
        b = grad_y.shape[0]
        self.meta, self.k, self.device, self.block_dim = meta, kk, device, bd
        self.op = op = pad_to(meta.cout, to)
        self.cp = cp = pad_to(meta.cin, tc)
        bx = pad_to(b, 8)
        self.gn = gn if gn is not None else node_major(grad_y, op, bx)
        self.xn = xn if xn is not None else node_major(x, cp, bx)
        vrowptr, vn, vm, maxlen = tap_lists(meta)
        n_ct = cp // tc
        n_tiles = (op // to) * n_ct
        n_bc = -(-bx // tkb)
        self.seg_steps = None
        if seg is not None:
            self.seg_steps = int(seg_steps)
            bounds, segptr, self.longest = _segments(meta, "dw", vrowptr, n_bc, self.seg_steps,
                                                     partial_bytes=4 * op * cp)
            nseg = bounds.numel() - 1
            self.nsplit = nseg                     # partials written (reported by the benchmark)
            self._keep = (vrowptr, vn, vm, bounds, segptr)
            self.out = torch.empty(max(1, nseg), op, cp, dtype=torch.float32, device=grad_y.device)
            self.dims = (nseg, n_tiles)
            self.inputs = [_ct(self.gn), _ct(self.xn), _ct(bounds), _ct(vn), _ct(vm), _ct(self.out),
                           n_bc, op, cp, n_ct]
            self._segptr = segptr
            return
        self._keep = (vrowptr, vn, vm)
        self.nsplit = s = int(nsplit) if nsplit is not None else default_dw_nsplit(meta, b, kk.tiles, device)
        # contiguous [S, V, Op, Cp] partials: coalesced tile stores. (Storing straight into dW's own
        # [Cout, Cin, V] order through a strided view saves the finishing copy but makes the stores
        # V-strided, and dW slower on the wide resnet layers on the H200: the strided-dW graphed steps of
        # 2026-11-29 in fovi_lab/records/h200/train_step.jsonl.gz.)
        self.out = torch.empty(s, meta.v, op, cp, dtype=torch.float32, device=grad_y.device)
        self.dims = (meta.v, s, n_tiles)
        self.inputs = [_ct(self.gn), _ct(self.xn), _ct(vrowptr), _ct(vn), _ct(vm), _ct(self.out),
                       n_bc, op, cp, s, n_ct]

    def launch(self) -> None:
        if self.dims[0]:
            _launch(self.k.kernel, self.dims, self.inputs, self.block_dim, self.device)

    def finish(self) -> torch.Tensor:
        """``dW[o, c*V + v]`` = the fixed-order sum of tap v's partials (fp32).

        Segments: one launch (:func:`_launch_seg_finish`: the tiled finish, or the SIMT one). Splits: the tiled
        finish too where :func:`_native_finish` (one launch at every dW size). Otherwise dW of
        ``_FINISH_TILED_MIN_BYTES`` or more (alexnet L1-L4, res18 layer3/4_0): one tiled launch straight
        into dW's layout (:func:`_dw_finish_kernel`), no ``[V, Op, Cp]`` temporary. On the H200
        (fovi_lab/records/h200/train_step.jsonl.gz, the tiled dW finish of 2026-11-29) that cut
        the alexnet steps' peak memory at the same GPU time. Smaller dW: PyTorch adds the partials split by
        split, then one transposing copy (the tile kernel was slower there, res18 layer1/2/2_0 with 8-16
        partials, and the temporary is only 0.6-4.7 MB). Every path adds each element's partials in split order,
        so all of them give the same bits."""
        m = self.meta
        if self.seg_steps is not None:
            dw = torch.empty(m.cout, m.cin, m.v, dtype=torch.float32, device=self.out.device)
            _launch_seg_finish(_ct(self._segptr), _ct(self.out), dw, self.device)
            return dw.view(m.cout, m.q)
        if _native_finish(self.device):
            dw = torch.empty(m.cout, m.cin, m.v, dtype=torch.float32, device=self.out.device)
            parts = self.out.view(self.nsplit * m.v, *self.out.shape[2:])        # [S*V, Op, Cp]
            _launch_seg_finish(_ct(_no_segptr(self.out.device)), _ct(parts), dw, self.device, nsplit=self.nsplit)
            return dw.view(m.cout, m.q)
        if 4 * m.cout * m.q < _FINISH_TILED_MIN_BYTES:
            part = self.out[0]                                              # [V, Op, Cp]
            if self.nsplit > 1:                 # split by split, as the tiled finishes sum (bitwise theirs)
                part = part.clone()
                for s in range(1, self.nsplit):
                    part.add_(self.out[s])
            return part[:, :m.cout, :m.cin].permute(1, 2, 0).reshape(m.cout, m.q).contiguous()
        dw = torch.empty(m.cout, m.cin, m.v, dtype=torch.float32, device=self.out.device)
        part = self.out.view(self.nsplit, m.v, -1)                              # [S, V, Op*Cp]
        _launch(_dw_finish_kernel(), (m.cout, -(-m.v // _FIN_TV), -(-m.cin // _FIN_TC)),
                [_ct(part), _ct(dw), self.nsplit, self.cp], _FIN_BLOCK, self.device)
        return dw.view(m.cout, m.q)

    def run(self) -> torch.Tensor:
        self.launch()
        return self.finish()


#: dW size (fp32 bytes) from which the fused dW finishes with :func:`_dw_finish_kernel` (see
#: ``_GradWeightNmPlan.finish``)
_FINISH_TILED_MIN_BYTES = 8 << 20
# tile of the dW finish: 32 taps x 32 input channels (one 128-byte row of the partials per tap)
_FIN_TV, _FIN_TC, _FIN_BLOCK = 32, 32, 64


@built_once
def _dw_finish_kernel():
    """Tile kernel ``dw[o, c, v] = sum_{s < S} part[s, v, o*Cp + c]`` (fp32, split order) over a
    ``(Cout, ceil(V/32), ceil(Cin/32))`` grid: each CTA loads 32x32 ``(v, c)`` tiles of the partials
    (rows of c, coalesced), sums them, transposes in shared memory and stores ``(c, v)`` rows of dW
    (coalesced). Columns past Cin (channel padding, or the next o's run) land outside ``dw[o]`` and are
    dropped by the bounds-checked store."""
    TV, TC = _FIN_TV, _FIN_TC

    @wp.kernel(enable_backward=False, module="unique")
    def fovi_dw_finish(part: wp.array3d(dtype=wp.float32), dw: wp.array3d(dtype=wp.float32), nsplit: int,
                       cp: int):
        o, vt, ct = wp.tid()
        v0 = vt * TV
        c0 = o * cp + ct * TC
        acc = wp.tile_load(part[0], shape=(TV, TC), offset=(v0, c0), storage="shared")
        for s in range(1, nsplit):
            acc = wp.tile_map(wp.add, acc, wp.tile_load(part[s], shape=(TV, TC), offset=(v0, c0),
                                                        storage="shared"))
        wp.tile_store(dw[o], wp.tile_transpose(acc), offset=(ct * TC, v0))
    return fovi_dw_finish

def _check(meta, grad_y, weight=NOT_GIVEN, x=NOT_GIVEN):
    # shapes against the layer; the reverse lists must agree with the tables (the kernels read only them)
    validate_meta(meta)
    check_tensor("grad_y", grad_y)                          # the dtype first: the kernels are fp16 or bf16
    if grad_y.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"grad_y: expected dtype torch.float16 or torch.bfloat16, got {grad_y.dtype}")
    check_grad_args(meta, grad_y, weight=weight, x=x)
    check_tensor("grad_y", grad_y, dtype=grad_y.dtype, dim=3, shape=(None, meta.cout, meta.nout))
    if grad_y.shape[0] < 1:
        raise ValueError("grad_y: batch must be >= 1")


def _kernel(kind: str, config: Optional[str], default: str, device: str, bf16: bool = False) -> Optional[NmGradKernel]:
    if config is None:
        return get_nm_grad_kernel(kind, default, device, bf16)
    if not isinstance(config, str):
        raise TypeError(f"config: expected a config name (str) or None, got {type(config).__name__}")
    k = get_nm_grad_kernel(kind, config, device, bf16)
    if k is None:
        why = _VALIDATED.why(validated_key(kind, config, bf16), device)
        raise RuntimeError(f"config: Warp {kind} kernel {config!r} is not launchable on {device}: {why}")
    return k


def _seg_request(arg) -> Optional[object]:
    """A ``seg_steps`` argument: None/"auto" -> the default rule, 0/"off" -> whole lists, an int >= 1 -> segments
    of that many steps."""
    v = arg
    if v in ("auto", None):
        return "auto"
    if v in ("off", 0, "0"):
        return 0
    try:
        n = int(v)
    except (TypeError, ValueError):
        n = -1
    if n < 1 or isinstance(v, bool):
        raise ValueError(f"seg_steps: expected None, 'auto', 0/'off' or an int >= 1, got {v!r}")
    return n


def plan_grad_input_nm(meta, grad_y, weight, config=None, *, store=None, gn=None, seg_steps=None, pick=None):
    """The prepared fused dx call, or None when the (default) kernel cannot launch here.

    ``seg_steps``: None (the default rule :func:`default_dx_seg_steps`), 0 for
    whole reverse lists, or the segment length in steps (kernel ``dxs``). ``pick``: the call's
    :class:`~fovi_lab.kernels.adjoint.rule.FusedPick` (the tiles and segments the adjoint plan decided; a pick
    whose kernel cannot launch here gives None, as the rule's would)."""
    if config is not None and not isinstance(config, str):
        raise TypeError(f"config: expected a config name (str) or None, got {type(config).__name__}")
    _check(meta, grad_y, weight=weight)
    check_tensor("weight", weight, dtype=grad_y.dtype, dim=2, shape=(meta.cout, meta.q), device=grad_y.device,
                 contiguous=True)
    device = warp_device(grad_y)
    bf16 = grad_y.dtype == torch.bfloat16
    meta = meta.to(grad_y.device)
    if pick is not None and config is None:
        return _plan_dx(meta, grad_y, weight, None, pick.config, pick.seg_steps, device, bf16, store, gn)
    req = _seg_request(seg_steps)
    if req == "auto":
        req = default_dx_seg_steps(meta, grad_y.shape[0], device)
    name = config if config is not None else select_dx_nm_config(grad_y.shape[0], meta.cin, meta.nin,
                                                                 segments=bool(req))
    return _plan_dx(meta, grad_y, weight, config, name, req, device, bf16, store, gn)


def _plan_dx(meta, grad_y, weight, config, name, req, device, bf16, store, gn):
    """The fused dx plan of kernel tiles ``name`` with ``req`` segment steps (0: whole lists), or None."""
    if req:
        k = _kernel("dxs", config, name, device, bf16)
        return None if k is None else _GradInputNmPlan(meta, grad_y, weight, None, device, gn=gn, seg=k,
                                                       seg_steps=req)
    k = _kernel("dxn", config, name, device, bf16)
    return None if k is None else _GradInputNmPlan(meta, grad_y, weight, k, device, store=store, gn=gn)


def plan_grad_weight_nm(meta, grad_y, x, config=None, *, nsplit=None, gn=None, xn=None, seg_steps=None, pick=None):
    """The prepared fused dW call, or None when the (default) kernel cannot launch here.

    ``nsplit`` (an int) asks for the interleaved splits (kernel ``dwn``); otherwise ``seg_steps``: None
    (:func:`default_dw_seg_steps`), 0 for the interleaved splits, or the segment
    length in steps (kernel ``dws``). ``pick``: the call's :class:`~fovi_lab.kernels.adjoint.rule.FusedPick`
    (tiles, segments and splits decided by the adjoint plan)."""
    if config is not None and not isinstance(config, str):
        raise TypeError(f"config: expected a config name (str) or None, got {type(config).__name__}")
    _check(meta, grad_y, x=x)
    check_tensor("x", x, dtype=grad_y.dtype, dim=3, shape=(grad_y.shape[0], meta.cin, meta.nin),
                 device=grad_y.device)
    if nsplit is not None and (not isinstance(nsplit, int) or nsplit < 1):
        raise ValueError(f"nsplit: expected a positive int or None, got {nsplit!r}")
    device = warp_device(grad_y)
    bf16 = grad_y.dtype == torch.bfloat16
    meta = meta.to(grad_y.device)
    if pick is not None and config is None and nsplit is None:
        name, req = pick.config, pick.seg_steps
        nsplit = None if req else pick.nsplit
    else:
        name = config if config is not None else select_dw_nm_config(meta.cout, meta.cin, grad_y.shape[0])
        req = 0 if nsplit is not None else _seg_request(seg_steps)
        if req == "auto":
            req = default_dw_seg_steps(meta, grad_y.shape[0], _spec("dwn", name), device)
    if req:
        k = _kernel("dws", config, name, device, bf16)
        return None if k is None else _GradWeightNmPlan(meta, grad_y, x, None, device, gn=gn, xn=xn, seg=k,
                                                        seg_steps=req)
    k = _kernel("dwn", config, name, device, bf16)
    return None if k is None else _GradWeightNmPlan(meta, grad_y, x, k, device, nsplit=nsplit, gn=gn, xn=xn)


def grad_input_nm(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor, config: Optional[str] = None, *,
                  store: Optional[str] = None, seg_steps=None, pick=None) -> Optional[torch.Tensor]:
    """``dx [B, Cin, Nin]`` fp32 by the fused node-major kernel (one launch, no stage); None when the
    default kernel cannot launch on this device (an explicit ``config`` that cannot raises). ``pick``: as
    :func:`plan_grad_input_nm`."""
    plan = plan_grad_input_nm(meta, grad_y, weight, config, store=store, seg_steps=seg_steps, pick=pick)
    return None if plan is None else plan.run()


def grad_weight_nm(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor, config: Optional[str] = None, *,
                   nsplit: Optional[int] = None, seg_steps=None, pick=None) -> Optional[torch.Tensor]:
    """``dW [Cout, Q]`` fp32 by the fused per-tap kernel (one launch + a fixed-order sum of ``nsplit``
    partials); None when the default kernel cannot launch on this device. ``pick``: as
    :func:`plan_grad_weight_nm`."""
    plan = plan_grad_weight_nm(meta, grad_y, x, config, nsplit=nsplit, seg_steps=seg_steps, pick=pick)
    return None if plan is None else plan.run()
