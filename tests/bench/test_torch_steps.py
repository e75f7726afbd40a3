"""The hand-written PyTorch train steps the benchmark times beside the backends equal the fp32 oracle's forward
and autograd gradients (on shapes that hurt: B not a tile multiple, heavy padding, Cout below a tile)."""

import pytest
import torch

from fovi_lab.bench.backward_impls import torch_steps
from fovi_lab.graph.layers import synthetic_meta
from fovi_lab.ops.reference import oracle_forward


@pytest.mark.parametrize("shape", ["MAIN", "ODD", "PAD_HEAVY"])
@pytest.mark.parametrize("b", [1, 5])
def test_explicit_steps_equal_the_oracle(shape, b):
    meta = synthetic_meta(shape)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(b, meta.cin, meta.nin, generator=gen, dtype=torch.float64)
    w = torch.randn(meta.cout, meta.q, generator=gen, dtype=torch.float64)
    g = torch.randn(b, meta.cout, meta.nout, generator=gen, dtype=torch.float64)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    y_ref = oracle_forward(xr, wr, None, meta.idx, meta.rf_index, meta.v)
    dx_ref, dw_ref = torch.autograd.grad(y_ref, (xr, wr), g)
    for name, step in torch_steps(meta).items():
        y, dx, dw = step(x.float(), w.float(), g.float())
        assert dx.dtype == dw.dtype == torch.float32, name
        torch.testing.assert_close(y.double(), y_ref.detach().double(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(dx.double(), dx_ref.double(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(dw.double(), dw_ref.double(), rtol=1e-4, atol=1e-4)
