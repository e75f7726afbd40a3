"""``auto`` on the CPU (fovi_lab.ops.cpu_auto), the dense form, the fovi route and the cpu-auto benchmark.

No timing is asserted: the choice logic runs on stub forms and a fake clock, the cache round trip on a file of the
test's own, the machine key on stubbed CPU names."""

import json

import pytest
import torch

from fovi_lab.graph.layers import layer_meta, synthetic_meta
from fovi_lab.ops import cpu_auto, tune_cache
from fovi_lab.ops.dense import DenseTorchOps
from fovi_lab.ops.dispatch import select_backend
from fovi_lab.ops.reference import oracle_forward


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    monkeypatch.setenv("FOVI_TUNE_CACHE", str(path))
    tune_cache.reload()
    cpu_auto.forget()
    yield path
    monkeypatch.undo()
    tune_cache.reload()
    cpu_auto.forget()


# ------------------------------------------------------------------------------------------------ the dense form

@pytest.mark.parametrize("budget_mib", [None, "0.01"])          # whole, and one node per chunk
def test_dense_form_matches_the_oracle(monkeypatch, budget_mib):
    if budget_mib:
        monkeypatch.setenv("FOVI_KNN_STAGE_MIB", budget_mib)
    meta = synthetic_meta("ODD")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, meta.cin, meta.nin, generator=gen, dtype=torch.float64).requires_grad_()
    w = torch.randn(meta.cout, meta.q, generator=gen, dtype=torch.float64).requires_grad_()
    b = torch.randn(meta.cout, generator=gen, dtype=torch.float64)
    g = torch.randn(3, meta.cout, meta.nout, generator=gen, dtype=torch.float64)
    y = oracle_forward(x, w, b, meta.idx, meta.rf_index, meta.v, dtype=torch.float64)
    dx, dw = torch.autograd.grad(y, (x, w), g)
    x, w = x.detach(), w.detach()
    torch.testing.assert_close(DenseTorchOps.forward(meta, x, w, b), y.detach())
    torch.testing.assert_close(DenseTorchOps.grad_input(meta, g, w), dx)
    torch.testing.assert_close(DenseTorchOps.grad_weight(meta, g, x), dw)


def test_dense_form_refuses_bad_operands_naming_them():
    meta = synthetic_meta("ODD")
    x = torch.randn(2, meta.cin, meta.nin)
    with pytest.raises(ValueError, match="weight"):
        DenseTorchOps.forward(meta, x, torch.randn(meta.cout, meta.q + 1), None)
    with pytest.raises(ValueError, match="grad_y"):
        DenseTorchOps.grad_input(meta, torch.randn(2, meta.cout + 1, meta.nout), torch.randn(meta.cout, meta.q))


# ------------------------------------------------------------------------------------------------ the choice

def _stub_forms(monkeypatch, ms: dict, first: dict = None):
    """Forms whose calls advance a fake clock by ``ms[form]`` (``first[form]`` on their first call); returns the
    clock and the calls made, in order."""
    now, calls = [0.0], []

    def runner(form, meta, training, x, w, g):
        def run():
            n = sum(c == form for c in calls)
            calls.append(form)
            now[0] += ((first or {}).get(form, ms[form]) if n == 0 else ms[form]) / 1e3
        return run
    monkeypatch.setattr(cpu_auto, "_runner", runner)
    monkeypatch.setattr(cpu_auto, "forms", lambda dtype, training: tuple(ms))
    monkeypatch.setattr(cpu_auto, "CLOCK", lambda: now[0])
    return (lambda: now[0]), calls


def test_measure_orders_by_estimate_and_cuts_slow_forms(monkeypatch):
    meta = synthetic_meta("ODD")
    clock, calls = _stub_forms(monkeypatch, {"torch_compact": 50.0, "torch_binned": 4.0, "torch_dense": 5.0},
                               first={"torch_compact": 60.0})
    times, refused, cut = cpu_auto.measure(meta, 2, torch.float32, True, clock=clock, min_ms=0,
                                           order={"torch_binned": 1, "torch_dense": 2, "torch_compact": 3})
    assert calls[0] == "torch_binned" and refused == {}
    assert times == pytest.approx({"torch_binned": 4.0, "torch_dense": 5.0, "torch_compact": 50.0})
    assert cut == ("torch_compact",) and calls.count("torch_compact") == 2      # first call, once more, then cut
    assert calls.count("torch_binned") == 1 + cpu_auto.MEASURE_REPS


