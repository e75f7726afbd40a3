"""fovi_lab.lab.host_viz: the host cost of a forward call measured here, and the recorded H200 host probes."""

import json

from fovi_lab.lab import host_viz as hv


def test_host_cost_times_both_paths_on_a_node_major_shape():
    from fovi_lab.kernels import forward as F
    r = hv.host_cost("MAIN", batch=8, reps=5)          # the default pick: an mma kernel (x read in place)
    assert r["cold_us"] > 0 and r["warm_us"] > 0
    assert F.config_spec(r["config"]).family in F.MMA_FAMILIES and r["device"] == "cpu"


def _probe(path, fwd, step, replay):
    shape = {"fwd": {"host_issue_ms": fwd, "pipelined_ms": fwd}, "step": {"host_issue_ms": step, "pipelined_ms": step},
             "graph": {"replay_ms": replay, "matches_eager": True}}
    path.write_text(json.dumps(dict(device="NVIDIA H200", warp="1.19.0", torch="2.11.0", date="2026-11-29",
                                    results={"res18_layer1 B=16": shape, "only here B=1": shape})))


def test_probe_figure_reads_every_recorded_probe(tmp_path):
    _probe(tmp_path / "host_probe_before.json", 0.15, 0.6, 0.15)
    _probe(tmp_path / "host_probe_trimmed.json", 0.07, 0.4, 0.15)
    runs = hv.host_probe_runs(tmp_path)
    assert [r["label"] for r in runs] == ["before the host-path work", "every trim"]
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
