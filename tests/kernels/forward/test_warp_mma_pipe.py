"""The pipelined tensor-core forward (``mmap``, :mod:`fovi_lab.kernels.forward.mma_pipe`).

On the CPU (CI) each thread runs the snippet's C++ branch: its own accumulator elements with the same warp grid,
lane mapping, pad select, loop bounds and guarded stores as the GPU branch. That checks everything but the
cp.async / ldmatrix / mma.sync packing, which :func:`test_gpu_every_mmap_config_on_real_layers` checks on a GPU
(skipped without one); ``tests/kernels/forward/test_warp_aot.py`` compiles the PTX for sm_80/89/90.
"""

from __future__ import annotations

import math

import pytest
import torch

from fovi_lab.kernels import forward as F
from fovi_lab.kernels.forward.mma_pipe import PIPE_SMEM_LIMIT, pipe_layout
from fovi_lab.graph.meta import build_meta
from fovi_lab.ops.reference import oracle_forward

from test_warp_forward import case, _run_prefilled
from test_warp_mma import _cuda

_PIPE = [n for n in F.uncached_config_names(experimental=True) if F.config_spec(n).variant in F.PIPE_VARIANTS]


def test_there_are_pipelined_configs_of_both_block_sizes():
    assert {F.config_spec(n).block_dim for n in _PIPE} == {128, 256}


@pytest.mark.parametrize("shape, b", (("ODD", 17), ("MAIN", 6), ("PAD_HEAVY", 130)))
@pytest.mark.parametrize("config", _PIPE)
def test_mmap_configs_match_the_oracle(config, shape, b):
    """Batch tails against 64/128/256-row blocks (B = 130: a whole block and a 2-row one), Cout inside one
    64..256-channel block (the tail channels never stored), heavy padding, NaN-prefilled output."""
    c = case(shape, b)
    c.check(_run_prefilled(c, config), f"{config} on {shape} B={b}")


def test_mmap_pad_rows_read_an_exact_zero_and_all_pad_gives_the_bias():
    """A pad index selects +0 without reading x (an inf where a clamped pad index would point stays out), and a
    node whose every entry is a pad gets exactly its bias."""
    g = torch.Generator().manual_seed(3)
    cin, nin, nout, k, v = 3, 30, 11, 7, 12
    idx = torch.randint(0, nin - 1, (nout, k), generator=g)
    idx[:, -2:] = nin
    idx[4] = nin                                     # node 4: pads only
    rf = torch.randint(0, v, (nout, k), generator=g)
    meta = build_meta(idx, rf, cin=cin, cout=10, v=v, nin=nin)
    x = torch.randn(6, cin, nin, generator=g).half()
    w = torch.randn(10, cin * v, generator=g).half()
    bias = torch.randn(10, generator=g).half()
    ref = oracle_forward(x, w, bias, idx, rf, v)
    x[:, cin - 1, nin - 1] = float("inf")
    for config in ("mmap_o64b64k32s4", "mmap_o128b256k16s3b256"):
        y = F.run_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=config)
        assert bool(torch.isfinite(y).all()), config
        assert float((y.float() - ref).abs().max()) < 2e-2, config
        assert torch.equal(y[:, :, 4], bias.view(1, -1).expand(6, 10)), config


def test_mmap_dense_ceiling_computes_the_dense_gemm():
    """The ceiling (the same pipeline over dense operands, p entry k = row k of both): every node's output is
    ``xd^T @ wd``."""
    plan = F.make_dense_ceiling("mmap_o64b64k32s4", 9, 20, 3, 40, "cpu")
    plan.out.fill_(float("nan"))
    plan.launch()
    y = plan.finish()                                              # [B, Cout, Nout]
    xd, w = plan._keep[0].float(), plan._keep[1].float()          # [Kd, Bx], [Kd, Cout_p]
    ref = (xd.t() @ w)[:9, :20]
    for n in range(3):
        assert torch.allclose(y[:, :, n].float(), ref, atol=2e-2, rtol=1e-2), n


