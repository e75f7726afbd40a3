"""Data-parallel training on the CPU: two gloo processes under DistributedDataParallel.

The all-reduced gradient of two processes, each on its half of a batch, equals (to fp32 rounding) the
one-process gradient of the whole batch, with ``warp_train`` (Warp's CPU device) and ``torch_compact``; and
two data-parallel runs of ``train_digits`` with ``warp_train`` end bit for bit equal.
"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from fovi_lab.train import FoveatedDigitsNet, load_digits_tensors, train_digits

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")
WORLD = 2
BATCH = 16


def _batch():
    xtr, ytr, _, _ = load_digits_tensors(seed=0)
    i = torch.randint(0, len(ytr), (BATCH,), generator=torch.Generator().manual_seed(3))
    return xtr[i], ytr[i]


def _grads(backend, images, labels, ddp):
    torch.manual_seed(0)
    model = FoveatedDigitsNet(backend=backend, norm="group")
    net = torch.nn.parallel.DistributedDataParallel(model) if ddp else model
    F.cross_entropy(net(images), labels).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def _worker(rank, store, out, backend):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        images, labels = _batch()
        half = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
        grads = _grads(backend, images[half], labels[half], ddp=True)
        runs, params = [], []
        for _ in range(2 if backend == "warp_train" else 0):
            torch.manual_seed(1)
            model = FoveatedDigitsNet(backend=backend, norm="group")
            runs.append(train_digits(backend, steps=3, batch=BATCH, log_every=1, device="cpu", model=model))
            params.append([p.detach().clone() for p in model.parameters()])
        if rank == 0:
            torch.save({"grads": grads, "loss": [r.loss for r in runs], "world": [r.world_size for r in runs],
                        "params": params}, out)
    finally:
        dist.barrier()          # no rank tears gloo down while another still talks
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["warp_train", "torch_compact"])
def test_two_gloo_processes_match_one_process(backend, tmp_path):
    if backend == "warp_train":
        pytest.importorskip("warp")
    out = tmp_path / "rank0.pt"
    mp.spawn(_worker, args=(str(tmp_path / "store"), str(out), backend), nprocs=WORLD, join=True)
    got = torch.load(out)
    images, labels = _batch()
    want = _grads(backend, images, labels, ddp=False)
    assert got["grads"].keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got["grads"][name], want[name], rtol=1e-4, atol=1e-5, msg=name)
    if backend == "warp_train":
        assert got["world"] == [WORLD, WORLD]
        assert got["loss"][0] == got["loss"][1] and all(v == v for v in got["loss"][0])
        assert all(torch.equal(a, b) for a, b in zip(*got["params"]))


def test_the_global_batch_must_split_evenly(monkeypatch):
    import fovi_lab.train as tr
    monkeypatch.setattr(tr, "_world", lambda: (0, 3))
    with pytest.raises(ValueError, match="batch: the global batch"):
        train_digits("torch_compact", steps=1, batch=16, device="cpu")


def _tune_worker(rank, store, out):
    from fovi_lab.bench.tune import tune
    from fovi_lab.graph.layers import synthetic_meta
    from fovi_lab.ops import tune_cache
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        entries = tune([(synthetic_meta("ODD"), 4, "train-step")], "cpu", reps=1, log=None)
        torch.save({"entries": entries, "memory": dict(tune_cache.load())}, f"{out}.{rank}")
    finally:
        dist.barrier()          # no rank tears gloo down while another still talks
        dist.destroy_process_group()


def test_rank_zero_tunes_and_every_rank_keeps_its_picks(tmp_path, monkeypatch):
    """Under DDP rank 0 tunes, broadcasts, and alone writes the file: the ranks run the same kernels."""
    pytest.importorskip("warp")
    cache = tmp_path / "tune.json"
    monkeypatch.setenv("FOVI_TUNE_CACHE", str(cache))
    out = tmp_path / "tuned"
    mp.spawn(_tune_worker, args=(str(tmp_path / "store"), str(out)), nprocs=WORLD, join=True)
    r0, r1 = torch.load(f"{out}.0"), torch.load(f"{out}.1")
    assert len(r0["entries"]) == 1 and r0["entries"] == r1["entries"] == r0["memory"] == r1["memory"]
    import json
    assert json.loads(cache.read_text())["entries"] == r0["entries"]
