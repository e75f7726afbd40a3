"""Warp adjoint kernels (fovi_lab.kernels.adjoint.staged) on Warp's CPU device (docs/operator.md §3, §3.3).

Criterion (docs/operator.md §5): each gradient is within 3x the fp16 torch_compact error + 2e-3, both errors
measured against torch autograd of the fp32 oracle on the same fp16-rounded inputs. Every buffer the
module allocates uninitialised is pre-filled with NaN (``_EMPTY_FILL``), so an unwritten stage entry
poisons the result.
"""

import warnings

import pytest
import torch

from fovi_lab.kernels import adjoint as wa
from fovi_lab.kernels.adjoint import configs as adj_configs
from fovi_lab.kernels.adjoint import staged_build as adj_staged_build
from fovi_lab.kernels.adjoint import staged_plans as adj_staged_plans
from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.ops.reference import CompactTorchOps
from fovi_lab.kernels.common import ValidatedCache, init_warp, wp
from grad_cases import assert_within, grad_case

GI_NAMES = list(wa.GRAD_INPUT_CONFIG_SPECS)
GW_NAMES = list(wa.GRAD_WEIGHT_CONFIG_SPECS)


@pytest.fixture(autouse=True)
def _nan_prefill(monkeypatch):
    monkeypatch.setattr(adj_staged_plans, "_EMPTY_FILL", float("nan"))
    monkeypatch.delenv("FOVI_KNN_STAGE_MIB", raising=False)
    monkeypatch.delenv("FOVI_KNN_GRAD_STAGE_MIB", raising=False)


_case = grad_case
_assert_within = assert_within


@pytest.mark.parametrize("name", list(SYNTHETIC_SHAPES))
@pytest.mark.parametrize("b", [1, 17, 130])
@pytest.mark.parametrize("fp32", [False, True], ids=["f16stage", "f32stage"])
def test_default_grads_match_oracle(name, b, fp32):
    meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case(name, b)
    dx = wa.grad_input(meta, g, w, stage_fp32=fp32)
    dw = wa.grad_weight(meta, g, x, stage_fp32=fp32)
    _assert_within(dx, dx_o, e_dx, f"dx {name} B={b}")
    _assert_within(dw, dw_o, e_dw, f"dW {name} B={b}")
    assert dx.shape == (b, meta.cin, meta.nin) and dw.shape == (meta.cout, meta.q)
    assert dx.is_contiguous() and dw.is_contiguous()


@pytest.mark.parametrize("config", GI_NAMES)
@pytest.mark.parametrize("fp32", [False, True], ids=["f16stage", "f32stage"])
def test_every_grad_input_config(config, fp32):
    for name, b in (("MAIN", 130), ("ODD", 17), ("PAD_HEAVY", 1)):
        meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case(name, b)
        dx = wa.grad_input(meta, g, w, config=config, stage_fp32=fp32)
        _assert_within(dx, dx_o, e_dx, f"dx {config} {name} B={b}")


@pytest.mark.parametrize("config", GW_NAMES)
@pytest.mark.parametrize("fp32", [False, True], ids=["f16stage", "f32stage"])
def test_every_grad_weight_config(config, fp32):
    for name, b in (("MAIN", 130), ("ODD", 17), ("PAD_HEAVY", 1)):
        meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case(name, b)
        dw = wa.grad_weight(meta, g, x, config=config, stage_fp32=fp32)
        _assert_within(dw, dw_o, e_dw, f"dW {config} {name} B={b}")


def test_f32_suffix_selects_fp32_staging():
    meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case("MAIN", 17)
    a = wa.grad_input(meta, g, w, config="gi2_p64b64_f32")
    b = wa.grad_input(meta, g, w, config="gi2_p64b64", stage_fp32=True)
    assert torch.equal(a, b)
    # fp32 staging is much closer to the oracle than the fp16 torch reference
    assert (a - dx_o).abs().max().item() < 0.1 * e_dx


