"""Headless tests of notebook 03's byte counts, canary runs on the production gather kernel and widget
callback (fovi_lab.lab.canary), on Warp's CPU device."""

import json
import re
import warnings
from pathlib import Path

import plotly.graph_objects as go
import pytest

from fovi_lab.lab import canary as cd
from fovi_lab.kernels.common import wp


def test_estimate_parts_and_validation():
    e = cd.estimate_smem(64, 64, 2)
    assert e["parts"] == {"a": 2 * 64 * 64 * 2, "b": 64 * 64 * 2, "acc": 2 * 64 * 64 * 4, "index": 0, "bias": 0}
    assert e["forward"] == 57344 and e["backward"] == 0
    g = cd.estimate_smem(64, 64, 4, gather=True, bias=True)
    assert g["forward"] == 107264 > cd.GPU_LIMITS["sm_89 opt-in (99 KiB)"]  # why m64n64r4 left sm_89
    assert cd.estimate_smem(16, 32, enable_backward=True)["backward"] == 2 * 8192
    assert cd.estimate_smem(16, 32, unroll=4)["forward"] == 4 * (2048 + 4096) + 2048
    for bad in (dict(tile_m=0, tile_n=8), dict(tile_m=8, tile_n=8, r=1.5)):
        with pytest.raises(ValueError):
            cd.estimate_smem(**bad)


@pytest.mark.parametrize("tm,tn,r", [(16, 32, 1), (32, 64, 2), (64, 64, 4)])
def test_estimate_matches_warps_own_count_of_the_production_kernel(tm, tn, r):
    from fovi_lab.kernels import forward as F
    k = cd.gather_kernel(tm, tn, r, 128)
    assert cd.warp_smem_bytes(k) == cd.estimate_smem(tm, tn, r, gather=True, bias=True)["forward"]
    assert cd.gather_kernel(tm, tn, r, 128) is k        # the forward's build cache: one module per config
    assert k is F.build_kernel(cd.gather_config(tm, tn, r, 128), mathdx=False)


def test_dead_tiles_unrolled_loops_and_backward_all_cost_bytes():
    base = cd.warp_smem_bytes(cd.make_budget_experiment(16, 32))
    ab = 16 * 64 * 2 + 64 * 32 * 2
    assert base == ab + 16 * 32 * 4 == cd.estimate_smem(16, 32)["forward"]
    assert cd.warp_smem_bytes(cd.make_budget_experiment(16, 32, dead_branch=True)) == base + ab
    assert cd.warp_smem_bytes(cd.make_budget_experiment(16, 32, unroll=4)) == 4 * ab + 16 * 32 * 4
    assert cd.warp_smem_bytes(cd.make_budget_experiment(16, 32, unroll=17)) == base
    k = cd.make_budget_experiment(16, 32, backward=True)
    assert cd.warp_smem_bytes(k) == base and cd.warp_smem_bytes(k, backward=True) == 2 * base
    assert cd.warp_smem_bytes(cd.make_budget_experiment(16, 32), backward=True) is None
    assert cd.warp_smem_bytes(cd.make_budget_experiment(16, 32, 256)) == base    # block_dim: same bytes


def test_cpu_arena_constant_matches_installed_warp():
    header = (Path(wp.__file__).parent / "native" / "tile.h").read_text()
    m = re.search(r"#define\s+WP_MAX_CPU_SHARED\s+(\d+)\s*\*\s*(\d+)", header)
    assert m, "WP_MAX_CPU_SHARED not found in warp/native/tile.h: re-check the CPU arena"
    assert int(m[1]) * int(m[2]) == cd.CPU_TILE_ARENA_BYTES


@pytest.mark.parametrize("r", [1, 2, 4])
def test_the_production_kernel_passes_the_canary(r):
    res = cd.canary_check(16, 32, r, 64, "cpu")
    assert res["ok"] and res["why"] == "ok" and res["untouched"] == 0
    assert res["max_err"] < 1e-2 and cd.error_class(res["max_err"]) == "< 0.01"


