"""The adjoints on tensor cores (``fovi_lab.kernels.adjoint.as_forward``): dx as the forward of the transposed layer,
dW as the forward of the tap layer, on Warp's CPU device (the mma kernels' CPU branch).

Criterion as for the fused bf16 adjoints (docs/operator.md §5): fp16 / bf16 products are exact in fp32 and the
kernels accumulate in fp32, so dx and dW must equal the fp32 oracle's on the same rounded operands up to fp32 summation
order, within ``1e-4 * (1 + max |oracle|)``; one rounding to fp16 (2^-11 relative) would exceed it. Both are fp32,
written whole (an input node no output reads, a tap no entry uses: exact zeros) and bitwise repeatable.
"""

import dataclasses

import pytest
import torch

from fovi_lab.graph.meta import build_meta, tap_meta, transposed_meta
from fovi_lab.kernels import forward as F
from fovi_lab.kernels.adjoint.as_forward import grad_input_mma, grad_weight_mma, transposed_weight
from grad_cases import assert_fp32_exact, grad_case

SPLIT = [c for c in F.uncached_config_names() if F.config_spec(c).variant in ("mmas", "mmasw")]


def _case(name, b, dtype, seed=3):
    """(meta, w, g, dx_oracle, x, dW_oracle), operands rounded to ``dtype``, the oracle on the rounded values."""
    meta, x, w, g, dx_o, dw_o = grad_case(name, b, seed=seed, data_seed=5, dtype=dtype)[:6]
    return meta, w, g, dx_o, x, dw_o


_assert_fp32_exact = assert_fp32_exact


def test_the_tap_layer_lists_every_real_entry_once_under_its_tap():
    meta, _, _, _, _, _ = _case("PAD_HEAVY", 1, torch.float16)
    t = tap_meta(meta, 5)
    assert (t.cin, t.cout, t.nin, t.nout, t.v) == (5, meta.cout, meta.nin, meta.v, meta.nout)
    got = sorted((tap, int(n), int(m)) for tap in range(meta.v) for m, n in zip(t.idx[tap], t.rf_index[tap])
                 if m < meta.nin)
    want = sorted((int(meta.rf_index[n, k]), n, int(meta.idx[n, k])) for n in range(meta.nout) for k in range(meta.k)
                  if meta.idx[n, k] < meta.nin)
    assert got == want and tap_meta(meta, 5) is t


def test_the_transposed_layer_lists_every_entry_once_with_its_tap():
    meta, _, _, _, _, _ = _case("PAD_HEAVY", 1, torch.float16)
    t = transposed_meta(meta)
    assert (t.cin, t.cout, t.nin, t.nout, t.v) == (meta.cout, meta.cin, meta.nout, meta.nin, meta.v)
    real = [(int(n), int(m), int(r)) for m in range(meta.nin) for n, r in zip(t.idx[m], t.rf_index[m]) if n < meta.nout]
    want = sorted((n, int(meta.idx[n, k]), int(meta.rf_index[n, k])) for n in range(meta.nout) for k in range(meta.k)
                  if meta.idx[n, k] < meta.nin)
    assert sorted(real) == want
    assert transposed_meta(meta) is t                       # built once per meta


@pytest.mark.parametrize("config", SPLIT)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_every_split_config_gives_dx_and_dw_in_fp32(config, dtype):
    for name, b in (("ODD", 17), ("PAD_HEAVY", 5), ("MAIN", 3)):
        meta, w, g, dx_o, x, dw_o = _case(name, b, dtype)
        dx = grad_input_mma(meta, g, w, config)
        _assert_fp32_exact(dx, dx_o, f"dx {config} {name} B={b}")
        assert torch.equal(dx, grad_input_mma(meta, g, w, config)), "dx not bitwise repeatable"
        dw = grad_weight_mma(meta, g, x, config)
        _assert_fp32_exact(dw, dw_o, f"dW {config} {name} B={b}")
        assert torch.equal(dw, grad_weight_mma(meta, g, x, config)), "dW not bitwise repeatable"


