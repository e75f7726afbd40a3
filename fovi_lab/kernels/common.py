"""Shared Warp plumbing for the compact KNN kernels: devices, torch interop, the NaN canary and the
per-device validated-config cache.

Why a canary at all (docs/operator.md §2.5): before Warp 1.15 a launch over the per-block
resource budget printed ``CUDA error 1: invalid argument`` and *returned normally*, leaving the output
untouched. Since 1.15 such a launch raises ``RuntimeError``. We keep a NaN-prefilled canary launch
anyway (defence in depth: a config that launches but writes nothing or garbage, other Warp versions,
graph capture) and treat both failure modes the same way: the config is unlaunchable on that device.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import io
import os
import sys
import tempfile
import threading
import warnings
from typing import Callable, Dict, Hashable, Optional, Tuple

import torch


#: When set (only by the ahead-of-time build tests), the kernel factories of every kernel module put their
#: kernels into this shared named module instead of a unique one, so one NVRTC run compiles many configs;
#: whoever sets it sets that module's options. Kept here, below every kernel module, so each reads it.
SHARED_KERNEL_MODULE: Optional[str] = None

__all__ = [
    "wp", "init_warp", "cuda_driver_present", "warp_device", "to_warp", "torch_stream", "warp_stream",
    "nan_canary", "ValidatedCache", "check_once", "check_tensor", "warp_ct", "fast_launch", "gather_rows",
]

try:  # Warp is a hard dependency of the package, but keep import errors readable.
    import warp as wp
except Exception as exc:  # pragma: no cover - exercised only without warp-lang
    wp = None
    _WARP_IMPORT_ERROR: Optional[BaseException] = exc
else:
    _WARP_IMPORT_ERROR = None

_init_lock = threading.Lock()
_initialised = False


#: What Warp's native library prints on a machine without an NVIDIA driver, where the kernels run on Warp's CPU
#: device as intended: :func:`init_warp` keeps it off the terminal.
NO_DRIVER_LINE = "Could not find or load the NVIDIA CUDA driver"


def cuda_driver_present() -> bool:
    """Whether this machine has an NVIDIA driver library Warp could load (``libcuda`` / ``nvcuda.dll``)."""
    names = ("nvcuda.dll",) if os.name == "nt" else ("libcuda.so.1", "libcuda.so")
    for name in names:
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


@contextlib.contextmanager
def _without_the_no_driver_line():
    """Capture what native code writes to file descriptor 2 while the block runs, then pass on every line except
    Warp's missing-driver warning (native code writes past ``sys.stderr``, so only the descriptor catches it)."""
    try:
        sys.stderr.flush()
        captured = tempfile.TemporaryFile()
    except (OSError, ValueError, AttributeError):        # no temporary folder, or no usable sys.stderr
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:                                      # no real descriptor 2 (an embedded interpreter)
        captured.close()
        yield
        return
    with captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            rest = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if NO_DRIVER_LINE not in line]
            if rest:
                sys.stderr.write("".join(rest))
                sys.stderr.flush()


def init_warp() -> None:
    """Initialise Warp once, quietly: its log level set to warnings (``wp.config.quiet`` is a no-op in 1.19), and on
    a machine without an NVIDIA driver, where the kernels run on Warp's CPU device, without the native
    missing-driver line (:data:`NO_DRIVER_LINE`)."""
    global _initialised
    if wp is None:
        raise ImportError(f"warp-lang is required for the Warp kernels: {_WARP_IMPORT_ERROR}")
    with _init_lock:
        if not _initialised:
            if hasattr(wp, "LOG_WARNING"):
                wp.config.log_level = wp.LOG_WARNING
            with contextlib.nullcontext() if cuda_driver_present() else _without_the_no_driver_line():
                wp.init()
            _initialised = True


