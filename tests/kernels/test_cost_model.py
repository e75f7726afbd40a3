"""The forward's cost model (fovi_lab.kernels.cost_model): it recovers a model that made the records, its score counts
what it says, the command's errors are one line with exit status 2, and docs/cost_model.md is its output."""

from pathlib import Path

import numpy as np
import pytest
import torch

from fovi_lab.cli import main as cli_main
from fovi_lab.kernels.families.base import Problem
from fovi_lab.kernels import cost_model as cm
from fovi_lab.ops.devices import DEVICES

H200, H100 = DEVICES["h200"], DEVICES["h100"]
# (layer, cin, cout, nin, nout, k, p64, v): sizes like the table's, small to large
SHAPES = [("a", 64, 64, 4096, 1024, 9, 640, 16), ("b", 128, 128, 1024, 256, 9, 1152, 16),
          ("c", 3, 64, 16384, 4096, 49, 192, 64), ("d", 256, 256, 256, 64, 9, 2304, 9)]
KERNELS = ("mmato_o64b32", "mmas_o32b8")
TRUE = {"torch_compact": [0.10, 0.0, 3.0, 0.0], "torch_binned": [0.08, 5.0, 4.0, 0.0],
        "tensor_cores/mmato": [0.07, 9.0, 0.5, 0.0], "tensor_cores/mmas": [0.06, 16.0, 0.25, 0.0]}


def _problem(dims, batch):
    _, cin, cout, nin, nout, k, p64, v = dims
    return Problem(batch=batch, cin=cin, nin=nin, cout=cout, nout=nout, p64=p64, q=cin * v, k=k,
                   dtype=torch.float16)


def _true_ms(cand, problem, spec):
    groups, terms = cm.candidate_terms(cand, problem, spec)
    return float(np.dot(TRUE[groups[0]], terms))


def _records(spec, batches=(1, 4, 16, 64, 256), date="2026-01-01"):
    out = []
    for dims in SHAPES:
        for b in batches:
            problem = _problem(dims, b)
            base = dict(device=spec.name, B=b, layer=dims[0], source="synthetic.jsonl", date=date,
                        **dict(zip(("cin", "cout", "nin", "nout", "k", "p64", "v"), dims[1:])))
            for impl, form in cm.FORMS.items():
                out.append(dict(base, impl=impl, ms=_true_ms(form, problem, spec)))
            for i, cfg in enumerate(KERNELS):
                out.append(dict(base, impl="warp_uncached", config=cfg, chosen=i == 0,
                                ms=_true_ms(cfg, problem, spec)))
    return out


def test_the_fit_recovers_the_model_that_made_the_records():
    shapes = cm.timed_shapes(_records(H200))
    assert len(shapes) == len(SHAPES) * 5 and all(len(ts.times) == 4 for ts in shapes)
    model = cm.fit(shapes)
    for name, true in TRUE.items():
        g = model.groups[name]
        assert g.rms < 1e-6, name
        assert np.allclose([g.fixed, g.a, g.b, g.c], true, rtol=1e-4, atol=1e-6), (name, g)
    # held out on another GPU's peaks, the picks are the fastest everywhere
    s = cm.score(model, cm.timed_shapes(_records(H100)))
    assert (s.hits, s.shapes, s.misses, s.unpriced) == (20, 20, (), 0)


def test_scope_backends_keeps_the_chosen_kernel_and_the_forms():
    shapes = cm.timed_shapes(_records(H200), scope="backends")
    assert all(set(ts.times) == {"torch_compact", "torch_binned", KERNELS[0]} for ts in shapes)
    assert all(ts.chosen == KERNELS[0] for ts in shapes)
    with pytest.raises(ValueError, match="scope"):
        cm.timed_shapes([], scope="all")


def test_records_left_out():
    rec = _records(H200, batches=(16,))
    graphed = [dict(r, graphed=True) for r in rec]
    variant = [dict(r, note_run="a variant") for r in rec]
    unknown = [dict(r, config="no_such_config") for r in rec if r["impl"] == "warp_uncached"]
    other_device = [dict(r, device="Some GPU") for r in rec]
    assert cm.timed_shapes(graphed + variant + other_device) == []
    shapes = cm.timed_shapes(unknown + [r for r in rec if r["impl"] != "warp_uncached"])
    assert all(set(ts.times) == set(cm.FORMS.values()) for ts in shapes)


