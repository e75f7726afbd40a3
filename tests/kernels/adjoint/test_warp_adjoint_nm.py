"""Fused node-major adjoint kernels (fovi_lab.kernels.adjoint.fused) on Warp's CPU device.

Same criterion as the staged kernels (docs/operator.md §5): each gradient within 3x the fp16 torch_compact error
+ 2e-3 of torch autograd through the fp32 oracle, on the same fp16-rounded inputs. Outputs are
pre-filled with NaN before the launch, so an entry the kernel does not write fails the test.
"""

import pytest
import torch

from fovi_lab.kernels import adjoint as nm
from fovi_lab.kernels.adjoint import fused as adj_fused
from fovi_lab.kernels.adjoint import fused_build as adj_fused_build
from fovi_lab.kernels.adjoint import fused_plans as adj_fused_plans
from fovi_lab.ops.autograd import KNNConvFunction
from fovi_lab.graph.meta import build_meta
from fovi_lab.ops.reference import CompactTorchOps
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


@pytest.mark.parametrize("finish", ["torch", "tiled", "native"])
@pytest.mark.parametrize("config", DW_NAMES)
def test_dw_finish_paths(monkeypatch, config, finish):
    """Every dW finish of the splits (``FINISH = "warp"``: PyTorch's sum + transposing copy below
    ``_FINISH_TILED_MIN_BYTES``, the Warp-tile kernel above; ``native``: the shared-memory tile kernel at every
    size): every dW config, 1 and 3 partials, NaN-prefilled partials, bitwise repeatable; the native finish gives
    the Warp-tile kernel's sums bitwise."""
    monkeypatch.setattr(adj_fused_plans, "FINISH", "native" if finish == "native" else "warp")
    monkeypatch.setattr(adj_fused_plans, "_FINISH_TILED_MIN_BYTES", 1 << 40 if finish == "torch" else 0)
    meta, x, w, g, _, dw_o, _, e_dw = _case("PAD_HEAVY", 17)
    for nsplit in (1, 3):
        got = _run_nan_prefilled(nm.plan_grad_weight_nm(meta, g, x, config, nsplit=nsplit))
        _assert_within(got, dw_o, e_dw, f"{config} x{nsplit} {finish} finish")
        assert torch.equal(got, nm.grad_weight_nm(meta, g, x, config, nsplit=nsplit))
        if finish == "native":
            monkeypatch.setattr(adj_fused_plans, "FINISH", "warp")
            assert torch.equal(got, nm.grad_weight_nm(meta, g, x, config, nsplit=nsplit))
            monkeypatch.setattr(adj_fused_plans, "FINISH", "native")


def test_dw_split_finishes_bitwise_equal(monkeypatch):
    """The three split finishes (PyTorch split by split, the Warp-tile kernel, the shared-memory tile kernel) give
    the same bits with 8 partials, where a tree or vectorised sum would round differently: a CUDA graph captured
    on one path and an eager call on another must not differ."""
    meta, x, w, g, _, dw_o, _, e_dw = _case("PAD_HEAVY", 17)
    got = {}
    for mode, min_bytes in (("warp", 1 << 40), ("warp", 0), ("native", 0)):
        monkeypatch.setattr(adj_fused_plans, "FINISH", mode)
        monkeypatch.setattr(adj_fused_plans, "_FINISH_TILED_MIN_BYTES", min_bytes)
        got[mode, min_bytes] = _run_nan_prefilled(nm.plan_grad_weight_nm(meta, g, x, nsplit=8))
    ref = got["warp", 1 << 40]
    _assert_within(ref, dw_o, e_dw, "dW x8")
    assert all(torch.equal(ref, t) for t in got.values())


@pytest.mark.parametrize("shape", ["MAIN", "PAD_HEAVY"])
@pytest.mark.parametrize("b", [17, 130])
def test_default_configs_main_pad_heavy(shape, b):
    meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case(shape, b)
    _assert_within(_run_nan_prefilled(nm.plan_grad_input_nm(meta, g, w)), dx_o, e_dx, f"dx {shape} B={b}")
    _assert_within(_run_nan_prefilled(nm.plan_grad_weight_nm(meta, g, x, nsplit=2)), dw_o, e_dw,
                   f"dW {shape} B={b}")