def warp_device(t: torch.Tensor) -> str:
    """Warp device string for a torch tensor (``"cpu"`` or ``"cuda:i"``)."""
    init_warp()
    if t.device.type == "cpu":
        return "cpu"
    if t.device.type == "cuda":
        return f"cuda:{t.device.index if t.device.index is not None else torch.cuda.current_device()}"
    raise ValueError(f"tensor on unsupported device {t.device}; Warp kernels run on cpu or cuda")


def to_warp(t: torch.Tensor, dtype=None):
    """Zero-copy Warp view of a torch tensor (strides kept)."""
    return wp.from_torch(t, dtype=dtype)


@contextlib.contextmanager
def torch_stream(device: str):
    """Launch on torch's current stream so ordering with torch ops holds."""
    if device.startswith("cuda"):
        with wp.ScopedStream(wp.stream_from_torch(torch.cuda.current_stream(torch.device(device)))):
            yield
    else:
        yield


_stream_lock = threading.Lock()
_STREAMS: Dict[Tuple[str, int], object] = {}


# torch's current raw stream handle by device index: the accessor inductor's generated code uses, ~20x
# cheaper than ``torch.cuda.current_stream(device).cuda_stream`` (which builds a Stream object per call)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_DEVICE_INDEX: Dict[str, int] = {}


def warp_stream(device: str):
    """The Warp stream wrapping torch's *current* stream on ``device`` (None on the CPU), cached per
    (device, stream handle): pass it as ``wp.launch(..., stream=...)`` so ordering with torch ops holds
    without building a new wrapper and a ``ScopedStream`` on every launch."""
    if not device.startswith("cuda"):
        return None
    idx = _DEVICE_INDEX.get(device)
    if idx is None:
        idx = _DEVICE_INDEX[device] = torch.device(device).index or 0
    handle = _raw_stream(idx) if _raw_stream is not None else torch.cuda.current_stream(idx).cuda_stream
    key = (device, handle)
    s = _STREAMS.get(key)
    if s is None:
        with _stream_lock:
            s = _STREAMS.get(key)
            if s is None:            # (the current stream is per thread: ts is the stream of ``handle``)
                s = _STREAMS[key] = wp.stream_from_torch(torch.cuda.current_stream(idx))
    return s


def capturing(t: torch.Tensor) -> bool:
    """Whether ``t``'s device stream is being captured into a CUDA graph. Caches of operands derived
    from a tensor's *values* (weight layouts, padded bias) must not be read then: a graph that
    captured a cache hit would replay the old layout after an in-place update of the weight."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def check_tensor(name: str, t, *, dtype=None, dim=None, device=None, contiguous=False, shape=None) -> None:
    """Raise a clear error naming ``name`` when ``t`` is not what a kernel needs."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if dtype is not None and isinstance(dtype, tuple):        # one of several dtypes
        if t.dtype not in dtype:
            raise TypeError(f"{name}: expected dtype {' or '.join(map(str, dtype))}, got {t.dtype}")
    elif dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if dim is not None and t.dim() != dim:
        raise ValueError(f"{name}: expected a {dim}-D tensor, got shape {tuple(t.shape)}")
    if shape is not None:
        want = tuple(shape)
        if len(want) != t.dim() or any(w is not None and w != s for w, s in zip(want, t.shape)):
            pretty = "[" + ", ".join("*" if w is None else str(w) for w in want) + "]"
            raise ValueError(f"{name}: expected shape {pretty}, got {tuple(t.shape)}")
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"{name}: expected device {device}, got {t.device}")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")


def nan_canary(launch: Callable[[], None], out: torch.Tensor) -> Tuple[bool, str]:
    """Prefill ``out`` with NaN, call ``launch`` (which must write all of ``out``), report (ok, why).

    Both failure modes count: a raised launch error (Warp >= 1.15) and a launch that returned but
    left NaN in the output (the silent trap of older Warp, or a kernel that writes nothing).
    """
    out.fill_(float("nan"))
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            launch()
            if out.is_cuda:
                torch.cuda.synchronize(out.device)
            else:
                wp.synchronize()
    except Exception as exc:  # RuntimeError from the launch, or a compile error
        return False, f"launch raised {type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    if not bool(torch.isfinite(out).all()):
        return False, "launch returned but left NaN in the canary output (silent launch failure)"
    return True, "ok"


