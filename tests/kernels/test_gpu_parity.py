"""GPU parity: every real layer's Warp ops against the references on a CUDA device (skipped without one).

CI runs every kernel on Warp's CPU device on small shapes (``tests/kernels/*/test_warp_*.py``); this file is what a
GPU machine runs on the real layers of :data:`fovi_lab.graph.layers.LAYERS`, at B = 1, 17 and 64:

* ``warp_compact``'s forward (the config the rules select there, the tensor-core kernels included) against
  the fp32 oracle;
* ``warp_train``'s dx and dW (tensor cores, fused or staged, as its rules select) against autograd through the fp32 oracle,
  and bitwise equal when run twice;
* the staged kernels (``fovi_lab.kernels.adjoint.grad_input`` / ``grad_weight``, default configs) likewise;
* in bf16 at B = 17 and 64: ``warp_compact``'s forward (the tensor-core kernels) and ``warp_train``'s dx and dW
  (the bf16 form of the adjoints the layer takes), bitwise repeatable;
* the tensor-core adjoints (``fovi_lab.kernels.adjoint.as_forward``: dx and dW as forwards of derived layers) at
  B = 17 and 64, in fp16 and bf16, bitwise repeatable;
* dx on the tap-expanded layer (``grad_input_taps``, ``FOVI_KNN_DX_PATH=taps``) on every layer at B = 17 and 64,
  whole and in batch chunks of a small stage budget, and through ``warp_train``'s backward under the switch.

The criterion is the project's: within 3x the error of ``torch_compact`` in the same dtype on the same rounded
inputs, plus 2e-3. Every Warp output buffer is written by the kernels (the tests of the CPU device prefill them
with NaN); a non-finite entry fails here too.
"""

from __future__ import annotations

import os

import pytest
import torch

from fovi_lab.graph.layers import LAYERS, layer_meta
from fovi_lab.ops.reference import CompactTorchOps, oracle_forward

#: ``FOVI_TEST_PARITY_DEVICE=cpu`` runs the same checks on Warp's CPU device (slow: pick a layer with -k)
DEVICE = os.environ.get("FOVI_TEST_PARITY_DEVICE", "cuda:0")
pytestmark = pytest.mark.skipif(DEVICE.startswith("cuda") and not torch.cuda.is_available(),
                                reason="needs a CUDA device")

BATCHES = (1, 17, 64)
_CASES = {}


def _case(layer: str, b: int, dtype=torch.float16):
    """(meta, x, w, bias, g, y_ref, dx_ref, dw_ref, errors of torch_compact in ``dtype``), on DEVICE, memoised."""
    key = (layer, b, dtype)
    if key not in _CASES:
        meta = layer_meta(layer, device=DEVICE)
        gen = torch.Generator().manual_seed(b)
        x = torch.randn(b, meta.cin, meta.nin, generator=gen).to(DEVICE, dtype)
        w = (torch.randn(meta.cout, meta.q, generator=gen) / (meta.cin * meta.k) ** 0.5).to(DEVICE, dtype)
        bias = torch.randn(meta.cout, generator=gen).to(DEVICE, dtype)
        g = torch.randn(b, meta.cout, meta.nout, generator=gen).to(DEVICE, dtype)
        xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
        y = oracle_forward(xf, wf, bias.float(), meta.idx, meta.rf_index, meta.v)
        dx, dw = torch.autograd.grad(y, (xf, wf), g.float())
        errs = ((CompactTorchOps.forward(meta, x, w, bias).float() - y).abs().max().item(),
                (CompactTorchOps.grad_input(meta, g, w).float() - dx).abs().max().item(),
                (CompactTorchOps.grad_weight(meta, g, x).float() - dw).abs().max().item())
        _CASES[key] = (meta, x, w, bias, g, y.detach(), dx, dw, errs)
    return _CASES[key]


def _within(got, want, ref_err, what):
    assert got.shape == want.shape, (what, tuple(got.shape), tuple(want.shape))
    assert torch.isfinite(got).all(), f"{what}: non-finite entries"
    err = (got.float() - want).abs().max().item()
    assert err <= 3 * ref_err + 2e-3, f"{what}: max err {err:.3g} > 3 x torch_compact's err {ref_err:.3g} + 2e-3"


@pytest.mark.parametrize("b", BATCHES)
@pytest.mark.parametrize("layer", list(LAYERS))
def test_gpu_warp_compact_forward(layer, b):
    from fovi_lab.knn_warp import WarpCompactOps
    meta, x, w, bias, _, y, _, _, errs = _case(layer, b)
    _within(WarpCompactOps.forward(meta, x, w, bias), y, errs[0], f"{layer} B={b} forward")


