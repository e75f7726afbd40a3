"""``backend="auto"`` on the CPU: the fastest of the CPU forms for each call shape, measured once per machine.

The forms: ``torch_compact`` (per-node gather-GEMMs), ``torch_binned`` (inputs binned into the taps by a scatter,
then one shared-weight GEMM), ``torch_dense`` (the same binning as dense one-hot GEMMs, :mod:`fovi_lab.ops.dense`)
and, for fp16 / bf16 calls where warp-lang imports, Warp's CPU kernels (``warp_compact`` for inference,
``warp_train`` for a train step). Which is fastest depends on the layer, the batch and the machine: on a 2-core
x86-64 CPU ``torch_compact`` was the slowest form at B = 1 on most layers and the fastest on some at B = 32.

A *call shape* is the layer's sizes, the batch, the compute dtype and the mode (``"forward"``: inference,
``"train-step"``: forward and both gradients). For each, :func:`decide` answers, in this order:

1. an entry of the tune cache for this machine (:mod:`fovi_lab.ops.tune_cache`: ``python -m fovi_lab tune``'s, or
   an earlier measurement of this one): ``measured`` / ``tuned``;
2. else, unless ``FOVI_KNN_AUTO_MEASURE=off``, a measurement now (:func:`measure`): each form runs on random
   operands of the call's shape (never the caller's tensors), the forms' first calls in the order of their
   estimates; a form whose first two calls each take more than :data:`CUTOFF` times the fastest first call so far
   is not repeated (its time is its second call's, marked ``cut``); the others then run :data:`MEASURE_REPS`
   rounds in turn (so that other work on the machine falls on every form alike), more where a form's rounds add
   up to less than :data:`MEASURE_MIN_MS` (up to :data:`MEASURE_MAX_REPS`: a millisecond call is timed over many
   rounds, not five), and each takes its median round.
   The fastest form is stored in the tune cache with every form's time
   (``"source": "measured"``), so this machine never measures that shape again (a new release, a new PyTorch or
   a changed kernel switch misses and measures again);
3. else the estimate (:func:`estimate_ms`): a cost model of each form from the layer's sizes (GEMM FLOPs, the
   values gathered and scattered, per-node products), with rates read off a 2-core x86-64 CPU: a first guess,
   never a measurement of this machine.

:func:`cpu_pick` is what :func:`fovi_lab.ops.dispatch.select_backend` calls: it decides once per call signature (the
shape, PyTorch's thread count, the setting, the cache's generation) and then answers from memory.
:func:`fovi_lab.explain` shows the choice with its times (:func:`known_choice`, which never measures).
"""

from __future__ import annotations

import datetime as _dt
import math
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

import torch

import fovi_lab.settings as settings
from fovi_lab.ops import tune_cache
from fovi_lab.ops.registry import OPS_REGISTRY, get_ops, load_optional_backends

__all__ = ["TORCH_FORMS", "WARP_FORMS", "MEASURE_REPS", "MEASURE_MIN_MS", "MEASURE_MAX_REPS", "CUTOFF", "CpuChoice",
           "forms", "estimate_ms", "estimates", "another_round",
           "measure", "decide", "known_choice", "cpu_pick", "forget", "problem_entry_key"]

#: The PyTorch forms, every dtype.
TORCH_FORMS = ("torch_compact", "torch_binned", "torch_dense")
#: Warp's CPU kernels per mode, for the dtypes they compute in (fp16, bf16).
WARP_FORMS = {"forward": "warp_compact", "train-step": "warp_train"}
#: Timed rounds per form after its first call, and the factor over the fastest first call past which a form's first
#: call ends its measurement.
MEASURE_REPS = 5
CUTOFF = 3.0
#: Rounds continue past :data:`MEASURE_REPS` until every form's rounds add up to this many milliseconds, up to
#: :data:`MEASURE_MAX_REPS` rounds: on a 2-core x86-64 VM one form's median of seven calls of a few milliseconds
#: varied by up to 1.4x from one measurement to the next (torch_binned, res18_layer4_0 at B = 1: 8.5 to 11.6 ms).
MEASURE_MIN_MS = 200.0
MEASURE_MAX_REPS = 40
#: The clock :func:`measure` reads, in seconds.
CLOCK: Callable[[], float] = time.perf_counter

# Rates of the estimate, read off a 2-core x86-64 CPU (AMD EPYC, PyTorch 2.13, fp32), rounded: per millisecond.
_GEMM_FLOPS = 3e7           # a large GEMM
_GATHER = 3e5               # values gathered by index_select
_SCATTER = 2e5              # values summed in by index_add_
_CALL_MS = 0.05             # a pass's fixed host cost
_WARP_FLOPS = 3.5e6         # Warp's CPU kernels (one thread per block)
_HALF_SLOWDOWN = 10.0       # PyTorch's fp16 / bf16 GEMMs on a CPU


