"""The adjoint rule (``fovi_lab.kernels.adjoint.rule``): the paths of dx and dW are the rule's, under every switch, and
a call signature decides them once."""

from __future__ import annotations

import pytest
import torch

import fovi_lab.kernels.adjoint.rule as rule
from fovi_lab.graph.layers import LAYERS, layer_meta
from fovi_lab.graph.meta import build_meta, synthetic_graph
from fovi_lab.kernels.adjoint.as_forward import select_grad_mma
from fovi_lab.knn_warp import WarpTrainOps, grad_paths
from fovi_lab.ops.reference import CompactTorchOps


def _expected(meta, b, dtype, dx_sw="auto", dw_sw="auto", grad_sw="auto"):
    kernels = ("fused" if meta.cin >= 16 else "staged") if grad_sw == "auto" else grad_sw
    cfg = select_grad_mma(meta, b, dtype)
    one = lambda sw: kernels if sw == "off" else ("mma" if sw == "mma" or cfg is not None else kernels)  # noqa: E731
    # the stems' rule: dW alone on the tensor cores, fp16 from 16 rows, where the staged kernels are the layer's
    stem = kernels == "staged" and dw_sw == "auto" and meta.cin < 16 and dtype == torch.float16 and b >= 16 \
        and b <= 4 * _rows_that_fit(meta)
    return one(dx_sw), "mma" if stem else one(dw_sw), kernels


def _rows_that_fit(meta, budget_mib: int = 32) -> int:
    """The most batch rows whose tap tables fit ``budget_mib``, counted up from one row (not the package's way)."""
    from fovi_lab.graph.meta import tap_table_bytes
    r = 1
    while tap_table_bytes(meta, r + 1) <= budget_mib << 20:
        r += 1
    return r


@pytest.mark.parametrize("layer", list(LAYERS))
def test_plan_is_the_rule_on_every_layer(layer):
    meta = layer_meta(layer)
    for b in (1, 16, 64, 512):
        for dtype in (torch.float16, torch.bfloat16):
            plan = rule.adjoint_plan(meta, b, dtype)
            assert (plan.dx, plan.dw, plan.kernels) == _expected(meta, b, dtype), (layer, b, dtype)
            assert grad_paths(meta, b, dtype) == (plan.dx, plan.dw)


@pytest.mark.parametrize("dx_sw, dw_sw, grad_sw", [("off", "auto", "auto"), ("mma", "off", "auto"),
                                                   ("auto", "mma", "staged"), ("off", "off", "fused")])
def test_switches(monkeypatch, dx_sw, dw_sw, grad_sw):
    monkeypatch.setenv("FOVI_KNN_DX_PATH", dx_sw)
    monkeypatch.setenv("FOVI_KNN_DW_PATH", dw_sw)
    monkeypatch.setenv("FOVI_KNN_GRAD_PATH", grad_sw)
    for layer, b in (("res18_layer1", 64), ("alex_L0", 16), ("res18_layer4_0", 16)):
        meta = layer_meta(layer)
        plan = rule.adjoint_plan(meta, b, torch.float16)
        assert (plan.dx, plan.dw, plan.kernels) == _expected(meta, b, torch.float16, dx_sw, dw_sw, grad_sw)
        assert plan.forced == (dx_sw == "mma", dw_sw == "mma")


def _problem(cin: int, cout: int, batch: int, seed: int):
    """A synthetic layer (40 -> 24 nodes, K = 9, V = 11) and fp16 ``x``, ``w``, ``grad_y`` for it."""
    idx, rf = synthetic_graph(40, 24, 9, 11, 6, seed=seed)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=11, nin=40)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, cin, 40, generator=g).half()
    w = (torch.randn(cout, cin * 11, generator=g) / 8).half()
    return meta, x, w, torch.randn(batch, cout, 24, generator=g).half()


def test_a_call_signature_decides_once(monkeypatch):
    calls = []
    real = rule.decide
    monkeypatch.setattr(rule, "decide", lambda *a: calls.append(a) or real(*a))
    meta, x, w, gy = _problem(cin=16, cout=24, batch=5, seed=2)
    first = WarpTrainOps.backward_combined(meta, gy, x, w)
    second = WarpTrainOps.backward_combined(meta, gy, x, w)
    assert len(calls) == 1
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    monkeypatch.setenv("FOVI_KNN_GRAD_PATH", "staged")                 # a switch changes: decided anew
    staged = WarpTrainOps.backward_combined(meta, gy, x, w)
    assert len(calls) == 2 and rule.adjoint_plan(meta, 5, torch.float16).kernels == "staged"
    for a, b in zip(first, staged):      # both paths compute the same gradients (the staged ones stage in fp16)
        assert float((a - b).abs().max()) <= 2e-3 * float(a.abs().max())


