"""The index tables and the reverse CSR (docs/operator.md §2.1, §3.1)."""

import pytest
import torch

from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph


def _meta(name="ODD", seed=0):
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[name]
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    return build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin), idx, rf


@pytest.mark.parametrize("name", list(SYNTHETIC_SHAPES))
def test_tables_match_the_definition(name):
    m, idx, rf = _meta(name)
    cin, cout, nin, nout, k, v, _ = SYNTHETIC_SHAPES[name]
    assert (m.p, m.q, m.nout, m.k) == (cin * k, cin * v, nout, k)
    assert m.p64 % 64 == 0 and m.p64 - 64 < m.p <= m.p64
    assert m.input_linear.dtype == torch.int32 and m.input_linear.shape == (nout, m.p64)
    assert m.weight_linear.dtype == torch.int32 and m.input_linear.is_contiguous()
    assert m.input_linear_flat.dtype == torch.int64 and m.input_linear_flat.shape == (nout * m.p64,)
    for n in (0, nout // 2, nout - 1):
        for c in (0, cin - 1):
            for kk in range(k):
                p = c * k + kk
                want_in = cin * nin if idx[n, kk] == nin else c * nin + idx[n, kk]
                assert m.input_linear[n, p] == want_in
                assert m.weight_linear[n, p] == c * v + rf[n, kk]
    # p >= P fillers: the pad column and weight row 0
    assert (m.input_linear[:, m.p:] == cin * nin).all()
    assert (m.weight_linear[:, m.p:] == 0).all()
    assert torch.equal(m.input_linear_flat, m.input_linear.reshape(-1).long())


@pytest.mark.parametrize("name", list(SYNTHETIC_SHAPES))
def test_reverse_csr_lists_every_non_pad_reader_once(name):
    m, idx, _ = _meta(name)
    rowptr, col = m.rev_rowptr.long(), m.rev_col.long()
    assert rowptr[0] == 0 and rowptr[-1] == col.numel() == int((idx < m.nin).sum())
    for node in range(m.nin):
        js = col[rowptr[node]:rowptr[node + 1]]
        kk, n = js // m.nout, js % m.nout
        assert (idx[n, kk] == node).all()
        assert torch.equal(js, js.sort().values)  # stable: ascending j within a row
        assert js.numel() == int((idx == node).sum())


def test_meta_moves_between_devices_and_caches():
    m, _, _ = _meta()
    assert m.to("cpu") is m
    meta_meta = m.to(torch.device("meta"))
    assert meta_meta.input_linear.device.type == "meta" and meta_meta is m.to("meta")


def test_bad_tables_raise_clear_errors():
    idx, rf = synthetic_graph(10, 4, 3, 5, 2)
    with pytest.raises(ValueError, match="idx"):
        build_meta(idx + 20, rf, cin=2, cout=3, v=5, nin=10)
    with pytest.raises(ValueError, match="idx"):
        build_meta(idx - 20, rf, cin=2, cout=3, v=5, nin=10)
    with pytest.raises(ValueError, match="rf_index.*v too small"):
        build_meta(idx, rf, cin=2, cout=3, v=2, nin=10)
    with pytest.raises(TypeError, match="idx"):
        build_meta(idx.float(), rf, cin=2, cout=3, v=5, nin=10)
    with pytest.raises(ValueError, match="rf_index"):
        build_meta(idx, rf[:, :2], cin=2, cout=3, v=5, nin=10)
    with pytest.raises(ValueError, match="cin"):
        build_meta(idx, rf, cin=0, cout=3, v=5, nin=10)
    with pytest.raises(ValueError, match="idx"):
        build_meta(idx[0], rf[0], cin=2, cout=3, v=5, nin=10)


def test_one_graph_gives_one_meta_and_its_layers_share_what_is_derived_from_it():
    """build_meta of the same graph and sizes returns the same meta (so two layers of one graph share the tables the
    backends derive from it: one transposed layer, one tap layer per batch); another size or graph another meta."""
    from fovi_lab.graph.meta import meta_aux, tap_meta, transposed_meta
    idx, rf = synthetic_graph(40, 30, 5, 7, 3, seed=11)
    a = build_meta(idx, rf, cin=8, cout=16, v=7, nin=40)
    b = build_meta(idx.clone(), rf.clone().int(), cin=8, cout=16, v=7, nin=40)
    assert a is b and a.to("cpu") is b
    assert transposed_meta(a) is transposed_meta(b) and tap_meta(a, 4) is tap_meta(b, 4)
    assert "transposed" in meta_aux(b)
    for other in (build_meta(idx, rf, cin=8, cout=17, v=7, nin=40), build_meta(idx, rf, cin=8, cout=16, v=8, nin=40),
                  build_meta(idx.flip(0), rf, cin=8, cout=16, v=7, nin=40)):
        assert other is not a


def test_a_device_copy_keeps_its_graphs_meta_and_makes_no_flat_copies():
    """A meta on another device (here torch's "meta" device) holds the meta it was copied from, so build_meta of
    the same graph finds it while only the copy is held (as fovi's layers hold theirs); the copy makes the int64 flat
    tables only when they are read."""
    import gc
    idx, rf = synthetic_graph(40, 30, 5, 7, 3, seed=12)
    d = build_meta(idx, rf, cin=8, cout=16, v=7, nin=40, device="meta")
    gc.collect()
    assert build_meta(idx, rf, cin=8, cout=16, v=7, nin=40, device="meta") is d
    assert d.input_linear.device.type == "meta"
    assert "_input_linear_flat" not in vars(d) and "_weight_linear_flat" not in vars(d)
    assert d.input_linear_flat.dtype == torch.int64 and d.input_linear_flat.shape == (d.nout * d.p64,)
    assert "_input_linear_flat" in vars(d)


def test_held_bytes_count_the_tables_and_what_is_derived_from_them_once():
    """held_bytes: a meta's own tables, plus each derived layer once it is built (the transposed layer, a tap layer
    per batch), each storage once (a meta listed twice, or shared, counts once); another device holds none of it."""
    from fovi_lab.graph.meta import held_bytes, tap_meta, transposed_meta
    idx, rf = synthetic_graph(40, 30, 5, 7, 3, seed=13)
    m = build_meta(idx, rf, cin=8, cout=16, v=7, nin=40)
    own = sum(t.numel() * t.element_size() for t in (m.input_linear, m.weight_linear, m.rev_rowptr, m.rev_col,
                                                     m.idx, m.rf_index))
    assert held_bytes(m) == own == held_bytes([m, m])
    t = transposed_meta(m)
    assert held_bytes(m) == own + held_bytes(t) and held_bytes(t) > 0
    before = held_bytes(m)
    tap_meta(m, 4)
    assert held_bytes(m) == before + held_bytes(tap_meta(m, 4))
    assert held_bytes(m, "meta") == 0 and held_bytes(m, derived=False) == own
    m.input_linear_flat                          # made on first read: now held too
    assert held_bytes(m) == before + held_bytes(tap_meta(m, 4)) + m.input_linear_flat.numel() * 8
