"""Headless tests of the lab (fovi_lab.lab): the models, the widget callbacks of notebooks 02, 04 and 05
(valid runs on Warp's CPU device, and invalid choices answered with a message), and the loaders and
figures of recorded data (with fixture records, and with none)."""

import json
import math

import plotly.graph_objects as go
import pytest
import torch

from fovi_lab import lab as kl
from fovi_lab.lab import forward_explorer as lab_forward_explorer
from fovi_lab.lab import problems as lab_problems
from fovi_lab.lab import records as lab_records
from fovi_lab.lab import records_forward_viz, records_select
from fovi_lab.lab.labels import short_label
from fovi_lab.bench.common import compact_bytes, compact_flops
from fovi_lab.ops.reference import oracle_forward
from fovi_lab.graph.meta import pad_to

CPU = "cpu"


def _is_fig(fig):
    return isinstance(fig, go.Figure) and not isinstance(fig, go.FigureWidget)


def _annotation(fig):
    return " ".join(a.text for a in fig.layout.annotations)


# ------------------------------------------------------------------------------------------ text

def test_tolerance_class_and_parity_line():
    assert kl.tolerance_class(0.0) == "= 0 (bitwise)"
    assert kl.tolerance_class(3.2e-4) == "< 1e-3"
    assert kl.tolerance_class(1e-3) == "< 1e-2"          # strictly below
    assert kl.tolerance_class(0.5) == "< 1e0"
    assert kl.tolerance_class(7.0) == "< 1e1"
    assert kl.tolerance_class(math.inf).startswith("inf")
    assert kl.tolerance_class(float("nan")) == "not computed"
    assert kl.parity_line("x", 2e-4, 1e-2) == "PASS  x: max error < 1e-3 (tolerance 1e-2)"
    assert kl.parity_line("x", 0.5, 1e-2).startswith("FAIL")
    assert kl.parity_line("x", math.inf, 1e-2).startswith("FAIL")
    assert kl.parity_line("x", 3e-17, 1e-12, coarse=True) == "PASS  x: max error below 1e-12"
    assert kl.parity_line("x", 1e-3, 1e-12, coarse=True).startswith("FAIL  x: max error < 1e-2")


def test_rel_error():
    a = torch.tensor([1.0, 2.0, 3.0])
    assert kl.rel_error(a, a) == 0.0
    assert kl.rel_error(a + 0.03, a) == pytest.approx(0.01)
    assert kl.rel_error(torch.tensor([0.1]), torch.tensor([0.0])) == pytest.approx(0.1)  # floor 1
    assert kl.rel_error(torch.tensor([float("nan")]), torch.tensor([0.0])) == math.inf
    with pytest.raises(ValueError):
        kl.rel_error(a, a[:2])


def test_show_source_marks_lines():
    from fovi_lab.kernels import forward as F
    marks = {"tile_load_indexed(wt": "W", "tile_matmul(": "GEMM", "no such line here": "gone"}
    text = kl.show_source(F.make_gather_kernel, marks)
    assert "# <- [W]" in text and "# <- [GEMM]" in text
    assert "no longer here" in text and "no such line here" in text
    assert kl.missing_marks(F.make_gather_kernel, marks) == ["no such line here"]
    assert text.splitlines()[0].lstrip().startswith("1  def make_gather_kernel")


def test_format_result_and_message_figure():
    assert kl.format_result({"a": 1.234567, "b": "x"}, ["a", "b", "c"]) == "a: 1.2346\nb: x\nc: None"
    fig = kl.message_figure("hello")
    assert _is_fig(fig) and "hello" in _annotation(fig)


def test_device_line_has_no_names():
    cpu, gpu = kl.device_line("cpu"), kl.device_line("cuda:0")
    assert "CPU" in cpu and "GPU" in gpu and "H200" not in gpu
    assert kl.setup(0) in ("cpu", "cuda:0")


# ------------------------------------------------------------------------------------------ problems

def test_make_meta_variants():
    m = kl.make_meta("res18_layer1")
    assert (m.cin, m.cout, m.nout, m.k) == (64, 64, 230, 9)
    m2 = kl.make_meta("res18_layer1", cout=40, nodes=17)
    assert (m2.cin, m2.cout, m2.nin, m2.nout, m2.k, m2.v) == (64, 40, 230, 17, 9, m.v)
    assert torch.equal(m2.input_linear, m.input_linear[:17])
    odd = kl.make_meta("ODD")
    assert (odd.cin, odd.cout, odd.nin, odd.nout) == (17, 7, 300, 33)
    with pytest.raises(KeyError):
        kl.make_meta("no_such_layer")
    assert set(kl.LAYER_CHOICES) >= {"alex_L1", "MAIN", "ODD", "PAD_HEAVY"}


def test_make_problem_reproducible():
    a = kl.make_problem("ODD", 5, seed=3)
    b = kl.make_problem("ODD", 5, seed=3)
    assert torch.equal(a.x, b.x) and torch.equal(a.weight, b.weight)
    assert a.x.dtype == torch.float16 and a.x.shape == (5, 17, 300)
    assert a.grad_y.shape == (5, 7, 33) and a.bias.shape == (7,) and a.batch == 5
    assert kl.make_problem("ODD", 5, bias=False).bias is None


def test_reference_forward_switches_to_chunked():
    pb = kl.make_problem("ODD", 4)
    ref, name = kl.reference_forward(pb.meta, pb.x, pb.weight, pb.bias)
    assert name == "fp32 oracle"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lab_problems, "ORACLE_MAX_ELEMS", 1)
        ref2, name2 = kl.reference_forward(pb.meta, pb.x, pb.weight, pb.bias)
        dx, dw, gname = kl.reference_grads(pb.meta, pb.x, pb.weight, pb.grad_y)
    assert name2 == "fp32 torch_compact" and torch.allclose(ref, ref2, atol=1e-5)
    assert gname == "fp32 torch_compact adjoints"
    dx1, dw1, _ = kl.reference_grads(pb.meta, pb.x, pb.weight, pb.grad_y)
    assert torch.allclose(dx, dx1, atol=1e-4) and torch.allclose(dw, dw1, atol=1e-4)


