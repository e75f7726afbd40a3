"""fovi_lab's backends inside fovi: :func:`register_with_fovi` and its reverse, :func:`unregister_from_fovi`.

fovi runs the compact backends of its ``KNNConvLayer`` through one registry,
``fovi.arch.knn_autograd.OPS_REGISTRY`` (name -> ops object), from its own autograd Function
(``fovi.arch.knn_autograd.KNNConvFunction``). The contract is the one :mod:`fovi_lab.ops.registry` states,
called with fovi's ``TrainingMeta`` instead of fovi_lab's::

    forward(meta, x, weight, bias)        -> y  [B, Cout, Nout]   (compute dtype; inputs contiguous)
    grad_input(meta, grad_y, weight)      -> dx [B, Cin, Nin]     fp32
    grad_weight(meta, grad_y, x)          -> dW [Cout, Cin*V]     fp32
    backward_combined(meta, g, x, weight) -> (dx, dW)             optional; fovi uses it when both are needed

:func:`register_with_fovi` puts an adapter there that hands a fovi_lab backend fovi_lab's meta of the same layer.
That meta is rebuilt from fovi's tables (the neighbour ids and taps are channel 0's columns of fovi's
``input_linear`` / ``weight_linear``) with :func:`fovi_lab.graph.meta.build_meta`, and every table it derives
(``input_linear``, ``weight_linear``, ``rev_rowptr``, ``rev_col``) must equal fovi's, else the call raises
``ValueError`` naming the table and no kernel runs. It is built once per fovi meta and kept on it
(``_fovi_lab_meta``), so it lives as long as fovi's own cache of the layer's tables.

fovi's dispatch stays fovi's: ``fovi.arch.knn_optimization.select_backend`` sends a layer with
``kernel_backend="warp_train"`` to the registry only for CUDA tensors in float16 (or under float16 autocast),
and refuses it elsewhere; the adapter changes which code runs under the name, not when fovi picks it. An entry
under a name fovi's layers do not know is reached through ``fovi.arch.knn_autograd.compact_forward(layer, x,
ops_name=name)``, fovi's layer-level entry point to the registry (the same Function, without the dispatch).

fovi imports the module that registers ``warp_train`` (``fovi.arch.knn_warp``; likewise ``cuda``,
``gather_gemm``) lazily, at the first forward that selects it, and that import writes fovi's own entry. So
:func:`register_with_fovi` imports it first (when it can be imported), and the entry it then writes stays.

fovi is an optional dependency: ``pip install "fovi-lab[fovi]"`` brings the pure-Python modules ``fovi.arch``
imports, and ``pip install --no-deps fovi==2.4.0`` fovi itself, without its CUDA-only (cupy-cuda12x) and
training-only (torchvision) dependencies.

**fovi's networks.** :func:`fovi_network` builds fovi's own ``KNNAlexNet`` and ``KNNResNet`` (ResNet-18) from
``fovi.models``; :func:`fovi_backend` sets the kernel backend of every KNN conv layer of a network by fovi's name,
and :func:`fovi_lab_inside` runs them on a fovi_lab backend through fovi's registry: on CUDA in float16 (or under
float16 autocast) as fovi's own ``kernel_backend="warp_train"`` (what :func:`register_with_fovi` is for), elsewhere
(where fovi's dispatch refuses ``warp_train``) through ``compact_forward`` under a name of its own.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import sys
import threading
import types
import weakref
from pathlib import Path
from collections import OrderedDict
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from fovi_lab.graph.meta import TrainingMeta, build_meta
from fovi_lab.ops.arguments import add_layer_source
from fovi_lab.ops.registry import get_ops

__all__ = ["register_with_fovi", "unregister_from_fovi", "TESTED_RELEASE", "INSTALL", "NETWORKS", "fovi_network",
           "conv_layers", "fovi_backend", "fovi_lab_inside", "knn_stubbed", "fovi_layer", "BASELINE_BACKENDS",
           "fovi_steps", "fovi_forwards", "FoviSteps", "lab_metas", "NETWORK_LAYER_PREFIX", "NETWORK_RES",
           "network_layers", "network_layer_meta", "expand_network_layers"]

#: The fovi release this integration is written and tested against (its registry contract and table layout).
TESTED_RELEASE = "2.4.0"

#: The install lines that give a working ``fovi.arch`` on any machine, CPU included.
INSTALL = f'pip install "fovi-lab[fovi]" && pip install --no-deps fovi=={TESTED_RELEASE}'

#: fovi's registry names whose entry fovi writes by importing a module on first use (fovi.arch.knn_optimization).
_OWNER_MODULES = {
    "warp_train": "fovi.arch.knn_warp",
    "cuda": "fovi.arch.knn_cuda",
    "gather_gemm": "fovi.arch.knn_gather_gemm",
}

#: fovi's training-capable backend that runs on native autograd, not through the registry.
_OFF_REGISTRY_TRAINING = {"torch_scatter"}

_META_ATTR = "_fovi_lab_meta"
_ADAPTER_FLAG = "_fovi_lab_adapter"
_ABSENT = object()
_LOCK = threading.Lock()
_SAVED: Dict[str, object] = {}          # name -> fovi's entry before the first register_with_fovi(name)


def _fovi():
    """fovi's registry module and dispatch module, or an ImportError naming the install lines."""
    try:
        import fovi.arch.knn                                  # noqa: F401  (the layers: einops, scikit-image, trimesh)
        import fovi.arch.knn_autograd as registry_module
        import fovi.arch.knn_optimization as dispatch_module
    except ImportError as exc:
        raise ImportError(f"fovi_lab.integrations.fovi needs fovi's fovi.arch, which does not import here "
                          f"({type(exc).__name__}: {exc}); install it with: {INSTALL}") from exc
    missing = [n for n in ("OPS_REGISTRY", "register_ops", "TrainingMeta") if not hasattr(registry_module, n)]
    missing += [n for n in ("VALID_BACKENDS", "TRAIN_CAPABLE_BACKENDS") if not hasattr(dispatch_module, n)]
    if missing:
        import fovi
        raise ImportError(f"fovi {getattr(fovi, '__version__', '?')} lacks {', '.join(missing)} of the ops-registry "
                          f"contract this integration follows (fovi {TESTED_RELEASE}); install it with: {INSTALL}")
    return registry_module, dispatch_module