@pytest.mark.parametrize("b", [1, 17, 130])
@pytest.mark.parametrize("config", DX_NAMES)
def test_dx_segments_every_config(config, b):
    """Balanced segments (kernel dxs + the segment finish): segments of 1, 2 and 5 steps, NaN-prefilled
    partials, against the oracle; bitwise repeatable."""
    meta, x, w, g, dx_o, _, e_dx, _ = _case("ODD", b)
    for seg in (1, 2, 5):
        plan = nm.plan_grad_input_nm(meta, g, w, config, seg_steps=seg)
        assert plan.k.kind == "dxs" and plan.longest <= seg
        got = _run_nan_prefilled(plan)
        _assert_within(got, dx_o, e_dx, f"{config} seg{seg} B={b}")
        assert torch.equal(got, nm.grad_input_nm(meta, g, w, config, seg_steps=seg))


@pytest.mark.parametrize("b", [1, 17, 130])
@pytest.mark.parametrize("config", DW_NAMES)
def test_dw_segments_every_config(config, b):
    meta, x, w, g, _, dw_o, _, e_dw = _case("ODD", b)
    for seg in (1, 3, 8):
        plan = nm.plan_grad_weight_nm(meta, g, x, config, seg_steps=seg)
        assert plan.k.kind == "dws" and plan.longest <= seg
        got = _run_nan_prefilled(plan)
        _assert_within(got, dw_o, e_dw, f"{config} seg{seg} B={b}")
        assert torch.equal(got, nm.grad_weight_nm(meta, g, x, config, seg_steps=seg))


@pytest.mark.parametrize("shape", ["MAIN", "PAD_HEAVY"])
def test_segments_main_pad_heavy(shape):
    meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case(shape, 17)
    _assert_within(_run_nan_prefilled(nm.plan_grad_input_nm(meta, g, w, seg_steps=3)), dx_o, e_dx, f"dx {shape}")
    _assert_within(_run_nan_prefilled(nm.plan_grad_weight_nm(meta, g, x, seg_steps=3)), dw_o, e_dw, f"dW {shape}")


@pytest.mark.parametrize("shape,b", [("ODD", 1), ("ODD", 130), ("PAD_HEAVY", 17)])
def test_tiled_segment_finish_is_the_simt_finish_bitwise(monkeypatch, shape, b):
    """The shared-memory-tile finish (the default) against the SIMT one on the same partials: dx and dW
    bitwise equal, NaN-prefilled outputs, every shape's segment lengths."""
    meta, x, w, g, _, _, _, _ = _case(shape, b)
    for seg in (1, 3):
        got = {}
        for mode in ("warp", "native"):
            monkeypatch.setattr(adj_fused_plans, "FINISH", mode)
            pi = nm.plan_grad_input_nm(meta, g, w, seg_steps=seg)
            pw = nm.plan_grad_weight_nm(meta, g, x, seg_steps=seg)
            pi.launch()
            pi.dx.fill_(float("nan"))                  # the finish alone fills dx
            adj_fused_plans._launch_seg_finish(*pi.fin_inputs, pi.dx, pi.device)
            got[mode] = (pi.dx.clone(), _run_nan_prefilled(pw))
        for a, t in zip(got["warp"], got["native"]):
            assert not torch.isnan(t).any() and torch.equal(a, t), f"{shape} B={b} seg{seg}"


