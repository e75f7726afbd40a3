"""Notebook 11's logic (``fovi_lab.lab.pipe_viz``): the block table, the swizzle model, a run against the
reference, the recorded H200 rows and the widget's refusals."""

import pytest

from fovi_lab.kernels import forward as F
from fovi_lab.kernels.forward.mma_pipe import PIPE_SMEM_LIMIT, pipe_snippet
from fovi_lab.lab import pipe_viz as pv


def test_the_block_table_counts_the_stages_shared_memory():
    rows = pv.stage_rows()
    assert {r["config"] for r in rows} == set(pv.pipe_configs())
    for r in rows:
        assert r["smem"] == 2 * r["stages"] * r["bk"] * (r["bm"] + r["bn"]) <= PIPE_SMEM_LIMIT
        assert r["in_flight"] == r["smem"] * (r["stages"] - 1) // r["stages"]
        assert r["wm"] * r["wn"] * 32 == r["threads"] and r["wm"] * r["warp_m"] == r["bm"]
        assert r["wn"] * r["warp_n"] == r["bn"] and r["acc"] == r["warp_m"] * r["warp_n"] // 32
    assert pv.stage_table().count("\n") == len(rows)


def test_the_swizzle_model_is_the_kernels_and_removes_the_conflicts():
    src = pipe_snippet(128, 64, 32, 3, 128)
    assert "(a_c ^ (row & 7))" in src and "(b_c ^ (row & 7))" in src       # the layout the model describes
    for elems in (64, 128, 256):
        assert pv.ldmatrix_conflict(elems, False) == 8
        assert all(pv.ldmatrix_conflict(elems, True, chunk=c) == 1 for c in range(elems // 8))
        plain, swz = pv.bank_groups(elems, False), pv.bank_groups(elems, True)
        assert all(sorted(row) == sorted(p) for row, p in zip(swz, plain))   # a permutation within each row
    fig = pv.swizzle_figure()
    assert len(fig.data) == 2


def test_a_pipelined_config_matches_the_reference_here():
    res = pv.explore_pipe("res18_layer3", 10, "mmaps_o64b64k32s4", nodes=3, device="cpu")
    assert res["line"].startswith("PASS") and res["finite"] and res["nodes"] == 3
    with pytest.raises(ValueError, match="config must be one of"):
        pv.explore_pipe("res18_layer3", 10, "mma_o64b16", device="cpu")


def test_recorded_rows_read_the_side_by_side_run():
    rows = pv.recorded_rows()
    assert rows, "data/h200/forward_pipe.jsonl.gz holds the pipelined kernels' run"
    for r in rows:
        assert F.config_spec(r["pipe"]).variant in F.PIPE_VARIANTS
        assert F.config_spec(r["reg"]).variant in F.MMA_VARIANTS
        assert r["speedup"] == pytest.approx(r["reg_ms"] / r["pipe_ms"])
        assert r["pipe_tflops"] == pytest.approx(r["reg_tflops"] * r["speedup"])
    assert {r["B"] for r in rows} == {64, 512}
    fig = pv.recorded_figure(rows)
    assert "H200" in fig.layout.title.text and len(fig.data) == 4
    assert "no side-by-side records" in pv.recorded_table([]) and pv.recorded_figure([]).layout.annotations


def test_the_widget_refuses_bad_choices_with_a_message():
    assert "config must be one of" in pv.explore_pipe_widget("alex_L1", 4, "m64n64", device="cpu")[0][0]
    assert "layer must be one of" in pv.explore_pipe_widget("nope", 4, "mmap_o64b128k32s3", device="cpu")[0][0]
    assert "batch must be an integer" in pv.explore_pipe_widget("alex_L1", 0, "mmap_o64b128k32s3", device="cpu")[0][0]
    lines, _ = pv.explore_pipe_widget("alex_L1", 512, "mmap_o64b128k32s3", device="cpu", budget=1e6)
    assert "budget" in lines[0]
