"""fovi_lab: the compact KNN convolution of foveated vision models, in NVIDIA Warp, taught and measured.

The public API::

    from fovi_lab import KNNConv, layer_graph, build_meta, backends

    graph = layer_graph("res18_layer1")                      # a real layer's KNN graph (idx, rf_index, ...)
    conv = KNNConv.from_graph(graph, cin=64, cout=64, backend="auto")
    y = conv(x)                                              # x [B, Cin, Nin] -> y [B, Cout, Nout]
    backends()                                               # the registered backend names
    print(explain("res18_layer1", 16))                       # which kernels that call runs, and why
    print(call_plan("res18_layer1", 16))                     # the plan a call of that signature takes here

The package's folders are its layers, bottom up (no module imports a layer above its own):

    settings   every ``FOVI_*`` environment variable: one table, read on each access, validated (docs/settings.md)
    graph/     geometry (grids, KNN, taps), the real layer table, the index tables (``build_meta``)
    ops/       the reference ops, the backend registry and ``auto``, autograd (``KNNConv``), CUDA graphs
    kernels/   the Warp kernels: ``forward/``, ``adjoint/``, their plumbing and per-device validation
    knn_warp   the Warp backends (``warp_compact``, ``warp_train``) and every name of fovi's own ``knn_warp`` module
    bench/     the benchmarks that write the records under ``data/``; ``train``: a small foveated network
    lab/       what the notebooks run (widget callbacks, models, recorded figures)
    explanation  ``explain``: the kernels a call runs and why the other families are not (``python -m fovi_lab explain``)
    demo, cli  ``python -m fovi_lab {demo, explain, bench, tune, warmup, ...}``
"""

from fovi_lab.graph.layers import layer_graph
from fovi_lab.graph.meta import TrainingMeta, build_meta
from fovi_lab.ops.autograd import KNNConv, KNNConvFunction
from fovi_lab.ops.registry import OPS_REGISTRY, load_optional_backends
from fovi_lab.explanation import explain

__version__ = "0.1.0"
__all__ = ["KNNConv", "KNNConvFunction", "TrainingMeta", "backends", "build_meta", "call_plan", "explain",
           "layer_graph", "__version__"]


def backends() -> list:
    """The registered backend names (the Warp ones when warp-lang imports), plus ``"auto"``."""
    load_optional_backends()
    return sorted(OPS_REGISTRY) + ["auto"]


def call_plan(layer, batch: int, dtype="fp16", device=None, rf=None):
    """The plan a ``warp_train`` call of ``layer`` at ``batch`` in ``dtype`` on ``device`` takes on this machine: its
    forward kernel and its dx / dW kernels, decided once per call signature (printing it says them in words). See
    :func:`fovi_lab.kernels.call_plan.call_plan`; needs warp-lang."""
    from fovi_lab.kernels.call_plan import call_plan as plan
    return plan(layer, batch, dtype, device, rf)
