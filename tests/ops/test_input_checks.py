"""Every input is checked at the door: an error names the argument and what was expected.

Each case here was once silently wrong or failed deep inside with a message that blamed something else.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from fovi_lab import knn_warp
from fovi_lab.demo import check_device, format_rows, main, run_demo
from fovi_lab.ops.autograd import KNNConv, OPS_REGISTRY
from fovi_lab.graph.layers import layer_graph, layer_meta
from fovi_lab.graph.meta import build_meta, meta_aux, validate_meta
from fovi_lab.ops.reference import CompactTorchOps
from fovi_lab.kernels.adjoint import grad_input, grad_input_nm, grad_weight, grad_weight_nm

LAYER = "res18_layer1"          # Cin 64, Nin 230, Cout 64, Nout 230


@pytest.fixture(scope="module")
def meta():
    return layer_meta(LAYER)


def _operands(m, b=2):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(b, m.cin, m.nin, generator=g).half(), torch.randn(m.cout, m.q, generator=g).half(),
            torch.randn(b, m.cout, m.nout, generator=g).half())


# ------------------------------------------------------------------------------------------ x against the layer

@pytest.mark.parametrize("shape", [(2, 128, 230), (2, 64, 240), (2, 32, 230), (2, 64, 220)])
@pytest.mark.parametrize("backend", ["warp_compact", "warp_train", "torch_compact", "torch_binned"])
def test_x_of_another_layer_is_refused(meta, shape, backend):
    # Cin = 128 / Nin = 240 once gave silently wrong output from the Warp forward, Cin = 32 / Nin = 220 an
    # error that blamed input_linear
    _, w, _ = _operands(meta)
    with pytest.raises(ValueError, match=r"x: expected shape \[B, Cin=64, Nin=230\]"):
        OPS_REGISTRY[backend].forward(meta, torch.randn(*shape).half(), w, None)


def test_x_of_another_layer_is_refused_by_the_module():
    conv = KNNConv.from_graph(layer_graph(LAYER), 64, 64, backend="warp_compact")
    with pytest.raises(ValueError, match=r"x: expected shape \[B, Cin=64, Nin=230\], got \(2, 128, 230\)"):
        conv(torch.randn(2, 128, 230).half())


@pytest.mark.parametrize("backend", ["warp_train", "torch_compact"])
def test_grad_operands_against_the_layer(meta, backend):
    x, w, g = _operands(meta)
    ops = OPS_REGISTRY[backend]
    with pytest.raises(ValueError, match=r"grad_y: expected shape \[B, Cout=64, Nout=230\]"):
        ops.grad_input(meta, g[:, :, :200].contiguous(), w)
    with pytest.raises(ValueError, match=r"weight: expected shape \[Cout=64, Q="):
        ops.grad_input(meta, g, w[:, :100].contiguous())
    with pytest.raises(ValueError, match=r"x: expected shape"):
        ops.grad_weight(meta, g, x[:, :32].contiguous())


# ------------------------------------------------------------------------------------------ the meta's tables

def test_built_metas_are_marked_and_pass(meta):
    validate_meta(meta)
    assert meta_aux(meta).get("validated")
    assert meta_aux(meta.to("cpu")).get("validated")
    same = dataclasses.replace(meta, rev_col=meta.rev_col.clone())    # a hand-made copy of good tables
    assert not meta_aux(same).get("validated")
    validate_meta(same)
    assert meta_aux(same).get("validated")


def _corrupt(meta, name, fn):
    t = getattr(meta, name).clone()
    fn(t)
    if name in {f.name for f in dataclasses.fields(meta)}:
        return dataclasses.replace(meta, **{name: t})
    bad = dataclasses.replace(meta)          # the flat copies are made on first read: one set by hand is kept
    setattr(bad, name, t)
    return bad


CORRUPTIONS = {
    "input_linear out of range": ("input_linear", lambda t: t.view(-1).__setitem__(5, 10 ** 6)),
    "input_linear in range, wrong": ("input_linear", lambda t: t.view(-1).__setitem__(5, int(t.view(-1)[6]))),
    "weight_linear": ("weight_linear", lambda t: t.view(-1).__setitem__(3, int(t.view(-1)[3]) + 1)),
    "input_linear_flat": ("input_linear_flat", lambda t: t.__setitem__(7, 0)),
    "weight_linear_flat": ("weight_linear_flat", lambda t: t.__setitem__(7, 1)),
    "rev_col swapped": ("rev_col", lambda t: t.copy_(t.flip(0))),
    "rev_col one entry": ("rev_col", lambda t: t.__setitem__(0, int(t[1]))),
    "rev_rowptr": ("rev_rowptr", lambda t: t.__setitem__(3, int(t[3]) + 1)),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_corrupted_tables_are_refused_by_every_entry_point(meta, case):
    name, fn = CORRUPTIONS[case]
    bad = _corrupt(meta, name, fn)
    x, w, g = _operands(meta)
    calls = {
        "forward warp": lambda: knn_warp.WarpTrainOps.forward(bad, x, w, None),
        "dx staged": lambda: grad_input(bad, g, w),
        "dW staged": lambda: grad_weight(bad, g, x),
        "dx fused": lambda: grad_input_nm(bad, g, w),
        "dW fused": lambda: grad_weight_nm(bad, g, x),
        "dx, dW warp_train": lambda: knn_warp.WarpTrainOps.backward_combined(bad, g, x, w),
        "forward torch": lambda: CompactTorchOps.forward(bad, x, w, None),
        "dx torch": lambda: CompactTorchOps.grad_input(bad, g, w),
    }
    for what, call in calls.items():
        with pytest.raises(ValueError, match=rf"meta\.{name}: "):
            call()


def test_tables_of_an_impossible_layer_are_refused(meta):
    bad = dataclasses.replace(meta, idx=torch.full_like(meta.idx, meta.nin + 3))
    with pytest.raises(ValueError, match="meta: its idx / rf_index do not make a valid layer"):
        validate_meta(bad)
    with pytest.raises(TypeError, match="meta: expected a TrainingMeta"):
        validate_meta(object())


def test_validation_names_the_first_difference():
    m = build_meta(torch.tensor([[0, 1], [2, 3]]), torch.tensor([[0, 1], [1, 0]]), cin=2, cout=3, v=2, nin=4)
    bad = _corrupt(m, "rev_col", lambda t: t.__setitem__(0, 3))
    with pytest.raises(ValueError, match=r"meta\.rev_col: 1 entry differs .* \(first at 0: 3, expected 0\)"):
        validate_meta(bad)


# ------------------------------------------------------------------------------------------ backends

def test_unknown_backend_is_refused_at_construction():
    with pytest.raises(ValueError, match=r"backend: unknown backend 'nope'; registered: .*torch_compact"):
        KNNConv.from_graph(layer_graph(LAYER), 64, 64, backend="nope")
    with pytest.raises(TypeError, match="backend: expected a backend name"):
        KNNConv.from_graph(layer_graph(LAYER), 64, 64, backend=3)
    assert KNNConv.from_graph(layer_graph(LAYER), 64, 64, backend="auto").backend == "auto"


# ------------------------------------------------------------------------------------------ the demo

@pytest.mark.parametrize("argv, message", [
    (["--backends", "nope"], "--backends: unknown 'nope'; registered:"),
    (["--device", "meta"], "--device: expected cpu or cuda"),
    (["--device", "banana"], "is not a torch device"),
    (["--reps", "0"], "--reps: expected an integer >= 1, got 0"),
])
def test_demo_cli_refuses_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_demo_refuses_cuda_without_a_gpu(capsys):
    with pytest.raises(SystemExit):
        main(["--device", "cuda"])
    assert "torch sees no CUDA device" in capsys.readouterr().err
    with pytest.raises(ValueError, match="device: 'cuda:1' asked for"):
        check_device("cuda:1")


def test_run_demo_refuses_bad_values():
    with pytest.raises(ValueError, match="reps: expected an integer >= 1, got 0"):
        run_demo(LAYER, batch=2, reps=0, log=lambda *_: None)
    with pytest.raises(KeyError, match="backends: unknown"):
        run_demo(LAYER, batch=2, backends=["nope"], log=lambda *_: None)


def test_demo_shows_tolerances_and_phases():
    lines = []
    rows = run_demo("res18_layer4_0", batch=2, reps=1, backends=["torch_compact", "warp_compact"], log=lines.append)
    table = format_rows(rows)
    head = table.splitlines()[0].split()
    assert head.count("tol") == 3 and head.index("tol") == head.index("err") + 1
    assert "tol: 3x the error of the oracle" in table
    compact = rows[0]
    assert compact.ok and compact.tol > compact.fwd_err and compact.dx_tol > compact.dx_err
    assert f"{compact.tol:9.1e}" in table.splitlines()[2]
    phases = [line for line in lines if "torch_compact  " in line]
    assert [p.split("  ")[-1].split(" (")[0].strip() for p in phases] == [
        "fp64 and same-dtype oracle references", "forward, first call", "dx and dW, first call", "timed, median of 1"]
    assert any("compiles its Warp kernels" in line for line in lines if "warp_compact" in line)