def _check_name(name) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name: expected a registry name (str), got {type(name).__name__}")
    if not name:
        raise ValueError("name: expected a non-empty registry name")
    return name


def _lab_meta(fovi_meta) -> TrainingMeta:
    """fovi_lab's :class:`TrainingMeta` of the layer fovi's ``fovi_meta`` describes, on the same device (cached on
    ``fovi_meta``); ``ValueError`` naming the first table where the two packages' layouts disagree."""
    got = getattr(fovi_meta, _META_ATTR, None)
    if got is not None:
        return got
    fields = ("cin", "cout", "nin", "nout", "k", "v", "p", "p64", "q", "input_linear", "weight_linear",
              "rev_rowptr", "rev_col", "device")
    lacking = [f for f in fields if not hasattr(fovi_meta, f)]
    if lacking:
        raise TypeError(f"meta: expected fovi's TrainingMeta (fovi.arch.knn_autograd), got "
                        f"{type(fovi_meta).__name__} without {', '.join(lacking)}")
    k, nin = int(fovi_meta.k), int(fovi_meta.nin)
    # channel 0's columns: input_linear = idx (or the pad column Cin*Nin), weight_linear = the tap
    first = fovi_meta.input_linear[:, :k].to("cpu", torch.int64)
    idx = torch.where(first < nin, first, torch.full_like(first, nin))
    taps = fovi_meta.weight_linear[:, :k].to("cpu", torch.int64)
    try:
        meta = build_meta(idx, taps, cin=int(fovi_meta.cin), cout=int(fovi_meta.cout), v=int(fovi_meta.v), nin=nin)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"meta: fovi's tables do not describe a layer fovi_lab can build: {exc}") from None
    for name in ("nout", "p", "p64", "q"):
        if int(getattr(fovi_meta, name)) != getattr(meta, name):
            raise ValueError(f"meta.{name}: fovi has {getattr(fovi_meta, name)}, fovi_lab builds {getattr(meta, name)} "
                             f"from the same graph (this integration follows fovi {TESTED_RELEASE}'s layout)")
    for name in ("input_linear", "weight_linear", "rev_rowptr", "rev_col"):
        theirs, ours = getattr(fovi_meta, name).cpu(), getattr(meta, name)
        if tuple(theirs.shape) != tuple(ours.shape):
            raise ValueError(f"meta.{name}: fovi's table has shape {tuple(theirs.shape)}, fovi_lab builds "
                             f"{tuple(ours.shape)} from the same graph (this integration follows fovi "
                             f"{TESTED_RELEASE}'s layout)")
        differ = int((theirs.to(torch.int64) != ours.to(torch.int64)).sum())
        if differ:
            raise ValueError(f"meta.{name}: {differ} entries of fovi's table differ from the one fovi_lab builds from "
                             f"the same graph (this integration follows fovi {TESTED_RELEASE}'s layout)")
    meta = meta.to(fovi_meta.device)
    try:
        setattr(fovi_meta, _META_ATTR, meta)
    except AttributeError:                      # a meta type without a __dict__: rebuilt per call
        pass
    return meta


