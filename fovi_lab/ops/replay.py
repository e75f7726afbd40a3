"""Replayed calls: the eager API of the Warp backends with the per-call host work taken off small calls.

At small batch a compact layer is tens of microseconds of GPU work, while issuing a ``warp_train`` step from
Python (argument checks, operand layouts, allocations, six to twenty launches) costs the host more: the stream
waits on the host, and the eager step runs several times slower than the same step replayed from a CUDA graph
(:mod:`fovi_lab.ops.graphs`; the replayed and eager ``warp_train`` rows of ``fovi_lab/records/h200/train_step.jsonl.gz``).

So the backends replay such calls themselves. Per *signature* (the op, the layer, each tensor's shape, strides
and dtype, the device, torch's current stream, the replay mode and the ``FOVI_*`` variables that change a kernel's
work, :func:`fovi_lab.settings.snapshot`):

1. the first call runs directly: Warp compiles and checks its kernels, the layer's derived tables are built
   (outside any graph's memory pool);
2. the second call copies its tensors into static inputs, captures the direct call on them into a CUDA graph
   (:func:`fovi_lab.ops.graphs.capture`) and replays it;
3. every later call copies its tensors into the static inputs, replays the graph and returns copies of its
   static outputs (new tensors, as a direct call returns).

The graph holds the same kernels in the same order as the direct call, so the results are bitwise the direct
call's (checked by the GPU tests). Caches keyed on a tensor's version (the inference weight layout) are not read
inside a capture, so a replay always computes from the values just copied in.

Which calls: ``FOVI_KNN_REPLAY=auto`` (the default) replays CUDA calls whose tensors (inputs and outputs) take at
most :data:`MAX_BYTES`; ``on`` replays every CUDA call, ``off`` none. On the H200 a replayed train step was at most
0.5 % slower than the direct one, from B = 16 to 512 on all 13 layers, and up to 3.2x faster (res18 layer1 B = 64: 0.316
against 1.010 ms, interleaved, ``data/h200/replay_ab.jsonl.gz``); where the calls' tensors pass 64 MiB (the AlexNet
layers and the stem at B = 512) it gained at most 4 %, so those run directly and keep no copies. A forward alone
(one or two launches, ~0.07 ms of host work) gains less: the direct forward took 0.85-1.39x the replayed one at
B = 1 to 16 (geometric means 0.99-1.06 per batch) and 1.05-1.51x at B = 64, in the same records.
Never replayed: CPU calls, calls made while torch's current stream is being captured (a user's own graph, or
``torch.compile(mode="reduce-overhead")``: the direct call is capturable), calls inside :func:`suspended` (what
:func:`fovi_lab.ops.graphs.graphed` runs its warm-up and capture in), tensors with overlapping or
non-dense strides, and a signature whose capture failed (it warns once and runs directly from then on).

Memory: each signature keeps its static inputs, outputs and the graph's private pool for as long as it is cached;
:func:`resident_bytes` reports what the captures allocated, :func:`clear` frees them, at most :data:`MAX_ENTRIES`
signatures are kept (the least recently used is dropped), and under ``auto`` no capture is made that would take
the captures past :data:`MAX_RESIDENT_BYTES` (such a signature runs directly). Replays of one signature are
serialised by a lock: its static tensors are shared.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections import OrderedDict
from typing import Callable, Dict, Iterator, Optional

import torch

import fovi_lab.settings as settings

__all__ = ["replay_mode", "replayed", "suspended", "clear", "resident_bytes", "stats", "MAX_BYTES", "MAX_ENTRIES",
           "MAX_RESIDENT_BYTES"]

#: Largest total of a call's tensor bytes (inputs and outputs) the default rule replays: past it the GPU work hides
#: the host's, and the static copies a graph keeps would cost as much memory as the call's own tensors.
MAX_BYTES = 64 << 20
#: Signatures kept at most (least recently used dropped first).
MAX_ENTRIES = 128
#: GPU memory the cached captures may hold in all (static copies and the graphs' pools, :func:`resident_bytes`):
#: once a new capture would pass it, new signatures run directly (captures already made stay), so a large network's
#: many layer x batch signatures cannot grow the memory without bound.
MAX_RESIDENT_BYTES = 2 << 30

_lock = threading.Lock()
_local = threading.local()          # .off: replays suspended on this thread (suspended())
_entries: "OrderedDict[tuple, _Entry]" = OrderedDict()
_counts: Dict[str, int] = {"direct": 0, "captured": 0, "replayed": 0, "refused": 0}

# torch's current raw stream handle by device index (see fovi_lab.kernels.common.warp_stream)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _count(what: str) -> None:
    with _lock:
        _counts[what] += 1


def replay_mode() -> str:
    """``FOVI_KNN_REPLAY``: ``auto`` (the default rule of the module docstring), ``on`` or ``off``."""
    return settings.get("FOVI_KNN_REPLAY")


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Inside, on this thread, every call runs directly: no signature is cached, captured or replayed. For code that
    captures whole steps itself (:func:`fovi_lab.ops.graphs.graphed`): its warm-up calls would otherwise capture
    per-call graphs (static copies and pools) that its own graph never replays."""
    prev = getattr(_local, "off", False)
    _local.off = True
    try:
        yield
    finally:
        _local.off = prev


def _signature(op: str, meta, device_index, stream, tensors: tuple, mode: str) -> tuple:
    """A call's cache key: the op, the layer, the device and stream, each tensor's layout, the replay mode and the
    kernel-affecting ``FOVI_*`` variables (:func:`fovi_lab.settings.snapshot`: a changed switch captures a new
    graph instead of replaying the old path)."""
    return (op, id(meta), device_index, stream, tensors, mode, settings.snapshot())


