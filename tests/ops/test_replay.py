"""The replay layer's rules on the CPU (:mod:`fovi_lab.ops.replay`; the replays themselves need CUDA graphs and are
checked by ``tests/ops/test_gpu_replay.py``): CPU calls run directly, the switch is validated, the signature sees the
replay mode and the kernel-affecting ``FOVI_*`` variables (which those are: ``tests/test_settings.py``), and only
layouts that a strided copy reproduces are replayed."""

from __future__ import annotations

import math

import pytest
import torch

from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.ops import replay


def test_cpu_calls_run_directly_and_match_the_reference(monkeypatch):
    from fovi_lab.knn_warp import WarpTrainOps
    from fovi_lab.ops.reference import oracle_forward
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES["ODD"]
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=3)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(3, cin, nin, generator=gen).half()
    w = (torch.randn(cout, cin * v, generator=gen) / math.sqrt(cin * k)).half()
    monkeypatch.setenv("FOVI_KNN_REPLAY", "on")
    before = replay.stats()
    ys = [WarpTrainOps.forward(meta, x, w, None) for _ in range(3)]
    assert replay.stats() == before, "CPU calls must not touch the replay cache"
    ref = oracle_forward(x.float(), w.float(), None, idx, rf, v)
    for y in ys:
        assert float((y.float() - ref).abs().max()) <= 2e-2 * max(1.0, float(ref.abs().max()))


def test_mode_is_validated(monkeypatch):
    monkeypatch.setenv("FOVI_KNN_REPLAY", "sometimes")
    with pytest.raises(ValueError, match="FOVI_KNN_REPLAY"):
        replay.replay_mode()
    for mode in ("auto", "on", "off", "ON"):
        monkeypatch.setenv("FOVI_KNN_REPLAY", mode)
        assert replay.replay_mode() == mode.lower()
    monkeypatch.delenv("FOVI_KNN_REPLAY")
    assert replay.replay_mode() == "auto"


def test_signature_sees_the_switches_and_the_mode(monkeypatch):
    monkeypatch.delenv("FOVI_KNN_DX_PATH", raising=False)
    meta = object()
    base = replay._signature("forward", meta, 0, 7, (), "auto")
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "off")
    assert replay._signature("forward", meta, 0, 7, (), "auto") != base
    monkeypatch.setenv("FOVI_KNN_DX_PATH", "mma")
    assert replay._signature("forward", meta, 0, 7, (), "auto") != base
    monkeypatch.delenv("FOVI_KNN_DX_PATH")
    assert replay._signature("forward", meta, 0, 7, (), "auto") == base
    assert replay._signature("forward", meta, 0, 7, (), "on") != base, "a refusal under auto must not bind 'on'"
    monkeypatch.setenv("NOT_FOVI_SWITCH", "1")
    monkeypatch.setenv("FOVI_COMMIT", "abc")
    assert replay._signature("forward", meta, 0, 7, (), "auto") == base, \
        "only the kernel-affecting FOVI_* variables belong to the signature"


def test_layouts_replayed_only_when_a_strided_copy_reproduces_them():
    t = torch.randn(4, 5, 6)
    assert replay._non_overlapping_dense(t)
    assert replay._non_overlapping_dense(t.permute(2, 0, 1))            # a permutation of a dense layout
    assert replay._non_overlapping_dense(torch.randn(4, 1, 6))
    assert not replay._non_overlapping_dense(t[:, ::2])                  # gaps
    assert not replay._non_overlapping_dense(torch.randn(4, 1).expand(4, 6))   # overlapping (stride 0)
    s = replay._static_copy(t.permute(2, 0, 1))
    assert s.stride() == t.permute(2, 0, 1).stride() and torch.equal(s, t.permute(2, 0, 1))


