"""The tensor-core (``mma.sync``) forward kernels of :mod:`fovi_lab.kernels.forward.mma`.

On the CPU (CI) the kernels run their native snippet's C++ branch: each lane computes its own accumulator
elements with the same channel permutation, batch tiles, pad select, loop bounds, split and stores as the
GPU branch. That checks everything but the PTX fragment packing; :func:`test_gpu_every_mma_config_on_real_layers`
checks the packing on a GPU (skipped without one) and ``tests/kernels/forward/test_warp_aot.py`` compiles the PTX for
sm_80/89/90. Every registered mma config also runs the every-config oracle parity of ``test_warp_forward``.
"""

from __future__ import annotations

import math

import pytest
import torch

from fovi_lab.kernels import forward as F
from fovi_lab.kernels.forward import plans as fwd_plans
from fovi_lab.graph.meta import build_meta
from fovi_lab.ops.reference import oracle_forward
from fovi_lab.kernels.forward.mma import mma_channel

from test_warp_forward import STEM, case, _run_prefilled

_MMA = [n for n in F.uncached_config_names() if F.config_spec(n).variant in F.MMA_VARIANTS]
_MMA_ALL = [n for n in F.uncached_config_names(experimental=True) if F.config_spec(n).variant in F.MMA_VARIANTS]


def test_channel_permutation_is_a_bijection_and_makes_lane_loads_contiguous():
    """Tile row ``g + 8h`` of m-tile ``mi`` -> channel ``o0 + 2*MT*g + 2*mi + h``: every channel of the warp's
    block exactly once, and for one lane (fixed g) its 2*MT channels are consecutive (one vector load)."""
    for mt in (1, 2, 3, 4, 6, 8):
        chans = [mma_channel(mt, 32, g, mi, h) for g in range(8) for mi in range(mt) for h in range(2)]
        assert sorted(chans) == list(range(32, 32 + 16 * mt)), mt
        for g in range(8):
            lane = sorted(mma_channel(mt, 0, g, mi, h) for mi in range(mt) for h in range(2))
            assert lane == list(range(2 * mt * g, 2 * mt * (g + 1))), (mt, g)


@pytest.mark.parametrize("b", (1, 17, 64))
@pytest.mark.parametrize("config", _MMA)
def test_mma_configs_on_a_stem(config, b):
    """Every registered mma block on the stem-like shape: Cout = 24 inside one 32..96-channel block (the tail
    channels never stored), batch tails against 8/16/32-row blocks, NaN-prefilled output."""
    c = case(STEM, b)
    c.check(_run_prefilled(c, config), f"{config} on STEM B={b}")


def test_mma_experimental_blocks_run():
    """The sweep-only blocks (128 channels, 32 rows x 96, other block_dims, splits of 96/128 channels, loops of
    2 and 4 k-steps, staged stores). Of the k32/k64 and other-block_dim blocks, one per (family, depth, nodes per
    staged block) that no registered config covers: on the CPU they all run the same scalar loop, the depth only
    sets the loop bounds and the block_dim the launch (the GPU test runs every block)."""
    c = case("ODD", 17)
    kind = lambda cfg: (cfg.variant, cfg.tile_k, cfg.block_dim // 32 if F.mma_staged(cfg.variant) else 0)  # noqa: E731
    covered = {kind(F.config_spec(n)) for n in _MMA}
    for config in _MMA_ALL:
        cfg = F.config_spec(config)
        if config in _MMA or (cfg.tile_k > 16 or cfg.block_dim != 128) and kind(cfg) in covered:
            continue
        covered.add(kind(cfg))
        c.check(_run_prefilled(c, config), config)


def test_mma_pad_entries_read_an_exact_zero():
    """The pad column is selected as +0, never loaded: inf in the last x row (where a clamped pad index would
    point) must not reach any output."""
    g = torch.Generator().manual_seed(3)
    cin, nin, nout, k, v = 3, 30, 11, 7, 12
    idx = torch.randint(0, nin - 1, (nout, k), generator=g)
    idx[:, -2:] = nin
    rf = torch.randint(0, v, (nout, k), generator=g)
    meta = build_meta(idx, rf, cin=cin, cout=10, v=v, nin=nin)
    x = torch.randn(6, cin, nin, generator=g).half()
    w = torch.randn(10, cin * v, generator=g).half()
    ref = oracle_forward(x, w, None, idx, rf, v)
    x[:, cin - 1, nin - 1] = float("inf")
    for config in ("mma_o32b8", "mmas_o32b16", "mma_o64b16"):
        y = F.run_uncached(x, w, None, meta.input_linear, meta.weight_linear, config=config)
        assert bool(torch.isfinite(y).all()), config
        assert float((y.float() - ref).abs().max()) < 2e-2, config


def test_mma_all_pad_table_gives_exactly_the_bias():
    nin, cin = 30, 3
    idx = torch.full((4, 5), nin)
    rf = torch.zeros(4, 5, dtype=torch.long)
    meta = build_meta(idx, rf, cin=cin, cout=13, v=6, nin=nin)
    x = torch.randn(3, cin, nin).half()
    w = torch.randn(13, cin * 6).half()
    bias = torch.randn(13).half()
    for config in ("mma_o32b8", "mmas_o64b16"):
        y = F.run_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=config)
        assert torch.equal(y, bias.view(1, -1, 1).expand(3, 13, 4)), config


