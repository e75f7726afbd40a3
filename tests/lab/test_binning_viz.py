"""fovi_lab.lab.binning_viz (notebook 13, section 4): the Q/P64 arithmetic, the measurement on this machine,
and the loaders of the recorded H200 runs (with and without data)."""

from __future__ import annotations

import math


from fovi_lab.graph.layers import base_layer, layer_name

from fovi_lab.lab import binning_viz as bv


def test_tap_ratio_rows_follow_the_spec_table():
    rows = {(r["layer"], r["rf"]): r for r in bv.tap_ratio_rows(("alex_L0", "res18_layer1", "dinov3_patch"))}
    # docs/operator.md §5: alexnet L0 Q = 1452 (rf2) / 363 (rf1) against P64 = 384; res18 layer1 2304 / 576 against 576
    assert (rows["alex_L0", "rf2"]["q"], rows["alex_L0", "rf1"]["q"], rows["alex_L0", "rf2"]["p64"]) == (1452, 363, 384)
    assert rows["res18_layer1", "rf2"]["ratio"] == 4.0 and rows["res18_layer1", "rf1"]["ratio"] == 1.0
    for r in rows.values():
        assert math.isclose(r["ratio"], r["q"] / r["p64"]) and r["q"] == r["cin"] * r["v"]


def test_measure_here_checks_every_forward_against_the_oracle():
    rows = bv.measure_here(batch=3, reps=1, device="cpu")
    assert len(rows) == 8
    assert {r["impl"] for r in rows} == {"torch_binned_mm", "torch_compact", "warp (compact)", "warp (binned)"}
    for r in rows:
        assert r["ms"] > 0 and r["err"] < 2e-2, r
    assert {r["q"] for r in rows} == {75, 300} and {r["p64"] for r in rows} == {128}


def test_recorded_rows_and_figure():
    rows = bv.recorded_rows()
    assert rows, "the shipped records hold the stems' binning benchmarks"
    assert {r["rf"] for r in rows} == {"rf1", "rf2"} and {base_layer(r["layer"]) for r in rows} == set(bv.STEMS)
    # each row is named by the table it ran on: the layer's own name on its network's frame, else the variant
    assert all(r["layer"] == layer_name(base_layer(r["layer"]), r["rf"]) for r in rows)
    for r in rows:
        for key in ("warp", "warp_graphed", "binned", "binned_graphed", "other", "other_graphed"):
            assert r[key] is None or r[key] > 0, (r, key)
        assert r["other_impl"] is None or not r["other_impl"].startswith("torch_binned_mm")
    fig = bv.binning_figure(rows)
    assert len(fig.data) == 6
    assert all(len(t.x) == len([r for r in rows if r["rf"] == ("rf2" if i < 3 else "rf1")]) for i, t in enumerate(fig.data))


def test_loaders_without_data(tmp_path):
    assert bv.recorded_rows(tmp_path) == [] and bv.warp_binned_rows(tmp_path) == []
    fig = bv.binning_figure([])
    assert len(fig.data) == 0


def test_warp_binned_rows_pair_each_shape():
    rows = bv.warp_binned_rows()
    assert rows, "the shipped records hold the Warp binned forward's benchmark"
    for r in rows:
        assert r["bin"] > 0 and r["i2c"] > 0 and math.isclose(r["bin_over_i2c"], r["bin"] / r["i2c"])
        assert r["bin_config"].startswith("bin_") and r["i2c_config"].startswith("i2c")
        assert r["q"] > r["p64"]                      # rf2: the binned contraction is the longer one


def test_tensor_core_binned_rows_read_the_h200_runs():
    rows = bv.tensor_core_binned_rows()
    assert len(rows) == 13 and {r["B"] for r in rows} == {1}        # every layer at B = 1
    for r in rows:
        assert r["binned"] > 0 and r["compact"] > 0 and r["torch"] > 0 and r["commit"]
        assert abs(r["binned_over_compact"] - r["binned"] / r["compact"]) < 1e-12
    assert bv.tensor_core_binned_rows(records=[]) == []