def test_suspended_runs_direct_in_every_thread_and_nests():
    """:func:`replay.suspended` (what ``graphed()`` runs its warm-ups in) holds for the whole process: autograd runs a
    CUDA backward on a worker thread of its own, whose calls must run directly too. It nests, ends with its outermost
    block, and inside even an emulated replay runs directly."""
    import threading
    from fovi_lab.ops.graphs import per_call_suspended
    assert not per_call_suspended()
    seen = []
    with replay.suspended():
        assert per_call_suspended()
        with replay.suspended():
            assert per_call_suspended()
        assert per_call_suspended(), "leaving an inner block must not resume the outer one"
        t = threading.Thread(target=lambda: seen.append(per_call_suspended()))
        t.start()
        t.join()
        before = replay.stats()
        with replay.emulated_on_cpu():
            for _ in range(3):
                replay.replayed("suspended-test", None, lambda a: a + 1, torch.ones(2))
        assert replay.stats() == before
    assert not per_call_suspended() and seen == [True]


def test_graphed_warm_ups_free_the_per_call_copies_first(monkeypatch):
    """A layer's first call inside :func:`replay.suspended` (``graphed()``'s warm-ups) drops the signatures its eager
    calls cached, their static copies freed at once, without owning the layer (its capture will); the results are
    the direct ones, and the layer's eager calls after the block cache again."""
    import weakref
    meta, conv = _layer_conv()
    x = torch.randn(4, meta.cin, meta.nin, generator=torch.Generator().manual_seed(1)).half()

    def step():
        xr = x.clone().requires_grad_()
        y = conv(xr)
        y.float().sum().backward()
        out = (y.detach(), xr.grad, conv.weight.grad.clone())
        conv.weight.grad = None
        return out
    want = step()
    _emulated(monkeypatch)
    for _ in range(3):
        step()
    held = list(replay._entries.values())
    copies = [weakref.ref(t) for e in held if e.static is not None for t in e.static if t is not None]
    assert held and copies
    (meta,) = {id(e.meta): e.meta for e in held}.values()         # the meta the layer's calls carry
    before = replay.stats()
    with replay.suspended():
        got = step()
        assert all(c() is None for c in copies), "the warm-up's first call must free the cached copies"
        assert replay.stats()["cached"] == 0 and replay.stats()["replayed"] == before["replayed"]
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert not replay.owned_by_outer_capture(meta) and replay.stats()["owned"] == 0
    for _ in range(3):
        step()
    assert replay.stats()["cached"] > 0 and replay.stats()["replayed"] > before["replayed"]
    replay.clear()


def _emulated(monkeypatch):
    """CUDA graphs emulated on the CPU (replay.EMULATE_ON_CPU) and every call replayed; the cache starts empty."""
    monkeypatch.setattr(replay, "EMULATE_ON_CPU", True)
    monkeypatch.setenv("FOVI_KNN_REPLAY", "on")
    replay.clear()


def _layer_conv(layer="res18_layer3_0", bias=False, dtype=torch.float16):
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.ops.autograd import KNNConv
    meta = layer_meta(layer)
    torch.manual_seed(0)
    conv = KNNConv(meta.idx, meta.rf_index, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout,
                   backend="warp_train", bias=bias).to(dtype=dtype)
    return meta, conv


@pytest.mark.parametrize("bias", [False, True])
def test_a_replayed_train_step_is_bitwise_the_direct_one(monkeypatch, bias):
    """warp_train's eager step through KNNConv, replayed (graphs emulated): the first call of each direction runs
    directly, the second captures, later ones replay, the backward from a graph that reads the forward's copies of x
    and the weight; every step's y, dx, dW and db equal the direct step's bit for bit."""
    meta, conv = _layer_conv(bias=bias)
    gen = torch.Generator().manual_seed(1)
    x0 = torch.randn(5, meta.cin, meta.nin, generator=gen).half()
    g = torch.randn(5, meta.cout, meta.nout, generator=gen).half()

    def step():
        x = x0.clone().requires_grad_()
        y = conv(x)
        y.backward(g)
        out = [y.detach(), x.grad] + [p.grad for p in conv.parameters()]
        for p in conv.parameters():
            p.grad = None
        return out
    want = step()                               # FOVI_KNN_REPLAY unset: CPU calls run directly
    _emulated(monkeypatch)
    before = replay.stats()
    for _ in range(4):
        got = step()
        assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(want, got))
    s = replay.stats()
    # signatures: the forward, the backward (its first call, before the forward's copies existed), the backward
    # after the forward's copies; captured: the forward and the backward after it
    assert (s["cached"], s["captured"] - before["captured"], s["replayed"] - before["replayed"]) == (3, 2, 5), s