# ------------------------------------------------------------------------------------------ models

def test_forward_counts_match_bench_common():
    s = kl.shape_of("alex_L1")
    c = kl.forward_counts(s, 512)
    assert c["flops"] == compact_flops(512, s["p64"], s["cout"], s["nout"])
    assert c["bytes"] == compact_bytes(512, s["cin"], s["nin"], s["cout"], s["q"], s["nout"], s["p64"])
    assert c["intensity"] == pytest.approx(c["flops"] / c["bytes"])
    assert c["weff_bytes"] == 2 * s["nout"] * s["p64"] * 256
    assert c["dense_flops"] == 2 * 512 * s["q"] * s["cout"] * s["nout"]


def test_tile_traffic_reuse_halves_weight_stream():
    s = kl.shape_of("res18_layer1")
    t1, t2, t4 = (kl.tile_traffic(s, 512, 32, 64, r) for r in (1, 2, 4))
    assert t2["w_bytes"] == pytest.approx(t1["w_bytes"] / 2)
    assert t4["w_bytes"] == pytest.approx(t1["w_bytes"] / 4)
    assert t1["a_bytes"] == t2["a_bytes"] == t4["a_bytes"]
    assert t1["ctas"] == 230 * 16 * 1 and t4["ctas"] == 230 * 4
    assert t4["smem"] > t2["smem"] > t1["smem"]
    assert t1["padded_flops"] == pytest.approx(t1["flops"])          # 512 = 16 tiles of 32, Cout = 64
    odd = kl.tile_traffic(kl.shape_of("ODD"), 37, 32, 64)
    assert odd["padded_flops"] > odd["flops"] and 0 < odd["padding_waste"] < 1
    assert kl.tile_smem_estimate(32, 64, 1) == 32 * 64 * 2 + 64 * 64 * 2 + 32 * 64 * 4 + 2 * 64 * 4 + 64 * 4
    rows = kl.traffic_table(s, 64)
    assert len(rows) == 12
    assert _is_fig(kl.traffic_figure(s, 64))


def test_node_gemm_is_the_operator():
    pb = kl.make_problem("ODD", 6, bias=False)
    ref = oracle_forward(pb.x.double(), pb.weight.double(), None, pb.meta.idx, pb.meta.rf_index, pb.meta.v,
                         dtype=torch.float64)
    for n in (0, 17, pb.meta.nout - 1):
        d = kl.node_gemm(pb.meta, pb.x, pb.weight, n)
        assert d["A"].shape == (6, pb.meta.p64) and d["W"].shape == (pb.meta.p64, 7)
        assert torch.allclose(d["y"], ref[:, :, n], atol=1e-12)
        assert bool((d["A"][:, d["is_pad"]] == 0).all())
    with pytest.raises(IndexError):
        kl.node_gemm(pb.meta, pb.x, pb.weight, pb.meta.nout)
    assert _is_fig(kl.node_gemm_figure(pb.meta, pb.x, pb.weight, 3, tile_m=4, tile_n=4))


# ------------------------------------------------------------------------------------------ forward widget

def test_explore_forward_registered_and_log():
    log = kl.RunLog()
    res, fig = kl.explore_forward("ODD", 37, None, 32, 64, 1, 128, device=CPU, log=log)
    assert res["ok"] and res["passed"], res["message"]
    assert res["config"] == "m32n64" and res["registered"]
    assert res["parity"].startswith("PASS") and "ODD" in res["parity"]
    assert res["compile_s"] >= 0 and res["run_ms"] > 0 and res["torch_ms"] > 0
    assert res["clamp"] is None and res["batch"] == 37
    assert _is_fig(fig) and len(log.runs) == 1
    res2, fig2 = kl.explore_forward("ODD", 37, 9, 32, 64, 1, 128, device=CPU, log=log)
    assert res2["ok"] and res2["cout"] == 9 and res2["compile_s"] == 0.0   # already built
    assert len(log.runs) == 2 and len(fig2.data[0].x) == 2
    assert kl.registered_forward_config("uncached", 64, 64, 2, 256) == "m64n64r2b256"
    assert kl.registered_forward_config("cached", 32, 64, 1, 128) == "c_m32n64"
    assert kl.registered_forward_config("uncached", 8, 16, 1, 32) is None


def test_explore_forward_cached_and_reuse():
    res, _ = kl.explore_forward("ODD", 37, None, 32, 64, 1, 128, kernel="cached", device=CPU)
    assert res["ok"] and res["passed"] and res["config"] == "c_m32n64", res["message"]
    res, _ = kl.explore_forward("PAD_HEAVY", 70, None, 32, 64, 2, 128, device=CPU)
    assert res["ok"] and res["passed"] and res["config"] == "m32n64r2", res["message"]


def test_explore_forward_unregistered_tiles():
    res, _ = kl.explore_forward("ODD", 11, None, 8, 16, 1, 32, device=CPU)
    assert res["ok"] and res["passed"], res["message"]
    assert res["config"] == "lab_m8n16r1b32" and not res["registered"]


def test_explore_forward_clamps_on_cpu():
    res, _ = kl.explore_forward("alex_L1", 512, None, 32, 64, 1, 128, device=CPU, budget=2e8)
    assert res["ok"] and res["passed"], res["message"]
    assert res["batch"] == 32 and res["nodes"] < 230
    assert "clamped" in res["clamp"] and "clamped" in res["message"]