def test_unread_nodes_and_unused_taps_get_exact_zeros_and_warp_train_opts_in(monkeypatch):
    from fovi_lab.knn_warp import WarpTrainOps
    meta, w, g, dx_o, x, dw_o = _case("PAD_HEAVY", 5, torch.float16)
    unread = (meta.rev_rowptr[1:] == meta.rev_rowptr[:-1]).nonzero().squeeze(1)
    dx, dw = grad_input_mma(meta, g, w), grad_weight_mma(meta, g, x)
    assert unread.numel() and torch.equal(dx[:, :, unread], torch.zeros_like(dx[:, :, unread]))
    wide = build_meta(meta.idx, meta.rf_index, cin=meta.cin, cout=meta.cout, v=meta.v + 3, nin=meta.nin)   # 3 unused taps
    dw_wide = grad_weight_mma(wide, g, x).view(meta.cout, meta.cin, meta.v + 3)
    assert torch.equal(dw_wide[:, :, meta.v:], torch.zeros_like(dw_wide[:, :, meta.v:]))
    assert torch.equal(dw_wide[:, :, :meta.v], dw.view(meta.cout, meta.cin, meta.v))
    fused = WarpTrainOps.backward_combined(meta, g, x, w)
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "mma")
    got = WarpTrainOps.backward_combined(meta, g, x, w)
    assert torch.equal(got[0], dx) and torch.equal(WarpTrainOps.grad_input(meta, g, w), dx)
    assert torch.equal(got[1], fused[1])                       # dW stays on the layer's kernels
    monkeypatch.setenv("FOVI_KNN_DW_PATH", "mma")
    got = WarpTrainOps.backward_combined(meta, g, x, w)
    assert torch.equal(got[1], dw) and torch.equal(WarpTrainOps.grad_weight(meta, g, x), dw)
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "nope")
    with pytest.raises(ValueError, match="FOVI_KNN_DX_PATH: expected 'mma', 'taps', 'off' or 'auto', got 'nope'"):
        WarpTrainOps.grad_input(meta, g, w)


def test_the_rule_takes_the_tensor_cores_on_large_gemms_only():
    """select_grad_mma on the real layers: the pipelined split config from 1 GFLOP of useful work at B >= 16 with
    Cin >= 16 and list padding within 3x; the fused / staged kernels elsewhere, and always in bf16."""
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.kernels.adjoint import as_forward as AF
    sel = AF.select_grad_mma
    assert AF.MMA_GRAD_CONFIG in F.uncached_config_names() and F.config_spec(AF.MMA_GRAD_CONFIG).variant == "mmaps"
    l1, l2, r3, r40, dino = (layer_meta(n) for n in ("alex_L1", "alex_L2", "res18_layer3", "res18_layer4_0",
                                                      "dinov3_patch"))
    r1, r30 = layer_meta("res18_layer1"), layer_meta("res18_layer3_0")
    assert sel(l1, 64) == sel(l2, 64) == sel(l2, 512) == sel(r3, 512) == AF.MMA_GRAD_CONFIG
    assert sel(l1, 16) == sel(l2, 16) == sel(r3, 64) == sel(r1, 64) == AF.MMA_GRAD_CONFIG   # 4.6, 1.7, 1.2, 1.1 GFLOP
    assert sel(r30, 512) == AF.MMA_GRAD_CONFIG                    # 4.8 GFLOP, tap layer padded 2.84-fold
    assert sel(r1, 16) is None and sel(r3, 16) is None and sel(r30, 64) is None   # 0.27, 0.30, 0.60 GFLOP
    assert sel(l1, 8) is None                                     # 2.3 GFLOP, under the smallest measured batch
    assert sel(r40, 512) is None                                  # 2.4 GFLOP on 2 output nodes, padded 5.5-fold
    assert sel(dino, 512) is None                                 # Cin = 3: the staged kernels
    assert sel(l1, 64, torch.bfloat16) is None                    # the split configs are fp16 only
    for meta in (l2, r40, dino):            # the rule's padding, read without building the derived layers
        assert AF.list_paddings(meta) == pytest.approx((AF.padding(meta), AF.tap_padding(meta)), rel=1e-12)
    assert max(AF.list_paddings(r40)) > AF.MMA_GRAD_MAX_PADDING


