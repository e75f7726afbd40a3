"""The caches keyed by weak references stay live when the garbage collector runs inside their locked regions.

Each cache drops an entry from a weak-reference callback that takes the cache's lock. A callback can run on the
same thread *inside* that lock: any allocation there may start the cyclic collector, which frees an object of a
reference cycle whose entry is in the same cache. With a plain Lock that thread waits on itself forever (the
intermittent stall of the H200 adjoint benchmark, whose stack ended in ``meta_aux``'s ``_drop``). Each test
forces that collection inside the locked region, in a child process (a deadlocked lock would hang every later
test of this one), and fails if the child does not finish.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_PRELUDE = """
import gc
import torch
from fovi_lab.graph import meta as meta_mod
from fovi_lab.graph.meta import build_meta, meta_aux
from fovi_lab.kernels.forward import plans

def small_meta(seed):
    g = torch.Generator().manual_seed(seed)
    return build_meta(torch.randint(0, 9, (4, 3), generator=g), torch.randint(0, 5, (4, 3), generator=g),
                      cin=2, cout=3, v=5, nin=8)

class CollectingDict(dict):          # lookups and stores run the cyclic collector first (as an allocation may)
    def get(self, *args):
        gc.collect()
        return super().get(*args)

    def __setitem__(self, key, value):
        gc.collect()
        super().__setitem__(key, value)

def cycle(obj):                      # only the cyclic collector frees obj now
    holder = [obj]
    holder.append(holder)
"""

_SCENARIOS = {
    "meta_aux": """
        doomed = small_meta(1)
        meta_aux(doomed)["x"] = 1
        other = small_meta(2)
        cycle(doomed)
        del doomed
        meta_mod._AUX = CollectingDict(meta_mod._AUX)
        meta_aux(other)
    """,
    "weight_layout": """
        w = torch.randn(6, 10).half()
        plans.weight_layout(w, "t", 2, 2)
        w2 = torch.randn(6, 10).half()
        cycle(w)
        del w
        plans._WCACHE = CollectingDict(plans._WCACHE)
        plans.weight_layout(w2, "t", 2, 2)
    """,
}


@pytest.mark.parametrize("cache", sorted(_SCENARIOS))
def test_cache_survives_a_collection_inside_its_lock(cache):
    code = _PRELUDE + textwrap.dedent(_SCENARIOS[cache]) + "\nprint('done')\n"
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{cache}: the call deadlocked when the collector ran inside its lock")
    assert out.returncode == 0 and "done" in out.stdout, out.stderr[-2000:]