def test_forward_clamp_gives_every_r_one_problem():
    # the tile work a clamp reads does not change with r, and the batch stops at one sub-tile, not at tile_m * r
    shape = kl.shape_of(lab_problems.make_meta("res18_layer1", None, None))
    assert kl.forward_clamp(shape, 128, 32, 64, CPU)[:2] == (64, None)
    assert kl.forward_clamp(shape, 128, 32, 64, "cuda:0") == (128, None, None)
    runs = {r: kl.explore_forward("ODD", 128, None, 32, 64, r, 128, device=CPU, budget=6e7)[0] for r in (1, 4)}
    assert all(res["ok"] and res["passed"] for res in runs.values()), [res["message"] for res in runs.values()]
    assert {(res["batch"], res["nodes"], res["clamp"]) for res in runs.values()} == {(64, 33, runs[1]["clamp"])}
    assert "batch 128 -> 64" in runs[1]["clamp"]
    assert runs[4]["w_bytes"] == pytest.approx(runs[1]["w_bytes"] / 2)      # B = 64 fills 2 of r = 4's 32-row tiles
    assert runs[1]["fill"] is None and runs[4]["fill"].startswith("B = 64 fills 2 of the 4 batch tiles")
    assert kl.reuse_fill(64, 16, 4) is None and kl.reuse_fill(37, 32, 2) is None


@pytest.mark.parametrize("kwargs, words", [
    (dict(layer="nope"), "layer must be one of"),
    (dict(batch=0), "batch must be"),
    (dict(batch=True), "batch must be"),
    (dict(batch=2.5), "batch must be"),
    (dict(cout=0), "Cout must be"),
    (dict(tile_m=48), "tile_m must be one of"),
    (dict(tile_n=True), "tile_n must be one of"),
    (dict(r=3), "r must be one of"),
    (dict(block_dim=100), "block_dim must be one of"),
    (dict(kernel="dense"), "kernel must be one of"),
    (dict(rf="rf3"), "rf must be"),
    (dict(kernel="cached", r=2), "no weight-reuse loop"),
    (dict(tile_m=128, tile_n=256, r=4), "unlaunchable"),
])
def test_explore_forward_invalid_gives_message(kwargs, words):
    log = kl.RunLog()
    res, fig = kl.explore_forward(**dict(dict(layer="ODD", batch=8, device=CPU, log=log), **kwargs))
    assert res["ok"] is False and res["passed"] is False
    assert words in res["message"]
    assert _is_fig(fig) and words in _annotation(fig)
    assert log.runs == []


def test_explore_forward_unlaunchable_after_build(monkeypatch):
    # a config the estimate lets through but the canary refuses: still a message, not an exception
    monkeypatch.setattr(lab_forward_explorer, "_forward_kernel", lambda *a: ("lab_x", None, None, False, "canary says no", True))
    res, fig = kl.explore_forward("ODD", 8, None, 32, 64, 1, 128, device=CPU)
    assert not res["ok"] and "canary says no" in res["message"]


