"""Notebook 01 section 8 logic (fovi_lab.stem_viz): the stage arithmetic, the CPU parity run, and the
readers of the recorded H200 stem runs."""

from __future__ import annotations


import plotly.graph_objects as go

from fovi_lab import stem_viz as sv
from fovi_lab.layers import layer_meta


def test_stage_bytes_is_the_im2col_operand():
    r = sv.stage_bytes(("alex_L0",), batch=64, budget_mib=32)[0]
    m = layer_meta("alex_L0")
    assert abs(r["stage_mib"] - 2 * m.nout * m.p64 * 64 / 2**20) < 1e-9
    assert r["chunks"] == -(-m.nout // ((32 << 20) // (2 * m.p64 * 64)))     # 964 nodes, 682 per chunk -> 2
    assert r["chunks"] == 2 and r["stage_mib"] > 10 * r["x_mib"]


def test_explore_stem_passes_on_the_cpu():
    res = sv.explore_stem("alex_L0", batch=3, nodes=20, device="cpu")
    assert res["pick"].startswith("i2c_") and len(res["lines"]) == 7       # 3 forwards, 2 x (dx, dW)
    assert all(line.startswith("PASS") for line in res["lines"]), res["lines"]
    assert "sv_b8o8u4b64" in res["configs"]


def test_simt_rows_read_the_recorded_sweep():
    """Runs 35-36: every stem shape has the SIMT and the i2c kernel times; the heuristic's pick is the
    faster of the two within 10 % wherever both were recorded, and the figure has one panel per stem."""
    rows = sv.simt_rows()
    assert {r["layer"] for r in rows} == set(sv.STEMS) and len(rows) >= 15
    for r in rows:
        assert r["fp16_ms"] and r["vec_ms"] and r["i2c_ms"] and r["torch_graphed_ms"], (r["layer"], r["B"])
        got = r["vec_ms"] if r["pick"] == r["vec_config"] else r["i2c_ms"]
        assert got <= 1.10 * min(r["vec_ms"], r["i2c_ms"]), (r["layer"], r["B"], r["pick"])
        assert all(rec["device"] == "NVIDIA H200" for rec in r["records"])
    fig = sv.simt_figure(rows)
    assert isinstance(fig, go.Figure) and len(fig.data) == 4 * len(sv.STEMS)
    assert "no recorded" in sv.simt_figure([]).layout.annotations[0].text


def test_recorded_rows_and_figure():
    rows = sv.stem_forward_rows()
    assert {r["layer"] for r in rows} == set(sv.STEMS)
    for r in rows:
        assert r["i2c_config"].startswith("i2c_") and r["i2c_ms"] and r["gather_ms"] and r["torch_ms"]
        assert r["date"] and all(rec["device"] == "NVIDIA H200" for rec in r["records"])
    assert isinstance(sv.stem_forward_figure(rows), go.Figure)
    assert "no recorded" in sv.stem_forward_figure([]).layout.annotations[0].text


def test_train_rows_leave_development_runs_out(tmp_path):
    base = dict(layer="alex_L0", B=64, mode="train-step", impl="warp_train_staged", seed_ms=3.4,
                strongest="torch_x", peak_mib=1.0)
    recs = [dict(base, ms=2.0, date="1", gi_config="gi2_p64b64", gw_config="gw3_p64n128"),
            dict(base, ms=1.5, date="2", gi_config="gi2i_p64b64", gw_config="gw3i_p64n128"),
            dict(base, ms=0.1, date="3", gi_config="gi2i_p64b64_f32", gw_config="gw3i_p64n128_f32", note_run="dev"),
            dict(layer="alex_L0", B=64, mode="train-step", impl="torch_x", ms=1.2, date="2")]
    (row,) = sv.stem_train_rows(recs, layers=("alex_L0",))
    assert row["before_ms"] == 2.0 and row["after_ms"] == 1.5 and row["torch_ms"] == 1.2
    assert row["after_configs"] == "gi2i_p64b64 + gw3i_p64n128"
