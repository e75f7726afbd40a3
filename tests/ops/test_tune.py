"""The autotune cache and tuner on the CPU: written, read back, keyed by problem and setup (a version change
misses), read by ``auto`` and by the Warp forward, bad candidates refused, a malformed file named."""

import json

import pytest
import torch

from fovi_lab.graph.layers import synthetic_meta
from fovi_lab.ops import cpu_auto, tune_cache
from fovi_lab.ops.dispatch import select_backend

pytest.importorskip("warp")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    monkeypatch.setenv("FOVI_TUNE_CACHE", str(path))
    tune_cache.reload()
    yield path
    monkeypatch.undo()                       # back to the session's empty cache (conftest), then forget this one
    tune_cache.reload()


def _problem(batch=5):
    meta = synthetic_meta("ODD")
    return meta, torch.randn(batch, meta.cin, meta.nin).half(), torch.randn(meta.cout, meta.q).half()


def _entry(backend, config=None):
    return {"backend": backend, "config": config, "ms": 1.0, "candidates": {}, "source": "tuned"}


def test_written_read_back_and_keyed(cache):
    meta, x, _ = _problem()
    setup = tune_cache.setup_key(x.device)
    key = tune_cache.entry_key(setup, tune_cache.problem_key(meta, 5, torch.float16, "forward"))
    tune_cache.store({key: _entry("torch_binned")})
    assert json.loads(cache.read_text())["entries"][key]["backend"] == "torch_binned"
    tune_cache.reload()
    assert tune_cache.tuned_choice(meta, x, training=False) == ("torch_binned", None)
    assert tune_cache.tuned_choice(meta, x, training=True) is None            # another mode
    assert tune_cache.tuned_choice(meta, x[:4], training=False) is None       # another batch
    assert select_backend("auto", meta, x, training=False) == "torch_binned"  # auto reads it first
    # no entry: on a CPU the estimate's pick (measuring is off in the tests)
    assert select_backend("auto", meta, x, training=True) == cpu_auto.decide(meta, 5, torch.float16, True).backend
    # under autocast eager and compiled calls resolve with the compute dtype, not x's
    assert select_backend("auto", meta, x.float(), training=False) == \
        cpu_auto.decide(meta, 5, torch.float32, False).backend
    assert select_backend("auto", meta, x.float(), training=False, dtype=torch.float16) == "torch_binned"


def test_a_version_change_misses(cache, monkeypatch):
    meta, x, _ = _problem()
    key = tune_cache.entry_key(tune_cache.setup_key(x.device), tune_cache.problem_key(meta, 5, torch.float16, "forward"))
    tune_cache.store({key: _entry("torch_binned")})
    assert tune_cache.tuned_choice(meta, x, training=False) == ("torch_binned", None)
    monkeypatch.setenv("FOVI_WARP_MMA", "off")                               # a switch that changes the kernels
    assert tune_cache.tuned_choice(meta, x, training=False) is None
    monkeypatch.delenv("FOVI_WARP_MMA")
    monkeypatch.setattr(tune_cache, "_SETUPS", {})
    monkeypatch.setattr(tune_cache, "_versions", lambda: "fovi-lab 9.9/warp 9.9.9/torch 2.13.0+cpu")
    assert tune_cache.tuned_choice(meta, x, training=False) is None          # another release


def test_the_warp_forward_runs_the_tuned_config(cache, monkeypatch):
    import fovi_lab.knn_warp as kw
    from fovi_lab.kernels.forward.api import prepare_uncached
    meta, x, w = _problem()
    rule = prepare_uncached(x, w, None, meta.input_linear, meta.weight_linear).config
    other = "m16n32" if rule != "m16n32" else "m32n64"
    key = tune_cache.entry_key(tune_cache.setup_key(x.device), tune_cache.problem_key(meta, 5, torch.float16, "forward"))
    tune_cache.store({key: _entry("warp_compact", other)})
    seen = []
    real = kw.run_uncached
    monkeypatch.setattr(kw, "run_uncached", lambda *a, config=None, **k: seen.append(config) or real(*a, config=config, **k))
    y = kw.WarpCompactOps.forward(meta, x, w, None)
    assert seen == [other]
    assert torch.equal(y, real(x, w, None, meta.input_linear, meta.weight_linear, config=other))