def test_explore_forward_internal_error_is_a_message(monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("kaboom\nsecond line")
    monkeypatch.setattr(lab_forward_explorer, "make_problem", boom)
    res, fig = kl.explore_forward("ODD", 8, device=CPU)
    assert not res["ok"] and res["message"] == "could not run: RuntimeError: kaboom"


def test_runlog_figure():
    log = kl.RunLog()
    assert "no runs yet" in _annotation(log.figure())
    log.add(dict(label="a", compile_s=1.0, run_ms=2.0, torch_ms=3.0, passed=True))
    log.add(dict(label="b", compile_s=0.0, run_ms=2.5, torch_ms=3.0, passed=False))
    fig = log.figure("msg")
    assert _is_fig(fig) and fig.layout.title.text == "runs so far: not run<br><sub>msg</sub>"
    assert list(fig.data[1].marker.color) == [kl.COLOURS["warp"], kl.COLOURS["fail"]]


def test_runlog_figure_reads_cleanly():
    """A short title (the log's and the verdict), the whole message wrapped under it, the legend between the title
    and the plot area (clear of the rotated run labels), every axis titled, units on the numbers."""
    from fovi_lab.lab import figure_layout as fl
    log = kl.RunLog(title="forward runs")
    for i in range(6):
        log.add(dict(label=f"res18_layer1 B=16 gather tiles 32x64, r = {i}", compile_s=1.0, run_ms=2.0,
                     torch_ms=3.0, passed=True, torch_name="torch_compact (fp32 on the CPU)"))
    message = ("PASS  " + "tile GEMM over gathered rows, 32 rows x 64 channels per tile, " * 3
               + "max error < 1e-3 (tolerance 1e-2)  [clamped for Warp's CPU device: batch 64 -> 16]")
    fig = log.figure(message)
    lines = fig.layout.title.text.split("<br>")
    assert lines[0] == "forward runs: PASS" and len(lines) >= 3 and all(x.startswith("<sub>") for x in lines[1:])
    assert " ".join(message.split()) in fl.title_text(fig.layout.title.text)
    assert "&lt; 1e-3" in fig.layout.title.text and "-&gt; 16" in fig.layout.title.text   # not read as a tag
    assert fig.layout.legend.yref == "container" and fig.layout.legend.yanchor == "top"
    assert fl.clipped_titles(fig) == [] and fl.legend_over_ticks(fig) == [] and fl.overlapping_boxes(fig) == []
    assert fl.axes_without_units(fig) == []
    assert log.figure("FAIL  y: max error < 1").layout.title.text.startswith("forward runs: FAIL<br>")
    assert log.figure().layout.title.text == "forward runs"


def test_reuse_live_and_figure():
    rows = kl.reuse_live("ODD", 64, 16, 32, rs=(1, 2), block_dim=64, device=CPU)
    assert [r["r"] for r in rows] == [1, 2] and all(r["passed"] for r in rows)
    assert rows[0]["rel_time"] == 1.0 and rows[1]["rel_time"] > 0
    assert rows[1]["w_bytes"] == pytest.approx(rows[0]["w_bytes"] / 2)
    assert _is_fig(kl.reuse_live_figure(rows))
    assert "no successful run" in _annotation(kl.reuse_live_figure([{"ok": False}]))


# ------------------------------------------------------------------------------------------ adjoints

def test_adjoint_by_node_gemms_matches_autograd():
    pb = kl.make_problem("ODD", 5, bias=False)
    dx, dw = kl.adjoint_by_node_gemms(pb.meta, pb.x, pb.weight, pb.grad_y)
    rdx, rdw, _ = kl.reference_grads(pb.meta, pb.x, pb.weight, pb.grad_y, dtype=torch.float64)
    assert torch.allclose(dx, rdx, atol=1e-10) and torch.allclose(dw, rdw, atol=1e-10)


def test_explore_adjoint_valid():
    log = kl.RunLog()
    res, fig = kl.explore_adjoint("ODD", 37, None, "gi2_p64b64", "gw3_p64n64", device=CPU, log=log)
    assert res["ok"] and res["passed"] and res["deterministic"], res["message"]
    assert res["parity_dx"].startswith("PASS") and res["parity_dw"].startswith("PASS")
    assert res["gi_ctas"] == 33 and res["gw_ctas"] == 33 * 3
    assert _is_fig(fig) and len(log.runs) == 1
    res2, _ = kl.explore_adjoint("PAD_HEAVY", 20, 40, "gi3_p64b64", "gw3_p64n64", device=CPU, log=log)
    assert res2["ok"] and res2["passed"] and res2["cout"] == 40, res2["message"]


def test_explore_adjoint_clamps():
    res, _ = kl.explore_adjoint("alex_L1", 512, None, "gi2_p64b64", "gw3_p64n64", device=CPU, budget=3e8)
    assert res["ok"] and res["passed"], res["message"]
    assert res["batch"] == 64 and res["nodes"] < 230 and "clamped" in res["clamp"]


@pytest.mark.parametrize("kwargs, words", [
    (dict(gi_config="gi9"), "gi config must be"),
    (dict(gw_config="gw9_p64n64"), "gw config must be"),
    (dict(layer="nope"), "layer must be"),
    (dict(batch=-3), "batch must be"),
    (dict(cout=99999), "Cout must be"),
])
def test_explore_adjoint_invalid_gives_message(kwargs, words):
    res, fig = kl.explore_adjoint(**dict(dict(layer="ODD", batch=8, device=CPU), **kwargs))
    assert not res["ok"] and words in res["message"] and words in _annotation(fig)


def test_explore_adjoint_unlaunchable(monkeypatch):
    from fovi_lab.kernels import adjoint as wa
    monkeypatch.setattr(wa, "get_grad_kernel", lambda kind, name, dev: None)
    res, _ = kl.explore_adjoint("ODD", 8, device=CPU)
    assert not res["ok"] and res["message"].startswith("unlaunchable on this device: gi kernel")


def test_determinism_demo():
    pb = kl.make_problem("ODD", 9, bias=False)
    d = kl.determinism_demo(pb, "gi2_p64b64", "gw3_p64n64", runs=2)
    assert d["warp_dx_bitwise"] and d["warp_dw_bitwise"]
    assert d["natural_matches_torch_compact"]
    assert d["shuffled_differs"] and 0 < d["shuffled_elements_differ"] <= d["elements"]
    assert 0 < d["shuffled_max_rel"] < 1e-5


def test_adjoint_grid_matches_the_launch_dims():
    from fovi_lab.kernels import adjoint as wa
    from fovi_lab.kernels.adjoint import staged_build as adj_staged_build
    s = kl.shape_of("alex_L1")
    for cfg in ("gi2_p64b128", "gi3_p64b64", "gi2p_p64b128"):
        g = kl.adjoint_grid("gi", cfg, s, 64)
        spec = wa.GRAD_INPUT_CONFIG_SPECS[cfg]
        assert g["dims"] == adj_staged_build._stage_dims(spec, "gi", s["nout"], s["p64"], pad_to(64, spec["tile_b"]))
    for cfg in ("gw2_p64n128", "gw3_p64n64", "gw4_p64n64", "gw3p_p64n128"):
        g = kl.adjoint_grid("gw", cfg, s, 64)
        spec = wa.GRAD_WEIGHT_CONFIG_SPECS[cfg]
        cpad = pad_to(s["cout"], spec["tile_n"] * (2 if spec["version"] == 4 else 1))
        assert g["dims"] == adj_staged_build._stage_dims(spec, "gw", g["chunk"], s["p64"], cpad)
    # the chunking itself, against the package's own launch plans (kernels already built above)
    pb = kl.make_problem("alex_L1", 64, bias=False)
    gi_plan, _ = wa.plan_grad_input(pb.meta, pb.grad_y, pb.weight, "gi2_p64b64")
    gw_plan, _ = wa.plan_grad_weight(pb.meta, pb.grad_y, pb.x, "gw3_p64n64")
    g_gi = kl.adjoint_grid("gi", "gi2_p64b64", s, 64)
    g_gw = kl.adjoint_grid("gw", "gw3_p64n64", s, 64)
    assert g_gi["launches"] == len(gi_plan.chunks) and g_gw["launches"] == len(gw_plan.chunks)
    assert g_gi["chunk"] == gi_plan.bchunk and g_gw["chunk"] == gw_plan.nc
    n0, n1 = gw_plan.chunks[0]
    assert g_gw["dims"] == adj_staged_build._stage_dims(gw_plan.stage_k.spec, "gw", n1 - n0, s["p64"], gw_plan.cpad)
    assert g_gi["dims"] == adj_staged_build._stage_dims(gi_plan.stage_k.spec, "gi", s["nout"], s["p64"], gi_plan.chunks[0][2])
    del gi_plan, gw_plan
    big = kl.adjoint_grid("gi", "gi2_p64b128", kl.shape_of("alex_L0"), 512)
    assert big["launches"] > 1                                       # the 256 MiB stage budget chunks B
    assert kl.adjoint_grid("gi", "gi2_p64b128_f32", s, 64)["ctas"] == kl.adjoint_grid("gi", "gi2_p64b128", s, 64)["ctas"]
    with pytest.raises(KeyError):
        kl.adjoint_grid("gi", "gi9", s, 64)
    rows = kl.occupancy_table(512, ["alex_L3", "res18_layer3"])
    assert len(rows) == 2 * 5
    small = [r for r in rows if r["layer"] == "res18_layer3" and r["config"] == "gi2_p64b128"][0]
    assert small["ctas"] == 16 * 4 and small["waves"] < 1
    assert _is_fig(kl.occupancy_figure(batches=(64, 512), layers=["alex_L3", "res18_layer3"]))


# ------------------------------------------------------------------------------------------ recorded data

_ENV = {"device": "NVIDIA H200", "warp": "1.19.0", "torch": "2.11.0+cu130", "date": "2026-11-29T17:00:00+00:00"}


def _fwd_records(date="2026-11-29T17:00:00+00:00"):
    env = dict(_ENV, date=date)
    shape = dict(layer="res18_layer1", B=512, cin=64, cout=64, nin=230, nout=230, k=9, v=36, p64=576,
                 flops=2.0 * 512 * 576 * 64 * 230, bytes=3.0e7)
    recs = [dict(env, **shape, impl="torch_cached_bmm", ms=0.27, err=3e-4),
            dict(env, **shape, impl="torch_gather_bmm", ms=0.40, err=3e-4),
            dict(env, **shape, impl="warp_uncached", config="nm_m64n64k64", chosen=True, ms=0.43, ms_kernel=0.27,
                 dense_ms=0.274, err=3e-4),
            dict(env, **shape, impl="warp_uncached", config="nm_m64n64k64r2", chosen=False, ms=None, ms_kernel=0.25,
                 dense_ms=0.26, err=3e-4),
            dict(env, **shape, impl="warp_uncached", config="m32n64", chosen=False, ms=None, ms_kernel=2.0, err=3e-4),
            dict(env, **shape, impl="warp_uncached", config="m32n64r2", chosen=False, ms=None, ms_kernel=2.1, err=3e-4),
            dict(env, **shape, impl="warp_uncached", config="m64n64b512", chosen=False, ms=None, note="cannot launch"),
            dict(env, **shape, impl="warp_dense_ceiling", config="nm_m64n64k64", ms=0.274),
            dict(env, **shape, impl="warp_cached", config="c_m32n64", ms=0.75, err=3e-4),
            dict(env, layer="gemm4096", B=4096, impl="torch_matmul", ms=0.19, tflops=720.0),
            dict(env, layer="gemm4096", B=4096, impl="warp_dense_gemm", config="nm_m64n64k128", ms=3.4, tflops=40.5)]
    return recs


def _write(path, recs, junk=False):
    with open(path, "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
        if junk:
            f.write("not json\n\n[1, 2]\n")


def test_loaders_with_no_data(tmp_path):
    assert kl.load_records(tmp_path) == []
    assert kl.load_records(tmp_path / "missing") == []
    for fig in (kl.forward_recorded_figure([]), kl.roofline_figure([]), kl.reuse_recorded_figure([]),
                kl.heuristic_figure([]), kl.backward_recorded_figure([]), kl.gi_gw_sweep_figure([])):
        assert _is_fig(fig) and "no recorded" in _annotation(fig)
    assert kl.versions_title([]) == "no recorded data"


def test_forward_loaders_and_figures(tmp_path):
    old = _fwd_records("2026-11-28T10:00:00+00:00")
    for r in old:
        if r.get("config") == "nm_m64n64k64":
            r["chosen"] = False
        if r.get("config") == "m32n64":
            r["chosen"], r["ms"] = True, 5.0                # an older run's pick: must not leak in
    _write(tmp_path / "forward_sweep_h200.jsonl", _fwd_records(), junk=True)
    _write(tmp_path / "forward_sweep_h200_run1.jsonl", old)
    recs = kl.forward_records(tmp_path)
    assert len(recs) == 2 * len(_fwd_records()) and all("_file" in r for r in recs)
    rows = kl.forward_table(recs)
    assert len(rows) == 1
    row = rows[0]
    assert row["pick_config"] == "nm_m64n64k64" and row["pick_ms"] == 0.43
    assert row["best_config"] == "nm_m64n64k64r2" and row["best_kernel_ms"] == 0.25
    assert row["torch_impl"] == "torch_cached_bmm" and row["cached_ms"] == 0.75
    assert row["max_err"] == pytest.approx(3e-4)
    title = kl.versions_title(records_select.latest_runs(recs))
    assert title == "NVIDIA H200 · Warp 1.19.0 · torch 2.11.0+cu130 · 2026-11-29"
    assert "2026-11-28 .. 2026-11-29" in kl.versions_title(recs)
    fig = kl.forward_recorded_figure(recs)
    assert _is_fig(fig) and "NVIDIA H200" in fig.layout.title.text and "Warp 1.19.0" in fig.layout.title.text
    assert len(fig.layout.updatemenus[0].buttons) == 1
    from fovi_lab.lab import figure_layout as fl
    assert fl.overlapping_boxes(fig) == [] and fl.legend_over_ticks(fig) == [] and fl.clipped_titles(fig) == []
    roof = kl.roofline_figure(recs, batch=512)
    assert _is_fig(roof) and "torch 2.11.0+cu130" in roof.layout.title.text
    assert "no recorded" in _annotation(kl.roofline_figure(recs, batch=3))
    reuse = kl.reuse_recorded_figure(recs)
    ratios = {t.name: [y for y in t.customdata if y is not None] for t in reuse.data}
    from fovi_lab.lab.labels import kernel_label
    assert len(ratios) == len({t.name for t in reuse.data})          # one legend entry per twin, in words
    assert ratios[kernel_label("m32n64r2") + " (over r = 1)"] == [pytest.approx(1.05)]
    assert ratios[kernel_label("nm_m64n64k64r2") + " (over r = 1)"] == []
    assert lab_records.gemm_ceilings(recs) == {"warp_tflops": 40.5, "warp_config": "nm_m64n64k128",
                                               "cublas_tflops": 720.0}


def test_forward_table_reads_pick_and_sweep_from_their_own_runs(tmp_path):
    # a later default-config benchmark (one config per shape) must not hide an earlier sweep
    sweep = _fwd_records("2026-11-29T17:00:00+00:00")
    env = dict(_ENV, date="2026-11-29T18:00:00+00:00")
    shape = {k: sweep[0][k] for k in ("layer", "B", "cin", "cout", "nin", "nout", "k", "v", "p64", "flops", "bytes")}
    bench = [dict(env, **shape, impl="torch_cached_bmm", ms=0.25),
             dict(env, **shape, impl="warp_uncached", config="nm_m64n64k64", chosen=True, ms=0.40, ms_kernel=0.26,
                  dense_ms=0.27, err=2e-4),
             dict(env, **shape, impl="warp_dense_ceiling", config="nm_m64n64k64", ms=0.27),
             dict(env, layer="gemm4096", B=4096, impl="torch_matmul", ms=0.2, tflops=700.0),
             dict(env, layer="gemm4096", B=4096, impl="warp_dense_gemm", config="m64n64r1", ms=4.0, tflops=30.0)]
    sweep.append(dict(sweep[-1], config="m32n64", ms=6.0, tflops=23.0))                 # two tile configs swept
    _write(tmp_path / "forward_sweep_h200.jsonl", sweep)
    _write(tmp_path / "forward_h200.jsonl", bench)
    recs = kl.forward_records(tmp_path)
    row = kl.forward_table(recs)[0]
    assert row["pick_ms"] == 0.40 and row["torch_ms"] == 0.25 and row["pick_dense_ms"] == 0.27
    assert row["best_config"] == "nm_m64n64k64r2" and row["best_kernel_ms"] == 0.25   # from the sweep
    assert row["cached_ms"] is None                                                     # not in the bench run
    assert lab_records.gemm_ceilings(recs)["warp_tflops"] == 40.5                       # the run with more configs
    assert [r["config"] for r in kl.reuse_summary(recs)] == ["m32n64r2"]      # nm twins not swept here
    summ = {r["config"]: r for r in kl.reuse_summary(recs)}
    assert summ["m32n64r2"]["median"] == pytest.approx(1.05) and summ["m32n64r2"]["faster"] == 0
    assert len(kl.heuristic_table(recs)) == 1


def test_heuristic_table(tmp_path):
    from fovi_lab.kernels import forward as F
    from fovi_lab.kernels.forward import rules as fwd_rules
    recs = _fwd_records()
    pick = F.select_config(512, 64, 230, 576, in_channels=64, node_major=True)
    rows = kl.heuristic_table(recs)
    assert len(rows) == 1 and rows[0]["pick"] == pick and rows[0]["best"] == "nm_m64n64k64r2"
    if pick in ("nm_m64n64k64", "nm_m64n64k64r2", "m32n64", "m32n64r2"):
        assert rows[0]["ratio"] >= 1.0
    else:
        assert rows[0]["ratio"] is None
    fig = kl.heuristic_figure(recs)
    assert _is_fig(fig) and "H200" in fig.layout.title.text
    cell = fig.data[0].text[0][0]                    # the pick in words in its cell; the id only in the hover text
    assert pick not in cell and cell.replace("<br>", ", ").startswith(short_label(pick).split(" ", 2)[-1].split(",")[0])
    assert pick in fig.data[0].customdata[0][0]
    assert records_forward_viz._cell_words("mmasw_o32b16b64", "tensor cores") == "32x16, 2 warps<br>W in place, split"


def _bwd_records():
    env = dict(_ENV, mode="backward")
    out = []
    for b in (64, 512):
        shape = dict(layer="alex_L1", B=b, cin=96, cout=256, nin=230, nout=230, k=25, v=100, p64=2432)
        out += [dict(env, **shape, impl="warp", ms=2.0, gi_stage_ms=0.8, dx_reduce_ms=0.1, gw_stage_ms=0.9,
                     dw_reduce_ms=0.1, deterministic=True),
                dict(env, **shape, impl="torch_compact", ms=1.5),
                dict(env, **shape, impl="torch_autograd_gather_bmm", ms=9.0),
                dict(env, **shape, impl="warp_gi", config="gi2_p64b128", ms=1.0, gi_stage_ms=0.8),
                dict(env, **shape, impl="warp_gi", config="gi3_p64b128", ms=0.9, gi_stage_ms=0.7),
                dict(env, **shape, impl="warp_gw", config="gw3_p64n128", gw_finish="csr", ms=1.0, gw_stage_ms=0.9)]
    out.append(dict(_ENV, mode="train-step", layer="alex_L1", B=64, impl="warp_train", ms=3.0))
    return out


def test_backward_loaders_and_figures(tmp_path):
    _write(tmp_path / "backward_nvidia_h200.jsonl", _bwd_records())
    _write(tmp_path / "forward_sweep_h200.jsonl", _fwd_records())
    assert len(kl.backward_records(tmp_path)) == len(_bwd_records())
    assert len(kl.backward_records(tmp_path, mode="backward")) == len(_bwd_records()) - 1
    assert all("mode" not in r for r in kl.forward_records(tmp_path))
    recs = kl.backward_records(tmp_path)
    fig = kl.backward_recorded_figure(recs)
    assert _is_fig(fig) and "H200" in fig.layout.title.text
    names = {t.name for t in fig.data}
    assert {"warp", "torch_compact", "torch_autograd_gather_bmm", "Warp gi stage kernel"} <= names
    assert len(fig.layout.updatemenus[0].buttons) == 2
    ts = kl.backward_recorded_figure(recs, mode="train-step")
    # these train-step records carry no per-kernel times, so the kernel markers (empty series) are left out
    assert _is_fig(ts) and {t.name for t in ts.data} == {"warp_train"}
    sw = kl.gi_gw_sweep_figure(recs)
    from fovi_lab.lab.labels import kernel_label, short_label
    configs = ("gi2_p64b128", "gi3_p64b128", "gw3_p64n128")
    # the legend in short words, the hover text in full ones
    assert _is_fig(sw) and {t.name for t in sw.data} == {short_label(c) for c in configs}
    assert {t.customdata[0] for t in sw.data} == {kernel_label(c) for c in configs}
    assert "B = 512" in sw.layout.title.text


def test_recorded_figures_on_the_repository_data():
    # whatever data/ holds (or nothing): a figure, never an exception
    recs = kl.load_records()
    from fovi_lab.lab import figure_layout as fl
    for fig in (kl.forward_recorded_figure(), kl.roofline_figure(), kl.reuse_recorded_figure(),
                kl.heuristic_figure(), kl.backward_recorded_figure(), kl.gi_gw_sweep_figure(),
                kl.occupancy_figure(), kl.traffic_figure(kl.shape_of("res18_layer1"), 512)):
        assert _is_fig(fig)
        # each reads cleanly: titles fit, legend and buttons cover nothing, every axis titled with its unit
        assert fl.clipped_titles(fig) + fl.legend_over_ticks(fig) + fl.overlapping_boxes(fig) == []
        assert fl.axes_without_units(fig) == []
    if kl.forward_records():
        assert "Warp" in kl.forward_recorded_figure().layout.title.text
    assert isinstance(recs, list)


def test_benchmark_forward_runs_on_cpu(monkeypatch):
    from fovi_lab.kernels import forward as F
    from fovi_lab.kernels.forward import api as fwd_api
    monkeypatch.setattr(fwd_api, "pick", lambda *a, **k: "m32n64")
    rows, fig = kl.benchmark_forward(("ODD",), batch=8, device=CPU, reps=2)
    impls = {r["impl"] for r in rows}
    assert {"warp_uncached", "warp_uncached_kernel", "warp_cached", "torch_compact"} <= impls
    ok = [r for r in rows if r.get("err") is not None]
    assert ok and all(r["err"] < 1e-2 for r in ok)
    assert _is_fig(fig) and "Warp" in fig.layout.title.text
    from fovi_lab.lab import figure_layout as fl
    assert fl.clipped_titles(fig) + fl.overlapping_boxes(fig) + fl.axes_without_units(fig) == []


def test_flagged_variant_runs_stay_out_of_the_figures(tmp_path):
    """Records flagged ``note_run`` (non-default variants, development runs) are not what a backend runs:
    the figure loaders leave them out unless asked."""
    base = dict(layer="res18_layer1", B=64, device="NVIDIA H200", date="2026-11-29T10:00:00")
    _write(tmp_path / "a.jsonl", [dict(base, impl="warp_uncached", ms=1.0),
                                  dict(base, impl="warp_uncached", ms=0.5, note_run="variant"),
                                  dict(base, impl="warp_train", ms=2.0, mode="train-step"),
                                  dict(base, impl="warp_train", ms=1.5, mode="train-step", note_run="variant")])
    assert [r["ms"] for r in kl.forward_records(tmp_path)] == [1.0]
    assert sorted(r["ms"] for r in kl.forward_records(tmp_path, variants=True)) == [0.5, 1.0]
    assert [r["ms"] for r in kl.backward_records(tmp_path, mode="train-step")] == [2.0]
    assert len(kl.backward_records(tmp_path, variants=True)) == 2


def test_the_reuse_figure_reads_the_sweep_that_timed_its_pairs():
    """Notebook 04, section 4: each r = 2 / 4 config over its r = 1 twin comes from the latest run that timed both
    (a later sweep of other configs does not empty the figure); every pair has recorded shapes."""
    import math
    from fovi_lab import lab as kl
    recs = kl.forward_records()
    rows = kl.reuse_summary(recs)
    assert len(rows) == sum(1 for pair in kl.REUSE_PAIRS for c in pair[1:] if c) and all(r["shapes"] > 0 for r in rows)
    fig = kl.reuse_recorded_figure(recs)
    assert fig.data and all(any(isinstance(v, float) and math.isfinite(v) for v in t.y if v is not None)
                            for t in fig.data)


def test_tile_kernel_table_and_the_printed_lines(tmp_path):
    """Notebook 02, section 7: the tile kernels' fastest config with its dense ceiling and the strongest PyTorch op of
    the same run, the cached kernel against the uncached pick of the run that timed it; the lines print a dash where
    a record has no value, and a ``cached`` column only where some row has one."""
    from fovi_lab.lab import records as R
    _write(tmp_path / "forward_sweep_h200.jsonl", _fwd_records())
    recs = kl.forward_records(tmp_path)
    rows = R.tile_kernel_table(recs)
    assert len(rows) == 1
    r = rows[0]
    assert (r["config"], r["kernel_ms"], r["dense_ms"], r["op_ms"]) == ("nm_m64n64k64r2", 0.25, 0.26, None)
    assert (r["torch_impl"], r["torch_ms"]) == ("torch_cached_bmm", 0.27)
    assert (r["cached_ms"], r["cached_vs_config"], r["cached_vs_ms"]) == (0.75, "nm_m64n64k64", 0.43)
    lines = R.tile_kernel_lines(rows, batches=(512,))
    assert "2026-11-29" in lines[0] and lines[2].split()[3:6] == ["0.250", "0.260", "0.96"]
    assert lines[2].endswith("  " + short_label("nm_m64n64k64r2"))     # the kernel in words, last
    assert lines[2].split()[10] == "-"                                  # no whole-op time: no op/torch ratio
    assert lines[-1].split()[5] == "1.74"                               # cached 0.75 / uncached 0.43
    assert lines[-1].endswith(short_label("nm_m64n64k64"))
    assert len(R.tile_kernel_lines(rows, batches=(16,))) == 2           # no row at B = 16: title and header
    with_cached = R.forward_lines(kl.forward_table(recs), batches=(512,), records=recs)
    assert "2026-11-29" in with_cached[0] and with_cached[1].split()[-3:] == ["cached", "heuristic's", "kernel"]
    assert with_cached[2].split()[8:10] == ["0.63", "0.750"]            # torch 0.27 / op 0.43, cached 0.75
    _write(tmp_path / "forward_sweep_h200.jsonl", [x for x in _fwd_records() if x.get("impl") != "warp_cached"])
    recs = kl.forward_records(tmp_path)
    assert "cached" not in R.forward_lines(kl.forward_table(recs), batches=(512,))[0]
    assert R.tile_kernel_table(recs)[0]["cached_ms"] is None and len(R.tile_kernel_lines(R.tile_kernel_table(recs))) == 3
    assert R.gemm_ceilings(recs) == {"warp_tflops": 40.5, "warp_config": "nm_m64n64k128", "cublas_tflops": 720.0}


def test_h200_roof_is_the_benchmarks_datasheet_roof():
    from fovi_lab.bench.common import Roofline
    from fovi_lab.lab.traffic import h200_roof
    roof = h200_roof()
    assert (roof["tflops"], roof["hbm_tbps"]) == (Roofline.H200_FP16_TFLOPS, Roofline.H200_HBM_TBPS)
    assert roof["ridge"] == pytest.approx(roof["tflops"] / roof["hbm_tbps"])


def test_adjoint_record_tables():
    from fovi_lab.lab import adjoint_explorer as ae
    assert ae.short_impl("torch_autograd_gather_bmm_graphed") == "autograd gather_bmm"
    assert ae.short_impl("torch_binned") == "binned"
    common = dict(date="2026-01-01T00:00:00", _file="x", device="GPU", warp="1", torch="2")
    sweep = [dict(common, layer="alex_L1", B=512, mode="backward", impl="warp_gi", config=c, ms=ms, gi_stage_ms=s,
                  gi_frac_dense=f, dx_reduce_gbps=g) for c, ms, s, f, g in (
        ("gi3_p64b128_f32", 8.313, 1.897, 0.7852, 2286.0), ("gi2p_p64b128", 15.748, 3.749, None, 1203.0))]
    sweep.append(dict(common, layer="alex_L1", B=512, mode="backward", impl="warp_gw", config="gw3_p64n128",
                      ms=8.019, gw_stage_ms=6.774, gw_frac_dense=0.735, dw_reduce_gbps=1264.7, gw_finish="csr"))
    lines = ae.gi_gw_sweep_table("alex_L1", 512, sweep).splitlines()
    assert lines[0].startswith("alex_L1, B = 512, GPU")
    assert [l.split()[-4:] for l in lines[2:]] == [["15.748", "3.749", "-", "1203"], ["8.313", "1.897", "79", "2286"],
                                                   ["8.019", "6.774", "74", "1265"]]
    assert [l.rsplit(None, 4)[0] for l in lines[2:]] == [     # each stage config in words, sorted by its id
        "dx 64 p x 128 rows, gi2 grid, prefetch, fp16 stage", "dx 64 p x 128 rows, gi3 grid, fp32 stage",
        "dW 64 p x 128 ch, gw3 grid, fp16 stage"]
    assert len(ae.gi_gw_sweep_table("alex_L1", 512, sweep, only=("gw",)).splitlines()) == 3
    assert ae.gi_gw_sweep_table("alex_L1", 64, sweep).startswith("no recorded")


def test_record_selections_take_whole_runs_of_their_device():
    """Each named selection of recorded runs is non-empty and takes whole runs: every record that shares a selected
    record's file and date stamp is selected too, and no record of another device."""
    for name, sel in kl.SELECTIONS.items():
        recs = kl.kind_records(sel.kind)
        picked = sel.pick(recs)
        assert picked, name
        stamps, ids = {r.get("date") for r in picked}, {id(r) for r in picked}
        assert all(id(r) in ids for r in recs if r.get("date") in stamps), name
        assert {r.get("device") for r in picked} == {sel.device}, name
        assert kl.selected(recs, name) == picked


def test_log_axes_are_labelled_in_full_numbers():
    import plotly.graph_objects as go
    from fovi_lab.lab.common import log_ticks, readable_log_axes
    assert log_ticks(0.018, 2.3) == ([0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0], ["0.02", "0.05", "0.1", "0.2", "0.5", "1", "2"])
    assert log_ticks(1e-3, 5e4)[1] == ["0.001", "0.01", "0.1", "1", "10", "100", "1,000", "10,000"]
    fig = go.Figure([go.Bar(x=["a", "b"], y=[0.03, 0.9]), go.Scatter(x=[1, 2], y=[5, 50], yaxis="y2")])
    fig.update_layout(yaxis_type="log", yaxis2=dict(overlaying="y", side="right", type="log", dtick=1))
    readable_log_axes(fig)
    assert list(fig.layout.yaxis.ticktext) == ["0.05", "0.1", "0.2", "0.5", "1"]
    assert fig.layout.yaxis2.tickvals is None and fig.layout.xaxis.tickvals is None   # its own ticks; not log