def test_measure_runs_the_forms_in_turn_and_keeps_each_ones_median_round(monkeypatch):
    """A burst of other work during one round (here: every call of the first round takes 10 ms more) must not
    decide the pick: the forms' rounds alternate, and each form's time is its median round."""
    meta = synthetic_meta("ODD")
    now, calls = [0.0], []
    base = {"torch_binned": 4.0, "torch_dense": 3.0}

    def runner(form, meta, training, x, w, g):
        def run():
            calls.append(form)
            burst = 10.0 if 3 <= len(calls) <= 4 else 0.0        # the first round after the first calls
            now[0] += (base[form] + burst) / 1e3
        return run
    monkeypatch.setattr(cpu_auto, "_runner", runner)
    monkeypatch.setattr(cpu_auto, "forms", lambda dtype, training: tuple(base))
    times, _, cut = cpu_auto.measure(meta, 2, torch.float32, True, clock=lambda: now[0], reps=4, min_ms=0,
                                     order={"torch_binned": 1, "torch_dense": 2})
    assert cut == () and times == pytest.approx({"torch_binned": 4.0, "torch_dense": 3.0})
    first, rounds = calls[:2], calls[2:]
    assert first == ["torch_binned", "torch_dense"]
    assert rounds == ["torch_binned", "torch_dense", "torch_dense", "torch_binned"] * 2


def test_a_form_whose_calls_vary_by_themselves_is_priced_by_its_typical_call(monkeypatch):
    """torch_compact's calls alternate 3 and 10 ms, torch_dense's take 5: the median prices compact at 6.5 and
    dense wins (the luckiest call, 3 ms, would have picked compact, which a loop of calls then runs at 6.5 a call)."""
    meta = synthetic_meta("ODD")
    now, calls = [0.0], []

    def runner(form, meta, training, x, w, g):
        def run():
            n = sum(c == form for c in calls)
            calls.append(form)
            now[0] += ((3.0, 10.0)[n % 2] if form == "torch_compact" else 5.0) / 1e3
        return run
    monkeypatch.setattr(cpu_auto, "_runner", runner)
    monkeypatch.setattr(cpu_auto, "forms", lambda dtype, training: ("torch_compact", "torch_dense"))
    times, _, cut = cpu_auto.measure(meta, 2, torch.float32, True, clock=lambda: now[0], reps=4, min_ms=0,
                                     order={"torch_compact": 1, "torch_dense": 2})
    assert cut == () and times == pytest.approx({"torch_compact": 6.5, "torch_dense": 5.0})


def test_fast_forms_run_more_rounds_until_each_adds_up_to_min_ms(monkeypatch):
    """Calls of 4 and 10 ms: rounds continue past reps until the 4 ms form's add up to min_ms (100 ms: 25 rounds);
    forms of 60 ms a call stop at reps; nothing runs past MEASURE_MAX_REPS rounds."""
    meta = synthetic_meta("ODD")
    clock, calls = _stub_forms(monkeypatch, {"torch_binned": 4.0, "torch_dense": 10.0})
    times, _, _ = cpu_auto.measure(meta, 2, torch.float32, True, clock=clock, reps=3, min_ms=100,
                                   order={"torch_binned": 1, "torch_dense": 2})
    assert calls.count("torch_binned") == calls.count("torch_dense") == 1 + 25
    assert times == pytest.approx({"torch_binned": 4.0, "torch_dense": 10.0})
    clock, calls = _stub_forms(monkeypatch, {"torch_binned": 60.0, "torch_dense": 70.0})
    cpu_auto.measure(meta, 2, torch.float32, True, clock=clock, reps=3, min_ms=100,
                     order={"torch_binned": 1, "torch_dense": 2})
    assert calls.count("torch_binned") == 1 + 3
    clock, calls = _stub_forms(monkeypatch, {"torch_binned": 0.001, "torch_dense": 0.002})
    cpu_auto.measure(meta, 2, torch.float32, True, clock=clock, reps=3, min_ms=100,
                     order={"torch_binned": 1, "torch_dense": 2})
    assert calls.count("torch_binned") == 1 + cpu_auto.MEASURE_MAX_REPS


