"""The widgets of notebooks 01, 02, 04, 05, 06, 11 and 13 (rerun on each change), and the button widgets of 03 and
07, all built by ``fovi_lab.lab.common.live`` (09's: tests/lab/test_mma_widget.py; their busy state:
tests/lab/test_widget_busy.py).

Each test calls the ``fovi_lab.lab`` function the notebook's widget callback calls, with the notebook's default
controls except one, at two values of that control, on Warp's CPU device: the figure the callback displays (the
function returns it) must change, must mark the chosen value, and the live time / result the callback prints must
be there for both calls."""

from __future__ import annotations

import json

import pytest

from fovi_lab import lab as kl
from fovi_lab.lab.figure_layout import title_text


def _plain(obj):
    """Plotly's typed arrays (``{"dtype", "bdata"}``) as lists, the rest as is."""
    if isinstance(obj, dict):
        if set(obj) >= {"dtype", "bdata"}:
            import base64
            import numpy as np
            arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=obj["dtype"])
            return arr.reshape(obj["shape"]).tolist() if "shape" in obj else arr.tolist()
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj


def _figure(fig) -> dict:
    return _plain(json.loads(fig.to_json()))


def _names(fig: dict):
    return [t.get("name") or "" for t in fig["data"]]


def _title(fig: dict) -> str:
    title = fig["layout"].get("title") or {}
    return title.get("text", "") if isinstance(title, dict) else str(title)


def _annotations(fig: dict):
    return [a.get("text", "") for a in fig["layout"].get("annotations", [])]


# ---------------------------------------------------------------- notebook 01: the KNN graph, one node drawn


def test_01_graph_widget_moves_and_marks_the_chosen_node():
    from fovi_lab.lab import graph_viz as gv
    defaults = dict(a=0.5, k=25, stride=2, rf="rf1")               # notebook 01's widget defaults
    figs, summaries = {}, {}
    for node in (0, 1):
        summary, fig = gv.explore_graph(node=node, **defaults)
        assert summary["ok"], summary["message"]
        assert summary["message"].startswith(f"{summary['nin']} -> {summary['nout']} nodes, K = ")   # what it prints
        figs[node], summaries[node] = _figure(fig), summary
    assert figs[0]["data"] != figs[1]["data"]
    from fovi_lab.graph.geometry import foveated_knn_graph
    graph = foveated_knn_graph(fov=16.0, a=0.5, res=64, in_stride=1, out_stride=2.0, k=25, ref_frame_mult=1.0)
    for node, d in figs.items():
        star = [t for t in d["data"] if t.get("name") == "output node"]
        assert len(star) == 1 and star[0]["marker"]["symbol"] == "star"
        x, y = graph.out_coords[node]
        assert star[0]["x"][0] == pytest.approx(float(x), abs=1e-3) and star[0]["y"][0] == pytest.approx(float(y), abs=1e-3)
        assert any(t.startswith(f"node {node}: ") for t in _annotations(d))       # the subplot title names the node


def test_01_graph_widget_stride_moves_the_default_node_s_picture():
    # node 0 reads the same K inputs at every stride (the input grid is fixed): the picture shows the output grid
    # of the chosen stride around it, in a view wide enough to hold the nearest other output node
    from fovi_lab.lab import graph_viz as gv
    defaults = dict(a=0.5, k=25, node=0, rf="rf1")                 # notebook 01's widget defaults
    figs, spans, summaries = {}, {}, {}
    for stride in (2, 8):
        summary, fig = gv.explore_graph(stride=stride, **defaults)
        assert summary["ok"], summary["message"]
        d = _figure(fig)
        grid = [t for t in d["data"] if t.get("name") == f"output nodes, stride {stride}"]
        assert len(grid) == 1 and len(grid[0]["x"]) >= 2                   # the node and a neighbour of the grid
        assert any(t.startswith("node 0: ") and t.endswith(f"stride {stride}") for t in _annotations(d))
        inputs = next(t for t in d["data"] if t.get("name") == "other inputs")
        figs[stride], spans[stride], summaries[stride] = d, max(abs(v) for v in inputs["x"]), summary
        assert summary["message"].endswith("% of the inputs read by no output node")
    assert figs[2]["data"] != figs[8]["data"]
    assert spans[8] > 2 * spans[2]                                        # the view widens with the stride
    assert summaries[8]["node_spacing"] > 4 * summaries[2]["node_spacing"]
    assert summaries[8]["unread_inputs"] > summaries[2]["unread_inputs"]


