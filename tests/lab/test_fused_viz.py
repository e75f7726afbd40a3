"""The fused adjoints' helpers of notebook 06 (fovi_lab.lab.fused_viz), headless."""

import json

import plotly.graph_objects as go

from fovi_lab.lab import fused_viz as fv


def test_stage_bytes_table_says_what_the_stage_costs():
    rows = {r["layer"]: r for r in fv.stage_bytes_table(("alex_L1", "res18_layer1"), batch=512)}
    a = rows["alex_L1"]
    # the staged fp16 dA stage alone: Nout * P64 * B * 2 bytes
    assert a["staged_mib"] > 230 * 2432 * 512 * 2 / 2**20
    assert a["fused_mib"] < a["staged_mib"] and a["ratio"] > 2
    assert all(r["B"] == 512 and r["grads_mib"] > 0 for r in rows.values())


def test_explore_fused_passes_and_is_deterministic():
    res = fv.explore_fused("ODD", 17, device="cpu")
    assert res["passed"] and res["deterministic"], res
    assert res["parity_dx"].startswith("PASS") and res["parity_dw"].startswith("PASS")
    assert res["vs_staged"].startswith("PASS")


def _rec(layer, b, impl, ms, **kw):
    r = dict(layer=layer, B=b, impl=impl, ms=ms, mode="train-step", date="2026-01-01T00:00:00", _file="x",
             device="GPU", warp="1", torch="2")
    r.update(kw)
    return r


def test_figures_from_records_and_without():
    recs = [_rec("res18_layer1", 64, "warp_train", 0.4, path="fused", peak_mib=10),
            _rec("res18_layer1", 64, "warp_train_staged", 0.9, path="staged", peak_mib=20),
            _rec("res18_layer1", 64, "torch_compact", 0.6, peak_mib=50),
            _rec("res18_layer1", 64, "torch_compact_graphed", 0.3, graphed=True),
            _rec("res18_layer1", 64, "warp_train_graphed", 0.2, graphed=True)]
    runs = fv.train_step_runs(recs)
    assert set(runs) == {("res18_layer1", 64)}
    assert fv._best_torch(runs[("res18_layer1", 64)], graphed=False)["impl"] == "torch_compact"
    fig = fv.fused_vs_staged_figure(recs)
    ys = [t.y[0] for t in fig.data if t.yaxis in (None, "y")]
    assert ys[:3] == (0.9, 0.4, 0.6) or ys[:3] == [0.9, 0.4, 0.6]
    g = fv.graphed_step_figure(recs)
    assert [t.y[0] for t in g.data[:2]] in ([0.2, 0.3], (0.2, 0.3))
    for f in (fv.fused_vs_staged_figure([]), fv.graphed_step_figure([])):
        assert isinstance(f, go.Figure) and "no recorded" in json.dumps(f.to_plotly_json()["layout"])


def test_widget_callback_runs_clamps_and_refuses():
    res, fig = fv.explore_fused_run("res18_layer1", 64, None, "auto", "auto", 0, device="cpu")
    assert res["ok"] and res["passed"] and res["deterministic"], res["message"]
    assert res["dx_kernel"].startswith("dxn_") and res["dw_kernel"].startswith("dwn_") and res["dw_split"] >= 1
    assert "clamped" in res["message"] and isinstance(fig, go.Figure)
    res, _ = fv.explore_fused_run("ODD", 17, None, "dxn_m16n16k64", "dwn_o64c32k64", 3, device="cpu")
    assert res["passed"] and res["dw_split"] == 3 and res["dx_kernel"] == "dxn_m16n16k64"
    for bad in (dict(dx_config="dxn_nope"), dict(dw_config="x"), dict(nsplit=-1), dict(layer="nope")):
        kw = dict(layer="ODD", batch=17, cout=None, dx_config="auto", dw_config="auto", nsplit=0, device="cpu")
        kw.update(bad)
        res, fig = fv.explore_fused_run(**kw)
        assert not res["ok"] and res["message"] and isinstance(fig, go.Figure), bad


def test_record_tables_print_the_bars():
    recs = [_rec("res18_layer1", 64, "warp_train", 0.4, path="fused", peak_mib=10, dx_frac_dense=0.7,
                 dw_frac_dense=0.9),
            _rec("res18_layer1", 64, "warp_train_staged", 0.9, path="staged", peak_mib=20),
            _rec("res18_layer1", 64, "torch_compact", 0.6, peak_mib=50),
            _rec("res18_layer1", 64, "torch_compact_graphed", 0.3, graphed=True),
            _rec("res18_layer1", 64, "warp_train_graphed", 0.2, graphed=True, pipelined_ms=0.35)]
    row = fv.train_step_table(records=recs).splitlines()[1].split()
    # B, layer, path, staged, fused, staged/fused, PyTorch, its ms, PyTorch/warp, peak ratio, dx %, dW %
    assert row == ["64", "res18_layer1", "fused", "0.900", "0.400", "2.25", "compact", "0.600", "1.50", "0.20",
                   "70", "90"]
    g = fv.graphed_step_table(records=recs).splitlines()[1].split()
    assert g == ["64", "res18_layer1", "0.200", "compact", "0.300", "1.50", "0.400", "-"]
    assert fv.train_step_table(batches=(16,), records=recs).count("\n") == 0      # the header only
    assert "no recorded" in fv.train_step_table(records=[]) and "no recorded" in fv.graphed_step_table(records=[])


def test_segments_sweep_table_names_the_fastest_of_each_kind(tmp_path):
    base = dict(layer="res18_layer3", B=64, mode="backward")
    recs = [dict(base, impl="warp_dxn", config="dxn_m16n16k64", ms=0.085),
            dict(base, impl="warp_dxn", config="dxn_m64n64k64", ms=0.2),
            dict(base, impl="warp_dxs", config="dxn_m64n64k64", ms=0.056, seg_steps=4),
            dict(base, impl="warp_dwn", config="dwn_o64c64k64", ms=0.059, nsplit=1),
            dict(base, impl="warp_dws", config="dwn_o64c64k64", ms=0.050, seg_steps=2)]
    p = tmp_path / "sweep.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in recs))
    lines = fv.segments_sweep_table(batches=(64,), path=str(p)).splitlines()
    assert lines[1].split() == ["64", "res18_layer3", "0.085", "16x16,", "64-deep", "0.056", "64x64,", "64-deep", "L=4",
                                "0.059", "64x64,", "64-deep", "x1", "0.050", "64x64,", "64-deep", "L=2"]
    assert fv.segments_sweep_table(path=str(tmp_path / "none.jsonl")) == "no recorded fused sweep"


def test_staged_step_table_sets_the_staged_step_beside_the_fovi_library_s():
    step = [_rec("res18_layer1", 64, i, ms, **kw) for i, ms, kw in (
        ("warp_train", 0.45, dict(path="fused")), ("warp_train_staged", 0.52, dict(deterministic=True)),
        ("torch_autograd_gather_bmm", 0.58, {}), ("torch_compact", 0.64, {}))]
    lines = fv.staged_step_table(step).splitlines()
    # layer, B, staged ms, the fovi library's ms (SEED_TRAIN_STEP_MS), the fastest eager PyTorch step, bitwise
    assert [l.split() for l in lines[1:]] == [["res18_layer1", "64", "0.520", "1.09", "autograd", "gather_bmm",
                                                "0.580", "yes"]]
