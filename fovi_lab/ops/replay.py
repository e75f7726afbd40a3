"""Replayed calls: the eager API of the Warp backends with the per-call host work taken off small calls.

At small batch a compact layer is tens of microseconds of GPU work, while issuing a ``warp_train`` step from
Python (argument checks, operand layouts, allocations, six to twenty launches) costs the host more: the stream
waits on the host, and the eager step runs several times slower than the same step replayed from a CUDA graph
(:mod:`fovi_lab.ops.graphs`; the replayed and eager ``warp_train`` rows of ``fovi_lab/records/h200/train_step.jsonl.gz``).

So the backends replay such calls themselves. Per *signature* (the op, the layer, each tensor's shape, strides
and dtype, the device, torch's current stream, the replay mode and the ``FOVI_*`` variables that change a kernel's
work, :func:`fovi_lab.settings.snapshot`):

1. the first call runs directly: Warp compiles and checks its kernels, the layer's derived tables are built
   (outside any graph's memory pool) (an adjoint that reads a replayed forward's copies, :func:`replayed_after`, is
   a signature of its own: its first call comes with the first replayed forward, so it captures a step later);
2. the second call copies its tensors into static inputs, captures the direct call on them into a CUDA graph
   (:func:`fovi_lab.ops.graphs.capture`) and replays it;
3. every later call copies its tensors into the static inputs, replays the graph and returns copies of its
   static outputs (new tensors, as a direct call returns).

The graph holds the same kernels in the same order as the direct call, so the results are bitwise the direct
call's (checked by the GPU tests). Caches keyed on a tensor's version (the inference weight layout) are not read
inside a capture, so a replay always computes from the values just copied in.

Which calls: ``FOVI_KNN_REPLAY=auto`` (the default) replays CUDA calls whose tensors (inputs and outputs) take at
most :data:`MAX_BYTES`; ``on`` replays every CUDA call, ``off`` none; ``in-place`` replays the calls ``auto`` does,
without the copies where it can (below). On the H200 a replayed train step was at most
0.5 % slower than the direct one, from B = 16 to 512 on all 13 layers, and up to 3.2x faster (res18 layer1 B = 64: 0.316
against 1.010 ms, interleaved, ``data/h200/replay_ab.jsonl.gz``); where the calls' tensors pass 64 MiB (the AlexNet
layers and the stem at B = 512) it gained at most 4 %, so those run directly and keep no copies. A forward alone
(one or two launches, ~0.07 ms of host work) gains less: the direct forward took 0.85-1.39x the replayed one at
B = 1 to 16 (geometric means 0.99-1.06 per batch) and 1.05-1.51x at B = 64, in the same records.
Never replayed: CPU calls (outside :func:`emulated_on_cpu`), calls made while torch's current stream is being captured (a user's own graph, or
``torch.compile(mode="reduce-overhead")``: the direct call is capturable), calls inside :func:`suspended` (what
:func:`fovi_lab.ops.graphs.graphed` runs its warm-up and capture in), tensors with overlapping or
non-dense strides, and a signature whose capture failed (it warns once and runs directly from then on).

An outer capture owns the layer: once a layer's call is met inside a capture of torch's current stream (the whole
step in a user's ``torch.cuda.graph``, :func:`fovi_lab.ops.graphs.graphed`, ``torch.compile(mode="reduce-overhead")``),
the step's graph issues that layer's kernels and would never replay its per-call graphs. So at that call the
layer's cached signatures are dropped (their static copies freed at once, inside the capture, so they do not add to
its peak; the graphs themselves are destroyed at the next call made outside any capture, or by :func:`clear`), and
the layer's later calls outside the capture run directly: none is cached again. :func:`fovi_lab.ops.graphs.graphed`
drops them sooner, at the layer's first call in its warm-ups (before the warm-up steps allocate theirs), and its
capture then owns the layer. :func:`owned_by_outer_capture` says
which layers; :func:`clear` forgets them too. Without this rule, on fovi's ResNet-18 at B = 64, the per-call graphs
made by two eager forward and backward passes before the capture held 89 MiB of a graphed step's 688 MiB peak
(``data/h200/network.jsonl``, commit dacd104, ``replay_resident_mib``).

In place (``FOVI_KNN_REPLAY=in-place``): a graph reads and writes the addresses it was captured on, so a call whose
tensors sit where an earlier call's of its signature sat needs no copies. Such a call allocates its outputs (as a
direct call does) and, where a graph of the signature was captured on these very addresses (the inputs' and the
outputs'), replays it: the graph reads the inputs where they are and writes the outputs in place (a copy kernel
inside the graph), and the call returns them; no copy or clone is issued from the host. Otherwise it captures one on
these addresses, up to :data:`MAX_IN_PLACE` a signature, and past that runs as ``auto`` (copies). A graph holds no
reference to the tensors it was captured on, so their memory is freed and handed out again as usual: in a training
loop, whose allocations repeat step after step, the same addresses come back and the graphs are replayed. Replaying
one only where every address and layout matches makes it read what the call passed, whatever tensor sits there now.

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
from fovi_lab.ops.graphs import _AFTER_CAPTURE, capture, per_call_suspended as suspended_here, \
    suspend_per_call as suspended

__all__ = ["replay_mode", "replayed", "replayed_keep", "replayed_after", "suspended", "emulated_on_cpu", "clear",
           "resident_bytes", "stats", "owned_by_outer_capture", "clear_retired", "MAX_BYTES", "MAX_ENTRIES",
           "MAX_RESIDENT_BYTES", "MAX_IN_PLACE"]

#: Largest total of a call's tensor bytes (inputs and outputs) the default rule replays: past it the GPU work hides
#: the host's, and the static copies a graph keeps would cost as much memory as the call's own tensors.
MAX_BYTES = 64 << 20
#: Signatures kept at most (least recently used dropped first).
MAX_ENTRIES = 128
#: GPU memory the cached captures may hold in all (static copies and the graphs' pools, :func:`resident_bytes`):
#: once a new capture would pass it, new signatures run directly (captures already made stay), so a large network's
#: many layer x batch signatures cannot grow the memory without bound.
MAX_RESIDENT_BYTES = 2 << 30
#: Graphs captured in place (``FOVI_KNN_REPLAY=in-place``) a signature keeps at most, one per set of addresses its
#: calls came with; past it, the signature's calls copy (a loop whose allocations do not repeat). Layers of one graph
#: share a meta (:func:`fovi_lab.graph.meta.build_meta`), so their calls of one shape are one signature: ResNet-18's
#: four layer1 convolutions bring four sets of addresses a step.
MAX_IN_PLACE = 8

_lock = threading.Lock()
_entries: "OrderedDict[tuple, _Entry]" = OrderedDict()
_counts: Dict[str, int] = {"direct": 0, "captured": 0, "replayed": 0, "refused": 0, "captured_in_place": 0,
                           "replayed_in_place": 0, "yielded": 0}
#: id(meta) -> meta of the layers an outer capture owns (met inside a capture of the current stream): their calls
#: run directly from then on (the meta is held, so its id is not reused by another layer)
_owned: Dict[int, object] = {}
#: the graphs of signatures dropped inside an outer capture, destroyed once no capture is underway
_retired: list = []

# torch's current raw stream handle by device index (see fovi_lab.kernels.common.warp_stream)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _count(what: str) -> None:
    with _lock:
        _counts[what] += 1


def replay_mode() -> str:
    """``FOVI_KNN_REPLAY``: ``auto`` (the default rule of the module docstring), ``on``, ``off`` or ``in-place``."""
    return settings.get("FOVI_KNN_REPLAY")


def _signature(op: str, meta, device_index, stream, tensors: tuple, mode: str) -> tuple:
    """A call's cache key: the op, the layer, the device and stream, each tensor's layout, the replay mode and the
    kernel-affecting ``FOVI_*`` variables (:func:`fovi_lab.settings.snapshot`: a changed switch captures a new
    graph instead of replaying the old path)."""
    return (op, id(meta), device_index, stream, tensors, mode, settings.snapshot())


class _Entry:
    """One signature: ``calls`` seen; after capture the static inputs, the captured step and its lock.
    ``generation`` counts the replays (a :func:`replayed_keep` handle is valid while it is unchanged); ``copied``:
    which static inputs a replay copies its arguments into (the others are another signature's, read in place)."""

    __slots__ = ("calls", "static", "step", "lock", "nbytes", "failed", "meta", "one", "generation", "stream",
                 "copied", "after", "outs", "places", "place_bytes", "place_dev", "__weakref__")

    def __init__(self, meta, stream=None, after=None):
        self.calls = 0
        self.static = None
        self.step = None
        self.lock = threading.Lock()
        self.nbytes = 0
        self.failed = False
        self.meta = meta                   # held, so the id in the signature stays this layer's
        self.one = True                    # fn returns one tensor (not a tuple)
        self.generation = 0
        self.stream = stream
        self.copied = None
        self.after = after                 # the entry whose static inputs this one reads (held: its id is in the key)
        self.outs = None                   # (shape, strides, dtype) of each output, from the first call
        self.places = None                 # in place: {the inputs' and outputs' addresses: their graph}
        self.place_bytes = 0               # what the in-place captures reserved (their pool, warm-ups included)
        self.place_dev = None


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


#: Set by :func:`emulated_on_cpu`: CPU calls take the replay path too, their "graph" emulated (:class:`_EmulatedStep`).
EMULATE_ON_CPU = False


@contextlib.contextmanager
def emulated_on_cpu() -> Iterator[None]:
    """Inside, CPU calls are replayed as CUDA calls are (every signature, whatever ``FOVI_KNN_REPLAY`` says), from an
    emulated graph (:class:`_EmulatedStep`: its replay runs the step again on the static tensors, out of sight of
    dispatch modes). A model for where no GPU is, not a speed-up: the tests check the replay layer's rules, copies and
    sharing with it, and notebook 08 counts what a replayed step issues from the host. Not thread-safe (a module
    switch); the signatures made inside stay cached (:func:`clear`)."""
    global EMULATE_ON_CPU
    prev = EMULATE_ON_CPU
    EMULATE_ON_CPU = True
    try:
        yield
    finally:
        EMULATE_ON_CPU = prev


class _EmulatedStep:
    """A CUDA graph's contract on the CPU, for the tests (:data:`EMULATE_ON_CPU`): capture runs ``fn`` (closed over the
    static inputs) once and keeps its outputs as the static outputs; each replay runs it again and writes them in
    place. Its operations are hidden from dispatch modes, as a graph's kernels are not host operations."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.outputs = fn()

    def replay(self):
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes():
            for o, n in zip(self.outputs, self.fn()):
                o.copy_(n)
        return self.outputs


class _EmulatedInPlace:
    """An in-place graph's contract on the CPU (:data:`EMULATE_ON_CPU`): it holds no tensor; :meth:`run` computes from
    the tensors at its addresses (the call's, since it runs only where the addresses match) into the outputs there,
    out of sight of dispatch modes, as a graph's kernels are."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.where = None               # the addresses it was made on (set by its signature)

    def run(self, args, outs, where) -> None:
        if where != self.where:
            raise RuntimeError("an in-place graph replayed on addresses it was not captured on")
        from torch.utils._python_dispatch import _disable_current_modes
        with _disable_current_modes():
            for o, n in zip(outs, _as_tuple(self.fn(*args))):
                o.copy_(n)


def _takes(t) -> bool:
    return t.is_cuda or (EMULATE_ON_CPU and t.device.type == "cpu")


def _stream_of(dev) -> int:
    if dev.type != "cuda":
        return 0
    return _raw_stream(dev.index) if _raw_stream is not None else torch.cuda.current_stream(dev).cuda_stream


def _entry(key, meta, stream, after=None) -> _Entry:
    with _lock:
        e = _entries.get(key)
        if e is None:
            e = _entries[key] = _Entry(meta, stream, after)
            while len(_entries) > MAX_ENTRIES:
                _entries.popitem(last=False)
        else:
            _entries.move_to_end(key)
    return e


def replayed(op: str, meta, fn: Callable, *args):
    """``fn(*args)`` (tensors or None; ``meta``: the call's layer, part of the signature), replayed from a CUDA graph
    where the module docstring's rule takes it; returns what ``fn`` returns (a tensor or a tuple)."""
    return _replay(op, meta, fn, args)[0]


def replayed_keep(op: str, meta, fn: Callable, *args):
    """:func:`replayed`, and a handle on the static copies of ``args`` this call was replayed from (None where it ran
    directly), for a later call that reads the same tensors (:func:`replayed_after`): a train step's backward reads
    the forward's x and weight."""
    return _replay(op, meta, fn, args)


def replayed_after(handle, shared: Dict[int, int], op: str, meta, fn: Callable, *args):
    """:func:`replayed`, where ``args[i]`` for each ``i -> j`` of ``shared`` is the tensor the call of ``handle`` (from
    :func:`replayed_keep`) took as its ``j``-th argument. While that call's static copies still hold them (its
    signature has not been replayed since, on this stream), this call's graph reads them in place and only the other
    arguments are copied in; otherwise (a second forward of the layer before this backward, a direct call, another
    stream) it is an ordinary :func:`replayed` call. The results are the same either way: the copies hold the values
    the tensors had when that call ran. The caller vouches that the tensors are unchanged since: an autograd Function
    by its saved tensors (autograd refuses one changed in place), :mod:`fovi_lab.knn_warp` by their versions."""
    if handle is not None:
        fwd, gen = handle
        first = next((a for a in args if a is not None), None)
        if first is not None and _takes(first) and _stream_of(first.device) == fwd.stream:
            with fwd.lock:                      # no replay of fwd may overwrite its copies until this one is issued
                if fwd.generation == gen and fwd.static is not None:
                    return _replay((op, "after", id(fwd)), meta, fn, args,
                                   after=(fwd, {i: fwd.static[j] for i, j in shared.items()}))[0]
    return _replay(op, meta, fn, args)[0]


def _outer_capture_underway(t) -> bool:
    """Whether torch's current stream on ``t``'s device is being captured (a graph of the caller's owns the call)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def _yield_to_outer_capture(meta, own: bool = True) -> None:
    """``meta``'s layer is owned by an outer capture: its signatures are dropped (their static tensors freed now;
    their graphs kept in :data:`_retired` until no capture is underway) and, where ``own``, its later calls run
    directly (``own`` False: the warm-ups of :func:`fovi_lab.ops.graphs.graphed`, whose capture owns the layer)."""
    with _lock:
        if id(meta) in _owned:
            return
        if own:
            _owned[id(meta)] = meta
        gone = [k for k, e in _entries.items() if e.meta is meta or (e.after is not None and e.after.meta is meta)]
        if not gone:
            return
        dropped = [_entries.pop(k) for k in gone]
        _counts["yielded"] += len(dropped)
    for e in dropped:
        with e.lock:
            # the graphs wait; what they hold of tensors (static outputs, an emulated step's closure) is freed now
            steps = [step for step in [e.step] + list((e.places or {}).values()) if step is not None]
            for step in steps:
                step.outputs = step.fn = None
            with _lock:
                _retired.extend(steps)
            e.static, e.step, e.nbytes = None, None, 0
            _stop_in_place(e)
            e.failed = True                        # a handle still held (a pending backward) reads no copy of it


def clear_retired() -> None:
    """Destroy the graphs of the signatures an outer capture dropped (call it outside any capture: a graph is not
    destroyed while one records). The next call made outside a capture does it too; :func:`fovi_lab.ops.graphs.graphed`
    does it after its capture."""
    with _lock:
        if not _retired:
            return
        _retired.clear()


_AFTER_CAPTURE.append(clear_retired)


def owned_by_outer_capture(meta) -> bool:
    """Whether ``meta``'s layer was met inside an outer capture (see the module docstring): its calls run directly."""
    return id(meta) in _owned


def _replay(op, meta, fn: Callable, args, after=None):
    """(what ``fn(*args)`` returns, a handle or None): the module docstring's rule; ``after``: (the entry whose
    static inputs ``args`` share, {argument index: that entry's static tensor})."""
    first = next((a for a in args if a is not None), None)
    if first is None or not _takes(first):
        return fn(*args), None
    if _outer_capture_underway(first):
        _yield_to_outer_capture(meta)
        return fn(*args), None
    if _retired:
        clear_retired()
    if suspended_here():
        # graphed()'s warm-ups: its capture will own the layer; the copies its eager calls made go before the
        # warm-up steps add theirs to the peak
        if meta is not None:
            _yield_to_outer_capture(meta, own=False)
        return fn(*args), None
    mode = replay_mode()
    if not first.is_cuda:                                     # a CPU call here is an emulated one
        mode = "in-place" if mode == "in-place" else "on"
    if mode == "off" or id(meta) in _owned:
        return fn(*args), None
    tensors = tuple(_tensor_key(a) for a in args)
    if False in tensors:
        return fn(*args), None
    dev = first.device
    stream = _stream_of(dev)
    e = _entry(_signature(op, meta, dev.index, stream, tensors, mode), meta, stream,
               None if after is None else after[0])
    if e.failed:
        return fn(*args), None
    layouts = e.outs                                          # (read once: another thread may stop it)
    if mode == "in-place" and layouts is not None and after is None:
        outs = _in_place(e, fn, args, dev, layouts)
        if outs is not None:
            return (outs[0] if e.one else outs), None
    with e.lock:
        if e.step is None:
            if e.calls == 0:                       # compile, check and build tables outside any pool
                out = fn(*args)                    # (a call that raises leaves the entry unseen)
                e.calls = 1
                e.one = not isinstance(out, tuple)
                if all(isinstance(o, torch.Tensor) for o in _as_tuple(out)):
                    e.outs = tuple((o.shape, o.stride(), o.dtype) for o in _as_tuple(out))
                e.nbytes = _bytes(args) + _bytes(_as_tuple(out))       # until a capture measures its own
                if mode in ("auto", "in-place") and e.nbytes > MAX_BYTES:
                    e.failed = True                # over the size rule: direct from now on
                    _count("refused")
                else:
                    _count("direct")
                return out, None
            if mode in ("auto", "in-place") and resident_bytes() + 2 * e.nbytes > MAX_RESIDENT_BYTES:
                e.failed = True                    # the captures made so far hold the budget: direct from now on
                _count("refused")
                return fn(*args), None
            if not _capture(e, op, fn, args, None if after is None else after[1]):
                return fn(*args), None
        # an autograd Function's forward and backward run with grad off already: no context to enter there
        with (torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext()):
            for s, a, c in zip(e.static, args, e.copied):
                if c:
                    s.copy_(a)
            outs = e.step.replay()
            res = tuple(o.clone() for o in outs)
        e.generation += 1
        handle = (e, e.generation)
        _count("replayed")
    return (res[0] if e.one else res), handle


def _outputs(layouts, dev) -> tuple:
    """New output tensors of these (shape, strides, dtype), as a direct call allocates them."""
    return tuple(torch.empty_strided(shape, stride, dtype=dtype, device=dev) for shape, stride, dtype in layouts)


def _in_place(e: _Entry, fn: Callable, args, dev, layouts) -> Optional[tuple]:
    """The outputs of ``fn(*args)`` from the graph captured on these inputs' and outputs' addresses (captured now
    where there is none, while the signature holds fewer than :data:`MAX_IN_PLACE`); None where the call copies
    instead. A signature whose graphs are all taken and meet addresses none of them has, or whose capture failed,
    copies from then on (:func:`_stop_in_place`)."""
    outs = _outputs(layouts, dev)
    where = tuple(0 if a is None else a.data_ptr() for a in args) + tuple(o.data_ptr() for o in outs)
    with e.lock:
        if e.outs is None:                         # stopped by another thread meanwhile
            return None
        step = e.places.get(where) if e.places else None
        if step is None:
            if (e.places and len(e.places) >= MAX_IN_PLACE) or \
                    resident_bytes() + 2 * e.nbytes > MAX_RESIDENT_BYTES:
                _stop_in_place(e)
                return None
            step = _capture_in_place(e, fn, args, outs, dev)
            if step is None:
                _stop_in_place(e)
                return None
            e.places = e.places or {}
            e.places[where] = step
            if dev.type != "cuda":
                step.where = where                 # the emulation checks that it runs where it was made
            _count("captured_in_place")
        with (torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext()):
            if dev.type == "cuda":
                step.replay()
            else:
                step.run(args, outs, where)
        _count("replayed_in_place")
    return outs


def _stop_in_place(e: _Entry) -> None:
    """``e``'s calls copy from now on (as ``auto``); its in-place graphs and their memory are dropped."""
    e.outs, e.places, e.place_bytes = None, None, 0


def _capture_in_place(e: _Entry, fn: Callable, args, outs, dev):
    """A graph of ``fn(*args)`` that writes its results into ``outs`` (a copy inside the graph) and holds neither
    (their addresses are in its kernels); an emulated one on the CPU. None (and a warning) where the capture
    failed."""
    if dev.type != "cuda":
        return _EmulatedInPlace(fn)
    first = next(iter(e.places.values()), None) if e.places else None

    def body():
        for o, r in zip(outs, _as_tuple(fn(*args))):
            o.copy_(r)
        return ()
    before = torch.cuda.memory_reserved(dev)
    try:
        with torch.no_grad():
            # a signature's graphs share one pool: they hold no live tensor in it and replay one at a time, in order
            # the allocator's cache kept: emptying it would move the next call's tensors to other addresses
            step = capture(body, warmup=1, device=dev, pool=None if first is None else first.pool, keep_cache=True)
    except Exception as exc:  # noqa: BLE001 - a call that cannot be captured copies instead
        warnings.warn(f"could not capture this call in place ({type(exc).__name__}: {exc}); its signature's calls "
                      f"copy into a graph's static inputs from now on", RuntimeWarning, stacklevel=5)
        return None
    e.place_bytes += max(0, torch.cuda.memory_reserved(dev) - before)
    e.place_dev = dev.index
    return step


def _allocated(dev) -> int:
    return torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0


def _capture(e: _Entry, op, fn: Callable, args, shared=None) -> bool:
    """Capture ``fn`` on static inputs into ``e`` (``shared``: {index: another entry's static tensor}, read in place);
    False (and a warning; the signature runs directly from then on) where the capture failed."""
    shared = shared or {}
    dev = next(a for a in args if a is not None).device
    before = _allocated(dev)
    try:
        with torch.no_grad():
            static = tuple(shared[i] if i in shared else _static_copy(a) for i, a in enumerate(args))
            if dev.type == "cuda":
                step = capture(lambda: _as_tuple(fn(*static)), warmup=1, device=dev)
            else:
                step = _EmulatedStep(lambda: _as_tuple(fn(*static)))
    except Exception as exc:  # noqa: BLE001 - a call that cannot be captured still runs directly
        e.failed = True
        _count("refused")
        name = op if isinstance(op, str) else op[0]
        warnings.warn(f"{name}: could not capture this call into a CUDA graph ({type(exc).__name__}: {exc}); "
                      f"running it directly from now on (FOVI_KNN_REPLAY=off skips the attempt)",
                      RuntimeWarning, stacklevel=5)
        return False
    e.static, e.step = static, step
    e.copied = tuple(a is not None and i not in shared for i, a in enumerate(args))
    e.nbytes = max(0, _allocated(dev) - before)
    _count("captured")
    return True


def clear() -> None:
    """Drop every captured signature (their graphs, static tensors and pools are freed with them; one that a pending
    backward still reads, through its forward's handle, once that backward has run) and forget which layers an outer
    capture owned (their calls are replayed again). Not to be called while a capture is underway."""
    with _lock:
        _entries.clear()
        _owned.clear()
        _retired.clear()


def resident_bytes(device: Optional[torch.device] = None) -> int:
    """Bytes the cached captures allocated (static inputs, outputs and what the graphs' pools hold allocated, the
    in-place graphs' included), over all devices or ``device``'s; a forward dropped from the cache counts while a
    cached adjoint reads its copies."""
    with _lock:
        entries = {id(e): e for e in _entries.values()}
    for e in list(entries.values()):        # a forward dropped from the cache that a cached adjoint still reads
        if e.after is not None:
            entries.setdefault(id(e.after), e.after)
    entries = list(entries.values())
    idx = None if device is None else torch.device(device).index
    return (sum(e.nbytes for e in entries if e.static is not None
                and (idx is None or next(s for s in e.static if s is not None).device.index == idx))
            + sum(e.place_bytes for e in entries if idx is None or e.place_dev == idx))


def stats() -> Dict[str, int]:
    """Counts since import: ``direct`` (first calls of a signature), ``captured``, ``replayed``, ``refused``
    (over the size rule, or a capture that failed), ``captured_in_place`` and ``replayed_in_place``
    (``FOVI_KNN_REPLAY=in-place``), ``yielded`` (signatures dropped because an outer capture owns their layer),
    ``cached`` (signatures held now) and ``owned`` (layers an outer capture owns now)."""
    with _lock:
        return dict(_counts, cached=len(_entries), owned=len(_owned))
