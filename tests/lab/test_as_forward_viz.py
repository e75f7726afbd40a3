"""fovi_lab.lab.as_forward_viz (notebook 12): the live timing of both gradients two ways, and the summary lines the
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


def test_the_taps_work_is_counted_from_the_layers_tables():
    rows = {r["layer"]: r for r in afv.taps_work_rows(batch=64)}
    stem = rows["res18_stem"]                                  # Cin = 3, K = V = 49: 147 tap-channels, 192 slots
    assert (stem["q"], stem["p64"]) == (147, 192) and stem["ratio"] == pytest.approx(147 / 192)
    assert stem["taps_macs"] == stem["staged_macs"] * 147 // 192
    for r in rows.values():
        assert r["rows"] * r["chunks"] >= 64 > r["rows"] * (r["chunks"] - 1)
    assert "0.77x" in afv.taps_work_table(list(rows.values()))


def test_the_taps_records_pair_with_the_rules_of_the_same_boot():
    base = dict(mode="train-step", layer="res18_stem", B=16, device="GPU X", boot_id="a", commit="c1",
                date="2026-01-01T00:00:00", replay="auto", tile_gemm="cuBLASDx")
    taps = {"FOVI_KNN_DX_PATH": "taps"}
    recs = [dict(base, impl="warp_train", ms=0.40), dict(base, impl="warp_train", ms=0.10, settings=taps),
            dict(base, impl="warp_train_graphed", ms=0.05, settings=taps),              # no rule record to pair
            dict(base, impl="warp_train", ms=0.01, settings=taps, boot_id="b"),         # another boot: unpaired
            dict(base, impl="warp_train", ms=0.30, B=512, settings={"FOVI_KNN_DX_PATH": "auto"}),
            dict(base, impl="warp_train", ms=0.20, B=512, settings=taps),
            dict(base, impl="torch_compact", ms=0.2, settings=taps),
            dict(base, impl="warp_train", ms=0.02, B=64, settings=dict(taps, FOVI_WARP_MATHDX="0")),
            dict(base, impl="warp_train", ms=0.08, B=64),                               # another build: unpaired
            dict(base, impl="warp_train", ms=0.03, B=128, settings=taps),
            dict(base, impl="warp_train", ms=0.06, B=128, date="2026-01-01T00:05:00"),   # the newest rule record
            dict(base, impl="warp_train", ms=0.09, B=128),
            dict(base, impl="warp_train", ms=0.01, B=128, replay="in-place"),           # another replay mode
            dict(base, impl="warp_train", ms=0.01, B=128, note_run="a development run"),
            dict(base, impl="warp_train", ms=0.05, B=256, settings=taps, boot_id=None),   # no boot: unpaired
            dict(base, impl="warp_train", ms=0.07, B=256, boot_id=None)]
    rows = afv.taps_recorded_rows(recs)
    assert [(r["B"], r["impl"], r["taps_ms"], r["rule_ms"]) for r in rows] == [
        (16, "warp_train", 0.10, 0.40), (128, "warp_train", 0.03, 0.06), (512, "warp_train", 0.20, 0.30)]
    assert rows[0]["speedup"] == pytest.approx(4.0)
    assert "4.00x" in afv.taps_recorded_lines(rows)[0]
    assert afv.taps_recorded_lines([])[0].startswith("No GPU record")


def test_the_stems_dx_two_ways_against_the_oracle():
    r = afv.stem_dx_here("dinov3_patch", 2, device="cpu", reps=1)
    assert r["taps_err"] < 1e-6 and 1e-6 < r["staged_err"] < 1e-3 and r["bitwise"]
    assert r["unread"] > 0 and r["unread_zero"] and r["taps_ms"] > 0 and r["staged_ms"] > 0