def test_mmas_split_covers_the_loop():
    for warps in (1, 16, 256, 2048, 10 ** 5):
        for steps in (1, 3, 4, 19, 144):
            s, per = F.mmas_split(warps, steps)
            assert s >= 1 and per >= 1 and (s - 1) * per < steps <= s * per, (warps, steps, s, per)
            assert s == 1 or per >= fwd_plans._MMAS_MIN_STEPS
    assert F.mmas_split(64, 144) == (29, 5)          # res18 layer3 at B = 16, 64-channel blocks: 32 -> 29 whole chunks
    assert F.mmas_split(10 ** 5, 144) == (1, 144)
    assert F.mmas_split(64, 0) == (1, 0)


@pytest.mark.parametrize("shape", ("MAIN", "PAD_HEAVY"))
def test_mmas_is_deterministic_and_splits(shape):
    """A real split (S > 1), a bitwise-identical output on every call, and a strided x read right."""
    c = case(shape, 6)
    il, wl = c.meta.input_linear, c.meta.weight_linear
    plan = F.prepare_uncached(c.x, c.w, c.bias, il, wl, config="mmas_o32b8")
    assert plan.split > 1
    y0 = F.run_uncached(c.x, c.w, c.bias, il, wl, config="mmas_o32b8")
    c.check(y0, f"mmas_o32b8 on {shape}")
    for _ in range(2):
        assert torch.equal(F.run_uncached(c.x, c.w, c.bias, il, wl, config="mmas_o32b8"), y0)
    xs = c.x.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    assert not xs.is_contiguous()
    c.check(F.run_uncached(xs, c.w, c.bias, il, wl, config="mma_o32b16"), "mma_o32b16, strided x")


def test_mma_follows_an_in_place_weight_update():
    """W^T is cached between calls while the weight is unchanged; an in-place update is seen."""
    c = case(STEM, 9)
    il, wl = c.meta.input_linear, c.meta.weight_linear
    w = c.w.clone()
    y0 = F.run_uncached(c.x, w, c.bias, il, wl, config="mma_o32b16")
    w.mul_(2)
    y1 = F.run_uncached(c.x, w, c.bias, il, wl, config="mma_o32b16")
    b = c.bias.float().view(1, -1, 1)
    assert torch.allclose(y1.float() - b, 2 * (y0.float() - b), atol=2e-2, rtol=1e-2)


