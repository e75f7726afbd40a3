"""The forward's host path: the per-signature call cache must never serve a stale decision, the cheap
array descriptors must equal Warp's own, the value caches (weight layouts, padded bias) must step aside
under CUDA-graph capture, and the paired row gather must copy bit-exactly.

Everything here runs on Warp's CPU device with small shapes (the forward kernels come from the kernel
cache that ``tests/kernels/forward/test_warp_forward.py``'s session fixture fills; a cold cache compiles them here)."""

from __future__ import annotations

import math

import pytest
import torch

from fovi_lab.kernels import adjoint as NM
from fovi_lab.kernels.adjoint import fused_plans as adj_fused_plans
from fovi_lab.kernels import forward as F
from fovi_lab.kernels.forward import api as fwd_api
from fovi_lab.kernels.forward import plans as fwd_plans
from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.ops.reference import oracle_forward
from fovi_lab.kernels.common import as_rows64, fast_launch, gather_rows_pair_kernel, init_warp, warp_ct, wp

STEM = (3, 24, 200, 37, 42, 80, 25)


def _problem(shape="ODD", b=5, seed=0):
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[shape] if isinstance(shape, str) else shape
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, cin, nin, generator=g).half()
    w = (torch.randn(cout, cin * v, generator=g) / math.sqrt(cin * k)).half()
    return meta, x, w, idx, rf, v


def _check(y, x, w, idx, rf, v, bias=None):
    ref = oracle_forward(x, w, bias, idx, rf, v)
    assert bool(torch.isfinite(y).all())
    assert float((y.float() - ref).abs().max()) <= 2e-2 * max(1.0, float(ref.abs().max()))


@pytest.mark.parametrize("make", [
    lambda: torch.randn(64, 96).half(),
    lambda: torch.randn(5, 7, 9).half().permute(2, 0, 1),
    lambda: torch.arange(10, dtype=torch.int32),
    lambda: torch.zeros(2, 3, 4, 5),
    lambda: torch.randn(8, 8).half().view(torch.int64),
    lambda: torch.randn(6, 10)[:, 2:7],
])
def test_descriptor_equals_warps_own(make):
    init_warp()
    t = make()
    a, b = wp.from_torch(t, return_ctype=True), warp_ct(t)
    assert (a.data, a.grad, a.ndim, a.flags) == (b.data, b.grad, b.ndim, b.flags)
    assert list(a.shape) == list(b.shape) and list(a.strides) == list(b.strides)


def test_descriptor_never_touches_grad():
    t = torch.zeros(4, 8, requires_grad=True)
    d = warp_ct(t)
    assert d.grad == 0 and t.grad is None
    with pytest.raises(ValueError, match="1-D to 4-D"):
        warp_ct(torch.zeros(1, 1, 1, 1, 1))


def test_call_cache_hits_and_matches_the_slow_path():
    meta, x, w, idx, rf, v = _problem()
    il, wl = meta.input_linear, meta.weight_linear
    y1 = F.run_uncached(x, w, None, il, wl)
    n = len(fwd_api._CALLS)
    y2 = F.run_uncached(x, w, None, il, wl)
    assert len(fwd_api._CALLS) == n                       # the second call was a hit
    assert torch.equal(y1, y2)
    _check(y2, x, w, idx, rf, v)
    x2 = torch.randn_like(x.float()).half()        # new values, same signature: a hit, new numbers
    _check(F.run_uncached(x2, w, None, il, wl), x2, w, idx, rf, v)


def test_call_cache_revalidates_an_edited_table():
    meta, x, w, *_ = _problem(seed=1)
    il, wl = meta.input_linear.clone(), meta.weight_linear.clone()
    F.run_uncached(x, w, None, il, wl)
    il[0, 0] = meta.cin * meta.nin + 5            # in place: bumps _version, so the key misses
    with pytest.raises(ValueError, match="input_linear"):
        F.run_uncached(x, w, None, il, wl)
    il[0, 0] = meta.input_linear[0, 0]
    wl[0, 0] = meta.q                              # one past the last weight column
    with pytest.raises(ValueError, match="weight_linear"):
        F.run_uncached(x, w, None, il, wl)


