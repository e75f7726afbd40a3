"""One plan per call signature (``fovi_lab.kernels.call_plan``): the forward kernel and the adjoint plan of a
``warp_train`` call are decided on the signature's first call, looked up by its later calls and by its backward,
and are what the call runs."""

from __future__ import annotations

import pytest
import torch

import fovi_lab
import fovi_lab.kernels.call_plan as cp
from fovi_lab.graph.layers import layer_meta
from fovi_lab.graph.meta import build_meta, synthetic_graph
from fovi_lab.kernels.adjoint.rule import adjoint_plan
from fovi_lab.kernels.forward.api import prepare_uncached
from fovi_lab.ops.autograd import KNNConv


@pytest.mark.parametrize("layer, batch, dtype", [("res18_layer1", 16, "fp16"), ("res18_stem", 5, "fp16"),
                                                 ("alex_L2", 3, "fp16"), ("res18_layer4_0", 64, "bf16")])
def test_the_plan_is_what_the_rules_pick(layer, batch, dtype):
    plan = fovi_lab.call_plan(layer, batch, dtype, "cpu")
    meta = layer_meta(layer)
    dt = torch.float16 if dtype == "fp16" else torch.bfloat16
    x = torch.empty(batch, meta.cin, meta.nin, dtype=dt)
    w = torch.empty(meta.cout, meta.q, dtype=dt)
    assert plan.forward == prepare_uncached(x, w, None, meta.input_linear, meta.weight_linear).config
    assert plan.forward_source == "rule" and plan.adjoint == adjoint_plan(meta, batch, dt, "cpu")
    assert (plan.batch, plan.dtype, plan.device) == (batch, dt, "cpu")
    text = str(plan)
    assert f"[{plan.forward}]" in text and f"B = {batch} in {dtype} on cpu" in text
    assert text.count("\n") == 3 and "dx: " in text and "dW: " in text
    assert fovi_lab.call_plan(layer, batch, dtype, "cpu") is plan             # looked up, not decided again


def test_a_signature_decides_once_and_runs_its_plan(monkeypatch):
    decided = []
    real = cp._decide
    monkeypatch.setattr(cp, "_decide", lambda *a: decided.append(a[1].shape) or real(*a))
    idx, rf = synthetic_graph(40, 24, 9, 11, 6, seed=4)
    conv = KNNConv(idx, rf, nin=40, v=11, cin=24, cout=20, backend="warp_train").half()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(7, 24, 40, generator=g).half().requires_grad_()
    outs = []
    for _ in range(3):                                  # three train steps of one signature
        y = conv(x)
        y.float().square().sum().backward()
        outs.append((y.detach(), x.grad, conv.weight.grad))
        x.grad = conv.weight.grad = None
    assert len(decided) == 1
    assert all(torch.equal(a, b) for o in outs[1:] for a, b in zip(outs[0], o))        # bitwise repeatable
    plan = cp.plan_of_call(conv.meta, x.detach(), conv.weight.detach())
    direct = prepare_uncached(x.detach(), conv.weight.detach(), None, conv.meta.input_linear,
                              conv.meta.weight_linear)
    assert plan.forward == direct.config
    with torch.no_grad():
        conv(x[:5])                                     # another batch: another signature
    assert len(decided) == 2
    monkeypatch.setenv("FOVI_KNN_GRAD_PATH", "staged")  # a setting the plan reads: decided anew
    conv(x).float().sum().backward()
    assert len(decided) == 3
    assert cp.plan_of_call(conv.meta, x.detach(), conv.weight.detach()).adjoint.kernels == "staged"


def test_the_plan_is_keyed_by_the_settings_it_reads():
    from fovi_lab.kernels.adjoint import rule
    from fovi_lab.kernels.forward import api
    assert set(api._CALL_SWITCHES) <= set(cp.SWITCHES) and set(rule.SWITCHES) <= set(cp.SWITCHES)
    assert "FOVI_KNN_FWD_PATH" in cp.SWITCHES


def test_call_plan_refuses_bad_arguments():
    with pytest.raises(ValueError, match="dtype: expected 'fp16' or 'bf16'"):
        fovi_lab.call_plan("res18_layer1", 16, "fp32", "cpu")
    with pytest.raises(ValueError, match="batch: expected an integer >= 1"):
        fovi_lab.call_plan("res18_layer1", 0, "fp16", "cpu")
    with pytest.raises(ValueError, match="layer: unknown 'res18_layer9'"):
        fovi_lab.call_plan("res18_layer9", 16, "fp16", "cpu")
    with pytest.raises(TypeError, match="layer: expected a layer name or a TrainingMeta"):
        fovi_lab.call_plan(3, 16, "fp16", "cpu")
    idx, rf = synthetic_graph(40, 24, 9, 11, 6, seed=5)
    meta = build_meta(idx, rf, cin=16, cout=8, v=11, nin=40)
    assert fovi_lab.call_plan(meta, 2, torch.float16, "cpu").adjoint.kernels == "fused"
