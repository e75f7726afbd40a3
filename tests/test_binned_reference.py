"""The binned PyTorch baseline (fovi_lab.reference.binned_forward, ``torch_binned_mm`` in the benchmarks):
spec §1.4's "bin by one-hot, then one matmul" with the compact tables, against the fp32 oracle and the
torch_compact gradients, on irregular shapes (collisions, heavy padding, Nout not a tile multiple)."""

from __future__ import annotations

import math

import pytest
import torch

from fovi_lab.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.reference import CompactTorchOps, binned_forward, oracle_forward

STEM = (3, 24, 200, 37, 42, 49, 25)      # Cin = 3, V ~ K (rf1-like: collisions), 25 pad entries


def _problem(shape, b, seed=0):
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[shape] if isinstance(shape, str) else shape
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    g = torch.Generator().manual_seed(3 + b)
    x = torch.randn(b, cin, nin, generator=g)
    w = torch.randn(cout, cin * v, generator=g) / math.sqrt(cin * k)
    gy = torch.randn(b, cout, nout, generator=g)
    return meta, x, w, gy


@pytest.mark.parametrize("shape", ("MAIN", "ODD", "PAD_HEAVY", STEM))
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