def test_call_cache_sees_new_tables_args_and_env(monkeypatch):
    meta, x, w, idx, rf, v = _problem(seed=2)
    F.run_uncached(x, w, None, meta.input_linear, meta.weight_linear)
    # a different graph of the same shape in new tensors: its own analysis, its own numbers
    meta2, _, _, idx2, rf2, _ = _problem(seed=3)
    _check(F.run_uncached(x, w, None, meta2.input_linear, meta2.weight_linear), x, w, idx2, rf2, v)
    # bad arguments still raise with a warm cache
    with pytest.raises(TypeError, match="x: expected dtype"):
        F.run_uncached(x.float(), w, None, meta.input_linear, meta.weight_linear)
    with pytest.raises(TypeError, match="weight"):
        F.run_uncached(x, w.float(), None, meta.input_linear, meta.weight_linear)
    with pytest.raises(ValueError, match="bias"):
        F.run_uncached(x, w, torch.zeros(3), meta.input_linear, meta.weight_linear)
    # the store request is part of the signature
    plan = F.prepare_uncached(x, w, None, meta.input_linear, meta.weight_linear, store="staged")
    assert plan.out.is_contiguous()                # the staged [Nout, B, Cout] buffer
    with pytest.raises(ValueError, match="store: expected 'staged' or 'direct', got 'bogus'"):
        F.run_uncached(x, w, None, meta.input_linear, meta.weight_linear, store="bogus")


def test_call_cache_follows_a_cleared_config_cache():
    meta, x, w, *_ = _problem(seed=4)
    F.run_uncached(x, w, None, meta.input_linear, meta.weight_linear)
    gen = F.VALIDATED.generation
    F.VALIDATED.clear()
    assert F.VALIDATED.generation == gen + 1
    F.run_uncached(x, w, None, meta.input_linear, meta.weight_linear)   # rebuilt, not a stale kernel
    key = fwd_api._call_key(x, w, None, meta.input_linear, meta.weight_linear, None, None)
    assert key in fwd_api._CALLS and key[-1] == gen + 1


@pytest.mark.parametrize("kind,cin,cp,cout,coutp", [("v", 4, 4, 8, 8), ("v", 3, 16, 6, 8), ("t", 3, 0, 6, 0),
                                                     ("tp", 3, 0, 8, 8), ("tp", 3, 0, 6, 8)])
def test_weight_layouts(kind, cin, cp, cout, coutp):
    v = 5
    w = torch.randn(cout, cin * v).half()
    got = F.weight_layout(w, kind, cin, cp, coutp)
    if kind == "v":
        want = torch.zeros(v, cp, coutp, dtype=w.dtype)
        want[:, :cin, :cout] = w.view(cout, cin, v).permute(2, 1, 0)
        want = want.view(v * cp, coutp)
    elif kind == "t":
        want = w.t()
    else:
        want = torch.zeros(cin * v, coutp, dtype=w.dtype)
        want[:, :cout] = w.t()
    assert got.is_contiguous() and torch.equal(got, want)


def test_value_caches_step_aside_under_graph_capture(monkeypatch):
    w = torch.randn(8, 12).half()
    b = torch.randn(8)
    first = F.weight_layout(w, "t", 0, 0)
    assert F.weight_layout(w, "t", 0, 0) is first            # a hit outside capture
    bias_first = F.bias_operand(b, 8, 32, b.device)[0]
    assert F.bias_operand(b, 8, 32, b.device)[0] is bias_first
    monkeypatch.setattr(fwd_plans, "capturing", lambda t: True)
    fresh = F.weight_layout(w, "t", 0, 0)
    assert fresh is not first and torch.equal(fresh, first)   # rebuilt, so a graph replays the copy
    assert F.weight_layout(w, "t", 0, 0) is not fresh         # ... and never cached
    assert F.bias_operand(b, 8, 32, b.device)[0] is not bias_first
    monkeypatch.undo()
    assert F.weight_layout(w, "t", 0, 0) is first            # the cached entry was left alone


def test_a_temporary_bias_frees_its_cached_operand():
    """Under autocast every call casts the bias anew: each cast copy's padded operand must go with it, not pile
    up in the cache (nor, under a CUDA-graph pool, outlive the graph's tensors)."""
    import gc
    import weakref
    before = len(fwd_plans._BIAS_CACHE)
    tmp = torch.randn(8).half()
    out = weakref.ref(F.bias_operand(tmp, 8, 32, tmp.device)[0])
    assert len(fwd_plans._BIAS_CACHE) == before + 1 and out() is not None
    del tmp
    gc.collect()
    assert len(fwd_plans._BIAS_CACHE) == before and out() is None


def test_i2c_chunk_plan_follows_the_budget(monkeypatch):
    meta, x, w, idx, rf, v = _problem(STEM, b=9)
    for mib in ("0.02", "0.05", "32"):
        monkeypatch.setenv("FOVI_WARP_I2C_MIB", mib)
        plan = F.prepare_uncached(x, w, None, meta.input_linear, meta.weight_linear, config="i2c_m16n64k64")
        plan.out.fill_(float("nan"))
        plan.launch()
        _check(plan.finish(), x, w, idx, rf, v)
    key = fwd_api._call_key(x, w, None, meta.input_linear, meta.weight_linear, "i2c_m16n64k64", None)
    memo = fwd_api._CALLS[key][-1]
    assert len([k for k in memo if k[0] == "i2c"]) == 3         # one chunk plan per budget
    assert len({st.nc for st in memo.values()}) == 3


