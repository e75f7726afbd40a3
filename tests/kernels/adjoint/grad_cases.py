"""Shared cases of the adjoint tests (staged and fused): the accuracy criterion of docs/operator.md §5 on synthetic shapes.

Each gradient must lie within 3x the fp16 torch_compact error + 2e-3 of torch autograd through the fp32
oracle, both measured on the same fp16-rounded inputs.
"""

import torch

from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.ops.reference import CompactTorchOps, oracle_forward

_CASES = {}


def grad_case(name, b, seed=0, data_seed=7, dtype=torch.float16):
    """(meta, x, w, g, dx_oracle, dw_oracle, err_dx_torch, err_dw_torch), memoised: operands drawn from
    ``seed + data_seed`` and rounded to ``dtype``, the oracle's gradients on those rounded values."""
    key = (name, b, seed, data_seed, dtype)
    if key not in _CASES:
        cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[name]
        idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
        meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
        gen = torch.Generator().manual_seed(seed + data_seed)
        x = torch.randn(b, cin, nin, generator=gen).to(dtype)
        w = (torch.randn(cout, cin * v, generator=gen) / (cin * k) ** 0.5).to(dtype)
        g = torch.randn(b, cout, nout, generator=gen).to(dtype)
        xf = x.float().requires_grad_()
        wf = w.float().requires_grad_()
        y = oracle_forward(xf, wf, None, meta.idx, meta.rf_index, v)
        dx_o, dw_o = torch.autograd.grad(y, (xf, wf), g.float())
        e_dx = (CompactTorchOps.grad_input(meta, g, w) - dx_o).abs().max().item()
        e_dw = (CompactTorchOps.grad_weight(meta, g, x) - dw_o).abs().max().item()
        _CASES[key] = (meta, x, w, g, dx_o, dw_o, e_dx, e_dw)
    return _CASES[key]


def assert_within(got, want, ref_err, what):
    assert got.dtype == torch.float32 and got.shape == want.shape, (what, got.dtype, got.shape)
    assert torch.isfinite(got).all(), f"{what}: non-finite entries (an entry the kernels did not write?)"
    err = (got - want).abs().max().item()
    assert err <= 3 * ref_err + 2e-3, f"{what}: max err {err:.3g} > 3 x torch fp16 err {ref_err:.3g} + 2e-3"


def assert_fp32_exact(got, want, what):
    """fp32 accumulation of exact fp16 / bf16 products: equal to the oracle on the rounded operands up to fp32
    summation order, within ``1e-4 * (1 + max |oracle|)`` (docs/operator.md §5)."""
    assert got.dtype == torch.float32 and got.shape == want.shape, (what, got.dtype, got.shape)
    assert torch.isfinite(got).all(), f"{what}: non-finite entries (an entry the kernels did not write?)"
    err = float((got - want).abs().max())
    tol = 1e-4 * (1.0 + float(want.abs().max()))
    assert err <= tol, f"{what}: max err {err:.3g} > {tol:.3g} (fp32 accumulation of exact products)"
