"""The ops in ordinary PyTorch GPU code (skipped without a CUDA device): side streams, the tensor's own device,
argument devices, and ``torch.compile`` with Inductor on the GPU.

* On a side stream (``with torch.cuda.stream(s)``) a train step's outputs and gradients are bitwise those of
  the default stream, and no torch op in the Warp host path synchronises (``set_sync_debug_mode("error")``
  raises on one) once the first call has compiled and checked its kernels.
* With two devices, a ``cuda:1`` layer runs on ``cuda:1`` while ``cuda:0`` is current, and equals ``cuda:0``.
* x, weight, bias and the index tables on different devices give an error naming the argument.
* ``torch.compile(fullgraph=True)`` with Inductor equals eager.
* A bf16 train step under autocast (fp32 master weights) captured in a CUDA graph replays bitwise what it ran
  eagerly, after an in-place weight update as an optimiser makes.
* ``torch.compile(mode="reduce-overhead")`` after ``fovi_lab.ops.graphs.prepare`` equals eager.
"""

from __future__ import annotations

import pytest
import torch

from fovi_lab.graph.layers import layer_meta
from fovi_lab.ops.autograd import KNNConv

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
LAYER = "res18_layer1"


def _conv(device, backend="warp_train"):
    meta = layer_meta(LAYER)
    torch.manual_seed(0)
    conv = KNNConv(meta.idx, meta.rf_index, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout, bias=True,
                   backend=backend).to(device).half()
    x = torch.randn(8, meta.cin, meta.nin, device=device, dtype=torch.float16)
    return conv, x.requires_grad_()


def _step(conv, x, net=None):
    """y, dx, dW, db of one step through ``net`` (default: the layer alone), loss = mean(y^2)."""
    x.grad = None
    conv.zero_grad()
    y = (net or conv)(x)
    y.float().square().mean().backward()
    return [y.detach().clone(), x.grad.clone(), conv.weight.grad.clone(), conv.bias.grad.clone()]


@pytest.fixture(autouse=True)
def _fresh_replay_cache():
    """No test inherits another's per-call graphs, nor the layers a capture of another test owns."""
    from fovi_lab.ops import replay
    replay.clear()
    yield
    replay.clear()


def test_side_stream_equals_default_stream_without_a_sync():
    conv, x = _conv("cuda:0")
    want = _step(conv, x)                            # compiles, runs the canaries, checks the tables
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side):
            got = _step(conv, x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(want, got))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_second_device_while_the_first_is_current():
    conv0, x0 = _conv("cuda:0")
    want = _step(conv0, x0)
    conv1, x1 = _conv("cuda:1")
    with torch.cuda.device(0):
        got = _step(conv1, x1.detach().copy_(x0.detach()).requires_grad_())
    assert all(g.device == torch.device("cuda:1") for g in got)
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(want, got))


def test_arguments_on_two_devices_name_the_argument():
    conv, x = _conv("cuda:0")
    ops = torch.ops.fovi_lab
    with pytest.raises(ValueError, match="weight: expected device cuda:0"):
        ops.knn_conv(x.detach(), conv.weight.detach().cpu(), None, conv._op_layer, "warp_train",
                     torch.float16, False)
    with pytest.raises(ValueError, match="bias: expected device cuda:0"):
        ops.knn_conv(x.detach(), conv.weight.detach(), conv.bias.detach().cpu(), conv._op_layer, "warp_train",
                     torch.float16, False)
    from fovi_lab.kernels.forward import run_uncached
    meta = conv.meta.to("cuda:0")
    with pytest.raises(ValueError, match="input_linear: expected device cuda:0"):
        run_uncached(x.detach(), conv.weight.detach(), None, meta.input_linear.cpu(), meta.weight_linear)
    with pytest.raises(ValueError, match="weight_linear: expected device cuda:0"):
        run_uncached(x.detach(), conv.weight.detach(), None, meta.input_linear, meta.weight_linear.cpu())


def test_compile_inductor_on_the_gpu_equals_eager():
    torch._dynamo.reset()
    conv, x = _conv("cuda:0")
    net = torch.nn.Sequential(conv, torch.nn.ReLU())
    want = _step(conv, x, net)
    got = _step(conv, x, torch.compile(net, fullgraph=True))
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3)


