"""Warp functions and kernels of the kernel factories, built once per key.

A factory's Warp functions (and native snippets) are closures over its tile constants, registered under a name per
shape; each is made the first time a kernel of its shape is built and shared by every later kernel that calls it.
The keyed counterpart of :func:`fovi_lab.kernels.common.built_once`: the first call for a key initialises Warp and
runs ``make`` under a lock (threads that build kernels concurrently register each function once); later calls
return it without locking (some getters sit on per-launch paths).
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, Hashable

from fovi_lab.kernels.common import init_warp

_lock = threading.RLock()
_BUILT: Dict[Hashable, object] = {}


def built(key: Hashable, make: Callable[[], object]):
    """``make()`` once per ``key`` (a tuple that starts with its factory module's name), Warp initialised first."""
    fn = _BUILT.get(key)
    if fn is None:
        init_warp()
        with _lock:
            fn = _BUILT.get(key)
            if fn is None:
                fn = _BUILT[key] = make()
    return fn