def test_the_backward_reads_the_forwards_copies_only_while_they_hold_its_inputs(monkeypatch):
    """Two forwards of one layer before the backwards (fp32 master weights under CPU autocast): the second forward's
    replay overwrites the copies the first's backward would read, so that backward copies its own operands; both
    gradients equal the direct run's bit for bit. (Reading the overwritten copies fails this test.)"""
    meta, conv = _layer_conv(dtype=torch.float32)
    gen = torch.Generator().manual_seed(2)
    xs = [torch.randn(4, meta.cin, meta.nin, generator=gen) for _ in range(2)]
    g = torch.randn(4, meta.cout, meta.nout, generator=gen)

    def two():
        with torch.autocast("cpu", dtype=torch.float16):
            ins = [x.clone().requires_grad_() for x in xs]
            ys = [conv(x) for x in ins]
        (ys[0].float() * g + 2 * ys[1].float() * g).sum().backward()
        out = [ins[0].grad, ins[1].grad, conv.weight.grad]
        conv.weight.grad = None
        return out
    want = two()
    _emulated(monkeypatch)
    for _ in range(4):
        got = two()
        assert all(torch.equal(a, b) for a, b in zip(want, got))
        assert [t.dtype for t in got] == [torch.float32] * 3


def test_an_adjoint_after_an_in_place_change_copies_its_own_operands(monkeypatch):
    """The ops-level adjoints (WarpTrainOps.grad_weight / grad_input / backward_combined) read a replayed forward's
    copies of x and the weight only while those tensors are unchanged: after ``x.mul_(2)`` (or an optimizer's step on
    the weight) they copy their own, and dW and dx are the direct calls' on the current values."""
    from fovi_lab.knn_warp import WarpTrainOps
    meta, _ = _layer_conv()
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(4, meta.cin, meta.nin, generator=gen).half()
    w = (torch.randn(meta.cout, meta.q, generator=gen) / 30).half()
    g = torch.randn(4, meta.cout, meta.nout, generator=gen).half()
    _emulated(monkeypatch)
    for _ in range(3):                                   # forward captured; the adjoints after it captured too
        WarpTrainOps.forward(meta, x, w, None)
        WarpTrainOps.backward_combined(meta, g, x, w)
        WarpTrainOps.grad_weight(meta, g, x)
        WarpTrainOps.grad_input(meta, g, w)
    WarpTrainOps.forward(meta, x, w, None)
    x.mul_(2)
    w.mul_(-1)
    got = (WarpTrainOps.grad_weight(meta, g, x), WarpTrainOps.grad_input(meta, g, w),
           *WarpTrainOps.backward_combined(meta, g, x, w))
    monkeypatch.setattr(replay, "EMULATE_ON_CPU", False)        # the direct calls on the current values
    want = (WarpTrainOps.grad_weight(meta, g, x), WarpTrainOps.grad_input(meta, g, w),
            *WarpTrainOps.backward_combined(meta, g, x, w))
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_resident_bytes_count_a_dropped_forward_that_an_adjoint_still_reads(monkeypatch):
    """A forward dropped from the cache (as the least recently used is) while a cached adjoint reads its copies: the
    adjoint holds it, so resident_bytes still counts its bytes (its static copies live on)."""
    meta, conv = _layer_conv()
    x = torch.randn(3, meta.cin, meta.nin).half().requires_grad_()
    g = torch.randn(3, meta.cout, meta.nout).half()
    _emulated(monkeypatch)
    for _ in range(3):
        conv(x).backward(g)
    entries = list(replay._entries.values())
    after = next(e for e in entries if e.after is not None)
    for i, e in enumerate(entries):
        e.nbytes = 10 ** i                      # each signature's bytes, told apart
    assert replay.resident_bytes() == sum(e.nbytes for e in entries if e.static is not None)
    with replay._lock:                          # the forward dropped from the cache (as the LRU rule drops one)
        key = next(k for k, e in replay._entries.items() if e is after.after)
        del replay._entries[key]
    assert replay.resident_bytes() == sum(e.nbytes for e in entries if e.static is not None)