@pytest.mark.parametrize("b", BATCHES)
@pytest.mark.parametrize("layer", list(LAYERS))
def test_gpu_warp_train_grads_bitwise_repeatable(layer, b):
    from fovi_lab.kernels.adjoint.as_forward import select_grad_mma
    from fovi_lab.knn_warp import WarpTrainOps, grad_path
    meta, x, w, _, g, _, dx, dw, errs = _case(layer, b)
    got = WarpTrainOps.backward_combined(meta, g, x, w)
    again = WarpTrainOps.backward_combined(meta, g, x, w)
    on_mma = select_grad_mma(meta, b) is not None
    path = "tensor cores" if on_mma else grad_path(meta)
    _within(got[0], dx, errs[1], f"{layer} B={b} dx ({path})")
    _within(got[1], dw, errs[2], f"{layer} B={b} dW ({path})")
    assert torch.equal(got[0], again[0]) and torch.equal(got[1], again[1]), f"{layer} B={b}: not bitwise repeatable"


@pytest.mark.parametrize("b", (17, 64))
@pytest.mark.parametrize("layer", list(LAYERS))
def test_gpu_staged_grads(layer, b):
    from fovi_lab.kernels.adjoint import grad_input, grad_weight
    meta, x, w, _, g, _, dx, dw, errs = _case(layer, b)
    got_dx, got_dw = grad_input(meta, g, w), grad_weight(meta, g, x)
    _within(got_dx, dx, errs[1], f"{layer} B={b} staged dx")
    _within(got_dw, dw, errs[2], f"{layer} B={b} staged dW")
    assert torch.equal(got_dx, grad_input(meta, g, w)) and torch.equal(got_dw, grad_weight(meta, g, x))


@pytest.mark.parametrize("b", (17, 64))
@pytest.mark.parametrize("layer", list(LAYERS))
def test_gpu_bf16_forward_and_grads(layer, b):
    from fovi_lab.knn_warp import WarpCompactOps, WarpTrainOps
    meta, x, w, bias, g, y, dx, dw, errs = _case(layer, b, torch.bfloat16)
    got_y = WarpCompactOps.forward(meta, x, w, bias)
    assert got_y.dtype == torch.bfloat16
    _within(got_y, y, errs[0], f"{layer} B={b} bf16 forward")
    got = WarpTrainOps.backward_combined(meta, g, x, w)
    again = WarpTrainOps.backward_combined(meta, g, x, w)
    _within(got[0], dx, errs[1], f"{layer} B={b} bf16 dx")
    _within(got[1], dw, errs[2], f"{layer} B={b} bf16 dW")
    assert torch.equal(got[0], again[0]) and torch.equal(got[1], again[1]), f"{layer} B={b}: not bitwise repeatable"


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=("fp16", "bf16"))
@pytest.mark.parametrize("b", (17, 64))
@pytest.mark.parametrize("layer", list(LAYERS))
def test_gpu_tensor_core_adjoints(layer, b, dtype):
    from fovi_lab.kernels.adjoint.as_forward import grad_input_mma, grad_weight_mma
    meta, x, w, bias, g, y, dx, dw, errs = _case(layer, b, dtype)
    got_dx, got_dw = grad_input_mma(meta, g, w), grad_weight_mma(meta, g, x)
    _within(got_dx, dx, errs[1], f"{layer} B={b} {dtype} tensor-core dx")
    _within(got_dw, dw, errs[2], f"{layer} B={b} {dtype} tensor-core dW")
    assert torch.equal(got_dx, grad_input_mma(meta, g, w)) and torch.equal(got_dw, grad_weight_mma(meta, g, x))


@pytest.mark.parametrize("b", (17, 64))
@pytest.mark.parametrize("layer", list(LAYERS))
def test_gpu_tap_expanded_dx(layer, b):
    import fovi_lab.settings as settings
    from fovi_lab.kernels.adjoint.as_forward import grad_input_taps, taps_batch_chunk
    from fovi_lab.knn_warp import WarpTrainOps, grad_paths
    meta, x, w, _, g, _, dx, dw, errs = _case(layer, b)
    got = grad_input_taps(meta, g, w)
    _within(got, dx, errs[1], f"{layer} B={b} taps dx")
    assert torch.equal(got, grad_input_taps(meta, g, w)), f"{layer} B={b}: taps dx not bitwise repeatable"
    # a stage budget of 1 MiB: the batch in several chunks on every layer (each row's dx is its chunk's alone)
    with settings.override(FOVI_KNN_GRAD_STAGE_MIB=1):
        rows = taps_batch_chunk(meta, b)
        chunked = grad_input_taps(meta, g, w)
    assert rows < b, f"{layer} B={b}: one chunk of {rows} rows under a 1 MiB stage budget"
    _within(chunked, dx, errs[1], f"{layer} B={b} taps dx in chunks of {rows} rows")
    with settings.override(FOVI_KNN_DX_PATH="taps"):
        assert grad_paths(meta, b)[0] == "taps"
        step = WarpTrainOps.backward_combined(meta, g, x, w)
    _within(step[0], dx, errs[1], f"{layer} B={b} warp_train dx under FOVI_KNN_DX_PATH=taps")
    _within(step[1], dw, errs[2], f"{layer} B={b} warp_train dW under FOVI_KNN_DX_PATH=taps")