def test_warp_train_follows_the_rule_and_the_switches(monkeypatch):
    """With the rule's thresholds opened to this small case, warp_train's dx and dW (alone and combined) are the
    tensor-core ones, bitwise; FOVI_KNN_D*_PATH=off gives the fused kernels back; a rule pick that cannot run
    (a tap table over its budget) falls back to them without a warning (nothing was asked for by name)."""
    import warnings
    from fovi_lab.kernels.adjoint import as_forward as AF
    from fovi_lab.kernels.adjoint.rule import forget_plans
    from fovi_lab.knn_warp import WarpTrainOps, grad_input_kernels, grad_weight_kernels
    meta, w, g, dx_o, x, dw_o = _case("MAIN", 4, torch.float16)
    fused = grad_input_kernels(meta, g, w), grad_weight_kernels(meta, g, x)
    assert torch.equal(WarpTrainOps.grad_input(meta, g, w), fused[0])       # below the threshold: the kernels
    monkeypatch.setattr(AF, "MMA_GRAD_MIN_GFLOP", 0.0)
    assert AF.select_grad_mma(meta, 4) is None                                      # under the smallest batch
    monkeypatch.setattr(AF, "MMA_GRAD_MIN_BATCH", 1)
    monkeypatch.setattr(AF, "MMA_GRAD_MAX_PADDING", 2.5)
    assert 2.5 < AF.padding(meta) < 3.0 and AF.select_grad_mma(meta, 4) is None     # over the padding guard
    monkeypatch.setattr(AF, "MMA_GRAD_MAX_PADDING", 3.0)
    assert AF.select_grad_mma(meta, 4) == AF.MMA_GRAD_CONFIG
    forget_plans(meta)                                   # the thresholds changed: the call signature decides anew
    dx = grad_input_mma(meta, g, w, AF.MMA_GRAD_CONFIG)
    dw = grad_weight_mma(meta, g, x, AF.MMA_GRAD_CONFIG)
    _assert_fp32_exact(dx, dx_o, "dx under the rule")
    _assert_fp32_exact(dw, dw_o, "dW under the rule")
    got = WarpTrainOps.backward_combined(meta, g, x, w)
    assert torch.equal(got[0], dx) and torch.equal(got[1], dw)
    assert torch.equal(WarpTrainOps.grad_input(meta, g, w), dx) and torch.equal(WarpTrainOps.grad_weight(meta, g, x), dw)
    assert not torch.equal(dx, fused[0])                 # a different summation order: the path really changed
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "off")
    got = WarpTrainOps.backward_combined(meta, g, x, w)
    assert torch.equal(got[0], fused[0]) and torch.equal(got[1], dw)
    monkeypatch.setenv("FOVI_KNN_DW_PATH", "off")
    assert torch.equal(WarpTrainOps.backward_combined(meta, g, x, w)[1], fused[1])
    monkeypatch.delenv("FOVI_KNN_DX_PATH")
    monkeypatch.delenv("FOVI_KNN_DW_PATH")
    meta7, _, g7, _, x7, dw7_o = _case("MAIN", 7, torch.float16)     # a batch no other test built the tap layer of
    monkeypatch.setenv("FOVI_KNN_TAP_TABLE_MIB", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dw7 = WarpTrainOps.grad_weight(meta7, g7, x7)
    assert torch.equal(dw7, grad_weight_kernels(meta7, g7, x7))
    _assert_fp32_exact(dw7, dw7_o, "dW after the rule's fallback")


def test_a_tap_layer_over_its_table_budget_is_refused_and_warp_train_falls_back(monkeypatch):
    from fovi_lab.knn_warp import WarpTrainOps
    meta, w, g, dx_o, x, dw_o = _case("MAIN", 2, torch.float16)      # a batch no other test built the tap layer of
    monkeypatch.setenv("FOVI_KNN_TAP_TABLE_MIB", "0")
    with pytest.raises(RuntimeError, match=r"tap layer at batch 2: its index tables would take .* over "
                                           r"FOVI_KNN_TAP_TABLE_MIB=0"):
        grad_weight_mma(meta, g, x)
    monkeypatch.setenv("FOVI_KNN_DW_PATH", "mma")
    with pytest.warns(RuntimeWarning, match="the tensor-core dW cannot run here"):
        dw = WarpTrainOps.grad_weight(meta, g, x)
    _assert_fp32_exact(dw, dw_o, "dW after the fallback")


def test_bad_requests_are_refused_with_the_argument_named():
    meta, w, g, _, x, _ = _case("ODD", 17, torch.float16)
    with pytest.raises(ValueError, match=r"config: an fp32 output needs a tensor-core config whose p loop is split .*got 'mma_o64b16'"):
        grad_input_mma(meta, g, w, "mma_o64b16")
    with pytest.raises(TypeError, match="grad_y: expected dtype torch.float16 or torch.bfloat16, got torch.float32"):
        grad_input_mma(meta, g.float(), w)
    with pytest.raises(TypeError, match=r"weight: expected dtype torch.float16 \(same as grad_y\)"):
        grad_input_mma(meta, g, w.bfloat16())
    with pytest.raises(ValueError, match=r"grad_y: expected shape \[B, Cout=7, Nout=33\]"):
        grad_input_mma(meta, g[:, :3], w)
    with pytest.raises(TypeError, match=r"x: expected dtype torch.float16 \(same as grad_y\)"):
        grad_weight_mma(meta, g, x.float())
    with pytest.raises(ValueError, match=r"x: expected shape"):
        grad_weight_mma(meta, g, x[:2])
    t = transposed_meta(meta)
    with pytest.raises(ValueError, match="out_dtype: expected None .* or torch.float32, got torch.float64"):
        F.run_uncached(g, transposed_weight(w, meta), None, t.input_linear, t.weight_linear, out_dtype=torch.float64)


def test_an_evicted_tap_layer_leaves_the_forward_call_cache_with_it():
    from fovi_lab.graph import meta as M
    from fovi_lab.kernels.forward import api
    from fovi_lab.ops import graphs
    base = _case("ODD", 1, torch.float16)[0]
    meta = dataclasses.replace(base)          # a copy of the layer's meta: no tap layers yet
    first = None
    for b in range(1, M._TAP_METAS_KEPT + 2):                    # one more batch than the cache keeps
        _, _, g, _, x, _ = _case("ODD", b, torch.float16)
        grad_weight_mma(meta, g, x, SPLIT[0])
        first = first or tap_meta(meta, 1)
        held = [v for v in api._CALLS.values() if v[0]() is first.input_linear]
        assert held if b <= M._TAP_METAS_KEPT else not held, f"B={b}: the first tap layer's call entries"
        if b == 1:                               # what a CUDA graph captured now would hold (ops.graphs.capture)
            kept = [provider() for provider in graphs._KEEPERS]
    assert 1 not in M.meta_aux(meta)["tap_metas"]
    assert any(v[0]() is first.input_linear for entries in kept for v in entries), \
        "a graph captured before the eviction no longer holds the tables its kernels read"


def test_a_bad_table_budget_is_named_and_the_transposed_layer_has_one_too(monkeypatch):
    base, w, g, _, x, _ = _case("ODD", 2, torch.float16)
    meta = dataclasses.replace(base)          # a copy of the layer's meta: nothing derived from it yet (build_meta
    #                                           would return the layer's own, whose derived layers other tests built)
    for bad in ("lots", "-1"):
        monkeypatch.setenv("FOVI_KNN_TAP_TABLE_MIB", bad)
        with pytest.raises(ValueError, match="FOVI_KNN_TAP_TABLE_MIB: expected"):
            grad_weight_mma(meta, g, x)
    monkeypatch.setenv("FOVI_KNN_TAP_TABLE_MIB", "0")
    with pytest.raises(RuntimeError, match=r"transposed layer: its index tables would take .* largest in-degree"):
        grad_input_mma(meta, g, w)
    monkeypatch.delenv("FOVI_KNN_TAP_TABLE_MIB")
    assert_fp32_exact(grad_input_mma(meta, g, w), _case("ODD", 2, torch.float16)[3], "dx once the budget allows it")


# -- dx on the tap-expanded layer (FOVI_KNN_DX_PATH=taps): the stems' dx on the tensor cores ---------------------------

def test_the_tap_expanded_layer_reads_its_own_node_and_the_reverse_taps_name_each_entry():
    from fovi_lab.graph.meta import expanded_meta, reverse_taps
    meta, _, _, _, _, _ = _case("PAD_HEAVY", 1, torch.float16)
    e = expanded_meta(meta)
    assert (e.cin, e.cout, e.nin, e.nout, e.k, e.v) == (meta.cout, meta.q, meta.nout, meta.nout, 1, 1)
    assert torch.equal(e.idx[:, 0], torch.arange(meta.nout)) and expanded_meta(meta) is e
    col = meta.rev_col.long()
    n, k = col % meta.nout, col // meta.nout
    assert torch.equal(reverse_taps(meta).long(), meta.rf_index[n, k] * meta.nout + n)


def test_taps_dx_is_the_oracle_in_fp32_with_unread_nodes_zero_and_repeats():
    from fovi_lab.kernels.adjoint.as_forward import MMA_GRAD_CONFIG, grad_input_taps
    for name, b, config in (("ODD", 17, None), ("PAD_HEAVY", 5, None), ("MAIN", 3, None),
                            ("PAD_HEAVY", 5, MMA_GRAD_CONFIG), ("ODD", 17, "mmas_o32b8")):
        meta, w, g, dx_o, _, _ = _case(name, b, torch.float16)
        dx = grad_input_taps(meta, g, w, config)
        _assert_fp32_exact(dx, dx_o, f"taps dx {name} B={b} {config}")
        assert torch.equal(dx, grad_input_taps(meta, g, w, config)), "taps dx not bitwise repeatable"
    meta, w, g, _, _, _ = _case("PAD_HEAVY", 5, torch.float16)
    unread = (meta.rev_rowptr[1:] == meta.rev_rowptr[:-1]).nonzero().squeeze(1)
    dx = grad_input_taps(meta, g, w)
    assert unread.numel() and torch.equal(dx[:, :, unread], torch.zeros_like(dx[:, :, unread]))


def test_taps_dx_on_a_real_stem_is_within_fp32_of_the_fp64_oracle():
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.kernels.adjoint.as_forward import grad_input_taps
    from fovi_lab.ops.reference import oracle_forward
    meta = layer_meta("res18_stem")                                        # Cin = 3, V = K = 49, Cout = 64
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(3, meta.cin, meta.nin, generator=gen).half()
    w = (0.05 * torch.randn(meta.cout, meta.q, generator=gen)).half()
    g = torch.randn(3, meta.cout, meta.nout, generator=gen).half()
    xf = x.double().requires_grad_()
    dx_o, = torch.autograd.grad(oracle_forward(xf, w.double(), None, meta.idx, meta.rf_index, meta.v), (xf,),
                                g.double())
    dx = grad_input_taps(meta, g, w)
    assert dx.dtype == torch.float32 and float((dx.double() - dx_o).abs().max()) <= 1e-5 * (1 + float(dx_o.abs().max()))


def test_warp_train_takes_taps_for_dx_under_the_switch_on_fp16_calls_only(monkeypatch):
    from fovi_lab.kernels.adjoint.as_forward import grad_input_taps, select_taps_config
    from fovi_lab.kernels.adjoint.rule import adjoint_plan, gradient_words
    from fovi_lab.knn_warp import WarpTrainOps, grad_paths
    meta, w, g, dx_o, x, dw_o = _case("ODD", 17, torch.float16)
    before = WarpTrainOps.backward_combined(meta, g, x, w)
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "taps")
    plan = adjoint_plan(meta, 17, torch.float16)
    assert plan.dx == "taps" and plan.forced[0] and plan.config("dx") == select_taps_config(meta, 17)
    assert plan.config("dx") in plan.mma_configs() and "tap-expanded layer" in gradient_words(plan, "dx")
    assert grad_paths(meta, 17, torch.bfloat16)[0] != "taps"             # the split configs are fp16 only
    dx, dw = WarpTrainOps.backward_combined(meta, g, x, w)
    assert torch.equal(dx, grad_input_taps(meta, g, w)) and torch.equal(WarpTrainOps.grad_input(meta, g, w), dx)
    assert torch.equal(dw, before[1])                                      # dW keeps its path
    _assert_fp32_exact(dx, dx_o, "warp_train dx under FOVI_KNN_DX_PATH=taps")


