"""Registry, KNNConvFunction and KNNConv (docs/operator.md §4)."""

import pytest
import torch

from fovi_lab.ops.autograd import OPS_REGISTRY, KNNConv, KNNConvFunction, get_ops, register_ops
from fovi_lab.graph.meta import build_meta, synthetic_graph
from fovi_lab.ops.reference import CompactTorchOps, oracle_forward


def _small(seed=0, cin=3, cout=4, nin=11, nout=5, k=4, v=6, pads=5):
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    return build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin), idx, rf


def test_gradcheck_fp64_non_contiguous_and_partial_requires_grad():
    meta, idx, rf = _small()
    x = torch.randn(meta.nin, meta.cin, 2, dtype=torch.float64).permute(2, 1, 0).requires_grad_()
    assert not x.is_contiguous()
    w = torch.randn(meta.cout, meta.q, dtype=torch.float64, requires_grad=True)
    b = torch.randn(meta.cout, dtype=torch.float64, requires_grad=True)
    fn = lambda x, w, b: KNNConvFunction.apply(x, w, b, meta, "torch_compact")  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w, b))
    w_frozen = w.detach()
    assert torch.autograd.gradcheck(lambda x, b: fn(x, w_frozen, b), (x, b))
    x_frozen = x.detach()
    assert torch.autograd.gradcheck(lambda w: fn(x_frozen, w, None), (w,))


def test_grads_cast_back_to_parameter_dtypes():
    meta, idx, rf = _small()
    x = torch.randn(2, meta.cin, meta.nin, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(meta.cout, meta.q, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(meta.cout, dtype=torch.bfloat16, requires_grad=True)
    y = KNNConvFunction.apply(x, w, b, meta, "torch_compact")
    assert y.dtype == torch.bfloat16
    y.float().square().sum().backward()
    assert x.grad.dtype == w.grad.dtype == b.grad.dtype == torch.bfloat16


def test_registry():
    assert get_ops("torch_compact") is CompactTorchOps is OPS_REGISTRY["torch_compact"]
    with pytest.raises(KeyError, match="unknown backend 'nope'.*torch_compact"):
        get_ops("nope")
    with pytest.raises(TypeError, match="lacks"):
        register_ops(object())


def test_unknown_backend_names_a_backend_module_that_did_not_import(monkeypatch):
    """A backend whose module cannot import (warp-lang missing) is named as such, not just as unknown."""
    from fovi_lab.ops import registry
    monkeypatch.setattr(registry, "OPTIONAL_BACKEND_MODULES", ("fovi_lab.no_such_backend_module",))
    monkeypatch.setattr(registry, "_IMPORT_ERRORS", {})
    with pytest.raises(KeyError, match=r"unknown backend 'warp_x'.*fovi_lab.no_such_backend_module did not import: "
                                       r"ModuleNotFoundError"):
        get_ops("warp_x")
    import sys
    import types
    monkeypatch.setitem(sys.modules, "fovi_lab.no_such_backend_module", types.ModuleType("x"))   # it imports now
    with pytest.raises(KeyError) as err:
        get_ops("warp_x")
    assert "did not import" not in str(err.value), "an earlier import failure is still given as the reason"

    class Doubling(CompactTorchOps):
        name = "test_doubling"

        @staticmethod
        def forward(meta, x, weight, bias):
            return 2 * CompactTorchOps.forward(meta, x, weight, bias)

    register_ops(Doubling)
    try:
        meta, _, _ = _small()
        x = torch.randn(2, meta.cin, meta.nin)
        w = torch.randn(meta.cout, meta.q)
        torch.testing.assert_close(KNNConvFunction.apply(x, w, None, meta, "test_doubling"),
                                   2 * CompactTorchOps.forward(meta, x, w, None))
    finally:
        OPS_REGISTRY.pop("test_doubling")


def test_knnconv_module_trains_and_keeps_tables_out_of_state_dict():
    torch.manual_seed(0)
    meta, idx, rf = _small(cin=2, cout=3, nin=20, nout=7, k=5, v=9, pads=6)
    layer = KNNConv(idx, rf, nin=20, v=9, cin=2, cout=3, bias=True)
    assert set(layer.state_dict()) == {"weight", "bias"}
    x = torch.randn(4, 2, 20)
    y = layer(x)
    assert layer.last_backend == "torch_compact"
    torch.testing.assert_close(y, oracle_forward(x, layer.weight, layer.bias, idx, rf, 9), rtol=0, atol=1e-5)
    opt = torch.optim.SGD(layer.parameters(), lr=0.05)
    target = torch.randn_like(y)
    losses = []
    for _ in range(20):
        loss = (layer(x) - target).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]
    with pytest.raises(ValueError, match="backend: unknown backend 'nope'"):   # refused at construction
        KNNConv(idx, rf, nin=20, v=9, cin=2, cout=3, backend="nope")


@pytest.mark.parametrize("needs", [(True, True, True), (False, True, True), (True, False, False), (True, True, False)],
                         ids=["x-w-b", "w-b", "x", "x-w"])
def test_warp_train_step_is_its_ops_calls_bit_for_bit(needs):
    """KNNConv with warp_train takes the ops' train step (``step_forward`` / ``step_backward``: the casts and the bias
    gradient inside one call per direction); its y, dx, dW and db are bitwise what the ops' forward and adjoints give
    on the operands cast to the compute dtype (fp32 master weights under CPU autocast, an fp32 x), with the gradients
    cast back to the operands' dtypes and db the fp32 sum of grad_y; and a gradient nobody asks for is not computed."""
    pytest.importorskip("warp")
    from fovi_lab.knn_warp import WarpTrainOps
    from fovi_lab.graph.meta import SYNTHETIC_SHAPES
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES["ODD"]
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=5)
    need_x, need_w, need_b = needs
    conv = KNNConv(idx, rf, nin=nin, v=v, cin=cin, cout=cout, backend="warp_train", bias=True)
    conv.weight.requires_grad_(need_w)
    conv.bias.requires_grad_(need_b)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, cin, nin, generator=gen).requires_grad_(need_x)
    g = torch.randn(3, cout, nout, generator=gen).half()
    with torch.autocast("cpu", dtype=torch.float16):
        y = conv(x)
    y.backward(g)
    meta = conv.meta
    h = torch.float16
    want_y = WarpTrainOps.forward(meta, x.detach().to(h), conv.weight.detach().to(h), conv.bias.detach().to(h))
    dx, dw = WarpTrainOps.backward_combined(meta, g, x.detach().to(h), conv.weight.detach().to(h))
    assert y.dtype == h and torch.equal(y, want_y)
    assert (x.grad is not None) == need_x and (conv.weight.grad is not None) == need_w
    assert (conv.bias.grad is not None) == need_b
    if need_x:
        assert x.grad.dtype == torch.float32 and torch.equal(x.grad, dx.float())
    if need_w:
        assert conv.weight.grad.dtype == torch.float32 and torch.equal(conv.weight.grad, dw.float())
    if need_b:
        assert torch.equal(conv.bias.grad, g.sum((0, 2), dtype=torch.float32))
