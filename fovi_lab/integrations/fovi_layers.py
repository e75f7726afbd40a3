"""fovi's own KNN conv layers for the benchmarks: :func:`fovi_layer` builds fovi's layer of a table layer,
:func:`fovi_steps` / :func:`fovi_forwards` time fovi's backends on it beside ours, and the ``fovi:`` layer names
(:func:`network_layers`, :func:`expand_network_layers`) reach the distinct layers of fovi's own networks.
Importing this module adds ``fovi:`` to the layers the benchmarks' ``--layers`` accept.
"""

from __future__ import annotations

import copy
import functools
import weakref
from collections import OrderedDict
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from fovi_lab.graph.meta import TrainingMeta
from fovi_lab.ops.arguments import add_layer_source
from fovi_lab.integrations.fovi_networks import _knn_layers, fovi_network, NETWORKS
from fovi_lab.integrations.fovi_registry import _fovi, _lab_meta

__all__ = ["fovi_layer", "BASELINE_BACKENDS", "fovi_steps", "fovi_forwards", "FoviSteps", "NETWORK_LAYER_PREFIX",
           "NETWORK_RES", "network_layers", "network_layer_meta", "expand_network_layers"]


#: fovi's own backends a fovi user has for a train step, timed beside fovi_lab's: its per-layer choice, its fused
#: CuPy kernel, its dense one-hot einsum, its compact PyTorch op and its copy of the seed's Warp kernels.
BASELINE_BACKENDS = ("auto", "cuda", "baseline", "torch_compact", "warp_train")


