"""Every entry point refuses an operand it cannot compute with, before computing anything.

Without the check an integer ``x`` into ``KNNConv(..., backend="torch_compact")`` returns an int64 tensor of zeros
(the weights are cast to int), a tensor on the meta device fails inside autocast with "unsupported scalarType" and a
NumPy array with an AttributeError. One check (:mod:`fovi_lab.ops.checks`) runs at every door: each backend's ops,
the seed's functional API (:mod:`fovi_lab.knn_warp`), the forward kernels' ``run_uncached`` / ``run_cached``,
``KNNConv``, ``KNNConvFunction`` and the custom ops.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fovi_lab import KNNConv, knn_warp
from fovi_lab.graph.layers import layer_graph, layer_meta
from fovi_lab.ops import library  # noqa: F401  (registers torch.ops.fovi_lab)
from fovi_lab.ops.autograd import KNNConvFunction
from fovi_lab.ops.checks import check_operand, check_operands
from fovi_lab.ops.reference import build_effective_weight
from fovi_lab.ops.registry import OPS_REGISTRY, register_ops

LAYER = "res18_layer4_0"        # a small real layer: Cin 256, Nin 16, Cout 512, Nout 2

FLOAT = r"expected a floating-point tensor \(float16, bfloat16, float32, float64\), got "
META = r"expected a tensor with values on cpu or cuda, got one on the meta device"


@pytest.fixture(scope="module")
def meta():
    return layer_meta(LAYER)


def _operands(m, dtype=torch.float16, b=2):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(b, m.cin, m.nin, generator=g).to(dtype), torch.randn(m.cout, m.q, generator=g).to(dtype),
            torch.randn(m.cout, generator=g).to(dtype), torch.randn(b, m.cout, m.nout, generator=g).to(dtype))


# (what to do to one operand, the error type, the message after "<name>: ")
BAD = {
    "int64": (lambda t: t.long(), TypeError, FLOAT + "int64"),
    "int32": (lambda t: t.int(), TypeError, FLOAT + "int32"),
    "bool": (lambda t: t > 0, TypeError, FLOAT + "bool"),
    "complex": (lambda t: t.float().to(torch.complex64), TypeError, FLOAT + "complex64"),
    "float8": (lambda t: t.float().to(torch.float8_e4m3fn), TypeError, FLOAT + "float8_e4m3fn"),
    "none": (lambda t: None, TypeError, r"expected a torch.Tensor, got NoneType"),
    "meta": (lambda t: t.to("meta"), ValueError, META),
    "numpy": (lambda t: t.float().numpy(), TypeError, r"expected a torch.Tensor.*, got numpy.ndarray; convert it "
                                                        r"with torch.from_numpy"),
    "list": (lambda t: t.float().tolist(), TypeError, r"expected a torch.Tensor.*, got list"),
}


class _Spy:
    """A backend that records whether it was ever asked to compute."""

    name = "spy_operand_checks"
    compute_dtypes = (torch.float32,)
    called = []

    @staticmethod
    def forward(meta, x, weight, bias):
        _Spy.called.append("forward")
        return torch.zeros(x.shape[0], meta.cout, meta.nout)

    @staticmethod
    def grad_input(meta, grad_y, weight):
        _Spy.called.append("grad_input")
        raise AssertionError("not reached")

    @staticmethod
    def grad_weight(meta, grad_y, x):
        _Spy.called.append("grad_weight")
        raise AssertionError("not reached")


@pytest.fixture
def spy():
    register_ops(_Spy)
    _Spy.called.clear()
    yield _Spy
    OPS_REGISTRY.pop(_Spy.name, None)


# ------------------------------------------------------------------------------------------ the silent case

@pytest.mark.parametrize("backend", ["torch_compact", "torch_binned", "warp_compact", "warp_train"])
def test_an_integer_x_into_a_layer_is_refused(backend):
    conv = KNNConv.from_graph(layer_graph(LAYER), 256, 512, backend=backend)
    x = torch.randint(0, 5, (2, 256, conv.nin))
    with pytest.raises(TypeError, match="x: " + FLOAT + "int64; convert it first, e.g. x.float()"):
        conv(x)


def test_the_layer_checks_before_any_backend_runs(spy):
    conv = KNNConv.from_graph(layer_graph(LAYER), 256, 512, backend=spy.name)
    for how, (make, exc, message) in BAD.items():
        x = make(torch.randn(2, 256, conv.nin))
        with pytest.raises(exc, match="x: " + message):
            conv(x)
    assert spy.called == []
    conv(torch.randn(2, 256, conv.nin))             # the spy itself works: the check is what stopped it above
    assert spy.called == ["forward"]


def test_an_integer_layer_weight_is_refused(spy):
    conv = KNNConv.from_graph(layer_graph(LAYER), 256, 512, bias=True, backend=spy.name)
    conv.bias = torch.nn.Parameter(torch.zeros(512, dtype=torch.long), requires_grad=False)    # a frozen int bias
    with pytest.raises(TypeError, match="bias: " + FLOAT + "int64"):
        conv(torch.randn(2, 256, conv.nin))
    assert spy.called == []


# ------------------------------------------------------------------------------------------ every door

def _doors(m, x, w, b, g):
    """Each entry point, called with the operands given (a bad one among them)."""
    il, wl = m.input_linear, m.weight_linear
    doors = {}
    for name in ("torch_compact", "torch_binned", "warp_compact", "warp_train"):
        ops = OPS_REGISTRY[name]
        doors[f"{name}.forward"] = lambda ops=ops: ops.forward(m, x, w, b)
        if name != "warp_compact":
            doors[f"{name}.grad_input"] = lambda ops=ops: ops.grad_input(m, g, w)
            doors[f"{name}.grad_weight"] = lambda ops=ops: ops.grad_weight(m, g, x)
    doors["warp_train.backward_combined"] = lambda: knn_warp.WarpTrainOps.backward_combined(m, g, x, w)
    doors["knn_warp.run_uncached"] = lambda: knn_warp.run_uncached(x, w, b, il, wl)
    doors["knn_warp.grad_input"] = lambda: knn_warp.grad_input(m, g, w)
    doors["knn_warp.grad_weight"] = lambda: knn_warp.grad_weight(m, g, x)
    doors["knn_warp.grad_input staged"] = lambda: knn_warp.grad_input(m, g, w, stage_fp32=True)
    doors["knn_warp.grad_weight staged"] = lambda: knn_warp.grad_weight(m, g, x, stage_fp32=True)
    doors["KNNConvFunction"] = lambda: KNNConvFunction.apply(x, w, b, m, "torch_compact")
    handle = library.register_layer(m)
    doors["op knn_conv"] = lambda: torch.ops.fovi_lab.knn_conv(x, w, b, handle, "torch_compact", torch.float32, False)
    doors["op grad_input"] = lambda: torch.ops.fovi_lab.knn_conv_grad_input(g, w, handle, "torch_compact",
                                                                            torch.float32)
    doors["op grad_weight"] = lambda: torch.ops.fovi_lab.knn_conv_grad_weight(g, x, handle, "torch_compact",
                                                                              torch.float32)
    doors["op backward"] = lambda: torch.ops.fovi_lab.knn_conv_backward(g, x, w, handle, "torch_compact",
                                                                        torch.float32)
    return doors


def _uses(door: str, operand: str) -> bool:
    """Whether ``door`` takes ``operand`` (a forward takes x, weight, bias; dx takes grad_y, weight; dW grad_y, x)."""
    if "grad_input" in door:
        return operand in ("grad_y", "weight")
    if "grad_weight" in door:
        return operand in ("grad_y", "x")
    if "backward" in door:
        return operand in ("grad_y", "x", "weight")
    return operand in ("x", "weight", "bias")


@pytest.mark.parametrize("operand", ["x", "weight", "bias", "grad_y"])
@pytest.mark.parametrize("how", list(BAD))
def test_every_entry_point_refuses_a_bad_operand(meta, operand, how):
    make, exc, message = BAD[how]
    if how == "none" and operand == "bias":
        pytest.skip("bias=None is a layer without bias")
    good = dict(zip(("x", "weight", "bias", "grad_y"), _operands(meta)))
    bad = dict(good, **{operand: make(good[operand])})
    refused = []
    for door, call in _doors(meta, bad["x"], bad["weight"], bad["bias"], bad["grad_y"]).items():
        if not _uses(door, operand):
            continue
        if door.startswith("op ") and how in ("numpy", "list"):
            # the dispatcher checks the op's schema first, naming the argument (its message prints the value)
            schema = f"Expected a value of type '(Optional\\[)?Tensor\\]?' for argument '{operand}'"
            with pytest.raises(RuntimeError, match=schema):
                call()
        else:
            with pytest.raises(exc, match=f"{operand}: {message}"):
                call()
        refused.append(door)
    assert len(refused) >= 5, refused


def test_run_cached_refuses_a_bad_effective_weight(meta):
    x, w, b, _ = _operands(meta)
    weff = build_effective_weight(meta, w)
    for how in ("int64", "float8", "meta", "numpy", "none"):
        make, exc, message = BAD[how]
        with pytest.raises(exc, match="effective_weight: " + message):
            knn_warp.run_cached(x, make(weff), b, meta.input_linear, cout=meta.cout)
        with pytest.raises(exc, match="x: " + message):
            knn_warp.run_cached(make(x), weff, b, meta.input_linear, cout=meta.cout)


def test_the_custom_op_refuses_an_integer_compute_dtype(meta):
    x, w, b, _ = _operands(meta, torch.float32)
    handle = library.register_layer(meta)
    for bad in (torch.int64, torch.complex64, torch.float8_e4m3fn):
        with pytest.raises(TypeError, match=rf"compute_dtype: expected a floating-point torch.dtype .*, got {bad}"):
            torch.ops.fovi_lab.knn_conv(x, w, b, handle, "torch_compact", bad, False)


def test_good_operands_pass_and_none_bias_is_allowed():
    check_operands(x=torch.zeros(1, 2, 3), weight=torch.zeros(2, 2, dtype=torch.bfloat16), bias=None)
    check_operand("grad_y", torch.zeros(1, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"weight: expected a torch.Tensor, got NoneType"):
        check_operands(x=torch.zeros(1), weight=None)
