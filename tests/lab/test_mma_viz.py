"""The logic of notebooks 09 and 10 (fovi_lab.lab.mma_viz): the fragment layout, the lane channels, the recorded-run
readers and the widget callback."""

from __future__ import annotations

import collections

import pytest

from fovi_lab.lab import mma_viz as mv
from fovi_lab.kernels import forward as F
from fovi_lab.lab.labels import short_label


@pytest.mark.parametrize("kind, rows, cols, per_lane", (("A", 16, 16, 8), ("B", 16, 8, 4), ("D", 16, 8, 4)))
def test_fragment_owner_gives_every_element_to_one_lane(kind, rows, cols, per_lane):
    own = mv.fragment_owner(kind)
    assert len(own) == rows and all(len(r) == cols for r in own)
    count = collections.Counter(lane for r in own for lane, _ in r)
    assert sorted(count) == list(range(32)) and set(count.values()) == {per_lane}
    # lane 4g + t: A rows g and g+8, B column g, D columns 2t, 2t+1
    if kind == "A":
        assert own[3][2 * 1 + 8] == (4 * 3 + 1, 2) and own[11][1] == (4 * 3 + 0, 1)
    if kind == "B":
        assert own[9][5] == (4 * 5 + 0, 1)
    if kind == "D":
        assert own[13][7] == (4 * 5 + 3, 3)
    with pytest.raises(ValueError, match="kind"):
        mv.fragment_owner("C")


def test_lane_channels_are_consecutive_and_cover_the_block():
    chans = mv.lane_channels(4, o0=64)
    assert sorted(c for g in chans for c in g) == list(range(64, 128))
    assert all(g == list(range(g[0], g[0] + 8)) for g in chans)


def test_recorded_rows_read_the_mma_runs():
    rows = mv.mma_rows()
    assert rows, "the shipped records hold the mma sweep"
    assert {r["B"] for r in rows} <= {1, 16, 64, 512}
    for r in rows:
        assert F.config_spec(r["pick"]).variant in F.MMA_VARIANTS
        assert F.config_spec(r["old_config"]).variant not in F.MMA_VARIANTS
        assert r["ms"] and r["torch_ms"] and r["vs_torch"] == pytest.approx(r["torch_ms"] / r["ms"])
    assert sum(1 for r in rows if r["vs_old"]) >= 40          # the tile / SIMT rules' picks were timed beside them
    fig = mv.mma_figure(rows)
    assert "H200" in fig.layout.title.text and len(fig.data) == 3 * len({r["B"] for r in rows})
    lay = mv.layout_rows()
    assert lay and all(r["speedup"] > 0 for r in lay)
    fig = mv.layout_figure(lay)
    assert "H200" in fig.layout.title.text and len(fig.data) == 2 and len(fig.data[0].x) == len(lay)


def test_widget_refuses_bad_choices_with_a_message():
    lines, fig = mv.explore_mma_widget("res18_layer3", 4, "m64n64", device="cpu")
    assert "config must be one of" in lines[0]
    lines, _ = mv.explore_mma_widget("nope", 4, None, device="cpu")
    assert "layer must be one of" in lines[0]
    lines, _ = mv.explore_mma_widget("alex_L1", 0, None, device="cpu")
    assert "batch must be an integer" in lines[0]
    lines, _ = mv.explore_mma_widget("alex_L1", 512, None, device="cpu", budget=1e6)
    assert "budget" in lines[0]


def test_widget_runs_a_pick_here():
    lines, fig = mv.explore_mma_widget("res18_layer4_0", 3, None, device="cpu")
    assert lines[0].startswith("PASS") and f"the rule picks {short_label('mmasw_o32b8')}" in lines[2]
    assert fig.data


def test_loop_depth_and_staged_store_readers():
    """Notebook 10's sections: the loop depths and the staged store read from the mma sweep, the cubins'
    registers, and the Nsight Compute profile that pointed at the stores."""
    depth = mv.depth_rows()
    stage = mv.stage_rows()
    assert depth and stage, "the shipped records hold the mma sweep's loop-depth and staged-store runs"
    for r in depth:
        assert r["ms"][0] and r["best_depth"] in (16, 32, 64)
        assert r["speedup"] == pytest.approx(r["ms"][0] / min(m for m in r["ms"] if m))
    for r in stage:
        assert F.mma_staged(F.config_spec(r["staged"]).variant) and not F.mma_staged(F.config_spec(r["direct"]).variant)
        assert r["speedup"] == pytest.approx(r["direct_ms"] / r["staged_ms"])
    assert len(mv.depth_figure(depth).data) == 3 and len(mv.stage_figure(stage).data) == 2
    regs = {r["kernel"]: r for r in mv.register_rows()}
    if regs:       # a deeper loop holds more fragments: more registers, fewer resident warps
        k16, k64 = regs["fovi_fwd_mmat_m4n2b128"], regs["fovi_fwd_mmat_m4n2k64b128"]
        assert k64["regs"] > k16["regs"] and k64["warps_per_sm"] < k16["warps_per_sm"]
    ncu = mv.ncu_rows()
    if ncu:        # the gathered stem kernel: 32 store sectors per request, its dense ceiling's stores 16
        stem, dense = ncu[0], ncu[1]
        assert round(stem["store sectors"] / stem["store requests"]) == 32
        assert round(dense["store sectors"] / dense["store requests"]) == 16
        assert stem["L2 throughput %"] > dense["L2 throughput %"]


def test_summary_sizes_and_dense_ceilings():
    """The per-batch summary counts what the rows say; the operand sizes are the tables' shape arithmetic; the
    dense-ceiling rows come from one benchmark run each."""
    rows = mv.mma_rows()
    for s in mv.mma_summary(rows):
        rs = [r for r in rows if r["B"] == s["B"]]
        assert s["layers"] == len(rs) and s["faster"] + len(s["losses"]) == len(rs)
        assert s["vs_torch"][0] == min(r["vs_torch"] for r in rs)
    assert all(r["tflops"] > 0 for r in rows)
    m = mv.layer_meta("res18_layer4_0")
    mb = mv.operand_mb("res18_layer4_0", 16)
    assert mb["wt"] == pytest.approx(2e-6 * m.q * m.cout) and mb["y"] == pytest.approx(2e-6 * 16 * m.cout * m.nout)
    for r in mv.dense_ceiling_rows():
        assert r["dense_ms"] > 0 and r["torch_impl"].startswith("torch") and r["torch_ms"] > 0
