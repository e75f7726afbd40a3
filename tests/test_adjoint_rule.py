"""The adjoint rule (``fovi_lab.kernels.adjoint.rule``): the paths of dx and dW are the rule's, under every switch, and
a call signature decides them once."""

from __future__ import annotations

import pytest
import torch

import fovi_lab.kernels.adjoint.rule as rule
from fovi_lab.graph.layers import LAYERS, layer_meta
from fovi_lab.graph.meta import build_meta, synthetic_graph
from fovi_lab.kernels.adjoint.as_forward import select_grad_mma
from fovi_lab.knn_warp import WarpTrainOps, grad_paths


def _expected(meta, b, dtype, dx_sw="auto", dw_sw="auto", grad_sw="auto"):
    kernels = ("fused" if meta.cin >= 16 else "staged") if grad_sw == "auto" else grad_sw
    cfg = select_grad_mma(meta, b, dtype)
    one = lambda sw: kernels if sw == "off" else ("mma" if sw == "mma" or cfg is not None else kernels)  # noqa: E731
    return one(dx_sw), one(dw_sw), kernels


@pytest.mark.parametrize("layer", list(LAYERS))
def test_plan_is_the_rule_on_every_layer(layer):
    meta = layer_meta(layer)
    for b in (1, 16, 64, 512):
        for dtype in (torch.float16, torch.bfloat16):
            plan = rule.adjoint_plan(meta, b, dtype)
            assert (plan.dx, plan.dw, plan.kernels) == _expected(meta, b, dtype), (layer, b, dtype)
            assert grad_paths(meta, b, dtype) == (plan.dx, plan.dw)


@pytest.mark.parametrize("dx_sw, dw_sw, grad_sw", [("off", "auto", "auto"), ("mma", "off", "auto"),
                                                   ("auto", "mma", "staged"), ("off", "off", "fused")])
def test_switches(monkeypatch, dx_sw, dw_sw, grad_sw):
    monkeypatch.setenv("FOVI_KNN_DX_PATH", dx_sw)
    monkeypatch.setenv("FOVI_KNN_DW_PATH", dw_sw)
    monkeypatch.setenv("FOVI_KNN_GRAD_PATH", grad_sw)
    for layer, b in (("res18_layer1", 64), ("alex_L0", 16), ("res18_layer4_0", 16)):
        meta = layer_meta(layer)
        plan = rule.adjoint_plan(meta, b, torch.float16)
        assert (plan.dx, plan.dw, plan.kernels) == _expected(meta, b, torch.float16, dx_sw, dw_sw, grad_sw)
        assert plan.forced == (dx_sw == "mma", dw_sw == "mma")


def test_a_call_signature_decides_once(monkeypatch):
    calls = []
    real = rule.decide
    monkeypatch.setattr(rule, "decide", lambda *a: calls.append(a) or real(*a))
    idx, rf = synthetic_graph(40, 24, 9, 11, 6, seed=2)
    meta = build_meta(idx, rf, cin=16, cout=24, v=11, nin=40)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 16, 40, generator=g).half()
    w = (torch.randn(24, 16 * 11, generator=g) / 8).half()
    gy = torch.randn(5, 24, 24, generator=g).half()
    first = WarpTrainOps.backward_combined(meta, gy, x, w)
    second = WarpTrainOps.backward_combined(meta, gy, x, w)
    assert len(calls) == 1
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    monkeypatch.setenv("FOVI_KNN_GRAD_PATH", "staged")                 # a switch changes: decided anew
    staged = WarpTrainOps.backward_combined(meta, gy, x, w)
    assert len(calls) == 2 and rule.adjoint_plan(meta, 5, torch.float16).kernels == "staged"
    for a, b in zip(first, staged):      # both paths compute the same gradients (the staged ones stage in fp16)
        assert float((a - b).abs().max()) <= 2e-3 * float(a.abs().max())
