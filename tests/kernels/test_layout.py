"""The layout copies (fovi_lab.kernels.layout) on Warp's CPU device: every element where PyTorch's permute puts it,
exact zeros in the padding, any strides, the 4-byte and the element-by-element paths, and clear errors."""
import pytest
import torch

from fovi_lab.kernels import layout as L

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _want(src, out_shape):
    a, r, c = src.shape
    want = torch.zeros(out_shape, dtype=src.dtype)
    want[:c, :r, :a] = src.permute(2, 1, 0)
    return want


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, pad", [
    ((70, 1, 130), (0, 0, 0)),       # a 2-D transpose, ragged tiles on both axes
    ((64, 3, 64), (1, 2, 5)),        # exact tiles, padded on every axis
    ((49, 2, 200), (0, 0, 3)),       # one ragged a tile
    ((100, 4, 50), (8, 0, 0)),
])
def test_swap_axes_into_matches_the_permute_and_zeroes_the_pads(dtype, shape, pad):
    g = torch.Generator().manual_seed(sum(shape))
    src = torch.randn(*shape, generator=g).to(dtype)
    a, r, c = shape
    out_shape = (c + pad[0], r + pad[1], a + pad[2])
    out = torch.full(out_shape, float("nan"), dtype=dtype)
    assert L.swap_axes_into(src, out) is out
    assert torch.equal(out, _want(src, out_shape))


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_and_misaligned_operands_take_the_element_path_and_stay_exact(dtype):
    g = torch.Generator().manual_seed(3)
    base = torch.randn(60, 3, 181, generator=g).to(dtype)
    for src in (base[:, :, ::2],            # stride 2 along c
                base[:, 1:, 1:],            # rows start one element in: not 4-byte aligned for 16-bit data
                base.permute(2, 1, 0)[:50].permute(2, 1, 0)):   # a transposed view
        out = torch.full((src.shape[2] + 3, src.shape[1], src.shape[0] + 1), float("nan"), dtype=dtype)
        L.swap_axes_into(src, out)
        assert torch.equal(out, _want(src, out.shape))
    # a strided destination: dx [B, Cin, Nin] written through its [Cin, B, Nin] view
    src = torch.randn(60, 5, 64, generator=g).to(dtype)              # [Nin, B, Cin]
    dx = torch.full((5, 64, 60), float("nan"), dtype=dtype)
    L.swap_axes_into(src, dx.permute(1, 0, 2))
    assert torch.equal(dx, src.permute(1, 2, 0))


def test_bits_are_copied_as_they_are():
    # inf, -0.0 and NaN payloads survive: the kernel moves 16- or 32-bit words, it does not convert
    src = torch.tensor([float("inf"), -0.0, float("nan"), 1.5, -2.0] * 50, dtype=torch.float16).view(50, 1, 5)
    src = src.repeat(1, 1, 13)                                       # [50, 1, 65]
    out = L.swap_axes(src)
    assert torch.equal(out.view(torch.int16), src.permute(2, 1, 0).contiguous().view(torch.int16))


@pytest.mark.parametrize("dtype", DTYPES)
def test_transpose_helpers(dtype):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(50, 300, generator=g).to(dtype)
    assert torch.equal(L.transpose(x), x.t())
    xt = torch.full((301, 56), float("nan"), dtype=dtype)            # a pad row and batch columns
    L.transpose_into(x, xt)
    assert torch.equal(xt[:300, :50], x.t())
    assert not xt[300].any() and not xt[:, 50:].any()


def test_small_extents_use_pytorchs_copy_with_the_same_result(monkeypatch):
    launched = []
    real = L._launch
    monkeypatch.setattr(L, "_launch", lambda *a: (launched.append(a[0].shape), real(*a)))
    src = torch.randn(600, 7, 2).half()                              # 2 along c: below the tile's worth
    out = torch.full((3, 7, 601), float("nan"), dtype=torch.float16)
    L.swap_axes_into(src, out)
    assert torch.equal(out, _want(src, out.shape)) and not launched
    L.swap_axes_into(torch.randn(20, 2, 40).half(), torch.empty(40, 2, 20).half())   # 20 along a: still PyTorch
    L.swap_axes_into(torch.randn(36, 2, 40).half(), torch.empty(40, 2, 36).half())   # from 32 on both: the kernel
    assert launched == [(36, 2, 40)]


def test_the_device_check_passes_on_the_cpu():
    assert L.layout_ok(torch.device("cpu"), 2) and L.layout_ok(torch.device("cpu"), 4)
    assert L.tile_width(2) == 64 and L.tile_width(4) == 32
    with pytest.raises(ValueError, match="element size 8"):
        L.tile_width(8)


def test_bad_arguments_are_named():
    src = torch.zeros(20, 2, 30, dtype=torch.float16)
    with pytest.raises(ValueError, match="smaller than src"):
        L.swap_axes_into(src, torch.empty(29, 2, 20, dtype=torch.float16))
    with pytest.raises(ValueError, match="float32"):
        L.swap_axes_into(src, torch.empty(30, 2, 20))
    with pytest.raises(ValueError, match="3-D"):
        L.swap_axes_into(src[0], torch.empty(30, 20, dtype=torch.float16))
    with pytest.raises(ValueError, match="2-D"):
        L.transpose_into(src, torch.empty(30, 2, 20, dtype=torch.float16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpu_swap_axes_matches_the_permute_on_both_paths(dtype):
    g = torch.Generator().manual_seed(11)
    assert L.layout_ok(torch.device("cuda"), torch.empty((), dtype=dtype).element_size())
    base = torch.randn(130, 6, 260, generator=g).to(dtype).cuda()
    for src in (base, base[:129, 1:5, :258], base[:, :, 1:], base[:, :, ::2], base.permute(2, 1, 0)[:70].permute(2, 1, 0)):
        a, r, c = src.shape
        for pad in ((0, 0, 0), (1, 2, 5), (64, 0, 63)):
            out = torch.full((c + pad[0], r + pad[1], a + pad[2]), float("nan"), dtype=dtype, device="cuda")
            L.swap_axes_into(src, out)
            assert torch.equal(out.cpu(), _want(src.cpu(), out.shape)), (tuple(src.shape), src.stride(), pad)
    x = torch.randn(512, 3000, generator=g).to(dtype).cuda()
    assert torch.equal(L.transpose(x), x.t())
