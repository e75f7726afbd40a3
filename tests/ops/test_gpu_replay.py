"""Replayed calls on a CUDA device (skipped without one): a replayed ``warp_compact`` / ``warp_train`` call returns
bitwise what the direct call returns, on every real layer, after an in-place weight update too; a switch of the
environment captures anew; calls inside a user's own capture and over the size rule run directly, and such a capture
drops the layer's per-call graphs (:mod:`fovi_lab.ops.replay`)."""

from __future__ import annotations

import pytest
import torch

from fovi_lab.graph.layers import LAYERS, layer_meta
from fovi_lab.ops import replay

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(autouse=True)
def _fresh_cache():
    """Each test starts from an empty cache and leaves none: a test's own capture makes its layers owned by an outer
    capture (their calls direct from then on), which the next test of the same layer must not inherit."""
    replay.clear()
    yield
    replay.clear()


def _operands(meta, b, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, meta.cin, meta.nin, generator=gen).cuda().half()
    w = (torch.randn(meta.cout, meta.q, generator=gen) / (meta.cin * meta.k) ** 0.5).cuda().half()
    bias = torch.randn(meta.cout, generator=gen).cuda().half()
    g = torch.randn(b, meta.cout, meta.nout, generator=gen).cuda().half()
    return x, w, bias, g


def _direct(fn, monkeypatch):
    with monkeypatch.context() as m:
        m.setenv("FOVI_KNN_REPLAY", "off")
        return fn()


@pytest.mark.parametrize("b", (16, 64))
@pytest.mark.parametrize("layer", list(LAYERS))
def test_replayed_step_bitwise_direct(layer, b, monkeypatch):
    from fovi_lab.knn_warp import WarpTrainOps
    monkeypatch.setenv("FOVI_KNN_REPLAY", "auto")
    meta = layer_meta(layer, device="cuda")
    x, w, bias, g = _operands(meta, b)
    step = lambda: (WarpTrainOps.forward(meta, x, w, bias),) + tuple(WarpTrainOps.backward_combined(meta, g, x, w))  # noqa: E731
    want = _direct(step, monkeypatch)
    before = replay.stats()
    # the forward: direct, captured, replayed twice; each adjoint call: direct (no replayed forward yet), direct again
    # as a call after the forward's copies (a signature of its own), captured, replayed: 3 + at least 2 replays
    got = [step() for _ in range(4)]
    after = replay.stats()
    assert after["replayed"] - before["replayed"] >= 5, (before, after)
    for run in got:
        for a, e, what in zip(run, want, ("y", "dx", "dW")):
            assert torch.equal(a, e), f"{layer} B={b}: replayed {what} differs from the direct call's"
    with torch.no_grad():                                # an optimiser's in-place update between steps
        w.mul_(0.5).add_(0.01)
        x.mul_(-1.0)
    want = _direct(step, monkeypatch)
    got = step()
    for a, e, what in zip(got, want, ("y", "dx", "dW")):
        assert torch.equal(a, e), f"{layer} B={b}: replayed {what} after an in-place update differs"
    assert got[1].data_ptr() != step()[1].data_ptr(), "replayed outputs must be new tensors"


