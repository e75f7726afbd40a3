"""torch_compact and the effective-weight cache against the fp32 oracle and torch autograd (docs/operator.md §2-§3)."""

import pytest
import torch

from fovi_lab.ops.autograd import KNNConvFunction
from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.ops.reference import CompactTorchOps, build_effective_weight, oracle_forward, pad_flat_input


def _case(name, b, dtype=torch.float32, seed=0):
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[name]
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(b, cin, nin, generator=g).to(dtype)
    w = (torch.randn(cout, cin * v, generator=g) / (cin * k) ** 0.5).to(dtype)
    bias = torch.randn(cout, generator=g).to(dtype)
    return meta, idx, rf, x, w, bias


def _oracle_grads(x, w, bias, idx, rf, v, gy):
    x64 = x.double().requires_grad_()
    w64 = w.double().requires_grad_()
    b64 = bias.double().requires_grad_()
    y = oracle_forward(x64, w64, b64, idx, rf, v, dtype=torch.float64)
    return torch.autograd.grad(y, (x64, w64, b64), gy.double())


@pytest.mark.parametrize("name", list(SYNTHETIC_SHAPES))
@pytest.mark.parametrize("b", [1, 17])
def test_torch_compact_matches_oracle_fp32(name, b):
    meta, idx, rf, x, w, bias = _case(name, b)
    y_ref = oracle_forward(x, w, bias, idx, rf, meta.v, dtype=torch.float64)
    y = CompactTorchOps.forward(meta, x, w, bias)
    assert y.dtype == torch.float32 and y.shape == (b, meta.cout, meta.nout)
    torch.testing.assert_close(y.double(), y_ref, rtol=0, atol=2e-5)
    gy = torch.randn_like(y)
    dx_ref, dw_ref, _ = _oracle_grads(x, w, bias, idx, rf, meta.v, gy)
    dx = CompactTorchOps.grad_input(meta, gy, w)
    dw = CompactTorchOps.grad_weight(meta, gy, x)
    assert dx.dtype == torch.float32 and dw.dtype == torch.float32
    torch.testing.assert_close(dx.double(), dx_ref, rtol=0, atol=5e-5)
    torch.testing.assert_close(dw.double(), dw_ref, rtol=0, atol=5e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_torch_compact_low_precision_within_tolerance_of_fp32_oracle(dtype):
    meta, idx, rf, x, w, bias = _case("MAIN", 9, dtype=dtype)
    y = CompactTorchOps.forward(meta, x, w, bias)
    assert y.dtype == dtype
    y_ref = oracle_forward(x.float(), w.float(), bias.float(), idx, rf, meta.v)
    assert (y.float() - y_ref).abs().max() < (3e-2 if dtype == torch.bfloat16 else 3e-3)


def test_chunking_under_a_tiny_budget_gives_identical_results(monkeypatch):
    meta, idx, rf, x, w, bias = _case("MAIN", 5)
    gy = torch.randn(5, meta.cout, meta.nout)
    full = (CompactTorchOps.forward(meta, x, w, bias), CompactTorchOps.grad_input(meta, gy, w),
            CompactTorchOps.grad_weight(meta, gy, x))
    monkeypatch.setenv("FOVI_KNN_STAGE_MIB", "0.01")  # ~10 KB: one node per chunk
    chunked = (CompactTorchOps.forward(meta, x, w, bias), CompactTorchOps.grad_input(meta, gy, w),
               CompactTorchOps.grad_weight(meta, gy, x))
    for a, b in zip(full, chunked):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_pad_semantics():
    meta, idx, rf, x, w, bias = _case("PAD_HEAVY", 3)
    xpad = pad_flat_input(x, meta)
    # input pads (pad neighbours and p >= P fillers) gather an exact zero
    gathered = xpad[:, meta.input_linear_flat].view(3, meta.nout, meta.p64)
    is_pad = (meta.input_linear == meta.pad_column).unsqueeze(0).expand_as(gathered)
    assert is_pad.any() and (gathered[is_pad] == 0).all()
    # dA at pad entries is non-zero, yet never reaches dx: dx equals autograd of the oracle
    gy = torch.randn(3, meta.cout, meta.nout)
    wt = w.t()[meta.weight_linear_flat].view(meta.nout, meta.p64, meta.cout)
    da = torch.einsum("bon,npo->bnp", gy, wt)
    assert da[is_pad].abs().max() > 0
    dx_ref, dw_ref, _ = _oracle_grads(x, w, bias, idx, rf, meta.v, gy)
    torch.testing.assert_close(CompactTorchOps.grad_input(meta, gy, w).double(), dx_ref, rtol=0, atol=5e-5)
    # weight pads (p >= P fillers point at row 0) scatter exact zeros: a graph whose only use of
    # weight column 0 is through pads has a zero gradient there.
    dweff = torch.einsum("bnp,bon->npo", gathered, gy)
    assert (dweff[is_pad[0]] == 0).all()
    torch.testing.assert_close(CompactTorchOps.grad_weight(meta, gy, x).double(), dw_ref, rtol=0, atol=5e-5)


def test_effective_weight_cache():
    meta, idx, rf, x, w, bias = _case("ODD", 4)
    weff = build_effective_weight(meta, w)
    assert weff.shape == (meta.nout, meta.p64, 64) and weff.is_contiguous()
    assert (weff[:, meta.p:, :] == 0).all() and (weff[:, :, meta.cout:] == 0).all()
    xpad = pad_flat_input(x, meta)
    a = xpad[:, meta.input_linear_flat].view(4, meta.nout, meta.p64)
    y = torch.einsum("bnp,npo->bon", a, weff)[:, :meta.cout] + bias.view(1, -1, 1)
    torch.testing.assert_close(y, CompactTorchOps.forward(meta, x, w, bias), rtol=0, atol=1e-5)


def test_bad_inputs_name_the_argument():
    meta, idx, rf, x, w, bias = _case("ODD", 2)
    with pytest.raises(ValueError, match="x: expected shape"):
        CompactTorchOps.forward(meta, x[:, :-1], w, bias)
    with pytest.raises(ValueError, match="weight: expected shape"):
        CompactTorchOps.forward(meta, x, w[:, :-1], bias)
    with pytest.raises(TypeError, match="weight: expected dtype"):
        CompactTorchOps.forward(meta, x, w.double(), bias)
    with pytest.raises(ValueError, match="bias: expected shape"):
        CompactTorchOps.forward(meta, x, w, bias[:-1])
    with pytest.raises(ValueError, match="weight: expected a tensor with values on cpu or cuda, got one on the meta"):
        CompactTorchOps.forward(meta, x, w.to("meta"), bias)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="weight: expected device cpu"):
            CompactTorchOps.forward(meta, x, w.cuda(), bias)
    with pytest.raises(ValueError, match="weight: expected shape"):
        build_effective_weight(meta, w.t())


def test_torch_compact_on_a_real_fovi_layer():
    from fovi_lab.graph.layers import layer_graph

    graph = layer_graph("res18_layer3_0", rf="rf1")  # 60 -> 16 nodes, 21% pads, rf1 tap collisions
    meta = graph.meta(128, 256)
    assert graph.collision_rate > 0.05
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 128, graph.nin, generator=g)
    w = torch.randn(256, meta.q, generator=g) / 30
    gy = torch.randn(5, 256, graph.nout, generator=g)
    y_ref = oracle_forward(x, w, None, graph.idx, graph.rf_index, graph.v, dtype=torch.float64)
    torch.testing.assert_close(CompactTorchOps.forward(meta, x, w, None).double(), y_ref, rtol=0, atol=1e-4)
    dx_ref, dw_ref, _ = _oracle_grads(x, w, torch.zeros(256), graph.idx, graph.rf_index, graph.v, gy)
    torch.testing.assert_close(CompactTorchOps.grad_input(meta, gy, w).double(), dx_ref, rtol=0, atol=1e-4)
    torch.testing.assert_close(CompactTorchOps.grad_weight(meta, gy, x).double(), dw_ref, rtol=0, atol=1e-4)