def test_fp32_staging_by_argument_and_by_name():
    """An fp32 stage is asked for by ``stage_fp32=True`` or by the config name's ``_f32`` suffix, with the same
    bits; the default stages in fp16 (the seed's), a different rounding."""
    meta, x, w, g, *_ = _case("ODD", 17)
    want = wa.grad_weight(meta, g, x, stage_fp32=True)
    name = wa.select_gw_config(meta.cout, meta.cin, 17, meta.nout, meta.p64)
    assert torch.equal(wa.grad_weight(meta, g, x, config=name + "_f32"), want)
    assert not torch.equal(wa.grad_weight(meta, g, x), want)


@pytest.mark.parametrize("name", ["MAIN", "PAD_HEAVY"])
def test_index_add_finish_matches(name):
    meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case(name, 17)
    dw = wa.grad_weight(meta, g, x, finish="index_add")
    _assert_within(dw, dw_o, e_dw, f"dW index_add {name}")
    dw_csr = wa.grad_weight(meta, g, x, finish="csr")
    torch.testing.assert_close(dw, dw_csr, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", list(SYNTHETIC_SHAPES))
def test_chunked_staging_is_bitwise_identical(name, monkeypatch):
    """A tiny FOVI_KNN_STAGE_MIB forces one b tile per gi chunk and one node per gw chunk; the reductions
    visit the terms of every output element in the same order, so results are bitwise unchanged."""
    meta, x, w, g, dx_o, dw_o, e_dx, e_dw = _case(name, 130)
    for gi, gw in (("gi2_p64b64", "gw3_p64n64"), ("gi2i_p64b64", "gw3i_p64n64")):  # gathered, staged operand
        monkeypatch.delenv("FOVI_KNN_STAGE_MIB", raising=False)
        dx_full = wa.grad_input(meta, g, w, config=gi)
        dw_full = wa.grad_weight(meta, g, x, config=gw)
        monkeypatch.setenv("FOVI_KNN_STAGE_MIB", "0.0001")
        dx = wa.grad_input(meta, g, w, config=gi)
        dw = wa.grad_weight(meta, g, x, config=gw)
        _assert_within(dx, dx_o, e_dx, f"dx chunked {gi}")
        _assert_within(dw, dw_o, e_dw, f"dW chunked {gw}")
        assert torch.equal(dx, dx_full)
        assert torch.equal(dw, dw_full)


def test_chunk_counts_under_tiny_budget(monkeypatch):
    """The tiny budget really chunks: one 64-row b tile per gi chunk, one node per gw chunk."""
    meta, x, w, g, *_ = _case("MAIN", 130)
    monkeypatch.setenv("FOVI_KNN_STAGE_MIB", "0.0001")
    plan, _ = wa.plan_grad_input(meta, g, w, "gi2_p64b64")
    assert [c[:2] for c in plan.chunks] == [(0, 64), (64, 128), (128, 130)]
    plan, _ = wa.plan_grad_weight(meta, g, x, "gw3_p64n64")
    assert len(plan.chunks) == meta.nout and plan.nc == 1
    monkeypatch.setenv("FOVI_KNN_STAGE_MIB", "512")
    assert len(wa.plan_grad_input(meta, g, w, "gi2_p64b64")[0].chunks) == 1
    assert len(wa.plan_grad_weight(meta, g, x, "gw3_p64n64")[0].chunks) == 1
    # the grads' own budget (default 64 MiB) chunks the same way, capped by FOVI_KNN_STAGE_MIB
    monkeypatch.setenv("FOVI_KNN_GRAD_STAGE_MIB", "0.0001")
    assert len(wa.plan_grad_input(meta, g, w, "gi3_p64b64")[0].chunks) == 3
    assert wa.grad_stage_budget_bytes() == int(0.0001 * (1 << 20))
    monkeypatch.delenv("FOVI_KNN_GRAD_STAGE_MIB")
    assert wa.grad_stage_budget_bytes() == 64 << 20


@pytest.mark.parametrize("budget_mib", [None, 16, 4])
def test_a_stems_stages_fit_the_budget_in_even_chunks(monkeypatch, budget_mib):
    """A stem's staged dW (x rows staged per node chunk) and dx at B = 256: what the plans stage (the products and,
    for dW, the x rows) fits FOVI_KNN_GRAD_STAGE_MIB (64 MiB by default), in chunks as even as the nodes or the
    batch tiles allow."""
    from fovi_lab.graph.layers import layer_meta
    if budget_mib is not None:
        monkeypatch.setenv("FOVI_KNN_GRAD_STAGE_MIB", str(budget_mib))
    budget = wa.grad_stage_budget_bytes()
    meta = layer_meta("res18_stem")
    b = 256
    x = torch.zeros(b, meta.cin, meta.nin, dtype=torch.float16)
    g = torch.zeros(b, meta.cout, meta.nout, dtype=torch.float16)
    w = torch.zeros(meta.cout, meta.q, dtype=torch.float16)
    gw, _ = wa.plan_grad_weight(meta, g, x, "gw3i_p64n64")
    staged = gw.stage_bytes + gw.at.numel() * gw.at.element_size()
    assert staged <= budget, (staged, budget)
    sizes = [n1 - n0 for n0, n1 in gw.chunks]
    # equal chunks but the last, which is short by less than one node per chunk
    assert sum(sizes) == meta.nout and len(set(sizes[:-1])) <= 1 and max(sizes) - min(sizes) < len(sizes)
    if budget_mib is not None:
        assert len(sizes) > 1
    gi, _ = wa.plan_grad_input(meta, g, w, "gi2_p64b64")
    assert gi.stage_bytes <= max(budget, meta.nout * meta.p64 * gi.tile_b * gi.stage_buf.element_size())
    rows = [c[1] - c[0] for c in gi.chunks]
    assert sum(rows) == b and max(rows) - min(rows) < gi.tile_b


def test_default_config_selection(monkeypatch):
    big = "gi3_p64b128_f32"  # B > 64 default, chosen from the H200 sweep
    assert wa.select_gi_config(17) == "gi2_p64b64" and wa.select_gi_config(130) == big
    assert wa.select_gi_config(130, nout=40, device="cpu") == big                # no SM count on the CPU
    monkeypatch.setattr(adj_configs, "_sm_count", lambda device: 132)
    assert wa.select_gi_config(64, nout=16, device="cuda:0") == "gi3_p64b64"    # 16 CTAs < 4 per SM
    assert wa.select_gi_config(64, nout=964, device="cuda:0") == "gi2_p64b64"
    assert wa.select_gi_config(512, nout=964, device="cuda:0") == big
    assert wa.select_gw_config(64) == "gw3_p64n64" and wa.select_gw_config(96) == "gw3_p64n128"
    # the Cin = 3 stems: staged-operand kernels once B*Nout*P64 >= 16M (H200: alexnet L0 train step
    # 1.60 ms at B=64, 2.1x the seed; below, the extra host work of the row copies outweighed the GPU saving)
    assert wa.select_gi_config(64, nout=964, device="cuda:0", cin=3, p64=384) == "gi2i_p64b64"       # alex L0
    assert wa.select_gi_config(512, nout=964, device="cuda:0", cin=3, p64=384) == "gi2i_p64b64_f32"
    assert wa.select_gi_config(16, nout=964, device="cuda:0", cin=3, p64=384) == "gi2_p64b64"
    assert wa.select_gi_config(64, nout=964, device="cuda:0", cin=3, p64=192) == "gi2_p64b64"        # res18 stem
    assert wa.select_gi_config(512, nout=964, device="cuda:0", cin=3, p64=192) == "gi2i_p64b64_f32"
    # Cout = 96 (alexnet's stem): 96-wide Cout tiles, no 96 -> 128 padding
    assert wa.select_gi_config(64, nout=964, device="cuda:0", cin=3, p64=384, cout=96) == "gi2i_p64b64o96"
    # ... and staged from 4M staged elements (H200: alexnet L0 at B = 16 is faster staged, 5.9M)
    assert wa.select_gi_config(16, nout=964, device="cuda:0", cin=3, p64=384, cout=96) == "gi2i_p64b16o96"
    assert wa.select_gw_config(96, cin=3, batch=16, nout=964, p64=384) == "gw3i_p64n96k16"
    assert wa.select_gi_config(16, nout=964, device="cuda:0", cin=3, p64=192, cout=64) == "gi2_p64b64"  # res18 stem
    assert wa.select_gi_config(512, nout=964, device="cuda:0", cin=3, p64=384, cout=96) == "gi2i_p64b64o96_f32"
    assert wa.select_gw_config(96, cin=3, batch=512, nout=964, p64=384) == "gw3i_p64n96_f32"
    assert wa.select_gw_config(96, cin=3, batch=64, nout=964, p64=384) == "gw3i_p64n96"
    assert wa.select_gw_config(384, cin=3, batch=64, nout=64, p64=320) != "gw3i_p64n96"
    assert wa.select_gw_config(128, 3, 64, 964, 384) == "gw3i_p64n128"
    assert wa.select_gw_config(64, 3, 512, 964, 192) == "gw3i_p64n64_f32"
    assert wa.select_gw_config(384, 3, 512, 64, 320) == "gw3_p64n128"                              # DINOv3 patch
    assert wa.select_gw_config(96, 64, 512, 964, 384) == "gw3_p64n128"                             # Cin = 64
    assert wa.select_gw_config(96, 3) == "gw3_p64n128"                                             # no batch given


def test_dx_direct_layout_is_identical():
    meta, x, w, g, *_ = _case("ODD", 130)
    assert torch.equal(wa.grad_input(meta, g, w, dx_direct=True), wa.grad_input(meta, g, w))


def test_determinism_bitwise_across_runs():
    meta, x, w, g, *_ = _case("MAIN", 130)
    dx1, dw1 = wa.grad_input(meta, g, w), wa.grad_weight(meta, g, x)
    dx2, dw2 = wa.grad_input(meta, g, w), wa.grad_weight(meta, g, x)
    assert torch.equal(dx1, dx2) and torch.equal(dw1, dw2)


def test_pad_semantics_exact():
    """All-pad output nodes give exact zeros to dx, and W columns that no real input reads get exact 0."""
    cin, cout, nin, nout, k, v = 3, 5, 20, 6, 4, 9
    idx, rf = synthetic_graph(nin, nout, k, v, 0, seed=3)
    idx[2] = nin                       # node 2 reads only pads
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, cin, nin, generator=gen).half()
    w = torch.randn(cout, cin * v, generator=gen).half()
    g = torch.zeros(4, cout, nout).half()
    g[:, :, 2] = 1.0                   # gradient only through the all-pad node
    assert torch.count_nonzero(wa.grad_input(meta, g, w)) == 0
    assert torch.count_nonzero(wa.grad_weight(meta, g, x)) == 0
    # taps read by no real neighbour get exactly zero gradient (row 0 included)
    g = torch.randn(4, cout, nout, generator=gen).half()
    dw = wa.grad_weight(meta, g, x).view(cout, cin, v)
    used = torch.zeros(v, dtype=torch.bool)
    used[rf[idx < nin]] = True
    assert torch.count_nonzero(dw[:, :, ~used]) == 0
    torch.testing.assert_close(dw.view(cout, -1), CompactTorchOps.grad_weight(meta, g, x), rtol=0, atol=2e-3)