def test_bf16_autocast_step_replays_from_a_cuda_graph():
    from fovi_lab.ops.graphs import capture
    meta = layer_meta(LAYER)
    torch.manual_seed(0)
    conv = KNNConv(meta.idx, meta.rf_index, nin=meta.nin, v=meta.v, cin=meta.cin, cout=meta.cout, bias=True,
                   backend="warp_train").to("cuda:0")                     # fp32 master weights
    x = torch.randn(16, meta.cin, meta.nin, device="cuda:0").requires_grad_()

    def step():
        x.grad = None
        conv.weight.grad = conv.bias.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = conv(x)
        y.float().square().mean().backward()
        return y, x.grad, conv.weight.grad, conv.bias.grad

    cap = capture(step)
    with torch.no_grad():
        conv.weight.mul_(0.5)                                            # the optimiser's in-place update
    got = [t.clone() for t in cap.replay()]
    want = [t.clone() for t in step()]
    assert got[0].dtype == torch.bfloat16 and got[2].dtype == torch.float32
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_reduce_overhead_after_prepare_equals_eager():
    """``torch.compile(mode="reduce-overhead")`` (Inductor's CUDA graphs) of a layer + ReLU after
    :func:`fovi_lab.ops.graphs.prepare`: it compiles (no table is built inside the graphs' pool), and every
    replayed step equals the eager step."""
    from fovi_lab.ops.graphs import prepare
    torch._dynamo.reset()
    conv, x = _conv("cuda:0")
    net = torch.nn.Sequential(conv, torch.nn.ReLU())
    prepare(net, x)                        # first: the eager reference below would build the tables too
    compiled = torch.compile(net, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):                     # warm-up, recording, replays
        torch.compiler.cudagraph_mark_step_begin()
        got = _step(conv, x, compiled)
    want = _step(conv, x, net)
    for a, b in zip(want, got):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3)


def test_graphed_module_replays_the_eager_step_bitwise():
    """:func:`fovi_lab.ops.graphs.graphed` (``make_graphed_callables`` after ``prepare``) of a layer + ReLU:
    every replayed step's output and gradients are bitwise the eager step's (warp_train is deterministic); the
    module is the same object, its forward replaced, its parameters the same tensors (an optimizer over them
    steps the graphed module)."""
    from fovi_lab.ops.graphs import graphed
    conv, x = _conv("cuda:0")
    net = torch.nn.Sequential(conv, torch.nn.ReLU())
    params = list(net.parameters())
    want = _step(conv, x, net)
    from fovi_lab.ops import replay
    before = replay.stats()
    fast = graphed(net, x)
    after = replay.stats()                # its warm-ups made no per-call graphs (they would only hold memory), and
    # its capture dropped the layer's (the eager step's first call cached a signature): the whole-step graph owns it
    assert after["captured"] == before["captured"] and after["cached"] < before["cached"], (before, after)
    assert after["owned"] == before["owned"] + 1 and after["yielded"] > before["yielded"]
    assert fast is net and "forward" in vars(fast) and all(p is q for p, q in zip(fast.parameters(), params))
    for _ in range(3):
        got = _step(conv, x, fast)
        assert all(torch.equal(a, b) for a, b in zip(want, got))


def test_graphed_under_autocast_replays_the_mixed_precision_step_bitwise():
    """fp32 master weights and an fp32 input, graphed with ``autocast=torch.float16``: the replayed steps equal the
    eager step under ``torch.autocast`` bit for bit (the graphs hold autocast's casts, re-read each replay), and a
    weight change between replays reaches the output."""
    from fovi_lab.ops.graphs import graphed
    conv, x = _conv("cuda:0")
    conv = conv.float()
    x = x.detach().float().requires_grad_()
    net = torch.nn.Sequential(conv, torch.nn.ReLU())

    def amp_step(module):
        with torch.autocast("cuda", dtype=torch.float16, cache_enabled=False):
            return _step(conv, x, module)
    want = amp_step(net)
    fast = graphed(net, x, autocast=torch.float16)
    for _ in range(3):
        got = _step(conv, x, fast)                    # no autocast around the call: the graphs hold the casts
        assert all(torch.equal(a, b) for a, b in zip(want, got))
    with torch.no_grad():
        conv.weight.mul_(0.5)
    assert not torch.equal(_step(conv, x, fast)[0], want[0])
