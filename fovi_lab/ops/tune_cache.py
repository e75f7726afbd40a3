"""The autotune cache: the fastest (backend, forward config) measured on this machine, per problem.

A *problem* is a layer shape ``(cin, cout, nin, nout, k, p64, v)``, a batch ``B``, a dtype and a mode
(``"forward"``: inference, ``"train-step"``: forward + both gradients); a *setup* is the device's name and
compute capability (on the CPU: its model, cores and PyTorch's threads, :func:`cpu_name`), the fovi-lab, Warp and
PyTorch versions and the ``FOVI_*`` variables that change a kernel's
work (those set, :data:`fovi_lab.settings.KERNEL_AFFECTING`, in the table's order).
``python -m fovi_lab tune`` (:mod:`fovi_lab.bench.tune`) times the candidates of a problem on the user's device
and stores the winner here (``"source": "tuned"``); on the CPU ``backend="auto"`` also stores here the forms it
measured at a shape's first call (``"source": "measured"``, :mod:`fovi_lab.ops.cpu_auto`). ``backend="auto"`` reads
it before the recorded rule
(:func:`fovi_lab.ops.dispatch.select_backend`), and the Warp forward runs the tuned config
(:func:`tuned_forward_config`). A change of setup misses every entry, so the rule answers again until the next
tune; a tuned config that no longer resolves is reported once and the rule's pick runs.

The cache is one JSON file, readable and deletable: ``$FOVI_TUNE_CACHE``, else
``$XDG_CACHE_HOME/fovi_lab/tune.json`` (``~/.cache/fovi_lab/tune.json``). It is read once per process
(:func:`reload` reads it again) and written whole, atomically, under a file lock (several processes may tune).

    {"format": 1, "entries": {"<setup>|<problem>": {"backend", "config", "ms", "candidates", "date", ...}}}
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

import fovi_lab.settings as settings

__all__ = ["cache_path", "cpu_name", "setup_key", "problem_key", "entry_key", "load", "reload", "lookup", "store",
           "tuned_choice", "tuned_forward_config", "bypass", "FORMAT"]

FORMAT = 1
_lock = threading.RLock()
_ENTRIES: Optional[Dict[str, dict]] = None
_SETUPS: Dict[str, str] = {}
_forward_memo: Dict[tuple, Optional[str]] = {}
#: Counts the times the entries were read again or written: a plan that read a tuned pick is kept per generation.
generation = 0


def _forget_memo() -> None:
    """Forget the memoised tuned picks (the entries changed); under ``_lock``."""
    global generation
    _forward_memo.clear()
    generation += 1


_bypass = threading.local()


def bypassed() -> bool:
    """Whether tuned picks are bypassed on this thread (while a tune measures the untuned candidates)."""
    return getattr(_bypass, "on", False)


def cache_path() -> Path:
    """Where the cache lives: ``$FOVI_TUNE_CACHE``, else ``$XDG_CACHE_HOME/fovi_lab/tune.json``."""
    path = settings.get("FOVI_TUNE_CACHE")
    if path is not None:
        return path
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fovi_lab" / "tune.json"


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        fv = version("fovi-lab")
    except PackageNotFoundError:
        fv = None
    try:
        import warp
        wv = warp.config.version
    except ImportError:
        wv = None
    return f"fovi-lab {fv}/warp {wv}/torch {torch.__version__}"


def _switches() -> str:
    """``"/<name>=<value>,..."`` of the kernel-affecting ``FOVI_*`` variables that are set, or ``""``."""
    switches = ",".join(f"{k}={v}" for k, v in settings.kernel_values().items())
    return f"/{switches}" if switches else ""


def cpu_name() -> str:
    """The CPU in a setup key: ``"<model> (<n> cores, <t> threads)"``: the model as ``/proc/cpuinfo`` (else
    ``platform``) names it, the cores the OS reports and the threads PyTorch runs its CPU ops on."""
    import platform
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.lower().startswith("model name")), None)
    except OSError:
        pass
    model = (model or platform.processor() or platform.machine() or "cpu").replace("/", "-").replace("|", "-")
    return f"{model} ({os.cpu_count()} cores, {torch.get_num_threads()} threads)"


def setup_key(device) -> str:
    """``"<device name>/<sm_XY or cpu>/fovi-lab <v>/warp <v>/torch <v>[/<switches>]"`` for a torch device; on the CPU
    the name is :func:`cpu_name` (its model, cores and threads), so each machine keeps its own entries."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    key = (str(device), settings.snapshot(), torch.get_num_threads() if device.type == "cpu" else None)
    hit = _SETUPS.get(key)
    if hit is None:
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            name, arch = torch.cuda.get_device_name(device), f"sm_{major}{minor}"
        elif device.type == "cpu":
            name, arch = cpu_name(), "cpu"
        else:
            name, arch = device.type, device.type
        hit = _SETUPS[key] = f"{name}/{arch}/{_versions()}{_switches()}"
    return hit


