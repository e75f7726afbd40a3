"""The tile-size widget over every family (fovi_lab.lab.family_explorer): any valid point runs live and matches the
reference, an invalid one says why before anything compiles, and two points give two different runs."""

from __future__ import annotations

import pytest

from fovi_lab.kernels.families import FAMILIES, PRESETS
from fovi_lab.lab.common import RunLog
from fovi_lab.lab.family_explorer import explore_point, family_widget, start_point

SMALL = 2e7          # FLOPs of tile work per CPU launch: a few output nodes


@pytest.mark.parametrize("family", [f.key for f in FAMILIES if not f.inference_only])
def test_every_family_runs_its_starting_point(family):
    res, fig = explore_point(family, "res18_layer1", 8, device="cpu", budget=SMALL)
    assert res["ok"] and res["passed"], res["message"]
    assert res["name"].startswith(dict((f.key, f.title) for f in FAMILIES)[family])
    assert res["run_ms"] > 0 and res["torch_ms"] > 0 and res["roofline_ms"] is None     # no peaks for the CPU
    assert len(fig.data) >= 2


def test_a_point_no_preset_names_runs_and_two_points_draw_two_runs():
    log = RunLog()
    a, _ = explore_point("tensor_cores", "res18_layer1", 8, device="cpu", log=log, budget=SMALL,
                         tile_o=48, tile_b=32, k=32, x_layout="transposed", store="direct", split=False,
                         w_layout="transposed", warps=4)
    assert a["ok"] and a["passed"] and a["id"] == "mmat_o48b32k32" and a["id"] not in PRESETS
    b, fig = explore_point("tensor_cores", "res18_layer1", 8, device="cpu", log=log, budget=SMALL,
                           tile_o=32, tile_b=8, k=16, x_layout="in place", store="direct", split=True,
                           w_layout="transposed", warps=4)
    assert b["ok"] and b["passed"] and b["id"] == "mmas_o32b8"
    labels = list(fig.data[0].x)
    assert len(labels) == 2 and labels[0] != labels[1]          # both runs drawn, each named in words
    assert "48 channels x 32 rows per warp" in labels[0] and "p loop split" in labels[1]


@pytest.mark.parametrize("family, params, why", [
    ("tensor_cores", dict(split=True, x_layout="transposed"), "no kernel combines"),
    ("pipelined", dict(channels=256, rows=256, k=64, stages=6), "bytes of shared"),
    ("tensor_cores", dict(tile_b=12), "tile_b .* must be one of"),
    ("im2col", dict(tile_k=128), "P64=576 is not a multiple of 128"),
    ("nope", dict(), "unknown 'nope'"),
])
def test_an_invalid_point_says_why_without_compiling(family, params, why, monkeypatch):
    import re
    from fovi_lab.kernels.forward import build
    monkeypatch.setattr(build, "build_kernel", lambda *a, **k: pytest.fail("nothing may compile"))
    res, fig = explore_point(family, "res18_layer1", 8, device="cpu", budget=SMALL, **params)
    assert not res["ok"] and re.search(why, res["message"]), res["message"]
    assert re.search(why, fig.layout.annotations[0].text)               # the figure says it too


def test_the_widget_starts_with_its_point_run():
    pytest.importorskip("ipywidgets")
    panel = family_widget("simt", "res18_layer1", 8, device="cpu")
    assert panel.last_result["ok"] and panel.last_result["passed"], panel.last_result["message"]
    assert start_point("simt", "res18_layer1", 8).id == panel.last_result["id"]
    tile_b = panel.children[1].children[0]                                    # the first parameter's dropdown
    tile_b.value = 8 if tile_b.value != 8 else 4                              # a change re-runs
    assert panel.last_result["id"] != start_point("simt", "res18_layer1", 8).id
