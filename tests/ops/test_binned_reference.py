"""The binned PyTorch baseline (fovi_lab.ops.reference.binned_forward, ``torch_binned_mm`` in the benchmarks):
docs/operator.md §1.4's "bin by one-hot, then one matmul" with the compact tables, against the fp32 oracle and the
torch_compact gradients, on irregular shapes (collisions, heavy padding, Nout not a tile multiple)."""

from __future__ import annotations

import math

import pytest
import torch

from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.ops.reference import (FOLD_BELOW_NODES, THIN_COLUMNS, CompactTorchOps, binned_forward, oracle_forward,
                                   shared_matmul)

STEM = (3, 24, 200, 37, 42, 49, 25)      # Cin = 3, V ~ K (rf1-like: collisions), 25 pad entries
FEW_NODES = (16, 40, 30, 3, 5, 9, 2)     # 3 output nodes: the CPU products run as one GEMM (shared_matmul)
ONE_TAP = (64, 40, 50, 37, 1, 1, 0)      # K = V = 1 (a 1x1 convolution): binning is a gather along the nodes
ONE_TAP_PADS = (16, 24, 30, 29, 1, 1, 7)  # the same with 7 output nodes that have no neighbour
ONE_TAP_FEW = (8, 12, 9, 3, 1, 1, 1)     # 3 output nodes, one without a neighbour
SHAPES = ("MAIN", "ODD", "PAD_HEAVY", STEM, FEW_NODES, ONE_TAP, ONE_TAP_PADS, ONE_TAP_FEW, (8, 12, 20, 17, 1, 2, 3))


def _problem(shape, b, seed=0):
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[shape] if isinstance(shape, str) else shape
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    g = torch.Generator().manual_seed(3 + b)
    x = torch.randn(b, cin, nin, generator=g)
    w = torch.randn(cout, cin * v, generator=g) / math.sqrt(cin * k)
    gy = torch.randn(b, cout, nout, generator=g)
    return meta, x, w, gy


@pytest.mark.parametrize("shape", SHAPES)
def test_binned_forward_matches_the_oracle_and_torch_compact_grads(shape):
    meta, x, w, gy = _problem(shape, 5)
    bias = torch.randn(meta.cout)
    y = binned_forward(meta, x, w, bias)
    ref = oracle_forward(x, w, bias, meta.idx, meta.rf_index, meta.v)
    assert y.shape == ref.shape
    assert torch.allclose(y, ref, atol=1e-4, rtol=1e-4)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    binned_forward(meta, xr, wr).backward(gy)
    assert torch.allclose(xr.grad, CompactTorchOps.grad_input(meta, gy, w), atol=1e-4, rtol=1e-4)
    assert torch.allclose(wr.grad, CompactTorchOps.grad_weight(meta, gy, x), atol=1e-3, rtol=1e-4)


def test_binned_forward_fp16_and_bad_arguments():
    meta, x, w, _ = _problem(STEM, 3)
    y16 = binned_forward(meta, x.half(), w.half())
    ref = oracle_forward(x.half(), w.half(), None, meta.idx, meta.rf_index, meta.v)
    ref16 = oracle_forward(x.half(), w.half(), None, meta.idx, meta.rf_index, meta.v, dtype=torch.float16)
    assert y16.dtype == torch.float16
    assert float((y16.float() - ref).abs().max()) <= 3 * float((ref16.float() - ref).abs().max()) + 2e-3
    with pytest.raises(ValueError, match="weight"):
        binned_forward(meta, x, w[:, :-1])
    with pytest.raises(ValueError, match="x"):
        binned_forward(meta, x[:, :2], w)


# ------------------------------------------------------------------------------------ the torch_binned backend

from fovi_lab.ops.autograd import KNNConv, KNNConvFunction, get_ops  # noqa: E402
from fovi_lab.ops.reference import BinnedTorchOps  # noqa: E402


@pytest.mark.parametrize("shape", SHAPES)
def test_binned_ops_gradients_match_torch_compact(shape):
    """fp32: equal to torch_compact's adjoints up to summation order; fp16: within 3x torch_compact's own
    fp16 error (against the fp32 adjoints) + 2e-3 of the gradient's scale."""
    meta, x, w, gy = _problem(shape, 17)
    rdx, rdw = CompactTorchOps.grad_input(meta, gy, w), CompactTorchOps.grad_weight(meta, gy, x)
    assert torch.allclose(BinnedTorchOps.grad_input(meta, gy, w), rdx, atol=1e-4, rtol=1e-4)
    assert torch.allclose(BinnedTorchOps.grad_weight(meta, gy, x), rdw, atol=1e-3, rtol=1e-4)
    x16, w16, g16 = x.half(), w.half(), gy.half()
    for got, ref16, ref in ((BinnedTorchOps.grad_input(meta, g16, w16), CompactTorchOps.grad_input(meta, g16, w16), rdx),
                            (BinnedTorchOps.grad_weight(meta, g16, x16), CompactTorchOps.grad_weight(meta, g16, x16), rdw)):
        assert got.dtype == torch.float32
        tol = 3 * float((ref16 - ref).abs().max()) + 2e-3 * float(ref.abs().max())
        assert float((got - ref).abs().max()) <= tol