_check_once_lock = threading.Lock()


def check_once(cache: Dict[Hashable, bool], key: Hashable, check: Callable[[], bool], failure: str) -> bool:
    """The cached outcome of a once-per-device kernel check: ``check()`` (True when the kernel's output equals its
    reference's) runs the first time ``key`` is asked for; a False result or an exception warns once with
    ``failure`` (its ``{why}`` filled in with the mismatch or the exception), and callers then take their
    reference path for that key. Threads asking at once may both run the check; the first result stored wins."""
    got = cache.get(key)
    if got is not None:
        return got
    try:
        ok = bool(check())
        why = "" if ok else "its output differs from the reference's"
    except Exception as exc:                                         # a build or launch failure
        ok, why = False, f"{type(exc).__name__}: {exc}"
    with _check_once_lock:
        first = key not in cache
        if first:
            cache[key] = ok
        got = cache[key]
    if first and not ok:
        warnings.warn(failure.format(why=why), RuntimeWarning, stacklevel=4)
    return got


class ValidatedCache:
    """Per-(key, device) cache of built-and-validated kernel configs; ``None`` marks unlaunchable.

    ``get(key, device, build)`` calls ``build()`` once per (key, device); ``build`` returns the config
    object or raises; a failing build is remembered as ``None`` with a warning that says why.
    """

    def __init__(self, what: str):
        self.what = what
        self._store: Dict[Tuple[Hashable, str], object] = {}
        self._why: Dict[Tuple[Hashable, str], str] = {}
        self._lock = threading.Lock()
        #: bumped by :meth:`clear`, so caches built on top of this one can tell their entries are stale
        self.generation = 0

    def get(self, key: Hashable, device: str, build: Callable[[], Tuple[object, str]]):
        k = (key, device)
        with self._lock:
            if k in self._store:
                return self._store[k]
        value, why = build()
        with self._lock:
            self._store[k] = value
            self._why[k] = why
        if value is None:
            warnings.warn(f"{self.what} {key!r} is not launchable on {device}: {why}; skipping it",
                          RuntimeWarning, stacklevel=3)
        return value

    def has(self, key: Hashable, device: str) -> bool:
        """Whether (key, device) was built and validated already (successfully or not)."""
        with self._lock:
            return (key, device) in self._store

    def why(self, key: Hashable, device: str) -> Optional[str]:
        return self._why.get((key, device))

    def clear(self) -> None:
        with self._lock:
            self._store.clear()
            self._why.clear()
            self.generation += 1


try:  # the ctypes struct of a Warp array argument (what wp.from_torch(..., return_ctype=True) returns)
    from warp._src.types import array_t as _array_t
except ImportError:  # older Warp layouts
    from warp.types import array_t as _array_t


def warp_ct(t: torch.Tensor):
    """Low-overhead Warp array *descriptor* (a ctypes struct) of a torch tensor, for :func:`fast_launch`.

    Cheaper to build on the host than a ``wp.array`` view; it does not own the memory and skips Warp's dtype
    check, so callers keep the tensor alive over the launch and pass only the dtypes the kernel
    declares (a wrong one would give wrong numbers, which every kernel's NaN canary, checked against
    the reference on first use per device, would report).
    """
    nd = t.dim()
    if not 1 <= nd <= 4:
        raise ValueError(f"warp_ct: expected a 1-D to 4-D tensor, got shape {tuple(t.shape)}")
    # Built field by field: cheaper on the host than wp.from_torch(t, return_ctype=True), and it never touches
    # t.grad (from_torch wraps, or allocates, the gradient of a tensor that requires grad).
    c = _array_t()
    c.data = t.data_ptr()
    c.ndim = nd
    es = t.element_size()
    shape, strides = c.shape, c.strides
    for i, (n, st) in enumerate(zip(t.shape, t.stride())):
        shape[i] = n
        strides[i] = st * es
    return c


