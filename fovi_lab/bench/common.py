"""Shared benchmark helpers: timing, roofline figures, JSON-lines records, progress.

API (used by :mod:`fovi_lab.bench.forward` and the backward benchmark):

* ``time_fn(fn, device, warmup=3, reps=20, target_ms=300.0) -> Timing``: runs ``fn()`` ``warmup``
  times, then times ``reps`` runs one by one (CUDA events on the current stream for CUDA, the host
  clock after ``synchronize`` otherwise) and returns the median, min and max in ms. When the first
  timed run shows that ``reps`` runs would exceed ``target_ms``, fewer runs are taken (never fewer
  than 3). ``fn`` must do the whole measured work each call. A call's time therefore includes the host
  work that the GPU waits for: the latency of one isolated call.
* ``pipelined_ms(fn, device, warmup=3, reps=20, target_ms=300.0) -> float``: ``reps`` calls back to back
  and one synchronisation, wall time per call: the throughput of a loop that never waits (a training
  loop's steady state, where the host issues the next calls while the GPU runs the last ones).
* ``env_info(device) -> dict``: ``device`` (name), ``warp``, ``torch``, ``cuda``, ``date`` (UTC ISO),
  ``host``, ``commit``, ``command``, ``tile_gemm`` (cuBLASDx or scalar) — stamped into every record.
* ``started(device, prog, args, what, tail="") -> dict``: ``env_info`` stamped with the command, after printing a
  benchmark's first line (``# <what> <device> (torch <version>, warp <version>)<tail>``).
* ``Roofline``: the ceilings quoted next to each measurement, a device's datasheet HBM bandwidth and dense fp16
  tensor-core peak (``roofline_of(device)``; ``Roofline()`` is the H200's: 4.8 TB/s, 990 TFLOP/s);
  ``bound_ms(flops, bytes)`` is the HBM/tensor-core bound time in ms, ``fraction(ms, flops, bytes)`` = bound /
  measured (None on a device without datasheet peaks, such as the CPU).
* ``tflops(flops, ms)``, ``gbps(nbytes, ms)``: rates from counts.
* ``compact_flops(b, p64, cout, nout) = 2*B*P64*Cout*Nout`` and ``compact_bytes(...)``: the fewest
  bytes the compact forward must move (x, W, both index tables, bias and y once each).
* ``append_jsonl(path, records)``: appends one JSON object per line (creates folders).
* ``Progress(total, label)``: plain-text progress lines (``[ 12/208]  6% label ... eta 40s``).
* ``default_record_path(kind, device_name)``: ``data/<kind>_<device-slug>.jsonl`` under the current folder (an
  installed package never writes into its own folder; run from a checkout's root, that is the checkout's ``data/``).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, List, Optional

import torch

import fovi_lab.settings as _settings

__all__ = ["Timing", "time_fn", "pipelined_ms", "env_info", "Roofline", "tflops", "gbps", "compact_flops", "compact_bytes",
           "append_jsonl", "Progress", "default_record_path", "records_note"]


@dataclass
class Timing:
    ms: float          # median
    ms_min: float
    ms_max: float
    reps: int


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def call_ms(fn: Callable[[], object], device) -> float:
    """Milliseconds of one ``fn()`` call: CUDA events around it on a GPU (the stream's time, not the
    host's), the wall clock on a CPU. The one timer every benchmark and lab measurement uses."""
    device = torch.device(device)
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_fn(fn: Callable[[], object], device, warmup: int = 3, reps: int = 20,
            target_ms: float = 300.0) -> Timing:
    """Median wall time of ``fn()`` in ms on ``device`` (see module docstring)."""
    device = torch.device(device)
    for _ in range(max(0, warmup)):
        fn()
    _sync(device)
    times = []
    n = max(1, reps)
    i = 0
    while i < n:
        times.append(call_ms(fn, device))
        if i == 0 and times[0] * n > target_ms:
            n = max(3, min(n, int(target_ms / max(times[0], 1e-6))))
        i += 1
    return Timing(statistics.median(times), min(times), max(times), len(times))


def pipelined_ms(fn: Callable[[], object], device, warmup: int = 3, reps: int = 20,
                 target_ms: float = 300.0) -> float:
    """Wall time per call of ``reps`` back-to-back calls of ``fn()`` with one synchronisation at the end
    (see module docstring); ``reps`` shrinks (>= 3) when one call shows the loop would exceed
    ``target_ms``."""
    device = torch.device(device)
    for _ in range(max(0, warmup)):
        fn()
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    one = (time.perf_counter() - t0) * 1e3
    n = max(3, min(max(1, reps), int(target_ms / max(one, 1e-6))))
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) * 1e3 / n


