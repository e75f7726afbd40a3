"""Fused node-major adjoint kernels (fovi_lab.warp_adjoint_nm) on Warp's CPU device.

Same criterion as the staged kernels (spec §5): each gradient within 3x the fp16 torch_compact error
+ 2e-3 of torch autograd through the fp32 oracle, on the same fp16-rounded inputs. Outputs are
pre-filled with NaN before the launch, so an entry the kernel does not write fails the test.
"""

import pytest
import torch

from fovi_lab import warp_adjoint_nm as nm
from fovi_lab.knn_autograd import KNNConvFunction
from fovi_lab.meta import build_meta
from fovi_lab.reference import CompactTorchOps
from grad_cases import assert_within, grad_case

DX_NAMES = list(nm.DX_NM_CONFIG_SPECS)
DW_NAMES = list(nm.DW_NM_CONFIG_SPECS)


def _case(name, b, seed=0):
    return grad_case(name, b, seed, data_seed=11)


_assert_within = assert_within


def _run_nan_prefilled(plan):
    plan.out.fill_(float("nan"))
    plan.launch()
    return plan.finish()


@pytest.mark.parametrize("b", [1, 17, 130])
@pytest.mark.parametrize("config", DX_NAMES)
def test_dx_every_config_odd(config, b):
    meta, x, w, g, dx_o, _, e_dx, _ = _case("ODD", b)
    for store in ("direct", "staged"):
        plan = nm.plan_grad_input_nm(meta, g, w, config, store=store)
        _assert_within(_run_nan_prefilled(plan), dx_o, e_dx, f"{config} {store} B={b}")


@pytest.mark.parametrize("b", [1, 17, 130])
@pytest.mark.parametrize("config", DW_NAMES)
def test_dw_every_config_odd(config, b):
    meta, x, w, g, _, dw_o, _, e_dw = _case("ODD", b)
    for nsplit in (1, 3):
        plan = nm.plan_grad_weight_nm(meta, g, x, config, nsplit=nsplit)
        _assert_within(_run_nan_prefilled(plan), dw_o, e_dw, f"{config} x{nsplit} B={b}")


@pytest.mark.parametrize("tiled", [False, True], ids=["torch_finish", "tiled_finish"])
@pytest.mark.parametrize("config", DW_NAMES)
def test_dw_finish_paths(monkeypatch, config, tiled):
    """Both dW finishes (PyTorch's sum + transposing copy below ``_FINISH_TILED_MIN_BYTES``, the tiled
    kernel above): every dW config, 1 and 3 partials, NaN-prefilled partials, bitwise repeatable."""
    monkeypatch.setattr(nm, "_FINISH_TILED_MIN_BYTES", 0 if tiled else 1 << 40)
    meta, x, w, g, _, dw_o, _, e_dw = _case("PAD_HEAVY", 17)
    for nsplit in (1, 3):
        got = _run_nan_prefilled(nm.plan_grad_weight_nm(meta, g, x, config, nsplit=nsplit))
        _assert_within(got, dw_o, e_dw, f"{config} x{nsplit} {'tiled' if tiled else 'torch'} finish")
        assert torch.equal(got, nm.grad_weight_nm(meta, g, x, config, nsplit=nsplit))


@pytest.mark.parametrize("shape", ["MAIN", "PAD_HEAVY"])
@pytest.mark.parametrize("b", [17, 130])
def test_default_configs_main_pad_heavy(shape, b):
    meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case(shape, b)
    _assert_within(_run_nan_prefilled(nm.plan_grad_input_nm(meta, g, w)), dx_o, e_dx, f"dx {shape} B={b}")
    _assert_within(_run_nan_prefilled(nm.plan_grad_weight_nm(meta, g, x, nsplit=2)), dw_o, e_dw,
                   f"dW {shape} B={b}")