def test_weight_row_csr_lists_every_real_entry_once():
    meta, *_ = _case("PAD_HEAVY", 1)
    rowptr, col = wa.weight_row_csr(meta)
    assert rowptr.dtype == torch.int32 and col.dtype == torch.int32
    il, wl = meta.input_linear_flat, meta.weight_linear_flat
    real = torch.nonzero(il != meta.pad_column).squeeze(1)
    assert int(rowptr[-1]) == real.numel() == col.numel()
    assert torch.equal(torch.sort(col.long()).values, real)
    for q in range(0, meta.q, 7):
        seg = col[int(rowptr[q]):int(rowptr[q + 1])].long()
        assert torch.all(wl[seg] == q) and torch.all(seg[1:] > seg[:-1])
    assert wa.weight_row_csr(meta) is wa.weight_row_csr(meta)      # cached alongside the meta


def test_pad_flat_input_fp16():
    meta, x, *_ = _case("ODD", 3)
    xp = wa.pad_flat_input_fp16(x, meta)
    assert xp.shape == (3, meta.cin * meta.nin + 1) and xp.dtype == torch.float16 and xp.is_contiguous()
    assert torch.equal(xp[:, :-1], x.reshape(3, -1)) and torch.count_nonzero(xp[:, -1]) == 0
    with pytest.raises(TypeError, match="x: expected dtype"):
        wa.pad_flat_input_fp16(x.float(), meta)


