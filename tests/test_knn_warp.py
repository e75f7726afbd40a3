"""The seed's public surface (fovi_lab.knn_warp) and the warp_compact / warp_train ops end to end."""

import pytest
import torch

import fovi_lab.knn_warp as knn_warp
from fovi_lab.ops.autograd import OPS_REGISTRY, KNNConv, KNNConvFunction, get_ops
from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.ops.reference import oracle_forward

SEED_API = [
    "_make_uncached_r2_kernel", "_make_uncached_r4_kernel", "_canary_launch_ok", "_get_uncached_batch_config",
    "_select_uncached_batch_config", "_pad_bias_to_tiles", "run_cached", "run_uncached",
    "_make_grad_input_stage2_kernel", "_make_grad_weight_stage2_kernel", "_make_grad_weight_stage3_kernel",
    "_make_grad_weight_stage4_kernel", "_canary_grad_stage_ok", "_get_grad_kernel", "_pad_flat_input_fp16",
    "grad_input", "grad_weight", "WarpCompactOps", "WarpTrainOps", "_register_ops",
    "_UNCACHED_BATCH_CONFIG_SPECS",
]


def test_seed_api_is_importable():
    missing = [n for n in SEED_API if not hasattr(knn_warp, n)]
    assert not missing


def test_ops_are_registered():
    assert get_ops("warp_train") is knn_warp.WarpTrainOps is OPS_REGISTRY["warp_train"]
    assert get_ops("warp_compact") is knn_warp.WarpCompactOps
    meta, _, _ = _case()
    with pytest.raises(NotImplementedError, match="warp_train"):
        knn_warp.WarpCompactOps.grad_input(meta, None, None)
    with pytest.raises(NotImplementedError, match="warp_train"):
        knn_warp.WarpCompactOps.grad_weight(meta, None, None)


def _case(name="ODD", seed=0):
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[name]
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    return build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin), idx, rf


@pytest.mark.parametrize("name", ["ODD", "PAD_HEAVY"])
def test_warp_train_through_autograd_matches_the_oracle(name):
    meta, idx, rf = _case(name)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(17, meta.cin, meta.nin, generator=g).half().requires_grad_()
    w = (torch.randn(meta.cout, meta.q, generator=g) / (meta.cin * meta.k) ** 0.5).requires_grad_()  # fp32 master
    b = torch.randn(meta.cout, generator=g).requires_grad_()
    y = KNNConvFunction.apply(x, w, b, meta, "warp_train")
    assert y.dtype == torch.float16 and y.shape == (17, meta.cout, meta.nout)
    gy = torch.randn(y.shape, generator=g).half()
    y.backward(gy)
    assert x.grad.dtype == torch.float16 and w.grad.dtype == torch.float32 and b.grad.dtype == torch.float32
    # the fp64 oracle on the same (fp16-rounded) operands
    x64 = x.detach().double().requires_grad_()
    w64 = w.detach().half().double().requires_grad_()
    b64 = b.detach().half().double().requires_grad_()
    y64 = oracle_forward(x64, w64, b64, idx, rf, meta.v, dtype=torch.float64)
    dx64, dw64, db64 = torch.autograd.grad(y64, (x64, w64, b64), gy.double())
    # criterion (docs/operator.md §5): within 3x the same-dtype torch reference's error + 2e-3
    xr, wr = x.detach().clone().requires_grad_(), w.detach().half().requires_grad_()
    yr = KNNConvFunction.apply(xr, wr, b.detach().half(), meta, "torch_compact")
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), gy)
    for got, ref, exact in ((y, yr, y64), (x.grad, dxr, dx64), (w.grad, dwr, dw64)):
        ref_err = (ref.double() - exact).abs().max().item()
        assert (got.double() - exact).abs().max().item() <= 3 * ref_err + 2e-3
    torch.testing.assert_close(b.grad.double(), db64, rtol=1e-3, atol=1e-3)


def test_warp_ops_reject_non_fp16():
    meta, _, _ = _case()
    x = torch.randn(2, meta.cin, meta.nin)
    w = torch.randn(meta.cout, meta.q)
    with pytest.raises(TypeError, match="x"):
        knn_warp.WarpTrainOps.forward(meta, x, w, None)


def test_knnconv_module_with_warp_train_backend():
    meta, idx, rf = _case("ODD")
    torch.manual_seed(0)
    layer = KNNConv(idx, rf, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout, backend="warp_train")
    x = torch.randn(4, meta.cin, meta.nin).half()
    y = layer(x)
    assert layer.last_backend == "warp_train" and y.dtype == torch.float16
    y.float().square().mean().backward()
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()