@pytest.mark.parametrize("device", ["cpu", "cuda:0"])
def test_fused_picks_are_the_fused_rules(device):
    """The plan's fused picks are what the fused family's rules give on that device (tiles, segments, splits)."""
    import fovi_lab.kernels.adjoint.fused_plans as nm
    from fovi_lab.kernels.adjoint.fused import select_dw_nm_config, select_dx_nm_config
    from fovi_lab.kernels.adjoint.fused_build import _spec
    for layer in LAYERS:
        meta = layer_meta(layer)
        for b in (1, 16, 64, 512):
            plan = rule.decide(meta, b, torch.float16, device)
            if plan.kernels != "fused":
                assert plan.fused is None and meta.cin < rule.FUSED_MIN_CIN
                continue
            dx, dw = plan.fused
            seg = nm.default_dx_seg_steps(meta, b, device)
            assert (dx.config, dx.seg_steps, dx.nsplit) == (
                select_dx_nm_config(b, meta.cin, meta.nin, segments=bool(seg)), seg, 1), (layer, b)
            name = select_dw_nm_config(meta.cout, meta.cin, b)
            seg = nm.default_dw_seg_steps(meta, b, _spec("dwn", name), device)
            assert (dw.config, dw.seg_steps) == (name, seg), (layer, b)
            assert dw.nsplit == (1 if seg else nm.default_dw_nsplit(meta, b, _spec("dwn", name), device))
            assert dx.kind == ("dxs" if dx.seg_steps else "dxn") and dw.kind == ("dws" if dw.seg_steps else "dwn")
            assert "tile" in dx.words() and "tile" in dw.words()
    if device == "cpu":                  # the CPU runs whole lists and one split
        plan = rule.decide(layer_meta("res18_layer2_0"), 64, torch.float16, "cpu")
        assert plan.fused[0].seg_steps == 0 and plan.fused[1].nsplit == 1


def test_fused_calls_take_the_plan_and_decide_nothing(monkeypatch):
    """After the first call of a signature, a fused backward runs the plan's picks without asking a rule again;
    a plan whose rules segment the lists (as they do on a GPU) runs the segmented kernels, within tolerance."""
    import fovi_lab.kernels.adjoint.fused as fused
    import fovi_lab.kernels.adjoint.fused_plans as nm
    asked = []
    for mod, name in ((nm, "default_dx_seg_steps"), (nm, "default_dw_seg_steps"), (nm, "default_dw_nsplit"),
                      (fused, "select_dx_nm_config"), (fused, "select_dw_nm_config"),
                      (nm, "select_dx_nm_config"), (nm, "select_dw_nm_config")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _r=real, _n=name, **k: asked.append(_n) or _r(*a, **k))
    meta, x, w, gy = _problem(cin=24, cout=20, batch=7, seed=3)
    first = WarpTrainOps.backward_combined(meta, gy, x, w)
    assert asked                                       # the first call decided
    n = len(asked)
    again = WarpTrainOps.backward_combined(meta, gy, x, w)
    alone = WarpTrainOps.grad_input(meta, gy, w), WarpTrainOps.grad_weight(meta, gy, x)
    assert len(asked) == n                             # the later ones looked the plan up
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(first, again, alone))
    monkeypatch.setattr(nm, "default_dx_seg_steps", lambda *a: 2)     # rules that segment (as on a GPU)
    monkeypatch.setattr(nm, "default_dw_seg_steps", lambda *a: 3)
    plan = rule.decide(meta, 7, torch.float16)
    assert (plan.fused[0].seg_steps, plan.fused[1].seg_steps) == (2, 3)
    rule.forget_plans(meta)
    assert rule.adjoint_plan(meta, 7, torch.float16) == plan
    seg = WarpTrainOps.backward_combined(meta, gy, x, w)
    ref = CompactTorchOps.grad_input(meta, gy.float(), w.float()), CompactTorchOps.grad_weight(meta, gy.float(), x.float())
    for a, r in zip(seg, ref):
        assert float((a - r).abs().max()) <= 2e-3 * float(r.abs().max())


