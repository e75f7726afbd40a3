"""Where a step's CUDA memory goes: the allocations live at its peak, by the code that made them.

PyTorch's caching allocator can record every allocation and free with the Python stack that made it
(``torch.cuda.memory._record_memory_history``) and hand the record over as a snapshot
(``torch.cuda.memory._snapshot()``: per device a list of events, each ``action`` (``alloc``, ``free_completed``, ...),
``addr``, ``size`` and ``frames``). :func:`live_at_peak` replays those events and returns the blocks alive at the
moment the allocated total was largest; :func:`at_peak` groups them by :func:`owner`, the innermost frame of the
code that asked for the block (fovi_lab's, fovi's, or a torch module's), so a record says, for example, that
140 MiB of a 688 MiB peak were outputs of ``fovi_lab/kernels/adjoint/fused.py:plan_grad_weight_nm``.

A CUDA graph's capture goes through the allocator as eager code does (its allocations are recorded with their
stacks, in the graph's private pool), so for a graphed step the peak is the capture's, which is what replaying the
graph needs. Blocks allocated before the recording began have no ``alloc`` event: they count under ``before``
(:data:`BEFORE`), given as the allocated total when the recording began. On the CPU, which has no such allocator
record, a dispatch mode stands in for it (:func:`recorded`): the storages that operators make inside the recording.

``python -m fovi_lab bench network --memory-trace`` records it per network, backend and mode
(:func:`fovi_lab.bench.network.network_records`), on a GPU or the CPU; the functions here are tested on made-up
events and on the CPU's record.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

__all__ = ["owner", "live_at_peak", "at_peak", "recorded", "BEFORE", "MAX_EVENTS"]

#: The owner of what was allocated before the recording began.
BEFORE = "before the recording"
#: Events the allocator keeps at most (the oldest are dropped past it; a whole ResNet-18 step makes a few thousand).
MAX_EVENTS = 1_000_000
#: Packages whose frames name an owner, in this order of preference (the innermost frame of the first that has one).
_PACKAGES = ("fovi_lab", "fovi")
#: fovi_lab's files that run a step rather than own its memory (the benchmarks, the command line): never an owner.
_HARNESS = ("fovi_lab/bench/", "fovi_lab/cli.py", "fovi_lab/__main__.py", "fovi_lab/ops/arguments.py")
#: torch's files that own what they allocate: modules (batch norm, pooling, linear), the optimizers, autograd's engine.
_TORCH_OWNERS = ("torch/nn/modules/", "torch/optim/", "torch/autograd/", "torch/amp/")


def _package_path(filename: str) -> Optional[Tuple[str, str]]:
    """(package, path from the package's folder on) of a frame's file, for fovi_lab's and fovi's files."""
    parts = filename.replace("\\", "/").split("/")
    for pkg in _PACKAGES:
        if pkg in parts[:-1]:
            i = len(parts) - 1 - parts[::-1].index(pkg)          # the last folder of that name
            return pkg, "/".join(parts[i:])
    return None


def _owner_of(frame: dict) -> Optional[str]:
    """``path:function`` of a frame that can own a block (see :func:`owner`), else None."""
    name = frame.get("filename", "").replace("\\", "/")
    where = _package_path(name)
    if where is not None:
        return None if where[1].startswith(_HARNESS) else f"{where[1]}:{frame.get('name', '?')}"
    if "/torch/" in name:
        rel = "torch/" + name.split("/torch/", 1)[1]
        if rel.startswith(_TORCH_OWNERS):
            return f"{rel}:{frame.get('name', '?')}"
    return None


def owner(frames: Sequence[dict]) -> str:
    """Who asked for a block: ``path:function`` of the innermost frame of its stack (``frames``: innermost first, each
    ``filename``, ``line``, ``name``) that is fovi_lab's (its benchmarks and command line aside, which run the step),
    fovi's, or a torch module's, optimizer's or autograd's (:data:`_TORCH_OWNERS`), else ``other``; ``unknown`` for a
    stack with no frame at all (recorded without Python stacks)."""
    if not frames:
        return "unknown"
    for f in frames:
        who = _owner_of(f)
        if who is not None:
            return who
    return "other"


def live_at_peak(events: Iterable[dict], before: int = 0) -> Tuple[int, int, Dict[int, dict]]:
    """(peak bytes, index of the event that reached it, the blocks alive then: address -> event) of one device's
    events (``alloc`` adds a block, ``free_completed`` takes it away; other actions are not allocations). ``before``:
    bytes allocated when the recording began; a free of a block that has no ``alloc`` event takes from it."""
    events = list(events)
    cur = peak = before
    peak_at = -1
    live: Dict[int, int] = {}
    for i, ev in enumerate(events):                      # pass 1: when the total peaks
        action = ev.get("action")
        if action == "alloc":
            live[ev["addr"]] = ev["size"]
            cur += ev["size"]
            if cur > peak:
                peak, peak_at = cur, i
        elif action == "free_completed":
            size = live.pop(ev["addr"], None)
            cur -= ev["size"] if size is None else size
    blocks: Dict[int, dict] = {}
    for ev in events[:peak_at + 1]:                      # pass 2: what was alive then
        if ev.get("action") == "alloc":
            blocks[ev["addr"]] = ev
        elif ev.get("action") == "free_completed":
            blocks.pop(ev["addr"], None)
    return peak, peak_at, blocks


def at_peak(snapshot: dict, device: int = 0, before: int = 0, top: int = 12) -> dict:
    """The allocations alive at the peak of ``snapshot``'s events on ``device``, by :func:`owner`: ``peak_mib``,
    ``events`` (how many were recorded), ``owners`` (``[owner, MiB, blocks]``, the largest first, at most ``top``
    and the rest summed as ``other owners``) and ``before_mib`` (``before`` less the frees of blocks allocated before
    the recording, at the peak)."""
    traces = snapshot.get("device_traces") or []
    events = traces[device] if device < len(traces) else []
    peak, peak_at, blocks = live_at_peak(events, before)
    by: Dict[str, List[int]] = {}
    for ev in blocks.values():
        acc = by.setdefault(owner(ev.get("frames") or ()), [0, 0])
        acc[0] += ev["size"]
        acc[1] += 1
    traced = sum(v[0] for v in by.values())
    rows = sorted(([k, v[0] / 2**20, v[1]] for k, v in by.items()), key=lambda r: -r[1])
    if len(rows) > top:
        rest = rows[top:]
        rows = rows[:top] + [["other owners", sum(r[1] for r in rest), sum(r[2] for r in rest)]]
    return dict(peak_mib=peak / 2**20, events=len(events), before_mib=(peak - traced) / 2**20,
                owners=[[k, round(mib, 3), n] for k, mib, n in rows])


def _dispatch_frame(filename: str) -> bool:
    """A frame of torch's operator dispatch (what runs a dispatch mode), not of the code that called the operator."""
    name = filename.replace("\\", "/")
    return "/torch/" in name and ("/torch/_dynamo/" in name or name.endswith((
        "/_ops.py", "/_compile.py", "/_python_dispatch.py", "/_tensor.py", "/overrides.py", "/_jit_internal.py")))


class _CpuRecorder:
    """The CPU's stand-in for the allocator's record: a dispatch mode that sees every operator's outputs, takes each
    output whose storage is new (none of the operator's inputs has it) as an ``alloc`` of the storage's bytes, with
    the Python stack, and gives its ``free_completed`` once the storage is gone (a weak reference to it, checked at
    every operator and at the end). Tensors made without an operator (``torch.from_numpy``, a Warp array's memory)
    are not seen; views are not allocations."""

    def __init__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self
        self.events: List[dict] = []
        self.live: Dict[int, tuple] = {}           # event id -> (storage weak handle, bytes)
        self._next = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                recorder._seen(out, args, kwargs)
                return out

        self.mode = Mode()
        self._torch = torch

    def _storages(self, tree) -> Iterator:
        from torch.utils._pytree import tree_leaves
        for t in tree_leaves(tree):
            if isinstance(t, self._torch.Tensor) and t.device.type == "cpu" and not t.is_sparse:
                st = t.untyped_storage()
                if st.data_ptr():
                    yield st

    def _seen(self, out, args, kwargs) -> None:
        import traceback
        self.collect()
        inputs = {st.data_ptr() for st in self._storages((args, kwargs or {}))}
        stack = None
        for st in self._storages(out):
            if st.data_ptr() in inputs:
                continue
            inputs.add(st.data_ptr())
            if stack is None:                      # innermost first, as the CUDA allocator's record
                frames = list(reversed(traceback.extract_stack()))
                while frames and (frames[0].filename == __file__ or _dispatch_frame(frames[0].filename)):
                    frames.pop(0)                  # this recorder and torch's dispatch machinery
                stack = [{"filename": f.filename, "line": f.lineno, "name": f.name} for f in frames]
            self._next += 1
            self.live[self._next] = (st._weak_ref(), st.nbytes())
            self.events.append({"action": "alloc", "addr": self._next, "size": st.nbytes(), "frames": stack})

    def collect(self) -> None:
        """``free_completed`` for every recorded storage that is gone since the last look."""
        storage = self._torch.UntypedStorage
        for key in [k for k, (h, _) in self.live.items() if storage._expired(h)]:
            handle, size = self.live.pop(key)
            storage._free_weak_ref(handle)
            self.events.append({"action": "free_completed", "addr": key, "size": size, "frames": []})

    def close(self) -> None:
        self.collect()
        for handle, _ in self.live.values():
            self._torch.UntypedStorage._free_weak_ref(handle)
        self.live.clear()


@contextlib.contextmanager
def recorded(device) -> Iterator[dict]:
    """Record the allocations on ``device`` inside the block, with Python stacks; the dict yielded gets ``snapshot``
    (what :func:`at_peak` reads) and ``before`` (bytes allocated when the recording began) at its end. On CUDA the
    caching allocator records them; on the CPU a dispatch mode stands in for it (:class:`_CpuRecorder`: what operators
    allocate inside the block, ``before`` 0)."""
    import torch
    out: dict = {}
    if getattr(device, "type", device) != "cuda":
        rec = _CpuRecorder()
        try:
            with rec.mode:
                yield out
            rec.collect()
            out.update(snapshot={"device_traces": [rec.events]}, before=0)
        finally:
            rec.close()
        return
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.memory._record_memory_history(max_entries=MAX_EVENTS, stacks="python")
    try:
        yield out
        torch.cuda.synchronize(device)
        out.update(snapshot=torch.cuda.memory._snapshot(), before=before)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
