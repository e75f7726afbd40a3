"""fovi_lab's backends inside fovi's own KNN conv layer (:mod:`fovi_lab.integrations.fovi`), on the CPU.

The layer is fovi's ``KNNConvLayer`` of ResNet-18's layer2.0.conv1 (:data:`fovi_lab.graph.layers.LAYERS`
``res18_layer2_0``: 230 -> 60 nodes, K = 9, V = 36, Cin 64, Cout 128), built by fovi from the layer table's
arguments, with a bias so that every gradient is checked. Our backends run inside fovi's autograd Function and
are compared with fovi's ``torch_compact`` and ``baseline``: ``torch_compact`` / ``torch_binned`` in fp32,
``warp_train`` / ``warp_compact`` in fp16 (they compute in fp16 / bf16 only; fp16 is the dtype fovi dispatches
``warp_train`` in) on Warp's CPU device, judged against fovi's fp64 baseline with fovi's fp16 references'
own errors as the yardstick.

fovi hands ``kernel_backend="warp_train"`` to the registry only for CUDA tensors; the CPU test of that path
lifts that one check of fovi's dispatch (everything after it, down to the kernels, is fovi's and ours).
Skipped where fovi is not installed.
"""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch

from fovi_lab.integrations.fovi import INSTALL

pytest.importorskip("fovi", reason=f"fovi is not installed (install it with: {INSTALL})")

import fovi.arch.knn_autograd as fovi_registry          # noqa: E402  (a broken fovi install fails here, not skips)
import fovi.arch.knn_optimization as fovi_dispatch      # noqa: E402

import fovi_lab.knn_warp as lab_warp                    # noqa: E402
from fovi_lab.graph.layers import LAYERS, layer_shape  # noqa: E402
from fovi_lab.graph.meta import build_meta              # noqa: E402
from fovi_lab.integrations.fovi import fovi_layer, register_with_fovi, unregister_from_fovi  # noqa: E402
from fovi_lab.ops.autograd import KNNConvFunction       # noqa: E402
from fovi_lab.ops.registry import get_ops               # noqa: E402

# fovi builds its reference grid with torch.meshgrid and no indexing argument
pytestmark = pytest.mark.filterwarnings("ignore:torch.meshgrid:UserWarning")

LAYER = "res18_layer2_0"
BATCH = 8


@pytest.fixture(scope="module")
def layer():
    torch.manual_seed(0)
    conv = fovi_layer(LAYER, "cpu", bias=True)            # fovi's own layer of the table layer
    with torch.no_grad():                    # fp16-exact parameters: every dtype below sees the same operator
        conv.weight.copy_(conv.weight.half().float())
        conv.bias.copy_(torch.randn(conv.out_channels).half().float())
    return conv


@pytest.fixture
def registered():
    """Register names for one test; fovi gets every entry back afterwards, pass or fail."""
    names = []

    def register(name, backend):
        names.append(name)
        return register_with_fovi(name, backend)

    yield register
    for name in reversed(names):
        unregister_from_fovi(name)


def _operands(layer, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, layer.in_channels, layer.in_coords.shape[0], generator=g).half()
    gy = torch.randn(BATCH, layer.out_channels, layer.out_coords.shape[0], generator=g).half()
    return x.to(dtype), gy.to(dtype)


def _grads(run, conv, x, gy):
    """``(y, dx, dW, db)`` of ``run(conv, x)`` backpropagating ``gy``."""
    conv = copy.deepcopy(conv)
    x = x.clone().requires_grad_()
    y = run(conv, x)
    y.backward(gy.to(y.dtype))
    return [t.detach() for t in (y, x.grad, conv.weight.grad, conv.bias.grad)]


def _via_registry(name):
    """fovi's layer-level entry point to its registry, then the layer's own output mask (as its forward does)."""
    return lambda conv, x: conv._mask_invalid_outputs(fovi_registry.compact_forward(conv, x, ops_name=name))


def _fovi_baseline(conv, x):
    conv.kernel_backend = "baseline"
    return conv.to(x.dtype)(x)          # fovi's baseline needs the parameters in x's dtype


def _sizes(layer):
    return {"cin": layer.in_channels, "cout": layer.out_channels, "nin": layer.in_coords.shape[0],
            "nout": layer.out_coords.shape[0], "k": layer._k, "v": layer.local_rf.shape[2], "q": layer.weight.shape[1]}


def test_the_layer_is_the_table_layer(layer):
    want = layer_shape(LAYER)
    assert _sizes(layer) == {key: want[key] for key in _sizes(layer)}


