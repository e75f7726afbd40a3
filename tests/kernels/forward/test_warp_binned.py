"""The binned forward on tensor cores (``fovi_lab.kernels.forward.binned``): bin by weight column, one shared-weight
GEMM on the mma kernels, on Warp's CPU device (the kernels' CPU branch), against the fp32 oracle on irregular shapes
(collisions, heavy padding, Cout below a tile, a stem with Cin = 3), bitwise repeatable, and the forward's path switch.

Criterion: the fp32 oracle on the same rounded operands, within 3x the error of the oracle computed in fp16 plus 2e-3
(a collision rounds its bin's sum to fp16 once, where the compact kernels round nothing before the GEMM).
"""

import pytest
import torch

from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph
from fovi_lab.kernels.forward import binned as BN
from fovi_lab.ops.reference import oracle_forward

STEM = (3, 24, 200, 37, 42, 49, 25)      # Cin = 3, V ~ K (rf1-like: many collisions), 25 pad entries


def _problem(shape, b, dtype=torch.float16, seed=0, bias=True):
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[shape] if isinstance(shape, str) else shape
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    g = torch.Generator().manual_seed(11 + b)
    x = torch.randn(b, cin, nin, generator=g).to(dtype)
    w = (torch.randn(cout, cin * v, generator=g) / (cin * k) ** 0.5).to(dtype)
    bb = torch.randn(cout, generator=g).to(dtype) if bias else None
    return meta, x, w, bb


def _assert_forward(y, meta, x, w, bias):
    ref = oracle_forward(x.float(), w.float(), None if bias is None else bias.float(), meta.idx, meta.rf_index, meta.v)
    ref16 = oracle_forward(x, w, bias, meta.idx, meta.rf_index, meta.v, dtype=x.dtype)
    assert y.dtype == x.dtype and y.shape == ref.shape
    assert torch.isfinite(y).all()
    err, ref_err = float((y.float() - ref).abs().max()), float((ref16.float() - ref).abs().max())
    assert err <= 3 * ref_err + 2e-3, (err, ref_err)


def test_the_chains_list_every_real_entry_under_its_column_in_p_order():
    meta = _problem(STEM, 1)[0]
    first, nxt = BN.binned_tables(meta)
    assert first.shape == (meta.nout, meta.q) and nxt.shape == (meta.nout, meta.p64)
    il, wl = meta.input_linear, meta.weight_linear
    got = {}
    for n in range(meta.nout):
        for q in torch.nonzero(first[n] >= 0).flatten().tolist():
            p, chain = int(first[n, q]), []
            while p >= 0:
                chain.append(p)
                p = int(nxt[n, p])
            got[(n, q)] = chain
    want = {}
    for n in range(meta.nout):
        for p in range(meta.p64):
            if int(il[n, p]) != meta.pad_column:
                want.setdefault((n, int(wl[n, p])), []).append(p)
    assert got == want
    assert any(len(c) > 1 for c in want.values())              # the stem has collisions: chains are exercised
    assert BN.binned_tables(meta) is BN.binned_tables(meta)    # built once per meta


def test_the_one_node_layer_is_the_identity_padded_to_64():
    meta = _problem("ODD", 1)[0]
    il, wl = BN.one_node_tables(meta)
    q64 = -(-meta.q // 64) * 64
    assert il.shape == wl.shape == (1, q64) and il.dtype == torch.int32
    assert il[0, :meta.q].tolist() == list(range(meta.q)) and set(il[0, meta.q:].tolist()) <= {meta.q}
    assert wl[0, :meta.q].tolist() == list(range(meta.q)) and set(wl[0, meta.q:].tolist()) <= {0}


@pytest.mark.parametrize("shape", ("MAIN", "ODD", "PAD_HEAVY", STEM))
@pytest.mark.parametrize("b", (1, 5))
def test_binned_forward_matches_the_oracle(shape, b):
    meta, x, w, bias = _problem(shape, b)
    _assert_forward(BN.run_binned(meta, x, w, bias), meta, x, w, bias)


def test_binned_bins_equal_the_definition_and_repeat_bitwise():
    meta, x, w, bias = _problem(STEM, 3)
    g = BN.bin_inputs(meta, x)
    xpad = torch.cat([x.reshape(3, -1).float(), torch.zeros(3, 1)], 1)
    want = torch.zeros(3, meta.nout, meta.q)
    for n in range(meta.nout):
        for p in range(meta.p64):
            c = int(meta.input_linear[n, p])
            if c != meta.pad_column:
                want[:, n, int(meta.weight_linear[n, p])] += xpad[:, c]
    assert torch.equal(g.view(3, meta.nout, meta.q), want.half())
    y1, y2 = BN.run_binned(meta, x, w, bias), BN.run_binned(meta, x, w, bias)
    assert torch.equal(y1, y2)


@pytest.mark.parametrize("config", ("mmas_o32b8", "mma_o64b8", "mmasw_o32b16"))
def test_binned_forward_on_forced_gemm_configs(config):
    meta, x, w, bias = _problem("ODD", 2, bias=False)
    _assert_forward(BN.run_binned(meta, x, w, bias, config=config), meta, x, w, bias)


def test_binned_forward_in_bf16():
    meta, x, w, bias = _problem("MAIN", 2, dtype=torch.bfloat16)
    y = BN.run_binned(meta, x, w, bias)
    assert y.dtype == torch.bfloat16
    ref = oracle_forward(x.float(), w.float(), bias.float(), meta.idx, meta.rf_index, meta.v)
    assert float((y.float() - ref).abs().max()) <= 2e-2 * (1 + float(ref.abs().max()))


def test_binned_forward_rejects_an_unknown_config():
    meta, x, w, bias = _problem("ODD", 1)
    with pytest.raises(ValueError, match="config"):
        BN.run_binned(meta, x, w, bias, config="no_such_config")


def test_the_forward_path_switch(monkeypatch):
    from fovi_lab.knn_warp import WarpCompactOps, forward_path
    meta, x, w, bias = _problem("ODD", 2)
    monkeypatch.delenv("FOVI_KNN_FWD_PATH", raising=False)
    assert forward_path() == "compact"                 # the default: the compact kernels
    monkeypatch.setenv("FOVI_KNN_FWD_PATH", "binned")
    assert forward_path() == "binned"
    assert torch.equal(WarpCompactOps.forward(meta, x, w, bias), BN.run_binned(meta, x, w, bias))
    monkeypatch.setenv("FOVI_KNN_FWD_PATH", "compact")
    _assert_forward(WarpCompactOps.forward(meta, x, w, bias), meta, x, w, bias)
    monkeypatch.setenv("FOVI_KNN_FWD_PATH", "sideways")
    with pytest.raises(ValueError, match="FOVI_KNN_FWD_PATH"):
        forward_path()


def test_the_binned_path_checks_its_arguments_at_the_door(monkeypatch):
    from fovi_lab.knn_warp import WarpCompactOps
    meta, x, w, bias = _problem("ODD", 2)
    monkeypatch.setenv("FOVI_KNN_FWD_PATH", "binned")
    with pytest.raises(ValueError, match="weight"):
        WarpCompactOps.forward(meta, x, w[:, :-1], bias)
    with pytest.raises(ValueError, match="x"):
        WarpCompactOps.forward(meta, x[:, :1], w, bias)
