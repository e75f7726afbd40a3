"""The autotune cache: the fastest (backend, forward config) measured on this machine, per problem.

A *problem* is a layer shape ``(cin, cout, nin, nout, k, p64, v)``, a batch ``B``, a dtype and a mode
(``"forward"``: inference, ``"train-step"``: forward + both gradients); a *setup* is the device's name and
compute capability and the Warp and PyTorch versions. ``python -m fovi_lab tune`` (:mod:`fovi_lab.bench.tune`)
times the candidates of a problem on the user's device and stores the winner here; ``backend="auto"`` reads
it before the recorded rule (:func:`fovi_lab.ops.dispatch.select_backend`), and the Warp forward runs the
tuned config (:func:`tuned_forward_config`). A setup or version change misses every entry, so the rule
answers again until the next tune.

The cache is one JSON file, readable and deletable: ``$FOVI_TUNE_CACHE``, else
``$XDG_CACHE_HOME/fovi_lab/tune.json`` (``~/.cache/fovi_lab/tune.json``). It is read once per process
(:func:`reload` reads it again) and written whole, atomically.

    {"format": 1, "entries": {"<setup>|<problem>": {"backend", "config", "ms", "candidates", "date", ...}}}
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch

__all__ = ["cache_path", "setup_key", "problem_key", "entry_key", "load", "reload", "lookup", "store",
           "tuned_choice", "tuned_forward_config", "FORMAT"]

FORMAT = 1
_lock = threading.Lock()
_ENTRIES: Optional[Dict[str, dict]] = None
_SETUPS: Dict[str, str] = {}


def cache_path() -> Path:
    """Where the cache lives: ``$FOVI_TUNE_CACHE``, else ``$XDG_CACHE_HOME/fovi_lab/tune.json``."""
    env = os.environ.get("FOVI_TUNE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "fovi_lab" / "tune.json"


def setup_key(device) -> str:
    """``"<device name>/<sm_XY or cpu>/warp <version>/torch <version>"`` for a torch device (cached)."""
    device = torch.device(device)
    key = str(device)
    hit = _SETUPS.get(key)
    if hit is None:
        if device.type == "cuda":
            major, minor = torch.cuda.get_device_capability(device)
            name, arch = torch.cuda.get_device_name(device), f"sm_{major}{minor}"
        else:
            name, arch = device.type, device.type
        try:
            import warp
            wv = warp.config.version
        except ImportError:
            wv = None
        hit = _SETUPS[key] = f"{name}/{arch}/warp {wv}/torch {torch.__version__}"
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
    return doc["entries"]


def reload() -> Dict[str, dict]:
    """Forget what was read and read the file again (after another process wrote it, or a path change)."""
    global _ENTRIES
    with _lock:
        _ENTRIES = None
    _forward_memo.clear()
    return load()


def lookup(setup: str, problem: str) -> Optional[dict]:
    return load().get(entry_key(setup, problem))


def store(entries: Dict[str, dict], write: bool = True) -> Path:
    """Add ``{entry key: entry}`` to the cache (in memory, and in the file when ``write``); returns the path."""
    path = cache_path()
    with _lock:
        current = _read(path) if write else {}
        mem = _ENTRIES if _ENTRIES is not None else _read(path)
        current.update(entries)
        mem.update(entries)
        globals()["_ENTRIES"] = mem
        if write:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tune-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump({"format": FORMAT, "entries": current}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
    _forward_memo.clear()
    return path


def tuned_choice(meta, x: torch.Tensor, training: bool) -> Optional[Tuple[str, Optional[str]]]:
    """``(backend, forward config or None)`` tuned for this call's problem on its device, or None."""
    entries = load()
    if not entries:
        return None
    mode = "train-step" if training else "forward"
    hit = entries.get(entry_key(setup_key(x.device), problem_key(meta, x.shape[0], x.dtype, mode)))
    return None if hit is None else (hit["backend"], hit.get("config"))


_forward_memo: Dict[tuple, Optional[str]] = {}


def tuned_forward_config(meta, x: torch.Tensor) -> Optional[str]:
    """The Warp forward config tuned for this call (any mode whose winner ran the Warp forward), or None:
    one dict lookup per call after the first (an empty cache costs one check)."""
    if not load():
        return None
    key = (x.device, x.dtype, x.shape[0], meta.cin, meta.cout, meta.nin, meta.nout, meta.k, meta.p64, meta.v)
    if key in _forward_memo:
        return _forward_memo[key]
    config = None
    setup = setup_key(x.device)
    for mode in ("forward", "train-step"):
        hit = load().get(entry_key(setup, problem_key(meta, x.shape[0], x.dtype, mode)))
        if hit is not None and hit.get("config"):
            config = hit["config"]
            break
    _forward_memo[key] = config
    return config