def _small_gemm(flops: float, smallest: int) -> float:
    """Milliseconds of batched small GEMMs whose smallest side is ``smallest``: their rate falls with it."""
    return flops / (_GEMM_FLOPS * smallest / (smallest + 16.0))


def forms(dtype: torch.dtype, training: bool) -> Tuple[str, ...]:
    """The registered CPU forms for a call in ``dtype``: the PyTorch ones, and Warp's where it computes in
    ``dtype``."""
    load_optional_backends()
    out = [f for f in TORCH_FORMS if f in OPS_REGISTRY]
    warp = OPS_REGISTRY.get(WARP_FORMS["train-step" if training else "forward"])
    if warp is not None and dtype in getattr(warp, "compute_dtypes", ()):
        out.append(warp.name)
    return tuple(out)


def estimate_ms(meta, batch: int, form: str, training: bool, dtype: torch.dtype = torch.float32) -> float:
    """The estimated milliseconds of one call of ``form`` (forward, or forward and both gradients when ``training``)
    on a CPU: the cost model of the module docstring."""
    b, passes = int(batch), (3 if training else 1)
    weff = meta.nout * meta.p64 * meta.cout                   # the compact form's per-node weight rows
    if form == "torch_compact":
        rows = b * meta.nout * meta.p64
        one = (weff + rows) / _GATHER + _small_gemm(2.0 * rows * meta.cout, b)
        ms = passes * one + ((rows + weff) / _SCATTER if training else 0.0)
    elif form == "torch_binned":
        vals, gemm = b * meta.nnz * meta.cin, 2.0 * b * meta.cout * meta.q * meta.nout / _GEMM_FLOPS
        binning = vals / _GATHER + vals / _SCATTER
        ms = binning + gemm + ((2 * gemm + binning + vals / _GATHER + vals / _SCATTER) if training else 0.0)
    elif form == "torch_dense":
        vals, gemm = b * meta.cin * meta.nout * meta.k, 2.0 * b * meta.cout * meta.q * meta.nout / _GEMM_FLOPS
        binning = vals / _GATHER + _small_gemm(2.0 * vals * meta.v, min(b * meta.cin, meta.k, meta.v))
        ms = binning + gemm + ((2 * gemm + 2 * binning + vals / _SCATTER) if training else 0.0)
    elif form in WARP_FORMS.values():
        return passes * (2.0 * b * weff / _WARP_FLOPS + _CALL_MS)
    else:
        raise ValueError(f"form: expected one of {', '.join(TORCH_FORMS + tuple(WARP_FORMS.values()))}, got {form!r}")
    if dtype in (torch.float16, torch.bfloat16):
        ms *= _HALF_SLOWDOWN
    return ms + passes * _CALL_MS


def estimates(meta, batch: int, dtype: torch.dtype, training: bool) -> Dict[str, float]:
    """``{form: estimated ms}`` of every CPU form of the call (:func:`forms`)."""
    return {f: estimate_ms(meta, batch, f, training, dtype) for f in forms(dtype, training)}


def _runner(form: str, meta, training: bool, x, w, g) -> Callable[[], object]:
    ops = get_ops(form)
    if not training:
        return lambda: ops.forward(meta, x, w, None)
    combined = getattr(ops, "backward_combined", None)
    if combined is not None:
        return lambda: (ops.forward(meta, x, w, None), combined(meta, g, x, w))
    return lambda: (ops.forward(meta, x, w, None), ops.grad_input(meta, g, w), ops.grad_weight(meta, g, x))


def another_round(done: int, reps: int, samples: Mapping[str, Sequence[float]], min_ms: float) -> bool:
    """Whether the forms of ``samples`` (form -> its rounds' ms) run one more round after ``done``: below ``reps``
    rounds, or while a form's rounds add up to less than ``min_ms`` within :data:`MEASURE_MAX_REPS` rounds."""
    if not samples:
        return False
    return done < max(1, int(reps)) or (done < MEASURE_MAX_REPS and min(map(sum, samples.values())) < min_ms)