def test_latest_takes_the_latest_run_of_each_pair_and_a_sweep_for_kernels():
    early = _records(H200, batches=(16,), date="2026-01-01")
    late = [r for r in _records(H200, batches=(16,), date="2026-02-01")
            if r["impl"] != "warp_uncached" or r["chosen"]]          # one kernel: no sweep
    shapes = cm.timed_shapes(early + late)
    assert len(shapes) == 2 * len(SHAPES)
    kernels = cm.latest(shapes, "kernels")
    backends = cm.latest(shapes, "backends")
    assert len(kernels) == len(backends) == len(SHAPES)
    assert all("2026-01-01" in ts.run and len(ts.times) == 4 for ts in kernels)
    assert all("2026-02-01" in ts.run and len(ts.times) == 3 for ts in backends)


def _shape(times, layer="x", batch=8):
    problem = _problem(SHAPES[0], batch)
    return cm.TimedShape("NVIDIA H200", layer, batch, "r", problem, dict(times))


def test_the_score_counts_picks_within_the_margin():
    # a model that prices torch_binned lowest everywhere: its pick is torch_binned
    model = cm.CostModel({"torch_binned": cm.Group(0.001, 0, 0, 0, 6, 0.0),
                          "torch_compact": cm.Group(1.0, 0, 0, 0, 6, 0.0)})
    shapes = [_shape({"torch_binned": 1.10, "torch_compact": 1.0}),          # 10% slower: counts
              _shape({"torch_binned": 1.0, "torch_compact": 2.0}),           # the fastest
              _shape({"torch_binned": 1.2, "torch_compact": 1.0}, "y", 4),   # 20% slower: a miss
              _shape({"mmato_o64b32": 1.0, "mmas_o32b8": 2.0})]              # nothing priced
    s = cm.score(model, shapes, within=0.10)
    assert (s.hits, s.shapes, s.unpriced, s.candidates) == (2, 4, 1, 8)
    assert s.share == 0.5
    assert [(m.layer, m.batch, m.pick, m.best) for m in s.misses] == [("y", 4, "torch_binned", "torch_compact")]
    assert s.misses[0].ratio == pytest.approx(1.2)
    assert cm.score(model, shapes, within=0.25).hits == 3
    with pytest.raises(ValueError, match="within"):
        cm.score(model, shapes, within=-0.1)


def test_a_kernel_only_the_pooled_group_prices_is_picked_only_alone():
    model = cm.CostModel({"warp": cm.Group(0.001, 0, 0, 0, 6, 0.0),
                          "tensor_cores/mmas": cm.Group(1.0, 0, 0, 0, 6, 0.0)})
    problem = _problem(SHAPES[0], 8)
    assert model.pick(["mmato_o64b32", "mmas_o32b8"], problem, H200) == "mmas_o32b8"
    assert model.pick(["mmato_o64b32"], problem, H200) == "mmato_o64b32"
    assert model.ms("mmato_o64b32", problem, "h200") == pytest.approx(0.001)


def test_fit_needs_enough_timings():
    with pytest.raises(ValueError, match="records"):
        cm.fit(cm.timed_shapes(_records(H200, batches=(16,))), min_points=100)


def test_the_terms_name_bad_candidates():
    with pytest.raises(ValueError, match="name"):
        cm.candidate_terms("no_such_config", _problem(SHAPES[0], 8), H200)
    with pytest.raises(ValueError, match="form"):
        cm.form_terms("torch_dense", _problem(SHAPES[0], 8), H200)


@pytest.mark.parametrize("argv, words", [
    (["--fit", "h100", "--score", "h100"], "--score: must name another GPU"),
    (["--fit", "h300"], "--fit: invalid choice"),
    (["--within", "-1"], "--within: expected a number >= 0"),
    (["--fit", "a100", "--scope", "backends"], "--fit: no timed forward shapes of NVIDIA A100"),
    (["--check", "no/such/page.md", "--scope", "backends", "--fit", "h200"], "--check: no file"),
    (["--out", "no/such/folder/page.md", "--scope", "backends", "--fit", "h200"], "--out: no folder"),
])
def test_the_command_errors_are_one_line_with_exit_status_2(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["cost-model", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("python -m fovi_lab cost-model: error: ")
    assert words in err


def test_the_page_is_the_command_output(capsys):
    assert cm.main(["--check", str(Path(__file__).resolve().parents[2] / "docs" / "cost_model.md")]) == 0
    out = capsys.readouterr().out
    assert "== summary" in out and out.count("within 10% of the fastest") >= 8
