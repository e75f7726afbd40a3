"""Layout copies through shared memory: the operand transposes every kernel family needs before its GEMM.

The kernels read their operands in the layout their loads want: x^T ``[Cin*Nin, B]`` (batch rows contiguous), W^T
``[Q, Cout]``, node-major ``g [Nout, Cout, B]``. Each is one swap of two axes around a third::

    out[c, r, a] = src[a, r, c]         src [A, R, C] -> out [C', R', A'] (C' >= C, R' >= R, A' >= A; the rest 0)

(a 2-D transpose is R = 1). PyTorch does such a copy with its generic strided kernel: one of the two sides is read
or written a 2-byte element per 32-byte sector, so on the H200 its copies move a small fraction of HBM bandwidth,
and in the six train steps profiled (four layers at B = 512, two at B = 16) its strided copies took a large share of
the GPU time (``tools/gpu/profile_step.py --transpose``; the copies' times, PyTorch's and this kernel's, are in
data/h200/layout_copies.jsonl). With this kernel the copies took less time, and the train step at B = 512,
replayed, was faster on all 13 layers (data/h200/train_step_b512.jsonl.gz against data/h200/train_step.jsonl).

:func:`swap_axes_into` stages a ``W x W`` tile through shared memory instead (``W`` = 64 16-bit or 32 32-bit
elements: 128 bytes along each tile row), so both sides are whole 128-byte lines:

* **load**: warp ``w`` of the CTA's 8 reads tile rows ``a = w, w+8, ...``, each lane 4 contiguous bytes along ``c``
  (one 128-byte line per warp and row) into ``s[a][c]``;
* **store**: the same warps write rows ``c`` of the output, each lane 4 bytes along ``a``, read down a column
  of ``s``. A row of ``s`` is padded by 4 bytes, so a column read touches every bank group (2-way conflicts at
  most for 16-bit elements, none for 32-bit).

Elements past the source's extents are written as exact zeros (the pads the GEMMs contract against), so a padded
layout needs no zero fill of its own. Any strides work; 4-byte vector accesses are used where the two contiguous
axes have unit stride and every row starts 4-byte aligned, element by element otherwise.

On Warp's CPU device the snippet's C++ branch has each thread copy its own elements of the tile directly (the same
tile mapping and zero fill, no shared memory). Before use on a device the kernel is checked once against PyTorch's
copy on odd extents with a NaN-prefilled output (:func:`layout_ok`); where that fails, under CUDA-graph capture
before that check ran, and for a swapped axis under 32 elements (:data:`_MIN_SWAP_EXTENT`), the copy is PyTorch's.
"""

# (no "from __future__ import annotations": Warp needs the stubs' annotations as objects)

from typing import Dict, Tuple

import torch

from fovi_lab.kernels.common import built_once, check_once, fast_launch, warp_ct, wp

__all__ = ["swap_axes_into", "swap_axes", "transpose", "transpose_into", "layout_ok", "layout_snippet", "LAYOUT_BLOCK",
           "tile_width"]

#: Threads per CTA (8 warps), one ``W x W`` tile each.
LAYOUT_BLOCK = 256
#: Below this many elements along either swapped axis the tile is mostly empty and PyTorch's copy is used. Replayed on
#: the H200 (tools/gpu/profile_step.py --transpose, 17 copies of a step's shapes, data/h200/layout_copies.jsonl) the
#: kernel beat PyTorch's copy on all 13 with both axes at 60 or more, and was no clear win on the 4 with one axis at 16
#: (barely ahead on two, well behind on two, x^T at B = 16 among them). No copy between was timed alone; the train
#: steps at B = 64 and 512 that ran faster with the kernel (data/h200/train_step_b512.jsonl.gz,
#: train_step_b64.jsonl.gz) sent the rf2 layers' tap-major W (36 taps) through it.
_MIN_SWAP_EXTENT = 32


def tile_width(element_size: int) -> int:
    """The tile's side ``W`` for elements of ``element_size`` bytes (2 or 4): 128 bytes per tile row."""
    if element_size not in (2, 4):
        raise ValueError(f"layout copy: element size {element_size} bytes, expected 2 or 4")
    return 128 // element_size


