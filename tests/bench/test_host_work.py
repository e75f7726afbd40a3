"""The host work of an eager call (fovi_lab.bench.host): the counters count what they claim, and the launches and
PyTorch operations of warp_train's forward, backward and step are pinned per adjoint path on Warp's CPU device (a
count, not a time: an extra copy, zero-fill, allocation or launch on a path fails here)."""

import pytest
import torch

from fovi_lab.bench.host import OpCounter, dry_launches, host_work, main as host_main


def test_op_counter_counts_kernels_allocations_and_syncs():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with OpCounter() as ops:
        c = a + b                 # a kernel, new memory
        c.view(16)                # a view: nothing
        c.add_(1)                 # a kernel in place: no new memory
        torch.empty(3)            # new memory, no kernel
        c.sum().item()            # a kernel and new memory (sum), then a sync (item)
    assert (ops.ops, ops.allocations, ops.syncs) == (3, 3, 1), (ops.names, ops.allocations, ops.syncs)
    assert ops.names == {"add": 1, "add_": 1, "sum": 1}


def test_dry_launches_counts_and_skips_then_restores_warp():
    import warp as wp
    wp.init()

    @wp.kernel(enable_backward=False)
    def fill_one(a: wp.array(dtype=wp.float32)):
        a[wp.tid()] = 1.0

    arr = wp.zeros(8, dtype=wp.float32, device="cpu")
    cmd = wp.launch(fill_one, dim=8, inputs=[arr], device="cpu", record_cmd=True)   # recorded, not run
    real = (wp.launch, wp.launch_tiled, wp.Launch.launch)
    with dry_launches() as n:
        wp.launch(fill_one, dim=8, inputs=[arr], device="cpu")
        cmd.launch()
        assert wp.launch(fill_one, dim=8, inputs=[arr], device="cpu", record_cmd=True) is not None
    assert n.count == 2 and arr.numpy().sum() == 0.0
    assert (wp.launch, wp.launch_tiled, wp.Launch.launch) == real
    cmd.launch()
    assert arr.numpy().sum() == 8.0


# (layer, batch, adjoint path on the CPU): forward launches, backward launches, backward's PyTorch operations.
# The backward's operations on the CPU: the casts of dx and dW to the fp16 operands' dtype (_to_copy: the adjoints
# accumulate in fp32), and the operand layouts, which a GPU copies with Warp's tiled transpose (launches there)
# and Warp's CPU device with PyTorch (copy_, clone, and the zero pad rows of the staged path).
PINNED = [
    ("res18_layer3_0", 16, "fused", 2, 4, {"_to_copy": 2, "copy_": 2}),
    ("res18_layer3", 64, "mma", 3, 8, {"_to_copy": 2, "clone": 4}),
    ("res18_stem", 8, "staged", 1, 5, {"_to_copy": 2, "clone": 1, "copy_": 4, "new_zeros": 1, "zero_": 2}),
    # the stems' dW on the tensor cores (one chunk of 16 rows; three of 14, the last padded, summed in order), dx staged
    ("res18_stem", 16, ("staged", "mma"), 1, 6, {"_to_copy": 2, "clone": 3, "copy_": 2, "zero_": 1}),
    ("res18_stem", 40, ("staged", "mma"), 2, 13, {"_to_copy": 2, "add_": 2, "clone": 1, "copy_": 5, "new_zeros": 2}),
]


@pytest.mark.parametrize("layer,batch,path,fwd_launches,bwd_launches,bwd_ops", PINNED,
                         ids=[f"{p[0]}-{p[1]}-{'-'.join(p[2]) if isinstance(p[2], tuple) else p[2]}" for p in PINNED])
def test_eager_calls_launch_what_is_pinned(layer, batch, path, fwd_launches, bwd_launches, bwd_ops):
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.knn_warp import grad_paths

    assert grad_paths(layer_meta(layer), batch) == (path if isinstance(path, tuple) else (path, path))
    recs = {r["path"]: r for r in host_work(layer, batch, "warp_train", "cpu", reps=1)}
    fwd, bwd, step = recs["forward"], recs["backward"], recs["step"]
    assert (fwd["warp_launches"], fwd["torch_ops"], fwd["syncs"]) == (fwd_launches, 0, 0), fwd
    assert (bwd["warp_launches"], bwd["torch_op_names"], bwd["syncs"]) == (bwd_launches, bwd_ops, 0), bwd
    # a step is its forward and its backward, nothing more
    assert step["warp_launches"] == fwd_launches + bwd_launches and step["torch_op_names"] == bwd_ops
    assert step["allocations"] == fwd["allocations"] + bwd["allocations"]
    assert all(r["backend_used"] == "warp_train" and r["wall_us"] > 0 for r in recs.values())