def fovi_layer(layer: str, device="cpu", bias: bool = False) -> torch.nn.Module:
    """fovi's own ``KNNConvLayer`` of the table layer ``layer`` (:data:`fovi_lab.graph.layers.LAYERS`): the same
    sampling grids (fovi's ``get_in_out_coords`` at the layer's strides of the 64 x 64 budget, isotropic, field of
    view 16), neighbours and reference frame, so its tables are the ones fovi_lab builds for the layer."""
    import math
    import warnings

    from fovi_lab.graph.layers import LAYERS, RES, RF_MULT

    _fovi()
    from fovi.arch.knn import KNNConvLayer, get_in_out_coords

    if layer not in LAYERS:
        raise ValueError(f"layer: expected one of the table's layers ({', '.join(LAYERS)}), got {layer!r}")
    spec = LAYERS[layer]
    side = spec.ref_side or math.ceil(RF_MULT[spec.rf] * math.sqrt(spec.k))   # the patch embed: its own 16 x 16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                  # torch.meshgrid's indexing warning inside fovi
        in_coords, out_coords, _ = get_in_out_coords(
            RES // spec.in_stride, 16.0, spec.a, spec.out_stride // spec.in_stride, style="isotropic",
            auto_match_cart_resources=1, in_cart_res=RES // spec.in_stride, device=str(device))
        conv = KNNConvLayer(spec.cin, spec.cout, spec.k, in_coords, out_coords, device=str(device),
                            sample_cortex=True, bias=bias, ref_frame_side_length=side)
    return conv.to(device)


class FoviSteps(dict):
    """fovi's train steps of one layer by name (see :func:`fovi_steps`), and :meth:`reference`."""

    def __init__(self, layer: torch.nn.Module, steps: Dict[str, object]):
        super().__init__(steps)
        self.layer = layer

    def reference(self, x, w, g):
        """``(y, dx, dW)`` in fp32 through the same fovi layer: its ``baseline`` backend (the dense one-hot einsum)
        on fp32 copies of the operands. fovi's tables for a layer are its own (fovi_lab's graph of the same layer
        has the same shapes, not necessarily the same neighbours), so fovi's steps are judged against this."""
        conv = copy.deepcopy(self.layer).float()
        conv.kernel_backend = "baseline"
        with torch.no_grad():
            conv.weight.copy_(w.float())
        xr = x.detach().float().requires_grad_()
        with torch.autocast(x.device.type, enabled=False):
            y = conv(xr)
        dx, dw = torch.autograd.grad(y, (xr, conv.weight), g.float())
        return y.detach(), dx, dw


@functools.lru_cache(maxsize=32)
def _base_layer(layer: str, device: torch.device, bias: bool) -> torch.nn.Module:
    """fovi's layer of a table layer, or a copy of a layer of fovi's own network (:func:`network_layers`), built
    once per (layer, device, bias) for the benchmarks, which time it at several batches (building fovi's tables
    takes up to a second); callers use copies of it, never it."""
    if layer.startswith(NETWORK_LAYER_PREFIX):
        conv = copy.deepcopy(_network_layer(layer, device))
        if bias and conv.bias is None:
            raise ValueError(f"layer: {layer!r} has no bias in fovi's network")
        return conv
    return fovi_layer(layer, device, bias=bias)


#: How the benchmarks name a KNN conv layer of fovi's own networks: ``fovi:<net>@<in_res>:<i>``, the i-th distinct
#: layer (its tables and channels; layers of one graph and channels count once) of ``fovi_network(net,
#: in_res=in_res)`` in the network's order; ``fovi:<net>@<in_res>`` names them all, ``fovi:all`` both networks at
#: every side of :data:`NETWORK_RES`.
NETWORK_LAYER_PREFIX = "fovi:"
#: The sides of the Cartesian budget ``fovi:all`` takes the networks at.
NETWORK_RES = (64, 128)


def _parse_network_layer(name: str) -> Tuple[str, int, Optional[int]]:
    """``(net, in_res, i or None)`` of a ``fovi:`` name; ValueError naming what is wrong."""
    body = name[len(NETWORK_LAYER_PREFIX):]
    net, at, rest = body.partition("@")
    side, colon, index = rest.partition(":")
    if net not in NETWORKS or not at or not side.isdigit() or (colon and not index.isdigit()):
        raise ValueError(f"layer: {name!r}: expected fovi:<net>@<in_res>[:<i>] with net one of "
                         f"{', '.join(NETWORKS)} (fovi:resnet18@64:0, fovi:alexnet@128), or fovi:all")
    return net, int(side), int(index) if colon else None


def network_layers(net: str, in_res: int = 64, device="cpu") -> "OrderedDict[str, torch.nn.Module]":
    """The distinct KNN conv layers of fovi's own ``net`` built with ``in_res`` (:func:`fovi_network`) on ``device``
    (a fovi layer keeps its tables as plain attributes, which ``Module.to`` leaves where they are), by their
    benchmark names (:data:`NETWORK_LAYER_PREFIX`): layers of one graph and the same channels count once
    (they share one fovi_lab meta). fovi 2.4.0's ResNet-18 at in_res 64 has 11 (its stem 3 -> 64 channels over
    5,977 -> 1,469 nodes); the table's layers (:data:`fovi_lab.graph.layers.LAYERS`) are another geometry."""
    return _network_layers(net, in_res, str(torch.device(device)))


@functools.lru_cache(maxsize=8)
def _network_layers(net: str, in_res: int, device: str) -> "OrderedDict[str, torch.nn.Module]":
    from fovi.arch.knn_autograd import ensure_training_metadata
    model = fovi_network(net, device, n_classes=10, in_res=in_res)
    got: "OrderedDict[str, torch.nn.Module]" = OrderedDict()
    seen = set()
    for layer in _knn_layers(model):
        meta = _lab_meta(ensure_training_metadata(layer, layer.weight.device))
        if id(meta) not in seen:
            seen.add(id(meta))
            got[f"{NETWORK_LAYER_PREFIX}{net}@{in_res}:{len(seen) - 1}"] = layer
    return got


def _network_layer(name: str, device="cpu") -> torch.nn.Module:
    net, res, i = _parse_network_layer(name)
    layers = network_layers(net, res, device)
    if i is None or name not in layers:
        raise ValueError(f"layer: {name!r}: fovi's {net} at in_res {res} has {len(layers)} distinct KNN layers, "
                         f"{next(iter(layers))} to {next(reversed(layers))}")
    return layers[name]


def network_layer_meta(name: str, device="cpu") -> TrainingMeta:
    """fovi_lab's meta of the fovi network layer ``name`` (``fovi:<net>@<in_res>:<i>``), built from fovi's own
    tables (and checked against them), on ``device``."""
    from fovi.arch.knn_autograd import ensure_training_metadata
    return _lab_meta(ensure_training_metadata(_network_layer(name), torch.device("cpu"))).to(device)


def _expand_with_fovi(name: str) -> List[str]:
    try:
        _fovi()
    except ImportError as exc:
        raise ImportError(f"the layers of fovi's networks need fovi: {exc}") from None
    return expand_network_layers(name)


def expand_network_layers(name: str) -> List[str]:
    """The layer names a ``fovi:`` name stands for: itself for one layer, every distinct layer of the network at that
    side for ``fovi:<net>@<in_res>``, both networks at every side of :data:`NETWORK_RES` for ``fovi:all``;
    ValueError (naming the argument) for a name that is none of those or a layer the network does not have."""
    if name == NETWORK_LAYER_PREFIX + "all":
        return [n for net in NETWORKS for res in NETWORK_RES for n in network_layers(net, res)]
    net, res, i = _parse_network_layer(name)
    if i is None:
        return list(network_layers(net, res))
    _network_layer(name)
    return [name]


def _per_backend(base: torch.nn.Module, backends) -> Iterator[tuple]:
    """Per backend: ``(backend, a copy of fovi's layer base with kernel_backend = backend, its _Prepared)``."""
    for backend in backends:
        conv = copy.deepcopy(base)
        conv.kernel_backend = backend
        yield backend, conv, _Prepared(conv)


class _Prepared:
    """fovi's layer set up once for the operands it is timed on (their dtype, the weight's values, the bias), not
    per call: a timed call then costs what fovi's own call costs. The layer takes x's dtype, so with the fp16
    operands the benchmarks give ours, fovi's runs in fp16 as well (its dispatch takes fp16 CUDA tensors without
    autocast): no weight or gradient casts that ours does not have either."""

    def __init__(self, conv):
        self.conv, self.key, self.held = conv, None, (None, None)

    def __call__(self, x, w, bias=None) -> bool:
        """Set the layer up for these operands where they are not the ones it holds; True where it did."""
        key = (x.dtype, x.device, w._version, None if bias is None else bias._version)
        held_w, held_b = (None if r is None else r() for r in self.held)
        if key == self.key and held_w is w and held_b is bias:
            return False
        conv = self.conv
        with torch.no_grad():
            conv.to(x.dtype)
            conv.weight.copy_(w)
            if bias is not None:
                conv.bias.copy_(bias)
        self.key = key
        self.held = (weakref.ref(w), None if bias is None else weakref.ref(bias))
        return True


def fovi_steps(layer: str, device="cpu", backends=BASELINE_BACKENDS) -> FoviSteps:
    """fovi's train step of ``layer`` per backend: ``{"fovi_<backend>": fn(x, w, g) -> (y, dx, dW)}``, autograd
    through fovi's own layer (:func:`fovi_layer`) with ``kernel_backend = backend`` and its weight set to ``w``;
    ``.reference(x, w, g)`` is the fp32 result to judge them by (:meth:`FoviSteps.reference`). The layer runs in
    ``x``'s dtype (fovi dispatches ``cuda`` and ``warp_train`` for fp16 CUDA tensors), as ours is timed on the same
    operands. It is set up for ``w`` once; each later step bumps its weight's version, as an optimizer's in-place
    update does (and as the benchmarks do for ours), so no backend reuses a layout of the previous step's weight,
    and no copy is timed. A backend fovi refuses on this device or dtype raises fovi's error when called."""
    device = torch.device(device)
    base = _base_layer(layer, device, False)
    steps = {}
    for backend, conv, prepared in _per_backend(base, backends):

        def step(x, w, g, conv=conv, prepare=prepared):
            if not prepare(x, w):
                torch.autograd.graph.increment_version(conv.weight)
            xr = x.detach().requires_grad_()
            y = conv(xr)
            dx, dw = torch.autograd.grad(y, (xr, conv.weight), g.to(y.dtype))
            return y, dx, dw
        steps[f"fovi_{backend}"] = step
    return FoviSteps(base, steps)


def fovi_forwards(layer: str, device="cpu", backends=BASELINE_BACKENDS, bias: bool = False) -> FoviSteps:
    """fovi's inference forward of ``layer`` per backend: ``{"fovi_<backend>": fn(x, w, b) -> y}`` through fovi's
    own layer (with a bias where ``bias``), under ``torch.no_grad``, in x's dtype, set up for the operands once (as
    :func:`fovi_steps`); ``.reference(x, w)`` is fovi's fp32 result of its own layer."""
    device = torch.device(device)
    base = _base_layer(layer, device, bias)
    fwd = {}
    for backend, conv, prepared in _per_backend(base, backends):

        def forward(x, w, b=None, conv=conv, prepare=prepared):
            prepare(x, w, b)
            with torch.no_grad():
                return conv(x)
        fwd[f"fovi_{backend}"] = forward
    return _FoviForwards(base, fwd)


class _FoviForwards(FoviSteps):
    """fovi's forwards of one layer by name (see :func:`fovi_forwards`), and :meth:`reference`."""

    def reference(self, x, w, b=None):
        """fovi's fp32 forward of its own layer (``baseline``: the dense one-hot einsum) on fp32 copies."""
        conv = copy.deepcopy(self.layer).float()
        conv.kernel_backend = "baseline"
        with torch.no_grad():
            conv.weight.copy_(w.float())
            if b is not None:
                conv.bias.copy_(b.float())
            with torch.autocast(x.device.type, enabled=False):
                return conv(x.float())


add_layer_source(NETWORK_LAYER_PREFIX, _expand_with_fovi)        # --layers fovi:... in the benchmarks