def test_a_slow_first_call_alone_does_not_cut_a_form(monkeypatch):
    meta = synthetic_meta("ODD")
    clock, calls = _stub_forms(monkeypatch, {"torch_binned": 4.0, "torch_compact": 3.0}, first={"torch_compact": 90.0})
    times, _, cut = cpu_auto.measure(meta, 2, torch.float32, False, clock=clock,
                                     order={"torch_binned": 1, "torch_compact": 2})
    assert cut == () and times["torch_compact"] == pytest.approx(3.0)


def test_measured_once_stored_and_read_back(cache, monkeypatch):
    meta = synthetic_meta("ODD")
    _stub_forms(monkeypatch, {"torch_compact": 9.0, "torch_binned": 7.0, "torch_dense": 2.0})
    measured = []
    real = cpu_auto.measure
    monkeypatch.setattr(cpu_auto, "measure", lambda *a, **k: measured.append(1) or real(*a, **k))
    monkeypatch.setenv("FOVI_KNN_AUTO_MEASURE", "on")
    x = torch.randn(4, meta.cin, meta.nin)
    assert select_backend("auto", meta, x, training=True) == "torch_dense"
    assert select_backend("auto", meta, x, training=True) == "torch_dense"
    assert len(measured) == 1                                               # once per call signature
    entry = json.loads(cache.read_text())["entries"][cpu_auto.problem_entry_key(meta, 4, torch.float32, True)]
    assert entry["backend"] == "torch_dense" and entry["source"] == "measured"
    assert entry["candidates"] == pytest.approx({"torch_compact": 9.0, "torch_binned": 7.0, "torch_dense": 2.0})
    tune_cache.reload()                                                     # another process reads the file
    cpu_auto.forget()
    choice = cpu_auto.known_choice(meta, 4, torch.float32, True)
    assert (choice.backend, choice.source) == ("torch_dense", "measured")
    assert "measured on this machine" in choice.words() and "torch_dense 2 ms" in choice.words()
    assert select_backend("auto", meta, x, training=True) == "torch_dense" and len(measured) == 1


def test_measuring_off_takes_the_estimate_and_writes_nothing(cache, monkeypatch):
    meta = layer_meta("res18_layer4_0")
    monkeypatch.setenv("FOVI_KNN_AUTO_MEASURE", "off")
    monkeypatch.setattr(cpu_auto, "measure", lambda *a, **k: pytest.fail("measured with measuring off"))
    x = torch.randn(2, meta.cin, meta.nin)
    est = cpu_auto.estimates(meta, 2, torch.float32, False)
    assert select_backend("auto", meta, x, training=False) == min(est, key=est.get)
    choice = cpu_auto.decide(meta, 2, torch.float32, False)
    assert choice.source == "estimated" and "estimated" in choice.words() and not cache.exists()


def test_a_bad_setting_names_the_variable(cache, monkeypatch):
    monkeypatch.setenv("FOVI_KNN_AUTO_MEASURE", "sometimes")
    with pytest.raises(ValueError, match="FOVI_KNN_AUTO_MEASURE"):
        cpu_auto.decide(synthetic_meta("ODD"), 2, torch.float32, True)


def test_a_tuned_entry_comes_first(cache):
    meta = synthetic_meta("ODD")
    key = cpu_auto.problem_entry_key(meta, 3, torch.float32, False)
    tune_cache.store({key: {"backend": "torch_compact", "config": None, "candidates": {"torch_compact": 1.0},
                            "source": "tuned"}})
    assert select_backend("auto", meta, torch.randn(3, meta.cin, meta.nin), training=False) == "torch_compact"
    assert cpu_auto.known_choice(meta, 3, torch.float32, False).source == "tuned"


def test_the_machine_key_names_the_cpu_and_another_machine_misses(cache, monkeypatch):
    meta = synthetic_meta("ODD")
    key = cpu_auto.problem_entry_key(meta, 3, torch.float32, True)
    assert tune_cache.cpu_name() in key and f"torch {torch.__version__}" in key
    assert f"{torch.get_num_threads()} threads" in tune_cache.cpu_name()
    tune_cache.store({key: {"backend": "torch_compact", "config": None, "source": "measured"}})
    assert cpu_auto.known_choice(meta, 3, torch.float32, True).source == "measured"
    monkeypatch.setattr(tune_cache, "_SETUPS", {})
    monkeypatch.setattr(tune_cache, "cpu_name", lambda: "Another CPU (64 cores, 64 threads)")
    assert cpu_auto.problem_entry_key(meta, 3, torch.float32, True) != key
    assert cpu_auto.known_choice(meta, 3, torch.float32, True).source == "estimated"


