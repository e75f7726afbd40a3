"""Headless tests of notebook 07's figures and widget callback (fovi_lab.lab.train_viz)."""

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from fovi_lab.lab import train_viz as tv
from fovi_lab.train import FoveatedDigitsNet, TrainResult, load_digits_tensors


@pytest.fixture(scope="module")
def model():
    return FoveatedDigitsNet(backend="torch_compact")


def test_retina_points_are_pixel_centres(model):
    px = tv.retina_points_px(model, 32)
    assert px.shape == (model.retina.shape[2], 2)
    assert px.min() >= -0.5 and px.max() <= 31.5  # inside the image (grid_sample, align_corners=False)
    shifted = tv.retina_points_px(model, 32, fixation=(0.5, 0.0))
    assert np.allclose(shifted[:, 0] - px[:, 0], 8.0) and np.allclose(shifted[:, 1], px[:, 1])


def test_retina_figure_values_are_what_the_model_samples(model):
    _, _, x_test, y_test = load_digits_tensors()
    fig = tv.retina_figure(model, x_test[0], int(y_test[0]))
    assert isinstance(fig, go.Figure) and not isinstance(fig, go.FigureWidget)
    assert [t.name for t in fig.data] == ["image", "sample points", "sampled values"]
    vals = np.asarray(fig.data[2].marker.color, dtype=np.float64)
    want = model.sample(x_test[:1])[0, 0].numpy()
    assert np.allclose(vals, want, atol=1e-4)
    assert f"'{int(y_test[0])}'" in fig.layout.annotations[0].text
    assert fig.to_json() == tv.retina_figure(model, x_test[0], int(y_test[0])).to_json()
    assert len(fig.to_json()) < 60_000


def _result(name, loss, acc=0.5):
    return TrainResult(name, "cpu", steps=list(range(1, len(loss) + 1)), loss=list(loss), test_accuracy=acc)


def test_loss_figure_and_compare():
    a, b = _result("warp_train", [2.3, 2.0, 1.5], 0.6), _result("torch_compact", [2.3, 2.02, 1.5], 0.61)
    fig = tv.loss_figure([a, b.as_dict()])
    curves = {t.name: t for t in fig.data if t.showlegend is not False}
    assert list(curves) == ["torch_compact (test acc 61.0%)", "warp_train (test acc 60.0%)"]   # the line first
    g = tv.compare_losses(a, b)
    assert g["steps"] == 3 and g["max_abs_gap"] == pytest.approx(0.02) and g["max_rel_gap"] == pytest.approx(0.02 / 2.02)
    assert g["step_of_max"] == 2
    # coinciding curves both show: a thick line under open circles, and the difference drawn apart, below
    line, circles = curves["torch_compact (test acc 61.0%)"], curves["warp_train (test acc 60.0%)"]
    assert line.mode == "lines" and line.line.width > 2 and circles.mode == "markers"
    assert circles.marker.symbol == "circle-open"
    diff = next(t for t in fig.data if t.name == "warp_train \u2212 torch_compact")
    assert diff.yaxis == "y2" and list(diff.y) == pytest.approx([0.0, -0.02, 0.0], abs=1e-6)
    assert "largest 0.0200 at step 2" in fig.layout.annotations[0].text
    assert fig.layout.yaxis.title.text == "loss (nats)" and fig.layout.xaxis2.title.text == "training time (steps)"
    line = tv.coincide_line(a, b)
    assert line.startswith("warp_train and torch_compact coincide") and "largest difference 0.0200 nats" in line
    assert "at step 2" in line and "do not coincide" in tv.coincide_line(a, b, within=0.001)
    alone = tv.loss_figure([a])
    assert len(alone.data) == 1 and alone.layout.xaxis.title.text == "training time (steps)"
    with pytest.raises(ValueError):
        tv.compare_losses(a, TrainResult("x", "cpu", steps=[10], loss=[1.0]))


def test_available_backends_keeps_order_and_drops_unknown():
    assert tv.available_backends(("no_such_backend", "torch_compact")) == ["torch_compact"]


@pytest.mark.parametrize("kw", [dict(backends=[], steps=5), dict(backends=["torch_compact"], steps=0),
                                dict(backends=["torch_compact"], steps=5, lr=0.0),
                                dict(backends=["torch_compact"], steps="many"),
                                dict(backends=["no_such_backend"], steps=5)])
def test_train_and_plot_invalid_is_a_message(kw):
    s, fig = tv.train_and_plot(**kw)
    assert "message" in s and isinstance(fig, go.Figure)
    assert tv.format_train_summary(s) == s["message"]


def test_train_and_plot_runs_and_lists_missing_backends():
    s, fig = tv.train_and_plot(["torch_compact", "no_such_backend"], steps=2, batch=16)
    assert list(s["results"]) == ["torch_compact"] and s["missing"] == ["no_such_backend"]
    r = s["results"]["torch_compact"]
    assert r["steps"] == [1, 2] and all(np.isfinite(r["loss"])) and 0.0 <= r["test_accuracy"] <= 1.0
    text = tv.format_train_summary(s, timings=False)
    assert "torch_compact" in text and "no_such_backend: not registered" in text and " s)" not in text
    assert len(fig.data) == 1


def test_two_backends_track_when_warp_train_is_registered():
    if "warp_train" not in tv.available_backends(("warp_train",)):
        pytest.skip("warp_train is not registered in this install")
    s, _ = tv.train_and_plot(["warp_train", "torch_compact"], steps=3, batch=16)
    assert s["gap"]["max_rel_gap"] < 0.05, s["gap"]