# ------------------------------------------------ notebooks 02, 04, 05, 06: run logs (one bar per run, labelled)


def _latest_run_marked(d: dict, res: dict, n_runs: int, time_key: str = "run_ms"):
    """The run log's figure shows ``n_runs`` runs; the last is ``res``'s, named by its label, with its live time."""
    bars = {t["name"]: t for t in d["data"]}
    warp = bars["Warp kernel(s)"]
    assert len(warp["x"]) == n_runs
    assert warp["x"][-1] == f"#{n_runs} {res['label']}"
    assert warp["y"][-1] == pytest.approx(kl.round4(res[time_key])) and warp["y"][-1] > 0
    # the title: the log's title and the run's verdict, the whole message under it (wrapped, in small type)
    lines = _title(d).split("<br>")
    head = title_text("<br>".join(line for line in lines if not line.startswith("<sub>")))
    verdict = res["message"].split()[0]
    assert verdict in ("PASS", "FAIL") and head.endswith(": " + verdict), head
    small = "<br>".join(line for line in lines if line.startswith("<sub>"))
    assert " ".join(res["message"].split()) in title_text(small)


def _forward(layer="res18_layer1", batch=64, cout=0, tile_m=32, tile_n=64, r=1, block_dim=128, kernel="uncached",
             log=None):
    """Notebook 02's ``_run`` (04's passes ``kernel="uncached"`` the same way): the same call, the same defaults."""
    return kl.explore_forward(layer, batch, cout or None, tile_m, tile_n, r, block_dim, kernel, device="cpu", log=log)


def _forward_printed(res: dict) -> None:
    assert res["ok"] and res["passed"], res["message"]
    assert res["message"].startswith("PASS")
    assert res["run_ms"] > 0 and res["torch_ms"] > 0 and res["compile_s"] >= 0 and res["ctas"] > 0


def test_02_forward_widget_moves_and_marks_the_chosen_tiles():
    log = kl.RunLog(title="forward runs")
    runs = []
    for n, tile_m in enumerate((32, 16), start=1):                  # the tile-rows dropdown
        res, fig = _forward(tile_m=tile_m, log=log)
        _forward_printed(res)
        assert res["label"] == f"res18_layer1 B={res['batch']} {kl.short_label(f'm{tile_m}n64')}"
        d = _figure(fig)
        _latest_run_marked(d, res, n)
        runs.append(d)
    assert runs[0]["data"] != runs[1]["data"]


def test_04_weight_reuse_widget_moves_and_marks_the_chosen_r():
    log = kl.RunLog(title="weight-reuse runs")
    runs = []
    for n, r in enumerate((2, 1), start=1):                         # the r toggle (notebook default 2)
        res, fig = _forward(r=r, kernel="uncached", log=log)
        _forward_printed(res)
        assert res["w_bytes"] > 0 and res["smem_estimate"] > 0
        tiles = "m32n64" + (f"r{r}" if r != 1 else "")
        assert res["label"] == f"res18_layer1 B={res['batch']} {kl.short_label(tiles)}"
        d = _figure(fig)
        _latest_run_marked(d, res, n)
        runs.append((d, res))
    assert runs[0][0]["data"] != runs[1][0]["data"]
    assert runs[0][1]["w_bytes"] < runs[1][1]["w_bytes"]             # r = 2 streams the weights half as often


def _adjoint_runs_marked(run, title: str, live_keys):
    """``run(batch, log)`` at B = 1 and 2 (the smallest batches of the batch box): each passes, prints its live
    times and the fields ``live_keys``, and is the latest run of the log's figure, marked; the figures differ."""
    log = kl.RunLog(title=title)
    runs = []
    for n, batch in enumerate((1, 2), start=1):
        res, fig = run(batch, log)
        assert res["ok"] and res["passed"] and res["message"].startswith("PASS"), res["message"]
        assert res["run_ms"] > 0 and res["torch_ms"] > 0 and all(res[k] for k in live_keys)
        assert f"B={batch} " in res["label"]
        d = _figure(fig)
        _latest_run_marked(d, res, n)
        runs.append(d)
    assert runs[0]["data"] != runs[1]["data"]


