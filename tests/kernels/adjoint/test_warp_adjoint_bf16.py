"""bf16 training on Warp's CPU device: the fused and the staged adjoints' bf16 kernels, and ``warp_train`` under
autocast.

Criterion (docs/operator.md §5): the kernels multiply bf16 operands (a product of two bf16 values is exact in
fp32) and accumulate in fp32, so each gradient must equal the fp32 oracle's, evaluated on the same
bf16-rounded operands, up to fp32 summation order: within ``1e-4 * (1 + max |oracle|)``. That is 30-100x
tighter than the bf16 rounding of the operands themselves (2^-8 relative), which a kernel that rounded its
accumulator or an operand once more would exceed. Outputs are pre-filled with NaN, and every result is
bitwise repeatable.
"""

import pytest
import torch

from fovi_lab.graph.meta import SYNTHETIC_SHAPES, synthetic_graph
from fovi_lab.kernels import adjoint as nm
from fovi_lab.ops.autograd import KNNConv
from fovi_lab.ops.reference import oracle_forward
from grad_cases import assert_fp32_exact, grad_case

def _case(name, b, seed=3):
    """(meta, x, w, g) in bf16 and the oracle's (dx, dW) in fp32 on those same bf16 values."""
    return grad_case(name, b, seed=seed, data_seed=19, dtype=torch.bfloat16)[:6]


_assert_fp32_exact = assert_fp32_exact


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


_EVERY_STAGED = ([("gi", c) for c in nm.GRAD_INPUT_CONFIG_SPECS] + [("gw", c) for c in nm.GRAD_WEIGHT_CONFIG_SPECS])


@pytest.mark.parametrize("kind,config", _EVERY_STAGED)
def test_bf16_every_staged_config(kind, config, monkeypatch):
    """Every staged config's bf16 form (``<config>_bf16``: bf16 GEMM operands, fp32 stage, the fp32 reverse-list
    reductions), on the ODD shape and the pad-heavy stem-like one (Cin = 9), stage buffers NaN-prefilled;
    asked for by the base name with bf16 operands, the bf16 form runs, and repeats bit for bit."""
    from fovi_lab.kernels.adjoint import staged_plans
    monkeypatch.setattr(staged_plans, "_EMPTY_FILL", float("nan"))
    for shape, b in (("ODD", 17), ("PAD_HEAVY", 5)):
        meta, x, w, g, dx_o, dw_o = _case(shape, b)
        if kind == "gi":
            plan, why = nm.plan_grad_input(meta, g, w, config)
            want, run, op = dx_o, nm.grad_input, w
        else:
            plan, why = nm.plan_grad_weight(meta, g, x, config)
            want, run, op = dw_o, nm.grad_weight, x
        assert why is None and plan.stage_k.name == config + "_bf16" and plan.stage_k.kernel.fovi_bf16
        assert plan.stage_k.fp32_stage and plan.stage_buf.dtype == torch.float32
        got = plan.run()
        _assert_fp32_exact(got, want, f"{config}_bf16 {shape} B={b}")
        assert torch.equal(got, run(meta, g, op, config))


@pytest.mark.parametrize("shape,b", [("MAIN", 130), ("PAD_HEAVY", 5), ("ODD", 1)])
def test_bf16_warp_train_adjoints(shape, b):
    """warp_train's own path in bf16 (default configs: fused where Cin >= 16, the staged kernels' bf16 form on
    PAD_HEAVY, Cin = 9, as in fp16), separate and combined, bitwise repeatable."""
    from fovi_lab.knn_warp import grad_path
    assert grad_path(_case(shape, b)[0], torch.bfloat16) == ("staged" if shape == "PAD_HEAVY" else "fused")
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
    # the staged kernels too: their bf16 and fp16 forms are validated apart, mixed dtypes are refused
    cfg = next(iter(nm.GRAD_INPUT_CONFIG_SPECS))
    s16, sbf = nm.get_grad_kernel("gi", cfg, "cpu"), nm.get_grad_kernel("gi", cfg + "_bf16", "cpu")
    assert s16 is not None and sbf is not None and s16.kernel is not sbf.kernel
    assert (s16.kernel.fovi_bf16, sbf.kernel.fovi_bf16, sbf.fp32_stage) == (False, True, True)
    with pytest.raises(TypeError, match=r"weight: expected dtype torch.bfloat16 \(same as grad_y\), got torch.float16"):
        nm.grad_input(meta, g, w.half(), cfg)
    with pytest.raises(TypeError, match="grad_y: expected dtype torch.float16 or torch.bfloat16, got torch.float32"):
        nm.grad_weight(meta, g.float(), x, next(iter(nm.GRAD_WEIGHT_CONFIG_SPECS)))


def test_autocast_bf16_trains_through_warp_train():
    """A fp32 layer under ``torch.autocast("cpu", dtype=torch.bfloat16)``: the forward runs in bf16 on the
    tensor-core kernels' CPU branch, the gradients on the bf16 adjoints (fused: Cin = 17), and come back in fp32 (the
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
