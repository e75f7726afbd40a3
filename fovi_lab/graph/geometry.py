"""Foveated grids, the cortical sensor manifold, KNN and kernel taps (docs/operator.md §1.1-§1.3, §6).

This module and its two helpers regenerate, with numpy and scipy only, the graphs that fovi's KNN convolution layers
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
tolerance line is nowhere near any of them. ``tests/graph/test_geometry_reproducible.py`` pins the digest of
every real layer's tables and rebuilds them under numpy's CPU-dispatch settings and with injected
last-bit noise.

Steps 1-4 and the decision rules live in :mod:`fovi_lab.graph.grid`, steps 5-6 in :mod:`fovi_lab.graph.knn`;
this module assembles them into a :class:`KNNGraph`.

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
from typing import Dict, Optional

import numpy as np
import torch
from scipy.spatial import cKDTree

from fovi_lab.graph.grid import (CORTEX_K, cortical_coords, DECISION_RTOL, distinct_radii, grid_size, isotropic_grid,
                                 matched_isotropic_grid, matched_n_rings, pad_candidates, ring_radii, _integer_gap,
                                 _pad_band_counts, _radii_with_extra_ring, _readonly, _ring_count_ratio, _split, _tie)
from fovi_lab.graph.knn import (knn_candidates, local_offsets, nearest_tap, nearest_tap_bruteforce, ref_side_for,
                                reference_grid, _distances, _tap_boundaries)


__all__ = [
    "ring_radii", "isotropic_grid", "grid_size", "matched_n_rings", "matched_isotropic_grid",
    "cortical_coords", "pad_candidates", "knn_candidates", "reference_grid", "ref_side_for",
    "local_offsets", "nearest_tap", "nearest_tap_bruteforce", "KNNGraph", "foveated_knn_graph",
    "CORTEX_K", "DECISION_RTOL", "distinct_radii", "decision_margins",
]


@dataclass(eq=False)
class KNNGraph:
    """One KNN-conv layer's graph: nodes, neighbours, taps (docs/operator.md §1).

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
    """Build (or fetch from the cache) one layer's foveated KNN graph (docs/operator.md §1, §6).

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