def test_only_pad_neighbours_give_exact_zeros():
    """Input nodes nobody reads get dx = 0; taps only pads fall into get dW = 0 (spec §3)."""
    nin, v, cin, cout = 6, 4, 3, 5
    idx = torch.tensor([[0, 6, 6], [1, 6, 0]])          # nodes 2..5 unread, tap 3 only on pads
    rf = torch.tensor([[0, 3, 3], [1, 3, 2]])
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, cin, nin, generator=gen).half()
    w = torch.randn(cout, cin * v, generator=gen).half()
    g = torch.randn(2, cout, 2, generator=gen).half()
    dx = _run_nan_prefilled(nm.plan_grad_input_nm(meta, g, w))
    dw = _run_nan_prefilled(nm.plan_grad_weight_nm(meta, g, x))
    assert torch.equal(dx[:, :, 2:], torch.zeros_like(dx[:, :, 2:]))
    assert torch.equal(dw.view(cout, cin, v)[:, :, 3], torch.zeros(cout, cin))
    torch.testing.assert_close(dx, CompactTorchOps.grad_input(meta, g.float(), w.float()), atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(dw, CompactTorchOps.grad_weight(meta, g.float(), x.float()), atol=2e-3, rtol=1e-3)


def test_bitwise_deterministic():
    meta, x, w, g, *_ = _case("MAIN", 17)
    dx = [nm.grad_input_nm(meta, g, w) for _ in range(3)]
    dw = [nm.grad_weight_nm(meta, g, x, nsplit=3) for _ in range(3)]
    assert all(torch.equal(dx[0], d) for d in dx[1:])
    assert all(torch.equal(dw[0], d) for d in dw[1:])


def test_backward_combined_matches_separate_and_staged_path(monkeypatch):
    from fovi_lab import knn_warp
    meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case("MAIN", 17)
    monkeypatch.delenv("FOVI_KNN_GRAD_PATH", raising=False)
    dx, dw = knn_warp.WarpTrainOps.backward_combined(meta, g, x, w)
    assert torch.equal(dx, knn_warp.WarpTrainOps.grad_input(meta, g, w))
    assert torch.equal(dw, knn_warp.WarpTrainOps.grad_weight(meta, g, x))
    _assert_within(dx, dx_o, e_dx, "combined dx")
    _assert_within(dw, dw_o, e_dw, "combined dW")
    monkeypatch.setenv("FOVI_KNN_GRAD_PATH", "staged")
    dxs, dws = knn_warp.WarpTrainOps.backward_combined(meta, g, x, w)
    assert torch.equal(dxs, knn_warp.grad_input(meta, g, w))
    _assert_within(dws, dw_o, e_dw, "staged dW")
    monkeypatch.setenv("FOVI_KNN_GRAD_PATH", "bogus")
    with pytest.raises(ValueError, match="FOVI_KNN_GRAD_PATH"):
        knn_warp.WarpTrainOps.grad_input(meta, g, w)


def test_autograd_end_to_end_through_warp_train(monkeypatch):
    monkeypatch.delenv("FOVI_KNN_GRAD_PATH", raising=False)
    meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case("ODD", 17)
    xr = x.clone().requires_grad_()
    wr = w.clone().requires_grad_()
    y = KNNConvFunction.apply(xr, wr, None, meta, "warp_train")
    y.backward(g)
    # gradients come back in the leaves' dtype (fp16 here): compare at fp16 resolution
    torch.testing.assert_close(xr.grad.float(), dx_o, atol=3 * e_dx + 2e-3 + 2e-2, rtol=2e-3)
    torch.testing.assert_close(wr.grad.float(), dw_o, atol=3 * e_dw + 2e-3 + 2e-2, rtol=2e-3)


def test_lists_cover_every_real_pair():
    meta, *_ = _case("PAD_HEAVY", 1)
    rowptr, rn, rv = nm.reverse_lists(meta)
    vrowptr, vn, vm, maxlen = nm.tap_lists(meta)
    real = int((meta.idx < meta.nin).sum())
    assert int(rowptr[-1]) == real == int(vrowptr[-1]) == rn.numel() == vn.numel()
    # every (n, tap, m) triple appears once in each list
    a = sorted(zip(rn.tolist(), rv.tolist(), torch.repeat_interleave(
        torch.arange(meta.nin), rowptr[1:].long() - rowptr[:-1].long()).tolist()))
    b_ = sorted(zip(vn.tolist(), torch.repeat_interleave(
        torch.arange(meta.v), vrowptr[1:].long() - vrowptr[:-1].long()).tolist(), vm.tolist()))
    assert a == b_
    assert maxlen == int((vrowptr[1:] - vrowptr[:-1]).max())


def test_config_selection_and_bad_inputs():
    assert nm.select_dx_nm_config(16, 3) == "dxn_m16n16k64"
    assert nm.select_dx_nm_config(64, 3) == "dxn_m64n16k64"
    assert nm.select_dx_nm_config(64, 64, nin=230) == "dxn_m64n64k64"
    assert nm.select_dx_nm_config(64, 256, nin=16) == "dxn_m16n16k64"      # under one wave of 64x64 CTAs
    assert nm.select_dx_nm_config(16, 96) == "dxn_m16n64k64"
    assert nm.select_dw_nm_config(96, 3) == "dwn_o64c16k64"
    assert nm.select_dw_nm_config(256, 96) == "dwn_o64c64k64"
    assert {nm.select_dx_nm_config(b, c, n) for b in (1, 16, 32, 64, 512) for c in (3, 64, 96, 256)
            for n in (None, 16, 4085)} <= set(nm.DX_NM_CONFIG_SPECS)
    assert {nm.select_dw_nm_config(o, c) for o in (64, 96, 256, 512) for c in (3, 64, 96, 256)} \
        <= set(nm.DW_NM_CONFIG_SPECS)
    meta, x, w, g, *_ = _case("ODD", 1)
    with pytest.raises(TypeError, match="grad_y"):
        nm.grad_input_nm(meta, g.float(), w)
    with pytest.raises(ValueError, match="weight"):
        nm.grad_input_nm(meta, g, w[:, :-1])
    with pytest.raises(ValueError, match="x"):
        nm.grad_weight_nm(meta, g, x[:, :, :-1])
    with pytest.raises(ValueError, match="nsplit"):
        nm.grad_weight_nm(meta, g, x, nsplit=0)
    with pytest.raises(KeyError, match="dxn"):
        nm.grad_input_nm(meta, g, w, config="dxn_nope")
    with pytest.raises(TypeError, match="meta"):
        nm.grad_input_nm("meta", g, w)


def test_capture_needs_cuda():
    from fovi_lab import graphs
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the CPU refusal path is not reachable")
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        graphs.capture(lambda: None)


def test_every_fused_kernel_compiles_aot_without_mathdx(tmp_path):
    """The fused dx/dW kernels' CUDA compiles for sm_80, sm_89 and sm_90 with no GPU (Warp's NVRTC, the
    scalar tile_matmul path; ~1 s per kernel and arch). Launch fit is the canary's job on the device."""
    import os
    from pathlib import Path
    from fovi_lab.warp_common import wp
    archs = [int(a) for a in os.environ.get("FOVI_TEST_AOT_ARCHS", "80,89,90").split(",") if a.strip()]
    for kind, name in nm.nm_grad_kernel_names():
        make = nm.make_dx_nm_kernel if kind == "dxn" else nm.make_dw_nm_kernel
        kernel = make(*nm._spec(kind, name), mathdx=False)
        for arch in archs:
            out = tmp_path / f"{name}_sm{arch}"
            files = wp.compile_aot_module(kernel.module, arch=arch, module_dir=str(out))
            files = [Path(f) for f in files or []]
            assert files and all(f".sm{arch}." in f.name and f.stat().st_size > 0 for f in files), (name, arch, files)
