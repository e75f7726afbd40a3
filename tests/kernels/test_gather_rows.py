"""The row gather behind the stems' im2col stages (``fovi_lab.kernels.common.gather_rows``): bit-exact copies of every
fp16 pattern (NaN payloads included), offsets into the index table, argument errors, and its CUDA build
for sm_80/89/90 without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fovi_lab.kernels.common import gather_rows, gather_rows_kernel, init_warp, wp


def test_every_fp16_bit_pattern_survives_the_copy():
    src = torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.float16).reshape(-1, 8)
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, src.shape[0], (3 * src.shape[0],), generator=g, dtype=torch.int32)
    out = torch.full((2 * src.shape[0], 8), float("nan"), dtype=torch.float16)
    gather_rows(src, idx, out, idx0=src.shape[0])
    want = src[idx[src.shape[0]:3 * src.shape[0]].long()]
    assert torch.equal(out.view(torch.int16), want.view(torch.int16))


@pytest.mark.parametrize("dtype,cols", [(torch.float16, 24), (torch.float32, 6), (torch.int64, 1)])
def test_rows_of_any_dtype_multiple_of_8_bytes(dtype, cols):
    src = torch.arange(50 * cols).to(dtype).reshape(50, cols)
    idx = torch.tensor([49, 0, 7, 7, 3], dtype=torch.int32)
    out = torch.empty(5, cols, dtype=dtype)
    gather_rows(src, idx, out)
    assert torch.equal(out, src[idx.long()])


def test_bad_arguments_are_named():
    idx = torch.zeros(4, dtype=torch.int32)
    with pytest.raises(ValueError, match="multiple of 8 bytes"):
        gather_rows(torch.zeros(4, 3, dtype=torch.float16), idx, torch.zeros(4, 3, dtype=torch.float16))
    with pytest.raises(ValueError, match="does not match"):
        gather_rows(torch.zeros(4, 8, dtype=torch.float16), idx, torch.zeros(4, 16, dtype=torch.float16))
    with pytest.raises(ValueError, match="does not match"):
        gather_rows(torch.zeros(4, 8, dtype=torch.float16), idx, torch.zeros(4, 8, dtype=torch.float32))
    with pytest.raises(ValueError, match="idx0"):
        gather_rows(torch.zeros(4, 8, dtype=torch.float16), idx, torch.zeros(3, 8, dtype=torch.float16), idx0=2)
    with pytest.raises(ValueError, match="int32"):
        gather_rows(torch.zeros(4, 8, dtype=torch.float16), idx.long(), torch.zeros(4, 8, dtype=torch.float16))


@pytest.mark.parametrize("arch", (80, 89, 90))
def test_gather_kernel_compiles_aot(tmp_path, arch):
    init_warp()
    paths = wp.compile_aot_module(gather_rows_kernel().module, arch=arch, module_dir=str(tmp_path))
    assert paths and all(Path(p).stat().st_size > 0 and f"sm{arch}" in Path(p).name for p in paths), paths
