"""The ``auto`` backend: pick the fastest registered backend from the recorded benchmarks.

The benchmarks (``python -m fovi_lab bench forward`` / ``bench train-step``) append JSON lines under
``data/`` with the device name, the layer shape (cin, cout, nin, nout, k, p64), the batch, the
implementation and its median time. For a call ``(meta, x, training)`` :func:`pick_backend` looks for
records of the same device name (else of a device of the same architecture: an H100 reads the H200's) and the
same layer shape, takes the recorded batch nearest to
``B`` (in log2 distance, at most a factor 2 away), and returns the registered backend with the smallest
time there:

* training (grad enabled): ``mode == "train-step"`` records of ``warp_train``, ``torch_compact`` and
  ``torch_binned`` (each backend's own forward and explicit adjoints);
* inference: forward records of ``warp_uncached`` (the config the heuristic chose in that run, whole op;
  sweeps also time the other configs' ops, marked ``chosen: false``, which are left out; backend
  ``warp_compact``), ``torch_compact`` and ``torch_binned_mm`` (:func:`fovi_lab.ops.reference.binned_forward`,
  the forward of backend ``torch_binned``).

On the CPU :func:`select_backend` asks :mod:`fovi_lab.ops.cpu_auto` instead (the records are GPU runs).
:func:`pick_backend` returns None when the compute dtype is not fp16 on CUDA (the records are fp16 runs; bf16
``auto`` takes ``torch_compact`` unless tuned, ``python -m fovi_lab tune --dtype bf16``), when Warp is not
importable, or when no record applies. An fp16 call no record covers (a layer or batch the benchmarks never ran,
a GPU of another architecture) then takes the backend the cost model prices lowest on the device's datasheet peaks
(:func:`estimated_backend`, :mod:`fovi_lab.kernels.cost_pick`), and ``torch_compact`` where nothing prices it (a GPU
without datasheet figures, no Warp). When several runs recorded the same point, the newest one counts. Records are
read once per process.
"""

from __future__ import annotations

import math
import threading
from functools import lru_cache
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

from fovi_lab.ops.devices import arch_of_name
from fovi_lab.ops.records import LOCAL_DIR, iter_records, read_file
from fovi_lab.ops.tune_cache import tuned_choice

__all__ = ["pick_backend", "lookup_records", "arch_of_name", "recorded_table", "estimated_backend", "select_backend",
           "DATA_DIR"]

DATA_DIR = LOCAL_DIR        # a checkout's own records, read beside the shipped ones (fovi_lab/records/)

# recorded impl -> registered backend name, per mode
_IMPL_TO_BACKEND = {
    "forward": {"warp_uncached": "warp_compact", "torch_compact": "torch_compact",
                "torch_binned_mm": "torch_binned"},       # torch_binned's forward is binned_forward itself
    "train-step": {"warp_train": "warp_train", "torch_compact": "torch_compact", "torch_binned": "torch_binned"},
}
#: What a record must match: the layer's sizes and its taps V (a variant on another reference frame, such as
#: ``res18_stem_rf2``, has the compact kernels' shape but not the binned backend's work, which grows with V).
_SHAPE_KEYS = ("cin", "cout", "nin", "nout", "k", "p64", "v")
_lock = threading.Lock()


def _records(data_dir: Optional[str]):
    if data_dir is None:
        yield from iter_records(auto=True)
        return
    for path in sorted(Path(data_dir).glob("*.jsonl")):
        yield from read_file(path)


@lru_cache(maxsize=1)
def recorded_table(data_dir: Optional[str] = None) -> Dict[Tuple, Dict[str, Tuple[str, float]]]:
    """``{(device, mode, shape, B): {backend: (date, ms)}}`` from the records (the latest per key): the shipped
    ones and a checkout's ``data/*.jsonl`` (:func:`fovi_lab.ops.records.iter_records`), or every ``*.jsonl`` of
    ``data_dir``; records flagged ``note_run`` (variants a backend does not run by default) are left out."""
    table: Dict[Tuple, Dict[str, Tuple[str, float]]] = {}
    for r in _records(data_dir):
        if r.get("note_run"):      # a measured variant or development run, not what a backend runs
            continue
        if r.get("impl") == "warp_uncached" and r.get("chosen") is False:
            continue               # a swept config (--op-all), not the one the backend would run
        mode = r.get("mode") or "forward"
        backend = _IMPL_TO_BACKEND.get(mode, {}).get(r.get("impl"))
        if backend is None or not r.get("ms") or any(k not in r for k in _SHAPE_KEYS):
            continue
        shape = tuple(int(r[k]) for k in _SHAPE_KEYS)
        key = (r.get("device"), mode, shape, int(r["B"]))
        prev = table.setdefault(key, {}).get(backend)
        stamp = str(r.get("date", ""))
        if prev is None or stamp >= prev[0]:
            table[key][backend] = (stamp, float(r["ms"]))
    return table


def _device_name(x: torch.Tensor) -> Optional[str]:
    try:
        return torch.cuda.get_device_name(x.device)
    except Exception:
        return None


def _device_arch(x: torch.Tensor) -> Optional[int]:
    try:
        major, minor = torch.cuda.get_device_capability(x.device)
        return major * 10 + minor
    except Exception:
        return None


