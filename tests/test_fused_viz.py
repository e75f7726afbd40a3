"""Notebook 04 section 7 helpers (fovi_lab.lab.fused_viz), headless."""

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
