"""The fovi layer table (docs/operator.md §5) regenerated from geometry: shapes and pad shares."""

import pytest
import torch

from fovi_lab.graph import layers
from fovi_lab.graph.layers import LAYERS, layer_graph, layer_meta, layer_shape, synthetic_meta

# docs/operator.md §5: name -> (cin, cout, nin, nout, k, v_rf2, v_rf1, p, p64, pad %)
SPEC = {
    "alex_L0": (3, 96, 4085, 964, 121, 484, 121, 363, 384, 4.7),
    "alex_L1": (96, 256, 230, 230, 25, 100, 25, 2400, 2432, 8.6),
    "alex_L2": (256, 384, 60, 60, 9, 36, 9, 2304, 2304, 11.3),
    "alex_L3": (384, 384, 60, 60, 9, 36, 9, 3456, 3456, 11.3),
    "alex_L4": (384, 256, 60, 60, 9, 36, 9, 3456, 3456, 11.3),
    "res18_stem": (3, 64, 4085, 964, 49, 196, 49, 147, 192, 3.2),
    "res18_layer1": (64, 64, 230, 230, 9, 36, 9, 576, 576, 3.8),
    "res18_layer2_0": (64, 128, 230, 60, 9, 36, 9, 576, 576, 9.3),
    "res18_layer2": (128, 128, 60, 60, 9, 36, 9, 1152, 1152, 11.3),
    "res18_layer3_0": (128, 256, 60, 16, 9, 36, 9, 1152, 1152, 20.8),
    "res18_layer3": (256, 256, 16, 16, 9, 36, 9, 2304, 2304, 22.2),
    "res18_layer4_0": (256, 512, 16, 2, 9, 36, 9, 2304, 2304, 27.8),
    "dinov3_patch": (3, 384, 3976, 64, 101, 256, 256, 303, 320, 1.6),
}


def test_table_names_in_order():
    assert list(LAYERS) == list(SPEC)
    assert all(name == spec.name for name, spec in LAYERS.items())
    assert LAYERS["dinov3_patch"].bias and not any(s.bias for n, s in LAYERS.items() if n != "dinov3_patch")


@pytest.mark.parametrize("name", list(SPEC))
def test_shapes_match_spec(name):
    cin, cout, nin, nout, k, v2, v1, p, p64, _ = SPEC[name]
    for rf, v in (("rf2", v2), ("rf1", v1)):
        s = layer_shape(name, rf)
        assert (s["cin"], s["cout"], s["nin"], s["nout"], s["k"]) == (cin, cout, nin, nout, k)
        assert (s["v"], s["p"], s["p64"], s["q"]) == (v, p, p64, cin * v)


@pytest.mark.parametrize("name", [n for n in SPEC if n != "dinov3_patch"])
def test_pad_share_matches_spec(name):
    # measured values agree with the spec column to within 0.05 points (it rounds to 0.1)
    assert 100 * layer_shape(name)["pad_fraction"] == pytest.approx(SPEC[name][-1], abs=0.06)
    assert LAYERS[name].spec_pad_pct == SPEC[name][-1]


def test_dinov3_pad_share_is_the_documented_approximation():
    # A plain Euclidean KNN (K=101) onto the 8x8-matched grid pads 13.2 % of entries; fovi's
    # partitioning patch embed has 1.6 %. Pinned so that a change in either is noticed.
    assert 100 * layer_shape("dinov3_patch")["pad_fraction"] == pytest.approx(13.18, abs=0.05)


def test_rf_collisions():
    assert layer_shape("alex_L0", "rf1")["collision_rate"] == pytest.approx(0.264, abs=0.005)
    for name in SPEC:
        if name != "dinov3_patch":
            assert 0.10 <= layer_shape(name, "rf1")["collision_rate"] <= 0.30
            assert layer_shape(name, "rf2")["collision_rate"] < 0.01


def test_same_grid_layers_share_coords():
    assert layer_graph("alex_L2").in_coords is layer_graph("alex_L3").out_coords
    assert layer_graph("res18_layer2_0").out_coords is layer_graph("res18_layer2").in_coords


def test_layer_meta():
    m = layer_meta("res18_layer3_0", "rf2")
    assert (m.cin, m.cout, m.nin, m.nout, m.k, m.v, m.p, m.p64, m.q) == (128, 256, 60, 16, 9, 36, 1152, 1152, 4608)
    assert layer_meta("res18_layer3_0", "rf2") is m
    assert m.input_linear.dtype == torch.int32 and tuple(m.input_linear.shape) == (16, 1152)
    # reverse CSR references every non-pad entry once
    g = layer_graph("res18_layer3_0")
    assert m.nnz == int((g.idx < g.nin).sum())


def test_errors():
    with pytest.raises(KeyError, match="unknown name"):
        layer_graph("nope")
    with pytest.raises(ValueError, match="rf"):
        layer_graph("alex_L0", "rf3")


@pytest.mark.parametrize("name", ["MAIN", "ODD", "PAD_HEAVY"])
def test_synthetic_meta(name):
    cin, cout, nin, nout, k, v, pads = layers.SYNTHETIC[name]
    m = synthetic_meta(name, seed=3)
    assert (m.cin, m.cout, m.nin, m.nout, m.k, m.v) == (cin, cout, nin, nout, k, v)
    assert int((m.idx == nin).sum()) == min(pads, nout * k)
    assert torch.equal(synthetic_meta(name, seed=3).idx, m.idx)