def test_pipe_layout_names_what_cannot_be_built():
    assert pipe_layout(128, 128, 16, 4, 128) == (2, 2, 4, 8)
    assert pipe_layout(128, 256, 16, 3, 256) == (2, 4, 4, 8)
    with pytest.raises(ValueError, match="shared memory"):
        pipe_layout(128, 128, 32, 3, 128)                         # 48 KiB of stages + Warp's own 512 bytes
    assert 3 * 32 * 256 * 2 > PIPE_SMEM_LIMIT
    with pytest.raises(ValueError, match="block_dim=96"):
        pipe_layout(64, 64, 32, 4, 96)
    with pytest.raises(ValueError, match="multiples of 64"):
        pipe_layout(96, 64, 32, 4, 128)
    with pytest.raises(ValueError, match="tile_k=8"):
        pipe_layout(64, 64, 8, 4, 128)
    with pytest.raises(ValueError, match="divide"):
        pipe_layout(64, 64, 16, 4, 256)                           # 128 copies of each operand for 256 threads


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (cp.async, ldmatrix and mma.sync run only there)")
@pytest.mark.parametrize("layer", ("alex_L1", "alex_L3", "res18_layer1", "res18_layer3", "res18_layer4_0"))
def test_gpu_every_mmap_config_on_real_layers(layer):
    """On a GPU: every mmap config on a real layer at B = 1, 130 and 512, NaN-prefilled, within 3x the fp16
    torch reference's error + 2e-3 of the fp32 oracle, and bitwise repeatable."""
    from fovi_lab.graph.layers import layer_meta
    meta = layer_meta(layer, "rf2", device="cuda")
    g = torch.Generator().manual_seed(11)
    for b in (1, 130, 512):
        x = torch.randn(b, meta.cin, meta.nin, generator=g).half().cuda()
        w = (torch.randn(meta.cout, meta.q, generator=g) / math.sqrt(meta.p)).half().cuda()
        bias = torch.randn(meta.cout, generator=g).half().cuda()
        ref = oracle_forward(x, w, bias, meta.idx, meta.rf_index, meta.v)
        ref16 = oracle_forward(x, w, bias, meta.idx, meta.rf_index, meta.v, dtype=torch.float16)
        tol = 3 * float((ref16.float() - ref).abs().max()) + 2e-3
        for config in _PIPE:
            plan = F.prepare_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=config)
            plan.out.fill_(float("nan"))
            plan.launch()
            y = plan.finish()
            assert bool(torch.isfinite(y).all()), f"{config} {layer} B={b}: unwritten outputs"
            err = float((y.float() - ref).abs().max())
            assert err <= tol, f"{config} {layer} B={b}: max abs error {err:.3g} > {tol:.3g}"
            y2 = F.run_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=config)
            assert torch.equal(y, y2), f"{config} {layer} B={b}: not bitwise repeatable"


def _pipe_module(arch: int, block_dim: int):
    """The pipelined kernels of one block size in one module (every config for sm_90, the first for sm_80 / 89).

    Their own module, not the shared one of ``tests/kernels/forward/test_warp_aot.py``: ptxas counts every static
    ``__shared__`` array of a module's native functions against each of its kernels (the staged mma stores' tiles
    would push the stages past 48 KiB), which one module per kernel, as the package builds them, does not."""
    from fovi_lab.kernels import common as wc
    from fovi_lab.kernels.common import init_warp, wp
    from fovi_lab.kernels.forward.mma_pipe import make_mma_pipe_kernel
    init_warp()
    names = [n for n in _PIPE if F.config_spec(n).block_dim == block_dim]
    mod = f"fovi_fwd_aot_pipe_sm{arch}_b{block_dim}"
    wc.SHARED_KERNEL_MODULE = mod
    try:
        for n in names if arch == 90 else names[:1]:
            c = F.config_spec(n)
            split = c.variant == "mmaps"
            make_mma_pipe_kernel(c.tile_n, c.tile_m, c.tile_k, c.r, c.block_dim, split=split)
            if not split:
                make_mma_pipe_kernel(c.tile_n, c.tile_m, c.tile_k, c.r, c.block_dim, dense=True)
    finally:
        wc.SHARED_KERNEL_MODULE = None
    m = wp.get_module(mod)
    m.options.update({"block_dim": block_dim, "enable_backward": False, "fast_math": True, "optimization_level": 1})
    return m