class _Entry:
    """One signature: ``calls`` seen; after capture the static inputs, the captured step and its lock."""

    __slots__ = ("calls", "static", "step", "lock", "nbytes", "failed", "meta", "one")

    def __init__(self, meta):
        self.calls = 0
        self.static = None
        self.step = None
        self.lock = threading.Lock()
        self.nbytes = 0
        self.failed = False
        self.meta = meta                   # held, so the id in the signature stays this layer's
        self.one = True                    # fn returns one tensor (not a tuple)


def _tensor_key(t):
    """(shape, strides, dtype, device) of ``t``; False where a strided copy cannot reproduce its layout."""
    if t is None:
        return None
    if not (t.is_contiguous() or _non_overlapping_dense(t)):
        return False
    return (tuple(t.shape), t.stride(), t.dtype, t.device)


def _non_overlapping_dense(t) -> bool:
    # a permutation of a contiguous layout (what empty_strided + copy_ reproduce exactly)
    dims = sorted(range(t.dim()), key=lambda i: t.stride(i))
    expect = 1
    for i in dims:
        if t.shape[i] != 1 and t.stride(i) != expect:
            return False
        expect *= t.shape[i]
    return True


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _static_copy(t):
    if t is None:
        return None
    s = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    s.copy_(t)
    return s


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def replayed(op: str, meta, fn: Callable, *args):
    """``fn(*args)`` (tensors or None; ``meta``: the call's layer, part of the signature), replayed from a CUDA graph
    where the module docstring's rule takes it; returns what ``fn`` returns (a tensor or a tuple)."""
    first = next((a for a in args if a is not None), None)
    if first is None or not first.is_cuda:
        return fn(*args)
    mode = replay_mode()
    if mode == "off" or getattr(_local, "off", False) or torch.cuda.is_current_stream_capturing():
        return fn(*args)
    tensors = tuple(_tensor_key(a) for a in args)
    if False in tensors:
        return fn(*args)
    dev = first.device
    stream = _raw_stream(dev.index) if _raw_stream is not None else torch.cuda.current_stream(dev).cuda_stream
    key = _signature(op, meta, dev.index, stream, tensors, mode)
    with _lock:
        e = _entries.get(key)
        if e is None:
            e = _entries[key] = _Entry(meta)
            while len(_entries) > MAX_ENTRIES:
                _entries.popitem(last=False)
        else:
            _entries.move_to_end(key)
    if e.failed:
        return fn(*args)
    with e.lock:
        if e.step is None:
            if e.calls == 0:                       # compile, check and build tables outside any pool
                out = fn(*args)                    # (a call that raises leaves the entry unseen)
                e.calls = 1
                e.one = not isinstance(out, tuple)
                e.nbytes = _bytes(args) + _bytes(_as_tuple(out))       # until a capture measures its own
                if mode == "auto" and e.nbytes > MAX_BYTES:
                    e.failed = True                # over the size rule: direct from now on
                    _count("refused")
                else:
                    _count("direct")
                return out
            if mode == "auto" and resident_bytes() + 2 * e.nbytes > MAX_RESIDENT_BYTES:
                e.failed = True                    # the captures made so far hold the budget: direct from now on
                _count("refused")
                return fn(*args)
            return _capture(e, op, fn, args)
        with torch.no_grad():
            for s, a in zip(e.static, args):
                if s is not None:
                    s.copy_(a)
            outs = e.step.replay()
            res = tuple(o.clone() for o in outs)
        _count("replayed")
    return res[0] if e.one else res


def _capture(e: _Entry, op: str, fn: Callable, args):
    from fovi_lab.ops.graphs import capture
    dev = next(a for a in args if a is not None).device
    before = torch.cuda.memory_allocated(dev)
    try:
        with torch.no_grad():
            static = tuple(_static_copy(a) for a in args)
            step = capture(lambda: _as_tuple(fn(*static)), warmup=1, device=dev)
    except Exception as exc:  # noqa: BLE001 - a call that cannot be captured still runs directly
        e.failed = True
        _count("refused")
        warnings.warn(f"{op}: could not capture this call into a CUDA graph ({type(exc).__name__}: {exc}); "
                      f"running it directly from now on (FOVI_KNN_REPLAY=off skips the attempt)",
                      RuntimeWarning, stacklevel=4)
        return fn(*args)
    e.static, e.step = static, step
    e.nbytes = max(0, torch.cuda.memory_allocated(dev) - before)
    _count("captured")
    with torch.no_grad():
        outs = step.replay()
        res = tuple(o.clone() for o in outs)
    _count("replayed")
    return res[0] if e.one else res


def clear() -> None:
    """Drop every captured signature (their graphs, static tensors and pools are freed with them)."""
    with _lock:
        _entries.clear()


def resident_bytes(device: Optional[torch.device] = None) -> int:
    """Bytes the cached captures allocated (static inputs, outputs and what the graphs' pools hold allocated),
    over all devices or ``device``'s."""
    with _lock:
        entries = list(_entries.values())
    idx = None if device is None else torch.device(device).index
    return sum(e.nbytes for e in entries if e.static is not None
               and (idx is None or next(s for s in e.static if s is not None).device.index == idx))


def stats() -> Dict[str, int]:
    """Counts since import: ``direct`` (first calls of a signature), ``captured``, ``replayed``, ``refused``
    (over the size rule, or a capture that failed), and ``cached`` (signatures held now)."""
    with _lock:
        return dict(_counts, cached=len(_entries))
