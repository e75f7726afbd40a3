"""The custom ops of fovi_lab.ops.library: opcheck on every op and backend, torch.compile(fullgraph=True) equal
to eager (forward and both gradients), the layer handles."""

import gc

import pytest
import torch

from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.ops import library
from fovi_lab.ops.autograd import KNNConv

pytest.importorskip("warp")

OPS = torch.ops.fovi_lab
# (backend, compute dtype, trains): warp_compact is forward-only
BACKENDS = [("torch_compact", torch.float32, True), ("torch_binned", torch.float32, True),
            ("warp_train", torch.float16, True), ("warp_compact", torch.float16, False)]


def _layer(name="ODD", seed=0):
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[name]
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    return build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)


@pytest.mark.parametrize("backend, dtype, trains", BACKENDS, ids=[b[0] for b in BACKENDS])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_opcheck_forward(backend, dtype, trains, with_bias):
    meta = _layer()
    layer = library.register_layer(meta)
    gen = torch.Generator().manual_seed(0)
    # B = 5: not a tile multiple; x non-contiguous (a transposed copy). torch_binned's matmul folds the batch
    # or not depending on autograd state, so its fp32 sums run in another order under AOT tracing: integer
    # values make every order exact
    draw = (lambda *s: torch.randint(-3, 4, s, generator=gen).float()) if backend == "torch_binned" else \
        (lambda *s: torch.randn(*s, generator=gen))
    x = draw(5, meta.nin, meta.cin).transpose(1, 2).requires_grad_(trains)
    w = draw(meta.cout, meta.q).requires_grad_(trains)
    b = torch.randn(meta.cout, generator=gen).requires_grad_(trains) if with_bias else None
    torch.library.opcheck(OPS.knn_conv.default, (x, w, b, layer, backend, dtype, trains))


@pytest.mark.parametrize("backend, dtype, trains", [b for b in BACKENDS if b[2]], ids=[b[0] for b in BACKENDS if b[2]])
def test_opcheck_adjoints(backend, dtype, trains):
    meta = _layer("PAD_HEAVY")
    layer = library.register_layer(meta)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(3, meta.cin, meta.nin, generator=gen)
    w = torch.randn(meta.cout, meta.q, generator=gen)
    g = torch.randn(3, meta.cout, meta.nout, generator=gen)
    torch.library.opcheck(OPS.knn_conv_grad_input.default, (g, w, layer, backend, dtype))
    torch.library.opcheck(OPS.knn_conv_grad_weight.default, (g, x, layer, backend, dtype))
    torch.library.opcheck(OPS.knn_conv_backward.default, (g, x, w, layer, backend, dtype))


def _net(backend, dtype):
    torch.manual_seed(0)
    m1 = _layer("ODD")
    l1 = KNNConv(m1.idx, m1.rf_index, nin=m1.nin, v=m1.v, cin=m1.cin, cout=m1.cout, bias=True, backend=backend)
    idx, rf = synthetic_graph(m1.nout, m1.nout, 3, 4, 1, seed=1)
    l2 = KNNConv(idx, rf, nin=m1.nout, v=4, cin=m1.cout, cout=5, backend=backend)
    return torch.nn.Sequential(l1, torch.nn.ReLU(), l2).to(dtype), m1


