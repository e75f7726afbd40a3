"""fovi_lab's backends in fovi's ops registry: :func:`register_with_fovi` and :func:`unregister_from_fovi`, and the
adapter that hands a fovi_lab backend fovi_lab's meta of the layer fovi calls it with (:mod:`fovi_lab.integrations.fovi`
describes the contract).
"""

from __future__ import annotations

import importlib
import threading
from typing import Dict, Optional

import torch

from fovi_lab.graph.meta import TrainingMeta, build_meta
from fovi_lab.ops.registry import get_ops

__all__ = ["register_with_fovi", "unregister_from_fovi", "TESTED_RELEASE", "INSTALL"]

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
