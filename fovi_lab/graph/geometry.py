"""Foveated grids, the cortical sensor manifold, KNN and kernel taps (spec §1.1-§1.3, §6).

This module regenerates, with numpy and scipy only, the graphs that fovi's KNN convolution layers
run on. A layer is a bipartite graph from ``Nin`` input nodes to ``Nout`` output nodes, each output
node reading its ``K`` nearest inputs; each (node, neighbour) pair is then assigned one of ``V``
kernel taps of a small square reference grid. Everything below is pure geometry; the integer tables
``idx`` / ``rf_index`` it produces are what :func:`fovi_lab.graph.meta.build_meta` turns into the compact
operator's index tables.

The math, step by step:

1. **Isotropic foveated rings** (§6.1). ``fov`` is the field-of-view *diameter* in degrees,
   ``a`` the cortical-magnification parameter (smaller ``a`` = stronger foveation) and ``R`` the
   ring count. With ``rmax = fov/2``, ``w0 = ln a``, ``w1 = ln(rmax + a)``,
   ``dw = (w1 - w0)/(R - 1)``, the ring radii are ``r_i = exp(w_i) - a`` for
   ``w = linspace(w0, w1 + dw, R + 1)`` (one extra ring, only used for spacing). Ring 0 is the
   single centre point; ring ``0 < i < R`` carries ``n_i = ceil(2 pi r_i / dr_i)`` points with
   ``dr_i = (r_{i+1} - r_{i-1})/2``, so spacing along and across rings is about equal ("locally
   isotropic"). Points are ``rho_i (cos phi, sin phi)`` with ``rho_i = r_i / rmax`` and
   ``phi = 2 pi j / n_i``: coordinates are normalised to the unit disk, ring order inside-out.
2. **Resource matching** (§6.3): the ring count is the *largest* ``R`` whose point count
   ``N(R) = sum_i n_i`` is ``<= target``; target = ``(res / stride)**2`` (res = 64 by default).
   fov=16, a=0.5 gives 4085 / 964 / 230 / 60 / 16 / 2 points for targets 64², 32², ..., 2².
3. **Cortical coordinates** (§6.2): with eccentricity ``r = |xy| fov/2`` (degrees),
   ``theta = atan2(y, x)``, magnification ``M(t) = k/(t + a)`` (k = 10),
   ``rho(t) = M(t) sin(t deg) 180/pi`` and ``z(r) = int_0^r sqrt(M(t)^2 - rho'(t)^2) dt``, a node sits
   at ``(rho(r) cos theta, rho(r) sin theta, z(r))`` on a 3-D surface of revolution whose
   geodesic arc length grows like the cortical map ``int M``. Distances there are "cortical
   distances": a fovea-sized step and a periphery-sized step look alike.
4. **Padding candidates** (§6.4): one more band of points just outside the field of view
   (radius step ``d`` = the last gap between the input rings, angle step also ``d`` radians -- a
   quirk of fovi kept on purpose) joins the neighbour search so border nodes get a
   geometrically honest, one-sided neighbourhood. Any neighbour that is a pad point becomes the
   pad token ``Nin`` (it carries no data).
5. **KNN** (§1.2, §6.5): the candidates (inputs, then pad points) in cortical 3-D space
   (``sample_cortex=True``) or visual Cartesian space (``False``); the ``K`` nearest, sorted by
   ``(distance, candidate id)`` with the tie rule below. ``K`` is clipped to ``Nin``.
6. **Taps** (§1.3): for output node ``n`` and neighbour ``k``, ``theta`` = visual-Cartesian
   direction, ``r`` = cortical distance, offset = ``r (cos theta, sin theta)`` (raw Cartesian
   difference when ``sample_cortex=False``); per node and per axis min-max normalise,
   ``u = 2 (v - min)/(max - min + 1e-6) - 1``; the reference grid has side
   ``s = ceil(ref_frame_mult sqrt(K))``, points ``(lin[a], lin[b])`` for ``lin = linspace(-1, 1, s)``
   and tap ``v = a s + b`` ('ij' meshgrid, a <-> x, b <-> y); ``rf_index[n, k]`` is the nearest tap
   (first index on ties), ``V = s²``.

**The same graph on every machine.** The float64 values behind the tables come from ``exp``, ``sin``,
``cos`` and ``arctan2``, whose last bits differ between CPUs (numpy runs AVX-512 code on some machines
and AVX2 code on others) and between library versions. The integers must not. So every discrete
decision compares with a relative tolerance ``DECISION_RTOL = 1e-9`` and settles what falls inside
it by a fixed rule:

* a ceil (ring point counts; the pad band's radius and angle counts) snaps a value within the
  tolerance of an integer to that integer;
* the distinct ring radii of the pad band's rule are radii more than the tolerance apart;
* **neighbours**: distances within the tolerance of each other are equal, and equal distances are
  ordered by candidate id, lowest first, both inside the ``K`` and at the ``K``-th place. Inputs
  precede pad points, so an input beats a pad point at the same distance. The grids' mirror and
  rotation symmetries make such exact ties (58 output nodes of the stem have one at the ``K``-th
  place); a KD-tree or ``topk`` breaks them by accident of its implementation;
* **taps**: a coordinate within the tolerance of the midpoint between two reference coordinates
  takes the lower one (the spec's "first index").

Float noise in these values is ~1e-13 relative; on every real layer, values decided equal differ by
less than 3e-14 and values decided different by more than 3e-8 (:func:`decision_margins`), so the
tolerance line is nowhere near any of them. ``tests/test_geometry_reproducible.py`` pins the digest of
every real layer's tables and rebuilds them under numpy's CPU-dispatch settings and with injected
last-bit noise.

Design notes:

* The nearest-tap search is separable: on a product grid ``|u - ref_v|²`` splits into an x term
  that depends only on ``a`` and a y term that depends only on ``b``, so the joint argmin is
  ``(argmin_a, argmin_b)``; and the set of joint minimisers is the product of the per-axis sets, so
  "first flat index ``a s + b`` on ties" is "first a, then first b". :func:`nearest_tap` does it per
  axis (``O(K s)`` per node instead of ``O(K s²)``) and :func:`nearest_tap_bruteforce` is the literal
  spec, kept for tests.
* Graphs are cached (``functools.lru_cache``) on their full parameter key: the stem graph of
  4085 inputs takes a few hundred ms to build once. Cached graphs are shared; treat them as
  read-only (their numpy arrays are made non-writeable).
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from scipy.integrate import cumulative_trapezoid
from scipy.spatial import cKDTree

__all__ = [
    "ring_radii", "isotropic_grid", "grid_size", "matched_n_rings", "matched_isotropic_grid",
    "cortical_coords", "pad_candidates", "knn_candidates", "reference_grid", "ref_side_for",
    "local_offsets", "nearest_tap", "nearest_tap_bruteforce", "KNNGraph", "foveated_knn_graph",
    "CORTEX_K", "DECISION_RTOL", "distinct_radii", "decision_margins",
]

#: The sensor-manifold gain ``k`` of ``M(t) = k/(t + a)`` (spec §6.2).
CORTEX_K = 10.0

#: Normalisation epsilon of the per-node min-max stretch (spec §1.3 step 4).
_MINMAX_EPS = 1e-6

#: Eccentricity mesh step (degrees) of the z(r) integral (spec §6.2).
_Z_MESH_STEP = 1e-4

#: Relative tolerance of every discrete decision the geometry makes (ring point counts, the pad
#: band's counts, distinct radii, neighbour order and membership, taps). The float64 values behind
#: those decisions come from ``exp``/``sin``/``cos``/``arctan2``, whose last bits differ between
#: numpy's SIMD paths (AVX-512 against AVX2) and between library versions: about 1e-13 relative
#: after the cancellations below. Two values closer than ``DECISION_RTOL`` count as equal and a
#: fixed rule decides (see the module notes); :func:`decision_margins` shows that on the real
#: layers no value lies anywhere near that line.
DECISION_RTOL = 1e-9


def _readonly(*arrays):
    for arr in arrays:
        arr.setflags(write=False)
    return arrays if len(arrays) > 1 else arrays[0]


def _ceil_snapped(x):
    """``ceil(x)``, except that a value within ``DECISION_RTOL`` (relative) of an integer *is* it.

    ``ceil`` jumps at every integer: ``ceil(7 + 1e-15)`` is 8 on one machine and ``ceil(7 - 1e-15)``
    7 on another. Snapping first puts the jump at ``k + DECISION_RTOL·k``, where no value computed
    from the real grids lies (``decision_margins``' ``count_*`` entries). Integer-valued int64.
    """
    x = np.asarray(x, dtype=np.float64)
    k = np.rint(x)
    near = np.abs(x - k) <= DECISION_RTOL * np.maximum(1.0, np.abs(x))
    return np.where(near, k, np.ceil(x)).astype(np.int64)


def _split(vals) -> float:
    """Smallest of ``vals`` decided as distinct (above ``DECISION_RTOL``); inf if none."""
    vals = vals[vals > DECISION_RTOL]
    return float(vals.min()) if vals.size else math.inf


def _tie(vals) -> float:
    """Largest of ``vals`` decided as a tie (at most ``DECISION_RTOL``); 0.0 if none."""
    vals = vals[vals <= DECISION_RTOL]
    return float(vals.max()) if vals.size else 0.0


def _integer_gap(x) -> np.ndarray:
    """Relative distance of each ``x`` from its nearest integer (what :func:`_ceil_snapped` compares)."""
    x = np.atleast_1d(np.asarray(x, dtype=np.float64))
    return np.abs(x - np.rint(x)) / np.maximum(1.0, np.abs(x))


def ring_radii(fov: float, a: float, n_rings: int) -> Tuple[np.ndarray, np.ndarray]:
    """Ring radii and points per ring of the isotropic foveated grid (spec §6.1).

    Args:
        fov: field-of-view diameter in degrees (``rmax = fov/2``).
        a: cortical-magnification parameter (> 0).
        n_rings: ring count ``R >= 1`` (ring 0 is the single centre point).

    Returns:
        ``(r, n)``: ``r [R]`` float64 ring radii in degrees (``r[0] = 0``, ``r[R-1] = rmax``) and
        ``n [R]`` int64 points per ring (``n[0] = 1``, ``n[i] = ceil(2 pi r_i / dr_i)`` with
        ``dr_i = (r_{i+1} - r_{i-1})/2`` using one extra, dropped ring ``r_R``).
    """
    fov, a, n_rings = float(fov), float(a), int(n_rings)
    if fov <= 0 or a <= 0:
        raise ValueError(f"fov and a must be > 0, got fov={fov}, a={a}")
    if n_rings < 1:
        raise ValueError(f"n_rings: expected >= 1, got {n_rings}")
    if n_rings == 1:
        return np.zeros(1), np.ones(1, dtype=np.int64)
    r = _radii_with_extra_ring(fov, a, n_rings)
    n = np.ones(n_rings, dtype=np.int64)
    n[1:] = _ceil_snapped(_ring_count_ratio(r, n_rings))
    return r[:n_rings], n


def _radii_with_extra_ring(fov: float, a: float, n_rings: int) -> np.ndarray:
    """``r_0 .. r_R`` (``R + 1`` radii, degrees; ``r_0 = 0``): the rings plus the spacing-only ring."""
    rmax = fov / 2.0
    w0, w1 = math.log(a), math.log(rmax + a)
    dw = (w1 - w0) / (n_rings - 1)
    r = np.exp(np.linspace(w0, w1 + dw, n_rings + 1)) - a
    r[0] = 0.0
    return r


def _ring_count_ratio(r: np.ndarray, n_rings: int) -> np.ndarray:
    """``2 pi r_i / dr_i`` for rings ``1 .. R-1`` (``r`` holds the extra ring ``r_R``): ``ceil`` of it is ``n_i``."""
    dr = (r[2:n_rings + 1] - r[:n_rings - 1]) / 2.0   # dr_i for i = 1 .. R-1
    return 2.0 * np.pi * r[1:n_rings] / dr


def grid_size(fov: float, a: float, n_rings: int) -> int:
    """Point count ``N(R) = sum_i n_i`` of :func:`isotropic_grid` without building it."""
    return int(ring_radii(fov, a, n_rings)[1].sum())


def isotropic_grid(fov: float, a: float, n_rings: int) -> np.ndarray:
    """The isotropic foveated grid in normalised visual coordinates (spec §6.1).

    Args:
        fov, a, n_rings: as :func:`ring_radii`.

    Returns:
        ``[N, 2]`` float64 points ``(rho_i cos phi, rho_i sin phi)``, ``rho_i = r_i/rmax`` in
        ``[0, 1]``, ``phi = 2 pi j / n_i`` (no stagger); ring order inside-out, ``j`` ascending.
    """
    r, n = ring_radii(fov, a, n_rings)
    rho = np.repeat(r / (float(fov) / 2.0), n)
    j = np.concatenate([np.arange(ni) for ni in n])
    phi = 2.0 * np.pi * j / np.repeat(n, n)
    return np.stack([rho * np.cos(phi), rho * np.sin(phi)], axis=1)


@functools.lru_cache(maxsize=256)
def matched_n_rings(fov: float, a: float, target_points: int) -> int:
    """The **largest** ring count ``R`` with ``N(R) <= target_points`` (spec §6.1, §6.3).

    ``N(R)`` is not monotone in principle, so every ``R`` up to the first one whose centre-ring
    count alone would already exceed the target is examined (a few hundred cheap evaluations).
    """
    target = int(target_points)
    if target < 1:
        raise ValueError(f"target_points: expected >= 1, got {target_points}")
    best, misses = 1, 0
    for rings in range(2, 100_000):
        size = grid_size(fov, a, rings)
        if size <= target:
            best, misses = rings, 0
        else:
            misses += 1
            if misses > 16:      # N(R) grows ~ R²: sixteen consecutive misses end the search
                break
    return best


@functools.lru_cache(maxsize=64)
def _matched_grid_cached(fov: float, a: float, target: int) -> np.ndarray:
    return _readonly(isotropic_grid(fov, a, matched_n_rings(fov, a, target)))


def matched_isotropic_grid(fov: float, a: float, target_points: int) -> np.ndarray:
    """Resource-matched grid: :func:`isotropic_grid` with ``R = matched_n_rings(...)``.

    Args:
        fov, a: as :func:`ring_radii`. target_points: point budget, ``(res/stride)**2``.

    Returns:
        ``[N, 2]`` float64 normalised coordinates with ``N <= target_points`` (read-only, cached).
        fov=16, a=0.5: 4085 points for 64², 964 for 32²; a=1: 4010 and 1023.
    """
    return _matched_grid_cached(float(fov), float(a), int(target_points))


# --------------------------------------------------------------------------------------------
# 2. cortical coordinates (the sensor manifold) and padding candidates
# --------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=32)
def _z_table(fov: float, a: float, k: float) -> Tuple[np.ndarray, np.ndarray]:
    """``(t, z(t))`` on a ``1e-4``-degree mesh from 0 to ``2 fov`` (cumulative trapezoid)."""
    t = np.arange(0.0, 2.0 * fov + _Z_MESH_STEP / 2, _Z_MESH_STEP)
    deg = np.pi / 180.0
    m = k / (t + a)
    drho = -k / (t + a) ** 2 * np.sin(t * deg) / deg + m * np.cos(t * deg)
    integrand = np.sqrt(np.clip(m * m - drho * drho, 0.0, None))
    z = cumulative_trapezoid(integrand, t, initial=0.0)
    return _readonly(t, z)


def cortical_coords(xy: np.ndarray, fov: float, a: float, k: float = CORTEX_K) -> np.ndarray:
    """Points on the 3-D sensor manifold (spec §6.2).

    Args:
        xy: ``[N, 2]`` normalised visual coordinates (``|xy| = 1`` is the FoV edge; the padding
            band lies a little outside; the mesh reaches ``|xy| = 4``).
        fov: FoV diameter in degrees. a: magnification parameter. k: gain of ``M(t) = k/(t+a)``.

    Returns:
        ``[N, 3]`` float64 ``(rho(r) cos theta, rho(r) sin theta, z(r))`` with ``r = |xy| fov/2``
        degrees, ``theta = atan2(y, x)``, ``rho(t) = M(t) sin(t deg) 180/pi`` and
        ``z(r) = int_0^r sqrt(M² - rho'²) dt`` (linear interpolation in a cached table).
    """
    xy = np.asarray(xy, dtype=np.float64)
    if xy.ndim != 2 or xy.shape[1] != 2:
        raise ValueError(f"xy: expected [N, 2], got {xy.shape}")
    r = np.hypot(xy[:, 0], xy[:, 1]) * float(fov) / 2.0
    if r.size and r.max() > 2.0 * fov:
        raise ValueError(f"xy: eccentricity {r.max():.3g} deg is beyond the z(r) mesh (2*fov)")
    theta = np.arctan2(xy[:, 1], xy[:, 0])
    deg = np.pi / 180.0
    rho = float(k) / (r + float(a)) * np.sin(r * deg) / deg
    t, zt = _z_table(float(fov), float(a), float(k))
    z = np.interp(r, t, zt)
    return np.stack([rho * np.cos(theta), rho * np.sin(theta), z], axis=1)


def distinct_radii(xy: np.ndarray) -> np.ndarray:
    """The distinct normalised radii ``|xy|`` of a ring grid, ascending.

    Radii closer than ``DECISION_RTOL`` (relative to the largest) are one ring: the points of a
    ring share ``rho_i`` exactly in real arithmetic, but ``hypot(rho cos phi, rho sin phi)`` differs
    from ``rho_i`` in the last bits, by an amount that depends on the machine. Each ring is
    represented by its smallest computed radius. Rounding to a fixed number of decimals instead
    would split a ring whose radius lies on a rounding boundary.
    """
    rho = np.sort(np.hypot(xy[:, 0], xy[:, 1]))
    if rho.size == 0:
        return rho
    new_ring = np.diff(rho) > DECISION_RTOL * max(1.0, float(rho[-1]))
    return rho[np.concatenate([[True], new_ring])]


def _pad_band_counts(u: np.ndarray) -> Tuple[float, float, float]:
    """``(d, radii ratio, angle ratio)`` of the pad band: ``d = u[-1] - u[-2]``, ``0.5/d``, ``2 pi/d``.

    The band has ``ceil(0.5/d)`` radii and ``ceil(2 pi/d)`` angles (the lengths of
    ``arange(u[-1] + d, u[-1] + d + 0.5, d)`` and ``arange(0, 2 pi, d)``), each ceil snapped.
    """
    d = float(u[-1] - u[-2])
    return d, 0.5 / d, 2.0 * np.pi / d


def pad_candidates(in_xy: np.ndarray) -> np.ndarray:
    """The padding band outside the FoV (spec §6.4, fovi quirk included).

    With ``u`` = the distinct normalised radii of ``in_xy`` (:func:`distinct_radii`) and
    ``d = u[-1] - u[-2]``, the extra radii are ``u[-1] + d + i d`` for ``i < ceil(0.5/d)`` (what
    ``arange(u[-1] + d, u[-1] + d + 0.5, d)`` holds) and on each the angles are ``j d`` for
    ``j < ceil(2 pi/d)`` (``arange(0, 2 pi, d)``): the *angle* step reuses the radial step ``d``
    (in radians), as fovi does. Both counts are snapped ceils, so they are the same on every machine.

    Args:
        in_xy: ``[Nin, 2]`` normalised input coordinates.

    Returns:
        ``[Npad, 2]`` float64 padding points, radius-major then angle ascending (``[0, 2]`` when
        the input has fewer than two distinct radii).
    """
    in_xy = np.asarray(in_xy, dtype=np.float64)
    u = distinct_radii(in_xy)
    if u.size < 2:
        return np.zeros((0, 2))
    d, radii_ratio, angle_ratio = _pad_band_counts(u)
    radii = u[-1] + d + d * np.arange(int(_ceil_snapped(radii_ratio)))
    angles = d * np.arange(int(_ceil_snapped(angle_ratio)))
    rr, aa = np.meshgrid(radii, angles, indexing="ij")
    return np.stack([(rr * np.cos(aa)).ravel(), (rr * np.sin(aa)).ravel()], axis=1)


def _distances(queries: np.ndarray, candidates: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``[Nq, m]`` Euclidean distances from each query to its candidates ``ids [Nq, m]``.

    Written out coordinate by coordinate so the summation order is fixed (a 2- or 3-term sum).
    """
    diff = candidates[ids] - queries[:, None, :]
    sq = diff[..., 0] * diff[..., 0]
    for axis in range(1, diff.shape[-1]):
        sq = sq + diff[..., axis] * diff[..., axis]
    return np.sqrt(sq)


def _tie_classes(dist: np.ndarray) -> np.ndarray:
    """Tie-class numbers along each row of ascending distances ``[Nq, m]``.

    A new class starts where a distance exceeds the previous one by more than ``DECISION_RTOL``
    of itself; distances closer than that are the same distance (the grids' mirror and rotation
    symmetries make exact ties, which float64 reports as differences of ~1e-15).
    """
    gap = np.diff(dist, axis=1) > DECISION_RTOL * dist[:, 1:]
    return np.concatenate([np.zeros((len(dist), 1), dtype=np.int64), np.cumsum(gap, axis=1)], axis=1)


def knn_candidates(queries: np.ndarray, candidates: np.ndarray, k: int) -> np.ndarray:
    """``[Nq, k]`` int64 ids of the ``k`` nearest candidates (Euclidean), nearest first.

    **The tie rule.** Neighbours are ordered by ``(distance, candidate id)`` where distances
    within ``DECISION_RTOL`` of each other are equal: of tied candidates the lower id comes first,
    and where a tie straddles the ``k``-th place the lower ids are in. Inputs come before pad
    points in the candidate list, so a real input beats a pad point at the same distance. The
    result is therefore one fixed graph, the same on every machine; a plain KD-tree or ``topk``
    query resolves exact ties by accident of its implementation.

    A ``scipy.spatial.cKDTree`` finds a few more than ``k`` candidates per query; the query is
    widened until every row's ``k``-th tie class ends inside what was found.
    """
    queries = np.asarray(queries, dtype=np.float64)
    candidates = np.asarray(candidates, dtype=np.float64)
    k, nq, nc = int(k), len(queries), len(candidates)
    if not 1 <= k <= nc:
        raise ValueError(f"k: expected 1 <= k <= {nc} candidates, got {k}")
    tree = cKDTree(candidates)
    width = min(nc, k + max(4, k // 4))
    while True:
        _, ids = tree.query(queries, k=width)
        ids = np.asarray(ids, dtype=np.int64).reshape(nq, width)
        dist = _distances(queries, candidates, ids)
        order = np.argsort(dist, axis=1, kind="stable")
        ids, dist = np.take_along_axis(ids, order, 1), np.take_along_axis(dist, order, 1)
        cls = _tie_classes(dist)
        # the k-th class must end before the last column, or unseen candidates may tie with it
        if width == nc or np.all(cls[:, k - 1] < cls[:, -1]):
            break
        width = min(nc, 2 * width)
    order = np.lexsort((ids, cls), axis=1)
    return np.ascontiguousarray(np.take_along_axis(ids, order, 1)[:, :k])


# --------------------------------------------------------------------------------------------
# 3. local offsets and taps
# --------------------------------------------------------------------------------------------

def ref_side_for(k: int, ref_frame_mult: float = 1.0) -> int:
    """Reference-grid side ``s = ceil(ref_frame_mult * sqrt(K))`` (``V = s²``; spec §1.3 step 5).

    ``rf1`` (mult 1) gives ``V >= K`` (``V == K`` for square K), ``rf2`` (mult 2) ``V ~ 4K``.
    A product within 1e-9 of an integer is rounded first so that ``2*sqrt(9)`` is 6, not 7.
    """
    x = float(ref_frame_mult) * math.sqrt(int(k))
    return max(1, int(math.ceil(round(x, 9))))


def reference_grid(side: int) -> np.ndarray:
    """``[s*s, 2]`` reference points: tap ``v = a*s + b`` sits at ``(lin[a], lin[b])``.

    ``lin = linspace(-1, 1, s)`` and an 'ij' meshgrid (a <-> x, b <-> y), flattened row-major.
    """
    lin = np.linspace(-1.0, 1.0, int(side))
    ga, gb = np.meshgrid(lin, lin, indexing="ij")
    return np.stack([ga.ravel(), gb.ravel()], axis=1)


def local_offsets(out_xy: np.ndarray, out_cort: np.ndarray, cand_xy: np.ndarray,
                  cand_cort: np.ndarray, cand_idx: np.ndarray, sample_cortex: bool = True) -> np.ndarray:
    """Per-node normalised neighbour offsets ``u`` (spec §1.3 steps 1-4).

    Args:
        out_xy, out_cort: ``[Nout, 2]`` / ``[Nout, 3]`` output-node visual / cortical coordinates.
        cand_xy, cand_cort: ``[Ncand, 2]`` / ``[Ncand, 3]`` candidates (inputs, then pad band).
        cand_idx: ``[Nout, K]`` candidate ids from the KNN.
        sample_cortex: True: offset ``= r (cos theta, sin theta)`` with ``theta`` the visual
            direction and ``r`` the cortical distance; False: the raw visual difference.

    Returns:
        ``[Nout, K, 2]`` float64 ``u = 2 (o - min)/(max - min + 1e-6) - 1``, min/max per node and
        per axis over its K neighbours, so every neighbourhood's bounding box maps onto ``[-1, 1]²``
        (the max lands just below 1).
    """
    dxy = cand_xy[cand_idx] - out_xy[:, None, :]                       # [Nout, K, 2]
    if sample_cortex:
        theta = np.arctan2(dxy[..., 1], dxy[..., 0])
        r = np.linalg.norm(cand_cort[cand_idx] - out_cort[:, None, :], axis=-1)
        off = np.stack([r * np.cos(theta), r * np.sin(theta)], axis=-1)
    else:
        off = dxy
    lo = off.min(axis=1, keepdims=True)
    hi = off.max(axis=1, keepdims=True)
    return 2.0 * (off - lo) / (hi - lo + _MINMAX_EPS) - 1.0


def _tap_boundaries(side: int) -> np.ndarray:
    """``[s-1]`` midpoints between consecutive reference coordinates ``lin``."""
    lin = np.linspace(-1.0, 1.0, int(side))
    return (lin[1:] + lin[:-1]) / 2.0


def nearest_tap(u: np.ndarray, side: int) -> np.ndarray:
    """``rf_index = argmin_v ||u - ref[v]||`` (first index on ties), per axis (see module notes).

    Per axis the nearest of ``lin[0] < lin[1] < ...`` is the number of midpoints that ``u`` lies
    above. A coordinate within ``DECISION_RTOL`` of a midpoint is a tie and takes the lower
    reference coordinate: the "first index" of the spec, made independent of the last bits of
    ``u``.

    Args:
        u: ``[..., 2]`` normalised offsets. side: reference-grid side ``s``.

    Returns:
        ``[...]`` int64 taps ``a*s + b`` in ``[0, s²)``.
    """
    mid = _tap_boundaries(side)
    ia = np.sum(u[..., 0:1] > mid + DECISION_RTOL, axis=-1)
    ib = np.sum(u[..., 1:2] > mid + DECISION_RTOL, axis=-1)
    return (ia * int(side) + ib).astype(np.int64)


def nearest_tap_bruteforce(u: np.ndarray, side: int, chunk: int = 64) -> np.ndarray:
    """The literal spec: Euclidean distance to all ``s²`` reference points, ``argmin`` (slow)."""
    ref = reference_grid(side)
    flat = u.reshape(-1, 2)
    out = np.empty(len(flat), dtype=np.int64)
    step = max(1, chunk * 1024 // max(1, len(ref)))
    for i in range(0, len(flat), step):
        d = np.linalg.norm(flat[i:i + step, None, :] - ref[None], axis=-1)
        out[i:i + step] = np.argmin(d, axis=-1)
    return out.reshape(u.shape[:-1])


# --------------------------------------------------------------------------------------------
# 4. the graph
# --------------------------------------------------------------------------------------------

@dataclass(eq=False)
class KNNGraph:
    """One KNN-conv layer's graph: nodes, neighbours, taps (spec §1).

    Attributes:
        fov, a, res, in_stride, out_stride, ref_frame_mult, sample_cortex: the build parameters.
        in_coords: ``[Nin, 2]`` normalised visual coordinates of the input nodes.
        out_coords: ``[Nout, 2]`` output nodes (the *same array* as ``in_coords`` at equal strides).
        in_cortical, out_cortical: ``[Nin, 3]`` / ``[Nout, 3]`` sensor-manifold coordinates.
        pad_coords, pad_cortical: ``[Npad, 2]`` / ``[Npad, 3]`` the padding band (§6.4).
        cand_idx: ``[Nout, K]`` int64 raw KNN candidate ids (``>= Nin`` = pad point ``cand_idx-Nin``).
        idx: ``[Nout, K]`` torch int64 neighbour ids, pad token ``nin`` (spec's
            ``knn_indices_pad_token`` transposed).
        rf_index: ``[Nout, K]`` torch int64 taps in ``[0, V)``.
        local_offsets: ``[Nout, K, 2]`` float64 normalised offsets ``u``.
        ref_side: reference-grid side ``s``; ``v = s*s``.
        nin, nout, k, v: sizes (``k`` already clipped to ``nin``).
    """

    fov: float
    a: float
    res: int
    in_stride: float
    out_stride: float
    ref_frame_mult: float
    sample_cortex: bool
    in_coords: np.ndarray
    out_coords: np.ndarray
    in_cortical: np.ndarray
    out_cortical: np.ndarray
    pad_coords: np.ndarray
    pad_cortical: np.ndarray
    cand_idx: np.ndarray
    idx: torch.Tensor
    rf_index: torch.Tensor
    local_offsets: np.ndarray
    ref_side: int
    nin: int
    nout: int
    k: int
    v: int
    _metas: Dict[tuple, object] = field(default_factory=dict, repr=False)

    # -- statistics ---------------------------------------------------------------------------
    @property
    def is_pad(self) -> np.ndarray:
        """``[Nout, K]`` bool: neighbour is the pad token."""
        return self.idx.numpy() == self.nin

    @property
    def pad_fraction(self) -> float:
        """Share of the ``Nout*K`` (n, k) entries that are the pad token ``nin``."""
        return float(self.is_pad.mean())

    @property
    def collided(self) -> np.ndarray:
        """``[Nout, K]`` bool: tap ``rf_index[n, k]`` was already taken by a neighbour ``j < k``.

        This is the collision definition used throughout fovi_lab: an entry "collides" when it
        lands in a tap that an earlier (nearer) neighbour of the same node already occupies, so
        the number of collisions of a node is ``K - (distinct taps of the node)``: exactly the
        rows of ``W_n`` that the compact operator repeats. (Counting *every* member of a shared
        tap, the first one included, gives a larger number; see :attr:`shared_tap_rate`.)
        """
        rf = self.rf_index.numpy()
        order = np.argsort(rf, axis=1, kind="stable")
        srt = np.take_along_axis(rf, order, axis=1)
        dup_sorted = np.zeros_like(srt, dtype=bool)
        dup_sorted[:, 1:] = srt[:, 1:] == srt[:, :-1]     # stable sort: first occurrence is earliest k
        out = np.zeros_like(dup_sorted)
        np.put_along_axis(out, order, dup_sorted, axis=1)
        return out

    @property
    def collision_rate(self) -> float:
        """Share of (n, k) entries whose tap an earlier neighbour of the same node already took.

        Equals ``1 - sum_n (distinct taps of n) / (Nout*K)``. Measured: ~26 % for the rf1 stem
        (V = K = 121), ~0.1 % with rf2 (V = 4K).
        """
        return float(self.collided.mean())

    @property
    def shared_tap_rate(self) -> float:
        """Share of (n, k) entries in a tap shared with *any* other neighbour of the same node."""
        rf = self.rf_index.numpy()
        counts = np.zeros((self.nout, self.v), dtype=np.int64)
        np.add.at(counts, (np.arange(self.nout)[:, None], rf), 1)
        return float((np.take_along_axis(counts, rf, axis=1) > 1).mean())

    @property
    def empty_tap_rate(self) -> float:
        """Share of (n, v) taps that receive no neighbour (always >= 1 - K/V)."""
        rf = self.rf_index.numpy()
        used = np.zeros((self.nout, self.v), dtype=bool)
        used[np.arange(self.nout)[:, None], rf] = True
        return float(1.0 - used.mean())

    @property
    def same_grid(self) -> bool:
        """True when the output nodes are the input nodes (equal strides)."""
        return self.out_coords is self.in_coords

    @property
    def ref_points(self) -> np.ndarray:
        """``[V, 2]`` reference-grid points (see :func:`reference_grid`)."""
        return reference_grid(self.ref_side)

    def meta(self, cin: int, cout: int, device=None):
        """The compact-operator :class:`~fovi_lab.graph.meta.TrainingMeta` for ``cin -> cout`` channels.

        Built once per ``(cin, cout)`` with :func:`fovi_lab.graph.meta.build_meta` and cached on the graph;
        ``device`` moves (and caches) a copy via ``TrainingMeta.to``.
        """
        from fovi_lab.graph.meta import build_meta

        key = (int(cin), int(cout))
        m = self._metas.get(key)
        if m is None:
            m = build_meta(self.idx, self.rf_index, cin=key[0], cout=key[1], v=self.v, nin=self.nin)
            self._metas[key] = m
        return m if device is None else m.to(device)

    def digest(self) -> str:
        """sha256 (hex) of the integer tables: shapes, then ``idx`` and ``rf_index`` as little-endian int64.

        Two machines built the same graph exactly when their digests agree; the tests pin the digest of
        every real layer (:func:`fovi_lab.graph.layers.graph_digests`).
        """
        h = hashlib.sha256()
        h.update(np.asarray([self.nin, self.nout, self.k, self.v], dtype="<i8").tobytes())
        for t in (self.idx, self.rf_index):
            h.update(np.ascontiguousarray(t.numpy(), dtype="<i8").tobytes())
        return h.hexdigest()

    def summary(self) -> dict:
        """Plain-number summary (sizes, pad fraction, collision rate)."""
        return {
            "nin": self.nin, "nout": self.nout, "k": self.k, "ref_side": self.ref_side, "v": self.v,
            "npad_candidates": int(len(self.pad_coords)),
            "pad_fraction": self.pad_fraction, "collision_rate": self.collision_rate,
            "empty_tap_rate": self.empty_tap_rate,
        }


def decision_margins(graph: "KNNGraph") -> Dict[str, float]:
    """How far each of the graph's discrete decisions lies from the line where it would flip.

    Every integer the graph holds comes from comparing float64 values: a ceil (ring point counts,
    the pad band's counts), a gap between sorted radii, a gap between sorted neighbour distances
    (order and the ``K``-th place), a tap coordinate against a midpoint of the reference grid.
    Each comparison is made with the tolerance ``DECISION_RTOL``. The graph is the same on every
    machine when no compared value lies within float noise (~1e-13 relative) of that tolerance
    line: values meant to be equal ("ties") must differ by far less than ``DECISION_RTOL``, and
    values meant to differ by far more.

    Returns:
        ``{kind + "_tie": largest relative difference decided as a tie (0.0 if none),
        kind + "_split": smallest relative difference decided as distinct}`` for the kinds
        ``count`` (ceil inputs, distance from the nearest integer: the ring point counts of every ring
        count the resource matching examined, and the pad band's counts), ``radius`` (ring radii),
        ``knn`` (the first ``K + 1`` neighbour distances of every node) and ``tap`` (tap
        coordinates against midpoints), plus ``knn_ties_at_cut``: the nodes whose ``K``-th place
        was decided by the tie rule.
    """
    g = graph
    ratios = []
    for stride in {g.in_stride, g.out_stride}:
        # every ring count the matching compared against the budget, not only the one it chose
        for rings in range(2, matched_n_rings(g.fov, g.a, _target(g.res, stride)) + 18):
            ratios.append(_ring_count_ratio(_radii_with_extra_ring(g.fov, g.a, rings), rings))
    radii = np.sort(np.hypot(g.in_coords[:, 0], g.in_coords[:, 1]))
    rel_gap = np.diff(radii) / max(1.0, float(radii[-1]))
    u = distinct_radii(g.in_coords)
    if u.size >= 2:
        ratios.append(np.array(_pad_band_counts(u)[1:]))
    ratios = np.concatenate(ratios) if ratios else np.zeros(0)

    queries = g.out_cortical if g.sample_cortex else g.out_coords
    cands = np.concatenate([g.in_cortical, g.pad_cortical] if g.sample_cortex else [g.in_coords, g.pad_coords])
    width = min(len(cands), g.k + 1)
    _, ids = cKDTree(cands).query(queries, k=width)
    dist = np.sort(_distances(queries, cands, np.asarray(ids).reshape(len(queries), width)), axis=1)
    knn_gap = np.diff(dist, axis=1) / np.maximum(dist[:, 1:], np.finfo(np.float64).tiny)
    at_cut = 0
    if width > g.k:
        at_cut = int(np.sum(knn_gap[:, g.k - 1] <= DECISION_RTOL))

    tap_gap = np.abs(g.local_offsets[..., None] - _tap_boundaries(g.ref_side)).ravel()

    return {
        "count_tie": _tie(_integer_gap(ratios)), "count_split": _split(_integer_gap(ratios)),
        "radius_tie": _tie(rel_gap), "radius_split": _split(rel_gap),
        "knn_tie": _tie(knn_gap), "knn_split": _split(knn_gap), "knn_ties_at_cut": at_cut,
        "tap_tie": _tie(tap_gap), "tap_split": _split(tap_gap),
    }


def _target(res: float, stride: float) -> int:
    """Point budget ``floor((res/stride)**2)`` (at least 1)."""
    return max(1, int(math.floor((float(res) / float(stride)) ** 2 + 1e-9)))


@functools.lru_cache(maxsize=128)
def _build_graph(fov: float, a: float, res: int, in_stride: float, out_stride: float, k: int,
                 ref_frame_mult: float, sample_cortex: bool, ref_side: Optional[int]) -> KNNGraph:
    in_xy = matched_isotropic_grid(fov, a, _target(res, in_stride))
    out_xy = in_xy if in_stride == out_stride else matched_isotropic_grid(fov, a, _target(res, out_stride))
    nin, nout = len(in_xy), len(out_xy)
    k = min(int(k), nin)

    pad_xy = pad_candidates(in_xy)
    in_c = cortical_coords(in_xy, fov, a)
    out_c = in_c if out_xy is in_xy else cortical_coords(out_xy, fov, a)
    pad_c = cortical_coords(pad_xy, fov, a)
    cand_xy = np.concatenate([in_xy, pad_xy], axis=0)
    cand_c = np.concatenate([in_c, pad_c], axis=0)

    if sample_cortex:
        cand_idx = knn_candidates(out_c, cand_c, k)
    else:
        cand_idx = knn_candidates(out_xy, cand_xy, k)
    u = local_offsets(out_xy, out_c, cand_xy, cand_c, cand_idx, sample_cortex=sample_cortex)
    side = int(ref_side) if ref_side is not None else ref_side_for(k, ref_frame_mult)
    rf = nearest_tap(u, side)
    idx = np.where(cand_idx >= nin, nin, cand_idx)

    _readonly(in_c, pad_xy, pad_c, cand_idx, u)
    if out_c is not in_c:
        _readonly(out_c)
    return KNNGraph(
        fov=fov, a=a, res=res, in_stride=in_stride, out_stride=out_stride,
        ref_frame_mult=ref_frame_mult, sample_cortex=sample_cortex,
        in_coords=in_xy, out_coords=out_xy, in_cortical=in_c, out_cortical=out_c,
        pad_coords=pad_xy, pad_cortical=pad_c, cand_idx=cand_idx,
        idx=torch.from_numpy(idx.copy()), rf_index=torch.from_numpy(rf),
        local_offsets=u, ref_side=side, nin=nin, nout=nout, k=k, v=side * side,
    )


def foveated_knn_graph(fov: float = 16.0, a: float = 0.5, res: int = 64, in_stride: float = 1,
                       out_stride: float = 1, k: int = 9, ref_frame_mult: float = 1.0,
                       sample_cortex: bool = True, ref_side: Optional[int] = None) -> KNNGraph:
    """Build (or fetch from the cache) one layer's foveated KNN graph (spec §1, §6).

    Args:
        fov: FoV diameter (degrees). a: magnification parameter (model values 0.5, 1, 2.79, 60.94).
        res: the Cartesian resolution the grids are resource-matched to (64).
        in_stride, out_stride: the input grid is matched to ``(res/in_stride)**2`` points, the
            output grid to ``(res/out_stride)**2`` (same ``fov`` and ``a``). Equal strides: the
            output grid *is* the input grid (KNN includes the node itself, at distance 0).
        k: neighbours per output node (clipped to Nin).
        ref_frame_mult: reference side ``s = ceil(ref_frame_mult sqrt(K))``: 1 -> "rf1",
            2 -> "rf2".
        sample_cortex: rank neighbours and measure offset lengths in cortical 3-D space (True,
            fovi's default) or in visual Cartesian space (False).
        ref_side: explicit reference side overriding ``ref_frame_mult`` (fovi's
            ``ref_frame_side_length``; the DINOv3 patch embed uses 16).

    Returns:
        A cached, shared :class:`KNNGraph` (treat as read-only).

    Raises:
        ValueError: for non-positive ``k``, ``fov``, ``a``, ``res``, strides or ``ref_side``.
    """
    if int(k) != k or int(k) < 1:
        raise ValueError(f"k: expected a positive integer, got {k!r}")
    for name, val in (("fov", fov), ("a", a), ("res", res), ("in_stride", in_stride),
                      ("out_stride", out_stride), ("ref_frame_mult", ref_frame_mult)):
        if not float(val) > 0:
            raise ValueError(f"{name}: expected > 0, got {val!r}")
    if ref_side is not None and int(ref_side) < 1:
        raise ValueError(f"ref_side: expected >= 1, got {ref_side!r}")
    return _build_graph(float(fov), float(a), int(res), float(in_stride), float(out_stride), int(k),
                        float(ref_frame_mult), bool(sample_cortex),
                        None if ref_side is None else int(ref_side))