# ---------------------------------------------------------------------------------- canary / fallback

@pytest.fixture
def fresh_cache(monkeypatch):
    cache = ValidatedCache("Warp grad kernel config")
    monkeypatch.setattr(adj_staged_build, "GRAD_KERNELS", cache)
    monkeypatch.setattr(adj_staged_plans, "GRAD_KERNELS", cache)     # the plans' reference to the same cache
    return cache


def test_canary_accepts_real_kernels():
    k = wa.make_grad_input_stage2_kernel(64, 64, False, block_dim=128)
    assert wa.canary_grad_stage_ok(k, 64, 64, 128, 2, True, "cpu")
    k = wa.make_grad_weight_stage4_kernel(64, 64, True, block_dim=256)
    assert wa.canary_grad_stage_ok(k, 64, 64, 256, 4, False, "cpu")
    assert wa.canary_csr_ok(wa.make_dx_csr_kernel(False), "dx", "cpu")
    assert wa.canary_csr_ok(wa.make_dw_csr_kernel(True), "dw", "cpu")


def _silent_kernel(write_zeros: bool):
    """A gi-signature kernel that writes nothing (the silent-launch trap) or writes zeros (garbage)."""
    wp_ = wp

    @wp_.kernel(enable_backward=False, module="unique")
    def silent(weight_linear: wp_.array2d(dtype=wp_.int32), wt: wp_.array2d(dtype=wp_.float16),
               g_nob: wp_.array3d(dtype=wp_.float16), n_p_tiles: int, n_o_tiles: int,
               da: wp_.array3d(dtype=wp_.float16)):
        n, bt = wp_.tid()
        if wp_.static(write_zeros):
            for pt in range(n_p_tiles):
                z = wp_.tile_zeros(shape=(64, 64), dtype=wp_.float16)
                wp_.tile_store(da[n], z, offset=(pt * 64, bt * 64))

    silent.fovi_fp32_stage = False
    return silent