class _AutoOps:
    """fovi_lab's ``auto`` as an ops object: each entry point runs the backend ``auto`` picks for the call
    (:func:`fovi_lab.ops.dispatch.select_backend`; on the CPU the fastest CPU form, :mod:`fovi_lab.ops.cpu_auto`).
    Inside fovi's autograd Function grad mode is off, so the forward counts as a train step when x or the weight
    requires grad (the gradients then run the same form); :func:`fovi_lab_inside` resolves the mode outside the
    Function instead."""

    name = "auto"

    @staticmethod
    def _ops(meta, x, training: bool, dtype):
        from fovi_lab.ops.dispatch import select_backend
        return get_ops(select_backend("auto", meta, x, training, dtype=dtype))

    @staticmethod
    def forward(meta, x, weight, bias):
        training = bool(x.requires_grad or weight.requires_grad)
        return _AutoOps._ops(meta, x, training, x.dtype).forward(meta, x, weight, bias)

    @staticmethod
    def grad_input(meta, grad_y, weight):
        return _AutoOps._ops(meta, grad_y, True, grad_y.dtype).grad_input(meta, grad_y, weight)

    @staticmethod
    def grad_weight(meta, grad_y, x):
        return _AutoOps._ops(meta, x, True, grad_y.dtype).grad_weight(meta, grad_y, x)


def _adapter(name: str, ops) -> type:
    """fovi's ops object for fovi_lab's ``ops``, registered as ``name``: each entry point converts the meta and calls
    ``ops`` (looked up at call time)."""

    def forward(meta, x, weight, bias):
        return ops.forward(_lab_meta(meta), x, weight, bias)

    def grad_input(meta, grad_y, weight):
        return ops.grad_input(_lab_meta(meta), grad_y, weight)

    def grad_weight(meta, grad_y, x):
        return ops.grad_weight(_lab_meta(meta), grad_y, x)

    attrs = {
        "__doc__": f"fovi_lab's {ops.name!r} backend in fovi's ops registry as {name!r}.",
        "__module__": __name__,
        "name": name,
        "backend": ops.name,
        "ops": ops,
        _ADAPTER_FLAG: True,
        "forward": staticmethod(forward),
        "grad_input": staticmethod(grad_input),
        "grad_weight": staticmethod(grad_weight),
    }
    if hasattr(ops, "backward_combined"):
        def backward_combined(meta, grad_y, x, weight):
            return ops.backward_combined(_lab_meta(meta), grad_y, x, weight)

        attrs["backward_combined"] = staticmethod(backward_combined)
    return type(f"FoviLabOps[{name}={ops.name}]", (), attrs)


def _is_ours(entry) -> bool:
    return getattr(entry, _ADAPTER_FLAG, False) is True


def _import_owner(name: str) -> None:
    """Import the fovi module that registers ``name`` on first use, so that its import cannot later replace an
    entry of ours. One that cannot import here is skipped: fovi's own lazy import of it fails the same way."""
    module = _OWNER_MODULES.get(name)
    if module is None:
        return
    if module == "fovi.arch.knn_warp":
        try:
            from fovi_lab.kernels.common import init_warp
            init_warp()                 # quietly, before fovi's module calls wp.init()
        except ImportError:
            return
    try:
        importlib.import_module(module)
    except Exception:                   # noqa: BLE001  (fovi's CUDA modules fail on import where CUDA is absent)
        pass