@pytest.mark.parametrize("config", ("mma_o32b8", "mma_o64b16", "mmas_o64b16", "mma_o32b8k64"))
def test_mma_dense_ceilings_compute_the_dense_gemm(config):
    """The ceiling (same register blocks, dense operands, no index loads): every node's output is
    ``at^T @ w`` with real channel order (the permutation is undone by the stores)."""
    plan = F.make_dense_ceiling(config, 9, 20, 3, 40, "cpu")
    plan.out.fill_(float("nan"))
    plan.launch()
    y = plan.finish()                                              # [B, Cout, Nout]
    xd, w = plan._keep[0].float(), plan._keep[1].float()          # [Bx, Kd], [Kd, Cout_p]
    ref = (xd @ w)[:9, :20]
    for n in range(3):
        assert torch.allclose(y[:, :, n].float(), ref, atol=2e-2, rtol=1e-2), (config, n)


def _cuda() -> bool:
    try:
        from fovi_lab.kernels.common import init_warp, wp
        init_warp()
        return torch.cuda.is_available() and wp.is_cuda_available()
    except Exception:
        return False


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (the PTX fragment packing runs only there)")
@pytest.mark.parametrize("layer", ("alex_L0", "res18_stem", "res18_layer1", "res18_layer3", "res18_layer4_0",
                                   "dinov3_patch"))
def test_gpu_every_mma_config_on_real_layers(layer):
    """On a GPU: every mma config (experimental ones too) on a real layer, B = 1, 17 and 64, NaN-prefilled,
    within 3x the fp16 torch reference's error + 2e-3 of the fp32 oracle; the split ones bitwise repeatable."""
    from fovi_lab.graph.layers import layer_meta
    meta = layer_meta(layer, "rf2", device="cuda")
    g = torch.Generator().manual_seed(11)
    for b in (1, 17, 64):
        x = torch.randn(b, meta.cin, meta.nin, generator=g).half().cuda()
        w = (torch.randn(meta.cout, meta.q, generator=g) / math.sqrt(meta.p)).half().cuda()
        bias = torch.randn(meta.cout, generator=g).half().cuda()
        ref = oracle_forward(x, w, bias, meta.idx, meta.rf_index, meta.v)
        ref16 = oracle_forward(x, w, bias, meta.idx, meta.rf_index, meta.v, dtype=torch.float16)
        tol = 3 * float((ref16.float() - ref).abs().max()) + 2e-3
        for config in _MMA_ALL:
            plan = F.prepare_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=config)
            plan.out.fill_(float("nan"))
            plan.launch()
            y = plan.finish()
            assert bool(torch.isfinite(y).all()), f"{config} {layer} B={b}: unwritten outputs"
            err = float((y.float() - ref).abs().max())
            assert err <= tol, f"{config} {layer} B={b}: max abs error {err:.3g} > {tol:.3g}"
            if F.config_spec(config).variant == "mmas":
                y2 = F.run_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=config)
                assert torch.equal(y, y2), f"{config} {layer} B={b}: not bitwise repeatable"


@pytest.mark.parametrize("config", ("mmaw_o64b16", "mmasw_o32b16", "mmat_o64b32", "mmat_o96b16", "mmat_o64b16k64"))
def test_mma_layout_dense_ceilings_compute_the_dense_gemm(config):
    """The x^T and W-in-place families' ceilings run their own operand layouts (x^T [Kd, Bx], W [Cout_p, Kd])
    over dense operands; a split family shares its unsplit ceiling."""
    cfg = F.config_spec(config)
    plan = F.make_dense_ceiling(config, 9, 20, 3, 40, "cpu")
    plan.out.fill_(float("nan"))
    plan.launch()
    y = plan.finish()
    xd, w = plan._keep[0].float(), plan._keep[1].float()
    _, w_native, x_t = F.mma_flags(cfg.variant)
    a = xd.t() if x_t else xd                                     # [Bx, Kd]
    wk = w.t() if w_native else w                                 # [Kd, Cout_p]
    ref = (a @ wk)[:9, :20]
    for n in range(3):
        assert torch.allclose(y[:, :, n].float(), ref, atol=2e-2, rtol=1e-2), (config, n)
    kind = F.dense_kind(cfg)
    assert kind[0] == cfg.variant.replace("mmas", "mma")
    assert F.dense_kind(F.config_spec("mmas_o64b16")) == F.dense_kind(F.config_spec("mma_o64b16"))
    assert F.dense_kind(F.config_spec("mmat_o64b16")) != F.dense_kind(F.config_spec("mma_o64b16"))
    # the staged store shares its loop's ceiling (the dense kernel writes [Nout, B, Cout], no store to stage)
    assert F.dense_kind(F.config_spec("mmato_o64b32")) == F.dense_kind(F.config_spec("mmat_o64b32"))
    assert F.dense_kind(F.config_spec("mmao_o96b16")) == F.dense_kind(F.config_spec("mma_o96b16"))