@pytest.mark.parametrize("write_zeros", [False, True], ids=["writes-nothing", "writes-garbage"])
def test_canary_rejects_broken_kernels(write_zeros):
    init_warp()
    k = _silent_kernel(write_zeros)
    ok, why = adj_staged_build._canary_grad_stage(k, 64, 64, 64, 2, True, "cpu")
    assert not ok and ("NaN" in why or "wrong" in why), why


def test_unlaunchable_default_falls_back_to_torch_compact(fresh_cache, monkeypatch):
    monkeypatch.setattr(adj_staged_build, "_canary_grad_stage", lambda *a, **k: (False, "simulated: too much shared memory"))
    meta, x, w, g, *_ = _case("MAIN", 17)
    with pytest.warns(RuntimeWarning, match="falling back to torch_compact"):
        dx = wa.grad_input(meta, g, w)
    with pytest.warns(RuntimeWarning, match="falling back to torch_compact"):
        dw = wa.grad_weight(meta, g, x)
    assert torch.equal(dx, CompactTorchOps.grad_input(meta, g, w))
    assert torch.equal(dw, CompactTorchOps.grad_weight(meta, g, x))
    assert fresh_cache.why(("gi", wa.select_gi_config(17)), "cpu").startswith("simulated")
    # an explicitly requested config that cannot launch raises instead of silently changing backend
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(RuntimeError, match="not launchable"):
            wa.grad_input(meta, g, w, config="gi2_p64b128")
        with pytest.raises(RuntimeError, match="not launchable"):
            wa.grad_weight(meta, g, x, config="gw2_p64n64")


