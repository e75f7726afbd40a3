"""fovi_lab.lab.host_viz: the host cost of a forward call measured here, and the recorded H200 host probes."""

import json

import pytest
import torch

from fovi_lab.lab import host_viz as hv


def test_host_cost_times_both_paths_on_a_node_major_shape():
    from fovi_lab.kernels import forward as F
    r = hv.host_cost("MAIN", batch=8, reps=5)          # the default pick: an mma kernel (x read in place)
    assert r["cold_us"] > 0 and r["warm_us"] > 0
    assert F.config_spec(r["config"]).variant in F.MMA_VARIANTS and r["device"] == "cpu"


def _probe(path, fwd, step, replay):
    shape = {"fwd": {"host_issue_ms": fwd, "pipelined_ms": fwd}, "step": {"host_issue_ms": step, "pipelined_ms": step},
             "graph": {"replay_ms": replay, "matches_eager": True}}
    path.write_text(json.dumps(dict(device="NVIDIA H200", warp="1.19.0", torch="2.11.0", date="2026-11-29",
                                    results={"res18_layer1 B=16": shape, "only here B=1": shape})))


def test_probe_figure_reads_every_recorded_probe(tmp_path):
    _probe(tmp_path / "host_probe_before.json", 0.15, 0.6, 0.15)
    _probe(tmp_path / "host_probe_trimmed.json", 0.07, 0.4, 0.15)
    runs = hv.host_probe_runs(tmp_path)
    assert [r["label"] for r in runs] == ["no call cache", "call cache + trimmed call"]
    fig = hv.host_probe_figure(tmp_path)
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == 4 and [float(b.y[0]) for b in bars[::2]] == [0.15, 0.07]
    assert float(fig.data[-1].y[0]) == 0.15 and "H200" in fig.layout.title.text


def test_probe_figure_without_records_says_so(tmp_path):
    fig = hv.host_probe_figure(tmp_path)
    assert "no recorded host probe" in fig.layout.annotations[0].text


def test_the_repository_probes_load():
    runs = hv.host_probe_runs()
    assert [r["file"] for r in runs] == list(hv.PROBE_LABELS)        # every labelled probe is recorded
    assert all("res18_layer1 B=16" in r["results"] for r in runs)


def test_probe_rows_flatten_the_recorded_probes():
    rows = hv.host_probe_rows()
    runs = hv.host_probe_runs()
    assert len(rows) == len(runs) * len({r["shape"] for r in rows})
    for r in rows:
        assert r["fwd_ms"] > 0 and r["step_ms"] > 0
        assert r["replay_ms"] is None or r["host_over_gpu"] == r["step_ms"] / r["replay_ms"]


def _ab(path, rows):
    import gzip
    with gzip.open(path, "wt") as fh:
        for r in rows:
            fh.write(json.dumps(dict(device="NVIDIA H200", warp="1.19.0", torch="2.11.0", date="2026-12-04", **r)) + "\n")


def test_replay_ab_rows_pick_the_fastest_torch_form(tmp_path):
    p = tmp_path / "replay_ab.jsonl.gz"
    base = dict(mode="train-step", layer="res18_layer1", B=16)
    _ab(p, [dict(base, impl="warp_train", ms=0.3, bitwise_equal_direct=True, replay="auto"),
            dict(base, impl="warp_train_direct", ms=0.9, bitwise_equal_direct=True, replay="off"),
            dict(base, impl="torch_compact", ms=0.6), dict(base, impl="torch_explicit_tgather", ms=0.45),
            dict(base, impl="torch_binned", ms=None, note="wrong"),
            dict(base, B=64, impl="warp_train", ms=0.3)])                       # no direct run: no row
    rows = hv.replay_ab_rows(path=p)
    assert len(rows) == 1
    r = rows[0]
    assert r["torch_impl"] == "torch_explicit_tgather" and r["torch_ms"] == 0.45 and r["bitwise"] is True
    assert abs(r["speedup"] - 1.5) < 1e-12 and abs(r["direct_over_replayed"] - 3.0) < 1e-12
    fig = hv.replay_ab_figure(path=p, batches=(16,))
    assert [t.name for t in fig.data] == ["replayed by the backend", "direct (FOVI_KNN_REPLAY=off)",
                                          "PyTorch's fastest, eager"]
    assert [float(t.y[0]) for t in fig.data] == [0.3, 0.9, 0.45] and "H200" in fig.layout.title.text
    assert "no recorded replay" in hv.replay_ab_figure(path=tmp_path / "none.jsonl.gz").layout.annotations[0].text


def test_the_repository_replay_ab_loads():
    rows = hv.replay_ab_rows()
    assert {r["B"] for r in rows} >= {16, 64, 128, 512} and all(r["bitwise"] for r in rows)
    assert len(hv.replay_ab_rows("forward")) > 0


def test_replay_ab_summary_counts_wins_per_batch():
    rows = hv.replay_ab_rows()
    for s in hv.replay_ab_summary():
        sub = [r for r in rows if r["B"] == s["B"]]
        assert s["layers"] == len(sub) and s["wins"] + len(s["losses"]) == len(sub)
        assert s["gain_min"] <= s["gain_max"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_replay_check_says_it_needs_a_gpu_on_the_cpu():
    line = hv.replay_check("res18_layer1", batch=2, device="cpu")
    assert line.startswith("res18_layer1 B=2: not run") and "CUDA device" in line