def test_switch_captures_anew_and_user_capture_runs_direct(monkeypatch):
    from fovi_lab.knn_warp import WarpTrainOps
    from fovi_lab.ops.graphs import capture
    meta = layer_meta("res18_layer2", device="cuda")
    x, w, _, g = _operands(meta, 8, seed=1)
    monkeypatch.setenv("FOVI_KNN_REPLAY", "auto")
    for _ in range(3):
        WarpTrainOps.backward_combined(meta, g, x, w)
    n = replay.stats()["captured"]
    monkeypatch.setenv("FOVI_KNN_DW_PATH", "off")
    for _ in range(3):
        WarpTrainOps.backward_combined(meta, g, x, w)
    assert replay.stats()["captured"] == n + 1, "a changed FOVI_* switch must capture a new graph"
    monkeypatch.delenv("FOVI_KNN_DW_PATH")
    want = _direct(lambda: WarpTrainOps.backward_combined(meta, g, x, w), monkeypatch)
    cap = capture(lambda: WarpTrainOps.backward_combined(meta, g, x, w))   # the user's own graph: direct inside
    got = cap.replay()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_an_outer_capture_drops_the_layers_graphs_and_frees_their_copies(monkeypatch):
    """Eager steps cache the layer's per-call graphs; a capture of the whole step (torch's own CUDA graph, warmed up on
    a side stream as torch's docs do) drops them inside the capture, their static copies freed (resident bytes 0),
    and replays bitwise the direct step; eager steps after it run directly (none replayed, none cached) with the
    same results, and the dropped graphs are destroyed by the first of them."""
    from fovi_lab.knn_warp import WarpTrainOps
    monkeypatch.setenv("FOVI_KNN_REPLAY", "auto")
    meta = layer_meta("res18_layer1", device="cuda")
    x, w, bias, g = _operands(meta, 16, seed=3)
    assert meta.to(x.device) is meta, "a meta made for 'cuda' is the current device's: no second copy"
    step = lambda: (WarpTrainOps.forward(meta, x, w, bias),) + tuple(WarpTrainOps.backward_combined(meta, g, x, w))  # noqa: E731
    want = _direct(step, monkeypatch)
    for _ in range(4):
        step()
    torch.cuda.synchronize()
    assert replay.resident_bytes() > 0 and not replay.owned_by_outer_capture(meta)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    assert replay.owned_by_outer_capture(meta) and replay.resident_bytes() == 0
    graph.replay()
    torch.cuda.synchronize()
    for a, e, what in zip(out, want, ("y", "dx", "dW")):
        assert torch.equal(a, e), f"the whole-step graph's {what} differs from the direct call's"
    n = replay.stats()["replayed"]
    got = step()
    assert replay.stats()["replayed"] == n and replay.stats()["cached"] == 0 and not replay._retired
    for a, e, what in zip(got, want, ("y", "dx", "dW")):
        assert torch.equal(a, e), f"an eager {what} after the capture differs from the direct call's"


def test_size_rule_and_off(monkeypatch):
    from fovi_lab.knn_warp import WarpCompactOps
    meta = layer_meta("res18_layer3", device="cuda")
    monkeypatch.setenv("FOVI_KNN_REPLAY", "auto")
    x, w, _, _ = _operands(meta, 65, seed=2)
    monkeypatch.setattr(replay, "MAX_BYTES", 1 << 10)
    before = replay.stats()
    for _ in range(3):
        WarpCompactOps.forward(meta, x, w, None)
    assert replay.stats()["replayed"] == before["replayed"], "a call over MAX_BYTES must run directly"
    assert replay.stats()["refused"] == before["refused"] + 1
    monkeypatch.setenv("FOVI_KNN_REPLAY", "on")
    for _ in range(3):
        y = WarpCompactOps.forward(meta, x, w, None)
    assert replay.stats()["replayed"] == before["replayed"] + 2
    monkeypatch.setenv("FOVI_KNN_REPLAY", "off")
    assert torch.equal(y, WarpCompactOps.forward(meta, x, w, None))
    assert replay.resident_bytes() > 0
    replay.clear()
    assert replay.resident_bytes() == 0 and replay.stats()["cached"] == 0


def test_memory_budget_stops_new_captures(monkeypatch):
    from fovi_lab.knn_warp import WarpCompactOps
    meta = layer_meta("res18_layer2", device="cuda")
    monkeypatch.setenv("FOVI_KNN_REPLAY", "auto")
    x, w, _, _ = _operands(meta, 24, seed=4)
    monkeypatch.setattr(replay, "MAX_RESIDENT_BYTES", 0)
    before = replay.stats()
    ys = [WarpCompactOps.forward(meta, x, w, None) for _ in range(3)]
    after = replay.stats()
    assert after["captured"] == before["captured"] and after["refused"] == before["refused"] + 1, (before, after)
    assert all(torch.equal(y, ys[0]) for y in ys)