@pytest.mark.parametrize("kw, exc, word", [
    (dict(batch=0), ValueError, "batch"), (dict(batch=2.0), ValueError, "batch"),
    (dict(dtype=torch.int32), TypeError, "dtype"), (dict(training="yes"), TypeError, "training"),
    (dict(meta="alex_L1"), TypeError, "meta")])
def test_bad_input_names_the_argument(kw, exc, word):
    args = dict(meta=synthetic_meta("ODD"), batch=2, dtype=torch.float32, training=True)
    args.update(kw)
    with pytest.raises(exc, match=word):
        cpu_auto.decide(**args)
    with pytest.raises(ValueError, match="form"):
        cpu_auto.estimate_ms(synthetic_meta("ODD"), 2, "torch_fast", True)


def test_the_estimate_covers_every_form_and_warp_only_in_half_precision():
    meta = layer_meta("alex_L1")
    assert set(cpu_auto.estimates(meta, 8, torch.float32, True)) == set(cpu_auto.TORCH_FORMS)
    half = cpu_auto.forms(torch.float16, True)
    assert set(half) - set(cpu_auto.TORCH_FORMS) <= {"warp_train"}
    assert all(v > 0 for v in cpu_auto.estimates(meta, 8, torch.float16, False).values())


def test_explain_says_what_auto_picks_on_the_cpu(cache):
    import fovi_lab
    text = str(fovi_lab.explain("res18_layer4_0", 8, device="cpu"))
    assert "backend auto: on this CPU" in text and "float32 train step at B = 8, estimated" in text
    meta = layer_meta("res18_layer4_0")
    tune_cache.store({cpu_auto.problem_entry_key(meta, 8, torch.float32, True): {
        "backend": "torch_dense", "config": None, "source": "measured",
        "candidates": {"torch_dense": 1.5, "torch_binned": 2.5}}})
    text = str(fovi_lab.explain("res18_layer4_0", 8, device="cpu"))
    assert "torch_dense for a float32 train step at B = 8, measured on this machine: torch_dense 1.5 ms" in text


# ------------------------------------------------------------------------------------------------ inside fovi

def _fovi_net(layer="res18_layer4_0"):
    pytest.importorskip("fovi.arch.knn")
    from fovi_lab.integrations.fovi import fovi_layer
    return torch.nn.Sequential(fovi_layer(layer, "cpu"))


@pytest.mark.parametrize("picked", ["torch_dense", "torch_binned"])
def test_fovi_route_runs_the_form_auto_picks(cache, monkeypatch, picked):
    from fovi_lab.integrations.fovi import fovi_backend, fovi_lab_inside
    import fovi.arch.knn_autograd as registry

    net = _fovi_net()
    conv = net[0]
    asked = []

    def decide(meta, batch, dtype, training, measure_now=None):
        asked.append((batch, dtype, training))
        return cpu_auto.CpuChoice(picked, "measured", "train-step" if training else "forward", batch, dtype)
    monkeypatch.setattr(cpu_auto, "decide", decide)
    x = torch.randn(2, conv.in_channels, conv.in_coords.shape[0])
    with fovi_backend(net, "baseline"):
        y0 = net(x)
        dw0, = torch.autograd.grad(y0.sum(), conv.weight)
    with fovi_lab_inside(net, "auto"):
        y1 = net(x)
        dw1, = torch.autograd.grad(y1.sum(), conv.weight)
        assert conv.fovi_lab_last_backend == picked
        with torch.no_grad():
            net(x)
    assert asked == [(2, torch.float32, True), (2, torch.float32, False)]
    torch.testing.assert_close(y1, y0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dw1, dw0, rtol=1e-4, atol=1e-4)
    assert not [n for n in registry.OPS_REGISTRY if n.startswith("fovi_lab_")]     # unregistered on exit