def test_explain_names_the_fused_picks_of_the_device():
    """explain() prints the fused kernels a call runs on that device: the GPU plan's segments, the CPU's whole
    lists and single split."""
    import fovi_lab
    meta = layer_meta("res18_layer2_0")
    for device, dev in (("h200", "cuda"), ("cpu", "cpu")):
        dx, dw = rule.decide(meta, 64, torch.float16, dev).fused
        ex = fovi_lab.explain("res18_layer2_0", 64, "fp16", device)
        assert ex.dx.startswith("fused") and f"{dx.words()}  [{dx.config}]" in ex.dx
        assert f"{dw.words()}  [{dw.config}]" in ex.dw
    assert rule.decide(meta, 64, torch.float16, "cuda").fused[0].seg_steps > 0       # the H200 sweep's segments
    assert "whole reverse lists" in fovi_lab.explain("res18_layer2_0", 64, "fp16", "cpu").dx


@pytest.mark.parametrize("layer, on_tensor_cores", [("res18_stem", (16, 40, 64)), ("alex_L0", (16,))])
def test_a_stems_dw_runs_on_the_tensor_cores_in_batch_chunks(layer, on_tensor_cores):
    """The stems' dW on the tap layer in chunks whose tables fit STEM_DW_TABLE_MIB, up to STEM_DW_MAX_CHUNKS chunks:
    the rule's plan, the words, and a batch that is no multiple of the chunk (zero rows pad the last chunk) against
    the fp64 oracle, bitwise repeatable and equal to the tap layer over the whole batch to fp32 rounding (sums of
    other lengths)."""
    import fovi_lab.knn_warp as K
    from fovi_lab.graph.meta import tap_table_bytes
    from fovi_lab.kernels.adjoint import as_forward as af
    meta = layer_meta(layer)
    for b in (8, 16, 40, 64, 256):
        plan = rule.adjoint_plan(meta, b, torch.float16)
        rows = plan.dw_batch_chunk
        if b not in on_tensor_cores:
            assert (plan.dx, plan.dw, rows) == ("staged", "staged", 0), b
            continue
        assert (plan.dx, plan.dw, plan.dw_config) == ("staged", "mma", "mmas_o64b8") and 1 <= rows <= b
        fit = _rows_that_fit(meta)
        chunks = -(-b // rows)
        assert tap_table_bytes(meta, rows) <= af.STEM_DW_TABLE_MIB << 20
        assert chunks == -(-b // fit) <= af.STEM_DW_MAX_CHUNKS      # the fewest chunks that fit
        assert chunks * rows - b < chunks                           # as even as the batch allows
    assert rule.adjoint_plan(meta, 16, torch.bfloat16).dw == "staged"   # the split configs are fp16 only
    assert rule.adjoint_plan(meta, 8, torch.float16).dw == "staged"     # below the rule's batch
    assert "in batch chunks of" in rule.gradient_words(rule.adjoint_plan(meta, 16, torch.float16), "dW")
    # the staged dx names the switch that puts it on the tensor cores
    assert "FOVI_KNN_DX_PATH=taps" in rule.gradient_words(rule.adjoint_plan(meta, 16, torch.float16), "dx")
    b = 40 if layer == "res18_stem" else 17             # 3 chunks of 14 rows; of 6 rows
    g0 = torch.Generator().manual_seed(b)
    x = torch.randn(b, meta.cin, meta.nin, generator=g0).half()
    g = torch.randn(b, meta.cout, meta.nout, generator=g0).half()
    rows = rule.adjoint_plan(meta, b, torch.float16).dw_batch_chunk
    assert b % rows != 0
    ref = CompactTorchOps.grad_weight(meta, g.double(), x.double())
    dw = K.grad_weight(meta, g, x)
    assert dw.dtype == torch.float32 and torch.equal(dw, K.grad_weight(meta, g, x))
    assert float((dw.double() - ref).abs().max()) <= 2e-6 * float(ref.abs().max())
    whole = af.grad_weight_mma(meta, g, x, "mmas_o64b8")
    assert float((dw - whole).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_the_stems_rule_reads_the_table_budget_and_a_forced_switch(monkeypatch):
    """FOVI_KNN_TAP_TABLE_MIB below the stems' own budget shrinks the chunks (a plan made under it is another plan);
    FOVI_KNN_DW_PATH=mma on a stem runs the rule's chunks and config at any batch, fp16; off keeps dW staged."""
    from fovi_lab.graph.meta import tap_table_bytes
    meta = layer_meta("res18_stem")
    assert rule.adjoint_plan(meta, 40, torch.float16).dw_batch_chunk == 14
    monkeypatch.setenv("FOVI_KNN_TAP_TABLE_MIB", "16")
    plan = rule.adjoint_plan(meta, 16, torch.float16)
    assert plan.dw == "mma" and tap_table_bytes(meta, plan.dw_batch_chunk) <= 16 << 20 < tap_table_bytes(meta, 16)
    assert rule.adjoint_plan(meta, 40, torch.float16).dw == "staged"          # 5 chunks of 8 rows: past the cap
    monkeypatch.delenv("FOVI_KNN_TAP_TABLE_MIB")
    alex = layer_meta("alex_L0")
    assert rule.adjoint_plan(alex, 128, torch.float16).dw == "staged"
    monkeypatch.setenv("FOVI_KNN_DW_PATH", "mma")
    plan = rule.adjoint_plan(alex, 128, torch.float16)
    assert (plan.dw, plan.dw_config, plan.dw_batch_chunk, plan.forced) == ("mma", "mmas_o64b8", 7, (False, True))
    assert rule.adjoint_plan(alex, 128, torch.bfloat16).dw_config is None     # no bf16 split config
    monkeypatch.setenv("FOVI_KNN_DW_PATH", "off")
    assert rule.adjoint_plan(meta, 40, torch.float16).dw == "staged"


def test_every_layers_dw_on_the_tensor_cores_keeps_its_tap_tables_within_the_budget(monkeypatch):
    """The tap layer's tables grow with the batch: a dW on the tensor cores runs in batch chunks whose tables fit
    STEM_DW_TABLE_MIB (and FOVI_KNN_TAP_TABLE_MIB), the whole batch at once where it fits; chunked, dW is against the
    fp64 oracle, bitwise repeatable and the whole batch's to fp32 rounding."""
    import fovi_lab.knn_warp as K
    from fovi_lab.graph.meta import tap_table_bytes
    from fovi_lab.kernels.adjoint import as_forward as af
    meta = layer_meta("alex_L1")
    budget = af.STEM_DW_TABLE_MIB << 20
    assert rule.adjoint_plan(meta, 64, torch.float16).dw_batch_chunk == 0 and tap_table_bytes(meta, 64) <= budget
    plan = rule.adjoint_plan(meta, 256, torch.float16)
    assert plan.dw == "mma" and plan.dw_config is None and 1 <= plan.dw_batch_chunk < 256
    assert tap_table_bytes(meta, plan.dw_batch_chunk) <= budget < tap_table_bytes(meta, 256)
    assert f"in batch chunks of {plan.dw_batch_chunk} rows" in rule.gradient_words(plan, "dW")
    meta = layer_meta("res18_layer1")
    b = 64
    monkeypatch.setenv("FOVI_KNN_TAP_TABLE_MIB", "2")
    plan = rule.adjoint_plan(meta, b, torch.float16)
    rows = plan.dw_batch_chunk
    assert plan.dw == "mma" and 1 <= rows < b and tap_table_bytes(meta, rows) <= 2 << 20
    g0 = torch.Generator().manual_seed(b)
    x = torch.randn(b, meta.cin, meta.nin, generator=g0).half()
    g = torch.randn(b, meta.cout, meta.nout, generator=g0).half()
    ref = CompactTorchOps.grad_weight(meta, g.double(), x.double())
    dw = K.grad_weight(meta, g, x)
    assert dw.dtype == torch.float32 and torch.equal(dw, K.grad_weight(meta, g, x))
    assert float((dw.double() - ref).abs().max()) <= 2e-6 * float(ref.abs().max())
    monkeypatch.delenv("FOVI_KNN_TAP_TABLE_MIB")           # the whole batch's tap layer is over that budget
    whole = af.grad_weight_mma(meta, g, x, plan.config("dW"))
    assert float((dw - whole).abs().max()) <= 1e-5 * float(ref.abs().max())


def test_explain_says_what_tables_the_layer_keeps():
    """explain() names the index tables the call's plan keeps on the device, each derived layer with its size as
    held_bytes counts it: on the H200's plan res18_layer1 at B = 64 keeps the transposed layer (dx) and the tap layer
    at B = 64 (dW), the stem the tap layer of its batch chunks alone."""
    import fovi_lab
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.graph.meta import held_bytes, tap_meta, transposed_meta
    text = str(fovi_lab.explain("res18_layer1", 64, device="h200"))
    meta = layer_meta("res18_layer1")
    line = next(line for line in text.splitlines() if line.startswith("index tables kept on the device:"))
    assert f"its own {held_bytes(meta, derived=False) / 2**20:.1f} MiB" in line
    assert f"the transposed layer (dx on tensor cores) {held_bytes(transposed_meta(meta)) / 2**20:.1f} MiB" in line
    assert f"the tap layer at B = 64 (dW on tensor cores) {held_bytes(tap_meta(meta, 64)) / 2**20:.1f} MiB" in line
    stem = next(line for line in str(fovi_lab.explain("res18_stem", 64, device="h200")).splitlines()
                if line.startswith("index tables"))
    assert "transposed" not in stem and "-row batch chunk (dW on tensor cores)" in stem
