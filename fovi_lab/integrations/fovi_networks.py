"""fovi's own networks run on fovi_lab's backends: :func:`fovi_network` builds fovi's KNN AlexNet and ResNet-18,
:func:`fovi_backend` sets fovi's kernel backend of every KNN conv layer, :func:`fovi_lab_inside` runs them on a
fovi_lab backend through fovi's registry, and :func:`knn_stubbed` stands them in by place-holders (what the rest of
a train step costs).
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from pathlib import Path
from typing import Dict, Iterator, List

import torch

from fovi_lab.graph.meta import TrainingMeta
from fovi_lab.integrations.fovi_registry import (_fovi, _lab_meta, _META_ATTR, INSTALL, register_with_fovi,
                                                 TESTED_RELEASE, unregister_from_fovi)

__all__ = ["NETWORKS", "fovi_network", "conv_layers", "fovi_backend", "fovi_lab_inside", "knn_stubbed", "lab_metas"]


#: The networks :func:`fovi_network` builds: fovi's KNNAlexNet and its KNNResNet with ResNet-18's blocks.
NETWORKS = ("alexnet", "resnet18")


def _fovi_models_module(name: str):
    """``fovi.models.<name>``. ``fovi.models``' package init requires the training stack of fovi's other models
    (timm, transformers, hydra, ...), which the KNN AlexNet and ResNet modules do not import: where that init fails
    for a missing dependency, the module is loaded from fovi's ``models`` folder under a bare package object that
    is taken out of ``sys.modules`` again (so a later ``import fovi.models`` still says what it lacks)."""
    try:
        return importlib.import_module(f"fovi.models.{name}")
    except ImportError:
        pass
    _fovi()
    import fovi
    folder = Path(fovi.__file__).resolve().parent / "models"
    if not (folder / f"{name}.py").is_file():
        raise ImportError(f"fovi {getattr(fovi, '__version__', '?')} has no fovi/models/{name}.py (this integration "
                          f"follows fovi {TESTED_RELEASE}); install it with: {INSTALL}")
    bare = types.ModuleType("fovi.models")
    bare.__path__ = [str(folder)]
    bare.__package__ = "fovi.models"
    had = sys.modules.get("fovi.models")
    sys.modules["fovi.models"] = bare
    try:
        return importlib.import_module(f"fovi.models.{name}")
    finally:
        if had is None:
            sys.modules.pop("fovi.models", None)
        else:
            sys.modules["fovi.models"] = had


@contextlib.contextmanager
def _fovi_refusal(net: str, in_res: int) -> Iterator[None]:
    """Inside: fovi's constructor refusing the foveated configuration (its strides shrink the sampling radii below
    one node at a small ``in_res``) comes out as a ValueError naming ``in_res``, with fovi's words."""
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"in_res: fovi's {net} cannot be built on a {in_res}-pixel grid (fovi: {exc}); its "
                         f"strides need a larger one (64, the default, builds both networks)") from None


