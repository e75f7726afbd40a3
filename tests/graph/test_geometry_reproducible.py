"""The foveated graphs are the same on every machine.

The tables ``(idx, rf_index)`` come from float64 trigonometry whose last bits depend on the CPU (numpy
dispatches ``sin``/``cos``/``exp``/``arctan2`` to AVX-512 or AVX2 code) and on library versions. Every
discrete decision the geometry makes is taken with the tolerance ``DECISION_RTOL`` and a fixed tie rule,
so those bits cannot reach the tables. Four checks:

* the digests of every real layer's tables, both frames, are pinned (``graph_digests.json``);
* they are recomputed in subprocesses under numpy's CPU-dispatch settings (the AVX-512 paths off, and
  every dispatched path off) and must not move;
* they are recomputed with random last-bit noise injected into every transcendental function the
  geometry calls: this machine's CPU may have no AVX-512, the noise test does not depend on it;
* every decision of the real layers lies many orders of magnitude from its tolerance line.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from fovi_lab.graph import geometry as geo
from fovi_lab.graph import grid, knn
from fovi_lab.graph.layers import LAYERS, graph_digests, layer_graph

PINNED = json.loads((Path(__file__).with_name("graph_digests.json")).read_text())


def _dispatch_targets():
    try:
        from numpy._core import _multiarray_umath as mu
    except ImportError:  # numpy < 2
        from numpy.core import _multiarray_umath as mu
    return list(getattr(mu, "__cpu_dispatch__", []))


def _clear_geometry_caches():
    for fn in (geo._build_graph, grid._matched_grid_cached, grid._z_table, grid.matched_n_rings):
        fn.cache_clear()


def test_digests_pinned():
    assert list(PINNED) == [f"{n}:{rf}" for n in LAYERS for rf in ("rf1", "rf2")]
    assert dict(graph_digests()) == PINNED


def test_digest_sees_one_entry():
    g = layer_graph("res18_layer3")
    idx = g.idx.clone()
    idx[3, 4] = (idx[3, 4] + 1) % g.nin
    assert dataclasses.replace(g, idx=idx).digest() != g.digest()
    assert dataclasses.replace(g, idx=g.idx.clone()).digest() == g.digest()


@pytest.mark.parametrize("setting", [
    "AVX512_SPR AVX512_ICL X86_V4",   # an AVX-512 machine takes its AVX2 paths
    "ALL",                            # every dispatched path off: numpy's baseline code
])
def test_digests_under_numpy_dispatch_settings(setting):
    value = " ".join(_dispatch_targets()) if setting == "ALL" else setting
    if not value:
        pytest.skip("this numpy dispatches no CPU-specific code")
    env = dict(os.environ, NPY_DISABLE_CPU_FEATURES=value)
    code = "import json; from fovi_lab.graph.layers import graph_digests; print(json.dumps(graph_digests()))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == PINNED


def _noisy(real, names, rng, ulps):
    """A stand-in for module ``real`` whose functions ``names`` return results moved by up to ``ulps`` ulps."""
    proxy = types.SimpleNamespace(**{k: getattr(real, k) for k in dir(real) if not k.startswith("__")})

    def wrap(fn):
        def noisy(*args, **kwargs):
            out = fn(*args, **kwargs)
            arr = np.asarray(out, dtype=np.float64)
            res = arr + rng.integers(-ulps, ulps + 1, size=arr.shape) * np.spacing(np.abs(arr))
            return res if isinstance(out, np.ndarray) else float(res)
        return noisy

    for name in names:
        setattr(proxy, name, wrap(getattr(real, name)))
    return proxy


@pytest.mark.parametrize("seed", [0, 1])
def test_digests_survive_last_bit_noise(seed, monkeypatch):
    # SIMD libraries differ from libm by a few ulps; 64 leaves a wide margin (the tables survive ~1000)
    rng = np.random.default_rng(seed)
    noisy_np = _noisy(np, ("sin", "cos", "exp", "log", "arctan2", "hypot", "sqrt"), rng, 64)
    noisy_math = _noisy(math, ("log", "exp", "sqrt"), rng, 64)
    for module in (grid, knn, geo):                  # every module of the graph that computes a coordinate
        monkeypatch.setattr(module, "np", noisy_np)
        if hasattr(module, "math"):
            monkeypatch.setattr(module, "math", noisy_math)
    _clear_geometry_caches()
    try:
        noisy = dict(graph_digests())
        coords = layer_graph("alex_L0").in_cortical.copy()
    finally:
        monkeypatch.undo()
        _clear_geometry_caches()
    assert not np.array_equal(coords, layer_graph("alex_L0").in_cortical)   # the noise did reach the floats
    assert noisy == PINNED


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("rf", ["rf1", "rf2"])
def test_decisions_far_from_their_tolerance(name, rf):
    m = geo.decision_margins(layer_graph(name, rf))
    for kind in ("count", "radius", "knn", "tap"):
        # ties are float noise (<= 1e-12 relative), distinct values differ by >= 10x the tolerance
        assert m[kind + "_tie"] <= geo.DECISION_RTOL / 1000, (kind, m)
        assert m[kind + "_split"] >= 10 * geo.DECISION_RTOL, (kind, m)


def test_exact_ties_at_the_kth_place_are_counted():
    # the grids' symmetry makes exact distance ties at the K-th neighbour; the tie rule decides them
    counts = {n: geo.decision_margins(layer_graph(n))["knn_ties_at_cut"]
              for n in ("alex_L0", "alex_L1", "res18_layer1", "alex_L2")}
    assert counts == {"alex_L0": 58, "alex_L1": 58, "res18_layer1": 13, "alex_L2": 4}


def test_knn_tie_rule_lower_id_first():
    # four candidates at distance 1 from the query (up to float noise), listed in scrambled id order
    eps = 1e-15
    cands = np.array([[0.0, 1.0], [1.0 + eps, 0.0], [0.0, -1.0 + eps], [-1.0, 0.0], [3.0, 0.0]])
    ids = geo.knn_candidates(np.zeros((1, 2)), cands, 2)
    assert ids.tolist() == [[0, 1]]
    assert geo.knn_candidates(np.zeros((1, 2)), cands, 4).tolist() == [[0, 1, 2, 3]]
    # a distance that is really larger (1e-6 relative) is not a tie
    cands[0, 1] = 1.0 + 1e-6
    assert geo.knn_candidates(np.zeros((1, 2)), cands, 2).tolist() == [[1, 2]]


def test_knn_widens_its_query_over_long_ties():
    # 40 points on the unit circle tie with each other; K = 3 must still take the three lowest ids
    phi = 2 * np.pi * np.arange(40) / 40
    ring = np.stack([np.cos(phi), np.sin(phi)], axis=1)[::-1].copy()   # ids run against the angle
    assert geo.knn_candidates(np.zeros((1, 2)), ring, 3).tolist() == [[0, 1, 2]]


def test_tap_tie_within_tolerance_takes_the_first_index():
    # s = 2: lin = [-1, 1], the midpoint is 0
    u = np.array([[[1e-13, 0.0], [2e-9, 0.0], [-1e-13, 1e-12]]])
    assert geo.nearest_tap(u, 2).tolist() == [[0, 2, 0]]


def test_snapped_ceil():
    assert grid._ceil_snapped(np.array([7.0, 7 + 1e-13, 7 - 1e-13, 7 + 1e-6, 6.5])).tolist() == [7, 7, 7, 8, 7]
    # a ring count that lies a last bit above an integer is that integer on every machine
    r = grid._radii_with_extra_ring(16.0, 0.5, 53)
    ratio = grid._ring_count_ratio(r, 53)
    assert np.array_equal(grid._ceil_snapped(ratio), grid._ceil_snapped(ratio * (1 + 4 * np.finfo(float).eps)))


def test_distinct_radii_do_not_split_a_ring():
    xy = geo.matched_isotropic_grid(16.0, 0.5, 64 ** 2)
    r, n = geo.ring_radii(16.0, 0.5, geo.matched_n_rings(16.0, 0.5, 64 ** 2))
    u = geo.distinct_radii(xy)
    assert len(u) == len(r) and np.allclose(u, r / 8.0, rtol=1e-12, atol=1e-15)