def test_a_launch_that_writes_nothing_fails_the_nan_canary_but_fools_a_zero_prefill():
    nan = cd.canary_check(16, 32, 1, 64, "cpu", launch=False)
    assert not nan["ok"] and "silent launch failure" in nan["why"]
    assert nan["untouched"] == nan["elements"] and nan["max_err"] is None
    zero = cd.canary_check(16, 32, 1, 64, "cpu", launch=False, prefill=0.0)
    assert zero["ok"]                                            # finite everywhere...
    assert cd.error_class(zero["max_err"]).startswith("WRONG")  # ...and wrong


def test_the_forward_cache_builds_once_and_remembers_failure():
    from fovi_lab.kernels import forward as F
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        k1, c1 = cd.validated_kernel(16, 32, 1, 64)
        k2, c2 = cd.validated_kernel(16, 32, 1, 64)
        bad1, d1 = cd.validated_kernel(128, 256, 4, 256)
        bad2, d2 = cd.validated_kernel(128, 256, 4, 256)
    assert k1 is not None and k1 is k2 and c2 and bad1 is None and bad2 is None and d2 and not d1
    assert len([w for w in caught if "lab_m128n256r4b256" in str(w.message)]) == 1
    why = F.VALIDATED.why(F.cache_key(cd.gather_config(128, 256, 4, 256), False), "cpu")
    assert "CPU tile arena" in why


def test_oversized_demo_refuses_the_cpu():
    with pytest.raises(ValueError, match="CUDA"):
        cd.oversized_launch_demo("cpu")


def test_budget_figure_is_small_and_deterministic():
    fig = cd.budget_figure()
    assert isinstance(fig, go.Figure) and not isinstance(fig, go.FigureWidget)
    names = [t.name for t in fig.data]
    assert names[:3] == ["A tiles (fp16, r of them)", "B tile (fp16)", "accumulators (fp32, r of them)"]
    assert "adjoint kernel (enable_backward)" in names
    assert len(fig.layout.shapes) == len(cd.GPU_LIMITS)
    assert fig.to_json() == cd.budget_figure().to_json() and len(fig.to_json()) < 20_000


def test_explore_config_fits_and_verdicts():
    s, fig = cd.explore_config(64, 64, 4, 128, device="cpu")
    assert s["estimate"] == s["warp_count"] == 107264
    assert s["fits"] == {"CUDA default, no opt-in (48 KiB)": False, "sm_89 opt-in (99 KiB)": False,
                         "H200 sm_90, as Warp 1.19 reported it": True}
    assert "canary passed" in s["verdict"]
    text = cd.format_summary(s, timings=False)
    assert "107264 B" in text and " s" not in text.split("\n")[-1][-3:]
    assert "build/load" in cd.format_summary(s) and "build/load" not in text
    assert isinstance(fig, go.Figure) and "your config" in json.dumps(fig.to_plotly_json()["layout"])


def test_explore_config_never_launches_over_the_cpu_arena():
    s, _ = cd.explore_config(256, 256, 4, 256, device="cpu")
    assert s["warp_count"] > cd.CPU_TILE_ARENA_BYTES
    assert s["verdict"].startswith("not launched") and not any(s["fits"].values())


@pytest.mark.parametrize("args", [(64, 64, 3, 128), (64, 64, 2, 100), (12, 64, 1, 128), ("x", 64, 1, 128)])
def test_explore_config_invalid_is_a_message(args):
    s, fig = cd.explore_config(*args, device="cpu")
    assert s["message"].startswith("Invalid choice") and cd.format_summary(s) == s["message"]
    assert isinstance(fig, go.Figure)


def test_limits_and_budget_tables_print_the_figure_s_numbers():
    lim = cd.limits_table().splitlines()
    assert len(lim) == len(cd.GPU_LIMITS) + 2
    assert "231424   226.0" in cd.limits_table() and "262144   256.0" in lim[-1]
    rows = {line.split("  ")[0].strip(): line for line in cd.budget_table().splitlines()[1:]}
    assert set(rows) == {cd.tile_text(*c[1:]) for c in cd.BUDGET_CONFIGS}     # the tiles in words, not ids
    assert "107264   104.8  H200 sm_90" in rows["64 rows x 64 channels, r = 4"]          # over sm_89, fits an H200 block
    assert "362496   354.0  no GPU" in rows[cd.tile_text(128, 128, 2, True)]  # the adjoint kernel's request
    assert rows["16 rows x 32 channels, r = 1"].endswith("CUDA default, sm_89 opt-in, H200 sm_90")