def test_unlaunchable_reduction_falls_back(fresh_cache, monkeypatch):
    monkeypatch.setattr(adj_staged_build, "_canary_csr", lambda *a, **k: (False, "simulated"))
    meta, x, w, g, *_ = _case("ODD", 17)
    with pytest.warns(RuntimeWarning, match="falling back"):
        dx = wa.grad_input(meta, g, w)
    assert torch.equal(dx, CompactTorchOps.grad_input(meta, g, w))
    # the index_add finish needs no reduction kernel, so it still runs on Warp
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        wa.grad_weight(meta, g, x, finish="index_add")


def test_get_grad_kernel_validates_once(fresh_cache, monkeypatch):
    seen = []
    real = adj_staged_build._canary_grad_stage
    monkeypatch.setattr(adj_staged_build, "_canary_grad_stage", lambda *a, **k: seen.append(a[1:]) or real(*a, **k))
    k1 = wa.get_grad_kernel("gw", "gw3_p64n64", "cpu")
    k2 = wa.get_grad_kernel("gw", "gw3_p64n64", "cpu")
    assert k1 is k2 and k1 is not None and len(seen) == 1
    assert k1.kind == "gw" and k1.spec["version"] == 3 and not k1.fp32_stage
    assert wa.get_grad_kernel("csr", "dx_f32", "cpu").fp32_stage


# ---------------------------------------------------------------------------------- bad inputs

def test_bad_inputs_are_rejected_with_the_argument_named():
    meta, x, w, g, *_ = _case("ODD", 3)
    with pytest.raises(TypeError, match="grad_y: expected dtype torch.float16"):
        wa.grad_input(meta, g.float(), w)
    with pytest.raises(TypeError, match="weight: expected dtype torch.float16"):
        wa.grad_input(meta, g, w.float())
    with pytest.raises(TypeError, match="x: expected dtype torch.float16"):
        wa.grad_weight(meta, g, x.to(torch.bfloat16))
    with pytest.raises(ValueError, match="grad_y: expected shape"):
        wa.grad_input(meta, g[:, :-1], w)
    with pytest.raises(ValueError, match="weight: expected shape"):
        wa.grad_input(meta, g, w[:, :-1].contiguous())
    with pytest.raises(ValueError, match="x: expected shape"):
        wa.grad_weight(meta, g, x[:2])
    with pytest.raises(ValueError, match="grad_y: expected a contiguous"):
        wa.grad_input(meta, g.transpose(0, 2).contiguous().transpose(0, 2), w)
    with pytest.raises(ValueError, match="x: expected a contiguous"):
        wa.grad_weight(meta, g, x.transpose(0, 1).contiguous().transpose(0, 1))
    with pytest.raises(ValueError, match="weight: expected a tensor with values on cpu or cuda, got one on the meta"):
        wa.grad_input(meta, g, torch.empty(w.shape, dtype=torch.float16, device="meta"))
    with pytest.raises(ValueError, match="grad_y: batch must be >= 1"):
        wa.grad_input(meta, g[:0], w)
    with pytest.raises(TypeError, match="meta: expected a TrainingMeta"):
        wa.grad_input(None, g, w)
    with pytest.raises(KeyError, match="unknown gi config"):
        wa.grad_input(meta, g, w, config="gi9_nope")
    with pytest.raises(KeyError, match="unknown gw config"):
        wa.grad_weight(meta, g, x, config="gi2_p64b128")
    with pytest.raises(ValueError, match="finish: expected"):
        wa.grad_weight(meta, g, x, finish="atomic")
    with pytest.raises(ValueError, match="kind: expected"):
        wa.get_grad_kernel("fw", "x", "cpu")