@pytest.mark.parametrize("arch", (80, 89, 90))
def test_mmap_kernels_compile_aot(tmp_path, arch):
    """The cp.async / ldmatrix / mma.sync PTX compiles for sm_80/89/90 with Warp's bundled NVRTC (no GPU), and
    every stage layout fits a CTA's static shared memory there."""
    import os
    from fovi_lab.kernels.common import wp
    for bd in (128, 256):
        paths = wp.compile_aot_module(_pipe_module(arch, bd), arch=arch, module_dir=str(tmp_path / f"b{bd}"))
        assert paths and all(os.path.getsize(p) > 0 for p in paths), (arch, bd)


def test_pipe_split_covers_the_loop():
    for ctas in (1, 16, 264, 10 ** 4):
        for steps in (1, 7, 8, 19, 144):
            s, per = F.pipe_split(ctas, steps)
            assert s >= 1 and per >= 1 and (s - 1) * per < steps <= s * per, (ctas, steps, s, per)
    assert F.pipe_split(32, 144) == (9, 16)          # res18 layer4_0 at B = 512 in 128 x 128 blocks: 9 x 32 CTAs
    assert F.pipe_split(10 ** 4, 144) == (1, 144)


def test_mmaps_splits_the_loop_and_is_deterministic():
    """A real split (S > 1) of a long p range: the fixed-order sum matches the oracle and is bitwise the same on
    every call."""
    g = torch.Generator().manual_seed(5)
    cin, nin, nout, k, v = 16, 50, 3, 40, 9
    idx = torch.randint(0, nin + 1, (nout, k), generator=g)
    rf = torch.randint(0, v, (nout, k), generator=g)
    meta = build_meta(idx, rf, cin=cin, cout=20, v=v, nin=nin)
    x = torch.randn(5, cin, nin, generator=g).half()
    w = (0.1 * torch.randn(20, cin * v, generator=g)).half()
    bias = torch.randn(20, generator=g).half()
    ref = oracle_forward(x, w, bias, idx, rf, v)
    il, wl = meta.input_linear, meta.weight_linear
    plan = F.prepare_uncached(x, w, bias, il, wl, config="mmaps_o64b64k32s4")
    assert plan.split > 1
    y0 = F.run_uncached(x, w, bias, il, wl, config="mmaps_o64b64k32s4")
    assert float((y0.float() - ref).abs().max()) < 2e-2
    assert torch.equal(F.run_uncached(x, w, bias, il, wl, config="mmaps_o64b64k32s4"), y0)


def test_a_pipelined_pick_that_cannot_launch_falls_back_to_the_register_kernels(monkeypatch):
    """Where the rule picks a pipelined config but it fails its canary on the device, the call runs the register
    mma rule's pick (and the tile / SIMT rule's only if that fails too)."""
    from fovi_lab.kernels.forward import api as fwd_api
    g = torch.Generator().manual_seed(2)
    cin, nin, nout, k, v = 64, 50, 16, 40, 9
    idx = torch.randint(0, nin + 1, (nout, k), generator=g)
    rf = torch.randint(0, v, (nout, k), generator=g)
    meta = build_meta(idx, rf, cin=cin, cout=256, v=v, nin=nin)
    x = torch.randn(64, cin, nin, generator=g).half()
    w = (0.05 * torch.randn(256, cin * v, generator=g)).half()
    il, wl = meta.input_linear, meta.weight_linear
    assert F.select_config(64, 256, nout, meta.p64, in_channels=cin, q=cin * v) == "mmaps_o128b64k32s3"
    real = F.get_uncached_config
    monkeypatch.setattr(fwd_api, "get_uncached_config",
                        lambda name, dev=None: (None if F.config_spec(name).variant in F.PIPE_VARIANTS
                                                else real(name, dev)))
    fwd_api._CALLS.clear()
    try:
        plan = F.prepare_uncached(x, w, None, il, wl)
        assert F.config_spec(plan.config).variant in F.MMA_VARIANTS
    finally:
        fwd_api._CALLS.clear()


