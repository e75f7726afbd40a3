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
(:data:`BEFORE`), given as the allocated total when the recording began.

``python -m fovi_lab bench network --memory-trace`` records it per network, backend and mode
(:func:`fovi_lab.bench.network.network_records`); the functions here need no GPU and are tested on made-up
events.
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
#: fovi_lab's files that run a step rather than own its memory (the benchmarks): never an owner.
_HARNESS = ("fovi_lab/bench/",)


def _package_path(filename: str) -> Optional[Tuple[str, str]]:
    """(package, path from the package's folder on) of a frame's file, for fovi_lab's and fovi's files."""
    parts = filename.replace("\\", "/").split("/")
    for pkg in _PACKAGES:
        if pkg in parts[:-1]:
            i = len(parts) - 1 - parts[::-1].index(pkg)          # the last folder of that name
            return pkg, "/".join(parts[i:])
    return None


def owner(frames: Sequence[dict]) -> str:
    """Who asked for a block: ``path:function`` of the innermost frame in fovi_lab (its benchmarks aside, which run
    the step) else fovi of its stack (``frames``: innermost first, each ``filename``, ``line``, ``name``), else of its
    innermost frame in a torch module
    (``torch/nn/...``, ``torch/optim/...``, ``torch/autograd/...``), else ``other``. A stack with no frame at all
    (recorded without Python stacks) is ``unknown``."""
    if not frames:
        return "unknown"
    for pkg in _PACKAGES:
        for f in frames:
            where = _package_path(f.get("filename", ""))
            if where is not None and where[0] == pkg and not where[1].startswith(_HARNESS):
                return f"{where[1]}:{f.get('name', '?')}"
    for f in frames:
        name = f.get("filename", "").replace("\\", "/")
        if "/torch/" in name and not name.endswith(("torch/cuda/memory.py", "torch/_tensor.py")):
            return f"torch/{name.split('/torch/', 1)[1]}:{f.get('name', '?')}"
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


@contextlib.contextmanager
def recorded(device) -> Iterator[dict]:
    """Record the allocator's events on ``device`` (CUDA) inside the block, with Python stacks; the dict yielded gets
    ``snapshot`` (what :func:`at_peak` reads) and ``before`` (bytes allocated when the recording began) at its end.
    On the CPU it records nothing (the dict stays empty)."""
    import torch
    out: dict = {}
    if getattr(device, "type", device) != "cuda":
        yield out
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