@pytest.mark.parametrize("name", list(LAYERS))
def test_every_table_layer_has_fovis_layer_of_its_sizes(name):
    """fovi's layer of each table layer has its sizes, the reference grid included: the DINOv3 patch embed's own
    16 x 16 grid (V = 256), not one derived from K, so the benchmarks can hand fovi the weight they time ours with."""
    want = layer_shape(name)
    got = _sizes(fovi_layer(name, "cpu"))
    assert got == {key: want[key] for key in got}


def test_register_and_unregister_swap_fovis_entry(registered):
    adapter = register_with_fovi()
    try:
        import fovi.arch.knn_warp as fovi_warp                  # fovi's lazy import: must not displace ours
        assert fovi_registry.OPS_REGISTRY["warp_train"] is adapter
        assert adapter.ops is lab_warp.WarpTrainOps and adapter.backend == "warp_train"
        again = register_with_fovi("warp_train", "torch_compact")
        assert fovi_registry.OPS_REGISTRY["warp_train"] is again and again.ops is get_ops("torch_compact")
    finally:
        restored = unregister_from_fovi()
    assert restored is fovi_warp.WarpTrainOps is fovi_registry.OPS_REGISTRY["warp_train"]
    assert unregister_from_fovi() is fovi_warp.WarpTrainOps        # nothing of ours left: no change
    new = registered("fovi_lab_binned", "torch_binned")
    assert fovi_registry.OPS_REGISTRY["fovi_lab_binned"] is new
    assert unregister_from_fovi("fovi_lab_binned") is None and "fovi_lab_binned" not in fovi_registry.OPS_REGISTRY


def test_registering_before_fovi_imports_its_warp_module_holds():
    """fovi imports ``fovi.arch.knn_warp`` (which writes fovi's ``warp_train``) at the first forward that selects
    it: in a fresh interpreter, an entry registered before that import must survive it."""
    probe = (
        "import sys\n"
        "from fovi_lab.integrations.fovi import register_with_fovi\n"
        "adapter = register_with_fovi()\n"
        "from fovi.arch import knn_warp\n"
        "from fovi.arch.knn_autograd import OPS_REGISTRY\n"
        "assert OPS_REGISTRY['warp_train'] is adapter, OPS_REGISTRY['warp_train']\n"
        "print('held')\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "held", done.stderr[-2000:]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"name": 3}, TypeError, "^name: expected a registry name"),
    ({"name": ""}, ValueError, "^name: expected a non-empty"),
    ({"name": "baseline"}, ValueError, "^name: fovi runs 'baseline' without its ops registry"),
    ({"name": "torch_scatter"}, ValueError, "^name: fovi runs 'torch_scatter' without"),
    ({"backend": None}, TypeError, "^backend: expected a fovi_lab backend name"),
    ({"backend": "warp_fast"}, ValueError, "^backend: unknown backend 'warp_fast'; registered: .*warp_train"),
])
def test_bad_arguments_name_the_argument(kwargs, error, match):
    before = dict(fovi_registry.OPS_REGISTRY)
    with pytest.raises(error, match=match):
        register_with_fovi(**kwargs)
    assert fovi_registry.OPS_REGISTRY == before
    with pytest.raises(TypeError, match="^name:"):
        unregister_from_fovi(name=None)


def test_without_fovi_the_error_names_the_install_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "fovi.arch.knn", None)     # makes `import fovi.arch.knn` fail
    with pytest.raises(ImportError, match=r'pip install "fovi-lab\[fovi\]" && pip install --no-deps fovi=='):
        register_with_fovi()