def test_tiled_finish_of_64_lists_is_the_simt_finish_bitwise(monkeypatch):
    """The 64-list tiles (36 taps and 60 input nodes, as on the rf2 layers): dx and dW through the tiled finish
    equal the SIMT finish's bitwise, segments and dW's splits, NaN-prefilled."""
    from fovi_lab.graph.meta import synthetic_graph
    idx, rf = synthetic_graph(60, 20, 9, 36, 5, seed=1)
    meta = build_meta(idx, rf, cin=16, cout=24, v=36, nin=60)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(5, 16, 60, generator=gen).half()
    w = (0.1 * torch.randn(24, 16 * 36, generator=gen)).half()
    g = torch.randn(5, 24, 20, generator=gen).half()
    monkeypatch.setattr(adj_fused, "SEG_FINISH_64_MIN_CTAS", 1)              # this small case: 64-list tiles
    assert adj_fused.seg_finish_lists((24, 16, meta.v)) == adj_fused.seg_finish_lists((5, 16, meta.nin)) == 64
    got = {}
    for mode in ("warp", "native"):
        monkeypatch.setattr(adj_fused_plans, "FINISH", mode)
        monkeypatch.setattr(adj_fused_plans, "_FINISH_TILED_MIN_BYTES", 0)    # warp: the Warp-tile split finish
        got[mode] = [nm.grad_input_nm(meta, g, w, seg_steps=1), nm.grad_weight_nm(meta, g, x, seg_steps=2),
                     _run_nan_prefilled(nm.plan_grad_weight_nm(meta, g, x, nsplit=3))]
    for a, t in zip(got["warp"], got["native"]):
        assert not torch.isnan(t).any() and torch.equal(a, t)


def test_seg_finish_check_and_mode(monkeypatch):
    assert adj_fused_plans.seg_finish_ok("cpu") is True
    assert adj_fused_plans.FINISH == "native"                  # the default: the tiled finish where it checks
    meta, x, w, g, _, _, _, _ = _case("ODD", 3)
    # a failed check warns once and keeps the SIMT finish (the result is unchanged)
    monkeypatch.setattr(adj_fused_plans, "_SEG_FINISH_OK", {})
    monkeypatch.setattr(adj_fused_plans, "seg_finish_tiled_kernel",
                        lambda lists=32: (_ for _ in ()).throw(RuntimeError("x")))
    with pytest.warns(RuntimeWarning, match="tiled partial-sum finish"):
        assert adj_fused_plans.seg_finish_ok("cpu") is False
    monkeypatch.setattr(adj_fused_plans, "FINISH", "warp")
    want = [nm.grad_weight_nm(meta, g, x, seg_steps=s) for s in (2, 0)]
    monkeypatch.setattr(adj_fused_plans, "FINISH", "native")
    assert all(torch.equal(nm.grad_weight_nm(meta, g, x, seg_steps=s), w_) for s, w_ in zip((2, 0), want))


def test_segment_table_covers_every_step_once():
    rowptr = torch.tensor([0, 3, 3, 4, 9], dtype=torch.int32)        # lists of 3, 0, 1 and 5 entries
    bounds, segptr, longest = nm.segment_table(rowptr, 2, 4)         # 2 steps per entry, at most 4 per segment
    assert segptr.tolist() == [0, 2, 2, 3, 6]                        # ceil(6/4), 0, ceil(2/4), ceil(10/4)
    assert bounds.tolist() == [0, 4, 6, 8, 12, 16, 18]
    assert longest == 4
    steps = torch.cat([torch.arange(int(bounds[i]), int(bounds[i + 1])) for i in range(bounds.numel() - 1)])
    assert torch.equal(steps, torch.arange(18))
    # no segment crosses a list boundary: each list's steps are [2*rowptr[g], 2*rowptr[g+1])
    for gi in range(4):
        lo, hi = int(segptr[gi]), int(segptr[gi + 1])
        if hi > lo:
            assert int(bounds[lo]) == 2 * int(rowptr[gi]) and int(bounds[hi]) == 2 * int(rowptr[gi + 1])
    assert nm.segment_table(torch.zeros(3, dtype=torch.int32), 1, 1)[0].tolist() == [0]
    with pytest.raises(ValueError, match="seg_steps"):
        nm.segment_table(rowptr, 2, 0)