def measure(meta, batch: int, dtype: torch.dtype, training: bool, candidates: Optional[Sequence[str]] = None,
            reps: int = MEASURE_REPS, clock: Optional[Callable[[], float]] = None,
            order: Optional[Mapping[str, float]] = None, min_ms: float = MEASURE_MIN_MS,
            ) -> Tuple[Dict[str, float], Dict[str, str], Tuple[str, ...]]:
    """Time each candidate form (default: :func:`forms`) on random CPU operands of the call's shape, as the module
    docstring says: ``(times in ms, {form: why it could not run}, the forms cut after their first call)``.
    ``clock``: seconds (default :data:`CLOCK`; a test passes a fake one); ``order``: the forms' estimates (the
    cheapest runs first); ``reps`` and ``min_ms``: the fewest rounds, and the milliseconds each form's rounds add
    up to at least (within :data:`MEASURE_MAX_REPS` rounds)."""
    clock = clock or CLOCK
    cands = tuple(candidates) if candidates is not None else forms(dtype, training)
    order = order if order is not None else estimates(meta, batch, dtype, training)
    cands = tuple(sorted(cands, key=lambda f: order.get(f, math.inf)))
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, meta.cin, meta.nin, generator=gen).to(dtype)
    w = (torch.randn(meta.cout, meta.q, generator=gen) / math.sqrt(max(1, meta.p))).to(dtype)
    g = torch.randn(batch, meta.cout, meta.nout, generator=gen).to(dtype)
    meta = meta.to("cpu")
    first: Dict[str, float] = {}
    refused: Dict[str, str] = {}
    runs: Dict[str, Callable[[], object]] = {}
    cut = []

    def once(run) -> float:
        t0 = clock()
        run()
        return (clock() - t0) * 1e3
    with torch.no_grad(), torch.autocast("cpu", enabled=False), tune_cache.bypass():
        for form in cands:                                    # each form's first call, the cheapest estimate first
            try:
                run = _runner(form, meta, training, x, w, g)
                ms = once(run)
            except Exception as exc:                          # noqa: BLE001  (a form that refuses this call)
                refused[form] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
                continue
            best = min(first.values(), default=math.inf)
            if ms > CUTOFF * best:
                ms = once(run)                                # the first call may build tables: once more
                if ms > CUTOFF * best:
                    first[form] = ms
                    cut.append(form)
                    continue
            first[form] = ms
            runs[form] = run
        # then rounds over the forms left, in turn (the order reversed every other round), so that a burst of other
        # work on the machine falls on every form alike; each form's time is its median round, as the benchmark
        # judges them: a form whose calls vary by themselves (torch_compact's large temporaries: on a 2-core CPU
        # half its calls took twice the others) is priced by its typical call, not by its luckiest
        samples: Dict[str, list] = {f: [] for f in runs}
        order_now = list(runs)
        i = 0
        while another_round(i, reps, samples, min_ms):
            for form in (order_now if i % 2 == 0 else order_now[::-1]):
                samples[form].append(once(runs[form]))
            i += 1
    times = {f: first[f] for f in cut}
    times.update({f: statistics.median(s) for f, s in samples.items()})
    return times, refused, tuple(cut)


@dataclass(frozen=True)
class CpuChoice:
    """What ``auto`` runs for one call shape on this CPU, and why: ``source`` is ``"measured"`` (auto timed the
    forms on this machine), ``"tuned"`` (``python -m fovi_lab tune`` did) or ``"estimated"`` (the cost model);
    ``times``: the measured ms per form (empty when estimated); ``estimates``: the model's ms per form."""

    backend: str
    source: str
    mode: str
    batch: int
    dtype: torch.dtype
    times: Mapping[str, float] = field(default_factory=dict)
    estimates: Mapping[str, float] = field(default_factory=dict)
    cut: Tuple[str, ...] = ()

    def words(self) -> str:
        """One line: the pick, how it was decided, and every form's time."""
        what = "train step" if self.mode == "train-step" else "forward"
        dtype = str(self.dtype).replace("torch.", "")
        if self.times:
            how = "measured on this machine" if self.source == "measured" else "tuned on this machine"
            shown = ", ".join(f"{f} {ms:.3g} ms{' (one call)' if f in self.cut else ''}"
                              for f, ms in sorted(self.times.items(), key=lambda kv: kv[1]))
            est = self.estimates.get(self.backend)
            tail = f"; estimated {est:.3g} ms" if est is not None else ""
            return f"{self.backend} for a {dtype} {what} at B = {self.batch}, {how}: {shown}{tail}"
        shown = ", ".join(f"{f} {ms:.3g} ms" for f, ms in sorted(self.estimates.items(), key=lambda kv: kv[1]))
        return (f"{self.backend} for a {dtype} {what} at B = {self.batch}, estimated (no measurement on this machine "
                f"yet; the shape's first call measures, unless FOVI_KNN_AUTO_MEASURE=off): {shown}")


