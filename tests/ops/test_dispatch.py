"""The auto backend reads the recorded benchmarks (the shipped records and a checkout's data/) and picks the fastest
registered backend."""

import json

import torch

from fovi_lab.ops import dispatch
from fovi_lab.ops.autograd import KNNConv, select_backend
from fovi_lab.graph.layers import layer_graph, layer_meta


def test_recorded_table_covers_the_h200_train_step_and_forward_runs():
    table = dispatch.recorded_table()
    modes = {m for (dev, m, shape, b) in table if dev == "NVIDIA H200"}
    assert {"forward", "train-step"} <= modes
    meta = layer_meta("alex_L1")
    shape = (meta.cin, meta.cout, meta.nin, meta.nout, meta.k, meta.p64, meta.v)
    assert {"warp_train", "torch_compact"} <= set(table[("NVIDIA H200", "train-step", shape, 512)])


def test_pick_follows_the_records(tmp_path, monkeypatch):
    meta = layer_meta("res18_layer1")
    shape = dict(cin=meta.cin, cout=meta.cout, nin=meta.nin, nout=meta.nout, k=meta.k, p64=meta.p64, v=meta.v)
    recs = [dict(shape, device="Fake GPU", mode="train-step", B=64, impl="warp_train", ms=1.0, date="2026-01-01"),
            dict(shape, device="Fake GPU", mode="train-step", B=64, impl="torch_compact", ms=2.0, date="2026-01-01"),
            dict(shape, device="Fake GPU", B=64, impl="warp_uncached", ms=3.0, date="2026-01-01"),
            dict(shape, device="Fake GPU", B=64, impl="torch_compact", ms=2.0, date="2026-01-01"),
            # a newer run of the same point wins
            dict(shape, device="Fake GPU", B=64, impl="torch_compact", ms=4.0, date="2026-02-01"),
            # ... unless it is a flagged variant (a config the backend does not run by default)
            dict(shape, device="Fake GPU", mode="train-step", B=64, impl="warp_train", ms=9.0, date="2026-03-01",
                 note_run="variant"),
            # a sweep (--op-all) times every config's op: only the chosen one is what warp_compact runs
            dict(shape, device="Fake GPU", B=64, impl="warp_uncached", config="slow", chosen=False, ms=99.0,
                 date="2026-01-01")]
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    table = dispatch.recorded_table(str(tmp_path))
    monkeypatch.setattr(dispatch, "recorded_table", lambda: table)
    monkeypatch.setattr(dispatch, "_device_name", lambda x: "Fake GPU")

    class FakeCuda(torch.Tensor):  # only .is_cuda / .dtype / .shape are read
        @property
        def is_cuda(self):
            return True

    x = torch.zeros(80, meta.cin, meta.nin, dtype=torch.float16).as_subclass(FakeCuda)
    assert dispatch.pick_backend(meta, x, training=True) == "warp_train"
    assert dispatch.pick_backend(meta, x, training=False) == "warp_compact"   # 3.0 < newest torch 4.0
    far = torch.zeros(512, meta.cin, meta.nin, dtype=torch.float16).as_subclass(FakeCuda)
    assert dispatch.pick_backend(meta, far, training=True) is None           # B=512 is 8x from B=64
    assert dispatch.pick_backend(layer_meta("alex_L1"), x[:, :1].expand(80, 96, 230), True) is None