def test_the_taps_config_rule_and_a_bad_dtype_is_refused(monkeypatch):
    """The config follows the rows of a chunk: a split config for few, the pipelined one from 64 rows of enough work
    (the chunks fit the stage budget: at B = 512, 171 of dinov3_patch's rows a chunk under 256 MiB, 47 under 64)."""
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.kernels.adjoint.as_forward import (MMA_GRAD_CONFIG, grad_input_taps, select_taps_config,
                                                     taps_batch_chunk)
    meta = layer_meta("dinov3_patch")
    assert select_taps_config(meta, 16) == "mmas_o64b16"
    monkeypatch.setenv("FOVI_KNN_GRAD_STAGE_MIB", "256")
    assert taps_batch_chunk(meta, 512) >= 64 and select_taps_config(meta, 512) == MMA_GRAD_CONFIG
    monkeypatch.setenv("FOVI_KNN_GRAD_STAGE_MIB", "64")
    assert taps_batch_chunk(meta, 512) < 64 and select_taps_config(meta, 512) != MMA_GRAD_CONFIG
    m, w, g, _, _, _ = _case("ODD", 3, torch.bfloat16)
    with pytest.raises(TypeError, match="grad_y"):
        grad_input_taps(m, g, w)


def test_taps_dx_runs_in_batch_chunks_within_the_stage_budget(monkeypatch):
    from fovi_lab.kernels.adjoint.as_forward import grad_input_taps, taps_batch_chunk
    meta, w, g, dx_o, _, _ = _case("ODD", 17, torch.float16)
    assert taps_batch_chunk(meta, 17) == 17
    row_mib = 2 * 4 * meta.q * meta.nout / 2**20                          # a row's stage and one split's partials
    monkeypatch.setenv("FOVI_KNN_GRAD_STAGE_MIB", str(5.5 * row_mib))      # 5 rows fit: chunks of 5, 5, 5 and 2
    assert taps_batch_chunk(meta, 17) == 5
    chunked = grad_input_taps(meta, g, w)
    _assert_fp32_exact(chunked, dx_o, "taps dx in chunks")
    assert torch.equal(chunked, grad_input_taps(meta, g, w)), "taps dx in chunks not bitwise repeatable"
    monkeypatch.setenv("FOVI_KNN_GRAD_STAGE_MIB", "0")                    # at least one row a chunk
    assert taps_batch_chunk(meta, 17) == 1
    _assert_fp32_exact(grad_input_taps(meta, g, w), dx_o, "taps dx a row at a time")
