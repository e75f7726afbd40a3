"""Notebook 11's layout-copy section (``fovi_lab.lab.layout_viz``): the check it runs here, and the recorded H200
rows it prints (the copy probe of both dispatches, the train step before and with the layout kernel)."""

from fovi_lab.lab import layout_viz as lv


def test_the_check_passes_here():
    lines = lv.check_here("cpu")
    assert len(lines) == 3 and all(line.startswith("PASS") for line in lines)


def test_the_recorded_copies_cover_both_dispatches():
    kernel, rule = lv.recorded_copy_rows(), lv.recorded_copy_rows(dispatch="rule")
    assert kernel and rule and {tuple(r["shape"]) for r in kernel} == {tuple(r["shape"]) for r in rule}
    assert all(r["equal"] for r in kernel + rule)
    for r in kernel:
        assert abs(r["speedup"] - r["torch_us"] / r["kernel_us"]) < 1e-12 and r["kernel_tbs"] > 0
    # what the dispatch rule was read from: the kernel wins where both swapped axes are 60 or more, loses at 16
    assert all(r["speedup"] > 1 for r in kernel if r["narrow"] >= 60)
    assert min(r["speedup"] for r in kernel if r["narrow"] == 16) < 1
    assert lv.recorded_copy_table().count("\n") == len(kernel)
    assert len(lv.recorded_copy_figure().data) == 2


def test_the_step_rows_compare_two_runs_of_every_layer():
    rows = lv.step_rows()
    assert len(rows) == 13
    for r in rows:
        assert abs(r["gain"] - r["before_ms"] / r["after_ms"]) < 1e-12
        assert r["commits"][0] != r["commits"][1]
    assert lv.step_table().count("\n") == 13
