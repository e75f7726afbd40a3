"""Explicit adjoint kernels of the compact KNN convolution in NVIDIA Warp (spec §3, §3.3).

Warp autodiff is never used (``enable_backward=False`` on every kernel). With ``g = dL/dy``
``[B, Cout, Nout]``, ``A_n[b, p] = xpad[b, input_linear[n, p]]`` and
``W_n[p, o] = W[o, weight_linear[n, p]]`` (spec §2.2)::

    dA_n[b, p]    = sum_o g[b, o, n] * W_n[p, o]                     # staged GEMM, [B, P64] per node
    dx[b, c, m]   = sum over (k, n) reading m of dA_n[b, c*K + k]     # reverse-CSR gather
    dWeff_n[p, o] = sum_b A_n[b, p] * g[b, o, n]                      # staged GEMM, [P64, Cout] per node
    dW[o, q]      = sum over (n, p) with weight_linear[n, p] = q of dWeff_n[p, o]

Both gradients are two-kernel pipelines: a tile-GEMM *stage* kernel writes a bounded staging buffer,
then a scalar *reduction* kernel gathers it through a reverse index. Reductions are gathers in a
fixed order (no atomics), so **dx and dW are bitwise deterministic** run to run, and also
independent of how the work was chunked (chunks are visited in index order and each output
element accumulates its terms in the same sequence).

grad_input (``gi`` stage, ``csr`` reduction ``dx_*``)
    Operands: ``wt = W^T`` ``[Q, Cout_pad]`` and ``g_nob = g.permute(2, 1, 0)``
    ``[Nout, Cout_pad, Bpad]``, both zero-padded (Cout to the o tile, batch to the b tile) and
    contiguous. ``gi2``: one CTA per ``(n, b_tile)``, the P64 loop inside the CTA; per p tile the W
    rows are gathered with ``tile_load_indexed(wt, weight_linear[n, p-tile], axis=0)`` (already the
    ``[tile_p, tile_o]`` left operand: no transpose), the o loop accumulates ``W_n g_n`` in fp32,
    and the ``[tile_p, tile_b]`` result is stored to ``dA_stage[n, p, b]`` ``[Nout, P64, Bchunk]``
    (fp16, or fp32 with ``FOVI_KNN_GRAD_STAGE_FP32=1``). Batch is innermost so that the reduction's
    reads coalesce. The reduction runs one thread per ``(m, c, b)`` (b fastest) over the reverse CSR
    of the meta: ``dx[b, c, m] = sum_i dA_stage[n_i, c*K + k_i, b]`` with ``(k_i, n_i)`` decoded
    from ``rev_col``. Input-pad entries of dA (non-zero, spec §3) never reach dx because the CSR
    never lists them. The batch is chunked so the stage fits ``FOVI_KNN_STAGE_MIB``.

grad_weight (``gw`` stage, ``csr`` reduction ``dw_*`` or torch ``index_add_``)
    Operands: ``xt = xpad^T`` ``[Cin*Nin + 1, Bpad]`` (batch contiguous; the last row is the zero
    pad row) and ``g_nbo = g.permute(2, 0, 1)`` ``[Nout, Bpad, Cout_pad]``, zero-padded. Gathering
    rows of ``xt`` by ``input_linear[n, p-tile]`` directly yields ``A_n^T`` ``[tile_p, 64]`` with
    contiguous 128-byte rows, so no ``tile_transpose`` is needed. Variants:

    * ``gw2``: grid ``(n, o_tile)``, P64 loop inside the CTA (few, long CTAs);
    * ``gw3``: grid ``(n, p_tile, o_tile)`` (many short CTAs; occupies the GPU for small Nout);
    * ``gw4``: gw3 with two adjacent o tiles per CTA sharing each gathered ``xt`` tile (halves the
      x-gather stream; needs Cout padded to ``2*tile_n``). The seed measured it 5-9 % slower than
      gw3 and kept it as a negative result; it stays here for the sweep.

    * ``gi3``: the 3-D ``(n, p_tile, b_tile)`` grid for gi (default when gi2's ``(n, b_tile)`` grid
      would give fewer than 4 CTAs per SM: small-Nout layers);
    * ``gi2p`` / ``gi3p`` / ``gw3p``: gi2 / gi3 / gw3 with a register prefetch (software pipelining): the next step's
      gathers are issued into registers before the current ``tile_matmul`` and copied to the shared
      operand tiles after it, hiding load latency that Warp's tile GEMM does not overlap itself.

    The stage ``dWeff[nc, P64, Cout_pad]`` is reduced into ``dW^T[Q, Cout]`` in fp32 by the ``dw``
    reduction over a *weight-row reverse index* (CSR from weight rows q to the flat entries
    ``j = n*P64 + p`` that use them; built once per meta and cached alongside it, see
    :func:`_weight_row_csr`). Entries whose input is the pad column are left out of that index: their
    dWeff rows are exactly zero (A is zero there), so dropping them equals the reference's "scatter
    zeros into row 0 / into the real tap" (spec §3). ``finish="index_add"`` keeps the seed's atomic
    torch ``index_add_`` finish as a measured alternative (nondeterministic on CUDA).

Pads and the "tile overread doctrine": every contraction operand is zero-padded to whole tiles
(Cout for dA, batch for dWeff, p via P64) and the plain axis of every indexed load is padded too,
so no tile load ever depends on Warp's out-of-bounds behaviour. Tests pre-fill stage buffers with
NaN, so an unwritten stage entry would poison the result.

Kernels are built lazily per config by ``_make_*`` factories (``module="unique"``,
``enable_backward=False``, ``fast_math``) and validated once per device by a NaN canary
(:func:`_canary_grad_stage_ok`, :func:`_get_grad_kernel`); an unlaunchable default config makes the
public functions fall back to :class:`fovi_lab.reference.CompactTorchOps` with a warning, an
unlaunchable *explicit* config raises. Everything also runs on Warp's CPU device (tile kernels run
there with one thread per block), which is how CI tests the kernels.

Knobs: ``FOVI_KNN_GRAD_STAGE_MIB`` (stage budget of these kernels, default 256, capped by
``FOVI_KNN_STAGE_MIB``), ``FOVI_KNN_GRAD_STAGE_FP32=1`` (fp32 staging), ``FOVI_KNN_GW_FINISH=index_add``
(the seed's atomic finish), ``FOVI_KNN_GI_CONFIG`` / ``FOVI_KNN_GW_CONFIG`` (default configs),
``FOVI_WARP_MATHDX=0/1`` (scalar / cuBLASDx tile GEMM, shared with the forward kernels).

Config names encode the tiles: ``gi2_p64b128`` = grad-input v2, 64-wide p tile, 128-wide batch tile;
``gw3_p64n128`` = grad-weight v3, 64-wide p tile, 128-wide o tile. A ``_f32`` suffix on a kernel name
(``gi2_p64b128_f32``) selects fp32 staging.
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

import os
import time
import uuid
import warnings
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from .meta import TrainingMeta, meta_aux, pad_to, validate_meta
from .reference import CompactTorchOps, check_grad_args, stage_budget_bytes
from .warp_common import (ValidatedCache, check_tensor, fast_launch, gather_rows, init_warp, nan_canary, to_warp,
                          torch_stream, warp_ct, warp_device, wp)

__all__ = [
    "grad_input", "grad_weight",
    "_GRAD_INPUT_CONFIG_SPECS", "_GRAD_WEIGHT_CONFIG_SPECS", "_CSR_KERNEL_SPECS",
    "DEFAULT_GI_CONFIG", "DEFAULT_GI_CONFIG_SMALL_B", "DEFAULT_GW_CONFIG", "DEFAULT_GW_CONFIG_NARROW",
    "_make_grad_input_stage2_kernel", "_make_grad_weight_stage2_kernel",
    "_make_grad_weight_stage3_kernel", "_make_grad_weight_stage4_kernel",
    "_make_dx_csr_kernel", "_make_dw_csr_kernel",
    "_canary_grad_stage_ok", "_canary_csr_ok", "_get_grad_kernel", "_select_gi_config",
    "_select_gw_config", "_pad_flat_input_fp16", "_weight_row_csr", "all_grad_kernel_names",
    "warm_grad_kernel", "aot_compile_grad_kernels", "GradKernel", "_make_grad_input_stage2p_kernel",
    "_make_grad_weight_stage3p_kernel", "_make_grad_input_stage3_kernel", "_make_grad_input_stage3p_kernel",
    "_plan_grad_input", "_plan_grad_weight", "grad_stage_budget_bytes",
]

# --------------------------------------------------------------------------------------------
# Config tables
# --------------------------------------------------------------------------------------------

# Contraction tile of the gi GEMM (Cout) and of the gw GEMM (batch). 64 fp16 = one 128-byte row.
_GI_TILE_O = 64
_GW_TILE_B = 64

#: grad-input stage configs. tile_p must divide 64 (P64 is a multiple of 64).
_GRAD_INPUT_CONFIG_SPECS: Dict[str, dict] = {
    "gi2_p64b128": dict(version=2, tile_p=64, tile_b=128, tile_o=64, block_dim=256),
    "gi2_p64b64": dict(version=2, tile_p=64, tile_b=64, tile_o=64, block_dim=128),
    "gi2_p32b128": dict(version=2, tile_p=32, tile_b=128, tile_o=64, block_dim=128),
    "gi2_p64b256": dict(version=2, tile_p=64, tile_b=256, tile_o=64, block_dim=256),
    "gi2_p64b128o128": dict(version=2, tile_p=64, tile_b=128, tile_o=128, block_dim=256),
    # register-prefetch (software-pipelined) variants
    "gi2p_p64b128": dict(version="2p", tile_p=64, tile_b=128, tile_o=64, block_dim=256),
    "gi2p_p64b64": dict(version="2p", tile_p=64, tile_b=64, tile_o=64, block_dim=128),
    # 3-D (n, p_tile, b_tile) grid: enough CTAs for small-Nout layers
    "gi3_p64b128": dict(version=3, tile_p=64, tile_b=128, tile_o=64, block_dim=256),
    "gi3_p64b64": dict(version=3, tile_p=64, tile_b=64, tile_o=64, block_dim=128),
    "gi3p_p64b128": dict(version="3p", tile_p=64, tile_b=128, tile_o=64, block_dim=256),
    "gi3p_p64b64": dict(version="3p", tile_p=64, tile_b=64, tile_o=64, block_dim=128),
    # staged-operand ("i", for the Cin = 3 stems): W's rows gathered once per call into
    # weff [Nout*P64, Cout_pad] by a row copy, then plain tile loads (no scalar gather in the GEMM loop)
    "gi2i_p64b64": dict(version="2i", tile_p=64, tile_b=64, tile_o=64, block_dim=128),
    "gi3i_p64b128": dict(version="3i", tile_p=64, tile_b=128, tile_o=64, block_dim=256),
    # ... with a 96-wide Cout chunk: Cout = 96 (alexnet's stem) in one chunk instead of 128 = 96 + 32 padding
    "gi2i_p64b64o96": dict(version="2i", tile_p=64, tile_b=64, tile_o=96, block_dim=128),
    "gi3i_p64b128o96": dict(version="3i", tile_p=64, tile_b=128, tile_o=96, block_dim=256),
    # ... with a 16-wide batch tile: at B = 16 a 64-wide one is 3/4 zero padding
    "gi2i_p64b16o96": dict(version="2i", tile_p=64, tile_b=16, tile_o=96, block_dim=128),
}

#: grad-weight stage configs (batch contraction tile ``tile_kb``, 64 unless given).
_GRAD_WEIGHT_CONFIG_SPECS: Dict[str, dict] = {
    "gw2_p64n64": dict(version=2, tile_p=64, tile_n=64, block_dim=128),
    "gw2_p64n128": dict(version=2, tile_p=64, tile_n=128, block_dim=256),
    "gw3_p64n64": dict(version=3, tile_p=64, tile_n=64, block_dim=128),
    "gw3_p64n128": dict(version=3, tile_p=64, tile_n=128, block_dim=256),
    "gw4_p64n64": dict(version=4, tile_p=64, tile_n=64, block_dim=256),
    "gw4_p64n128": dict(version=4, tile_p=64, tile_n=128, block_dim=256),
    # register-prefetch (software-pipelined) variants of gw3
    "gw3p_p64n128": dict(version="3p", tile_p=64, tile_n=128, block_dim=256),
    "gw3p_p64n64": dict(version="3p", tile_p=64, tile_n=64, block_dim=128),
    # staged-operand ("i", stems): each node chunk's x rows gathered into at [nc*P64, Bpad] by a row copy
    "gw3i_p64n64": dict(version="3i", tile_p=64, tile_n=64, block_dim=128),
    "gw3i_p64n128": dict(version="3i", tile_p=64, tile_n=128, block_dim=256),
    "gw3i_p64n96": dict(version="3i", tile_p=64, tile_n=96, block_dim=128),   # Cout = 96 without padding
    # ... contracting the batch 16 rows at a time (``tile_kb``; the others: 64): B = 16 without padding
    "gw3i_p64n96k16": dict(version="3i", tile_p=64, tile_n=96, tile_kb=16, block_dim=128),
}

#: scalar reverse-index reductions (one thread per output element; block 256).
_CSR_KERNEL_SPECS: Dict[str, dict] = {
    "dx_f16": dict(target="dx", fp32_stage=False, block_dim=256),
    "dx_f32": dict(target="dx", fp32_stage=True, block_dim=256),
    "dw_f16": dict(target="dw", fp32_stage=False, block_dim=256),
    "dw_f32": dict(target="dw", fp32_stage=True, block_dim=256),
}

# B > 64: the 3-D (n, p_tile, b_tile) grid with an fp32 stage had the fastest whole grad_input op on
# the H200 sweep (data/backward_sweep_h200.jsonl, 2026-11-29): alexnet L1 B=512 8.3 ms vs 11.6 ms for
# the seed's gi2_p64b128 (fp16 stage), alexnet L0 3.8 vs 4.5, res18 layer1 0.97 vs 1.41. The fp32
# stage skips one rounding and its stores are no slower; the budget halves the batch chunk instead.
DEFAULT_GI_CONFIG = "gi3_p64b128_f32"
DEFAULT_GI_CONFIG_SMALL_B = "gi2_p64b64"   # B <= 64: a 128-wide batch tile would be >= half padding
DEFAULT_GW_CONFIG = "gw3_p64n128"          # the seed's default
DEFAULT_GW_CONFIG_NARROW = "gw3_p64n64"    # Cout <= 64: a 128-wide o tile would be >= half padding

_F32_SUFFIX = "_f32"
_MODULE_OPTIONS = {"fast_math": True}


def _env_flag(name: str, default: bool = False) -> bool:
    v = os.environ.get(name)
    if v is None or v.strip() == "":
        return default
    return v.strip().lower() not in ("0", "false", "no", "off")


def _stage_fp32_default() -> bool:
    """fp32 staging when ``FOVI_KNN_GRAD_STAGE_FP32=1`` (default fp16, like the seed)."""
    return _env_flag("FOVI_KNN_GRAD_STAGE_FP32", False)


def _split_name(name: str) -> Tuple[str, bool]:
    """``'gi2_p64b128_f32'`` -> ``('gi2_p64b128', True)``."""
    if name.endswith(_F32_SUFFIX):
        return name[: -len(_F32_SUFFIX)], True
    return name, False


def all_grad_kernel_names():
    """Every ``(kind, name)`` that :func:`_get_grad_kernel` knows (for warm-up and sweeps)."""
    out = []
    for base in _GRAD_INPUT_CONFIG_SPECS:
        out += [("gi", base), ("gi", base + _F32_SUFFIX)]
    for base in _GRAD_WEIGHT_CONFIG_SPECS:
        out += [("gw", base), ("gw", base + _F32_SUFFIX)]
    out += [("csr", name) for name in _CSR_KERNEL_SPECS]
    return out


_SM_COUNTS: Dict[str, int] = {}


def _sm_count(device) -> Optional[int]:
    """Multiprocessor count of a CUDA device (cached); None for the CPU."""
    if device is None:
        return None
    dev = torch.device(device) if not isinstance(device, torch.device) else device
    if dev.type != "cuda":
        return None
    key = str(dev)
    if key not in _SM_COUNTS:
        _SM_COUNTS[key] = int(torch.cuda.get_device_properties(dev).multi_processor_count)
    return _SM_COUNTS[key]


def _cout96(cout: Optional[int]) -> bool:
    """Cout a multiple of 96 but not of 64 (alexnet's stem): the stems' 96-wide Cout tiles fit it exactly
    where 64/128-wide ones pad 96 to 128 (a third more MMA work, stage and staged-W bytes)."""
    return cout is not None and cout % 96 == 0 and cout % 64 != 0


# Below this many input channels (the Cin = 3 stems) the staged-operand ("i") gi/gw kernels are the
# defaults once the stage is big enough: a gathered operand tile there is scalar loads of 3-row
# neighbour runs. Their GPU time is lower on every stem shape measured (H200 run 10, CUDA-graph replay:
# alexnet L0 B=64 1.79 -> 1.32 ms, res18 stem 0.64 -> 0.52), but they add a row copy, a buffer and ~0.3 ms
# of host work per eager step: session 4 set the threshold at 16M staged elements (B * Nout * P64) from
# eager steps. Where the 96-wide Cout tiles apply (Cout = 96, alexnet's stem: the staged kernels also drop
# the 96 -> 128 padding of the gathered ones), staging wins earlier: run 31 (session 6) measured alexnet
# L0 at B = 16 (5.9M) faster staged in every measure (per call 0.99 against 1.46 ms, pipelined 0.86
# against 1.34, replayed 0.83 against 1.31), hence 4M there; the res18 stem at B = 16 (3.0M) and the
# DINOv3 patch embed (0.3M at B = 16, 1.3M at 64) stayed slower staged per call and pipelined.
_STAGED_OPERAND_MAX_CIN = 16
_STAGED_OPERAND_MIN_WORK = 16 << 20
_STAGED_OPERAND_MIN_WORK_COUT96 = 4 << 20


def _staged_operand(cin: Optional[int], batch: int, nout: Optional[int], p64: Optional[int],
                    cout: Optional[int] = None) -> bool:
    """Whether the stems' staged-operand adjoints are the default for this call (see above)."""
    if cin is None or cin >= _STAGED_OPERAND_MAX_CIN or nout is None or p64 is None:
        return False
    return batch * nout * p64 >= (_STAGED_OPERAND_MIN_WORK_COUT96 if _cout96(cout) else _STAGED_OPERAND_MIN_WORK)


def _select_gi_config(batch: int, nout: Optional[int] = None, device=None, cin: Optional[int] = None,
                      p64: Optional[int] = None, cout: Optional[int] = None) -> str:
    """Default gi config. ``FOVI_KNN_GI_CONFIG`` overrides (still a default: unlaunchable -> fallback).

    A 64-wide batch tile for B <= 64 (a 128-wide one would be >= half padding). gi2's ``(n, b_tile)``
    grid when it has at least 4 CTAs per SM, else the 3-D gi3 grid (small-Nout layers). Stems
    (``cin`` < 16) with at least ``_STAGED_OPERAND_MIN_WORK`` staged elements: the staged-operand
    variants (gi2i at B <= 64, gi3i above).
    """
    env = os.environ.get("FOVI_KNN_GI_CONFIG")
    if env:
        return env
    small = batch <= 64
    if _staged_operand(cin, batch, nout, p64, cout):
        # B > 64: gi2i with an fp32 stage (run 29, alexnet L0 B=512: the whole grad_input 1.93 ms against
        # 2.20 for gi3i_..._f32, and 2.44 against 2.86 with 64-wide Cout tiles)
        name = "gi2i_p64b64" if small else "gi2i_p64b64_f32"
        if _cout96(cout):
            return "gi2i_p64b16o96" if batch <= 16 else name.replace("b64", "b64o96")
        return name
    sms = _sm_count(device)
    if sms is not None and nout is not None:
        tile_b = 64 if small else 128
        if nout * -(-batch // tile_b) < 4 * sms:
            return "gi3_p64b64" if small else DEFAULT_GI_CONFIG
    return DEFAULT_GI_CONFIG_SMALL_B if small else DEFAULT_GI_CONFIG


def _select_gw_config(cout: int, cin: Optional[int] = None, batch: Optional[int] = None,
                      nout: Optional[int] = None, p64: Optional[int] = None) -> str:
    """Default gw config (``FOVI_KNN_GW_CONFIG`` overrides): gw3, 64-wide o tile when Cout <= 64; the
    staged-operand gw3i for stems with at least ``_STAGED_OPERAND_MIN_WORK`` staged elements."""
    env = os.environ.get("FOVI_KNN_GW_CONFIG")
    if env:
        return env
    name = DEFAULT_GW_CONFIG_NARROW if cout <= 64 else DEFAULT_GW_CONFIG
    if batch is not None and _staged_operand(cin, batch, nout, p64, cout):
        if _cout96(cout):
            name = "gw3i_p64n96k16" if batch <= 16 else "gw3i_p64n96"
        else:
            name = name.replace("gw3_", "gw3i_")
        if batch > 64:   # fp32 stage (run 29, alexnet L0 B=512: grad_weight 1.66 ms against 2.04 with fp16;
            name += "_f32"   # a tie at B = 64, where the fp16 stage keeps the peak lower)
    return name


def grad_stage_budget_bytes() -> int:
    """Stage budget of the Warp grads: ``min(FOVI_KNN_STAGE_MIB, FOVI_KNN_GRAD_STAGE_MIB)`` MiB.

    ``FOVI_KNN_GRAD_STAGE_MIB`` defaults to 256: at B=512 the dA stage alone would otherwise be
    ~0.5 GiB for alexnet L0/L1, and chunking the batch costs only launches (each chunk is still
    ``Nout * Bchunk/tile_b`` full tiles). ``FOVI_KNN_STAGE_MIB`` (the torch reference's budget, default
    512) stays a hard cap.
    """
    grad = int(float(os.environ.get("FOVI_KNN_GRAD_STAGE_MIB", "256")) * (1 << 20))
    return min(stage_budget_bytes(), grad)


# --------------------------------------------------------------------------------------------
# Kernel factories
# --------------------------------------------------------------------------------------------

def _mathdx_env() -> Optional[bool]:
    """``FOVI_WARP_MATHDX=0/1`` forces the scalar / cuBLASDx tile GEMM (shared with warp_forward);
    unset: Warp's own default (cuBLASDx on CUDA)."""
    env = os.environ.get("FOVI_WARP_MATHDX")
    if env is None or env.strip() == "":
        return None
    return env.strip().lower() not in ("0", "false", "no", "off")


def _kernel_options(block_dim: Optional[int], module_options: Optional[dict]) -> dict:
    opts = dict(_MODULE_OPTIONS)
    mathdx = _mathdx_env()
    if mathdx is not None:
        opts["enable_mathdx_gemm"] = mathdx
    if block_dim is not None:
        # The module's block_dim is what an AOT compile targets; launches pass it again anyway.
        opts["block_dim"] = int(block_dim)
    if module_options:
        opts.update(module_options)
    return opts


def _kernel_decorator(tag: str, opts: dict, module: Optional[str]):
    """``@wp.kernel`` in its own unique module (the default), or in the named shared ``module``.

    A shared module (used by the AOT test to compile many kernels in one NVRTC call) takes its options
    from ``wp.set_module_options(..., module=name)``; per-kernel names keep the kernels apart.
    """
    if module is None:
        return wp.kernel(enable_backward=False, module="unique", module_options=opts, name=tag)
    return wp.kernel(enable_backward=False, module=module, name=tag)


def _tag(kernel, fp32_stage: bool):
    # Remember the stage dtype on the kernel (the canaries need it; the signature is fixed by the seed).
    kernel.fovi_fp32_stage = bool(fp32_stage)
    return kernel


def _stage_dtype(fp32_stage: bool):
    return wp.float32 if fp32_stage else wp.float16


def _make_grad_input_stage2_kernel(tile_p: int, tile_b: int, fp32_stage: bool, *, tile_o: int = _GI_TILE_O,
                                   block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                   module: Optional[str] = None):
    """v2 gi staging: one CTA per ``(n, b_tile)``, the P64 loop inside the CTA.

    Launch ``wp.launch_tiled(k, dim=(Nout, Bpad // tile_b), block_dim=...)`` with inputs
    ``(weight_linear [Nout, P64] i32, wt [Q, Cout_pad] f16, g_nob [Nout, Cout_pad, Bpad] f16,
    n_p_tiles = P64 // tile_p, n_o_tiles = Cout_pad // tile_o)`` and output
    ``dA_stage [Nout, P64, Bpad]`` (fp16 or fp32)::

        dA_stage[n, p, b] = sum_o W^T[weight_linear[n, p], o] * g_nob[n, o, b]     (fp32 accumulate)

    Keeping the P loop in the CTA amortises per-CTA fixed costs over P64/tile_p accumulator
    rounds; the gathered W tile is directly the left operand (rows of W^T), so no transpose.
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    tag = f"fovi_gi2_p{tile_p}b{tile_b}o{tile_o}_{'f32' if fp32_stage else 'f16'}"

    @_kernel_decorator(tag, opts, module)
    def gi2(weight_linear: wp.array2d(dtype=wp.int32), wt: wp.array2d(dtype=wp.float16),
            g_nob: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_o_tiles: int,
            da: wp.array3d(dtype=sd)):
        n, bt = wp.tid()
        b_off = bt * tile_b
        for pt in range(n_p_tiles):
            p_off = pt * tile_p
            rows = wp.tile_load(weight_linear[n], shape=tile_p, offset=p_off)
            acc = wp.tile_zeros(shape=(tile_p, tile_b), dtype=wp.float32)
            for ot in range(n_o_tiles):
                o_off = ot * tile_o
                w = wp.tile_load_indexed(wt, indices=rows, shape=(tile_p, tile_o), offset=(0, o_off),
                                         axis=0, storage="shared")
                g = wp.tile_load(g_nob[n], shape=(tile_o, tile_b), offset=(o_off, b_off), storage="shared")
                wp.tile_matmul(w, g, acc)
            if wp.static(fp32_stage):
                wp.tile_store(da[n], acc, offset=(p_off, b_off))
            else:
                wp.tile_store(da[n], wp.tile_astype(acc, wp.float16), offset=(p_off, b_off))

    return _tag(gi2, fp32_stage)


def _make_grad_input_stage3_kernel(tile_p: int, tile_b: int, fp32_stage: bool, *, tile_o: int = _GI_TILE_O,
                                   block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                   module: Optional[str] = None):
    """v3 gi staging: a 3-D ``(n, p_tile, b_tile)`` grid, the o loop inside the CTA.

    Launch ``dim=(Nout, P64 // tile_p, Bpad // tile_b)``; same arguments as gi2 (``n_p_tiles`` unused).
    gi2's ``(n, b_tile)`` grid has only ``Nout * B / tile_b`` CTAs, each walking all P64/tile_p tiles:
    for small-Nout layers (alexnet L2-L4: 60 nodes, resnet layer3: 16) that is fewer CTAs than the GPU
    has SMs. Here every output tile is its own CTA (the gw3 idea applied to dA).
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    tag = f"fovi_gi3_p{tile_p}b{tile_b}o{tile_o}_{'f32' if fp32_stage else 'f16'}"

    @_kernel_decorator(tag, opts, module)
    def gi3(weight_linear: wp.array2d(dtype=wp.int32), wt: wp.array2d(dtype=wp.float16),
            g_nob: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_o_tiles: int,
            da: wp.array3d(dtype=sd)):
        n, pt, bt = wp.tid()
        p_off = pt * tile_p
        b_off = bt * tile_b
        rows = wp.tile_load(weight_linear[n], shape=tile_p, offset=p_off)
        acc = wp.tile_zeros(shape=(tile_p, tile_b), dtype=wp.float32)
        for ot in range(n_o_tiles):
            o_off = ot * tile_o
            w = wp.tile_load_indexed(wt, indices=rows, shape=(tile_p, tile_o), offset=(0, o_off),
                                     axis=0, storage="shared")
            g = wp.tile_load(g_nob[n], shape=(tile_o, tile_b), offset=(o_off, b_off), storage="shared")
            wp.tile_matmul(w, g, acc)
        if wp.static(fp32_stage):
            wp.tile_store(da[n], acc, offset=(p_off, b_off))
        else:
            wp.tile_store(da[n], wp.tile_astype(acc, wp.float16), offset=(p_off, b_off))

    return _tag(gi3, fp32_stage)


def _make_grad_input_stage3p_kernel(tile_p: int, tile_b: int, fp32_stage: bool, *, tile_o: int = _GI_TILE_O,
                                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                    module: Optional[str] = None):
    """gi3 with a register prefetch of the next o step's W gather and g tile (see gi2p)."""
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    tag = f"fovi_gi3p_p{tile_p}b{tile_b}o{tile_o}_{'f32' if fp32_stage else 'f16'}"

    @_kernel_decorator(tag, opts, module)
    def gi3p(weight_linear: wp.array2d(dtype=wp.int32), wt: wp.array2d(dtype=wp.float16),
             g_nob: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_o_tiles: int,
             da: wp.array3d(dtype=sd)):
        n, pt, bt = wp.tid()
        p_off = pt * tile_p
        b_off = bt * tile_b
        g_n = g_nob[n]
        rows = wp.tile_load(weight_linear[n], shape=tile_p, offset=p_off, storage="shared")
        w_sh = wp.tile_zeros(shape=(tile_p, tile_o), dtype=wp.float16, storage="shared")
        g_sh = wp.tile_zeros(shape=(tile_o, tile_b), dtype=wp.float16, storage="shared")
        w_r = wp.tile_load_indexed(wt, indices=rows, shape=(tile_p, tile_o), offset=(0, 0), axis=0)
        g_r = wp.tile_load(g_n, shape=(tile_o, tile_b), offset=(0, b_off))
        acc = wp.tile_zeros(shape=(tile_p, tile_b), dtype=wp.float32)
        for ot in range(n_o_tiles):
            wp.tile_assign(w_sh, w_r)
            wp.tile_assign(g_sh, g_r)
            o1 = wp.min(ot + 1, n_o_tiles - 1) * tile_o
            w_r = wp.tile_load_indexed(wt, indices=rows, shape=(tile_p, tile_o), offset=(0, o1), axis=0)
            g_r = wp.tile_load(g_n, shape=(tile_o, tile_b), offset=(o1, b_off))
            wp.tile_matmul(w_sh, g_sh, acc)
        if wp.static(fp32_stage):
            wp.tile_store(da[n], acc, offset=(p_off, b_off))
        else:
            wp.tile_store(da[n], wp.tile_astype(acc, wp.float16), offset=(p_off, b_off))

    return _tag(gi3p, fp32_stage)


def _make_grad_weight_stage2_kernel(tile_p: int, tile_n: int, fp32_stage: bool, *, tile_b: int = _GW_TILE_B,
                                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                   module: Optional[str] = None):
    """v2 gw staging: one CTA per ``(n, o_tile)``, P64 loop in the CTA, transposed-x operand.

    Launch ``dim=(nc, Cout_pad // tile_n)`` with inputs ``(input_linear [nc, P64] i32,
    xt [Cin*Nin+1, Bpad] f16, g_nbo [nc, Bpad, Cout_pad] f16, n_p_tiles, n_b_tiles)`` and output
    ``dWeff [nc, P64, Cout_pad]``::

        dWeff[n, p, o] = sum_b xt[input_linear[n, p], b] * g_nbo[n, b, o]          (fp32 accumulate)

    ``xt`` is batch-contiguous, so the indexed gather reads contiguous 128-byte rows and is
    directly the ``A_n^T`` tile (no ``tile_transpose``).
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    tag = f"fovi_gw2_p{tile_p}n{tile_n}b{tile_b}_{'f32' if fp32_stage else 'f16'}"

    @_kernel_decorator(tag, opts, module)
    def gw2(input_linear: wp.array2d(dtype=wp.int32), xt: wp.array2d(dtype=wp.float16),
            g_nbo: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_b_tiles: int,
            dweff: wp.array3d(dtype=sd)):
        n, ot = wp.tid()
        o_off = ot * tile_n
        for pt in range(n_p_tiles):
            p_off = pt * tile_p
            rows = wp.tile_load(input_linear[n], shape=tile_p, offset=p_off)
            acc = wp.tile_zeros(shape=(tile_p, tile_n), dtype=wp.float32)
            for bt in range(n_b_tiles):
                b_off = bt * tile_b
                a = wp.tile_load_indexed(xt, indices=rows, shape=(tile_p, tile_b), offset=(0, b_off),
                                         axis=0, storage="shared")
                g = wp.tile_load(g_nbo[n], shape=(tile_b, tile_n), offset=(b_off, o_off), storage="shared")
                wp.tile_matmul(a, g, acc)
            if wp.static(fp32_stage):
                wp.tile_store(dweff[n], acc, offset=(p_off, o_off))
            else:
                wp.tile_store(dweff[n], wp.tile_astype(acc, wp.float16), offset=(p_off, o_off))

    return _tag(gw2, fp32_stage)


def _make_grad_weight_stage3_kernel(tile_p: int, tile_n: int, fp32_stage: bool, *, tile_b: int = _GW_TILE_B,
                                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                   module: Optional[str] = None):
    """v3 gw staging: a 3-D ``(n, p_tile, o_tile)`` grid with the v2 transposed-x operand.

    Launch ``dim=(nc, P64 // tile_p, Cout_pad // tile_n)``; same arguments as v2 (``n_p_tiles`` is
    unused). For small-Nout shapes the v2 ``(n, o_tile)`` grid under-occupies the GPU; this keeps
    per-CTA work small but parallel (one accumulator, B/64 GEMM steps per CTA).
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    tag = f"fovi_gw3_p{tile_p}n{tile_n}b{tile_b}_{'f32' if fp32_stage else 'f16'}"

    @_kernel_decorator(tag, opts, module)
    def gw3(input_linear: wp.array2d(dtype=wp.int32), xt: wp.array2d(dtype=wp.float16),
            g_nbo: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_b_tiles: int,
            dweff: wp.array3d(dtype=sd)):
        n, pt, ot = wp.tid()
        p_off = pt * tile_p
        o_off = ot * tile_n
        rows = wp.tile_load(input_linear[n], shape=tile_p, offset=p_off)
        acc = wp.tile_zeros(shape=(tile_p, tile_n), dtype=wp.float32)
        for bt in range(n_b_tiles):
            b_off = bt * tile_b
            a = wp.tile_load_indexed(xt, indices=rows, shape=(tile_p, tile_b), offset=(0, b_off),
                                     axis=0, storage="shared")
            g = wp.tile_load(g_nbo[n], shape=(tile_b, tile_n), offset=(b_off, o_off), storage="shared")
            wp.tile_matmul(a, g, acc)
        if wp.static(fp32_stage):
            wp.tile_store(dweff[n], acc, offset=(p_off, o_off))
        else:
            wp.tile_store(dweff[n], wp.tile_astype(acc, wp.float16), offset=(p_off, o_off))

    return _tag(gw3, fp32_stage)


def _make_grad_weight_stage4_kernel(tile_p: int, tile_n: int, fp32_stage: bool, *, tile_b: int = _GW_TILE_B,
                                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                   module: Optional[str] = None):
    """v4 gw staging: v3's 3-D grid, but each CTA computes TWO adjacent o tiles.

    Launch ``dim=(nc, P64 // tile_p, Cout_pad // (2*tile_n))``; ``g_nbo``/``dWeff`` must be padded to
    a multiple of ``2*tile_n`` columns. Each gathered ``xt`` tile feeds both accumulators, halving
    the x-gather stream (the forward's weight-reuse idea applied to the batch contraction).
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    tag = f"fovi_gw4_p{tile_p}n{tile_n}b{tile_b}_{'f32' if fp32_stage else 'f16'}"

    @_kernel_decorator(tag, opts, module)
    def gw4(input_linear: wp.array2d(dtype=wp.int32), xt: wp.array2d(dtype=wp.float16),
            g_nbo: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_b_tiles: int,
            dweff: wp.array3d(dtype=sd)):
        n, pt, ot = wp.tid()
        p_off = pt * tile_p
        o0 = ot * (2 * tile_n)
        o1 = o0 + tile_n
        rows = wp.tile_load(input_linear[n], shape=tile_p, offset=p_off)
        acc0 = wp.tile_zeros(shape=(tile_p, tile_n), dtype=wp.float32)
        acc1 = wp.tile_zeros(shape=(tile_p, tile_n), dtype=wp.float32)
        for bt in range(n_b_tiles):
            b_off = bt * tile_b
            a = wp.tile_load_indexed(xt, indices=rows, shape=(tile_p, tile_b), offset=(0, b_off),
                                     axis=0, storage="shared")
            g0 = wp.tile_load(g_nbo[n], shape=(tile_b, tile_n), offset=(b_off, o0), storage="shared")
            wp.tile_matmul(a, g0, acc0)
            g1 = wp.tile_load(g_nbo[n], shape=(tile_b, tile_n), offset=(b_off, o1), storage="shared")
            wp.tile_matmul(a, g1, acc1)
        if wp.static(fp32_stage):
            wp.tile_store(dweff[n], acc0, offset=(p_off, o0))
            wp.tile_store(dweff[n], acc1, offset=(p_off, o1))
        else:
            wp.tile_store(dweff[n], wp.tile_astype(acc0, wp.float16), offset=(p_off, o0))
            wp.tile_store(dweff[n], wp.tile_astype(acc1, wp.float16), offset=(p_off, o1))

    return _tag(gw4, fp32_stage)


def _make_grad_input_stage2p_kernel(tile_p: int, tile_b: int, fp32_stage: bool, *, tile_o: int = _GI_TILE_O,
                                    block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                    module: Optional[str] = None):
    """gi2 with a register prefetch (software pipelining): same arguments, grid and result as gi2.

    Warp's tile GEMM does not overlap loads with math inside a CTA (load, sync, matmul, sync). Here
    the next (p tile, o tile) step's W gather and g tile are issued into *registers* before the
    current step's ``tile_matmul`` and copied into the shared operand tiles after it, so their
    global-load latency hides behind the math (the forward's ``gp``/``nmp`` idea).
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    tag = f"fovi_gi2p_p{tile_p}b{tile_b}o{tile_o}_{'f32' if fp32_stage else 'f16'}"

    @_kernel_decorator(tag, opts, module)
    def gi2p(weight_linear: wp.array2d(dtype=wp.int32), wt: wp.array2d(dtype=wp.float16),
             g_nob: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_o_tiles: int,
             da: wp.array3d(dtype=sd)):
        n, bt = wp.tid()
        b_off = bt * tile_b
        wl_n = weight_linear[n]
        g_n = g_nob[n]
        w_sh = wp.tile_zeros(shape=(tile_p, tile_o), dtype=wp.float16, storage="shared")
        g_sh = wp.tile_zeros(shape=(tile_o, tile_b), dtype=wp.float16, storage="shared")
        rows = wp.tile_load(wl_n, shape=tile_p, offset=0, storage="shared")
        w_r = wp.tile_load_indexed(wt, indices=rows, shape=(tile_p, tile_o), offset=(0, 0), axis=0)
        g_r = wp.tile_load(g_n, shape=(tile_o, tile_b), offset=(0, b_off))
        n_steps = n_p_tiles * n_o_tiles
        for pt in range(n_p_tiles):
            acc = wp.tile_zeros(shape=(tile_p, tile_b), dtype=wp.float32)
            for ot in range(n_o_tiles):
                wp.tile_assign(w_sh, w_r)
                wp.tile_assign(g_sh, g_r)
                # prefetch the next step (the last step re-loads itself: unconditional loads keep
                # the register consumers after the matmul)
                s1 = wp.min(pt * n_o_tiles + ot + 1, n_steps - 1)
                pt1 = s1 // n_o_tiles
                ot1 = s1 - pt1 * n_o_tiles
                rows1 = wp.tile_load(wl_n, shape=tile_p, offset=pt1 * tile_p, storage="shared")
                w_r = wp.tile_load_indexed(wt, indices=rows1, shape=(tile_p, tile_o), offset=(0, ot1 * tile_o),
                                           axis=0)
                g_r = wp.tile_load(g_n, shape=(tile_o, tile_b), offset=(ot1 * tile_o, b_off))
                wp.tile_matmul(w_sh, g_sh, acc)
            if wp.static(fp32_stage):
                wp.tile_store(da[n], acc, offset=(pt * tile_p, b_off))
            else:
                wp.tile_store(da[n], wp.tile_astype(acc, wp.float16), offset=(pt * tile_p, b_off))

    return _tag(gi2p, fp32_stage)


def _make_grad_weight_stage3p_kernel(tile_p: int, tile_n: int, fp32_stage: bool, *, tile_b: int = _GW_TILE_B,
                                     block_dim: Optional[int] = None, module_options: Optional[dict] = None,
                                     module: Optional[str] = None):
    """gw3 with a register prefetch of the next b step's ``xt`` gather and ``g`` tile (see gi2p)."""
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    tag = f"fovi_gw3p_p{tile_p}n{tile_n}b{tile_b}_{'f32' if fp32_stage else 'f16'}"

    @_kernel_decorator(tag, opts, module)
    def gw3p(input_linear: wp.array2d(dtype=wp.int32), xt: wp.array2d(dtype=wp.float16),
             g_nbo: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_b_tiles: int,
             dweff: wp.array3d(dtype=sd)):
        n, pt, ot = wp.tid()
        p_off = pt * tile_p
        o_off = ot * tile_n
        g_n = g_nbo[n]
        rows = wp.tile_load(input_linear[n], shape=tile_p, offset=p_off, storage="shared")
        a_sh = wp.tile_zeros(shape=(tile_p, tile_b), dtype=wp.float16, storage="shared")
        g_sh = wp.tile_zeros(shape=(tile_b, tile_n), dtype=wp.float16, storage="shared")
        a_r = wp.tile_load_indexed(xt, indices=rows, shape=(tile_p, tile_b), offset=(0, 0), axis=0)
        g_r = wp.tile_load(g_n, shape=(tile_b, tile_n), offset=(0, o_off))
        acc = wp.tile_zeros(shape=(tile_p, tile_n), dtype=wp.float32)
        for bt in range(n_b_tiles):
            wp.tile_assign(a_sh, a_r)
            wp.tile_assign(g_sh, g_r)
            b1 = wp.min(bt + 1, n_b_tiles - 1) * tile_b
            a_r = wp.tile_load_indexed(xt, indices=rows, shape=(tile_p, tile_b), offset=(0, b1), axis=0)
            g_r = wp.tile_load(g_n, shape=(tile_b, tile_n), offset=(b1, o_off))
            wp.tile_matmul(a_sh, g_sh, acc)
        if wp.static(fp32_stage):
            wp.tile_store(dweff[n], acc, offset=(p_off, o_off))
        else:
            wp.tile_store(dweff[n], wp.tile_astype(acc, wp.float16), offset=(p_off, o_off))

    return _tag(gw3p, fp32_stage)


def _make_grad_staged_operand_kernel(kind: str, version: str, tile_p: int, tile_wide: int, fp32_stage: bool, *,
                                     tile_o: int = _GI_TILE_O, block_dim: Optional[int] = None,
                                     module_options: Optional[dict] = None, module: Optional[str] = None,
                                     tile_kb: int = _GW_TILE_B):
    """Staged-operand ("i") variants of gi2 / gi3 / gw3 for the Cin = 3 stems.

    There every neighbour contributes 3 contraction rows, so the gathered operand tile (rows of W^T for
    gi, rows of x^T for gw) is a scalar, bounds-checked ``tile_load_indexed`` that costs more than
    the tile GEMM. Here the plan copies those rows once into a dense operand (``weff[n*P64 + p] =
    W^T[weight_linear[n, p]]`` per call for gi; ``at[nl*P64 + p] = xt[input_linear[n0+nl, p]]`` per
    node chunk for gw, :func:`fovi_lab.warp_common.gather_rows`) and the kernel plain-loads it
    (vectorised). Same launch grid and argument list as the version it mirrors; the table argument is
    unused, and the row of node ``n``'s tile ``p`` is ``n * n_p_tiles * tile_p + p``.

    Memory: gw's staged rows count against the stage budget (they shrink the node chunk); gi's
    ``weff`` is ``Nout*P64*Cout_pad*2`` bytes whatever the batch (alexnet L0: 95 MB), outside it.
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(block_dim, module_options)
    f = "f32" if fp32_stage else "f16"
    if kind == "gi":
        tile_b = tile_wide
        tag = f"fovi_gi{version}_p{tile_p}b{tile_b}o{tile_o}_{f}"
        GRID3 = version == "3i"

        @_kernel_decorator(tag, opts, module)
        def gi_i(weight_linear: wp.array2d(dtype=wp.int32), weff: wp.array2d(dtype=wp.float16),
                 g_nob: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_o_tiles: int,
                 da: wp.array3d(dtype=sd)):
            if wp.static(GRID3):
                n, pt0, bt = wp.tid()
                pt_lo = pt0
                pt_hi = pt0 + 1
            else:
                n, bt = wp.tid()
                pt_lo = 0
                pt_hi = n_p_tiles
            b_off = bt * tile_b
            row0 = n * n_p_tiles * tile_p
            for pt in range(pt_lo, pt_hi):
                p_off = pt * tile_p
                acc = wp.tile_zeros(shape=(tile_p, tile_b), dtype=wp.float32)
                for ot in range(n_o_tiles):
                    o_off = ot * tile_o
                    w = wp.tile_load(weff, shape=(tile_p, tile_o), offset=(row0 + p_off, o_off), storage="shared")
                    g = wp.tile_load(g_nob[n], shape=(tile_o, tile_b), offset=(o_off, b_off), storage="shared")
                    wp.tile_matmul(w, g, acc)
                if wp.static(fp32_stage):
                    wp.tile_store(da[n], acc, offset=(p_off, b_off))
                else:
                    wp.tile_store(da[n], wp.tile_astype(acc, wp.float16), offset=(p_off, b_off))

        return _tag(gi_i, fp32_stage)

    tile_n = tile_wide
    TKB = int(tile_kb)                   # batch rows contracted per MMA (gw's K)
    tag = f"fovi_gw{version}_p{tile_p}n{tile_n}b{TKB}_{f}"

    @_kernel_decorator(tag, opts, module)
    def gw_i(input_linear: wp.array2d(dtype=wp.int32), at: wp.array2d(dtype=wp.float16),
             g_nbo: wp.array3d(dtype=wp.float16), n_p_tiles: int, n_b_tiles: int,
             dweff: wp.array3d(dtype=sd)):
        n, pt, ot = wp.tid()
        p_off = pt * tile_p
        o_off = ot * tile_n
        row = n * n_p_tiles * tile_p + p_off
        acc = wp.tile_zeros(shape=(tile_p, tile_n), dtype=wp.float32)
        for bt in range(n_b_tiles):
            b_off = bt * TKB
            a = wp.tile_load(at, shape=(tile_p, TKB), offset=(row, b_off), storage="shared")
            g = wp.tile_load(g_nbo[n], shape=(TKB, tile_n), offset=(b_off, o_off), storage="shared")
            wp.tile_matmul(a, g, acc)
        if wp.static(fp32_stage):
            wp.tile_store(dweff[n], acc, offset=(p_off, o_off))
        else:
            wp.tile_store(dweff[n], wp.tile_astype(acc, wp.float16), offset=(p_off, o_off))

    return _tag(gw_i, fp32_stage)


def _make_dx_csr_kernel(fp32_stage: bool, *, module_options: Optional[dict] = None, module: Optional[str] = None):
    """Reverse-CSR grad-input reduction (scalar, one thread per ``(m, c, b)``, b fastest).

    Launch ``wp.launch(k, dim=(Nin, Cin, Bc))`` with ``rev_rowptr [Nin+1] i32``, ``rev_row [nnz] i32``
    (decoded ``n_i*P64 + k_i``), ``da [Nout*P64, Bstage]`` (the stage viewed 2-D), ``k`` and output
    ``out[c, m, b]`` (any strides)::

        out[c, m, b] = sum_{i in [rowptr[m], rowptr[m+1])} da[rev_row[i] + c*K, b]      (fp32, in order)

    Threads of one warp share (m, c) and read consecutive b: broadcast index loads, coalesced
    stage loads. No atomics, so the result is deterministic.
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(None, module_options)
    tag = f"fovi_dx_csr_{'f32' if fp32_stage else 'f16'}"

    @_kernel_decorator(tag, opts, module)
    def dx_csr(rowptr: wp.array(dtype=wp.int32), rev_row: wp.array(dtype=wp.int32),
               da: wp.array2d(dtype=sd), k: int, out: wp.array3d(dtype=wp.float32)):
        m, c, b = wp.tid()
        ck = c * k
        i = rowptr[m]
        e = rowptr[m + 1]
        acc = wp.float32(0.0)
        # 8 (then 4) independent loads in flight, then the adds in index order: the same fp32 sum, bit for
        # bit, as one element at a time. (With 4 in flight the reductions ran at 0.5-0.7 TB/s on the H200;
        # 8 made them 1.6x faster, run 13.)
        while i + 8 <= e:
            v0 = wp.float32(da[rev_row[i] + ck, b])
            v1 = wp.float32(da[rev_row[i + 1] + ck, b])
            v2 = wp.float32(da[rev_row[i + 2] + ck, b])
            v3 = wp.float32(da[rev_row[i + 3] + ck, b])
            v4 = wp.float32(da[rev_row[i + 4] + ck, b])
            v5 = wp.float32(da[rev_row[i + 5] + ck, b])
            v6 = wp.float32(da[rev_row[i + 6] + ck, b])
            v7 = wp.float32(da[rev_row[i + 7] + ck, b])
            acc = (((((((acc + v0) + v1) + v2) + v3) + v4) + v5) + v6) + v7
            i += 8
        while i + 4 <= e:
            v0 = wp.float32(da[rev_row[i] + ck, b])
            v1 = wp.float32(da[rev_row[i + 1] + ck, b])
            v2 = wp.float32(da[rev_row[i + 2] + ck, b])
            v3 = wp.float32(da[rev_row[i + 3] + ck, b])
            acc = (((acc + v0) + v1) + v2) + v3
            i += 4
        while i < e:
            acc += wp.float32(da[rev_row[i] + ck, b])
            i += 1
        out[c, m, b] = acc

    return _tag(dx_csr, fp32_stage)


_SEARCH_FUNC = None


def _search_func():
    """``_first_not_below(arr, lo, hi, v)``: first i in [lo, hi) with arr[i] >= v, else hi.

    Not ``wp.lower_bound``: in Warp 1.19 it returns ``hi - 1`` (not ``hi``) when every element is
    below ``v``, which would drop or duplicate a term at a chunk boundary.
    """
    global _SEARCH_FUNC
    if _SEARCH_FUNC is None:
        @wp.func
        def _first_not_below(arr: wp.array(dtype=wp.int32), lo: int, hi: int, v: int):
            a = lo
            b = hi
            while a < b:
                mid = a + (b - a) // 2
                if arr[mid] < v:
                    a = mid + 1
                else:
                    b = mid
            return a

        _SEARCH_FUNC = _first_not_below
    return _SEARCH_FUNC


def _make_dw_csr_kernel(fp32_stage: bool, *, module_options: Optional[dict] = None, module: Optional[str] = None):
    """Weight-row reverse-index grad-weight reduction (scalar, one thread per ``(q, o)``, o fastest).

    Launch ``wp.launch(k, dim=(Q, Cout))`` with ``w_rowptr [Q+1] i32``, ``w_col [nnz_w] i32``
    (flat ``j = n*P64 + p``, ascending within a row), the stage ``dweff [nc*P64, Cout_pad]`` holding
    the flat entries ``[j_lo, j_hi)``, ``j_lo``, ``j_hi``, ``accumulate`` and output
    ``dwt [Q, Cout_pad]`` fp32::

        dwt[q, o] (+)= sum_{i in row q, j_lo <= w_col[i] < j_hi} dweff[w_col[i] - j_lo, o]

    Chunks of nodes are processed in ascending order and each row's entries are ascending in j, so
    every ``dwt[q, o]`` sees the same fp32 addition sequence whatever the chunking: deterministic.
    """
    init_warp()
    sd = _stage_dtype(fp32_stage)
    opts = _kernel_options(None, module_options)
    tag = f"fovi_dw_csr_{'f32' if fp32_stage else 'f16'}"
    _first_not_below = _search_func()

    @_kernel_decorator(tag, opts, module)
    def dw_csr(rowptr: wp.array(dtype=wp.int32), w_col: wp.array(dtype=wp.int32),
               dweff: wp.array2d(dtype=sd), j_lo: int, j_hi: int, accumulate: int,
               dwt: wp.array2d(dtype=wp.float32)):
        q, o = wp.tid()
        s = rowptr[q]
        e = rowptr[q + 1]
        if j_lo > 0:
            s = _first_not_below(w_col, s, e, j_lo)
        if j_hi < 2147483647:
            e = _first_not_below(w_col, s, e, j_hi)
        acc = wp.float32(0.0)
        if accumulate != 0:
            acc = dwt[q, o]
        i = s
        while i + 8 <= e:   # 8 (then 4) loads in flight, adds in index order (bitwise the sequential sum)
            v0 = wp.float32(dweff[w_col[i] - j_lo, o])
            v1 = wp.float32(dweff[w_col[i + 1] - j_lo, o])
            v2 = wp.float32(dweff[w_col[i + 2] - j_lo, o])
            v3 = wp.float32(dweff[w_col[i + 3] - j_lo, o])
            v4 = wp.float32(dweff[w_col[i + 4] - j_lo, o])
            v5 = wp.float32(dweff[w_col[i + 5] - j_lo, o])
            v6 = wp.float32(dweff[w_col[i + 6] - j_lo, o])
            v7 = wp.float32(dweff[w_col[i + 7] - j_lo, o])
            acc = (((((((acc + v0) + v1) + v2) + v3) + v4) + v5) + v6) + v7
            i += 8
        while i + 4 <= e:
            v0 = wp.float32(dweff[w_col[i] - j_lo, o])
            v1 = wp.float32(dweff[w_col[i + 1] - j_lo, o])
            v2 = wp.float32(dweff[w_col[i + 2] - j_lo, o])
            v3 = wp.float32(dweff[w_col[i + 3] - j_lo, o])
            acc = (((acc + v0) + v1) + v2) + v3
            i += 4
        while i < e:
            acc += wp.float32(dweff[w_col[i] - j_lo, o])
            i += 1
        dwt[q, o] = acc

    return _tag(dw_csr, fp32_stage)


_STAGE_FACTORIES = {
    ("gi", 2): _make_grad_input_stage2_kernel,
    ("gi", "2p"): _make_grad_input_stage2p_kernel,
    ("gi", 3): _make_grad_input_stage3_kernel,
    ("gi", "3p"): _make_grad_input_stage3p_kernel,
    ("gw", "3p"): _make_grad_weight_stage3p_kernel,
    ("gw", 2): _make_grad_weight_stage2_kernel,
    ("gw", 3): _make_grad_weight_stage3_kernel,
    ("gw", 4): _make_grad_weight_stage4_kernel,
}


def _build_kernel(kind: str, name: str, module_options: Optional[dict] = None, module: Optional[str] = None):
    """Build (do not validate) the kernel for ``(kind, name)``; returns ``(kernel, spec, fp32_stage)``."""
    if kind == "csr":
        if name not in _CSR_KERNEL_SPECS:
            raise KeyError(f"config: unknown csr kernel {name!r}; known: {sorted(_CSR_KERNEL_SPECS)}")
        spec = _CSR_KERNEL_SPECS[name]
        factory = _make_dx_csr_kernel if spec["target"] == "dx" else _make_dw_csr_kernel
        return factory(spec["fp32_stage"], module_options=module_options, module=module), spec, spec["fp32_stage"]
    base, fp32 = _split_name(name)
    table = {"gi": _GRAD_INPUT_CONFIG_SPECS, "gw": _GRAD_WEIGHT_CONFIG_SPECS}.get(kind)
    if table is None:
        raise ValueError(f"kind: expected 'gi', 'gw' or 'csr', got {kind!r}")
    if base not in table:
        raise KeyError(f"config: unknown {kind} config {name!r}; known: {sorted(table)} "
                       f"(append {_F32_SUFFIX!r} for fp32 staging)")
    spec = table[base]
    if str(spec["version"]).endswith("i"):
        wide = spec["tile_b"] if kind == "gi" else spec["tile_n"]
        kernel = _make_grad_staged_operand_kernel(kind, spec["version"], spec["tile_p"], wide, fp32,
                                                  tile_o=spec.get("tile_o", _GI_TILE_O), block_dim=spec["block_dim"],
                                                  module_options=module_options, module=module,
                                                  tile_kb=spec.get("tile_kb", _GW_TILE_B))
        return kernel, spec, fp32
    factory = _STAGE_FACTORIES[(kind, spec["version"])]
    if kind == "gi":
        kernel = factory(spec["tile_p"], spec["tile_b"], fp32, tile_o=spec["tile_o"],
                         block_dim=spec["block_dim"], module_options=module_options, module=module)
    else:
        kernel = factory(spec["tile_p"], spec["tile_n"], fp32, block_dim=spec["block_dim"],
                         module_options=module_options, module=module)
    return kernel, spec, fp32


# --------------------------------------------------------------------------------------------
# Launch helpers and the NaN canary
# --------------------------------------------------------------------------------------------

def _torch_device(device: str) -> torch.device:
    return torch.device("cpu") if str(device) == "cpu" else torch.device(str(device))


def _launch_stage(kernel, spec: dict, kind: str, idx_table, operand, g, out, device: str):
    """Launch a gi/gw stage kernel with the uniform argument list (see the factories)."""
    p64 = idx_table.shape[1]
    wide = out.shape[2]
    n_inner = g.shape[1] // (spec["tile_o"] if kind == "gi" else spec.get("tile_kb", _GW_TILE_B))
    with torch_stream(device):      # checked wp.array views and a plain launch: this is the canary's path
        wp.launch_tiled(kernel, dim=_stage_dims(spec, kind, out.shape[0], p64, wide),
                        inputs=[to_warp(idx_table), to_warp(operand), to_warp(g), int(p64 // spec["tile_p"]),
                                int(n_inner), to_warp(out)], block_dim=spec["block_dim"], device=device)


def _kernel_stage_is_fp32(kernel) -> bool:
    """Whether a factory-built kernel stages in fp32 (the factories tag their kernels)."""
    tag = getattr(kernel, "fovi_fp32_stage", None)
    if tag is None:
        raise ValueError("kernel: expected a kernel built by a fovi_lab.warp_adjoint factory")
    return bool(tag)


def _canary_grad_stage(kernel, tile_p, tile_wide, block_dim, version, weight_operand, device,
                       tile_o: int = _GI_TILE_O, tile_kb: int = _GW_TILE_B) -> Tuple[bool, str]:
    """Run a stage kernel once on a tiny single-node problem into a NaN-prefilled output.

    ``weight_operand=True`` means a gi kernel (gathers rows of W^T; ``tile_wide`` = batch tile);
    False a gw kernel (gathers rows of xt; ``tile_wide`` = o tile); ``tile_o``: a gi kernel's Cout chunk,
    ``tile_kb``: a gw kernel's batch chunk.
    Checks that every output entry is
    written and finite and matches a torch product (catches garbage as well as silent no-ops).
    """
    try:
        init_warp()
        dev = _torch_device(device)
        gen = torch.Generator().manual_seed(1234)
        p64 = 2 * tile_p                       # two p tiles: exercises the p loop / p grid axis
        if weight_operand:
            cpad, bpad, q = 2 * tile_o, tile_wide, 3 * tile_p   # two Cout chunks: exercises the o loop
            table = torch.randint(0, q, (1, p64), generator=gen, dtype=torch.int32)
            operand = (torch.randn(q, cpad, generator=gen) * 0.25).half()
            g = (torch.randn(1, cpad, bpad, generator=gen) * 0.25).half()
            want = operand.float()[table[0].long()] @ g[0].float()                       # [P64, Bpad]
            out_shape = (1, p64, bpad)
            spec = dict(version=version, tile_p=tile_p, tile_b=tile_wide, tile_o=tile_o, block_dim=block_dim)
            kind = "gi"
        else:
            cpad, bpad, rows = 2 * tile_wide, 2 * tile_kb, 3 * tile_p   # two batch chunks: the K loop
            table = torch.randint(0, rows, (1, p64), generator=gen, dtype=torch.int32)
            table[0, ::7] = rows - 1             # some pad entries (the zero row)
            operand = (torch.randn(rows, bpad, generator=gen) * 0.25).half()
            operand[-1] = 0
            g = (torch.randn(1, bpad, cpad, generator=gen) * 0.25).half()
            want = operand.float()[table[0].long()] @ g[0].float()                       # [P64, Cout_pad]
            out_shape = (1, p64, cpad)
            spec = dict(version=version, tile_p=tile_p, tile_n=tile_wide, tile_kb=tile_kb, block_dim=block_dim)
            kind = "gw"
        if str(version).endswith("i"):            # staged-operand kernels read the rows pre-gathered
            operand = operand[table[0].long()].contiguous()
        fp32 = _kernel_stage_is_fp32(kernel)
        out = torch.empty(out_shape, dtype=torch.float32 if fp32 else torch.float16, device=dev)
        table, operand, g = table.to(dev), operand.to(dev), g.to(dev)
        ok, why = nan_canary(lambda: _launch_stage(kernel, spec, kind, table, operand, g, out, device), out)
        if not ok:
            return False, why
        err = (out[0].float().cpu() - want).abs().max().item()
        if err > 2e-2:
            return False, f"canary result wrong (max abs err {err:.3g})"
        return True, "ok"
    except Exception as exc:  # a compile error is "unlaunchable" too
        return False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"


def _canary_grad_stage_ok(kernel, tile_p, tile_wide, block_dim, version, weight_operand, device) -> bool:
    """NaN-canary a grad staging kernel (same silent-launch trap as the forward). True when it works."""
    return _canary_grad_stage(kernel, tile_p, tile_wide, block_dim, version, weight_operand, device)[0]


def _canary_csr(kernel, target: str, device) -> Tuple[bool, str]:
    """Run a reduction kernel on a tiny hand-made index into a NaN-prefilled output and check it."""
    try:
        init_warp()
        dev = _torch_device(device)
        gen = torch.Generator().manual_seed(99)
        fp32 = _kernel_stage_is_fp32(kernel)
        sdt = torch.float32 if fp32 else torch.float16
        if target == "dx":
            nin, cin, k, p64, nout, bc = 3, 2, 2, 64, 2, 5
            rowptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
            rev_row = torch.tensor([0, 64 + 1, 1, 64, 65], dtype=torch.int32)   # n*P64 + k
            da = (torch.randn(nout * p64, bc, generator=gen)).to(sdt)
            out = torch.empty(cin, nin, bc, dtype=torch.float32, device=dev)
            want = torch.zeros(cin, nin, bc)
            for m in range(nin):
                for i in range(int(rowptr[m]), int(rowptr[m + 1])):
                    for c in range(cin):
                        want[c, m] += da[int(rev_row[i]) + c * k].float()
            args = [rowptr.to(dev), rev_row.to(dev), da.to(dev), k]
            dim = (nin, cin, bc)
        else:
            q, cpad, cout = 3, 8, 5
            rowptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
            w_col = torch.tensor([0, 3, 1, 2, 4], dtype=torch.int32)
            dweff = torch.randn(5, cpad, generator=gen).to(sdt)
            out = torch.empty(q, cpad, dtype=torch.float32, device=dev)
            want = torch.zeros(q, cpad)
            for r in range(q):
                for i in range(int(rowptr[r]), int(rowptr[r + 1])):
                    want[r] += dweff[int(w_col[i])].float()
            args = [rowptr.to(dev), w_col.to(dev), dweff.to(dev), 0, 2147483647, 0]
            dim = (q, cout)

        def launch():
            with torch_stream(device):
                wp.launch(kernel, dim=dim, inputs=[to_warp(a) if isinstance(a, torch.Tensor) else a for a in args],
                          outputs=[to_warp(out)], device=device)

        view = out if target == "dx" else out[:, :cout]
        out.fill_(float("nan"))                # columns >= cout are never written: they stay NaN
        ok, why = nan_canary(launch, view)
        if not ok:
            return False, why
        err = (view.float().cpu() - (want if target == "dx" else want[:, :cout])).abs().max().item()
        if err > 1e-5:
            return False, f"canary result wrong (max abs err {err:.3g})"
        return True, "ok"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"


def _canary_csr_ok(kernel, target: str, device) -> bool:
    """True when a reduction kernel (``target`` 'dx' or 'dw') launches and computes correctly."""
    return _canary_csr(kernel, target, device)[0]


@dataclass(frozen=True)
class GradKernel:
    """A built and canary-validated kernel: ``kind`` in {gi, gw, csr}, its name, spec and stage dtype."""

    kind: str
    name: str
    kernel: object
    spec: dict
    fp32_stage: bool


_GRAD_KERNELS = ValidatedCache("Warp grad kernel config")


def _normalize_device(device) -> str:
    if device is None:
        init_warp()
        return str(wp.get_device())
    if isinstance(device, torch.device):
        if device.type == "cpu":
            return "cpu"
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    s = str(device)
    if s == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    return s


def _get_grad_kernel(kind: str, name: str, device) -> Optional[GradKernel]:
    """``kind`` in {'gi', 'gw', 'csr'}; the per-device validated :class:`GradKernel`, or None when unlaunchable.

    Built and canary-checked once per (kind, name, device); unknown names raise ``KeyError``.
    """
    device = _normalize_device(device)
    if kind == "csr":
        if name not in _CSR_KERNEL_SPECS:
            raise KeyError(f"config: unknown csr kernel {name!r}; known: {sorted(_CSR_KERNEL_SPECS)}")
    else:
        table = {"gi": _GRAD_INPUT_CONFIG_SPECS, "gw": _GRAD_WEIGHT_CONFIG_SPECS}.get(kind)
        if table is None:
            raise ValueError(f"kind: expected 'gi', 'gw' or 'csr', got {kind!r}")
        if _split_name(name)[0] not in table:
            raise KeyError(f"config: unknown {kind} config {name!r}; known: {sorted(table)} "
                           f"(append {_F32_SUFFIX!r} for fp32 staging)")

    def build():
        try:
            kernel, spec, fp32 = _build_kernel(kind, name)
        except Exception as exc:
            return None, f"build failed: {type(exc).__name__}: {exc}"
        if kind == "csr":
            ok, why = _canary_csr(kernel, spec["target"], device)
        elif kind == "gi":
            ok, why = _canary_grad_stage(kernel, spec["tile_p"], spec["tile_b"], spec["block_dim"],
                                         spec["version"], True, device, tile_o=spec.get("tile_o", _GI_TILE_O))
        else:
            ok, why = _canary_grad_stage(kernel, spec["tile_p"], spec["tile_n"], spec["block_dim"],
                                         spec["version"], False, device, tile_kb=spec.get("tile_kb", _GW_TILE_B))
        return (GradKernel(kind, name, kernel, spec, fp32) if ok else None), why

    return _GRAD_KERNELS.get((kind, name), device, build)


def warm_grad_kernel(kind: str, name: str, device: str) -> Tuple[bool, str, float]:
    """Build, compile and canary one kernel on ``device``; ``(ok, why, seconds)``.

    A top-level function so that a spawned process pool can fill Warp's on-disk kernel cache in
    parallel (MathDx compiles take ~50 s per module on the H200 box and in-process workers do not
    overlap them); the main process then loads every module from the cache.
    """
    t0 = time.perf_counter()
    init_warp()
    k = _get_grad_kernel(kind, name, device)
    return k is not None, (_GRAD_KERNELS.why((kind, name), _normalize_device(device)) or "ok"), \
        time.perf_counter() - t0


def _spec_of(kind: str, name: str) -> dict:
    if kind == "csr":
        return _CSR_KERNEL_SPECS[name]
    table = _GRAD_INPUT_CONFIG_SPECS if kind == "gi" else _GRAD_WEIGHT_CONFIG_SPECS
    return table[_split_name(name)[0]]


def aot_compile_grad_kernels(names, arch, module_dir, *, mathdx: Optional[bool] = False,
                             use_ptx: bool = False, shared_module: bool = True) -> Dict[str, dict]:
    """Compile ``(kind, name)`` kernels ahead of time for CUDA ``arch`` (int or list) with no GPU.

    Uses ``wp.compile_aot_module`` (Warp's bundled NVRTC). ``mathdx=False`` compiles the scalar
    ``tile_matmul`` fallback, ``True`` the cuBLASDx GEMM (~60 s per kernel and arch on a 2-core box),
    None defers to ``wp.config``. With ``shared_module`` (default) the kernels are built into one
    fresh Warp module per block_dim (a tile kernel's code depends on its module's block_dim) and
    compiled in one NVRTC call per module and arch: ~3x cheaper than one module per kernel. Otherwise
    each kernel's own runtime module is compiled (what a warm-up into the kernel cache would do).

    Returns ``{"kind:name": {"seconds": s, "files": [artifact paths]}}`` (with a shared module the
    seconds and files are those of the kernel's module). This proves the generated CUDA compiles;
    whether a config fits a device's shared memory is only known at launch (the canary's job).
    """
    init_warp()
    opts = {} if mathdx is None else {"enable_mathdx_gemm": bool(mathdx)}
    out: Dict[str, dict] = {}
    if not shared_module:
        for kind, name in names:
            kernel, _spec, _fp32 = _build_kernel(kind, name, module_options=opts or None)
            t0 = time.perf_counter()
            files = wp.compile_aot_module(kernel.module, arch=arch, module_dir=module_dir, use_ptx=use_ptx)
            out[f"{kind}:{name}"] = {"seconds": time.perf_counter() - t0, "files": [str(f) for f in files or []]}
        return out
    groups: Dict[int, list] = {}
    for kind, name in names:
        groups.setdefault(int(_spec_of(kind, name)["block_dim"]), []).append((kind, name))
    for block_dim, items in sorted(groups.items()):
        mname = f"fovi_lab_aot_adjoint_b{block_dim}_{uuid.uuid4().hex[:8]}"
        wp.set_module_options(dict(_MODULE_OPTIONS, block_dim=block_dim, enable_backward=False, **opts),
                              module=mname)
        for kind, name in items:
            _build_kernel(kind, name, module=mname)
        t0 = time.perf_counter()
        files = wp.compile_aot_module(wp.get_module(mname), arch=arch, module_dir=module_dir, use_ptx=use_ptx)
        rec = {"seconds": time.perf_counter() - t0, "files": [str(f) for f in files or []]}
        for kind, name in items:
            out[f"{kind}:{name}"] = rec
    return out


# --------------------------------------------------------------------------------------------
# Operand preparation and per-meta cached indices
# --------------------------------------------------------------------------------------------

#: Tests set this to NaN: every buffer this module allocates uninitialised is then pre-filled with it,
#: so an entry a kernel fails to write poisons the result instead of passing by luck.
_EMPTY_FILL: Optional[float] = None


def _empty(shape, dtype, device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    if _EMPTY_FILL is not None:
        t.fill_(_EMPTY_FILL)
    return t


def _pad_flat_input_fp16(x: torch.Tensor, meta: TrainingMeta) -> torch.Tensor:
    """``[B, Cin, Nin]`` fp16 -> ``[B, Cin*Nin + 1]`` fp16 with a trailing zero pad column (contiguous)."""
    check_tensor("x", x, dtype=torch.float16, dim=3, shape=(None, meta.cin, meta.nin))
    b = x.shape[0]
    out = _empty((b, meta.pad_column + 1), x.dtype, x.device)
    out[:, :-1] = x.reshape(b, meta.pad_column)
    out[:, -1] = 0
    return out


def _transposed_padded_input(x: torch.Tensor, meta: TrainingMeta, bpad: int) -> torch.Tensor:
    """``xt[Cin*Nin + 1, Bpad]``: ``xt[r, b] = xpad[b, r]``; zero pad row and zero batch padding."""
    b = x.shape[0]
    xt = _empty((meta.pad_column + 1, bpad), x.dtype, x.device)
    xt[:-1, :b] = x.reshape(b, meta.pad_column).t()
    xt[-1].zero_()
    if bpad > b:
        xt[:, b:].zero_()
    return xt


def _padded_weight_t(weight: torch.Tensor, cpad: int) -> torch.Tensor:
    """``W^T`` as ``[Q, Cout_pad]`` fp16, zero columns for ``o >= Cout`` (contiguous)."""
    cout, q = weight.shape
    wt = _empty((q, cpad), weight.dtype, weight.device)
    wt[:, :cout] = weight.t()
    if cpad > cout:
        wt[:, cout:].zero_()
    return wt


_meta_aux = meta_aux      # per-meta cache of derived tables (fovi_lab.meta.meta_aux)


def _decoded_reverse_csr(meta: TrainingMeta):
    """``(rev_rowptr, rev_row)`` with ``rev_row[i] = n_i*P64 + k_i`` (int32, on the meta's device).

    Decoding ``j = k*Nout + n`` once saves a division per gathered element; also checks the CSR is the
    real one (a meta built with an empty CSR would silently give dx = 0).
    """
    aux = _meta_aux(meta)
    got = aux.get("rev_row")
    if got is None:
        expected = int((meta.idx < meta.nin).sum())
        if meta.nnz != expected or int(meta.rev_rowptr[-1]) != expected:
            raise ValueError(f"meta: reverse CSR has {meta.nnz} entries but the graph has {expected} non-pad "
                             "(k, n) pairs; build the meta with fovi_lab.meta.build_meta")
        col = meta.rev_col.to(torch.int64)
        kk, nn = col // meta.nout, col % meta.nout
        rev_row = (nn * meta.p64 + kk).to(torch.int32).contiguous()
        got = (meta.rev_rowptr.to(torch.int32).contiguous(), rev_row)
        aux["rev_row"] = got
    return got


def _weight_row_csr(meta: TrainingMeta):
    """Reverse index over weight rows: ``(w_rowptr [Q+1] i32, w_col [nnz_w] i32)`` (cached per meta).

    Row ``q`` lists, ascending, every flat ``j = n*P64 + p`` with ``weight_linear[n, p] = q`` whose input
    is *not* the pad column (pad entries carry exactly-zero dWeff, spec §3, so leaving them out is exact).
    """
    aux = _meta_aux(meta)
    got = aux.get("w_csr")
    if got is None:
        il = meta.input_linear_flat
        wl = meta.weight_linear_flat
        keep = torch.nonzero(il != meta.pad_column).squeeze(1)
        rows = wl[keep]
        order = torch.sort(rows, stable=True).indices           # stable: ascending j within a row
        w_col = keep[order].to(torch.int32).contiguous()
        counts = torch.bincount(rows, minlength=meta.q)
        rowptr = torch.zeros(meta.q + 1, dtype=torch.int64, device=il.device)
        rowptr[1:] = torch.cumsum(counts, 0)
        if meta.nout * meta.p64 >= 2**31 - 1:
            raise ValueError("meta: Nout*P64 must fit in int32 for the weight-row index")
        got = (rowptr.to(torch.int32).contiguous(), w_col)
        aux["w_csr"] = got
    return got


# --------------------------------------------------------------------------------------------
# Public gradients
# --------------------------------------------------------------------------------------------

_MAX_STAGE_ELEMS = 2**31 - 1    # keep every stage index in int32 range


def _check_common(meta: TrainingMeta, grad_y: torch.Tensor, weight=None, x=None) -> None:
    # shapes against the layer, and a table or reverse list that disagrees with idx / rf_index is refused
    validate_meta(meta)
    check_tensor("grad_y", grad_y, dtype=torch.float16)     # the dtype first: the Warp kernels are fp16 only
    check_grad_args(meta, grad_y, weight=weight, x=x)
    check_tensor("grad_y", grad_y, dtype=torch.float16, dim=3, shape=(None, meta.cout, meta.nout), contiguous=True)
    if grad_y.shape[0] < 1:
        raise ValueError("grad_y: batch must be >= 1")
    if grad_y.device.type not in ("cpu", "cuda"):
        raise ValueError(f"grad_y: expected a cpu or cuda tensor, got device {grad_y.device}")


def _resolve(kind: str, config: Optional[str], default: str, fp32_stage: Optional[bool]):
    """-> (kernel name, explicit?)."""
    fp32 = _stage_fp32_default() if fp32_stage is None else bool(fp32_stage)
    if config is None:
        name = default
        explicit = False
    else:
        if not isinstance(config, str):
            raise TypeError(f"config: expected a config name (str) or None, got {type(config).__name__}")
        name = config
        explicit = True
    base, named_fp32 = _split_name(name)
    if named_fp32 or fp32:
        name = base + _F32_SUFFIX
    return name, explicit


def _kernels_or_fallback(kind: str, name: str, explicit: bool, device: str, finish: str = "csr"):
    """(stage GradKernel, reduction GradKernel or None, fallback reason or None)."""
    stage = _get_grad_kernel(kind, name, device)
    red = None
    if stage is not None and (kind == "gi" or finish == "csr"):
        red_name = ("dx_" if kind == "gi" else "dw_") + ("f32" if stage.fp32_stage else "f16")
        red = _get_grad_kernel("csr", red_name, device)
        if red is None:
            bad = ("csr", red_name)
        else:
            return stage, red, None
    elif stage is not None:
        return stage, None, None
    else:
        bad = (kind, name)
    why = _GRAD_KERNELS.why(bad, device)
    if explicit:
        raise RuntimeError(f"config: Warp {bad[0]} kernel {bad[1]!r} is not launchable on {device}: {why}")
    return None, None, f"Warp {bad[0]} kernel {bad[1]!r} is not launchable on {device} ({why})"


def _warn_fallback(why: str):
    warnings.warn(f"{why}; falling back to torch_compact (CompactTorchOps)", RuntimeWarning, stacklevel=3)


# Array descriptors (:func:`~fovi_lab.warp_common.warp_ct`): they do not own memory, so the plans keep
# every tensor alive while they launch, and they skip Warp's dtype check, so only tensors of the dtypes
# the kernels declare are passed (the canary launches, with checked ``wp.array`` views, validate the
# signatures once per device).
_ct = warp_ct


def _wp_cached(meta: TrainingMeta, key: str, t: torch.Tensor):
    """Warp view of a per-meta constant tensor, made once (saves a from_torch per launch)."""
    aux = _meta_aux(meta)
    got = aux.get(("wp", key))
    if got is None or got[0] is not t:
        got = (t, _ct(t))
        aux[("wp", key)] = got
    return got[1]


def _launch_tiled(kernel, dim, inputs, block_dim: int, device: str):
    """A recorded tile launch on torch's current stream (:func:`~fovi_lab.warp_common.fast_launch`):
    ``inputs`` are array descriptors (:func:`_ct`) and ints. A staged step makes 4+ launches per gradient;
    packing every argument anew (``wp.launch``) cost ~8 us more per launch than re-setting a recorded one
    (12.8 against 4.7 us on the CPU device, same kernel)."""
    fast_launch(kernel, tuple(dim), inputs, block_dim, device)


def _launch(kernel, dim, inputs, device: str):
    """The SIMT counterpart of :func:`_launch_tiled` (block 256, Warp's default)."""
    fast_launch(kernel, tuple(dim), inputs, 256, device, tiled=False)


def _stage_dims(spec: dict, kind: str, nrows: int, p64: int, wide: int) -> Tuple[int, ...]:
    """Launch grid of a stage kernel; ``wide`` = Bpad (gi) or Cout_pad (gw)."""
    n_p = p64 // spec["tile_p"]
    if kind == "gi":
        if spec["version"] in (3, "3p", "3i"):
            return (nrows, n_p, wide // spec["tile_b"])
        return (nrows, wide // spec["tile_b"])
    if spec["version"] == 2:
        return (nrows, wide // spec["tile_n"])
    if spec["version"] == 4:
        return (nrows, n_p, wide // (2 * spec["tile_n"]))
    return (nrows, n_p, wide // spec["tile_n"])


class _GradInputPlan:
    """Operands and launches of one ``grad_input`` call, one batch chunk at a time.

    ``chunks`` lists ``(b0, b1, bcp)``; ``prepare(i)`` lays out chunk i's ``g_nob``; ``stage(i)`` and
    ``reduce(i)`` launch its two kernels; ``finish(i)`` moves its result into ``dx``. :func:`grad_input`
    runs them in order; the benchmark times ``stage``/``reduce`` alone on prepared operands.
    """

    def __init__(self, meta, grad_y, weight, stage: GradKernel, red: GradKernel, device: str, dx_direct: bool):
        self.meta, self.grad_y, self.stage_k, self.red_k, self.device = meta, grad_y, stage, red, device
        self.dx_direct = dx_direct
        spec = stage.spec
        b = grad_y.shape[0]
        self.tile_b = tile_b = spec["tile_b"]
        self.cpad = pad_to(meta.cout, spec["tile_o"])
        self.wt = _padded_weight_t(weight, self.cpad)                           # [Q, Cout_pad]
        if str(spec["version"]).endswith("i"):                                 # stems: W rows staged once
            weff = _empty((meta.nout * meta.p64, self.cpad), torch.float16, grad_y.device)
            gather_rows(self.wt, meta.weight_linear.view(-1), weff)
            self.wt = weff                                                     # [Nout*P64, Cout_pad]
        rowptr, rev_row = _decoded_reverse_csr(meta)
        self.w_rowptr = _wp_cached(meta, "rev_rowptr32", rowptr)
        self.w_rev_row = _wp_cached(meta, "rev_row", rev_row)
        self.w_wl = _wp_cached(meta, "weight_linear", meta.weight_linear)
        self.w_wt = _ct(self.wt)
        itemsize = 4 if stage.fp32_stage else 2
        per_b = meta.nout * meta.p64 * itemsize
        bchunk = max(tile_b, (grad_stage_budget_bytes() // max(1, per_b)) // tile_b * tile_b)
        cap = max(tile_b, (_MAX_STAGE_ELEMS // (meta.nout * meta.p64)) // tile_b * tile_b)
        self.bchunk = bchunk = min(bchunk, pad_to(b, tile_b), cap)
        self.chunks = [(b0, min(b, b0 + bchunk), pad_to(min(b, b0 + bchunk) - b0, tile_b))
                       for b0 in range(0, b, bchunk)]
        sdt = torch.float32 if stage.fp32_stage else torch.float16
        self.stage_buf = _empty((meta.nout * meta.p64 * bchunk,), sdt, grad_y.device)
        self.dx = _empty((b, meta.cin, meta.nin), torch.float32, grad_y.device)
        self.n_p = meta.p64 // spec["tile_p"]
        self.n_o = self.cpad // spec["tile_o"]
        self._cur = {}

    @property
    def stage_bytes(self) -> int:
        return self.stage_buf.numel() * self.stage_buf.element_size()

    def prepare(self, i: int) -> None:
        meta, (b0, b1, bcp) = self.meta, self.chunks[i]
        bc = b1 - b0
        g_nob = self.grad_y.new_zeros(meta.nout, self.cpad, bcp)             # zero pads: Cout and batch
        g_nob[:, :meta.cout, :bc] = self.grad_y[b0:b1].permute(2, 1, 0)
        da = self.stage_buf[: meta.nout * meta.p64 * bcp].view(meta.nout, meta.p64, bcp)
        if self.dx_direct:
            out = self.dx[b0:b1].permute(1, 2, 0)                              # [Cin, Nin, bc] strided view
        else:
            out = _empty((meta.cin, meta.nin, bc), torch.float32, self.grad_y.device)
        self._cur = dict(i=i, g_nob=g_nob, da=da, out=out, w_g=_ct(g_nob), w_da=_ct(da),
                         w_da2=_ct(da.view(meta.nout * meta.p64, bcp)), w_out=_ct(out))

    def stage(self) -> None:
        c, meta = self._cur, self.meta
        bcp = c["da"].shape[2]
        _launch_tiled(self.stage_k.kernel, _stage_dims(self.stage_k.spec, "gi", meta.nout, meta.p64, bcp),
                      [self.w_wl, self.w_wt, c["w_g"], self.n_p, self.n_o, c["w_da"]],
                      self.stage_k.spec["block_dim"], self.device)

    def reduce(self) -> None:
        c, meta = self._cur, self.meta
        b0, b1, _ = self.chunks[c["i"]]
        _launch(self.red_k.kernel, (meta.nin, meta.cin, b1 - b0),
                [self.w_rowptr, self.w_rev_row, c["w_da2"], int(meta.k), c["w_out"]], self.device)

    def finish(self) -> None:
        c = self._cur
        if not self.dx_direct:
            b0, b1, _ = self.chunks[c["i"]]
            self.dx[b0:b1] = c["out"].permute(2, 0, 1)

    def run(self) -> torch.Tensor:
        for i in range(len(self.chunks)):
            self.prepare(i)
            self.stage()
            self.reduce()
            self.finish()
        self._cur = {}
        return self.dx


class _GradWeightPlan:
    """Operands and launches of one ``grad_weight`` call, one node chunk at a time (see _GradInputPlan)."""

    def __init__(self, meta, grad_y, x, stage: GradKernel, red: Optional[GradKernel], device: str, finish: str):
        self.meta, self.grad_y, self.stage_k, self.red_k, self.device = meta, grad_y, stage, red, device
        self.finish_mode = finish
        spec = stage.spec
        b = grad_y.shape[0]
        self.cpad = pad_to(meta.cout, spec["tile_n"] * (2 if spec["version"] == 4 else 1))
        self.tile_kb = tkb = spec.get("tile_kb", _GW_TILE_B)
        self.bpad = pad_to(b, tkb)
        self.xt = _transposed_padded_input(x, meta, self.bpad)                 # [Cin*Nin+1, Bpad]
        self.w_xt = _ct(self.xt)
        itemsize = 4 if stage.fp32_stage else 2
        self.staged_x = str(spec["version"]).endswith("i")                    # stems: x rows staged per chunk
        per_node = meta.p64 * self.cpad * itemsize + (meta.p64 * self.bpad * 2 if self.staged_x else 0)
        self.nc = nc = max(1, min(meta.nout, grad_stage_budget_bytes() // max(1, per_node),
                                  _MAX_STAGE_ELEMS // (meta.p64 * self.cpad),
                                  _MAX_STAGE_ELEMS // (meta.p64 * self.bpad) if self.staged_x else meta.nout))
        if self.staged_x:
            self.at = _empty((nc * meta.p64, self.bpad), torch.float16, grad_y.device)
        self.chunks = [(n0, min(meta.nout, n0 + nc)) for n0 in range(0, meta.nout, nc)]
        sdt = torch.float32 if stage.fp32_stage else torch.float16
        self.stage_buf = _empty((nc * meta.p64 * self.cpad,), sdt, grad_y.device)
        if finish == "csr":
            w_rowptr, w_col = _weight_row_csr(meta)
            self.w_wrowptr = _wp_cached(meta, "w_rowptr", w_rowptr)
            self.w_wcol = _wp_cached(meta, "w_col", w_col)
            self.dwt = _empty((meta.q, self.cpad), torch.float32, grad_y.device)
        else:
            self.dwt = torch.zeros(meta.q, self.cpad, dtype=torch.float32, device=grad_y.device)
        self.w_dwt = _ct(self.dwt)
        self.n_p = meta.p64 // spec["tile_p"]
        self.n_b = self.bpad // tkb
        self._cur = {}

    @property
    def stage_bytes(self) -> int:
        return self.stage_buf.numel() * self.stage_buf.element_size()

    def prepare(self, i: int) -> None:
        meta, (n0, n1) = self.meta, self.chunks[i]
        m = n1 - n0
        b = self.grad_y.shape[0]
        g_nbo = self.grad_y.new_zeros(m, self.bpad, self.cpad)                 # zero pads: batch and Cout
        g_nbo[:, :b, :meta.cout] = self.grad_y[:, :, n0:n1].permute(2, 0, 1)
        dweff = self.stage_buf[: m * meta.p64 * self.cpad].view(m, meta.p64, self.cpad)
        flat = dweff.view(m * meta.p64, self.cpad)
        il = meta.input_linear[n0:n1]
        self._cur = dict(i=i, g_nbo=g_nbo, dweff=dweff, flat=flat, w_g=_ct(g_nbo), w_dweff=_ct(dweff),
                         w_flat=_ct(flat), w_il=_ct(il) if m < meta.nout else
                         _wp_cached(meta, "input_linear", meta.input_linear), w_x=self.w_xt)
        if self.staged_x:
            at = self.at[: m * meta.p64]
            gather_rows(self.xt, meta.input_linear.view(-1), at, n0 * meta.p64)
            self._cur["w_x"] = _ct(at)

    def stage(self) -> None:
        c, meta = self._cur, self.meta
        m = c["dweff"].shape[0]
        spec = self.stage_k.spec
        _launch_tiled(self.stage_k.kernel, _stage_dims(spec, "gw", m, meta.p64, self.cpad),
                      [c["w_il"], c["w_x"], c["w_g"], self.n_p, self.n_b, c["w_dweff"]],
                      spec["block_dim"], self.device)

    def reduce(self) -> None:
        c, meta = self._cur, self.meta
        n0, n1 = self.chunks[c["i"]]
        if self.finish_mode == "csr":
            j_lo = n0 * meta.p64
            j_hi = n1 * meta.p64 if n1 < meta.nout else 2147483647            # sentinel: no upper search
            _launch(self.red_k.kernel, (meta.q, meta.cout),
                    [self.w_wrowptr, self.w_wcol, c["w_flat"], int(j_lo), int(j_hi), int(n0 > 0), self.w_dwt],
                    self.device)
        else:
            self.dwt.index_add_(0, meta.weight_linear_flat[n0 * meta.p64: n1 * meta.p64], c["flat"].float())

    def run(self) -> torch.Tensor:
        for i in range(len(self.chunks)):
            self.prepare(i)
            self.stage()
            self.reduce()
        self._cur = {}
        return self.dwt[:, :self.meta.cout].t().contiguous()


def _plan_grad_input(meta, grad_y, weight, config=None, *, stage_fp32=None, dx_direct=False):
    """Validate, pick kernels; returns a :class:`_GradInputPlan` or ``(None, why)`` for the fallback."""
    _check_common(meta, grad_y, weight=weight)
    check_tensor("weight", weight, dtype=torch.float16, dim=2, shape=(meta.cout, meta.q),
                 device=grad_y.device, contiguous=True)
    name, explicit = _resolve("gi", config, _select_gi_config(grad_y.shape[0], meta.nout, grad_y.device, meta.cin,
                                                                meta.p64, meta.cout),
                              stage_fp32)
    try:
        device = warp_device(grad_y)
    except ImportError as exc:
        return None, f"Warp is unavailable ({exc})"
    stage, red, why = _kernels_or_fallback("gi", name, explicit, device)
    if stage is None:
        return None, why
    return _GradInputPlan(meta.to(grad_y.device), grad_y, weight, stage, red, device, dx_direct), None


def _plan_grad_weight(meta, grad_y, x, config=None, *, stage_fp32=None, finish=None):
    """Validate, pick kernels; returns a :class:`_GradWeightPlan` or ``(None, why)`` for the fallback."""
    _check_common(meta, grad_y, x=x)
    check_tensor("x", x, dtype=torch.float16, dim=3, shape=(grad_y.shape[0], meta.cin, meta.nin),
                 device=grad_y.device, contiguous=True)
    finish = (os.environ.get("FOVI_KNN_GW_FINISH") or "csr") if finish is None else finish
    if finish not in ("csr", "index_add"):
        raise ValueError(f"finish: expected 'csr' or 'index_add', got {finish!r}")
    name, explicit = _resolve("gw", config, _select_gw_config(meta.cout, meta.cin, grad_y.shape[0], meta.nout,
                                                                      meta.p64), stage_fp32)
    try:
        device = warp_device(grad_y)
    except ImportError as exc:
        return None, f"Warp is unavailable ({exc})"
    stage, red, why = _kernels_or_fallback("gw", name, explicit, device, finish)
    if stage is None:
        return None, why
    return _GradWeightPlan(meta.to(grad_y.device), grad_y, x, stage, red, device, finish), None


def grad_input(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor, config: Optional[str] = None, *,
               stage_fp32: Optional[bool] = None, dx_direct: bool = False) -> torch.Tensor:
    """``dx [B, Cin, Nin]`` fp32 of the compact operator; deterministic reverse-CSR reduction.

    Args:
        meta: the layer's :class:`TrainingMeta` (moved to grad_y's device; needs the real reverse CSR).
        grad_y: ``[B, Cout, Nout]`` fp16, contiguous.
        weight: ``[Cout, Q]`` fp16, contiguous, same device.
        config: a ``_GRAD_INPUT_CONFIG_SPECS`` name (``_f32`` suffix: fp32 staging); None picks by
            batch (:func:`_select_gi_config`) and falls back to torch_compact with a warning when that
            kernel cannot launch; an explicit config that cannot launch raises ``RuntimeError``.
        stage_fp32: stage dA in fp32 (None: ``FOVI_KNN_GRAD_STAGE_FP32``).
        dx_direct: let the reduction write ``dx[b, c, m]`` in place (strided 4-byte stores) instead of
            a coalesced ``[Cin, Nin, Bc]`` buffer plus one torch transpose copy (the default).

    Returns:
        ``dx[b, c, m] = sum_{(n, p): input_linear[n, p] = c*Nin + m} sum_o g[b, o, n] W[o, weight_linear[n, p]]``
        (pad entries never reach dx). Batch chunks keep the stage within ``FOVI_KNN_STAGE_MIB``
        (at least one b tile: ``Nout*P64*tile_b*itemsize`` bytes).
    """
    plan, why = _plan_grad_input(meta, grad_y, weight, config, stage_fp32=stage_fp32, dx_direct=dx_direct)
    if plan is None:
        _warn_fallback(why)
        return CompactTorchOps.grad_input(meta, grad_y, weight)
    return plan.run()


def grad_weight(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor, config: Optional[str] = None, *,
                stage_fp32: Optional[bool] = None, finish: Optional[str] = None) -> torch.Tensor:
    """``dW [Cout, Q]`` fp32; per-node ``dWeff`` staged by a tile GEMM, reduced deterministically.

    Mirrors :meth:`CompactTorchOps.grad_weight` semantics exactly: input-pad entries gather the zero pad
    row (exact-zero contributions) and weight-pad entries would scatter zeros into row 0 of the
    ``[Q, Cout]`` accumulator (the ``csr`` finish skips them; ``index_add`` adds the zeros).

    Args:
        meta: the layer's :class:`TrainingMeta`.
        grad_y: ``[B, Cout, Nout]`` fp16, contiguous.
        x: ``[B, Cin, Nin]`` fp16, contiguous, same device (the forward's compute-dtype input).
        config: a ``_GRAD_WEIGHT_CONFIG_SPECS`` name (``_f32`` suffix: fp32 staging); None picks by
            Cout (:func:`_select_gw_config`), with the same fallback rules as :func:`grad_input`.
        stage_fp32: stage dWeff in fp32 (None: ``FOVI_KNN_GRAD_STAGE_FP32``).
        finish: ``"csr"`` (deterministic weight-row gather, default) or ``"index_add"`` (the seed's
            torch fp32 ``index_add_``; atomics on CUDA). None: ``FOVI_KNN_GW_FINISH`` or ``"csr"``.

    Returns:
        ``dW[o, q] = sum_{(n, p): weight_linear[n, p] = q} sum_b xpad[b, input_linear[n, p]] g[b, o, n]``.
        Node chunks keep the stage within ``FOVI_KNN_STAGE_MIB`` (at least one node).
    """
    plan, why = _plan_grad_weight(meta, grad_y, x, config, stage_fp32=stage_fp32, finish=finish)
    if plan is None:
        _warn_fallback(why)
        return CompactTorchOps.grad_weight(meta, grad_y, x)
    return plan.run()