def lookup_records(table, device: Optional[str], arch: Optional[int], mode: str, shape: tuple, b: int,
                   candidates) -> Tuple[Optional[str], Optional[str]]:
    """``(backend, recorded device)``: the fastest of ``candidates`` at the recorded batch nearest ``b`` (at most a
    factor 2 away) for this mode and shape, from the records of ``device`` itself, else from those of a device of
    the same architecture (an H100 reads the H200's records: both sm_90); ``(None, None)`` where none applies."""
    recorded = {dev for (dev, m, shp, _) in table if m == mode and shp == shape}
    same_arch = sorted(d for d in recorded if d != device and arch is not None and arch_of_name(d) == arch)
    for devices in ([device], same_arch):
        best, best_d = None, None
        for (dev, m, shp, rb) in table:
            if dev in devices and m == mode and shp == shape:
                d = abs(math.log2(rb) - math.log2(b))
                if d <= 1.0 and (best_d is None or (d, dev) < best_d):
                    best, best_d = (dev, rb), (d, dev)
        if best is not None:
            options = {be: ms for be, (_, ms) in table[(best[0], mode, shape, best[1])].items() if be in candidates}
            if options:
                return min(options, key=options.get), best[0]
    return None, None


def pick_backend(meta, x: torch.Tensor, training: Optional[bool] = None, candidates=None,
                 dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Fastest recorded backend for this layer shape, batch, device and mode among ``candidates`` (default:
    every registered backend), or None: the device's own records first, else a device's of the same architecture
    (:func:`lookup_records`). ``dtype``: the dtype the op will compute in (default ``x.dtype``; under autocast,
    the autocast dtype)."""
    if not x.is_cuda or (dtype or x.dtype) != torch.float16:
        return None
    if training is None:
        training = torch.is_grad_enabled()
    mode = "train-step" if training else "forward"
    if candidates is None:
        from fovi_lab.ops.registry import OPS_REGISTRY, load_optional_backends
        load_optional_backends()
        candidates = OPS_REGISTRY
    shape = (meta.cin, meta.cout, meta.nin, meta.nout, meta.k, meta.p64, meta.v)
    with _lock:
        table = recorded_table()
    return lookup_records(table, _device_name(x), _device_arch(x), mode, shape, x.shape[0], candidates)[0]


_estimated: Dict[tuple, Optional[str]] = {}


def estimated_backend(meta, batch: int, device: torch.device, training: bool, candidates) -> Optional[str]:
    """The backend the first registered estimator (:data:`fovi_lab.ops.registry.ESTIMATORS`) prices lowest among
    ``candidates`` for this layer shape, batch, device and mode, or None where none prices it; asked once per such
    signature (its answer kept). A signature first met while torch's current stream is being captured is not asked
    (an estimator reads the layer's tables, which a capture forbids): None then, and nothing kept, so the next call
    outside the capture asks; warm-up calls before a capture (as :func:`fovi_lab.ops.graphs.graphed` and
    ``torch.compile`` make them) have asked already."""
    from fovi_lab.ops.registry import ESTIMATORS
    key = (meta.cin, meta.cout, meta.nin, meta.nout, meta.k, meta.p64, meta.v, int(batch), str(device),
           bool(training), tuple(candidates), len(ESTIMATORS))
    with _lock:
        if key in _estimated:
            return _estimated[key]
    if torch.device(device).type == "cuda" and torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return None
    choice = None
    for estimator in list(ESTIMATORS):
        choice = estimator(meta, int(batch), device, bool(training), tuple(candidates))
        if choice is not None:
            break
    with _lock:
        _estimated[key] = choice
    return choice


def select_backend(backend: str, meta, x: torch.Tensor, training: Optional[bool] = None,
                   dtype: Optional[torch.dtype] = None) -> str:
    """Resolve a requested backend name to a registered one.

    ``auto`` picks, for this shape/batch/dtype/device and mode (training or inference). On the CPU: the fastest
    of the CPU forms, measured once per call shape on this machine or estimated (:mod:`fovi_lab.ops.cpu_auto`,
    decided once per call signature). On a GPU: the backend tuned on this device (:mod:`fovi_lab.ops.tune_cache`,
    ``python -m fovi_lab tune``), else the fastest registered backend in the recorded benchmarks when they cover
    the call (:func:`pick_backend`), else for an fp16 call the backend a registered estimator prices lowest
    (:func:`estimated_backend`: the cost model on the device's datasheet peaks), else ``torch_compact``. Any other
    name must be registered (an unknown one raises, listing the known names).
    ``dtype``: the dtype the op computes in (default ``x.dtype``): eager and compiled calls under autocast pass
    the autocast dtype, so both resolve ``auto`` alike.
    """
    from fovi_lab.ops.registry import OPS_REGISTRY, get_ops, load_optional_backends
    if backend == "auto":
        load_optional_backends()
        if x.device.type == "cpu":
            from fovi_lab.ops.cpu_auto import cpu_pick
            mode = torch.is_grad_enabled() if training is None else training
            return cpu_pick(meta, x.shape[0], dtype or x.dtype, mode)
        tuned = tuned_choice(meta, x, torch.is_grad_enabled() if training is None else training, dtype)
        if tuned is not None and tuned[0] in OPS_REGISTRY:
            return tuned[0]
        choice = pick_backend(meta, x, training, candidates=tuple(OPS_REGISTRY), dtype=dtype)
        if choice is None and (dtype or x.dtype) == torch.float16:
            choice = estimated_backend(meta, x.shape[0], x.device,
                                       torch.is_grad_enabled() if training is None else training, tuple(OPS_REGISTRY))
        return choice if choice is not None else "torch_compact"
    get_ops(backend)
    return backend
