"""bf16 training on Warp's CPU device: the fused adjoints' bf16 kernels and ``warp_train`` under autocast.

Criterion (docs/operator.md §5): the kernels multiply bf16 operands (a product of two bf16 values is exact in
fp32) and accumulate in fp32, so each gradient must equal the fp32 oracle's, evaluated on the same
bf16-rounded operands, up to fp32 summation order: within ``1e-4 * (1 + max |oracle|)``. That is 30-100x
tighter than the bf16 rounding of the operands themselves (2^-8 relative), which a kernel that rounded its
accumulator or an operand once more would exceed. Outputs are pre-filled with NaN, and every result is
bitwise repeatable.
"""

import pytest
import torch

from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.kernels import adjoint as nm
from fovi_lab.ops.autograd import KNNConv
from fovi_lab.ops.reference import oracle_forward

_CASES = {}


def _case(name, b, seed=3):
    """(meta, x, w, g) in bf16 and the oracle's (dx, dW) in fp32 on those same bf16 values."""
    key = (name, b, seed)
    if key not in _CASES:
        cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[name]
        idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
        meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
        gen = torch.Generator().manual_seed(seed + 19)
        x = torch.randn(b, cin, nin, generator=gen).bfloat16()
        w = (torch.randn(cout, cin * v, generator=gen) / (cin * k) ** 0.5).bfloat16()
        g = torch.randn(b, cout, nout, generator=gen).bfloat16()
        xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
        y = oracle_forward(xf, wf, None, meta.idx, meta.rf_index, v)
        dx_o, dw_o = torch.autograd.grad(y, (xf, wf), g.float())
        _CASES[key] = (meta, x, w, g, dx_o, dw_o)
    return _CASES[key]


def _assert_fp32_exact(got, want, what):
    assert got.dtype == torch.float32 and got.shape == want.shape, (what, got.dtype, got.shape)
    assert torch.isfinite(got).all(), f"{what}: non-finite entries (an entry the kernels did not write?)"
    err = float((got - want).abs().max())
    tol = 1e-4 * (1.0 + float(want.abs().max()))
    assert err <= tol, f"{what}: max err {err:.3g} > {tol:.3g} (fp32 accumulation of exact bf16 products)"


def _run_nan_prefilled(plan):
    plan.out.fill_(float("nan"))
    plan.launch()
    return plan.finish()


_EVERY = ([("dx", c) for c in nm.DX_NM_CONFIG_SPECS] + [("dw", c) for c in nm.DW_NM_CONFIG_SPECS])


@pytest.mark.parametrize("which,config", _EVERY)
def test_bf16_every_fused_config(which, config):
    """Every dx config over whole reverse lists (dxn, both stores) and every dW config over interleaved splits
    (dwn, 1 and 3 partials), then each over balanced segments (dxs / dws), ODD shape, NaN-prefilled."""
    meta, x, w, g, dx_o, dw_o = _case("ODD", 17)
    if which == "dx":
        want, op, plan_of, run = dx_o, w, nm.plan_grad_input_nm, nm.grad_input_nm
        plans = [plan_of(meta, g, w, config, store=s) for s in ("direct", "staged")]
    else:
        want, op, plan_of, run = dw_o, x, nm.plan_grad_weight_nm, nm.grad_weight_nm
        plans = [plan_of(meta, g, x, config, nsplit=n) for n in (1, 3)]
    for plan in plans:
        assert plan.k.kernel.fovi_dtype == "bfloat16" and plan.gn.dtype == torch.bfloat16
        _assert_fp32_exact(_run_nan_prefilled(plan), want, f"{config} whole lists")
    plan = plan_of(meta, g, op, config, seg_steps=3)
    assert plan.k.kind == ("dxs" if which == "dx" else "dws")
    got = _run_nan_prefilled(plan)
    _assert_fp32_exact(got, want, f"{config} seg3")
    assert torch.equal(got, run(meta, g, op, config, seg_steps=3))