def test_empty_reverse_csr_is_rejected():
    meta, x, w, g, *_ = _case("ODD", 3)
    from dataclasses import replace
    empty = replace(meta, rev_rowptr=torch.zeros(meta.nin + 1, dtype=torch.int32),
                    rev_col=torch.zeros(0, dtype=torch.int32), _per_device={})
    with pytest.raises(ValueError, match=r"meta\.rev_rowptr: .* differ from the table built from idx and rf_index"):
        wa.grad_input(empty, g, w)


# ---------------------------------------------------------------------------------- benchmark smoke

@pytest.mark.parametrize("mode", ["backward", "train-step"])
def test_backward_bench_smoke_on_cpu(tmp_path, mode, monkeypatch):
    """The benchmark runs end to end on the CPU (a synthetic shape, one rep) and writes JSON lines."""
    import json

    from fovi_lab.bench import backward as bench

    monkeypatch.setattr(adj_staged_plans, "_EMPTY_FILL", None)
    out = tmp_path / "bw.jsonl"
    args = [mode, "--layers", "ODD", "--batches", "3", "--reps", "1", "--warmup", "0", "--out", str(out)]
    if mode == "backward":
        args += ["--sweep", "--gi-configs", "gi2_p64b64", "--gw-configs", "gw3_p64n64"]
    assert bench.main(args) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    impls = {r["impl"] for r in recs}
    warp = "warp" if mode == "backward" else "warp_train"
    assert {warp, "torch_compact", "torch_autograd_gather_bmm", "torch_autograd_tgather_bmm"} <= impls
    for r in recs:
        assert r["ms"] is not None, r
        assert {"layer", "B", "impl", "ms", "device", "warp", "torch", "date"} <= set(r)
    w = next(r for r in recs if r["impl"] == warp)
    assert w["deterministic"] and w["err_dx"] < 1e-2 and w["err_dw"] < 1e-2
    # every eager step is timed back to back too, PyTorch's as well, and compared like for like
    assert w["pipelined_ms"] > 0 and w["strongest_pipelined"].startswith("torch")
    assert w["speedup_vs_strongest_pipelined"] > 0
    assert all(r.get("pipelined_ms", 0) > 0 for r in recs if r["impl"].startswith("torch") and not r.get("graphed"))
    if mode == "backward":
        assert {"warp_gi", "warp_gw"} <= impls


def test_fused_sweep_smoke_on_cpu(tmp_path):
    """``--sweep-fused --fused-only``: only the fused kernels, whole lists, splits and segments, each with
    its error against the oracle and its dense ceiling."""
    import json

    from fovi_lab.bench import backward as bench

    out = tmp_path / "fs.jsonl"
    assert bench.main(["backward", "--layers", "ODD", "--batches", "3", "--reps", "1", "--warmup", "0",
                       "--sweep-fused", "--fused-only", "--out", str(out)]) == 0
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    impls = {r["impl"] for r in recs}
    assert impls <= {"warp_dxn", "warp_dxs", "warp_dwn", "warp_dws"} and {"warp_dxn", "warp_dxs", "warp_dwn"} <= impls
    assert all(r["ms"] and r["err"] < 1e-2 for r in recs), [r for r in recs if not r["ms"]]
    assert {r["seg_steps"] for r in recs if r["impl"] == "warp_dxs"} >= {1, 2, 4}