def test_segment_rules_and_requests(monkeypatch):
    """The default rules on the real layers: dx segments only where the reverse lists are uneven or long
    on a small grid (fit to the H200 fused sweep), dW segments on the res18 layers only; every dW
    segment table within the partial budget."""
    from fovi_lab.graph.layers import layer_meta
    dx_seg = {name: nm.default_dx_seg_steps(layer_meta(name), 64, "cuda:0")
              for name in ("res18_layer1", "res18_layer2_0", "res18_layer2", "res18_layer3_0", "res18_layer3",
                           "res18_layer4_0", "alex_L1", "alex_L2", "alex_L3", "alex_L4", "alex_L0")}
    assert {k for k, v in dx_seg.items() if v} == {"res18_layer2_0", "res18_layer2", "res18_layer3_0",
                                                    "res18_layer3", "alex_L2"}
    assert nm.default_dx_seg_steps(layer_meta("res18_layer2_0"), 64, "cpu") == 0        # CPU: whole lists
    assert nm.default_dx_seg_steps(layer_meta("res18_layer2_0"), 512, "cuda:0") == 0    # big grid
    assert nm.select_dx_nm_config(64, 256, nin=16, segments=True) == "dxn_m64n64k64"
    for name in ("res18_layer1", "res18_layer2_0", "res18_layer4_0", "alex_L1", "alex_L3"):
        meta = layer_meta(name)
        for b in (16, 64, 512):
            tiles = nm.DW_NM_CONFIG_SPECS[nm.select_dw_nm_config(meta.cout, meta.cin, b)]
            seg = nm.default_dw_seg_steps(meta, b, tiles, "cuda:0")
            assert (seg > 0) == name.startswith("res18"), (name, b, seg)
            assert nm.default_dw_seg_steps(meta, b, tiles, "cpu") == 0
            if seg:
                bounds, _, longest = nm.segment_table(nm.tap_lists(meta)[0], -(-b // tiles[2]), seg)
                assert longest <= seg and (bounds.numel() - 1) * 4 * meta.cout * meta.cin <= adj_fused._budget_bytes()


def test_recorded_sweep_supports_the_dx_rule():
    """On every shape of the recorded H200 sweep at B >= 64, the default dx (tiles, segment length) is
    within 10% of the fastest measured option when the sweep measured it."""
    from collections import defaultdict
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.ops.records import RECORDS_DIR, read_file
    by = defaultdict(list)
    for r in read_file(RECORDS_DIR / "h200" / "fused_sweep.jsonl.gz"):
        if r.get("ms") and r["impl"] in ("warp_dxn", "warp_dxs"):
            by[(r["layer"], r["B"])].append(r)
    checked = 0
    for (layer, b), rs in by.items():
        if b < 64:
            continue
        meta = layer_meta(layer)
        seg = nm.default_dx_seg_steps(meta, b, "cuda:0")
        cfg = nm.select_dx_nm_config(b, meta.cin, meta.nin, segments=bool(seg))
        pick = [r["ms"] for r in rs if r["config"] == cfg and (r.get("seg_steps") or 0) == seg]
        if pick:
            best = min(r["ms"] for r in rs)
            assert pick[0] <= 1.10 * best, (layer, b, cfg, seg, pick[0], best)
            checked += 1
    assert checked >= 15


def test_segment_requests(monkeypatch):
    meta, x, w, g, *_ = _case("ODD", 3)
    monkeypatch.setenv("FOVI_KNN_FUSED_PARTIAL_MIB", "0.001")          # ~1 KB: any explicit table is too big
    with pytest.raises(ValueError, match="partial budget"):
        nm.plan_grad_input_nm(meta, g, w, seg_steps=1)
    with pytest.raises(ValueError, match="partial budget"):
        nm.plan_grad_weight_nm(meta, g, x, seg_steps=1)
    monkeypatch.delenv("FOVI_KNN_FUSED_PARTIAL_MIB")
    with pytest.raises(ValueError, match="seg_steps"):
        nm.grad_input_nm(meta, g, w, seg_steps=-1)
    with pytest.raises(ValueError, match="seg_steps: expected None, 'auto', 0/'off' or an int >= 1, got 'many'"):
        nm.grad_weight_nm(meta, g, x, seg_steps="many")
    assert nm.plan_grad_weight_nm(meta, g, x, seg_steps=2).seg_steps == 2
    assert nm.plan_grad_weight_nm(meta, g, x, seg_steps="off").k.kind == "dwn"
    assert nm.plan_grad_weight_nm(meta, g, x, seg_steps="auto").k.kind == "dwn"        # the CPU rule: splits


def test_only_pad_neighbours_give_exact_zeros():
    """Input nodes nobody reads get dx = 0; taps only pads fall into get dW = 0 (docs/operator.md §3)."""
    nin, v, cin, cout = 6, 4, 3, 5
    idx = torch.tensor([[0, 6, 6], [1, 6, 0]])          # nodes 2..5 unread, tap 3 only on pads
    rf = torch.tensor([[0, 3, 3], [1, 3, 2]])
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, cin, nin, generator=gen).half()
    w = torch.randn(cout, cin * v, generator=gen).half()
    g = torch.randn(2, cout, 2, generator=gen).half()
    for seg in (0, 1):
        dx = _run_nan_prefilled(nm.plan_grad_input_nm(meta, g, w, seg_steps=seg))
        dw = _run_nan_prefilled(nm.plan_grad_weight_nm(meta, g, x, seg_steps=seg))
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
    dxs = [nm.grad_input_nm(meta, g, w, seg_steps=2) for _ in range(3)]
    dws = [nm.grad_weight_nm(meta, g, x, seg_steps=2) for _ in range(3)]
    assert all(torch.equal(dxs[0], d) for d in dxs[1:])
    assert all(torch.equal(dws[0], d) for d in dws[1:])


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
    assert nm.select_dx_nm_config(16, 96) == "dxn_m16n16k64"                # B <= 16: 16x16 (the fused sweep)
    assert nm.select_dx_nm_config(32, 96) == "dxn_m32n64k64"
    assert nm.select_dw_nm_config(96, 3) == "dwn_o64c16k64"
    assert nm.select_dw_nm_config(256, 96) == "dwn_o64c64k64"
    assert nm.select_dw_nm_config(256, 96, 16) == "dwn_o64c64k16"          # B=16: no 3/4-zero batch chunk
    assert nm.select_dw_nm_config(256, 96, 32) == "dwn_o64c64k32"
    assert nm.select_dw_nm_config(256, 96, 64) == "dwn_o64c64k64"
    assert {nm.select_dx_nm_config(b, c, n) for b in (1, 16, 32, 64, 512) for c in (3, 64, 96, 256)
            for n in (None, 16, 4085)} <= set(nm.DX_NM_CONFIG_SPECS)
    assert {nm.select_dw_nm_config(o, c, b) for o in (64, 96, 256, 512) for c in (3, 64, 96, 256)
            for b in (None, 1, 16, 32, 512)} <= set(nm.DW_NM_CONFIG_SPECS)
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
    from fovi_lab.ops import graphs
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the CPU refusal path is not reachable")
    with pytest.raises(RuntimeError, match="CUDA graphs need a CUDA device"):
        graphs.capture(lambda: None)


def test_every_fused_kernel_compiles_aot_without_mathdx(tmp_path):
    """The fused dx/dW kernels' CUDA compiles with no GPU (Warp's NVRTC, the scalar tile_matmul path; ~1 s per
    kernel and arch): every config for sm_90, the first config of each kind for sm_80 and sm_89 (a kind's
    configs differ in tile constants only). Launch fit is the canary's job on the device."""
    import os
    from pathlib import Path
    from fovi_lab.kernels.common import wp
    archs = [int(a) for a in os.environ.get("FOVI_TEST_AOT_ARCHS", "80,89,90").split(",") if a.strip()]
    kinds_seen = set()
    for kind, name in nm.nm_grad_kernel_names():
        kernel = adj_fused_build._kinds()[kind][1](*adj_fused_build._spec(kind, name), mathdx=False)
        first = kind not in kinds_seen
        kinds_seen.add(kind)
        for arch in (a for a in archs if a == max(archs) or first):
            out = tmp_path / f"{kind}_{name}_sm{arch}"
            files = wp.compile_aot_module(kernel.module, arch=arch, module_dir=str(out))
            files = [Path(f) for f in files or []]
            assert files and all(f".sm{arch}." in f.name and f.stat().st_size > 0 for f in files), (name, arch, files)


def test_tiled_finish_compiles_aot(tmp_path):
    """The tiled finish's CUDA branch (its shared-memory tile, 32 and 64 lists) compiles with no GPU for every AOT
    arch; the tile size follows the list count."""
    import os
    from pathlib import Path
    from fovi_lab.kernels.common import wp
    archs = [int(a) for a in os.environ.get("FOVI_TEST_AOT_ARCHS", "80,89,90").split(",") if a.strip()]
    for lists in (32, 64):
        kernel = adj_fused.seg_finish_tiled_kernel(lists)
        for arch in archs:
            out = tmp_path / f"l{lists}_sm{arch}"
            files = [Path(f) for f in wp.compile_aot_module(kernel.module, arch=arch, module_dir=str(out)) or []]
            assert files and all(f".sm{arch}." in f.name and f.stat().st_size > 0 for f in files), (lists, arch, files)
    assert [adj_fused.seg_finish_lists((512, 256, g)) for g in (16, 32, 33, 36, 64, 65, 230)] == [32, 32, 64, 64, 64, 32, 32]
    assert adj_fused.seg_finish_lists((64, 64, 36)) == 32                     # 128 CTAs: the 32-list tile
    with pytest.raises(ValueError, match="32 or 64"):
        adj_fused.seg_finish_tiled_kernel(48)


def test_default_rules_read_no_device_tensor_after_the_first_call(monkeypatch):
    """The rules run on every call, also while a CUDA graph is being captured, where reading a device
    tensor back (``int(t)``, ``t.item()``) invalidates the capture (a train-step benchmark caught that on the H200): after
    the first call they must answer from host-side caches alone."""
    from fovi_lab.graph.layers import layer_meta
    meta = layer_meta("res18_layer2_0")
    tiles = nm.DW_NM_CONFIG_SPECS["dwn_o64c64k64"]
    want = (nm.default_dx_seg_steps(meta, 64, "cuda:0"), nm.default_dw_seg_steps(meta, 64, tiles, "cuda:0"))

    def boom(*a, **k):
        raise AssertionError("a default rule read a tensor back to the host")
    for name in ("__int__", "__float__", "__bool__", "__index__", "item", "tolist"):
        monkeypatch.setattr(torch.Tensor, name, boom)
    got = (nm.default_dx_seg_steps(meta, 64, "cuda:0"), nm.default_dw_seg_steps(meta, 64, tiles, "cuda:0"))
    monkeypatch.undo()
    assert got == want and all(want)


def test_the_public_adjoints_take_warp_train_s_path(monkeypatch):
    """fovi's public ``grad_input`` / ``grad_weight`` run what ``warp_train`` runs (fused here, Cin >= 16), bitwise;
    with a staged config or staged options they run the staged kernels."""
    from fovi_lab import knn_warp
    from fovi_lab.kernels.adjoint import grad_input as staged_gi, grad_weight as staged_gw
    meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case("MAIN", 17)
    monkeypatch.delenv("FOVI_KNN_GRAD_PATH", raising=False)
    assert knn_warp.grad_path(meta) == "fused"
    assert torch.equal(knn_warp.grad_input(meta, g, w), knn_warp.WarpTrainOps.grad_input(meta, g, w))
    assert torch.equal(knn_warp.grad_weight(meta, g, x), knn_warp.WarpTrainOps.grad_weight(meta, g, x))
    assert torch.equal(knn_warp.grad_input(meta, g, w), nm.grad_input_nm(meta, g, w))
    assert torch.equal(knn_warp.grad_input(meta, g, w, stage_fp32=True), staged_gi(meta, g, w, stage_fp32=True))
    assert torch.equal(knn_warp.grad_weight(meta, g, x, "gw3_p64n64"), staged_gw(meta, g, x, "gw3_p64n64"))