def _step(net, x):
    """y and every gradient of one step (loss = sum(y^2))."""
    x.grad = None
    net.zero_grad()
    y = net(x)
    y.float().square().sum().backward()
    return [y.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize("backend, dtype, compiler", [
    ("torch_compact", torch.float32, "aot_eager"), ("warp_train", torch.float16, "aot_eager"),
    ("auto", torch.float32, "aot_eager"), ("warp_train", torch.float16, "inductor"),
])
def test_compile_fullgraph_equals_eager(backend, dtype, compiler):
    """Two KNNConv layers and a ReLU compile with no graph break; outputs and gradients equal eager's
    (the op runs the same kernels; only the ReLU and the loss may fuse), and a second compiled step
    repeats the first bit for bit."""
    torch._dynamo.reset()
    net, m1 = _net(backend, dtype)
    x = torch.randn(3, m1.cin, m1.nin, dtype=dtype, generator=torch.Generator().manual_seed(2)).requires_grad_()
    eager = _step(net, x)
    compiled = torch.compile(net, fullgraph=True, backend=compiler)
    first = _step(compiled, x)
    again = _step(compiled, x)
    for e, c in zip(eager, first):
        torch.testing.assert_close(c, e, rtol=1e-5, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_layer_handles():
    meta = _layer(seed=97)        # a graph no other test builds: build_meta hands out one meta per graph, and this
    #                               test drops its meta and expects it gone
    h = library.register_layer(meta)
    assert library.register_layer(meta) == h and library.layer_meta(h) is meta
    with pytest.raises(TypeError, match="meta: expected a TrainingMeta"):
        library.register_layer("tables")
    del meta
    gc.collect()
    with pytest.raises(ValueError, match=f"layer: no KNN layer is registered under handle {h}"):
        library.layer_meta(h)


def test_a_copied_or_unpickled_layer_registers_its_own_tables():
    """The handle is per process and per meta: a deepcopy (then the original dropped) and a pickle round trip
    each register their meta anew, and compile to the same output as their own eager call."""
    import copy
    import io
    m1 = _layer("ODD")
    conv = KNNConv(m1.idx, m1.rf_index, nin=m1.nin, v=m1.v, cin=m1.cin, cout=m1.cout)
    x = torch.randn(2, m1.cin, m1.nin)
    clone = copy.deepcopy(conv)
    buf = io.BytesIO()
    torch.save(conv, buf)
    del conv
    gc.collect()
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for layer in (clone, loaded):
        assert library.layer_meta(layer._op_layer) is layer.meta
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(layer, fullgraph=True, backend="aot_eager")(x), layer(x))
    assert clone._op_layer != loaded._op_layer


def test_the_compiled_graph_holds_the_custom_op_and_fp64_stays_fp64():
    """What Dynamo traces is the op itself (no graph break, no inlined Python), and an fp64 layer's gradients
    under compile are fp64 and equal eager's."""
    seen = []

    def inspect(gm, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    torch._dynamo.reset()
    net, m1 = _net("torch_compact", torch.float64)
    x = torch.randn(2, m1.cin, m1.nin, dtype=torch.float64, requires_grad=True)
    eager = _step(net, x)
    compiled = _step(torch.compile(net, fullgraph=True, backend=inspect), x)
    assert sum("fovi_lab.knn_conv" in t for t in seen) == 2, seen
    compiled_aot = _step(torch.compile(net, fullgraph=True, backend="aot_eager"), x)
    for e, c, a in zip(eager, compiled, compiled_aot):
        assert a.dtype == torch.float64
        torch.testing.assert_close(c, e, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)


def test_the_fakes_check_shapes_and_an_unknown_backend_is_named():
    from torch._subclasses.fake_tensor import FakeTensorMode
    meta = _layer()
    layer = library.register_layer(meta)
    with FakeTensorMode():
        x = torch.empty(2, meta.cin + 1, meta.nin)
        w = torch.empty(meta.cout, meta.q)
        with pytest.raises(Exception, match=r"x: expected shape \[B, Cin="):
            OPS.knn_conv(x, w, None, layer, "torch_compact", torch.float32, False)
    with pytest.raises(ValueError, match="backend: unknown backend 'no_such'"):
        OPS.knn_conv(torch.randn(2, meta.cin, meta.nin), torch.randn(meta.cout, meta.q), None, layer, "no_such",
                     torch.float32, False)


def test_prepare_builds_every_table_before_a_graph_and_keeps_the_gradients():
    """``fovi_lab.ops.graphs.prepare`` (before ``torch.compile(mode="reduce-overhead")``): two eager forwards and
    backwards, after which a call of the same signature builds nothing new (no meta moved, no derived table, no
    call plan: nothing a CUDA-graph pool would hold), and the parameters' gradients are as they were."""
    from fovi_lab.graph import meta as meta_mod
    from fovi_lab.kernels.forward import api
    from fovi_lab.ops.graphs import prepare
    net, m1 = _net("warp_train", torch.float16)
    x = torch.randn(3, m1.cin, m1.nin, dtype=torch.float16, generator=torch.Generator().manual_seed(4))
    x.requires_grad_()
    l1 = net[0]
    l1.weight.grad = marker = torch.full_like(l1.weight, 7.0)
    prepare(net, x)
    assert l1.weight.grad is marker and bool((marker == 7.0).all()) and net[2].weight.grad is None
    bn = torch.nn.BatchNorm1d(m1.cin).train()              # [B, C, N] in: a training step would move its statistics
    kept = {k: v.clone() for k, v in bn.state_dict().items()}
    prepare(bn, x.float())
    assert all(torch.equal(v, bn.state_dict()[k]) for k, v in kept.items()), "prepare moved BatchNorm's statistics"

    def state():
        aux = {k: sorted(map(str, e[1])) for k, e in meta_mod._AUX.items() if e[0]() is not None}
        return len(api._CALLS), aux
    before = state()
    _step(net, x)
    assert state() == before


def test_graphed_on_the_cpu_is_the_module_itself_and_checks_its_sample():
    """On the CPU :func:`fovi_lab.ops.graphs.graphed` returns the module unchanged (the eager fallback); a sample
    that is not tensors, or on another device than the parameters, is refused naming ``sample_input``."""
    from fovi_lab.ops.graphs import graphed
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    x = torch.randn(2, 4)
    assert graphed(net, x) is net and graphed(net, (x,)) is net
    with pytest.raises(TypeError, match="sample_input: expected a tensor or a tuple of tensors, got list"):
        graphed(net, [x])
    with pytest.raises(TypeError, match="sample_input: .* got tuple holding int"):
        graphed(net, (x, 3))
    with pytest.raises(TypeError, match="sample_input: expected a tensor or a tuple of tensors, got str$"):
        graphed(net, "x")
    with pytest.raises(TypeError, match="sample_input: .* got an empty tuple"):
        graphed(net, ())
    with pytest.raises(TypeError, match="module: expected a torch.nn.Module, got function"):
        graphed(lambda t: t, x)
    with pytest.raises(TypeError, match="warmup: expected an int, got float"):
        graphed(net, x, warmup=2.5)
    with pytest.raises(ValueError, match="warmup: expected at least 1"):
        graphed(net, x, warmup=0)
    with pytest.raises(ValueError, match="autocast: expected None, torch.float16 or torch.bfloat16"):
        graphed(net, x, autocast=torch.float32)
    assert graphed(net, x, autocast=torch.float16) is net
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="sample_input: expected the sample and the module's parameters on one"):
            graphed(net, x.cuda())