def test_the_ops_step_replays_as_the_gpu_test_counts(monkeypatch):
    """``WarpTrainOps.forward`` then ``backward_combined`` (the path ``tests/ops/test_gpu_replay.py`` checks on every
    layer), graphs emulated: over four steps the forward replays three times and the adjoint, a signature of its own once it
    reads the forward's copies, twice; every step equals the direct one bit for bit."""
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.knn_warp import WarpTrainOps
    meta = layer_meta("res18_layer3_0")
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, meta.cin, meta.nin, generator=gen).half()
    w = (torch.randn(meta.cout, meta.q, generator=gen) / math.sqrt(meta.cin * meta.k)).half()
    g = torch.randn(3, meta.cout, meta.nout, generator=gen).half()
    step = lambda: (WarpTrainOps.forward(meta, x, w, None),) + tuple(WarpTrainOps.backward_combined(meta, g, x, w))  # noqa: E731
    want = step()                               # FOVI_KNN_REPLAY unset: CPU calls run directly
    _emulated(monkeypatch)
    before = replay.stats()
    for _ in range(4):
        assert all(torch.equal(a, b) for a, b in zip(want, step()))
    assert replay.stats()["replayed"] - before["replayed"] == 5, replay.stats()


def _in_place(monkeypatch, reuse: bool):
    """Emulated graphs in place; ``reuse``: every call's outputs land where the last call's did (a training loop's
    allocations coming back), else never where any earlier call's did (all kept alive)."""
    monkeypatch.setattr(replay, "EMULATE_ON_CPU", True)
    monkeypatch.setenv("FOVI_KNN_REPLAY", "in-place")
    replay.clear()
    made: dict = {}
    kept: list = []
    real = replay._outputs

    def outputs(e, dev):
        if not reuse:
            kept.append(real(e, dev))
            return kept[-1]
        # new tensors (autograd takes a gradient it alone holds) on the memory of the signature's first ones
        return tuple(torch.empty(0, dtype=b.dtype).set_(b.untyped_storage(), b.storage_offset(), b.shape, b.stride())
                     for b in made.setdefault(id(e), real(e, dev)))
    monkeypatch.setattr(replay, "_outputs", outputs)


@pytest.mark.parametrize("reuse", [True, False])
def test_in_place_replays_read_and_write_where_the_tensors_are(monkeypatch, reuse):
    """``FOVI_KNN_REPLAY=in-place``, graphs emulated: a train step whose tensors come back to the same addresses is
    replayed from the graphs captured there, with no copy or clone issued (only its outputs allocated); one whose
    addresses never repeat captures up to MAX_IN_PLACE graphs a signature and then copies as ``auto`` does. Every
    step equals the direct one bit for bit, a step after an in-place weight update too."""
    from fovi_lab.bench.host import OpCounter
    meta, conv = _layer_conv(bias=True)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(3, meta.cin, meta.nin, generator=gen).half().requires_grad_()
    g = torch.randn(3, meta.cout, meta.nout, generator=gen).half()

    ops = OpCounter()

    def step():
        ops.names.clear()
        with ops:
            y = conv(x)
            y.backward(g)
        out = [t.clone() for t in [y.detach(), x.grad] + [p.grad for p in conv.parameters()]]
        x.grad = None
        for p in conv.parameters():
            p.grad = None
        return out
    want = step()                               # FOVI_KNN_REPLAY unset: CPU calls run directly
    _in_place(monkeypatch, reuse)
    before = replay.stats()
    for i in range(2 * replay.MAX_IN_PLACE + 2):
        got = step()
        assert all(torch.equal(a, b) for a, b in zip(want, got)), f"step {i}"
    s = replay.stats()
    placed, in_place = (s["captured_in_place"] - before["captured_in_place"],
                        s["replayed_in_place"] - before["replayed_in_place"])
    if reuse:     # forward and backward: a graph each, replayed on every call after their first
        assert (placed, s["captured"] - before["captured"]) == (2, 0)
        assert in_place == 2 * (2 * replay.MAX_IN_PLACE + 1)
        assert not {"copy_", "clone"} & set(ops.names), ops.names
    else:         # MAX_IN_PLACE graphs a signature, then the copies
        assert placed == 2 * replay.MAX_IN_PLACE and s["captured"] - before["captured"] >= 1
        assert "copy_" in ops.names
    with torch.no_grad():
        conv.weight.mul_(0.5)
    with monkeypatch.context() as m:
        m.setenv("FOVI_KNN_REPLAY", "off")
        m.setattr(replay, "EMULATE_ON_CPU", False)
        want = step()
    assert all(torch.equal(a, b) for a, b in zip(want, step()))