def register_with_fovi(name: str = "warp_train", backend: str = "warp_train") -> type:
    """Register fovi_lab's backend ``backend`` in fovi's ops registry as ``name``, so that a fovi layer whose
    ``kernel_backend`` is ``name`` runs fovi_lab's kernels wherever fovi dispatches it to the registry (for
    ``warp_train``: CUDA tensors in float16 or under float16 autocast).

    The entry fovi had under ``name`` is kept for :func:`unregister_from_fovi`; registering again (any backend)
    replaces the adapter and keeps fovi's entry.

    Args:
        name: the fovi registry name: one fovi's layers dispatch through the registry (``warp_train``,
            ``torch_compact``, ``cuda``, ``gather_gemm``), or a new name for ``compact_forward(..., ops_name=name)``.
        backend: a fovi_lab backend name (``fovi_lab.backends()``): ``warp_train`` (fp16 / bf16, trains),
            ``warp_compact`` (forward only: its gradients raise), ``torch_compact``, ``torch_binned``,
            ``torch_dense``, or ``auto`` (per call the backend fovi_lab's ``auto`` picks: on the CPU the fastest
            CPU form for the call's shape, measured once per machine).

    Returns:
        The adapter now in fovi's registry (``.ops`` is fovi_lab's ops object, ``.backend`` its name).

    Raises:
        ImportError: fovi's ``fovi.arch`` does not import here (the message gives the install lines).
        TypeError / ValueError: a ``name`` or ``backend`` that is not a name, an unknown ``backend``, or a
            ``name`` fovi runs without its registry (``baseline``, ``auto``, the cached inference backends,
            ``torch_scatter``), where an entry would never be called.
    """
    _check_name(name)
    if not isinstance(backend, str):
        raise TypeError(f"backend: expected a fovi_lab backend name (str), got {type(backend).__name__}")
    try:
        ops = _AutoOps if backend == "auto" else get_ops(backend)
    except KeyError as exc:
        raise ValueError(str(exc.args[0]).replace("ops_name:", "backend:", 1).replace("]", ", 'auto']", 1)) from None
    registry_module, dispatch_module = _fovi()
    through_registry = set(dispatch_module.TRAIN_CAPABLE_BACKENDS) - _OFF_REGISTRY_TRAINING
    if name in set(dispatch_module.VALID_BACKENDS) - through_registry:
        raise ValueError(f"name: fovi runs {name!r} without its ops registry, so an entry under it would never be "
                         f"called; the names fovi's layers dispatch through the registry: {sorted(through_registry)} "
                         f"(a new name is reached through fovi.arch.knn_autograd.compact_forward)")
    _import_owner(name)
    adapter = _adapter(name, ops)
    with _LOCK:
        current = registry_module.OPS_REGISTRY.get(name, _ABSENT)
        if not _is_ours(current):
            _SAVED[name] = current
        registry_module.register_ops(adapter)
    return adapter


def unregister_from_fovi(name: str = "warp_train") -> Optional[object]:
    """Give fovi back its own entry under ``name`` (the one :func:`register_with_fovi` found there), or remove the
    name where fovi had none. An entry that is not fovi_lab's adapter (fovi's own, or one registered by someone
    else since) is left as it is.

    Returns:
        The entry now under ``name`` in fovi's registry, or None where there is none.

    Raises:
        ImportError: fovi's ``fovi.arch`` does not import here. TypeError / ValueError: ``name`` is not a name.
    """
    _check_name(name)
    registry_module, _ = _fovi()
    registry = registry_module.OPS_REGISTRY
    with _LOCK:
        saved = _SAVED.pop(name, _ABSENT)
        current = registry.get(name, _ABSENT)
        if _is_ours(current):
            if saved is _ABSENT:
                del registry[name]
            else:
                registry[name] = saved
        entry = registry.get(name, _ABSENT)
    return None if entry is _ABSENT else entry


# ------------------------------------------------------------------------------------------------ fovi's networks

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


# ------------------------------------------------------------------------------------------------ fovi's layers

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