def test_a_fovi_layer_with_warp_train_runs_our_kernels(layer, monkeypatch, registered):
    adapter = registered("warp_train", "warp_train")
    import fovi.arch.knn_warp as fovi_warp

    # fovi's dispatch: "warp_train" needs CUDA; on this CPU machine that one check is lifted
    fovi_select = fovi_dispatch.select_backend
    monkeypatch.setattr(fovi_dispatch, "select_backend",
                        lambda conv, x: "warp_train" if conv.kernel_backend == "warp_train" else fovi_select(conv, x))
    calls = []
    ours = lab_warp.WarpTrainOps

    def spy(entry, fn):
        def wrapped(*args):
            calls.append(entry)
            return fn(*args)
        return staticmethod(wrapped)

    monkeypatch.setattr(ours, "forward", spy("forward", ours.forward))
    monkeypatch.setattr(ours, "backward_combined", spy("backward_combined", ours.backward_combined))

    conv = copy.deepcopy(layer)
    conv.kernel_backend = "warp_train"
    x, gy = _operands(conv, torch.float16)
    got = _grads(lambda c, xx: c(xx), conv, x, gy)
    assert calls == ["forward", "backward_combined"]
    assert fovi_registry.OPS_REGISTRY["warp_train"] is adapter

    # the same kernels driven by fovi_lab alone, on a meta built from the fovi layer's neighbour and tap tables
    meta = build_meta(layer.knn_indices_pad_token.t(), layer.local_rf.argmax(2), cin=layer.in_channels,
                      cout=layer.out_channels, v=layer.local_rf.shape[2], nin=layer.in_coords.shape[0])
    own = _grads(lambda c, xx: KNNConvFunction.apply(xx, c.weight, c.bias, meta, "warp_train"), layer, x, gy)
    for name, a, b in zip(("y", "dx", "dW", "db"), got, own):
        assert a.dtype == b.dtype and torch.equal(a, b), name

    # fovi's own entry is back after unregistering: the layer reaches it, not ours
    unregister_from_fovi("warp_train")
    assert fovi_registry.OPS_REGISTRY["warp_train"] is fovi_warp.WarpTrainOps

    class FovisOwn(Exception):
        pass

    def fovis(meta, x, weight, bias):
        raise FovisOwn

    monkeypatch.setattr(fovi_warp.WarpTrainOps, "forward", staticmethod(fovis))
    calls.clear()
    with pytest.raises(FovisOwn):
        conv(x)
    assert calls == []


def _scale(t):
    return max(1.0, float(t.double().abs().max()))


@pytest.mark.parametrize("backend", ["torch_compact", "torch_binned"])
def test_fp32_backends_match_fovis_torch_compact_and_baseline(layer, registered, backend):
    name = f"fovi_lab_{backend}"
    registered(name, backend)
    x, gy = _operands(layer, torch.float32)
    got = _grads(_via_registry(name), layer, x, gy)
    for ref_name, run in (("torch_compact", _via_registry("torch_compact")), ("baseline", _fovi_baseline)):
        ref = _grads(run, layer, x, gy)
        for what, a, b in zip(("y", "dx", "dW", "db"), got, ref):
            assert a.dtype == b.dtype == torch.float32, (ref_name, what)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * _scale(b), msg=f"{what} vs fovi's {ref_name}")


def test_warp_train_in_fp16_is_as_accurate_as_fovis_fp16_backends(layer, registered):
    registered("fovi_lab_warp_train", "warp_train")
    x, gy = _operands(layer, torch.float16)
    got = _grads(_via_registry("fovi_lab_warp_train"), layer, x, gy)
    assert [t.dtype for t in got] == [torch.float16, torch.float16, torch.float32, torch.float32]
    exact = _grads(_fovi_baseline, layer, x.double(), gy.double())
    # deterministic: a second call is bitwise the first
    assert all(torch.equal(a, b) for a, b in zip(got, _grads(_via_registry("fovi_lab_warp_train"), layer, x, gy)))
    # criterion (docs/operator.md §5): within 3x a same-dtype reference's error, + 2e-3 of the scale
    for ref_name, run in (("torch_compact", _via_registry("torch_compact")), ("baseline", _fovi_baseline)):
        ref = _grads(run, layer, x, gy)
        for what, a, b, e in zip(("y", "dx", "dW", "db"), got, ref, exact):
            err, ref_err = float((a.double() - e).abs().max()), float((b.double() - e).abs().max())
            assert err <= 3 * ref_err + 2e-3 * _scale(e), (what, ref_name, err, ref_err)


def test_warp_compact_forward_in_fp16(layer, registered):
    registered("fovi_lab_warp_compact", "warp_compact")
    x, _ = _operands(layer, torch.float16)
    with torch.no_grad():
        y = _via_registry("fovi_lab_warp_compact")(layer, x)
        ref = _via_registry("torch_compact")(layer, x)
        exact = _fovi_baseline(copy.deepcopy(layer), x.double())
    assert y.dtype == torch.float16
    err, ref_err = float((y.double() - exact).abs().max()), float((ref.double() - exact).abs().max())
    assert err <= 3 * ref_err + 2e-3 * _scale(exact)