# ---- bf16: the same kernels with bf16 operands (mma.sync ... .bf16.bf16 on a GPU; the C++ branch here)

_BF16_CONFIGS = ("mma_o32b8", "mma_o64b16", "mma_o96b16k32", "mmas_o32b8", "mmasw_o32b8", "mmat_o64b32",
                 "mmat_o64b16k64b32", "mmao_o96b16", "mmato_o64b16k64", "mmaw_o64b16", None)


def _bf16_case(shape, b, seed=5):
    from fovi_lab.graph.layers import synthetic_meta
    meta = synthetic_meta(shape)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, meta.cin, meta.nin, generator=gen).bfloat16()
    w = (torch.randn(meta.cout, meta.q, generator=gen) / math.sqrt(meta.cin * meta.k)).bfloat16()
    bias = torch.randn(meta.cout, generator=gen)
    return meta, x, w, bias


@pytest.mark.parametrize("config", _BF16_CONFIGS, ids=lambda c: c or "rule")
@pytest.mark.parametrize("shape, b", (("MAIN", 17), ("ODD", 1), ("PAD_HEAVY", 9)))
def test_bf16_mma_kernels_match_the_oracle(config, shape, b):
    """Every entry of the NaN-prefilled bf16 output is written and within one bf16 rounding (2^-8 relative)
    of the fp32 oracle on the same bf16 inputs; the rule (config None) picks an mma config for bf16."""
    meta, x, w, bias = _bf16_case(shape, b)
    plan = F.prepare_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=config)
    assert F.config_spec(plan.config).variant in F.MMA_VARIANTS
    plan.out.fill_(float("nan"))
    plan.launch()
    y = plan.finish()
    assert y.dtype == torch.bfloat16 and y.shape == (b, meta.cout, meta.nout)
    ref = oracle_forward(x.float(), w.float(), bias, meta.idx, meta.rf_index, meta.v)
    assert torch.isfinite(y.float()).all(), "an output entry the kernel did not write"
    err = (y.float() - ref).abs()
    assert (err <= 2 ** -8 * ref.abs() + 1e-3).all(), float(err.max())


def test_bf16_is_refused_where_no_bf16_kernel_exists():
    meta, x, w, bias = _bf16_case("ODD", 3)
    with pytest.raises(ValueError, match="config: 'm16n32' has no bf16 kernel"):
        F.run_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config="m16n32")
    with pytest.raises(TypeError, match="weight: expected dtype torch.bfloat16"):
        F.run_uncached(x, w.half(), bias, meta.input_linear, meta.weight_linear)
    with pytest.raises(TypeError, match="x: expected dtype torch.float16 or torch.bfloat16, got torch.float32"):
        F.run_uncached(x.float(), w.float(), bias, meta.input_linear, meta.weight_linear)
    with pytest.raises(TypeError, match="x: expected dtype torch.float16, got torch.bfloat16"):
        F.run_cached(x, torch.zeros(meta.nout, meta.p64, 64, dtype=torch.float16), None, meta.input_linear)


def test_the_bf16_and_fp16_kernels_of_a_config_are_validated_apart():
    from fovi_lab.kernels.forward.build import get_uncached_config
    a, b = get_uncached_config("mma_o32b8", "cpu"), get_uncached_config("mma_o32b8", "cpu", bf16=True)
    assert a is not None and b is not None and a.kernel is not b.kernel
    assert (a.kernel.fovi_dtype, b.kernel.fovi_dtype) == ("float16", "bfloat16")
