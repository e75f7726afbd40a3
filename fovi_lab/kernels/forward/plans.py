"""Plans: the operand layouts of one forward call, its launch, and the output's finish.

A :class:`Plan` holds a prepared launch (``plan.launch()`` writes the kernel's output) and ``plan.finish()``
(returns ``y [B, Cout, Nout]``): kept apart so a benchmark can time the kernel alone and the whole op.
Outputs go straight into ``y`` (``store="direct"``, up to ``DIRECT_STORE_MAX_BYTES``) or through a
contiguous buffer and one permute-copy (``store="staged"``). Here: the cached bias and weight layouts, the plan of
each family's dataflow and the runners memoised per call signature; :mod:`fovi_lab.kernels.forward.launch` holds
the plan object and its recorded launches, :mod:`fovi_lab.kernels.forward.splits` the split sizes and i2c chunks.
"""

from __future__ import annotations

import threading
from typing import Dict, Optional, Tuple

import torch

from fovi_lab.graph.meta import pad_to
from fovi_lab.kernels.common import (as_rows64, built_once, capturing, fast_launch, warp_ct_vec, gather_rows_kernel,
                                     gather_rows_pair_kernel, to_warp, warp_ct, warp_device, warp_stream, wp)
from fovi_lab.kernels.families.registry import family, family_or_none
from fovi_lab.kernels.forward.configs import FwdConfig, _GATHER_TILE_K
from fovi_lab.kernels.forward.launch import (DIRECT_STORE_MAX_BYTES, _launcher, _output, _relaunch,  # noqa: F401
                                             Plan, store_mode)
from fovi_lab.kernels.forward.simt import simtv_prep_kernel
from fovi_lab.kernels.forward.splits import (_i2c_stage_bytes, _i2c_static, _MMAS_MIN_STEPS,  # noqa: F401
                                             _nms_split, _SIMTS_MIN_STEPS, MMAPS_CTAS, MMAS_WARPS, mmas_split,
                                             pipe_split, simts_split)
from fovi_lab.kernels.layout import swap_axes_into, transpose, transpose_into
from fovi_lab.kernels.forward.checks import device_str
from fovi_lab.kernels.tables import TableInfo, analyse_tables


_BIAS_CACHE: Dict[Tuple, Tuple] = {}


