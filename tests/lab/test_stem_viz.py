"""Notebook 13 section 1 logic (fovi_lab.lab.stem_viz): the stage arithmetic, the CPU parity run, and the
readers of the recorded H200 stem runs."""

from __future__ import annotations


import plotly.graph_objects as go

from fovi_lab.lab import stem_viz as sv
from fovi_lab.graph.layers import layer_meta


def test_stage_bytes_is_the_im2col_operand():
    r = sv.stage_bytes(("alex_L0",), batch=64, budget_mib=32)[0]
    m = layer_meta("alex_L0")
    assert abs(r["stage_mib"] - 2 * m.nout * m.p64 * 64 / 2**20) < 1e-9
    assert r["chunks"] == -(-m.nout // ((32 << 20) // (2 * m.p64 * 64)))     # 964 nodes, 682 per chunk -> 2
    assert r["chunks"] == 2 and r["stage_mib"] > 10 * r["x_mib"]


def test_explore_stem_passes_on_the_cpu():
    res = sv.explore_stem("alex_L0", batch=3, nodes=20, device="cpu")
    assert res["pick"].startswith("i2c_") and len(res["lines"]) == 8       # 4 forwards, 2 x (dx, dW)
    assert all(line.startswith("PASS") for line in res["lines"]), res["lines"]
    assert {"sd_b8o8u4", "sv_b8o8u8"} <= set(res["configs"])


def test_simt_rows_read_the_recorded_sweep():
    """The SIMT sweeps: every stem shape has the SIMT and i2c whole ops replayed; where the heuristic picks a
    SIMT kernel on a CNN stem it is within 10 % of the faster of the fp16 / vec4 / i2c replays (the metric
    of the rule), and the figure has one panel per stem."""
    rows = sv.simt_rows()
    assert {r["layer"] for r in rows} == set(sv.STEMS) and len(rows) >= 15
    for r in rows:
        assert r["fp16_ms"] and r["vec_ms"] and r["torch_graphed_ms"], (r["layer"], r["B"])
        assert all(rec["device"] == "NVIDIA H200" for rec in r["records"])
        if r["pick"] in (r["fp16_config"], r["vec_config"]):
            got = r["fp16_ms"] if r["pick"] == r["fp16_config"] else r["vec_ms"]
            best = min(v for v in (r["fp16_ms"], r["vec_ms"], r["i2c_ms"]) if v)
            assert got <= 1.10 * best or (r["B"] <= 4 and got <= 1.30 * best), (r["layer"], r["B"], r["pick"])
    fig = sv.simt_figure(rows)
    assert isinstance(fig, go.Figure) and len(fig.data) == 4 * len(sv.STEMS)
    assert "no recorded" in sv.simt_figure([]).layout.annotations[0].text


def test_stem_forward_rows_carry_the_ceiling_rate():
    rows = sv.stem_forward_rows()
    assert rows
    for r in rows:
        rec = next(x for x in r["records"] if x.get("config") == r["i2c_config"] and x.get("flops"))
        assert r["i2c_dense_tflops"] == rec["flops"] / r["i2c_dense_ms"] / 1e9