def layout_snippet(element_size: int) -> str:
    """The native snippet of the layout kernel for ``element_size``-byte elements (2 or 4): the CUDA branch (the
    tile through shared memory) and the C++ branch Warp's CPU device runs."""
    es = element_size
    w = tile_width(es)
    e = 4 // es                       # elements per 4-byte word
    stype = "unsigned short" if es == 2 else "unsigned int"
    ws = w + e                        # shared row stride: 132 bytes (33 words), so a column read spreads over the banks
    pack = ("(unsigned int)s[(e0) * WS + cl] | ((unsigned int)s[(e0 + 1) * WS + cl] << 16)" if es == 2
            else "s[(e0) * WS + cl]")
    return f"""
    const int W = {w}, E = {e}, WS = {ws};
    const int A = src.shape[0], R = src.shape[1], C = src.shape[2];
    const int Ad = dst.shape[2], Cd = dst.shape[0];
    const size_t sa = (size_t)src.strides[0], sr = (size_t)src.strides[1], sc = (size_t)src.strides[2];
    const size_t tc = (size_t)dst.strides[0], tr = (size_t)dst.strides[1], ta = (size_t)dst.strides[2];
    const char* sb = (const char*)src.data + (size_t)r * sr;
    char* db = (char*)dst.data + (size_t)r * tr;
    const bool in_r = r < R;
#if defined(__CUDA_ARCH__)
    __shared__ __align__(16) {stype} s[W * WS];
    const int lane = threadIdx.x & 31, wy = threadIdx.x >> 5;
    for (int i = 0; i < W / 8; ++i) {{                 // load: rows a of the tile, E elements along c per lane
        const int al = wy + 8 * i, a = a0 + al, cl0 = E * lane, c = c0 + cl0;
        const char* row = sb + (size_t)a * sa;
        if (vec && in_r && a < A && c + E <= C) {{
            *(unsigned int*)(s + al * WS + cl0) = *(const unsigned int*)(row + (size_t)c * {es});
        }} else {{
            for (int k = 0; k < E; ++k)
                s[al * WS + cl0 + k] = (in_r && a < A && c + k < C) ? *(const {stype}*)(row + (size_t)(c + k) * sc)
                                                                   : ({stype})0;
        }}
    }}
    __syncthreads();
    for (int i = 0; i < W / 8; ++i) {{                 // store: rows c of the output, E elements along a per lane
        const int cl = wy + 8 * i, c = c0 + cl, e0 = E * lane, a = a0 + e0;
        if (c >= Cd) continue;
        char* row = db + (size_t)c * tc;
        if (vec && a + E <= Ad) {{
            *(unsigned int*)(row + (size_t)a * {es}) = {pack};
        }} else {{
            for (int k = 0; k < E; ++k)
                if (a + k < Ad) *({stype}*)(row + (size_t)(a + k) * ta) = s[(e0 + k) * WS + cl];
        }}
    }}
    __syncthreads();                                   // the tile is reused by the block's next grid-stride step
#else
    const int lane = tid & 31, wy = (tid >> 5) & 7;
    for (int i = 0; i < W / 8; ++i)                    // this thread's load-phase elements, copied directly
        for (int k = 0; k < E; ++k) {{
            const int a = a0 + wy + 8 * i, c = c0 + E * lane + k;
            if (a >= Ad || c >= Cd) continue;
            const {stype} v = (in_r && a < A && c < C) ? *(const {stype}*)(sb + (size_t)a * sa + (size_t)c * sc)
                                                      : ({stype})0;
            *({stype}*)(db + (size_t)c * tc + (size_t)a * ta) = v;
        }}
#endif
"""