def fovi_network(net: str, device="cpu", n_classes: int = 1000, in_res: int = 64) -> torch.nn.Module:
    """fovi's own network ``net`` (:data:`NETWORKS`), built by its class with the class's default foveated
    configuration (field of view 16, cortical magnification ``a`` = 0.5, isotropic sampling, batch norm) at
    ``in_res`` (the side of the Cartesian grid the retinal samples are matched to), with a linear classifier of
    ``n_classes``:

    * ``alexnet``: ``fovi.models.knnalexnet.KNNAlexNet`` with the layers of fovi's ``base`` AlexNet
      (``fovi.models.alexnet.baseline_alexnet_kernels``: channels 96-256-384-384-256, kernel sides 11-5-3-3-3 as
      neighbourhoods of 121-25-9-9-9, strides 4-1-1-1-1) and pooling after layers 0, 1 and 4, as fovi's
      ``fovi_alexnet2023`` builds it;
    * ``resnet18``: ``fovi.models.knnresnet.KNNResNet`` with basic blocks ``[2, 2, 2, 2]``.

    Its input is ``[B, 3, N]``: the retinal samples, ``N`` = ``model.fovi_lab_nin`` (set here). Raises ValueError
    for an unknown ``net``, an ``n_classes`` or ``in_res`` that is not an integer >= 1, or an ``in_res`` too small
    for the network's strides (fovi's own refusal, in its words); ImportError where fovi does not import (the
    message gives the install lines)."""
    if net not in NETWORKS:
        raise ValueError(f"net: expected one of {', '.join(NETWORKS)}, got {net!r}")
    for arg, value in (("n_classes", n_classes), ("in_res", in_res)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{arg}: expected an integer >= 1, got {value!r}")
    import warnings

    with warnings.catch_warnings(), _fovi_refusal(net, in_res):
        warnings.simplefilter("ignore")                  # torch.meshgrid's indexing warning inside fovi
        if net == "alexnet":
            kernels = _fovi_models_module("alexnet").baseline_alexnet_kernels["base"]
            model = _fovi_models_module("knnalexnet").KNNAlexNet(
                in_res=in_res, in_channels=3, features_per_layer=[int(k[0]) for k in kernels],
                stride_per_layer=[int(k[2]) for k in kernels], pool_after=[0, 1, 4],
                k_per_layer=[int(k[1]) ** 2 for k in kernels], n_classes=n_classes, device=str(device))
        else:
            with contextlib.redirect_stdout(None):
                model = _fovi_models_module("knnresnet").KNNResNet(layers=[2, 2, 2, 2], in_res=in_res,
                                                                    num_classes=n_classes, device=str(device))
    model = model.to(device)
    model.fovi_lab_nin = int(conv_layers(model)[0].in_coords.shape[0])
    return model


def lab_metas(model: torch.nn.Module) -> List[TrainingMeta]:
    """The fovi_lab metas built so far for the KNN conv layers of fovi's ``model`` (each layer's fovi meta caches its
    own, on each device it ran on), each once: layers of one graph share theirs
    (:func:`fovi_lab.graph.meta.build_meta`). What :func:`fovi_lab.graph.meta.held_bytes` sums for the tables
    fovi_lab keeps inside fovi's networks."""
    got: Dict[int, TrainingMeta] = {}
    for layer in _knn_layers(model):
        fovi_meta = getattr(layer, "_knn_training_metadata", None)
        meta = getattr(fovi_meta, _META_ATTR, None) if fovi_meta is not None else None
        if meta is not None:
            got.setdefault(id(meta), meta)
    return list(got.values())


def conv_layers(model: torch.nn.Module) -> List[torch.nn.Module]:
    """The KNN conv layers of a fovi network (the modules with a ``kernel_backend``), in order."""
    return [m for m in model.modules() if hasattr(m, "kernel_backend") and hasattr(m, "weight")]


def _knn_layers(model) -> List[torch.nn.Module]:
    """:func:`conv_layers` of ``model``, which must hold some: a model without them would run unchanged inside a
    context meant to change its layers' backend, so it is refused (ValueError naming ``model``)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: expected a torch.nn.Module (a fovi network), got {type(model).__name__}")
    layers = conv_layers(model)
    if not layers:
        raise ValueError(f"model: expected a fovi network with KNN conv layers (modules with a kernel_backend), "
                         f"got a {type(model).__name__} with none")
    return layers


@contextlib.contextmanager
def fovi_backend(model: torch.nn.Module, backend: str) -> Iterator[torch.nn.Module]:
    """Inside: every KNN conv layer of ``model`` has fovi's ``kernel_backend = backend`` (one of fovi's
    ``VALID_BACKENDS``, checked: ValueError naming ``backend`` and the valid ones); restored on exit."""
    _, dispatch_module = _fovi()
    valid = sorted(dispatch_module.VALID_BACKENDS)
    if backend not in valid:
        raise ValueError(f"backend: expected one of fovi's backends {valid}, got {backend!r}")
    layers = _knn_layers(model)
    saved = [m.kernel_backend for m in layers]
    for m in layers:
        m.kernel_backend = backend
    try:
        yield model
    finally:
        for m, b in zip(layers, saved):
            m.kernel_backend = b


@contextlib.contextmanager
def _forwards_replaced(layers, make) -> Iterator[None]:
    """Inside: each layer's ``forward`` is ``make(layer)``, set on the layer itself; on exit each has the forward it
    had (its class's, or one set on it before)."""
    saved = [vars(m).get("forward") for m in layers]
    for m in layers:
        m.forward = make(m)
    try:
        yield
    finally:
        for m, f in zip(layers, saved):
            if f is None:
                del m.forward
            else:
                m.forward = f


@contextlib.contextmanager
def fovi_lab_inside(model: torch.nn.Module, backend: str = "warp_train", device=None) -> Iterator[str]:
    """Inside: every KNN conv layer of fovi's ``model`` runs fovi_lab's ``backend`` through fovi's own autograd
    Function and registry. On a CUDA ``device`` as fovi's ``kernel_backend="warp_train"`` with fovi_lab registered
    under that name (:func:`register_with_fovi`; fovi dispatches it for float16 inputs or under float16 autocast);
    elsewhere through ``fovi.arch.knn_autograd.compact_forward(layer, x, ops_name="fovi_lab_<backend>")``, since
    fovi's dispatch refuses ``warp_train`` off CUDA; there ``backend="auto"`` runs, per call, the form fovi_lab's
    ``auto`` picks for the layer's shape and mode (:func:`_auto_route`: on the CPU the fastest CPU form, never one
    auto measured slower than another). Yields the route taken, in words; on exit fovi's registry entries, the
    layers' backends and their forwards are as they were."""
    registry_module, _ = _fovi()
    layers = _knn_layers(model)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    if device.type == "cuda":
        register_with_fovi("warp_train", backend)
        try:
            with fovi_backend(model, "warp_train"):
                yield f"fovi's dispatch, kernel_backend='warp_train' (fovi_lab's {backend} registered as it)"
        finally:
            unregister_from_fovi("warp_train")
        return
    if backend == "auto":
        yield from _auto_route(layers, registry_module)
        return
    compact_forward = registry_module.compact_forward
    name = f"fovi_lab_{backend}"
    register_with_fovi(name, backend)

    def routed(layer):
        def forward(x):
            return layer._mask_invalid_outputs(compact_forward(layer, x, ops_name=name))
        return forward

    try:
        with _forwards_replaced(layers, routed):
            yield f"fovi.arch.knn_autograd.compact_forward(layer, x, ops_name={name!r})"
    finally:
        unregister_from_fovi(name)


def _auto_route(layers, registry_module) -> Iterator[str]:
    """:func:`fovi_lab_inside`'s route for ``backend="auto"`` off CUDA: per call, the mode (train step when grad is
    enabled and x or the layer's weight requires it, else forward) and the compute dtype are read outside fovi's
    autograd Function, fovi_lab's ``auto`` picks the backend for the layer's shape (on the CPU the fastest CPU form,
    :mod:`fovi_lab.ops.cpu_auto`: measured once per machine, or estimated), and the call runs through
    ``compact_forward(layer, x, ops_name="fovi_lab_<backend>")``, each backend registered at its first pick."""
    from fovi_lab.ops.autograd import _compute_dtype
    from fovi_lab.ops.dispatch import select_backend

    compact_forward = registry_module.compact_forward
    names: List[str] = []

    def routed(layer):
        def forward(x):
            meta = _lab_meta(registry_module.ensure_training_metadata(layer, x.device))
            training = torch.is_grad_enabled() and (x.requires_grad or layer.weight.requires_grad)
            backend = select_backend("auto", meta, x, training, dtype=_compute_dtype(x))
            name = f"fovi_lab_{backend}"
            if name not in names:
                register_with_fovi(name, backend)
                names.append(name)
            layer.fovi_lab_last_backend = backend
            return layer._mask_invalid_outputs(compact_forward(layer, x, ops_name=name))
        return forward

    try:
        with _forwards_replaced(layers, routed):
            yield "fovi.arch.knn_autograd.compact_forward(layer, x, ops_name='fovi_lab_<the form auto picks>')"
    finally:
        for name in names:
            unregister_from_fovi(name)


class _StubConv(torch.autograd.Function):
    """A KNN conv layer's place-holder: zeros of the output's shape forward, zero gradients for x (where it needs
    one) and the weight backward. What it costs is a memset per tensor and its launch, the least a layer can cost;
    those count as the rest of the step, so the KNN layers' share taken against it is a slight underestimate."""

    @staticmethod
    def forward(ctx, x, weight, cout: int, nout: int, dtype: torch.dtype):
        ctx.shapes = (x.shape, x.dtype, weight.shape, weight.dtype)
        return x.new_zeros((x.shape[0], cout, nout), dtype=dtype)

    @staticmethod
    def backward(ctx, grad_y):
        xs, xd, ws, wd = ctx.shapes
        need_x, need_w = ctx.needs_input_grad[:2]
        return (grad_y.new_zeros(xs, dtype=xd) if need_x else None,
                grad_y.new_zeros(ws, dtype=wd) if need_w else None, None, None, None)


@contextlib.contextmanager
def knn_stubbed(model: torch.nn.Module) -> Iterator[str]:
    """Inside: every KNN conv layer of fovi's ``model`` is a place-holder (zeros out, zero gradients for its input
    and weight, :class:`_StubConv`), so a train step costs what the rest of the network costs (batch norm,
    activations, pooling, the head, the loss, the optimizer over every parameter): the floor any KNN backend
    stands on. Under CUDA autocast its output has the autocast dtype, as fovi's layer's has. Yields the route in words;
    on exit the layers' forwards are as they were."""
    layers = _knn_layers(model)

    def stub(layer):
        cout, nout = int(layer.weight.shape[0]), int(layer.out_coords.shape[0])

        def forward(x):               # fovi computes in CUDA autocast's dtype, else in x's
            cuda = x.device.type == "cuda" and torch.is_autocast_enabled("cuda")
            return _StubConv.apply(x, layer.weight, cout, nout, torch.get_autocast_dtype("cuda") if cuda else x.dtype)
        return forward

    with _forwards_replaced(layers, stub):
        yield "every KNN conv layer stubbed: zeros out, zero gradients"