def test_register_with_fovi_auto_follows_the_pick(cache, monkeypatch):
    from fovi_lab.integrations.fovi import register_with_fovi, unregister_from_fovi
    net = _fovi_net()
    import fovi.arch.knn_autograd as registry

    monkeypatch.setattr(cpu_auto, "cpu_pick", lambda meta, batch, dtype, training: "torch_dense")
    ran = []
    real = DenseTorchOps.forward
    monkeypatch.setattr(DenseTorchOps, "forward", staticmethod(lambda *a: ran.append(1) or real(*a)))
    adapter = register_with_fovi("fovi_lab_test_auto", "auto")
    try:
        assert adapter.backend == "auto"
        conv = net[0]
        x = torch.randn(2, conv.in_channels, conv.in_coords.shape[0])
        registry.compact_forward(conv, x, ops_name="fovi_lab_test_auto")
        assert ran == [1]
    finally:
        unregister_from_fovi("fovi_lab_test_auto")
    with pytest.raises(ValueError, match="backend"):
        register_with_fovi("fovi_lab_test_auto", "torch_fastest")


# ------------------------------------------------------------------------------------------------ the benchmark

def test_the_benchmark_runs_one_small_shape(cache, tmp_path, capsys):
    from fovi_lab.bench import cpu_auto as bench
    out = tmp_path / "cpu_auto.jsonl"
    assert bench.main(["--layers", "res18_layer4_0", "--nets", "none", "--batches", "1", "--reps", "1",
                       "--out", str(out)]) == 0
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["kind"] == "cpu_auto" and rec["layer"] == "res18_layer4_0" and rec["B"] == 1
    assert set(cpu_auto.TORCH_FORMS) <= set(rec["times"]) and rec["auto"] in rec["times"]
    assert rec["ratio"] >= 1.0 and rec["command"].startswith("python -m fovi_lab bench cpu-auto")
    for field in ("device", "torch", "date", "commit", "auto_source", "estimate_pick"):
        assert field in rec
    printed = capsys.readouterr().out
    assert "auto within 1.25x of the fastest form" in printed and "of 1 shapes" in printed


def test_the_benchmark_refuses_a_bad_cutoff(capsys):
    from fovi_lab.bench import cpu_auto as bench
    with pytest.raises(SystemExit):
        bench.main(["--layers", "res18_layer4_0", "--nets", "none", "--cutoff", "0.5"])
    assert "--cutoff" in capsys.readouterr().err


def test_a_traced_call_measures_nothing_and_keeps_no_decision(monkeypatch, tmp_path):
    """Under a dispatch mode (as torch.compile's fake tensors, or the memory record) no operand is real: auto takes
    the estimate, measures nothing and keeps no decision, so the shape's first eager call measures."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
    from fovi_lab.ops import cpu_auto

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES["ODD"]
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=21)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    monkeypatch.setenv("FOVI_KNN_AUTO_MEASURE", "on")
    monkeypatch.setenv("FOVI_TUNE_CACHE", str(tmp_path / "tune.json"))
    measured = []
    monkeypatch.setattr(cpu_auto, "measure", lambda *a, **kw: measured.append(a) or ({"torch_binned": 1.0}, {}, ()))
    cpu_auto.forget()
    with Seen():
        picked = cpu_auto.cpu_pick(meta, 3, torch.float32, True)
    assert measured == [] and picked in cpu_auto.estimates(meta, 3, torch.float32, True)
    assert cpu_auto.cpu_pick(meta, 3, torch.float32, True) == "torch_binned" and len(measured) == 1


def test_the_benchmarks_rounds_add_up_to_min_ms_as_autos_do():
    from fovi_lab.bench.cpu_auto import time_forms
    now, calls = [0.0], []

    def step(form, ms):
        def run():
            calls.append(form)
            now[0] += ms / 1e3
        return run
    steps = {"torch_binned": step("torch_binned", 2.0), "torch_dense": step("torch_dense", 5.0)}
    times, once = time_forms(steps, reps=3, cutoff=4.0, clock=lambda: now[0], min_ms=50.0)
    assert once == [] and times == pytest.approx({"torch_binned": 2.0, "torch_dense": 5.0})
    assert calls.count("torch_binned") == 1 + 25                  # 25 rounds of 2 ms add up to 50
    calls.clear()
    time_forms(steps, reps=3, cutoff=4.0, clock=lambda: now[0])    # min_ms 0: the rounds asked for
    assert calls.count("torch_binned") == 1 + 3