def test_inside_fovis_function_a_replayed_backward_reads_the_forwards_copies(layer, registered):
    """fovi's own autograd Function calls our forward, then backward_combined on the tensors it saved: replayed (CUDA
    graphs emulated on the CPU, fovi_lab.ops.replay.emulated_on_cpu), the backward copies grad_y alone (x and the
    weight are read from the forward's copies) and returns dx and dW; every step's results equal the direct ones."""
    from fovi_lab.bench.host import OpCounter
    from fovi_lab.ops import replay
    registered("fovi_lab_warp_train", "warp_train")
    run = _via_registry("fovi_lab_warp_train")
    x, gy = _operands(layer, torch.float16)
    conv = copy.deepcopy(layer).half()       # one layer throughout: its tables, and so its signatures, persist

    def step():
        xr = x.clone().requires_grad_()
        y = run(conv, xr)
        y.backward(gy)
        out = [t.detach() for t in (y, xr.grad, conv.weight.grad, conv.bias.grad)]
        conv.weight.grad = conv.bias.grad = None
        return out
    want = step()
    with replay.emulated_on_cpu():
        for _ in range(3):                   # direct, captured, replayed
            assert all(torch.equal(a, b) for a, b in zip(step(), want))
        xr = x.clone().requires_grad_()
        y = run(conv, xr)
        with OpCounter() as ops:
            y.backward(gy)
    # grad_y in, dx and dW out (fovi's own casts and bias sum besides, outside our call)
    assert ops.names.get("copy_", 0) == 1 and ops.names.get("clone", 0) == 2, ops.names


def test_fovis_timed_steps_set_the_layer_up_once_and_bump_its_weight_version():
    """The benchmarks time fovi's own call: the layer takes the operands' dtype and weight once; each later step only
    bumps the weight's version (as an optimizer's update does, as for ours), no copy and no module cast per call;
    a weight changed in place is taken again."""
    from fovi_lab.integrations.fovi import fovi_forwards, fovi_steps

    meta = layer_shape("res18_layer3_0")
    g0 = torch.Generator().manual_seed(0)
    x = torch.randn(2, meta["cin"], meta["nin"], generator=g0)
    w = 0.05 * torch.randn(meta["cout"], meta["q"], generator=g0)
    g = torch.randn(2, meta["cout"], meta["nout"], generator=g0)
    step = fovi_steps("res18_layer3_0", "cpu", backends=("torch_compact",))["fovi_torch_compact"]
    conv = step.__defaults__[0]
    y1 = step(x, w, g)[0]
    version = conv.weight._version
    y1b = step(x, w, g)[0]
    assert conv.weight._version == version + 1 and torch.equal(y1, y1b)
    with torch.no_grad():
        conv.weight.mul_(2.0)                       # the layer's own weight: a step does not copy w over it
    assert torch.allclose(step(x, w, g)[0], 2 * y1, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        w.mul_(1.0)                                 # w changed in place (its version): taken again
    assert torch.equal(step(x, w, g)[0], y1)
    b = torch.randn(meta["cout"], generator=g0)
    fwd = fovi_forwards("res18_layer3_0", "cpu", backends=("torch_compact",), bias=True)
    y = fwd["fovi_torch_compact"](x, w, b)
    assert not y.requires_grad
    torch.testing.assert_close(y, fwd.reference(x, w, b), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(y - y1, b.view(1, -1, 1).expand_as(y), rtol=1e-4, atol=1e-4)


def test_the_forward_benchmark_times_fovis_backends_beside_ours(tmp_path):
    """``bench forward`` times fovi's own backends on fovi's layer of the same table layer, judged against that
    layer's fp32 forward; one fovi refuses on this device is a record with fovi's reason; ``--no-fovi`` drops them."""
    import json

    from fovi_lab.bench.forward import main as forward_main

    out = tmp_path / "fwd.jsonl"
    args = ["--layers", "res18_layer3_0", "--batches", "2", "--no-compile", "--reps", "1", "--warmup", "0",
            "--device", "cpu", "--out", str(out)]
    assert forward_main(args) == 0
    recs = {r["impl"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert recs["fovi_torch_compact"]["ms"] > 0 and recs["fovi_torch_compact"]["err"] < 1e-2
    assert recs["fovi_torch_compact"]["fovi_weight"] == "set once"
    assert recs["fovi_cuda"]["ms"] is None and "CUDA" in recs["fovi_cuda"]["note"]
    assert "peak_mib" in recs["fovi_torch_compact"] and "peak_mib" in recs["torch_compact"], "CUDA memory: None here"
    assert recs["warp_uncached"]["tables_mib"] > 0, "the index tables the layer keeps"
    out.unlink()
    assert forward_main(args + ["--no-fovi"]) == 0
    assert not [r for r in map(json.loads, out.read_text().splitlines()) if r["impl"].startswith("fovi_")]