@pytest.mark.parametrize("shape,b", [("MAIN", 130), ("PAD_HEAVY", 5), ("ODD", 1)])
def test_bf16_warp_train_adjoints(shape, b):
    """warp_train's own path in bf16 (default configs, fused on every layer: the stems too, as the staged
    kernels are fp16 only: PAD_HEAVY has Cin = 9), separate and combined, bitwise repeatable."""
    from fovi_lab.knn_warp import WarpTrainOps
    meta, x, w, g, dx_o, dw_o = _case(shape, b)
    dx, dw = WarpTrainOps.backward_combined(meta, g, x, w)
    _assert_fp32_exact(dx, dx_o, f"dx {shape} B={b}")
    _assert_fp32_exact(dw, dw_o, f"dW {shape} B={b}")
    assert torch.equal(dx, WarpTrainOps.grad_input(meta, g, w))
    assert torch.equal(dw, WarpTrainOps.grad_weight(meta, g, x))
    dx2, dw2 = WarpTrainOps.backward_combined(meta, g, x, w)
    assert torch.equal(dx, dx2) and torch.equal(dw, dw2)


def test_bf16_fp16_kernels_are_validated_apart_and_mixed_dtypes_refused():
    meta, x, w, g, _, _ = _case("ODD", 17)
    a = nm.get_nm_grad_kernel("dxn", "dxn_m16n16k64", "cpu")
    b = nm.get_nm_grad_kernel("dxn", "dxn_m16n16k64", "cpu", bf16=True)
    assert a is not None and b is not None and a.kernel is not b.kernel
    assert (a.kernel.fovi_dtype, b.kernel.fovi_dtype) == ("float16", "bfloat16")
    with pytest.raises(TypeError, match=r"weight: expected dtype torch.bfloat16 \(same as grad_y\), got torch.float16"):
        nm.plan_grad_input_nm(meta, g, w.half())
    with pytest.raises(TypeError, match=r"x: expected dtype torch.bfloat16 \(same as grad_y\), got torch.float16"):
        nm.plan_grad_weight_nm(meta, g, x.half())
    with pytest.raises(TypeError, match="grad_y: expected dtype torch.float16 or torch.bfloat16, got torch.float32"):
        nm.plan_grad_input_nm(meta, g.float(), w)
    # the staged kernels have no bf16 form: a staged config asked for by name says so
    from fovi_lab import knn_warp
    with pytest.raises(TypeError, match="grad_y: expected dtype torch.float16"):
        knn_warp.grad_input(meta, g, w, config=next(iter(nm.GRAD_INPUT_CONFIG_SPECS)))


def test_autocast_bf16_trains_through_warp_train():
    """A fp32 layer under ``torch.autocast("cpu", dtype=torch.bfloat16)``: the forward runs in bf16 on the
    tensor-core kernels' CPU branch, the gradients on the fused bf16 adjoints, and come back in fp32 (the
    master weights' dtype) equal to the oracle on the bf16-rounded operands; two steps are bitwise equal."""
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES["ODD"]
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=1)
    layer = KNNConv(idx, rf, nin=nin, v=v, cin=cin, cout=cout, bias=True, backend="warp_train")
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(6, cin, nin, generator=gen)
    g = torch.randn(6, cout, layer.nout, generator=gen)

    def step():
        layer.zero_grad(set_to_none=True)
        xr = x.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(xr)
        y.backward(g)
        return y, xr.grad, layer.weight.grad, layer.bias.grad

    y, dx, dw, db = step()
    assert y.dtype == torch.bfloat16 and layer.last_backend == "warp_train"
    assert dx.dtype == dw.dtype == db.dtype == torch.float32
    xb, wb, bb = x.bfloat16().float(), layer.weight.detach().bfloat16().float(), layer.bias.detach().bfloat16()
    xf, wf = xb.clone().requires_grad_(), wb.clone().requires_grad_()
    yo = oracle_forward(xf, wf, bb.float(), layer.meta.idx, layer.meta.rf_index, v)
    dx_o, dw_o = torch.autograd.grad(yo, (xf, wf), g.bfloat16().float())
    torch.testing.assert_close(y.float(), yo.detach(), rtol=2 ** -7, atol=2 ** -7)   # one bf16 rounding of y
    _assert_fp32_exact(dx, dx_o, "autocast dx")
    _assert_fp32_exact(dw, dw_o, "autocast dW")
    torch.testing.assert_close(db, g.sum((0, 2)), rtol=1e-2, atol=1e-2)              # from the bf16 grad_y
    y2, dx2, dw2, db2 = step()
    assert torch.equal(y, y2) and torch.equal(dx, dx2) and torch.equal(dw, dw2) and torch.equal(db, db2)