def test_an_outer_capture_owns_the_layer(monkeypatch):
    """Eager steps of two layers cache their per-call graphs (emulated); a step made while an outer capture records
    (a whole-step graph of the caller's) runs layer 1 directly, drops layer 1's signatures and frees their static
    copies at that call, and keeps layer 2's, which no capture met. After the capture, layer 1's eager calls run
    directly and are never cached again, with the same results bit for bit; clear() forgets the ownership."""
    import weakref
    meta1, conv1 = _layer_conv("res18_layer3_0")
    meta2, conv2 = _layer_conv("res18_layer4_0")
    gen = torch.Generator().manual_seed(5)
    x1 = torch.randn(3, meta1.cin, meta1.nin, generator=gen).half()
    x2 = torch.randn(3, meta2.cin, meta2.nin, generator=gen).half()

    def step(conv, x):
        x = x.clone().requires_grad_()
        y = conv(x)
        y.float().square().sum().backward()
        out = [y.detach(), x.grad] + [p.grad for p in conv.parameters()]
        for p in conv.parameters():
            p.grad = None
        return out
    want = step(conv1, x1)
    _emulated(monkeypatch)
    for _ in range(3):
        step(conv1, x1)
    layer1 = {id(e.meta): e.meta for e in replay._entries.values()}     # the meta layer 1's calls carry
    assert len(layer1) == 1
    (m1,) = layer1.values()
    for _ in range(3):
        step(conv2, x2)
    held = [e for e in replay._entries.values() if e.meta is m1]
    others = [e for e in replay._entries.values() if e.meta is not m1]
    assert held and others and any(e.static is not None for e in held)
    copies = [weakref.ref(s) for e in held if e.static is not None for s in e.static if s is not None]
    assert copies and not replay.owned_by_outer_capture(m1)

    before = replay.stats()
    monkeypatch.setattr(replay, "_outer_capture_underway", lambda t: True)
    got = step(conv1, x1)
    assert all(c() is None for c in copies), "the dropped signatures' static copies must be freed at the capture"
    assert replay._retired, "their graphs wait until no capture is underway"
    monkeypatch.setattr(replay, "_outer_capture_underway", lambda t: False)
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    s = replay.stats()
    assert s["yielded"] - before["yielded"] == len(held) and s["owned"] == 1
    assert s["replayed"] == before["replayed"], "nothing is replayed inside an outer capture"
    assert replay.owned_by_outer_capture(m1)
    assert not any(e.meta is m1 for e in replay._entries.values())
    assert all(replay._entries.get(k) is e for k, e in zip(
        [k for k, e in replay._entries.items() if e.meta is not m1], others)), "a layer no capture met keeps its graphs"

    for _ in range(3):                                   # eager again: layer 1 direct, never cached again
        got = step(conv1, x1)
        assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert not replay._retired, "the first call outside the capture destroys the dropped graphs"
    assert not any(e.meta is m1 for e in replay._entries.values())
    assert replay.stats()["replayed"] == s["replayed"], "an owned layer's eager calls run directly"
    replay.clear()
    assert not replay.owned_by_outer_capture(m1) and replay.stats()["owned"] == 0
