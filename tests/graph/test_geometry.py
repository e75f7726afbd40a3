"""Geometry of the foveated KNN graphs (docs/operator.md §1.2, §1.3, §6): counts, pads, taps, collisions."""

import math

import numpy as np
import pytest
import torch

from fovi_lab.graph import geometry as geo
from fovi_lab.graph.geometry import foveated_knn_graph


@pytest.mark.parametrize("a, n_in, n_out", [(0.5, 4085, 964), (1.0, 4010, 1023)])
def test_matched_counts(a, n_in, n_out):
    assert len(geo.matched_isotropic_grid(16.0, a, 64 ** 2)) == n_in
    assert len(geo.matched_isotropic_grid(16.0, a, 32 ** 2)) == n_out
    g = foveated_knn_graph(a=a, k=9, out_stride=2)
    assert (g.nin, g.nout) == (n_in, n_out)


def test_matched_counts_all_strides():
    counts = [len(geo.matched_isotropic_grid(16.0, 0.5, (64 // s) ** 2)) for s in (1, 2, 4, 8, 16, 32)]
    assert counts == [4085, 964, 230, 60, 16, 2]


def test_matching_picks_largest_fitting_ring_count():
    for target in (4, 16, 64, 1024):
        r = geo.matched_n_rings(16.0, 0.5, target)
        assert geo.grid_size(16.0, 0.5, r) <= target
        assert all(geo.grid_size(16.0, 0.5, rr) > target for rr in range(r + 1, r + 20))


def test_ring_structure():
    r, n = geo.ring_radii(16.0, 0.5, 53)
    assert r[0] == 0 and n[0] == 1
    assert math.isclose(r[-1], 8.0, rel_tol=1e-12)
    assert np.all(np.diff(r) > 0)
    xy = geo.isotropic_grid(16.0, 0.5, 53)
    assert xy.shape == (n.sum(), 2)
    rho = np.hypot(xy[:, 0], xy[:, 1])
    assert np.allclose(rho, np.repeat(r / 8.0, n))
    assert rho.max() <= 1 + 1e-12
    # ring 1 of the 53-ring grid starts at angle 0 (no stagger)
    assert xy[1, 1] == 0.0 and xy[1, 0] > 0


def test_cortical_coords():
    xy = geo.matched_isotropic_grid(16.0, 0.5, 64 ** 2)
    c = geo.cortical_coords(xy, 16.0, 0.5)
    assert c.shape == (len(xy), 3)
    assert np.allclose(c[0], 0.0)
    # z(r) grows with eccentricity; the planar radius follows rho(r) = M(r) sin(r deg) 180/pi
    r = np.hypot(xy[:, 0], xy[:, 1]) * 8.0
    order = np.argsort(r)
    assert np.all(np.diff(c[order, 2]) >= -1e-12)
    rho = 10.0 / (r + 0.5) * np.sin(np.deg2rad(r)) * 180 / np.pi
    assert np.allclose(np.hypot(c[:, 0], c[:, 1]), rho)
    # arc length on the manifold per degree is M(r): check d(arc)/dr numerically at r = 4 deg
    pts = geo.cortical_coords(np.array([[4.0 / 8, 0.0], [4.001 / 8, 0.0]]), 16.0, 0.5)
    assert math.isclose(np.linalg.norm(pts[1] - pts[0]) / 0.001, 10.0 / 4.5, rel_tol=1e-3)


def test_pad_candidates_quirk():
    xy = geo.matched_isotropic_grid(16.0, 0.5, 64 ** 2)
    pad = geo.pad_candidates(xy)
    u = np.unique(np.round(np.hypot(xy[:, 0], xy[:, 1]), 9))
    d = u[-1] - u[-2]
    radii = np.unique(np.round(np.hypot(pad[:, 0], pad[:, 1]), 9))
    assert np.allclose(radii, np.arange(u[-1] + d, u[-1] + d + 0.5, d))
    assert len(pad) == len(radii) * len(np.arange(0, 2 * np.pi, d))  # angle step reuses d
    assert np.hypot(pad[:, 0], pad[:, 1]).min() > 1.0


@pytest.fixture(scope="module")
def stem_rf1():
    return foveated_knn_graph(a=0.5, k=121, out_stride=2, ref_frame_mult=1.0)


@pytest.fixture(scope="module")
def stem_rf2():
    return foveated_knn_graph(a=0.5, k=121, out_stride=2, ref_frame_mult=2.0)


def test_stem_pad_fraction(stem_rf1):
    # docs/operator.md §6: 4.66 % (a=0.5) and 5.12 % (a=1)
    assert stem_rf1.pad_fraction == pytest.approx(0.0466, abs=5e-4)
    g1 = foveated_knn_graph(a=1.0, k=121, out_stride=2)
    assert g1.pad_fraction == pytest.approx(0.0512, abs=5e-4)


def test_collision_rates(stem_rf1, stem_rf2):
    assert (stem_rf1.v, stem_rf2.v) == (121, 484)
    # docs/operator.md §1.3, §6.5: rf1 ~22-26 %, 26.4 % on this stem; rf2 ~0
    assert stem_rf1.collision_rate == pytest.approx(0.264, abs=0.005)
    assert stem_rf2.collision_rate < 0.005
    # with V == K, every collision leaves exactly one tap empty
    assert stem_rf1.empty_tap_rate == pytest.approx(stem_rf1.collision_rate)


def test_collision_definition():
    g = foveated_knn_graph(a=0.5, k=9, in_stride=8, out_stride=8)
    rf = g.rf_index.numpy()
    expect = np.array([[rf[n, k] in rf[n, :k] for k in range(g.k)] for n in range(g.nout)])
    assert np.array_equal(g.collided, expect)
    assert not g.collided[:, 0].any()
    assert g.collision_rate == pytest.approx(1 - sum(len(set(r)) for r in rf) / rf.size)


def test_tables(stem_rf2):
    g = stem_rf2
    assert g.idx.dtype == torch.int64 and g.rf_index.dtype == torch.int64
    assert tuple(g.idx.shape) == tuple(g.rf_index.shape) == (g.nout, g.k)
    assert g.local_offsets.shape == (g.nout, g.k, 2)
    assert int(g.rf_index.min()) >= 0 and int(g.rf_index.max()) < g.v
    assert int(g.idx.min()) >= 0 and int(g.idx.max()) == g.nin
    # pad entries are exactly nin, and exactly the candidates beyond the real inputs
    pad = g.cand_idx >= g.nin
    assert np.array_equal(g.idx.numpy() == g.nin, pad)
    assert np.array_equal(g.idx.numpy()[~pad], g.cand_idx[~pad])
    # offsets stretch each node's bounding box onto [-1, 1]
    u = g.local_offsets
    assert np.allclose(u.min(axis=1), -1.0)
    assert np.all(u.max(axis=1) < 1.0) and np.allclose(u.max(axis=1), 1.0, atol=1e-4)


def test_knn_sorted_by_cortical_distance(stem_rf2):
    g = stem_rf2
    cand = np.concatenate([g.in_cortical, g.pad_cortical])
    d = np.linalg.norm(cand[g.cand_idx] - g.out_cortical[:, None, :], axis=-1)
    assert np.all(np.diff(d, axis=1) >= -1e-12)
    # no candidate outside the K is nearer than the K-th
    n = 17
    all_d = np.linalg.norm(cand - g.out_cortical[n], axis=-1)
    assert np.sort(all_d)[g.k - 1] == pytest.approx(d[n, -1])


def test_taps_match_bruteforce_argmin(stem_rf1):
    g = stem_rf1
    bf = geo.nearest_tap_bruteforce(g.local_offsets[:200], g.ref_side)
    assert np.array_equal(bf, g.rf_index.numpy()[:200])


def test_tap_ties_take_first_index():
    # midway between lin[0] = -1 and lin[1] = 1 (s = 2): the first of the tied taps wins
    u = np.array([[[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]]])
    assert geo.nearest_tap(u, 2).tolist() == [[0, 1, 2]]
    assert geo.nearest_tap_bruteforce(u, 2).tolist() == [[0, 1, 2]]


def test_reference_grid_ij_layout():
    ref = geo.reference_grid(3)
    lin = np.linspace(-1, 1, 3)
    for a in range(3):
        for b in range(3):
            assert tuple(ref[a * 3 + b]) == (lin[a], lin[b])
    assert geo.ref_side_for(9, 2.0) == 6 and geo.ref_side_for(121, 1.0) == 11
    assert geo.ref_side_for(25, 2.0) == 10 and geo.ref_side_for(2, 1.0) == 2


def test_equal_strides_share_grid():
    g = foveated_knn_graph(a=0.5, k=9, in_stride=4, out_stride=4)
    assert g.same_grid and g.out_coords is g.in_coords
    # each node's nearest neighbour is itself, at offset (0, 0) before normalisation
    assert np.array_equal(g.idx[:, 0].numpy(), np.arange(g.nout))


def test_k_clipped_to_nin():
    g = foveated_knn_graph(a=0.5, k=9, in_stride=32, out_stride=32)
    assert g.nin == 2 and g.k == 2 and tuple(g.idx.shape) == (2, 2)
    assert g.v == 4  # rf1: ceil(sqrt(2))**2, from the clipped K


def test_visual_cartesian_option():
    g = foveated_knn_graph(a=0.5, k=9, in_stride=4, out_stride=8, sample_cortex=False)
    cand = np.concatenate([g.in_coords, g.pad_coords])
    d = np.linalg.norm(cand[g.cand_idx] - g.out_coords[:, None, :], axis=-1)
    assert np.all(np.diff(d, axis=1) >= -1e-12)
    assert int(g.rf_index.max()) < g.v


def test_determinism_and_cache():
    g1 = foveated_knn_graph(a=0.5, k=25, in_stride=4, out_stride=4, ref_frame_mult=2.0)
    g2 = foveated_knn_graph(a=0.5, k=25, in_stride=4, out_stride=4, ref_frame_mult=2)
    assert g1 is g2
    geo._build_graph.cache_clear()
    g3 = foveated_knn_graph(a=0.5, k=25, in_stride=4, out_stride=4, ref_frame_mult=2.0)
    assert g3 is not g1
    assert torch.equal(g1.idx, g3.idx) and torch.equal(g1.rf_index, g3.rf_index)
    assert np.array_equal(g1.local_offsets, g3.local_offsets)


def test_meta_cached_and_consistent():
    g = foveated_knn_graph(a=0.5, k=9, in_stride=4, out_stride=8, ref_frame_mult=2.0)
    m = g.meta(5, 7)
    assert g.meta(5, 7) is m
    assert (m.cin, m.cout, m.nin, m.nout, m.k, m.v) == (5, 7, g.nin, g.nout, g.k, g.v)
    assert torch.equal(m.idx, g.idx) and torch.equal(m.rf_index, g.rf_index)


@pytest.mark.parametrize("kw", [dict(k=0), dict(k=-3), dict(k=2.5), dict(a=0.0), dict(fov=-1.0),
                                dict(out_stride=0), dict(ref_side=0)])
def test_invalid_params_raise(kw):
    with pytest.raises(ValueError):
        foveated_knn_graph(**kw)
