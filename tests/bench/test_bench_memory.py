"""Where a step's memory goes (:mod:`fovi_lab.bench.memory`), on made-up allocator events: the live set at the
peak, blocks allocated before the recording, the owner of a block by its stack; the CPU's record (a dispatch mode in
the allocator's place) on a few known allocations, and the network benchmark's records on the CPU (the CUDA memory
fields None, the CPU's record of the step's allocations given)."""

from __future__ import annotations

import pytest
import torch

from fovi_lab.bench import memory

MIB = 2**20


def _frame(path, name):
    return {"filename": path, "line": 1, "name": name}


KERNEL = [_frame("/x/site-packages/torch/_tensor.py", "new_empty"),
          _frame("/x/site-packages/fovi_lab/kernels/adjoint/fused.py", "plan_grad_weight_nm"),
          _frame("/x/site-packages/fovi_lab/knn_warp.py", "_backward_direct"),
          _frame("/x/site-packages/fovi/arch/knn_autograd.py", "backward"),
          _frame("/x/site-packages/fovi_lab/bench/network.py", "step")]
FOVI = [_frame("/x/site-packages/torch/nn/functional.py", "pad"),
        _frame("/x/site-packages/fovi/arch/knn.py", "forward"),
        _frame("/x/site-packages/fovi_lab/bench/network.py", "step")]
BN = [_frame("/x/site-packages/torch/nn/modules/batchnorm.py", "forward"),
      _frame("/x/site-packages/fovi_lab/bench/network.py", "step")]


def test_the_owner_is_the_innermost_frame_of_fovi_lab_fovi_or_a_torch_module():
    assert memory.owner(KERNEL) == "fovi_lab/kernels/adjoint/fused.py:plan_grad_weight_nm"
    assert memory.owner(FOVI) == "fovi/arch/knn.py:forward", "the benchmark's own frames own nothing"
    assert memory.owner(BN) == "torch/nn/modules/batchnorm.py:forward"
    assert memory.owner(BN[:1] + FOVI[1:]) == "torch/nn/modules/batchnorm.py:forward", "the innermost owner wins"
    assert memory.owner([_frame("/x/torch/nn/functional.py", "relu"), _frame("/x/fovi_lab/cli.py", "main")]) \
        == "other", "neither torch's functions nor the command line own a block"
    assert memory.owner([_frame("/home/me/train.py", "main")]) == "other"
    assert memory.owner([]) == "unknown"
    assert memory.owner([_frame("C:\\py\\Lib\\fovi\\arch\\knn_cuda.py", "run")]) == "fovi/arch/knn_cuda.py:run"


def _alloc(addr, mib, frames):
    return {"action": "alloc", "addr": addr, "size": int(mib * MIB), "frames": frames}


def _free(addr, mib):
    return {"action": "free_completed", "addr": addr, "size": int(mib * MIB), "frames": []}


def test_the_live_set_is_taken_at_the_peak_not_at_the_end():
    events = [_alloc(1, 10, BN), _alloc(2, 30, KERNEL), {"action": "segment_alloc", "addr": 9, "size": 999 * MIB},
              _free(2, 30), _alloc(3, 5, FOVI), _free(1, 10), _alloc(4, 20, FOVI)]
    peak, at, blocks = memory.live_at_peak(events)
    assert peak == 40 * MIB and at == 1 and sorted(blocks) == [1, 2]
    got = memory.at_peak({"device_traces": [events]})
    assert got["peak_mib"] == 40 and got["events"] == len(events) and got["before_mib"] == 0
    assert got["owners"] == [["fovi_lab/kernels/adjoint/fused.py:plan_grad_weight_nm", 30.0, 1],
                             ["torch/nn/modules/batchnorm.py:forward", 10.0, 1]]


def test_blocks_from_before_the_recording_count_under_before_and_their_frees_take_from_it():
    events = [_free(77, 6), _alloc(1, 4, FOVI), _alloc(2, 4, FOVI)]     # 77: allocated before the recording
    got = memory.at_peak({"device_traces": [events]}, before=int(10 * MIB))
    assert got["peak_mib"] == 12 and got["before_mib"] == 4
    assert got["owners"] == [["fovi/arch/knn.py:forward", 8.0, 2]]
    assert memory.at_peak({"device_traces": []})["peak_mib"] == 0, "a device with no events has no peak"


def test_owners_past_top_are_summed():
    events = [_alloc(i, i + 1, [_frame(f"/p/fovi/m{i}.py", "f")]) for i in range(6)]
    got = memory.at_peak({"device_traces": [events]}, top=3)
    assert [r[0] for r in got["owners"]] == ["fovi/m5.py:f", "fovi/m4.py:f", "fovi/m3.py:f", "other owners"]
    assert got["owners"][-1][1:] == [6.0, 3]


def _made_here():
    a = torch.ones(1000)                      # 4,000 bytes, alive to the end
    b = a * 2                                 # 4,000
    c = torch.empty(2000)                     # 8,000, freed before the end: the peak is 16,000 bytes
    del c
    return torch.nn.functional.relu(b.view(10, 100))      # a view is no allocation; relu's output is 4,000


def test_the_cpus_record_sees_each_new_storage_and_its_end():
    import weakref
    with memory.recorded(torch.device("cpu")) as got:
        kept = _made_here()
    events = got["snapshot"]["device_traces"][0]
    assert [e["action"] for e in events].count("alloc") == 4 and got["before"] == 0
    assert [e["size"] for e in events if e["action"] == "alloc"] == [4000, 4000, 8000, 4000]
    res = memory.at_peak(got["snapshot"])
    assert res["peak_mib"] * MIB == 16000
    assert res["owners"] == [["other", round(16000 / MIB, 3), 3]]
    assert events[-1]["action"] == "free_completed", "a storage freed inside the block ends there"
    assert all(f["filename"] != memory.__file__ for e in events for f in e["frames"])
    ref = weakref.ref(kept)
    del kept
    assert ref() is None


def test_the_network_records_carry_the_memory_fields_and_the_trace_note():
    pytest.importorskip("fovi", reason="fovi is not installed")
    from fovi_lab.bench.network import TRACE_NOTE, network_records, table_line
    recs = network_records("resnet18", 2, backends=("torch_compact",), modes=("eager",), steps=1, warmup=1,
                           device="cpu", in_res=32, memory_trace=True)
    (r,) = recs
    assert r["ms"] > 0 and r["note_run"] == TRACE_NOTE
    for key in ("peak_mib", "peak_run_mib", "reserved_run_mib", "resident_mib"):
        assert key in r and r[key] is None, f"{key}: CUDA memory only, None on the CPU"
    at = r["memory_at_peak"]                   # the CPU's record: what the operators allocated
    assert at["peak_mib"] > 0 and at["events"] > 0 and at["owners"]
    owners = [o for o, _, _ in at["owners"]]
    assert any(o.startswith("fovi/") for o in owners), owners
    assert not any(o.startswith(("fovi_lab/bench/", "fovi_lab/cli.py")) for o in owners), owners
    assert "at the peak" in table_line(r)