def warp_ct_vec(t: torch.Tensor, width: int = 4):
    """:func:`warp_ct` of a contiguous 2-D fp32 tensor ``[rows, cols]`` seen as a Warp array of
    ``vector(width, float32)`` ``[rows, cols / width]`` (one 16-byte load per ``vec4``). The caller
    pads ``cols`` to a multiple of ``width`` and declares ``wp.array2d(dtype=wp.vec4)`` in the kernel."""
    if t.dim() != 2 or t.dtype != torch.float32 or not t.is_contiguous() or t.shape[1] % width:
        raise ValueError(f"warp_ct_vec: expected a contiguous fp32 [rows, cols] tensor with cols a multiple "
                         f"of {width}, got {t.dtype} {tuple(t.shape)} (contiguous={t.is_contiguous()})")
    c = _array_t()
    c.data = t.data_ptr()
    c.ndim = 2
    c.shape[0], c.shape[1] = t.shape[0], t.shape[1] // width
    c.strides[0], c.strides[1] = t.shape[1] * 4, width * 4
    return c


_fast_lock = threading.Lock()
_FAST: Dict[Tuple, object] = {}


def fast_launch(kernel, dims, inputs, block_dim: int, device: str, tiled: bool = True) -> None:
    """``wp.launch_tiled`` on torch's current stream with the host cost of a recorded launch.

    At small batch the host is the bottleneck (a compact layer is a fraction of a millisecond of GPU work, and
    ``wp.launch`` packs every argument anew; the forward's per-call host times are in
    fovi_lab/records/h200/logs/host_probe_*.json), so one recorded ``wp.Launch`` is kept per (kernel,
    device, grid, block_dim) and each call only re-sets its parameters from ``inputs`` (array
    descriptors from :func:`warp_ct`, or ints) before launching. ``tiled=False``: a plain SIMT
    ``wp.launch`` over ``dims`` threads.
    """
    key = (kernel, device, tuple(dims), int(block_dim), tiled)
    stream = warp_stream(device)
    with _fast_lock:                       # one recorded launch is shared: set + launch must not interleave
        cmd = _FAST.get(key)
        if cmd is None:
            if tiled:
                cmd = wp.launch_tiled(kernel, dim=dims, inputs=inputs, block_dim=block_dim, device=device,
                                      record_cmd=True)
            else:
                cmd = wp.launch(kernel, dim=dims, inputs=inputs, block_dim=block_dim, device=device,
                                record_cmd=True)
            if len(_FAST) > 1024:
                _FAST.clear()
            _FAST[key] = cmd
        else:
            for i, v in enumerate(inputs):
                cmd.set_param_at_index_from_ctype(i, v)
        cmd.launch(stream=stream)


# --------------------------------------------------------------------------------------------------
# Row gather: dst[i, :] = src[idx[idx0 + i], :] (the stems' staged operands: the i2c forward's im2col
# stage, the gi2i/gi3i/gw3i adjoints' staged W and x rows)
# --------------------------------------------------------------------------------------------------

def built_once(factory: Callable[[], object]) -> Callable[[], object]:
    """Decorator for a function that defines one module-level Warp kernel: the first call initialises Warp
    and runs ``factory`` under a lock; every later call returns the same kernel without locking (these
    getters sit on per-launch paths)."""
    lock = threading.Lock()
    box: list = []

    @functools.wraps(factory)
    def get():
        if not box:
            init_warp()
            with lock:
                if not box:
                    box.append(factory())
        return box[0]
    return get


