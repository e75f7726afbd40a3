"""CUDA-graph capture of a compact-conv step: what removes the per-call host cost at small batch.

At small batch a compact layer is ~0.03-0.1 ms of GPU work, while issuing it from Python costs as much
or more: argument checks, operand layouts, torch allocations and the Warp launches took ~0.15 ms per
forward and ~0.5 ms per train step on the H200 machine's host (``fovi_lab/records/h200/logs/host_probe_before.json``), and
still 0.05-0.07 ms and 0.28-0.40 ms after the host path was trimmed (res18 layer1,
``fovi_lab/records/h200/logs/host_probe_trimmed.json``). A CUDA graph records the kernels once and replays them with
one launch, so the step costs its GPU time. Weight and bias layouts that the eager path caches per
tensor version are rebuilt inside a capture, so a graph replays them from the current weights (checked
on the H200: replay after an in-place weight update matches eager).

Every op of the ``warp_train`` / ``warp_compact`` backends is capturable: Warp launches go to torch's
current stream (which the capture records), allocations come from torch's caching allocator (which
gives a graph its private pool) and nothing synchronises with the host. Checked on the H200: replayed
outputs are bitwise equal to eager ones.

The usual CUDA-graph rules apply: the replay reuses the *same* input and output tensors (copy new
data into the static inputs before :meth:`CapturedStep.replay`, read the outputs after it), shapes are
fixed, and the first eager calls (which compile Warp modules and run each config's canary) happen
before capture: :func:`capture` does that warm-up on a side stream.

``torch.compile(model, mode="reduce-overhead")`` (Inductor's CUDA graphs) needs the same: the layers' tables
on the device and the kernels' derived tables (reverse lists, node-major copies, call plans) are built on a
layer's first call and kept, and built inside the compiled region they land in the graphs' memory pool, which
Inductor refuses ("tensor(s) in the cudagraph pool not tracked as outputs"). :func:`prepare` runs one eager
forward and backward first. Measured on the H200 (AlexNet L2-L4 stack, B = 64, fp16, ``warp_train``): with one
eager step first the reduce-overhead step took 2.29 ms against eager's 4.79 ms; without it compilation
refused 30 tensors (``data/h200/compile_step.jsonl``, kind ``reduce_overhead_probe``).

For an eager training loop, :func:`graphed` wraps a module so its forward and its backward each replay from a
CUDA graph (``torch.cuda.make_graphed_callables``, after :func:`prepare`); on the CPU it returns the module as it
is. Its warm-ups run with the backends' own per-call graphs suspended (:func:`suspend_per_call`): the
whole-step graph never replays them, and on fovi's ResNet-18 at B = 64 they held 492 of the graphed step's 1,090 MiB
peak (``data/h100/network.jsonl``, commit 2cd909c). Per-call graphs made before it (eager steps of the same model)
are dropped at each layer's first warm-up call, their copies freed before the warm-up steps add to the peak, and
the capture owns the layers from then on (:mod:`fovi_lab.ops.replay`).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, List, Optional

import torch

__all__ = ["CapturedStep", "capture", "prepare", "graphed", "keep_alive_while_captured", "suspend_per_call",
           "per_call_suspended"]

_KEEPERS: List[Callable[[], object]] = []
#: Called after :func:`graphed`'s capture, outside it (:mod:`fovi_lab.ops.replay` destroys the per-call graphs an outer
#: capture made their layers drop).
_AFTER_CAPTURE: List[Callable[[], None]] = []
_suspend_lock = threading.Lock()
_suspended = 0                      # open suspend_per_call() blocks, process-wide


@contextlib.contextmanager
def suspend_per_call() -> Iterator[None]:
    """Inside, the backends' calls run directly (:mod:`fovi_lab.ops.replay` caches, captures and replays no signature;
    exported there as ``suspended``). :func:`graphed` runs its warm-ups and its capture in it: per-call graphs made
    there (static copies and pools) would never be replayed by the whole-step graph. It holds for the whole process,
    not this thread alone: autograd runs a CUDA backward on a worker thread of its own, and the backward's calls must
    run directly too (other threads' calls meanwhile run directly as well: correct, only not replayed)."""
    global _suspended
    with _suspend_lock:
        _suspended += 1
    try:
        yield
    finally:
        with _suspend_lock:
            _suspended -= 1


def per_call_suspended() -> bool:
    """Whether a :func:`suspend_per_call` block is open (in any thread)."""
    return _suspended > 0


def keep_alive_while_captured(provider: Callable[[], object]) -> None:
    """Register ``provider()``: what a backend holds that a captured graph's kernels may read (index tables and
    their derived copies, built before capture outside the graph's pool). :func:`capture` calls it after each
    capture and the :class:`CapturedStep` holds the result, so evicting a backend cache never frees memory a
    replay still reads."""
    _KEEPERS.append(provider)


class CapturedStep:
    """A captured callable: :meth:`replay` re-runs its kernels; :attr:`outputs` are the static results."""

    def __init__(self, graph: "torch.cuda.CUDAGraph", outputs, pool=None, kept=()):
        self.graph = graph
        self.outputs = outputs
        self.pool = pool
        self._kept = kept                # what the backends' caches held at capture (keep_alive_while_captured)

    def replay(self):
        """Run the captured kernels again (on torch's current stream); returns :attr:`outputs`."""
        self.graph.replay()
        return self.outputs

    __call__ = replay


def capture(fn: Callable[[], object], *, warmup: int = 3, device: Optional[torch.device] = None,
            pool=None, keep_cache: bool = False) -> CapturedStep:
    """Capture ``fn()`` (no arguments; it closes over static CUDA tensors) into a CUDA graph.

    Args:
        fn: the step to capture, e.g. ``lambda: (ops.forward(meta, x, w, b),) +
            tuple(ops.backward_combined(meta, g, x, w))``.
        warmup: eager calls first, on a side stream (Warp compiles/validates kernels there, torch's
            allocator warms up); CUDA graphs need at least one.
        device: the CUDA device (default: the current one).
        pool: another capture's memory pool (:attr:`CapturedStep.pool`) to share (``torch.cuda.graph``'s ``pool``):
            for graphs that hold no live tensor in it and never run at once.
        keep_cache: capture without emptying torch's allocator cache first (``torch.cuda.graph`` empties it): the
            free blocks stay where they are, so the tensors allocated after the capture land where they would have
            without it (what :mod:`fovi_lab.ops.replay`'s in-place graphs, keyed by addresses, rely on).

    Raises:
        RuntimeError: without CUDA (graphs are a CUDA feature; on the CPU call ``fn`` directly).
    """
    if not torch.cuda.is_available():
        raise RuntimeError("capture: CUDA graphs need a CUDA device; on the CPU call the step directly")
    if warmup < 1:
        raise ValueError(f"warmup: expected at least 1 eager call before capture, got {warmup}")
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    if keep_cache:
        with torch.cuda.stream(torch.cuda.Stream(device)):
            graph.capture_begin(pool=pool)
            try:
                outputs = fn()
            finally:
                graph.capture_end()
    else:
        with torch.cuda.graph(graph, pool=pool):
            outputs = fn()
    return CapturedStep(graph, outputs, pool=graph.pool(), kept=tuple(provider() for provider in _KEEPERS))


def prepare(model: torch.nn.Module, *inputs) -> None:
    """Three eager forwards and backwards of ``model(*inputs)``, leaving the parameters' gradients as they were: they
    build every per-layer table and kernel plan outside any CUDA-graph pool, before
    ``torch.compile(model, mode="reduce-overhead")`` (see the module docstring), and the later two let the Warp
    backends capture their own per-call graphs (:mod:`fovi_lab.ops.replay`: a forward on its second call, the
    backward that reads its copies on the third) there too. Call it as training calls
    the model: same batch size, dtypes and autocast context (the plans are per call signature). The buffers
    (BatchNorm's running statistics and batch count) are restored too: the calls are not training steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    for p in params:                     # backward would add into an existing grad in place
        p.grad = None
    try:
        for _ in range(3):
            out = model(*inputs)
            outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                    if isinstance(t, torch.Tensor) and t.requires_grad]
            if outs:
                torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
            for p in params:
                p.grad = None
    finally:
        for p, g in zip(params, saved):
            p.grad = g
        with torch.no_grad():
            for b, kept in buffers:
                b.copy_(kept)


def graphed(module: torch.nn.Module, sample_input, *, warmup: int = 3,
            autocast: Optional[torch.dtype] = None) -> torch.nn.Module:
    """``module`` with its forward and backward each replayed from a CUDA graph: the contract of
    ``torch.cuda.make_graphed_callables(module, sample_args)``, after :func:`prepare` has built every table and plan
    outside the graphs' memory pool.

    Args:
        module: a module whose layers may use any backend (the Warp backends capture; see the module doc). Train
            or eval mode as it will be called; no hooks (a CUDA-graph rule).
        sample_input: a tensor or a tuple of tensors like the ones it will be called with: same shapes, dtypes,
            device and ``requires_grad`` (the graphs are fixed to them).
        warmup: eager iterations before each capture (``num_warmup_iters``).
        autocast: for mixed precision, the autocast dtype (``torch.float16`` / ``torch.bfloat16``): the warm-up
            and the capture run under ``torch.autocast("cuda", dtype, cache_enabled=False)`` (autocast's weight
            cache cannot live in a graph), so the graphs hold autocast's casts, fp32 master weights included, and
            replay them wherever the module is called. None: the module runs in its own dtypes.

    Returns:
        On CUDA, ``module`` itself with its ``forward`` replaced by the graphed one (what
        ``make_graphed_callables`` does to a module): call it as before, with inputs of the sample's shapes; its
        parameters are unchanged, so an optimizer over them steps it. On the CPU (graphs are a CUDA feature)
        ``module`` unchanged: the same loop runs eagerly.

    Raises:
        TypeError: ``module`` is not a module, ``sample_input`` not a tensor or a tuple of tensors, or ``warmup``
        not an int. ValueError: the sample and the parameters are not all on one device, ``warmup`` is below 1,
        or ``autocast`` is not a half dtype.
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"module: expected a torch.nn.Module, got {type(module).__name__}")
    args = sample_input if isinstance(sample_input, tuple) else (sample_input,)
    bad = [type(a).__name__ for a in args if not isinstance(a, torch.Tensor)]
    if not args or bad:
        held = f" holding {', '.join(bad)}" if isinstance(sample_input, tuple) and bad else ""
        raise TypeError(f"sample_input: expected a tensor or a tuple of tensors, got "
                        f"{'an empty tuple' if not args else type(sample_input).__name__ + held}")
    if isinstance(warmup, bool) or not isinstance(warmup, int):
        raise TypeError(f"warmup: expected an int, got {type(warmup).__name__}")
    if warmup < 1:
        raise ValueError(f"warmup: expected at least 1 eager iteration before capture, got {warmup}")
    if autocast not in (None, torch.float16, torch.bfloat16):
        raise ValueError(f"autocast: expected None, torch.float16 or torch.bfloat16, got {autocast!r}")
    devices = {a.device for a in args} | {p.device for p in module.parameters()}
    if len(devices) > 1:
        raise ValueError(f"sample_input: expected the sample and the module's parameters on one device, got "
                         f"{', '.join(sorted(str(d) for d in devices))}")
    if next(iter(devices)).type != "cuda":
        return module
    amp = (torch.autocast("cuda", dtype=autocast, cache_enabled=False) if autocast is not None
           else contextlib.nullcontext())
    # the whole step is one graph: per-call graphs made during the warm-ups would only hold memory
    with amp, suspend_per_call():
        prepare(module, *args)
        out = torch.cuda.make_graphed_callables(module, args, num_warmup_iters=warmup)
    for hook in _AFTER_CAPTURE:                # the per-call graphs the capture made its layers drop, destroyed
        hook()
    return out
