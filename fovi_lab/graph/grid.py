"""The foveated sampling grid: isotropic rings, resource matching, cortical coordinates, the pad band,
and the tolerance rules every discrete decision of the graph follows (see :mod:`fovi_lab.graph.geometry`).
"""

from __future__ import annotations

import functools
import math
from typing import Tuple

import numpy as np
from scipy.integrate import cumulative_trapezoid


#: The sensor-manifold gain ``k`` of ``M(t) = k/(t + a)`` (docs/operator.md §6.2).
CORTEX_K = 10.0

#: Normalisation epsilon of the per-node min-max stretch (docs/operator.md §1.3 step 4).
_MINMAX_EPS = 1e-6

#: Eccentricity mesh step (degrees) of the z(r) integral (docs/operator.md §6.2).
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
    """Ring radii and points per ring of the isotropic foveated grid (docs/operator.md §6.1).

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
    """The isotropic foveated grid in normalised visual coordinates (docs/operator.md §6.1).

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
    """The **largest** ring count ``R`` with ``N(R) <= target_points`` (docs/operator.md §6.1, §6.3).

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
    """Points on the 3-D sensor manifold (docs/operator.md §6.2).

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
    """The padding band outside the FoV (docs/operator.md §6.4, fovi quirk included).

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
