"""dx on tensor cores (``fovi_lab.kernels.adjoint.mma_dx``): the forward of the transposed layer, on Warp's CPU
device (the mma kernels' CPU branch).

Criterion as for the fused bf16 adjoints (docs/operator.md §5): fp16 / bf16 products are exact in fp32 and the
kernels accumulate in fp32, so dx must equal the fp32 oracle's on the same rounded operands up to fp32 summation
order, within ``1e-4 * (1 + max |oracle|)``; one rounding of dx to fp16 (2^-11 relative) would exceed it. dx is
fp32, written whole (an input node no output reads gets exact zeros) and bitwise repeatable.
"""

import pytest
import torch

from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph, transposed_meta
from fovi_lab.kernels import forward as F
from fovi_lab.kernels.adjoint.mma_dx import grad_input_mma, transposed_weight
from fovi_lab.ops.reference import oracle_forward

SPLIT = [c for c in F.uncached_config_names() if F.config_spec(c).family in ("mmas", "mmasw")]
_CASES = {}


def _case(name, b, dtype, seed=3):
    key = (name, b, dtype, seed)
    if key not in _CASES:
        cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[name]
        idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
        meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
        gen = torch.Generator().manual_seed(seed + 5)
        w = (torch.randn(cout, cin * v, generator=gen) / (cin * k) ** 0.5).to(dtype)
        g = torch.randn(b, cout, nout, generator=gen).to(dtype)
        xf = torch.zeros(b, cin, nin, requires_grad=True)
        y = oracle_forward(xf, w.float(), None, meta.idx, meta.rf_index, v)
        dx_o, = torch.autograd.grad(y, (xf,), g.float())
        _CASES[key] = (meta, w, g, dx_o)
    return _CASES[key]


def _assert_fp32_exact(got, want, what):
    assert got.dtype == torch.float32 and got.shape == want.shape, (what, got.dtype, got.shape)
    assert torch.isfinite(got).all(), what
    err, tol = float((got - want).abs().max()), 1e-4 * (1.0 + float(want.abs().max()))
    assert err <= tol, f"{what}: max err {err:.3g} > {tol:.3g}"


def test_the_transposed_layer_lists_every_entry_once_with_its_tap():
    meta, _, _, _ = _case("PAD_HEAVY", 1, torch.float16)
    t = transposed_meta(meta)
    assert (t.cin, t.cout, t.nin, t.nout, t.v) == (meta.cout, meta.cin, meta.nout, meta.nin, meta.v)
    real = [(int(n), int(m), int(r)) for m in range(meta.nin) for n, r in zip(t.idx[m], t.rf_index[m]) if n < meta.nout]
    want = sorted((n, int(meta.idx[n, k]), int(meta.rf_index[n, k])) for n in range(meta.nout) for k in range(meta.k)
                  if meta.idx[n, k] < meta.nin)
    assert sorted(real) == want
    assert transposed_meta(meta) is t                       # built once per meta


@pytest.mark.parametrize("config", SPLIT)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_every_split_config_gives_dx_in_fp32(config, dtype):
    for name, b in (("ODD", 17), ("PAD_HEAVY", 5), ("MAIN", 3)):
        meta, w, g, dx_o = _case(name, b, dtype)
        dx = grad_input_mma(meta, g, w, config)
        _assert_fp32_exact(dx, dx_o, f"{config} {name} B={b}")
        assert torch.equal(dx, grad_input_mma(meta, g, w, config)), "not bitwise repeatable"


def test_nodes_no_output_reads_get_exact_zeros_and_warp_train_opts_in(monkeypatch):
    from fovi_lab.knn_warp import WarpTrainOps
    meta, w, g, dx_o = _case("PAD_HEAVY", 5, torch.float16)
    unread = (meta.rev_rowptr[1:] == meta.rev_rowptr[:-1]).nonzero().squeeze(1)
    dx = grad_input_mma(meta, g, w)
    assert unread.numel() and torch.equal(dx[:, :, unread], torch.zeros_like(dx[:, :, unread]))
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "mma")
    x = torch.randn(5, meta.cin, meta.nin).half()
    got, dw = WarpTrainOps.backward_combined(meta, g, x, w)
    assert torch.equal(got, dx) and torch.equal(WarpTrainOps.grad_input(meta, g, w), dx)
    assert torch.equal(dw, WarpTrainOps.grad_weight(meta, g, x))
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "nope")
    with pytest.raises(ValueError, match="FOVI_KNN_DX_PATH: expected 'mma' or 'auto', got 'nope'"):
        WarpTrainOps.grad_input(meta, g, w)


def test_bad_requests_are_refused_with_the_argument_named():
    meta, w, g, _ = _case("ODD", 17, torch.float16)
    with pytest.raises(ValueError, match=r"config: an fp32 output needs a split tensor-core config .*'mma_o64b16'"):
        grad_input_mma(meta, g, w, "mma_o64b16")
    with pytest.raises(TypeError, match="grad_y: expected dtype torch.float16 or torch.bfloat16, got torch.float32"):
        grad_input_mma(meta, g.float(), w)
    with pytest.raises(TypeError, match=r"weight: expected dtype torch.float16 \(same as grad_y\)"):
        grad_input_mma(meta, g, w.bfloat16())
    with pytest.raises(ValueError, match=r"grad_y: expected shape \[B, Cout=7, Nout=33\]"):
        grad_input_mma(meta, g[:, :3], w)
    t = transposed_meta(meta)
    with pytest.raises(ValueError, match="out_dtype: expected None .* or torch.float32, got torch.float64"):
        F.run_uncached(g, transposed_weight(w, meta), None, t.input_linear, t.weight_linear, out_dtype=torch.float64)