def _commit() -> Optional[str]:
    """``FOVI_COMMIT`` where set, else the checkout's commit (short hash, ``+changes`` when its tracked files differ
    from it); None for an installed package or where git is not at hand."""
    import fovi_lab.settings as settings
    from fovi_lab.ops.records import CHECKOUT_ROOT

    if settings.get("FOVI_COMMIT"):
        return settings.get("FOVI_COMMIT")
    if CHECKOUT_ROOT is None:
        return None
    import subprocess
    try:
        head = subprocess.run(["git", "-C", str(CHECKOUT_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(CHECKOUT_ROOT), "diff", "--quiet", "HEAD", "--"],
                               capture_output=True, timeout=30).returncode != 0
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+changes" if dirty else "")


def _command() -> str:
    """The command line this process runs, as a user would type it (``python -m fovi_lab.bench.forward ...``)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    head = f"python -m {spec.name.removesuffix('.__main__')}" if spec is not None else f"python {sys.argv[0]}"
    return " ".join([head] + sys.argv[1:])


def emit_rows(rows: List[dict], out, line: Callable[[dict], str]) -> int:
    """Print ``line(r)`` for each record and append them to ``out`` (JSON lines) where given; returns how many."""
    for r in rows:
        print(line(r), flush=True)
    if out:
        append_jsonl(out, rows)
    return len(rows)


def say_appended(out, count: int) -> None:
    """The closing line of a benchmark that appended ``count`` records to ``out``."""
    if out and count:
        import os
        print(f"# {count} records appended to {os.path.abspath(out)}", flush=True)


def stamp_command(env: dict, prog: str, args) -> dict:
    """``env`` with ``command`` set to ``prog`` and the words the command was given (``args.argv``, set by
    :func:`fovi_lab.ops.arguments.run_command` and the command line), where they are known."""
    if getattr(args, "argv", None) is not None:
        env["command"] = " ".join([prog] + list(args.argv))
    return env


def started(device, prog: str, args, what: str, tail: str = "") -> dict:
    """A benchmark's provenance, :func:`env_info` of ``device`` stamped with its command (:func:`stamp_command`),
    after printing its first line ``# <what> <device name> (torch <version>, warp <version>)<tail>``."""
    env = stamp_command(env_info(device), prog, args)
    print(f"# {what} {env['device']} (torch {env['torch']}, warp {env['warp']}){tail}", flush=True)
    return env


def tile_gemm(device) -> Optional[str]:
    """How the tile GEMMs (``tile_matmul``) of the tile-GEMM forwards and the staged and fused adjoints are built on
    ``device``: ``"cuBLASDx"`` (Warp's default on CUDA) or ``"scalar"`` (``FOVI_WARP_MATHDX=0``, and always on the
    CPU); None without Warp. The tensor-core kernels (mma.sync) use neither."""
    device = torch.device(device)
    try:
        import warp
    except Exception:  # pragma: no cover
        return None
    if device.type != "cuda":
        return "scalar"
    from fovi_lab import settings
    forced = settings.get("FOVI_WARP_MATHDX")
    on = bool(getattr(warp.config, "enable_mathdx_gemm", True)) if forced is None else forced
    return "cuBLASDx" if on else "scalar"


def boot_id() -> Optional[str]:
    """This machine's boot id (Linux: ``/proc/sys/kernel/random/boot_id``), None elsewhere: two records with the same
    one were taken on one machine without a restart between them (a host name alone may be shared by many)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def env_info(device) -> dict:
    """The provenance stamped into every record: ``device`` (name), ``warp``, ``torch``, ``cuda``, ``python``,
    ``date`` (UTC), ``host``, ``boot_id`` (:func:`boot_id`), ``commit`` (of the checkout, None for an installed
    package), ``command``, ``tile_gemm`` (:func:`tile_gemm`: how the kernels' tile GEMMs were built), ``replay``
    (``FOVI_KNN_REPLAY``) and ``settings`` (the kernel-affecting ``FOVI_*`` variables that are set, such as
    ``FOVI_WARP_MATHDX``: :func:`fovi_lab.settings.kernel_values`; empty where none is). Under an A/B switch
    (:func:`fovi_lab.settings.ab_switches_set`: ``FOVI_KNN_DX_PATH=taps``, say) the records also carry ``note_run``
    naming it: a variant of the kernels, which every reader of records (the report, ``auto``, the figures) leaves
    out."""
    device = torch.device(device)
    try:
        import warp
        warp_version = warp.config.version
    except Exception:  # pragma: no cover
        warp_version = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.processor() or platform.machine()})"
    return {
        "device": name,
        "warp": warp_version,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "boot_id": boot_id(),
        "commit": _commit(),
        "command": _command(),
        "tile_gemm": tile_gemm(device),
        "replay": _replay_mode(),
        **_switches(),
    }


def _switches() -> dict:
    """``{"settings": the kernel-affecting variables set}``, and ``"note_run"`` naming the A/B switches among them
    (:func:`env_info`)."""
    values = _settings.kernel_values()
    out = {"settings": values}
    ab = _settings.ab_switches_set(values)
    if ab:
        out["note_run"] = "A/B switch " + ", ".join(f"{k}={v}" for k, v in ab.items())
    return out


def _replay_mode() -> Optional[str]:
    """``FOVI_KNN_REPLAY`` (how the Warp backends replay their eager calls, :mod:`fovi_lab.ops.replay`); None where the
    value is not one the table knows (the benchmark's own calls refuse it then)."""
    import fovi_lab.settings as settings
    try:
        return settings.get("FOVI_KNN_REPLAY")
    except ValueError:
        return None


class Roofline:
    """Ceilings quoted beside measurements: a device's datasheet peaks (dense fp16 tensor-core TFLOP/s and HBM
    TB/s; leads, not measurements). ``Roofline()`` is the H200 SXM's; :meth:`of` takes the device measured."""

    H200_HBM_TBPS = 4.8
    H200_FP16_TFLOPS = 990.0

    def __init__(self, hbm_tbps: float = H200_HBM_TBPS, fp16_tflops: float = H200_FP16_TFLOPS,
                 source: str = "NVIDIA H200 datasheet"):
        self.hbm_tbps = hbm_tbps
        self.fp16_tflops = fp16_tflops
        self.source = source

    @classmethod
    def of(cls, device) -> Optional["Roofline"]:
        """The roofline of ``device`` (a CUDA device, a :class:`fovi_lab.ops.devices.DeviceSpec` or a key of
        :data:`fovi_lab.ops.devices.DEVICES`) from its datasheet peaks; None where they are not known (the CPU, a
        GPU model the package has no figures for): its records then carry no roofline fraction."""
        from fovi_lab.ops.devices import device_spec

        spec = device_spec(device)
        if not spec.tensor_tflops or not spec.hbm_tbps:
            return None
        return cls(spec.hbm_tbps, spec.tensor_tflops, f"{spec.name} datasheet")

    def words(self) -> str:
        return f"HBM {self.hbm_tbps:g} TB/s, fp16 dense {self.fp16_tflops:g} TFLOP/s ({self.source})"

    def bound_ms(self, flops: float, nbytes: float) -> float:
        """max(flops / peak, bytes / bandwidth) in ms."""
        return max(flops / (self.fp16_tflops * 1e12), nbytes / (self.hbm_tbps * 1e12)) * 1e3

    def fraction(self, ms: float, flops: float, nbytes: float) -> float:
        return self.bound_ms(flops, nbytes) / ms if ms > 0 else math.nan

    def hbm_fraction(self, gb_per_s: float) -> Optional[float]:
        """``gb_per_s`` as a fraction of the HBM bandwidth."""
        return gb_per_s / (self.hbm_tbps * 1e3)


class NoRoofline(Roofline):
    """The roofline of a device without datasheet peaks (the CPU): every fraction is None."""

    def __init__(self, name: str = "this device"):
        super().__init__(math.nan, math.nan, f"no datasheet peaks for {name}")

    def words(self) -> str:
        return self.source

    def bound_ms(self, flops: float, nbytes: float) -> float:
        return math.nan

    def fraction(self, ms: float, flops: float, nbytes: float):
        return None

    def hbm_fraction(self, gb_per_s: float):
        return None


def roofline_of(device) -> Roofline:
    """:meth:`Roofline.of` ``device``, or a :class:`NoRoofline` (fractions None) where its peaks are unknown."""
    return Roofline.of(device) or NoRoofline(str(device))


def tflops(flops: float, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12 if ms > 0 else math.nan


def gbps(nbytes: float, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9 if ms > 0 else math.nan


def compact_flops(b: int, p64: int, cout: int, nout: int) -> float:
    return 2.0 * b * p64 * cout * nout


def compact_bytes(b: int, cin: int, nin: int, cout: int, q: int, nout: int, p64: int, itemsize: int = 2) -> float:
    """x + W + bias + both int32 tables + y, each moved once."""
    return float(itemsize * (b * cin * nin + cout * q + cout + b * cout * nout) + 2 * 4 * nout * p64)


def append_jsonl(path, records: Iterable[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")


def default_record_path(kind: str, device_name: str) -> Path:
    """``data/<kind>_<device-slug>.jsonl`` under the current folder, as an absolute path (the folder is made when
    the first records are appended)."""
    slug = "".join(ch.lower() if ch.isalnum() else "_" for ch in device_name).strip("_")
    while "__" in slug:
        slug = slug.replace("__", "_")
    return Path.cwd() / "data" / f"{kind}_{slug or 'device'}.jsonl"


def records_note(path) -> str:
    """One line for after a benchmark's "records appended to" line: whether ``report`` and ``auto`` read the file at
    ``path`` (they read a checkout's ``data/`` folder beside the shipped records, and nothing else)."""
    from fovi_lab.ops.records import CHECKOUT_ROOT
    path = Path(path).resolve()
    if CHECKOUT_ROOT is None:
        return (f"# an installed package reads only the records it ships: python -m fovi_lab report --data "
                f"{path.parent} reads these")
    data = (CHECKOUT_ROOT / "data").resolve()
    if path.parent == data:
        return "# report and auto read them (the checkout's data/)"
    return (f"# report and auto read the checkout's {data}, not this folder: move the file there, or "
            f"python -m fovi_lab report --data {path.parent}")


class Progress:
    """Plain-text progress for long sweeps (one line per step, flushed)."""

    def __init__(self, total: int, label: str = "", stream=None):
        self.total = max(1, int(total))
        self.done = 0
        self.label = label
        self.t0 = time.perf_counter()
        self.stream = stream or sys.stdout

    def step(self, what: str = "") -> None:
        self.done += 1
        el = time.perf_counter() - self.t0
        eta = el / self.done * (self.total - self.done)
        w = len(str(self.total))
        print(f"[{self.done:>{w}}/{self.total}] {100 * self.done // self.total:3d}% {self.label} {what} "
              f"(elapsed {el:.0f}s, eta {eta:.0f}s)", file=self.stream, flush=True)


def print_graphed(recs, impl: str) -> None:
    """The summary lines of the ``impl`` records replayed from CUDA graphs against the strongest PyTorch
    backend replayed the same way (records carry ``strongest_graphed`` and ``speedup_vs_strongest_graphed``)."""
    rows = [r for r in recs if r["impl"] == impl and r.get("ms")]
    if not rows:
        return
    print("\n CUDA-graph replay (no per-call host work), both sides:")
    print(" layer            B   warp graphed  best torch graphed                   ms   speedup")
    for r in rows:
        sp = r.get("speedup_vs_strongest_graphed")
        print(f" {r['layer']:<15s} {r['B']:>4d} {r['ms']:>12.3f}  {str(r.get('strongest_graphed')):<32s}"
              f"{(r['ms'] * sp if sp else math.nan):>8.3f}  x{(sp or math.nan):.2f}")