def test_05_adjoint_widget_moves_and_marks_the_chosen_batch():
    _adjoint_runs_marked(lambda b, log: kl.explore_adjoint("res18_layer1", b, None, "gi2_p64b64", "gw3_p64n64",
                                                           device="cpu", log=log),
                         "adjoint runs", ("gi_ctas", "gw_ctas"))


def test_06_fused_adjoint_widget_moves_and_marks_the_chosen_batch():
    from fovi_lab.lab import fused_viz as fv
    _adjoint_runs_marked(lambda b, log: fv.explore_fused_run("res18_layer1", b, None, "auto", "auto", 0,
                                                             device="cpu", log=log, seg_steps=-1),
                         "fused adjoint runs", ("dx_kernel", "dw_kernel"))


# --------------------------------------------- notebooks 11 and 13: a live run beside the layer's recorded runs


def _batch_marked(d: dict, batch: int, live_line: str):
    line = [t for t in d["data"] if t.get("name") == f"your batch: B = {batch}"]
    assert len(line) == 1 and line[0]["x"] == [f"B={batch}", f"B={batch}"]
    assert f"B={batch}" in d["layout"]["xaxis"]["categoryarray"]
    assert any(live_line in a for a in _annotations(d))             # the live run, named, beside the records


def _two_batches_marked(widget, batches):
    """``widget(batch)`` at two batches: each run passes, prints its live time and the rule's pick, and its figure
    marks that batch; the two figures differ."""
    figs = {}
    for batch in batches:
        lines, fig = widget(batch)
        assert len(lines) == 3 and lines[0].startswith("PASS"), lines
        assert " ms here (cpu)" in lines[1] and f"at B = {batch}" in lines[2]
        figs[batch] = _figure(fig)
        _batch_marked(figs[batch], batch, lines[1])
    assert figs[batches[0]]["data"] != figs[batches[1]]["data"]


def test_13_split_widget_moves_and_marks_the_chosen_batch():
    from fovi_lab.lab import split_viz as spv
    _two_batches_marked(lambda b: spv.explore_split_widget("res18_layer3", b, "ss_b8o8u4", device="cpu"),
                        (1, 4))                                     # the batch slider (min 1)


def test_11_pipe_widget_moves_and_marks_the_chosen_batch():
    from fovi_lab.lab import pipe_viz as pv
    _two_batches_marked(lambda b: pv.explore_pipe_widget("alex_L1", b, "mmap_o64b128k32s3", device="cpu"), (1, 2))


# ---------------------------------------------------------------- notebooks 03 and 07: their button widgets' callbacks


def test_03_canary_widget_moves_and_marks_the_chosen_tiles():
    """Notebook 03's widget (run once at once, then on its button): the chosen tile's shared-memory estimate is the
    'your config' mark, which moves with the tile, and its summary prints the estimate and Warp's own count."""
    from fovi_lab.lab import canary as cd
    figs, summaries = {}, {}
    for tile_m in (64, 32):
        summary, fig = cd.explore_config(tile_m, 64, 2, 128, device="cpu")
        text = cd.format_summary(summary)
        assert f"{tile_m} rows x 64 channels, r = 2" in text and "Warp's own count" in text
        figs[tile_m], summaries[tile_m] = _figure(fig), text
    marks = {m: [a for a in figs[m]["layout"]["annotations"] if a.get("text") == "your config"] for m in figs}
    assert all(len(v) == 1 for v in marks.values())
    assert marks[64][0]["y"] != marks[32][0]["y"]
    for m, text in summaries.items():
        assert f"{marks[m][0]['y']} B" in text                    # the mark sits at the printed estimate
        assert f"{m} rows x 64 channels" in _title(figs[m])


def test_07_training_widget_redraws_the_chosen_run():
    """Notebook 07's widget (a training run on its button): another step count or batch gives other loss curves,
    one per chosen backend, named in the legend, and the summary it prints names each backend."""
    from fovi_lab.lab import train_viz as tv
    figs = {}
    for steps in (2, 3):
        summary, fig = tv.train_and_plot(("torch_compact",), steps, 1e-2, 16, device="cpu")
        text = tv.format_train_summary(summary)
        assert "torch_compact" in text
        figs[steps] = _figure(fig)
        assert any("torch_compact" in n for n in _names(figs[steps]))
    assert figs[2]["data"] != figs[3]["data"]