@pytest.mark.parametrize("amp", (False, True), ids=("fp16", "amp"))
@pytest.mark.parametrize("layer", ("res18_layer1", "alex_L1", "res18_stem"))
def test_knnconv_step_replays_in_two_graphs_bitwise(layer, amp, monkeypatch):
    """KNNConv's eager step through ``step_forward`` / ``step_backward``: replayed (the backward from a graph that reads
    the forward's copies of x and the weight), every step's y, dx, dW and db equal the direct step's bit for bit, under
    fp16 and under autocast with fp32 master weights; a step of two forwards before the backwards (the first's copies
    overwritten) too; and a step issues only its copies in and its results out (4 + 4 host operations)."""
    from fovi_lab.bench.host import OpCounter
    from fovi_lab.ops.autograd import KNNConv
    monkeypatch.setenv("FOVI_KNN_REPLAY", "on")
    replay.clear()
    meta = layer_meta(layer)
    torch.manual_seed(0)
    conv = KNNConv(meta.idx, meta.rf_index, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout,
                   backend="warp_train", bias=True).cuda()
    if not amp:
        conv = conv.half()
    dtype = torch.float32 if amp else torch.float16
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(16, meta.cin, meta.nin, generator=gen).cuda().to(dtype) for _ in range(2)]
    g = torch.randn(16, meta.cout, meta.nout, generator=gen).cuda().half()
    ctx = lambda: torch.autocast("cuda", dtype=torch.float16, enabled=amp)  # noqa: E731

    def step(two=False):
        ins = [x.clone().requires_grad_() for x in (xs if two else xs[:1])]
        with ctx():
            ys = [conv(x) for x in ins]
        sum((i + 1) * (y.float() * g.float()).sum() for i, y in enumerate(ys)).backward()
        out = [y.detach() for y in ys] + [x.grad for x in ins] + [conv.weight.grad, conv.bias.grad]
        conv.weight.grad = conv.bias.grad = None
        return out
    for two in (False, True):
        want = _direct(lambda: step(two), monkeypatch)
        for _ in range(4):
            got = step(two)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), (layer, amp, two)
    x = xs[0].clone().requires_grad_()
    with ctx():
        y = conv(x)
    y.backward(g)                            # this signature was replayed above: count one more of it
    x.grad = conv.weight.grad = conv.bias.grad = None
    with OpCounter() as ops:
        with ctx():
            y = conv(x)
        y.backward(g)
    assert ops.names == {"copy_": 4, "clone": 4}, ops.names       # x, weight, bias, grad_y in; y, dx, dW, db out


def test_a_backward_on_another_stream_copies_its_own_operands(monkeypatch):
    """The forward replayed on one stream, its adjoints called on another (the forward's copies are ordered on the
    first): they do not read the forward's copies but copy their own, and dx and dW equal the direct calls'."""
    from fovi_lab.knn_warp import WarpTrainOps
    monkeypatch.setenv("FOVI_KNN_REPLAY", "on")
    replay.clear()
    meta = layer_meta("res18_layer1", device="cuda")
    x, w, _, g = _operands(meta, 16)
    want = _direct(lambda: WarpTrainOps.backward_combined(meta, g, x, w), monkeypatch)
    other = torch.cuda.Stream()
    for _ in range(4):
        WarpTrainOps.forward(meta, x, w, None)
        other.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(other):
            got = WarpTrainOps.backward_combined(meta, g, x, w)
        torch.cuda.current_stream().wait_stream(other)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert not any(isinstance(k[0], tuple) for k in replay._entries), "no signature may read across streams"


@pytest.mark.parametrize("layer", ["res18_layer1", "alex_L1", "res18_stem", "dinov3_patch"])
def test_in_place_step_bitwise_direct(layer, monkeypatch):
    """``FOVI_KNN_REPLAY=in-place``: an eager train step through KNNConv, six steps on fresh tensors of one shape (the
    caching allocator hands their memory out again, as in a training loop), each bitwise the direct step; the
    in-place graphs are replayed once the addresses come back, and what a signature meets past MAX_IN_PLACE copies."""
    from fovi_lab.ops.autograd import KNNConv
    meta = layer_meta(layer, device="cuda")
    torch.manual_seed(0)
    conv = KNNConv(meta.idx, meta.rf_index, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout,
                   backend="warp_train", bias=True).cuda().half()

    def step(seed):
        x0, _, _, g = _operands(meta, 16, seed=seed)
        x = x0.clone().requires_grad_()
        y = conv(x)
        y.backward(g)
        out = [y.detach(), x.grad] + [p.grad.clone() for p in conv.parameters()]
        for p in conv.parameters():
            p.grad = None
        return out
    want = [_direct(lambda: step(s), monkeypatch) for s in range(6)]
    monkeypatch.setenv("FOVI_KNN_REPLAY", "in-place")
    replay.clear()
    before = replay.stats()
    for s in range(6):
        got = step(s)
        for a, e, what in zip(got, want[s], ("y", "dx", "dW", "db")):
            assert torch.equal(a, e), f"{layer}: in-place step {s}: {what} differs from the direct call's"
    after = replay.stats()
    got = {k: after[k] - before[k] for k in after if k != "cached"}
    print(layer, got)
    # both signatures captured in place, and the addresses came back: more in-place replays than captures
    assert got["captured_in_place"] >= 2 and got["replayed_in_place"] > got["captured_in_place"], got