def problem_key(meta, batch: int, dtype: torch.dtype, mode: str) -> str:
    """``"<mode>/<dtype>/<cin>x<cout>x<nin>x<nout>x<k>x<p64>x<v>/B<batch>"``."""
    if mode not in ("forward", "train-step"):
        raise ValueError(f"mode: expected 'forward' or 'train-step', got {mode!r}")
    shape = "x".join(str(int(getattr(meta, a))) for a in ("cin", "cout", "nin", "nout", "k", "p64", "v"))
    return f"{mode}/{str(dtype).replace('torch.', '')}/{shape}/B{int(batch)}"


def entry_key(setup: str, problem: str) -> str:
    return f"{setup}|{problem}"


def load() -> Dict[str, dict]:
    """The cache's entries (read once; a missing file is an empty cache; a malformed one raises, naming it)."""
    global _ENTRIES
    if _ENTRIES is None:
        with _lock:
            if _ENTRIES is None:
                _ENTRIES = _read(cache_path())
    return _ENTRIES


def _read(path: Path) -> Dict[str, dict]:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"the tune cache {path} is not JSON ({e}); delete it or set FOVI_TUNE_CACHE") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
        raise ValueError(f"the tune cache {path} is not a format-{FORMAT} cache; delete it to tune again")
    for key, e in doc["entries"].items():
        if not isinstance(e, dict) or not isinstance(e.get("backend"), str) \
                or not isinstance(e.get("config"), (str, type(None))):
            raise ValueError(f"the tune cache {path}: entry {key!r} needs a 'backend' name and a 'config' "
                             f"(a name or null); fix or delete it")
    return doc["entries"]


def reload() -> Dict[str, dict]:
    """Forget what was read and read the file again (after another process wrote it, or a path change)."""
    global _ENTRIES
    with _lock:
        _ENTRIES = None
        _forget_memo()
    return load()


def lookup(setup: str, problem: str) -> Optional[dict]:
    return load().get(entry_key(setup, problem))


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive lock on ``<path>.lock`` (POSIX ``flock``; elsewhere only this process's lock)."""
    try:
        import fcntl
    except ImportError:                      # pragma: no cover - not POSIX
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def store(entries: Dict[str, dict], write: bool = True) -> Path:
    """Add ``{entry key: entry}`` to the cache (in memory, and in the file when ``write``: re-read, updated and
    replaced under the file lock, so concurrent tuners keep each other's entries); returns the path."""
    global _ENTRIES
    path = cache_path()
    with _lock:
        mem = dict(load())
        mem.update(entries)
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
            with _file_lock(path):
                current = _read(path)
                current.update(entries)
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tune-", suffix=".json")
                try:
                    with os.fdopen(fd, "w") as f:
                        json.dump({"format": FORMAT, "entries": current}, f, indent=1, sort_keys=True)
                    umask = os.umask(0)
                    os.umask(umask)
                    os.chmod(tmp, 0o666 & ~umask)          # (mkstemp makes it 0600)
                    os.replace(tmp, path)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
            mem.update(current)
        _ENTRIES = mem
        _forget_memo()
    return path


@contextlib.contextmanager
def bypass():
    """Within this block, in this thread, :func:`tuned_forward_config` answers None: what the tuner times is the
    rule's kernel, not an earlier tune's."""
    prev = bypassed()
    _bypass.on = True
    try:
        yield
    finally:
        _bypass.on = prev


def tuned_choice(meta, x: torch.Tensor, training: bool,
                 dtype: Optional[torch.dtype] = None) -> Optional[Tuple[str, Optional[str]]]:
    """``(backend, forward config or None)`` tuned for this call's problem on its device, or None. ``dtype``: the
    dtype the op computes in (default ``x.dtype``)."""
    entries = load()
    if not entries:
        return None
    mode = "train-step" if training else "forward"
    hit = entries.get(entry_key(setup_key(x.device), problem_key(meta, x.shape[0], dtype or x.dtype, mode)))
    return None if hit is None else (hit["backend"], hit.get("config"))


def tuned_forward_config(meta, x: torch.Tensor) -> Optional[str]:
    """The Warp forward config tuned for this forward problem (its winner ran the Warp forward), or None:
    one dict lookup per call after the first (an empty cache costs one check)."""
    if not load() or bypassed():
        return None
    setup = setup_key(x.device)
    key = (setup, x.dtype, x.shape[0], meta.cin, meta.cout, meta.nin, meta.nout, meta.k, meta.p64, meta.v)
    with _lock:
        if key in _forward_memo:
            return _forward_memo[key]
        hit = load().get(entry_key(setup, problem_key(meta, x.shape[0], x.dtype, "forward")))
        config = hit.get("config") if hit is not None and hit.get("backend") == "warp_compact" else None
        _forward_memo[key] = config
    return config