def _make_kernel(es: int):
    et = wp.int16 if es == 2 else wp.int32
    src_code = layout_snippet(es)

    # (Warp recognises a native function by its literal ``@wp.func_native(...)`` decorator)
    @wp.func_native(src_code)
    def swap_tile(src: wp.array3d(dtype=et), dst: wp.array3d(dtype=et), a0: int, r: int, c0: int, tid: int,
                  vec: int): ...

    w = tile_width(es)

    @wp.kernel(enable_backward=False, module="unique", name=f"fovi_swap_axes_{8 * es}")
    def kernel(src: wp.array3d(dtype=et), dst: wp.array3d(dtype=et), vec: int):
        ta, r, tl = wp.tid()                           # grid (a tiles, R', c tiles * LAYOUT_BLOCK)
        swap_tile(src, dst, ta * w, r, (tl // LAYOUT_BLOCK) * w, tl % LAYOUT_BLOCK, vec)
    return kernel


@built_once
def _kernel16():
    return _make_kernel(2)


@built_once
def _kernel32():
    return _make_kernel(4)


def _vec_ok(src: torch.Tensor, out: torch.Tensor, es: int) -> bool:
    """Whether 4-byte accesses are safe: unit stride along both contiguous axes and 4-byte aligned rows."""
    ss, os_ = src.stride(), out.stride()
    if ss[2] != 1 or os_[2] != 1:
        return False
    return es == 4 or not ((src.data_ptr() | out.data_ptr()) & 3 or (ss[0] | ss[1] | os_[0] | os_[1]) & 1)


def _launch(src: torch.Tensor, out: torch.Tensor, es: int, device: str) -> None:
    # (the kernels declare int16 / int32 arrays; warp_ct's descriptors carry only pointer, shape and byte strides,
    # so the fp16 / bf16 / fp32 tensors are passed as they are: the kernel moves their bits)
    w = tile_width(es)
    cd, rd, ad = out.shape
    kernel = _kernel16() if es == 2 else _kernel32()
    fast_launch(kernel, (-(-ad // w), rd, -(-cd // w) * LAYOUT_BLOCK),
                [warp_ct(src), warp_ct(out), int(_vec_ok(src, out, es))], LAYOUT_BLOCK, device, tiled=False)


_OK: Dict[Tuple[str, int], bool] = {}


def _device_str(d: torch.device) -> str:
    """The Warp device string of a torch device (``"cpu"`` or ``"cuda:i"``), without building a tensor."""
    if d.type == "cuda":
        return f"cuda:{d.index if d.index is not None else torch.cuda.current_device()}"
    if d.type == "cpu":
        return "cpu"
    raise ValueError(f"tensor on unsupported device {d}; Warp kernels run on cpu or cuda")


def layout_ok(device: torch.device, element_size: int) -> bool:
    """Whether the layout kernel for ``element_size``-byte elements copies correctly on ``device`` (checked once:
    odd extents, zero-padded extents, NaN-prefilled outputs, both the 4-byte and the element-by-element path, against
    PyTorch's copy). A failure warns once and the copies there use PyTorch's."""
    dev = torch.device(device)
    key = (_device_str(dev), int(element_size))
    dtype = torch.float16 if element_size == 2 else torch.float32

    def check() -> bool:
        base = torch.randn(38, 5, 132, generator=torch.Generator().manual_seed(0)).to(dtype).to(dev)
        ok = True
        # 4-byte accesses (unit strides, aligned rows), then element by element (rows one element off alignment)
        for src in (base[:37, 1:4, :130], base[:37, 1:4, 1:130]):
            a, r, c = src.shape
            out = torch.full((c + 3, r + 1, a + 3), float("nan"), dtype=dtype, device=dev)
            _launch(src, out, element_size, key[0])
            want = torch.zeros_like(out)
            want[:c, :r, :a] = src.permute(2, 1, 0)
            ok = ok and bool(torch.equal(out, want))
        return ok

    return check_once(_OK, key, check, f"the layout kernel for {element_size}-byte elements does not run correctly "
                                       f"on {dev} ({{why}}); layout copies there use PyTorch's")


def swap_axes_into(src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[c, r, a] = src[a, r, c]`` for ``src [A, R, C]`` and ``out [C', R', A']`` with ``C' >= C``, ``R' >= R``,
    ``A' >= A``; every other element of ``out`` is set to zero. Any strides, 2- or 4-byte dtypes (``out`` of
    ``src``'s dtype, on its device); a recorded launch on torch's current stream. Returns ``out``.

    PyTorch's strided copy does it where the kernel is not worth it (an extent below 32 along a swapped axis), on a
    device where the once-per-device check failed, and under CUDA-graph capture before that check ran."""
    if src.dim() != 3 or out.dim() != 3:
        raise ValueError(f"swap_axes_into: expected 3-D src and out, got {tuple(src.shape)} and {tuple(out.shape)}")
    a, r, c = src.shape
    cd, rd, ad = out.shape
    if cd < c or rd < r or ad < a:
        raise ValueError(f"swap_axes_into: out {tuple(out.shape)} is smaller than src {tuple(src.shape)} with its "
                         f"outer axes swapped ({c}, {r}, {a})")
    if out.dtype != src.dtype or out.device != src.device:
        raise ValueError(f"swap_axes_into: out is {out.dtype} on {out.device}, src {src.dtype} on {src.device}")
    if cd == 0 or rd == 0 or ad == 0:
        return out
    es = src.element_size()
    if a >= _MIN_SWAP_EXTENT and c >= _MIN_SWAP_EXTENT and es in (2, 4):
        dev = _device_str(src.device)
        ok = _OK.get((dev, es))
        if ok is None and not (src.is_cuda and torch.cuda.is_current_stream_capturing()):
            ok = layout_ok(src.device, es)
        if ok:
            _launch(src, out, es, dev)
            return out
    if (cd, rd, ad) != (c, r, a):
        out.zero_()
    out[:c, :r, :a].copy_(src.permute(2, 1, 0))
    return out


def swap_axes(src: torch.Tensor, shape=None) -> torch.Tensor:
    """A new ``[C', R', A']`` tensor (default ``[C, R, A]``) filled by :func:`swap_axes_into`."""
    a, r, c = src.shape
    out = torch.empty(tuple(shape) if shape is not None else (c, r, a), dtype=src.dtype, device=src.device)
    return swap_axes_into(src, out)


def transpose(src: torch.Tensor) -> torch.Tensor:
    """``src.t().contiguous()`` for a 2-D ``src``, through :func:`transpose_into`."""
    out = torch.empty(src.shape[1], src.shape[0], dtype=src.dtype, device=src.device)
    return transpose_into(src, out)


def transpose_into(src: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out[j, i] = src[i, j]`` for 2-D ``src [M, N]`` and ``out [N', M']`` (``N' >= N``, ``M' >= M``, the rest
    zero): :func:`swap_axes_into` with R = 1."""
    if src.dim() != 2 or out.dim() != 2:
        raise ValueError(f"transpose_into: expected 2-D src and out, got {tuple(src.shape)} and {tuple(out.shape)}")
    return swap_axes_into(src.unsqueeze(1), out.unsqueeze(1)).squeeze(1)