@built_once
def gather_rows_kernel():
    """SIMT row-gather kernel over 8-byte elements (``int64`` views of fp16 rows): one thread per
    element, so a warp copies 256 contiguous bytes of one gathered row."""
    @wp.kernel(enable_backward=False, module="unique")
    def fovi_gather_rows(src: wp.array2d(dtype=wp.int64), idx: wp.array1d(dtype=wp.int32),
                         dst: wp.array2d(dtype=wp.int64), idx0: int):
        i, j = wp.tid()
        dst[i, j] = src[idx[idx0 + i], j]
    return fovi_gather_rows


@built_once
def gather_rows_pair_kernel():
    """Two row gathers in one SIMT launch (one fewer launch per call on host-bound eager paths): threads
    ``[0, n_a)`` copy ``dst_a[i, :] = src_a[idx_a[idx0_a + i], :]`` (``n_a = rows * dst_a.shape[1]``
    elements), the rest do the same for ``b``; 8-byte elements, consecutive threads along a row."""
    @wp.kernel(enable_backward=False, module="unique")
    def fovi_gather_rows_pair(src_a: wp.array2d(dtype=wp.int64), idx_a: wp.array1d(dtype=wp.int32),
                              dst_a: wp.array2d(dtype=wp.int64), idx0_a: int, n_a: int,
                              src_b: wp.array2d(dtype=wp.int64), idx_b: wp.array1d(dtype=wp.int32),
                              dst_b: wp.array2d(dtype=wp.int64), idx0_b: int):
        t = wp.tid()
        if t < n_a:
            ca = dst_a.shape[1]
            i = t // ca
            j = t - i * ca
            dst_a[i, j] = src_a[idx_a[idx0_a + i], j]
        else:
            u = t - n_a
            cb = dst_b.shape[1]
            i = u // cb
            j = u - i * cb
            dst_b[i, j] = src_b[idx_b[idx0_b + i], j]
    return fovi_gather_rows_pair


def as_rows64(t: torch.Tensor) -> torch.Tensor:
    """A contiguous 2-D tensor viewed as ``[rows, row_bytes / 8]`` int64 (rows must be 8-byte multiples)."""
    rb = t.shape[1] * t.element_size()
    if t.dim() != 2 or rb % 8 or not t.is_contiguous():
        raise ValueError(f"gather_rows: expected contiguous 2-D rows of a multiple of 8 bytes, got shape "
                         f"{tuple(t.shape)} of {t.dtype}")
    return t.view(torch.int64)


def gather_rows(src: torch.Tensor, idx: torch.Tensor, out: torch.Tensor, idx0: int = 0) -> None:
    """``out[i, :] = src[idx[idx0 + i], :]`` for ``i < out.shape[0]``, a recorded Warp launch on torch's
    current stream (:func:`fast_launch`).

    ``src`` / ``out``: contiguous 2-D tensors of one dtype whose rows are a multiple of 8 bytes; ``idx``:
    int32 with entries in ``[0, src.shape[0])`` (not checked here: callers range-check their tables
    once per table version).
    """
    if out.shape[1] != src.shape[1] or out.dtype != src.dtype:
        raise ValueError(f"gather_rows: out {tuple(out.shape)} {out.dtype} does not match src "
                         f"{tuple(src.shape)} {src.dtype}")
    if idx.dtype != torch.int32 or idx.dim() != 1 or not 0 <= idx0 <= idx.numel() - out.shape[0]:
        raise ValueError(f"gather_rows: idx must be 1-D int32 with idx0 + out rows <= its length, got "
                         f"{idx.dtype} {tuple(idx.shape)}, idx0={idx0}, {out.shape[0]} rows")
    s, d = as_rows64(src), as_rows64(out)
    fast_launch(gather_rows_kernel(), (d.shape[0], d.shape[1]), [warp_ct(s), warp_ct(idx), warp_ct(d), int(idx0)],
                256, warp_device(src), tiled=False)
