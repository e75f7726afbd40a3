"""fovi_lab.lab.as_forward_viz (notebook 09): the live timing of both gradients two ways, and the summary lines the
notebook's prose quotes."""

import pytest

from fovi_lab.lab import as_forward_viz as afv


def test_both_gradients_two_ways_agree_and_are_timed_here():
    rows = afv.time_here("res18_layer3_0", batch=3, device="cpu", reps=1)
    assert [r["gradient"] for r in rows] == ["dx", "dW"]
    for r in rows:
        assert r["rel_diff"] < 1e-5 and r["as_forward_ms"] > 0 and r["kernels_ms"] > 0
        assert r["own_path"] == "fused" and r["kernels_over_as_forward"] == pytest.approx(r["kernels_ms"] / r["as_forward_ms"])


def _row(layer, gflop, dx, dw, rule=True):
    return dict(layer=layer, B=64, gflop=gflop, dx_kernels=dx, dx_mma=1.0, dW_kernels=dw, dW_mma=1.0, rule=rule)


def test_the_summary_finds_the_work_from_which_the_tensor_cores_win_both():
    rows = [_row("alex_L1", 1.0, 1.5, 0.9), _row("alex_L2", 2.0, 1.2, 1.1), _row("alex_L3", 3.0, 2.0, 1.4),
            _row("dinov3_patch", 4.0, 0.3, 0.5, rule=False)]          # Cin = 3: left out of the threshold
    lines = afv.recorded_summary(rows)
    assert lines[0] == "where the rule takes the tensor cores (3 shapes): dx 1.20-2.00x, dW 0.90-1.40x"
    assert lines[1] == "where it keeps the fused / staged kernels (1 shapes): dx 0.30-0.30x, dW 0.50-0.50x"
    assert lines[2] == "from 2.00 GFLOP on with Cin >= 16 (2 shapes) the tensor cores win both: dx 1.20-2.00x, dW 1.10-1.40x"