def bias_operand(bias: Optional[torch.Tensor], cout: int, tile_n: int, device) -> torch.Tensor:
    """(tensor, Warp view) of :func:`pad_bias_to_tiles`, cached per (bias object, ``_version``, width,
    device): saves two small launches per call (most calls reuse the layer's bias, or have none)."""
    import weakref
    n = -(-cout // tile_n) * tile_n
    key = (id(bias) if bias is not None else None, n, device)
    hit = _BIAS_CACHE.get(key)
    if bias is not None and capturing(bias):     # a CUDA graph must copy the bias it will see on replay
        out = pad_bias_to_tiles(bias, cout, tile_n, device=device)
        return out, warp_ct(out)
    if hit is not None and (bias is None or (hit[0]() is bias and hit[1] == bias._version)):
        return hit[2], hit[3]
    out = pad_bias_to_tiles(bias, cout, tile_n, device=device)
    if len(_BIAS_CACHE) > 256:
        _BIAS_CACHE.clear()

    def _drop(_ref, key=key, cache=_BIAS_CACHE):    # a temporary bias (e.g. autocast's cast copy) frees its entry
        if key in cache and cache[key][0] is _ref:
            del cache[key]
    ref = weakref.ref(bias, _drop) if bias is not None else None
    _BIAS_CACHE[key] = (ref, None if bias is None else bias._version, out, warp_ct(out))
    return out, _BIAS_CACHE[key][3]


def pad_bias_to_tiles(bias: Optional[torch.Tensor], cout: int, tile_n: int, device=None) -> torch.Tensor:
    """fp32 bias zero-padded to a multiple of ``tile_n`` (zeros when ``bias`` is None).

    Warp >= 1.18 bounds-checks tile loads, but a full-width bias buffer keeps every tail tile load
    in bounds whatever the Warp version (the seed's tile-overread doctrine) and costs nothing.
    """
    if bias is not None and tuple(bias.shape) != (cout,):
        raise ValueError(f"bias: expected shape ({cout},) (Cout), got {tuple(bias.shape)}")
    n = pad_to(cout, tile_n)
    dev = bias.device if bias is not None else device
    out = torch.zeros(n, dtype=torch.float32, device=dev)
    if bias is not None:
        out[:cout] = bias.to(torch.float32)
    return out


def plan_uncached(cfg: FwdConfig, kernel, x, weight, bias, il, wl, store: str,
                   info: Optional[TableInfo] = None, dev: Optional[str] = None, memo: Optional[dict] = None,
                   out_dtype=None) -> Plan:
    dev = dev or warp_device(x)
    b, cin, nin = x.shape
    cout, q = weight.shape
    nout, p64 = il.shape
    flow = family(cfg.variant).dataflow(cfg)          # which plan below: the family says
    if flow == "in_place":
        # x read and y written in place ([B, Cin*Nin] and [B, Cout, Nout]; ``store`` does not apply)
        if info is None:
            info = analyse_tables(il, wl, cin, nin, q)
        runner = _SimtRunner(cfg, kernel, dev, info, b, cin, nin, cout, nout, il, wl)
        if memo is not None:
            memo["runner"] = runner
        return runner(x, weight, bias, out_dtype)       # (resolve_uncached allows out_dtype on split configs only)
    out, finish = _output(b, cout, nout, x.device, store)
    bias_p, bias_w = bias_operand(bias, cout, cfg.tile_n, x.device)
    dims = (nout, -(-b // cfg.rows_per_cta), -(-cout // cfg.tile_n))
    if info is None:
        info = analyse_tables(il, wl, cin, nin, q)
    if flow == "gather":
        xt = transpose(x.reshape(b, cin * nin))                # [Cin*Nin, B]: batch rows contiguous
        wt, wt_w = _weight_operand(weight, "t", 0, 0)           # [Q, Cout]
        inputs = [warp_ct(xt), wt_w, info.wa(il), info.wa(wl), bias_w, warp_ct(out),
                  p64 // _GATHER_TILE_K, b]
        keep = (xt, wt, il, wl, bias_p)
    elif flow in ("node_major", "node_major_lists"):
        if info.nm is None:
            raise ValueError(f"config: {cfg.name!r} (node-major) needs index tables built as in docs/operator.md §2.1 "
                             f"(input_linear[n, c*K+k] = c*Nin + idx[n,k]); these are not")
        cp = pad_to(cin, cfg.tile_k)
        if flow == "node_major":
            runner = _NmRunner(cfg, kernel, dims, dev, info, b, cin, nin, cout, nout, store)
            if memo is not None:
                memo["runner"] = runner
            return runner(x, weight, bias, out, finish, bias_p, bias_w)
        else:
            idxc, rfc, cnt = info.compact()
            # unchecked loads: every tile must lie inside the operands
            bx, coutp = pad_to(b, cfg.tile_m), pad_to(cout, cfg.tile_n)
            xn = _node_major_x(x, cp, bx)
            wv, wv_w = _weight_operand(weight, "v", cin, cp, coutp)
            inputs = [warp_ct(xn), wv_w, info.wa(idxc), info.wa(rfc), info.wa(cnt), bias_w,
                      warp_ct(out), cp // cfg.tile_k, cp]
            keep = (xn, wv, idxc, rfc, cnt, bias_p)
    elif flow == "im2col":
        return _plan_i2c(cfg, kernel, x, weight, il, wl, out, finish, bias_p, bias_w, dev, info, memo)
    elif flow == "vec4":
        bx, coutp = pad_to(b, cfg.tile_m), pad_to(cout, cfg.tile_n)
        rows = cin * nin
        xp = torch.empty(rows + 1, bx, dtype=torch.float32, device=x.device)      # [Cin*Nin + 1, Bx]
        wpm = torch.empty(q, coutp, dtype=torch.float32, device=x.device)         # permuted W^T
        x2 = x.reshape(b, rows)
        n_x, n_og = (rows + 1) * (bx // 4), coutp // cfg.tile_n
        prep_args = [warp_ct(x2), warp_ct(weight), warp_ct_vec(xp), warp_ct(wpm), n_x, cfg.tile_n, n_og]
        inputs = [warp_ct_vec(xp), warp_ct_vec(wpm), info.wa(il), info.wa(wl), bias_w, warp_ct(out),
                  pad_to(info.p_used, cfg.tile_k), n_og]
        main = _launcher(kernel, dims, inputs, cfg.block_dim, dev, tiled=False)

        def launch():
            fast_launch(simtv_prep_kernel(), (n_x + q * coutp,), prep_args, 256, dev, tiled=False)
            main()
        plan = Plan(launch, out, finish)
        plan._keep = (x2, weight, xp, wpm, il, wl, bias_p)
        return plan
    else:
        raise ValueError(f"config: {cfg.name!r} is not an uncached config")
    launch = _launcher(kernel, dims, inputs, cfg.block_dim, dev)
    plan = Plan(launch, out, finish)
    plan._keep = keep  # operands must outlive the launch
    return plan


class _SimtRunner:
    """The SIMT forward of one call signature (families ``simt`` / ``simtp`` / ``simtw`` and the split
    ``simts`` / ``simtsw``), memoised with it (:data:`_CALLS`), like :class:`_NmRunner`.

    Why: these kernels read x and write y in place, so a call's device work is one or two launches, and at
    B <= 16 its eager time is mostly host time (on the H200 machine such an op's eager call took longer than its
    GPU work: the SIMT rows of fovi_lab/records/h200/forward.jsonl.gz, per call and replayed). Everything a call
    derives from shapes and tables (grid, loop length, split, table descriptors) is fixed here, and the runner
    owns its recorded launches, so a call only allocates y (and the split's partials), looks up the cached W
    layout and bias, re-points the launches' array parameters at this call's tensors and launches."""

    def __init__(self, cfg: FwdConfig, kernel, dev: str, info: TableInfo, b: int, cin: int, nin: int, cout: int,
                 nout: int, il: torch.Tensor, wl: torch.Tensor):
        tb, to, u = cfg.tile_m, cfg.tile_n, cfg.tile_k
        self.kernel, self.dev, self.block_dim = kernel, dev, cfg.block_dim
        self.b, self.rows, self.cout, self.nout, self.to = b, cin * nin, cout, nout, to
        self.coutp = pad_to(cout, to)
        fam = family(cfg.variant)
        v = fam.variant_values(cfg)
        self.wkind = "pv" if v.get("w_vectors") else "tp"
        n_og, nbg = self.coutp // to, -(-b // tb)
        p_len = pad_to(info.p_used, u)
        self.xt = self.wnat = False
        if fam.unit == "warp":
            # a warp per (node, batch block, channel block): the last grid dimension is (channel block, lane);
            # the vectorised index loads need 8-byte aligned table rows
            self.wnat, self.xt = v["w_layout"] == "in place", v["x_layout"] == "transposed"
            self.bx = pad_to(b, tb)
            if il.data_ptr() % 16 or wl.data_ptr() % 16:
                il, wl = il.clone(), wl.clone()
                info = TableInfo(nm=info.nm, nin=info.nin, p_used=info.p_used)
            lanes, units = 32, nout * nbg * n_og
        elif fam.unit == "block":
            # a CTA per (node, batch block, channel block): the last grid dimension is (channel block, thread);
            # x^T [Cin*Nin, Bx] per call, W^T [Q, Cout_p] zero padded (cached per weight version)
            self.xt, self.bx = True, pad_to(b, tb)
            lanes, units = cfg.block_dim, nout * nbg * n_og
        else:
            lanes, units = 1, nout * nbg * n_og
        self.tables = (il, wl)                       # kept alive with their descriptors
        self.split = 0
        if v["split"]:
            if fam.unit == "block":
                self.split, per = pipe_split(units, p_len // u)
            elif fam.unit == "warp":
                self.split, per = mmas_split(units, p_len // u)
            else:
                self.split, per = simts_split(units, p_len // u, (tb, to))
            self.dims = (self.split * nout, nbg, n_og * lanes)
            self.tail = [p_len, per * u, n_og, nout]
        elif v.get("store") == "shared tile":       # a block = block_dim/32 consecutive nodes of one (bg, og)
            self.dims = (nbg, n_og, pad_to(nout, cfg.block_dim // 32) * 32)
            self.tail = [p_len, n_og]
        else:
            self.dims = (nout, nbg, n_og * lanes)
            self.tail = [p_len, n_og]
        self.il_c, self.wl_c = info.wa(il), info.wa(wl)
        self._lock = threading.Lock()
        self._main = None
        self._red = {}              # the recorded reduce launch per output dtype (fp32: True)

    def __call__(self, x, weight, bias, out_dtype=None) -> Plan:
        """``out_dtype`` torch.float32 (the split families only): y in fp32, straight from the fp32 partials'
        fixed-order sum (the tensor-core dx of :mod:`fovi_lab.kernels.adjoint.as_forward`); default x's dtype."""
        x2 = x.reshape(self.b, self.rows)
        if x2.stride(1) != 1:                        # rows are read with unit stride
            x2 = x2.contiguous()
        if self.xt:                                  # x^T [Cin*Nin, Bx] (tail columns never stored)
            x2 = transpose_into(x2, torch.empty(self.rows, self.bx, dtype=x.dtype, device=x.device))
        if out_dtype not in (None, x.dtype) and not (out_dtype == torch.float32 and self.split):
            raise ValueError(f"out_dtype: {out_dtype} output needs a split tensor-core config (mmas / mmasw)")
        y = torch.empty(self.b, self.cout, self.nout, dtype=out_dtype or x.dtype, device=x.device)
        if self.wnat:                                # W read in place
            wop = weight if weight.stride(1) == 1 else weight.contiguous()
            w_c = warp_ct(wop)
        else:
            wop, w_c = _weight_operand(weight, self.wkind, 0, self.to, self.coutp)
        bias_p, bias_c = bias_operand(bias, self.cout, self.to, x.device)
        if self.split:
            part = torch.empty(self.split * self.nout, self.b, self.cout, dtype=torch.float32, device=x.device)
            part_c = warp_ct(part)
            main_args = [warp_ct(x2), w_c, self.il_c, self.wl_c, part_c] + self.tail
            red_args = [part_c, bias_c, warp_ct(y.permute(2, 0, 1)), self.split, self.nout]
            keep = (x2, wop, bias_p, part)
        else:
            main_args = [warp_ct(x2), w_c, self.il_c, self.wl_c, bias_c, warp_ct(y)] + self.tail
            red_args = None
            keep = (x2, wop, bias_p)
        f32 = y.dtype == torch.float32
        plan = Plan(lambda: self._launch(main_args, red_args, f32), y, lambda: y)
        plan._keep = keep + self.tables
        plan.split = self.split or None
        return plan

    def _launch(self, main_args, red_args, f32: bool = False) -> None:
        stream = warp_stream(self.dev)
        with self._lock:
            self._main = _relaunch(self._main, self.kernel, self.dims, main_args, self.block_dim, self.dev, False,
                                   stream)
            if red_args is not None:
                red = (nms_reduce_f32_kernel() if f32 else nms_reduce_bf16_kernel()
                       if getattr(self.kernel, "fovi_dtype", "") == "bfloat16" else nms_reduce_kernel())
                self._red[f32] = _relaunch(self._red.get(f32), red, (self.nout, self.b, self.cout), red_args, 256,
                                           self.dev, False, stream)


class _NmRunner:
    """The node-major (``nm`` / ``nms``) forward of one call signature, memoised with it (:data:`_CALLS`):
    what the launch needs from shapes and tables alone is fixed here, so a call does only its per-value
    work (the node-major copy of x, the weight layout lookup, the output, the descriptors, the launches).

    ``nms``: the kernel writes ``S`` fp32 partials ``[S*Nout, B, Cout]``, then one SIMT launch
    (:func:`nms_reduce_kernel`) sums them in a fixed order, adds the bias in fp32 and rounds once into
    ``out``."""

    def __init__(self, cfg: FwdConfig, kernel, dims, dev: str, info: TableInfo, b: int, cin: int, nin: int,
                 cout: int, nout: int, store: str):
        idxn, rfn, k = info.nm
        self.kernel, self.block_dim, self.dev, self.store = kernel, cfg.block_dim, dev, store
        self.b, self.cin, self.cout, self.nout, self.tile_n = b, cin, cout, nout, cfg.tile_n
        # channel runs padded to the K step; 16-byte batch and Cout rows for vectorised loads
        self.cp, self.bx, self.coutp = pad_to(cin, cfg.tile_k), pad_to(b, 8), pad_to(cout, 8)
        self.tables = (idxn, rfn)
        self.split = _nms_split(dims, k) if family(cfg.variant).variant_values(cfg)["split"] else 0
        self.dims = (self.split * nout, dims[1], dims[2]) if self.split else dims
        self.consts = (info.wa(idxn), info.wa(rfn), k, self.cp // cfg.tile_k, self.cp, nin, b)

    def __call__(self, x, weight, bias, out=None, finish=None, bias_p=None, bias_w=None) -> Plan:
        xn = _node_major_x(x, self.cp, self.bx)                                    # [Nin*Cp, Bx]
        wv, wv_w = _weight_operand(weight, "v", self.cin, self.cp, self.coutp)     # [V*Cp, Cout_p]
        if bias_w is None:
            bias_p, bias_w = bias_operand(bias, self.cout, self.tile_n, x.device)
        if out is None:
            out, finish = _output(self.b, self.cout, self.nout, x.device, self.store)
        t0, t1, k, ksteps, cp, nin, b = self.consts
        if not self.split:
            inputs = [warp_ct(xn), wv_w, t0, t1, bias_w, warp_ct(out), k, ksteps, cp, nin, b]
            plan = Plan(_launcher(self.kernel, self.dims, inputs, self.block_dim, self.dev), out, finish)
            plan._keep = (xn, wv, bias_p) + self.tables  # operands must outlive the launch
            return plan
        s, nout, cout, dev = self.split, self.nout, self.cout, self.dev
        part = torch.empty(s * nout, b, cout, dtype=torch.float32, device=x.device)
        part_c = warp_ct(part)
        kernel_launch = _launcher(self.kernel, self.dims, [warp_ct(xn), wv_w, t0, t1, part_c, k, ksteps, cp, nin,
                                                           s, nout], self.block_dim, dev)
        red_inputs = [part_c, bias_w, warp_ct(out), s, nout]

        def launch():
            kernel_launch()
            fast_launch(nms_reduce_kernel(), (nout, b, cout), red_inputs, 256, dev, tiled=False)
        plan = Plan(launch, out, finish)
        plan._keep = (xn, wv, bias_p, part) + self.tables
        return plan


def _make_nms_reduce(et, name: str):
    def reduce(part: wp.array3d(dtype=wp.float32), bias: wp.array1d(dtype=wp.float32),
               out: wp.array3d(dtype=et), nsplit: int, nout: int):
        n, b, o = wp.tid()
        acc = part[n, b, o]
        for s in range(1, nsplit):
            acc += part[s * nout + n, b, o]
        out[n, b, o] = et(acc + bias[o])
    reduce.__annotations__["out"] = wp.array3d(dtype=et)      # an object: this module's annotations are strings
    reduce.__name__ = name
    return wp.kernel(enable_backward=False, module="unique")(reduce)


@built_once
def nms_reduce_kernel():
    """``out[n, b, o] = fp16(sum_{s < S} part[s*Nout + n, b, o] + bias[o])``, the sum in fp32 in split
    order: the nms partials' fixed-order reduction, bias and single rounding in one SIMT launch (o fastest:
    coalesced partial reads)."""
    return _make_nms_reduce(wp.float16, "fovi_nms_reduce")


@built_once
def nms_reduce_bf16_kernel():
    """:func:`nms_reduce_kernel` rounding to bf16 (the split bf16 mma kernels' reduction)."""
    return _make_nms_reduce(wp.bfloat16, "fovi_nms_reduce_bf16")


@built_once
def nms_reduce_f32_kernel():
    """:func:`nms_reduce_kernel` with an fp32 output (no rounding): the tensor-core dx's finish."""
    return _make_nms_reduce(wp.float32, "fovi_nms_reduce_f32")


#: How the i2c stage gathers rows: ``"warp"`` (a SIMT row copy of 8-byte elements,
#: :func:`~fovi_lab.kernels.common.gather_rows`) or ``"torch"`` (``index_select`` of 16-byte elements; the tests
#: compare the two).
I2C_GATHER = "warp"


def _i2c_gather_kind() -> str:
    """:data:`I2C_GATHER`."""
    return I2C_GATHER


def _as_rows16(t: torch.Tensor) -> torch.Tensor:
    """An fp16 ``[rows, C]`` tensor (C a multiple of 8) viewed as ``[rows, C/8]`` 16-byte elements, so a
    row gather copies 16 bytes per element instead of 2."""
    return t.view(torch.complex128) if t.shape[1] % 8 == 0 else t


def _plan_i2c(cfg: FwdConfig, kernel, x, weight, il, wl, out, finish, bias_p, bias_w, dev: str,
              info: TableInfo, memo: Optional[dict] = None) -> Plan:
    """The i2c launch (see :func:`make_i2c_kernel`): per chunk of ``Nc`` nodes (``Nc*P64*Bx*2`` bytes
    within ``FOVI_WARP_I2C_MIB``), one row gather into the stage, then one kernel launch. For ``i2c``
    the weight rows of every node are gathered too (``Nout*P64*Cout_p*2`` bytes, rebuilt per call
    because a training step changes W), in the same launch as the first chunk's x rows. All of it is
    inside the timed launch. ``memo``: the call signature's memo (:data:`_CALLS`), for the chunk plan."""
    b, cin, nin = x.shape
    cout, q = weight.shape
    nout, p64 = il.shape
    budget, how = _i2c_stage_bytes(), _i2c_gather_kind()
    st = memo.get(("i2c", how, budget)) if memo is not None else None
    if st is None:
        st = _i2c_static(cfg, b, cout, nout, p64, budget)
        if memo is not None:
            memo[("i2c", how, budget)] = st
    bx, coutp, staged_w = st.bx, st.coutp, not family(cfg.variant).variant_values(cfg)["w_gathered"]
    # [Cin*Nin + 1, Bx]: x^T, the zero pad row and zero batch columns, in one op
    xp = torch.nn.functional.pad(x.reshape(b, cin * nin).t(), (0, bx - b, 0, 1))
    at = torch.empty(st.nc * p64, bx, dtype=torch.float16, device=x.device)
    if staged_w:
        wtp, _ = _weight_operand(weight, "tp", 0, 0, coutp)     # [Q, Cout_p]
        wop = torch.empty(nout * p64, coutp, dtype=torch.float16, device=x.device)
    else:
        wtp = None
        wop, _ = _weight_operand(weight, "t", 0, 0)              # [Q, Cout], gathered by wl in the kernel
    at_w, wop_w, out_w, wl_w = warp_ct(at), warp_ct(wop), warp_ct(out), info.wa(wl)
    ksteps, bd = p64 // cfg.tile_k, cfg.block_dim

    if how == "torch":
        il_flat, xp16, at16 = il.view(-1), _as_rows16(xp), _as_rows16(at)
        if staged_w:
            wl_flat, wtp16, wop16 = wl.view(-1), _as_rows16(wtp), _as_rows16(wop)

        def gathers(first, n0, cnt):
            if first and staged_w:
                torch.index_select(wtp16, 0, wl_flat, out=wop16)
            torch.index_select(xp16, 0, il_flat[n0 * p64:(n0 + cnt) * p64], out=at16[:cnt * p64])
    else:  # Warp row copies of 8-byte elements, recorded launches (host time matters here)
        xp64, at64 = as_rows64(xp), as_rows64(at)
        xp_c, at_c, il_c, arow = warp_ct(xp64), warp_ct(at64), info.wa(il, flat=True), at64.shape[1]
        if staged_w:
            wop64 = as_rows64(wop)
            wtp_c, wop_c, wl_c, wn = warp_ct(as_rows64(wtp)), warp_ct(wop64), info.wa(wl, flat=True), wop64.numel()

        def gathers(first, n0, cnt):
            na = cnt * p64 * arow
            if first and staged_w:     # W rows and chunk 0's x rows in one launch
                fast_launch(gather_rows_pair_kernel(), (na + wn,),
                            [xp_c, il_c, at_c, n0 * p64, na, wtp_c, wl_c, wop_c, 0], 256, dev, tiled=False)
            else:
                fast_launch(gather_rows_kernel(), (cnt * p64, arow), [xp_c, il_c, at_c, n0 * p64], 256, dev,
                            tiled=False)

    def launch():
        for i, (n0, cnt, dims) in enumerate(st.chunks):
            gathers(i == 0, n0, cnt)
            fast_launch(kernel, dims, [at_w, wop_w, wl_w, bias_w, out_w, ksteps, p64, n0], bd, dev)
    plan = Plan(launch, out, finish)
    plan._keep = (xp, at, wop, wtp, il, wl, bias_p)
    return plan


def _node_major_x(x: torch.Tensor, cp: int, bx: int) -> torch.Tensor:
    """``xn[m*Cp + c, b] = x[b, c, m]`` as ``[Nin*Cp, Bx]`` fp16; channel and batch padding zeroed
    (the channel pad is contracted against W's zero pad: it must not hold NaN)."""
    b, cin, nin = x.shape
    if x.dtype == torch.float16:
        return swap_axes_into(x, torch.empty(nin, cp, bx, dtype=x.dtype, device=x.device)).view(nin * cp, bx)
    if cp == cin and bx == b:
        return x.permute(2, 1, 0).contiguous().view(nin * cp, bx)
    xn = torch.empty(nin, cp, bx, dtype=torch.float16, device=x.device)
    xn[:, :cin, :b].copy_(x.permute(2, 1, 0))
    if cp > cin:
        xn[:, cin:, :].zero_()
    if bx > b:
        xn[:, :cin, b:].zero_()
    return xn.view(nin * cp, bx)


_wcache_lock = threading.RLock()     # re-entrant: the weak-reference callbacks below may run under it (a GC pass)
_WCACHE: "Dict[Tuple, Tuple]" = {}
_WCACHE_MAX = 64


def weight_layout(weight: torch.Tensor, kind: str, cin: int, cp: int, coutp: int = 0) -> torch.Tensor:
    """Weight operand of a kernel family, cached per (weight object, ``_version``, layout).

    ``"t"``: ``W^T [Q, Cout]``; ``"tp"``: the same with ``coutp`` columns (zero padded); ``"pv"``: fp32
    ``W^T`` with ``coutp`` columns permuted for ``tile_o = cp`` channel groups,
    ``out[q, og*tile_o + j] = W^T[q, og + j*n_og]`` (``n_og = coutp/tile_o``; zero past Cout). ``"v"``:
    tap-major ``wv[v*Cp + c, o] = W[o, c*V + v]``, ``[V*Cp, Cout_p]`` with zero channel/column padding
    (``coutp`` columns, a multiple of 8 for 16-byte rows). Inference reuses the layout; a training
    step's in-place update bumps ``_version`` and rebuilds it. Under CUDA-graph capture the layout is
    always rebuilt (and not cached), so the graph replays the copy and sees the weight of each replay.
    """
    import weakref
    key = (id(weight), kind, cp, coutp)
    capture = capturing(weight)          # under CUDA-graph capture: rebuild, inside the graph, every replay
    with _wcache_lock:
        hit = None if capture else _WCACHE.get(key)
    if hit is not None and hit[0]() is weight and hit[1] == weight._version:
        return hit[2]
    cout, q = weight.shape
    # (one layout copy through shared memory, zero pads included: fovi_lab.kernels.layout)
    if kind == "pv":
        to, n_og = cp, coutp // cp
        src = weight if coutp == cout else torch.cat([weight, weight.new_zeros(coutp - cout, q)])
        out = torch.empty(q, n_og, to, dtype=torch.float32, device=weight.device)
        out.copy_(src.view(to, n_og, q).permute(2, 1, 0))       # [q, og, j] = W[j*n_og + og, q]
        out = out.view(q, coutp)
    elif kind == "t" or kind == "tp":
        out = transpose_into(weight, torch.empty(q, coutp if kind == "tp" else cout, dtype=weight.dtype,
                                                 device=weight.device))
    else:
        v = q // cin
        wv = torch.empty(v, cp, coutp, dtype=weight.dtype, device=weight.device)
        out = swap_axes_into(weight.view(cout, cin, v), wv).view(v * cp, coutp)   # wv[v, c, o] = W[o, c*V + v]
    if capture:
        return out
    with _wcache_lock:
        if len(_WCACHE) >= _WCACHE_MAX:
            _WCACHE.pop(next(iter(_WCACHE)))
        def _drop(_ref, key=key, lock=_wcache_lock, cache=_WCACHE):  # a temporary weight frees its layout too
            with lock:
                if key in cache and cache[key][0] is _ref:
                    del cache[key]
        _WCACHE[key] = (weakref.ref(weight, _drop), weight._version, out, _weight_desc(kind, out))
    return out


def _weight_desc(kind: str, out: torch.Tensor):
    """The Warp array descriptor of a weight layout (``"pv"``: fp32 ``vec4`` words)."""
    return warp_ct_vec(out) if kind == "pv" else warp_ct(out)


def _weight_operand(weight: torch.Tensor, kind: str, cin: int, cp: int, coutp: int = 0):
    """(tensor, Warp view) of :func:`weight_layout` (the view is cached with the layout)."""
    out = weight_layout(weight, kind, cin, cp, coutp)
    with _wcache_lock:
        ent = _WCACHE.get((id(weight), kind, cp, coutp))
    if ent is not None and ent[2] is out:
        return out, ent[3]
    return out, _weight_desc(kind, out)


def plan_cached(cfg: FwdConfig, kernel, x, weff, bias, il, cout: int, store: str) -> Plan:
    dev = warp_device(x)
    b, cin, nin = x.shape
    nout, p64 = il.shape
    out, finish = _output(b, cout, nout, x.device, store)
    bias_p, bias_w = bias_operand(bias, cout, cfg.tile_n, x.device)
    xt = transpose(x.reshape(b, cin * nin))
    dims = (nout, -(-b // cfg.tile_m), -(-cout // cfg.tile_n))
    inputs = [warp_ct(xt), warp_ct(weff), warp_ct(il), bias_w, warp_ct(out), p64 // _GATHER_TILE_K, b]
    plan = Plan(_launcher(kernel, dims, inputs, cfg.block_dim, dev), out, finish)
    plan._keep = (xt, weff, il, bias_p)
    return plan


def plan_dense(cfg: FwdConfig, kernel, b: int, cout: int, nout: int, kdim: int, device, seed: int = 0,
                store: str = "staged") -> Plan:
    """Dense ceiling operands of the same GEMM sizes: ``at [Kd, Bx]``, ``w [Kd, Cout_p]`` (random)."""
    dev_t = torch.device(device if device != "cpu" else "cpu")
    g = torch.Generator(device="cpu").manual_seed(seed)
    kd = pad_to(kdim, cfg.tile_k)
    # whole tiles: the pipelined ceiling loads unchecked
    at = torch.randn(kd, pad_to(b, cfg.rows_per_cta), generator=g).to(dev_t, torch.float16)
    w = (0.1 * torch.randn(kd, pad_to(cout, cfg.tile_n), generator=g)).to(dev_t, torch.float16)
    out, finish = _output(b, cout, nout, dev_t, store)
    bias_p, bias_w = bias_operand(None, cout, cfg.tile_n, dev_t)
    dims = (nout, -(-b // cfg.rows_per_cta), -(-cout // cfg.tile_n))
    inputs = [to_warp(at), to_warp(w), bias_w, to_warp(out), kd // cfg.tile_k, b]
    fam = family_or_none(cfg.variant)                # None: the tile families' dense ceiling ("dense", "densep")
    simt = fam is not None and fam.unit is not None
    if simt:                                       # SIMT ceiling: all Kd rows, U per step; channel groups
        inputs[4:] = [kd, pad_to(cout, cfg.tile_n) // cfg.tile_n]
        v = fam.variant_values(cfg)
        if fam.unit == "warp":                      # warps: (node, batch block, channel block x lane)
            w_native, x_t = v["w_layout"] == "in place", v["x_layout"] == "transposed"
            if not x_t:
                at = at.t().contiguous()             # [Bx, Kd]: x rows, as the in-place kernels read them
            if w_native:
                w = w.t().contiguous()               # [Cout_p, Kd]: W's own layout
            inputs[0:2] = [to_warp(at), to_warp(w)]
            dims = (nout, dims[1], dims[2] * 32)
        if fam.unit == "block":                     # CTAs: (node, batch block, channel block x thread)
            dims = (nout, dims[1], dims[2] * cfg.block_dim)
        if v.get("fp32_vectors"):
            at, w = at.float(), w.float()
            inputs[0:2] = [warp_ct_vec(at), warp_ct_vec(w)]
    plan = Plan(_launcher(kernel, dims, inputs, cfg.block_dim, device_str(device),
                           tiled=not simt), out, finish)
    plan._keep = (at, w, bias_p)
    return plan
