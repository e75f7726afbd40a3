"""Neighbours and kernel taps: the K nearest candidates in cortical space under the fixed tie rule, and
each (node, neighbour) pair's nearest tap of the reference grid (see :mod:`fovi_lab.graph.geometry`).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.spatial import cKDTree

from fovi_lab.graph.grid import DECISION_RTOL, _MINMAX_EPS


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

def ref_side_for(k: int, ref_frame_mult: float = 1.0) -> int:
    """Reference-grid side ``s = ceil(ref_frame_mult * sqrt(K))`` (``V = s²``; docs/operator.md §1.3 step 5).

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
    """Per-node normalised neighbour offsets ``u`` (docs/operator.md §1.3 steps 1-4).

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
