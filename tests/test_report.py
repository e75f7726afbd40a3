"""The results table: docs/results.md and the README's table are what ``python -m fovi_lab report`` makes of the
committed records, and a row's two sides come from one run."""

from fovi_lab.bench import report
from fovi_lab.graph.layers import LAYERS


def test_committed_tables_equal_the_generated_ones():
    assert report.main(["--check"]) == 0


def test_rows_pair_ours_with_pytorch_of_the_same_run():
    rows = report.result_rows(report.load_runs())
    assert {r["mode"] for r in rows} == {"forward", "train-step"}
    fwd = [r for r in rows if r["mode"] == "forward"]
    # the 13 layers, the ResNet-18 stem on both frames (its rf1 network frame and the rf2 frame of earlier runs)
    assert {r["layer"] for r in fwd} == set(LAYERS) | {"res18_stem_rf2"}
    for r in rows:
        assert r["ours_ms"] and (r["torch_ms"] or r["torch_graphed_ms"]), r
        assert r["torch_impl"] is None or r["torch_impl"].startswith("torch_")


def test_the_readme_block_is_replaced_between_its_markers():
    text = f"a\n{report.README_BEGIN}\nold\n{report.README_END}\nb\n"
    assert report.update_readme(text, "new") == f"a\n{report.README_BEGIN}\nnew\n{report.README_END}\nb\n"
    try:
        report.update_readme("no markers", "new")
    except ValueError as e:
        assert "markers" in str(e)
    else:
        raise AssertionError("a README without the markers must be refused")
