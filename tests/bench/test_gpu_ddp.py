"""On two GPUs of one host (skipped with fewer): the autotune cache under data parallelism. Rank 0 tunes a layer on
its GPU, broadcasts the picks over NCCL, and both ranks keep the same ones (rank 0 alone writes the file), so the
ranks of one job run the same kernels. (The data-parallel training runs themselves are ``python -m fovi_lab bench
ddp``: scaling, the loss against one process, two runs bitwise equal.)"""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2
                                or not dist.is_available() or not dist.is_nccl_available(),
                                reason="needs two CUDA devices and NCCL")
WORLD = 2


def _tune_worker(rank, store, out, cache):
    import os
    os.environ["FOVI_TUNE_CACHE"] = cache
    from fovi_lab.bench.tune import tune
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.ops import tune_cache

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        entries = tune([(layer_meta("res18_layer1"), 16, "train-step")], f"cuda:{rank}", reps=3, log=None)
        torch.save({"entries": entries, "memory": dict(tune_cache.load())}, f"{out}.{rank}")
    finally:
        dist.barrier()
        dist.destroy_process_group()


def test_rank_zero_tunes_on_its_gpu_and_both_ranks_keep_its_picks(tmp_path):
    cache = tmp_path / "tune.json"
    out = tmp_path / "tuned"
    mp.spawn(_tune_worker, args=(str(tmp_path / "store"), str(out), str(cache)), nprocs=WORLD, join=True)
    r0, r1 = torch.load(f"{out}.0"), torch.load(f"{out}.1")
    assert len(r0["entries"]) == 1 and r0["entries"] == r1["entries"] == r0["memory"] == r1["memory"]
    import json
    assert json.loads(cache.read_text())["entries"] == r0["entries"]