def test_tune_refuses_bad_candidates_and_picks_a_timed_one(cache, monkeypatch):
    from fovi_lab.bench import tune
    real = tune.candidates
    monkeypatch.setattr(tune, "candidates", lambda *a, **k: real(*a, **k) + [("warp_compact", "no_such_config")])
    meta, _, _ = _problem()
    entries = tune.tune([(meta, 5, "forward"), (meta, 5, "train-step")], "cpu", reps=2, log=None)
    assert len(entries) == 2
    for key, e in entries.items():
        label = e["backend"] + (f":{e['config']}" if e["config"] else "")
        assert label in e["candidates"] and e["ms"] == e["candidates"][label]
        best = min(e["candidates"], key=e["candidates"].get)
        if best == e["rule"]:
            assert label == best and e["ab"] is None
        else:                           # the one-pass winner is kept only if it wins the interleaved rounds by 2 %
            ab = e["ab"]
            assert ab["pick"] == best and ab["rounds"] == tune.AB_ROUNDS
            assert label == (best if ab["pick_ms"] < 0.98 * ab["rule_ms"] else e["rule"])
        assert e["rule"] == "torch_compact" and e["rule_ms"] == e["candidates"]["torch_compact"]
    fwd = next(e for k, e in entries.items() if "|forward/" in k)
    assert "warp_compact:no_such_config" in fwd["refused"]
    assert tune_cache.reload() == entries                                     # and written


def test_a_tuned_config_that_no_longer_runs_warns_once_and_the_rule_runs(cache):
    import fovi_lab.knn_warp as kw
    meta, x, w = _problem(batch=6)
    key = tune_cache.entry_key(tune_cache.setup_key(x.device), tune_cache.problem_key(meta, 6, torch.float16, "forward"))
    tune_cache.store({key: _entry("warp_compact", "a_config_of_another_release")})
    with pytest.warns(RuntimeWarning, match="tuned forward config 'a_config_of_another_release'.*rule's pick"):
        y = kw.WarpCompactOps.forward(meta, x, w, None)
    assert torch.equal(y, kw.run_uncached(x, w, None, meta.input_linear, meta.weight_linear))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kw.WarpCompactOps.forward(meta, x, w, None)                    # once: no second warning


def test_a_malformed_cache_is_named(cache):
    cache.write_text("{not json")
    with pytest.raises(ValueError, match="tune cache .* is not JSON"):
        tune_cache.reload()
    cache.write_text(json.dumps({"format": 0, "entries": {}}))
    with pytest.raises(ValueError, match="not a format-1 cache"):
        tune_cache.reload()
    cache.write_text(json.dumps({"format": 1, "entries": {"k": {"config": None}}}))
    with pytest.raises(ValueError, match="entry 'k' needs a 'backend' name"):
        tune_cache.reload()
    cache.unlink()
    assert tune_cache.reload() == {}


def test_bf16_is_tuned_apart_and_warp_train_is_a_bf16_candidate(cache):
    from fovi_lab.bench import tune
    meta, x, _ = _problem()
    entries = tune.tune([(meta, 5, "train-step")], "cpu", torch.bfloat16, reps=1, log=None)
    (key, e), = entries.items()
    assert key.endswith(tune_cache.problem_key(meta, 5, torch.bfloat16, "train-step"))
    assert "warp_train" in e["candidates"], e.get("refused")                   # checked against the oracle, timed
    assert tune_cache.tuned_choice(meta, x, training=True) is None             # fp16 x: another problem
    assert tune_cache.tuned_choice(meta, x.bfloat16(), training=True) == (e["backend"], None)


@pytest.mark.parametrize("ab,kept", [((0.5, 1.0), "torch_binned"), ((0.99, 1.0), "torch_compact")])
def test_a_one_pass_win_over_the_rule_must_hold_in_interleaved_rounds(cache, monkeypatch, ab, kept):
    from fovi_lab.bench import tune

    def one_pass(cands, meta, mode, x, w, g, device, reps, times, refused):
        times.update({"torch_compact": 2.0, "torch_binned": 1.0})            # the rule (torch_compact) loses

    monkeypatch.setattr(tune, "_time_candidates", one_pass)
    monkeypatch.setattr(tune, "_interleaved", lambda fa, fb, device, reps: ab)
    meta, _, _ = _problem()
    _, e = tune.tune_problem(meta, 5, "forward", "cpu", reps=1)
    assert e["ab"] == {"pick": "torch_binned", "pick_ms": ab[0], "rule_ms": ab[1], "rounds": tune.AB_ROUNDS}
    assert e["backend"] == kept and e["rule"] == "torch_compact"
