"""auto on a GPU no record covers: the backend the cost model prices lowest on the device's datasheet peaks
(fovi_lab.kernels.cost_pick), reached through the registry's estimators (fovi_lab.ops.dispatch.estimated_backend)."""

from __future__ import annotations

import pytest
import torch

from fovi_lab.graph.layers import layer_meta
from fovi_lab.kernels import cost_pick
from fovi_lab.kernels.cost_model import CostModel, Group
from fovi_lab.ops import dispatch, registry
from fovi_lab.ops.devices import DEVICES, DeviceSpec


def test_the_estimates_price_each_backend_of_the_mode_on_a_gpu_with_peaks():
    meta = layer_meta("res18_layer1")
    train = cost_pick.backend_estimates(meta, 16, DEVICES["a100"], True)
    infer = cost_pick.backend_estimates(meta, 16, DEVICES["a100"], False)
    assert set(train) == {"warp_train", "torch_compact", "torch_binned"}
    assert set(infer) == {"warp_compact", "torch_compact", "torch_binned"}
    assert all(ms > 0 for ms in train.values()) and train["torch_compact"] == infer["torch_compact"]
    pick = cost_pick.estimated_pick(meta, 16, DEVICES["a100"], True)
    assert pick == min(train, key=train.get)
    assert cost_pick.estimated_pick(meta, 16, DEVICES["a100"], True, ("torch_compact", "torch_binned")) in \
        ("torch_compact", "torch_binned")
    words = cost_pick.estimate_words(meta, 16, DEVICES["a100"], True)
    assert words.startswith("the cost model's estimates on NVIDIA A100") and f"{pick} " in words


def test_no_estimate_on_the_cpu_or_a_gpu_without_datasheet_figures():
    meta = layer_meta("res18_layer1")
    unknown = DeviceSpec("NVIDIA RTX Something", 89, sms=128, smem_per_block=99 * 1024)
    for spec in (DEVICES["cpu"], unknown):
        assert cost_pick.backend_estimates(meta, 16, spec, True) == {}
        assert cost_pick.estimated_pick(meta, 16, spec, True) is None
        assert cost_pick.estimate_words(meta, 16, spec, True) == ""


def test_the_pick_follows_the_fitted_model():
    """A model that prices torch_binned's group far below the Warp kernels' makes it the pick, and one without a
    PyTorch group leaves the Warp backend alone."""
    meta = layer_meta("res18_layer1")
    cheap, dear = Group(0.001, 0.0, 0.0, 0.0, 6, 0.0), Group(1.0, 0.0, 0.0, 0.0, 6, 0.0)
    binned_first = CostModel({"warp": dear, "torch_binned": cheap, "torch_compact": dear})
    est = cost_pick.backend_estimates(meta, 8, DEVICES["h100"], True, model=binned_first)
    assert min(est, key=est.get) == "torch_binned"
    warp_only = CostModel({"warp": cheap})
    assert cost_pick.backend_estimates(meta, 8, DEVICES["h100"], False, model=warp_only) == \
        pytest.approx({"warp_compact": 0.001})


def test_dispatch_asks_the_registered_estimators_once_per_signature(monkeypatch):
    meta = layer_meta("res18_layer1")
    asked = []

    def first(meta, batch, device, training, candidates):
        asked.append(("first", batch))
        return None                                        # prices nothing: the next one answers

    def second(meta, batch, device, training, candidates):
        asked.append(("second", batch))
        return "torch_binned" if "torch_binned" in candidates else None
    monkeypatch.setattr(registry, "ESTIMATORS", [first, second])
    monkeypatch.setattr(dispatch, "_estimated", {})
    dev = torch.device("cuda", 0)
    cands = ("warp_train", "torch_compact", "torch_binned")
    assert dispatch.estimated_backend(meta, 16, dev, True, cands) == "torch_binned"
    assert dispatch.estimated_backend(meta, 16, dev, True, cands) == "torch_binned"
    assert asked == [("first", 16), ("second", 16)]
    assert dispatch.estimated_backend(meta, 16, dev, True, ("warp_train",)) is None
    monkeypatch.setattr(registry, "ESTIMATORS", [])
    assert dispatch.estimated_backend(meta, 32, dev, True, cands) is None


def test_the_warp_backend_registers_the_cost_models_estimator():
    pytest.importorskip("warp")
    import fovi_lab.knn_warp  # noqa: F401
    assert cost_pick.estimator in registry.ESTIMATORS
    with pytest.raises(TypeError, match="fn"):
        registry.register_estimator("not a function")