def test_paired_row_gather_is_bit_exact():
    init_warp()
    g = torch.Generator().manual_seed(0)
    src_a = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(-1, 16)
    src_b = torch.randn(50, 24, generator=g).half()
    idx_a = torch.randint(0, src_a.shape[0], (900,), generator=g, dtype=torch.int32)
    idx_b = torch.randint(0, 50, (70,), generator=g, dtype=torch.int32)
    dst_a = torch.full((400, 16), float("nan"), dtype=torch.float16)
    dst_b = torch.full((70, 24), float("nan"), dtype=torch.float16)
    rows_a, idx0_a = 300, 123                                   # a partial chunk of dst_a, offset index
    a64, b64 = as_rows64(dst_a), as_rows64(dst_b)
    na = rows_a * a64.shape[1]
    fast_launch(gather_rows_pair_kernel(), (na + b64.numel(),),
                [warp_ct(as_rows64(src_a)), warp_ct(idx_a), warp_ct(a64), idx0_a, na,
                 warp_ct(as_rows64(src_b)), warp_ct(idx_b), warp_ct(b64), 0], 256, "cpu", tiled=False)
    want_a = src_a[idx_a[idx0_a:idx0_a + rows_a].long()]
    assert torch.equal(dst_a[:rows_a].view(torch.int16), want_a.view(torch.int16))
    assert bool(torch.isnan(dst_a[rows_a:]).all())              # rows past the chunk untouched
    assert torch.equal(dst_b, src_b[idx_b.long()])


def test_nms_reduce_is_the_ordered_fp32_sum_plus_bias_rounded_once():
    init_warp()
    g = torch.Generator().manual_seed(1)
    s, nout, b, cout = 3, 2, 5, 7
    part = torch.randn(s * nout, b, cout, generator=g) * torch.logspace(-2, 4, cout)
    bias = torch.randn(8, generator=g)                     # padded to the tile width: the tail is unread
    y = torch.full((b, cout, nout), float("nan"), dtype=torch.float16)
    out = y.permute(2, 0, 1)                               # the direct store's strided [Nout, B, Cout] view
    fast_launch(F.nms_reduce_kernel(), (nout, b, cout), [warp_ct(part), warp_ct(bias), warp_ct(out), s, nout],
                256, "cpu", tiled=False)
    acc = part[:nout].clone()
    for i in range(1, s):
        acc += part[i * nout:(i + 1) * nout]               # fp32, in split order
    assert torch.equal(out, (acc + bias[:cout]).half())


@pytest.mark.parametrize("nsplit", (1, 3))
@pytest.mark.parametrize("v,cout,cin,op,cp", [(5, 6, 3, 8, 4),        # one 32x32 tile per o, pads dropped
                                              (40, 3, 35, 4, 48)])   # ragged second tiles along v and c
def test_dw_finish_is_the_ordered_sum_in_dw_layout(nsplit, v, cout, cin, op, cp):
    """The fused dW's partials ``[S, V, Op, Cp]`` (padded Cout and Cin) become ``dW[o, c*V + v]``: the fp32
    sum over splits in split order, bit for bit; channel pads and the next o's run never reach dW."""
    init_warp()
    g = torch.Generator().manual_seed(2)
    part = torch.randn(nsplit, v, op, cp, generator=g) * torch.logspace(-3, 3, cp)
    dw = torch.full((cout, cin, v), float("nan"))
    grid = (cout, -(-v // adj_fused_plans._FIN_TV), -(-cin // adj_fused_plans._FIN_TC))
    fast_launch(adj_fused_plans._dw_finish_kernel(), grid, [warp_ct(part.view(nsplit, v, op * cp)), warp_ct(dw), nsplit, cp],
                adj_fused_plans._FIN_BLOCK, "cpu")
    dw = dw.view(cout, cin * v)
    acc = part[0].clone()
    for s in range(1, nsplit):
        acc += part[s]
    assert torch.equal(dw, acc[:, :cout, :cin].permute(1, 2, 0).reshape(cout, cin * v))


@pytest.mark.parametrize("arch", (80, 90))
@pytest.mark.parametrize("make", [gather_rows_pair_kernel, F.nms_reduce_kernel, adj_fused_plans._dw_finish_kernel,
                                  NM.seg_finish_kernel, F.simtv_prep_kernel],
                         ids=["gather_pair", "nms_reduce", "dw_finish", "seg_finish", "simtv_prep"])
def test_simt_helpers_compile_aot(tmp_path, arch, make):
    init_warp()
    paths = wp.compile_aot_module(make().module, arch=arch, module_dir=str(tmp_path))
    assert paths and all(f"sm{arch}" in str(p) for p in paths)