@pytest.mark.parametrize("shape", (ONE_TAP, ONE_TAP_PADS, ONE_TAP_FEW))
def test_one_tap_layers_gather_along_the_nodes_bit_for_bit(shape, monkeypatch):
    """A K = V = 1 layer bins by a gather along the node axis and scatters its dx along it: on the CPU the same
    values bit for bit as binning over the flattened channel-node columns (the same sums in the same order)."""
    import fovi_lab.ops.reference as reference
    meta, x, w, gy = _problem(shape, 6)
    assert reference._one_tap(meta) is not None
    x_before = x.clone()
    fast = (binned_forward(meta, x, w), BinnedTorchOps.grad_input(meta, gy, w), BinnedTorchOps.grad_weight(meta, gy, x))
    monkeypatch.setattr(reference, "_one_tap", lambda meta: None)
    general = (binned_forward(meta, x, w), BinnedTorchOps.grad_input(meta, gy, w),
               BinnedTorchOps.grad_weight(meta, gy, x))
    for a, b in zip(fast, general):
        assert a.dtype == b.dtype and torch.equal(a, b)
    assert torch.equal(x, x_before)                                  # the input is not written


@pytest.mark.parametrize("batch, nodes", [(5, 1), (5, 2), (5, FOLD_BELOW_NODES - 1), (5, FOLD_BELOW_NODES), (5, 13),
                                          (1, 1), (1, 2), (THIN_COLUMNS - 1, 1), (THIN_COLUMNS // 2, 2)])
def test_shared_matmul_is_the_batched_product(batch, nodes):
    """Every path: the batched matmul, the folded GEMM and its transposed form (2 to THIN_COLUMNS - 1 columns)."""
    g = torch.Generator().manual_seed(nodes)
    w, t = torch.randn(24, 19, generator=g), torch.randn(batch, 19, nodes, generator=g)
    got = shared_matmul(w, t)
    assert got.shape == (batch, 24, nodes) and got.is_contiguous()
    torch.testing.assert_close(got, torch.matmul(w, t))
    w, t = w.double(), t.double()
    torch.testing.assert_close(shared_matmul(w, t), torch.einsum("mk,bkn->bmn", w, t), rtol=1e-12, atol=1e-12)


def test_binned_ops_chunk_over_the_batch(monkeypatch):
    """A stage budget below one image: one image per chunk, same results."""
    meta, x, w, gy = _problem("ODD", 9)
    whole = (binned_forward(meta, x, w), BinnedTorchOps.grad_input(meta, gy, w), BinnedTorchOps.grad_weight(meta, gy, x))
    monkeypatch.setenv("FOVI_KNN_STAGE_MIB", "0.0001")
    chunked = (binned_forward(meta, x, w), BinnedTorchOps.grad_input(meta, gy, w), BinnedTorchOps.grad_weight(meta, gy, x))
    assert torch.allclose(whole[0], chunked[0], atol=1e-5) and torch.equal(whole[1], chunked[1])
    assert torch.allclose(whole[2], chunked[2], atol=1e-4, rtol=1e-5)


def test_torch_binned_is_a_registered_backend_end_to_end():
    assert get_ops("torch_binned") is BinnedTorchOps
    meta, x, w, gy = _problem(STEM, 4)
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: KNNConvFunction.apply(a, b, None, meta, "torch_binned"), (xd, wd),
                                    eps=1e-6, atol=1e-6)
    layer = KNNConv(meta.idx, meta.rf_index, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout, bias=True,
                    backend="torch_binned")
    ref = KNNConv(meta.idx, meta.rf_index, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout, bias=True,
                  backend="torch_compact")
    ref.load_state_dict(layer.state_dict())
    xr = x.clone().requires_grad_()
    layer(xr).square().sum().backward()
    xc = x.clone().requires_grad_()
    ref(xc).square().sum().backward()
    assert layer.last_backend == "torch_binned"
    assert torch.allclose(xr.grad, xc.grad, atol=1e-3, rtol=1e-4)
    assert torch.allclose(layer.weight.grad, ref.weight.grad, atol=1e-2, rtol=1e-4)
    assert torch.allclose(layer.bias.grad, ref.bias.grad, atol=1e-3)


@pytest.mark.parametrize("shape", [(5,), (3, 7), (2, 4, 9)])
def test_take_last_is_index_select_along_the_last_axis(shape):
    from fovi_lab.ops.reference import take_last
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randn(*shape, generator=g)
    for index in (torch.randint(0, shape[-1], (13,), generator=g), torch.zeros(0, dtype=torch.int64),
                  torch.arange(shape[-1]).flip(0)):
        got = take_last(x, index)
        assert got.is_contiguous() and torch.equal(got, x.index_select(x.dim() - 1, index))
