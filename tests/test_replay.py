"""The replay layer's rules on the CPU (:mod:`fovi_lab.ops.replay`; the replays themselves need CUDA graphs and are
checked by ``tests/test_gpu_replay.py``): CPU calls run directly, the switch is validated, the signature sees the
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


def test_suspended_runs_direct_on_this_thread_and_nests():
    """:func:`replay.suspended` (what ``graphed()`` runs its warm-ups in) sets the thread's flag that replayed()
    reads first, restores it on exit, nests, and leaves other threads alone."""
    import threading
    assert not getattr(replay._local, "off", False)
    seen = []
    with replay.suspended():
        assert replay._local.off
        with replay.suspended():
            assert replay._local.off
        assert replay._local.off, "leaving an inner block must not resume the outer one"
        t = threading.Thread(target=lambda: seen.append(getattr(replay._local, "off", False)))
        t.start(); t.join()
    assert not replay._local.off and seen == [False]