@pytest.mark.parametrize("fp32", [False, True], ids=["f16stage", "f32stage"])
def test_csr_reductions_are_the_sequential_sum_bit_for_bit(fp32):
    """Rows of 0..21 entries cross the 8-, 4- and 1-wide loops of both reverse-index reductions; each
    output must equal the fp32 sum taken one entry at a time in index order (so unrolling is exact)."""
    from fovi_lab.kernels.common import fast_launch, warp_ct
    sdt = torch.float32 if fp32 else torch.float16
    g = torch.Generator().manual_seed(7)
    lens = torch.tensor([0, 1, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 21])
    rowptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    rowptr[1:] = torch.cumsum(lens, 0).to(torch.int32)
    nnz = int(rowptr[-1])
    stage = (torch.randn(64, 6, generator=g) * torch.logspace(-3, 3, 64).unsqueeze(1)).to(sdt)
    rows = torch.randint(0, 64, (nnz,), generator=g, dtype=torch.int32)

    def sequential(idx):
        want = torch.zeros(len(lens), 6, dtype=torch.float32)
        for r in range(len(lens)):
            for i in range(int(rowptr[r]), int(rowptr[r + 1])):
                want[r] += stage[int(idx[i])].float()             # one fp32 add at a time
        return want

    # dw: dwt[q, o] = sum_i dweff[w_col[i], o] (w_col ascending within a row, as the CSR builds it)
    w_col = torch.cat([torch.sort(rows[int(rowptr[r]):int(rowptr[r + 1])]).values for r in range(len(lens))])
    dw = torch.full((len(lens), 6), float("nan"))
    k = wa.get_grad_kernel("csr", "dw_f32" if fp32 else "dw_f16", "cpu").kernel
    fast_launch(k, (len(lens), 6), [warp_ct(rowptr), warp_ct(w_col), warp_ct(stage), 0, 2147483647, 0, warp_ct(dw)],
                256, "cpu", tiled=False)
    assert torch.equal(dw, sequential(w_col))
    # dx: out[c, m, b] = sum_i da[rev_row[i] + c*k, b]   (one channel, k = 0 offset)
    out = torch.full((1, len(lens), 6), float("nan"))
    k = wa.get_grad_kernel("csr", "dx_f32" if fp32 else "dx_f16", "cpu").kernel
    fast_launch(k, (len(lens), 1, 6), [warp_ct(rowptr), warp_ct(rows), warp_ct(stage), 0, warp_ct(out)], 256, "cpu",
                tiled=False)
    assert torch.equal(out[0], sequential(rows))


@pytest.mark.parametrize("b", [17, 64])
def test_cout96_stem_tiles_match_the_oracle_and_the_64_wide_tiles(b):
    """The 96-wide Cout tiles of the stems' staged-operand adjoints (alexnet's stem has Cout = 96), also
    with a 16-wide batch tile (gi) and 16-deep batch chunks (gw), on a Cin = 3, Cout = 96 layer: against
    the fp32 oracle, and against the 64/128-wide tiles they replace."""
    from fovi_lab.graph.meta import build_meta
    gen = torch.Generator().manual_seed(96)
    nin, nout, k, v, cin, cout = 50, 21, 9, 36, 3, 96
    idx = torch.randint(0, nin + 1, (nout, k), generator=gen)                 # nin = the pad token
    rf = torch.randint(0, v, (nout, k), generator=gen)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    x = torch.randn(b, cin, nin, generator=gen).half()
    w = (0.2 * torch.randn(cout, cin * v, generator=gen)).half()
    g = torch.randn(b, cout, nout, generator=gen).half()
    rdx = CompactTorchOps.grad_input(meta, g.float(), w.float())
    rdw = CompactTorchOps.grad_weight(meta, g.float(), x.float())
    for fp32 in (False, True):
        for gi in ("gi2i_p64b64o96", "gi3i_p64b128o96", "gi2i_p64b16o96"):
            dx = wa.grad_input(meta, g, w, config=gi, stage_fp32=fp32)
            torch.testing.assert_close(dx, rdx, atol=2e-2, rtol=2e-2)
            torch.testing.assert_close(dx, wa.grad_input(meta, g, w, config="gi2i_p64b64", stage_fp32=fp32),
                                       atol=1e-2, rtol=1e-2)
        for gw in ("gw3i_p64n96", "gw3i_p64n96k16"):
            dw = wa.grad_weight(meta, g, x, config=gw, stage_fp32=fp32)
            torch.testing.assert_close(dw, rdw, atol=5e-2, rtol=2e-2)
            torch.testing.assert_close(dw, wa.grad_weight(meta, g, x, config="gw3i_p64n128", stage_fp32=fp32),
                                       atol=2e-2, rtol=1e-2)