def problem_entry_key(meta, batch: int, dtype: torch.dtype, training: bool) -> str:
    """The tune cache key of a CPU call shape on this machine."""
    mode = "train-step" if training else "forward"
    return tune_cache.entry_key(tune_cache.setup_key("cpu"), tune_cache.problem_key(meta, batch, dtype, mode))


def _check(meta, batch, dtype, training) -> None:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch: expected an integer >= 1, got {batch!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype: expected a floating-point torch dtype, got {dtype!r}")
    if not isinstance(training, bool):
        raise TypeError(f"training: expected True (a train step) or False (a forward), got {training!r}")
    if not all(hasattr(meta, a) for a in ("cin", "cout", "nin", "nout", "k", "v", "p64", "q", "nnz")):
        raise TypeError(f"meta: expected a fovi_lab TrainingMeta, got {type(meta).__name__}")


def known_choice(meta, batch: int, dtype: torch.dtype, training: bool) -> CpuChoice:
    """The choice from the tune cache, else from the estimate: :func:`decide` without measuring."""
    return decide(meta, batch, dtype, training, measure_now=False)


_measuring = threading.RLock()


def _tracing() -> bool:
    """Whether the call is being traced (torch.compile, a dispatch mode such as fake tensors): no operand is real
    there, so nothing is measured; the estimate decides, and the shape's first eager call measures."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    return torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None


def decide(meta, batch: int, dtype: torch.dtype, training: bool, measure_now: Optional[bool] = None) -> CpuChoice:
    """What ``auto`` runs for this call shape on this CPU (the order of the module docstring). ``measure_now``:
    whether a shape without an entry is measured (default: ``FOVI_KNN_AUTO_MEASURE``, on unless set off)."""
    _check(meta, batch, dtype, training)
    mode = "train-step" if training else "forward"
    est = estimates(meta, batch, dtype, training)
    key = problem_entry_key(meta, batch, dtype, training)
    hit = tune_cache.load().get(key)
    if hit is not None and hit.get("backend") in OPS_REGISTRY:
        return CpuChoice(hit["backend"], "measured" if hit.get("source") == "measured" else "tuned", mode, batch,
                         dtype, dict(hit.get("candidates") or {}), est, tuple(hit.get("cut") or ()))
    if measure_now is None:
        measure_now = settings.get("FOVI_KNN_AUTO_MEASURE") and not _tracing()
    if measure_now:
        with _measuring:
            hit = tune_cache.load().get(key)              # another thread may have measured it meanwhile
            if hit is not None and hit.get("backend") in OPS_REGISTRY:
                return decide(meta, batch, dtype, training, measure_now=False)
            times, refused, cut = measure(meta, batch, dtype, training, order=est)
            if times:
                best = min(times, key=times.get)
                entry = {"backend": best, "config": None, "ms": times[best], "candidates": times, "cut": list(cut),
                         "refused": refused, "estimates": est, "reps": MEASURE_REPS, "min_ms": MEASURE_MIN_MS,
                         "source": "measured",
                         "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
                try:
                    tune_cache.store({key: entry})
                except OSError:                             # a read-only cache: keep it for this process
                    tune_cache.store({key: entry}, write=False)
                return CpuChoice(best, "measured", mode, batch, dtype, times, est, cut)
    best = min(est, key=est.get)
    return CpuChoice(best, "estimated", mode, batch, dtype, {}, est)


_memo: Dict[tuple, str] = {}
_memo_lock = threading.Lock()


def forget() -> None:
    """Forget the decisions made in this process (the next call of each signature decides again)."""
    with _memo_lock:
        _memo.clear()


def cpu_pick(meta, batch: int, dtype: torch.dtype, training: bool) -> str:
    """The backend ``auto`` runs for this CPU call: :func:`decide`, once per call signature (the layer's sizes, the
    batch, dtype and mode, PyTorch's threads, ``FOVI_KNN_AUTO_MEASURE``, the kernel switches and the tune cache's
    generation), then from memory."""
    sig = (meta.cin, meta.cout, meta.nin, meta.nout, meta.k, meta.p64, meta.v, meta.nnz, int(batch), dtype,
           bool(training), torch.get_num_threads(), settings.raw("FOVI_KNN_AUTO_MEASURE"), settings.snapshot(),
           tune_cache.generation)
    got = _memo.get(sig)
    if got is None:
        choice = decide(meta, batch, dtype, training)
        got = choice.backend
        if choice.source == "estimated" and _tracing():
            return got                          # the shape's first call outside the trace measures (not kept)
        with _memo_lock:
            _memo[sig] = got
            _memo[sig[:-1] + (tune_cache.generation,)] = got    # a measurement just stored bumped the generation
    return got