def test_the_command_prints_a_row_per_path_and_refuses_bad_input_in_one_line(capsys, tmp_path):
    out = tmp_path / "host.jsonl"
    assert host_main(["--layers", "res18_layer3_0", "--batches", "3", "--backends", "warp_train", "--reps", "1",
                      "--device", "cpu", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert sum(" warp_train " in line for line in printed.splitlines()) == 3
    assert sum(" floor " in line for line in printed.splitlines()) == 3
    import json
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["backend"], r["path"]) for r in recs] == [(b, p) for b in ("warp_train", "floor")
                                                         for p in ("forward", "backward", "step")]
    floor = {r["path"]: r for r in recs if r["backend"] == "floor"}
    # the floor: no kernel, no PyTorch kernel, one allocation per returned tensor (y; dx and dW)
    assert [(floor[p]["warp_launches"], floor[p]["torch_ops"], floor[p]["allocations"]) for p in
            ("forward", "backward", "step")] == [(0, 0, 1), (0, 0, 2), (0, 0, 3)]
    out.unlink()
    assert host_main(["--layers", "res18_layer3_0", "--batches", "3", "--backends", "warp_train", "--reps", "1",
                      "--paths", "forward", "--no-floor", "--device", "cpu", "--out", str(out)]) == 0
    assert [json.loads(line)["backend"] for line in out.read_text().splitlines()] == ["warp_train"]
    capsys.readouterr()
    assert all(r["kind"] == "host" and "commit" in r
               and r["command"].startswith("python -m fovi_lab bench host --layers res18_layer3_0") for r in recs)
    with pytest.raises(SystemExit) as exc:
        host_main(["--backends", "warp_compact"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--backends" in err[0] and "forward-only" in err[0]


def test_dry_launches_counts_and_times_graph_replays(monkeypatch):
    """A replayed call's graph runs inside dry_launches and is counted and timed (on a GPU the Warp backends replay
    small calls from CUDA graphs); the replay method is restored afterwards."""
    import time as _time
    from fovi_lab.bench.host import dry_launches

    class FakeGraph:
        def replay(self):
            _time.sleep(0.002)
            return "ran"

    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    original = FakeGraph.replay
    with dry_launches() as counter:
        assert FakeGraph().replay() == "ran" and FakeGraph().replay() == "ran"
    assert counter.replays == 2 and counter.replay_s >= 0.004
    assert FakeGraph.replay is original


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("precision", ["fp16", "amp"])
def test_a_replayed_step_issues_its_copies_and_its_results_only(monkeypatch, precision, bias):
    """warp_train's eager step once replayed (CUDA graphs emulated on the CPU, fovi_lab.ops.replay.EMULATE_ON_CPU):
    the forward copies x and the weight (and the bias) into its graph's inputs and returns y; the backward copies
    grad_y alone (it reads the forward's copies of x and the weight) and returns dx and dW (and db). The casts of
    mixed precision, the bias gradient and every kernel are inside the two graphs, so a step's host operations are
    its copies and its results, and it allocates only what it returns."""
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.ops import replay
    from fovi_lab.ops.autograd import KNNConv
    monkeypatch.setattr(replay, "EMULATE_ON_CPU", True)
    monkeypatch.setenv("FOVI_KNN_REPLAY", "on")
    replay.clear()
    meta = layer_meta("res18_layer3_0")
    dtype = torch.float16 if precision == "fp16" else torch.float32
    conv = KNNConv(meta.idx, meta.rf_index, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout,
                   backend="warp_train", bias=bias).to(dtype=dtype)
    x = torch.randn(4, meta.cin, meta.nin).to(dtype).requires_grad_()
    g = torch.randn(4, meta.cout, meta.nout).half()
    amp = torch.autocast("cpu", dtype=torch.float16, enabled=precision == "amp")

    def step():
        with amp:
            y = conv(x)
        y.backward(g)
        x.grad = None
        for p in conv.parameters():
            p.grad = None
    for _ in range(3):                   # direct, capture, replay
        step()
    with OpCounter() as ops:
        step()
    n = 3 + bias
    assert (ops.names, ops.allocations, ops.syncs) == ({"copy_": n, "clone": n}, n, 0), (ops.names, ops.allocations)


def test_host_work_of_replayed_calls_on_the_cpu():
    """``bench host --emulate-replay``: the same calls replayed from emulated graphs, as a GPU replays them; each
    replay is counted and not run, so a step shows two graph replays, no Warp launch, and its copies and results
    as its only PyTorch operations (x and the weight in, y out; grad_y in, dx and dW out)."""
    recs = {r["path"]: r for r in host_work("res18_layer3_0", 3, "warp_train", "cpu", reps=1, emulate_replay=True)}
    step = recs["step"]
    assert all(r["replay"] == "emulated" for r in recs.values())
    assert (step["warp_launches"], step["graph_replays"]) == (0, 2), step
    assert step["torch_op_names"] == {"copy_": 3, "clone": 3} and step["allocations"] == 3, step
    assert (recs["forward"]["graph_replays"], recs["forward"]["torch_op_names"]) == (1, {"copy_": 2, "clone": 1})
    with pytest.raises(ValueError, match="emulate_replay: the graphs are emulated on a CPU only"):
        host_work("res18_layer3_0", 3, "warp_train", "cuda", reps=1, emulate_replay=True)


def test_through_fovis_layer_a_step_adds_fovis_casts_of_the_fp32_gradients(capsys, tmp_path):
    """``--fovi``: the same calls through fovi's own layer. Ours inside fovi (its registry and autograd Function, the
    route inside fovi's networks) replays the same two graphs and copies, and fovi adds its casts of the fp32
    gradients the registry's contract returns (here both: an fp16 layer); a backend fovi refuses here is a row saying
    why."""
    pytest.importorskip("fovi", reason="fovi is not installed")
    from fovi_lab.bench.host import host_work

    ours, = host_work("res18_layer3_0", 3, "warp_train", "cpu", reps=1, paths=("step",), emulate_replay=True)
    inside, = host_work("res18_layer3_0", 3, "fovi:fovi_lab", "cpu", reps=1, paths=("step",), emulate_replay=True)
    assert (inside["graph_replays"], inside["warp_launches"]) == (ours["graph_replays"], ours["warp_launches"]) == (2, 0)
    extra = {n: c - ours["torch_op_names"].get(n, 0) for n, c in inside["torch_op_names"].items()}
    assert {n: c for n, c in extra.items() if c} == {"_to_copy": 2}
    out = tmp_path / "host.jsonl"
    assert host_main(["--layers", "res18_layer3_0", "--batches", "3", "--backends", "warp_train", "--fovi", "cuda",
                      "--paths", "step", "--reps", "1", "--no-floor", "--device", "cpu", "--out", str(out)]) == 0
    import json
    cuda = [json.loads(line) for line in out.read_text().splitlines()][-1]
    assert cuda["backend"] == "fovi:cuda" and "CUDA" in cuda["note"] and "wall_us" not in cuda
    assert "not run: RuntimeError" in capsys.readouterr().out


def test_backends_take_turns_and_keep_their_own_counts():
    """Several backends of one layer and batch are timed call by call in turn (``interleaved``), each with the counts
    it has alone; a backend that fails is left out into ``refusals`` where that is given, and raises otherwise."""
    from fovi_lab.bench.host import FLOOR, host_work

    alone = {r["path"]: r for r in host_work("res18_layer3_0", 3, "warp_train", "cpu", reps=1, emulate_replay=True)}
    refused = {}
    rows = host_work("res18_layer3_0", 3, ["warp_train", FLOOR, "fovi:no_such_backend"], "cpu", reps=2,
                     emulate_replay=True, refusals=refused)
    assert [(r["backend"], r["path"]) for r in rows] == [(b, p) for b in ("warp_train", FLOOR)
                                                         for p in ("forward", "backward", "step")]
    assert all(r["interleaved"] == 2 and r["reps"] == 2 for r in rows) and alone["step"]["interleaved"] == 1
    for r in rows[:3]:
        a = alone[r["path"]]
        assert (r["warp_launches"], r["graph_replays"], r["torch_op_names"], r["allocations"]) == (
            a["warp_launches"], a["graph_replays"], a["torch_op_names"], a["allocations"])
    assert list(refused) == ["fovi:no_such_backend"]
    refused = {}
    assert host_work("res18_layer3_0", 3, ["fovi:no_such_backend"], "cpu", reps=1, refusals=refused) == []
    assert list(refused) == ["fovi:no_such_backend"]
    with pytest.raises((ValueError, ImportError), match="backend|fovi"):
        host_work("res18_layer3_0", 3, ["warp_train", "fovi:no_such_backend"], "cpu", reps=1, paths=("forward",))


def test_a_graph_captured_in_a_dry_run_is_dropped():
    """Inside dry_launches Warp's launches are counted, not run, so a graph captured there would hold none of them:
    on the way out every cached graph is dropped, and the next call runs and captures afresh."""
    from fovi_lab.ops import replay
    replay.clear()
    t = torch.ones(3)
    with replay.emulated_on_cpu():
        replay.replayed("dry-run-test", None, lambda a: a + 1, t)        # direct: the signature's first call
        with dry_launches():
            replay.replayed("dry-run-test", None, lambda a: a + 1, t)    # captured here
            assert replay.stats()["cached"] == 1
        assert replay.stats()["cached"] == 0
        assert torch.equal(replay.replayed("dry-run-test", None, lambda a: a + 1, t), t + 1)