def test_pick_includes_the_binned_torch_backend(tmp_path, monkeypatch):
    """torch_binned's own train-step records and its forward (recorded as torch_binned_mm) take part; the
    autograd-through-binned_forward record (not what the backend runs) does not."""
    meta = layer_meta("alex_L1")
    shape = dict(cin=meta.cin, cout=meta.cout, nin=meta.nin, nout=meta.nout, k=meta.k, p64=meta.p64, v=meta.v)
    d = dict(shape, device="Fake GPU", B=16, date="2026-01-01")
    recs = [dict(d, mode="train-step", impl="warp_train", ms=2.3), dict(d, mode="train-step", impl="torch_binned", ms=1.1),
            dict(d, mode="train-step", impl="torch_autograd_binned_mm", ms=0.5),
            dict(d, impl="warp_uncached", ms=0.30), dict(d, impl="torch_binned_mm", ms=0.25)]
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    table = dispatch.recorded_table(str(tmp_path))
    assert set(table[("Fake GPU", "train-step", tuple(shape.values()), 16)]) == {"warp_train", "torch_binned"}
    monkeypatch.setattr(dispatch, "recorded_table", lambda: table)
    monkeypatch.setattr(dispatch, "_device_name", lambda x: "Fake GPU")

    class FakeCuda(torch.Tensor):
        @property
        def is_cuda(self):
            return True

    x = torch.zeros(16, meta.cin, meta.nin, dtype=torch.float16).as_subclass(FakeCuda)
    assert dispatch.pick_backend(meta, x, training=True) == "torch_binned"
    assert dispatch.pick_backend(meta, x, training=False) == "torch_binned"


def test_auto_on_cpu_takes_the_cpu_choice():
    # on the CPU auto asks fovi_lab.ops.cpu_auto (measuring is off in the tests: the estimate's pick)
    from fovi_lab.ops import cpu_auto
    graph = layer_graph("res18_layer3")
    conv = KNNConv.from_graph(graph, 256, 256, backend="auto")
    conv(torch.randn(2, 256, graph.nin))
    assert conv.last_backend == cpu_auto.decide(conv.meta, 2, torch.float32, True).backend
    half = torch.randn(2, 256, graph.nin).half()
    assert select_backend("auto", conv.meta, half) == cpu_auto.decide(conv.meta, 2, torch.float16, True).backend


def test_records_of_a_variant_do_not_serve_the_real_layer():
    # most recorded stem runs used the rf2 frame (V = 196); the network's stem is rf1 (V = 49): the compact
    # kernels see the same shape, the binned backend four times less work, so rf2 records must not decide for
    # rf1. The rf1 stem has runs of its own only from B = 16 on, so at B = 1 nothing may cover it.
    table = dispatch.recorded_table()

    def covered(meta):
        shape = (meta.cin, meta.cout, meta.nin, meta.nout, meta.k, meta.p64, meta.v)
        return {(mode, b) for (dev, mode, shp, b) in table if dev == "NVIDIA H200" and shp == shape}

    rf2, rf1 = covered(layer_meta("res18_stem_rf2")), covered(layer_meta("res18_stem"))
    assert ("forward", 1) in rf2 and ("forward", 1) not in rf1
    assert rf1 and min(b for _, b in rf1) >= 16


def test_a_device_without_records_reads_those_of_its_architecture():
    """A device with records reads its own (the H200, the H100 SXM); an H100 PCIe (sm_90, none of its own) reads
    those of an sm_90 device, and says which; an A100 (sm_80) reads none."""
    meta = layer_meta("res18_layer1")
    shape = (meta.cin, meta.cout, meta.nin, meta.nout, meta.k, meta.p64, meta.v)
    table = dispatch.recorded_table()
    cands = ("warp_train", "torch_compact", "torch_binned")
    h200 = dispatch.lookup_records(table, "NVIDIA H200", 90, "train-step", shape, 64, cands)
    assert h200[0] is not None and h200[1] == "NVIDIA H200"
    h100 = dispatch.lookup_records(table, "NVIDIA H100 80GB HBM3", 90, "train-step", shape, 64, cands)
    assert h100[0] is not None and h100[1] == "NVIDIA H100 80GB HBM3"
    pcie = dispatch.lookup_records(table, "NVIDIA H100 PCIe", 90, "train-step", shape, 64, cands)
    assert pcie in (h100, h200)
    assert dispatch.lookup_records(table, "NVIDIA A100-SXM4-80GB", 80, "train-step", shape, 64, cands) == (None, None)
    assert dispatch.arch_of_name("NVIDIA H100 PCIe") == 90 and dispatch.arch_of_name("Fake GPU") is None