def test_mmaps_gives_the_tensor_core_adjoints_in_fp32_bitwise():
    """The split pipeline's fp32 output (the fixed-order sum, never rounded) is what the tensor-core adjoints
    need: dx on the transposed layer, dW on the tap layer, against the fp32 reference, repeatable bit for bit."""
    from fovi_lab.kernels.adjoint.as_forward import grad_input_mma, grad_weight_mma
    from fovi_lab.ops.reference import CompactTorchOps
    g = torch.Generator().manual_seed(1)
    cin, nin, nout, k, v, cout, b = 8, 40, 12, 9, 7, 20, 5
    idx = torch.randint(0, nin + 1, (nout, k), generator=g)
    rf = torch.randint(0, v, (nout, k), generator=g)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    x = torch.randn(b, cin, nin, generator=g).half()
    w = torch.randn(cout, cin * v, generator=g).half()
    gy = torch.randn(b, cout, nout, generator=g).half()
    dx_ref = CompactTorchOps.grad_input(meta, gy.float(), w.float())
    dw_ref = CompactTorchOps.grad_weight(meta, gy.float(), x.float())
    dx = grad_input_mma(meta, gy, w, "mmaps_o128b64k32s3")
    dw = grad_weight_mma(meta, gy, x, "mmaps_o128b64k32s3")
    assert dx.dtype == dw.dtype == torch.float32
    assert float((dx - dx_ref).abs().max()) < 1e-4 * float(dx_ref.abs().max())
    assert float((dw - dw_ref).abs().max()) < 1e-4 * float(dw_ref.abs().max())
    assert torch.equal(dx, grad_input_mma(meta, gy, w, "mmaps_o128b64k32s3"))
    assert torch.equal(dw, grad_weight_mma(meta, gy, x, "mmaps_o128b64k32s3"))
    with pytest.raises(ValueError, match="fp32 output"):
        grad_input_mma(meta, gy, w, "mmap_o128b64k32s3")          # unsplit: no fp32 partials


def test_bf16_runs_the_register_kernels_where_fp16_takes_the_pipeline(monkeypatch):
    """The pipelined kernels have no bf16 form: a bf16 call on a shape where the fp16 rule picks one gets the
    register tensor-core rule's config (what is built is recorded here, nothing is compiled)."""
    from fovi_lab.graph.layers import layer_meta
    from fovi_lab.kernels.forward import api
    meta = layer_meta("alex_L2")
    fp16_pick = F.select_config(64, meta.cout, meta.nout, meta.p64, in_channels=meta.cin, node_major=True, q=meta.q)
    assert F.config_spec(fp16_pick).variant in F.PIPE_VARIANTS
    asked = []
    monkeypatch.setattr(api, "get_uncached_config", lambda name, dev, bf16=False: asked.append((name, bf16)))
    x = torch.zeros(64, meta.cin, meta.nin, dtype=torch.bfloat16)
    w = torch.zeros(meta.cout, meta.q, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="bf16 runs on the tensor-core"):
        api.resolve_uncached(x, w, None, meta.input_linear, meta.weight_linear)
    assert asked == [(F.select_mma(64, meta.cout, meta.nout, meta.p64, meta.q, pipe=False), True)]
    assert F.config_spec(asked[0][0]).variant in F.MMA_VARIANTS
