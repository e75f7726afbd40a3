"""The staged adjoints' configs and the rules that pick them.

A config name encodes its tiles: ``gi2_p64b128`` is grad-input version 2 with a 64-wide p tile and a 128-wide
batch tile; ``gw3_p64n128`` is grad-weight version 3 with a 64-wide p tile and a 128-wide output-channel tile.
A ``_f32`` suffix on a kernel name selects an fp32 stage (the staged entry points take a config name and
``stage_fp32`` for sweeps); ``FOVI_KNN_GRAD_STAGE_MIB`` bounds the stage (default 64 MiB, capped by
``FOVI_KNN_STAGE_MIB``).
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

from typing import Dict, Optional, Tuple

import torch

import fovi_lab.settings as settings
from fovi_lab.ops.reference import stage_budget_bytes


# Contraction tile of the gi GEMM (Cout) and of the gw GEMM (batch). 64 fp16 = one 128-byte row.
_GI_TILE_O = 64
_GW_TILE_B = 64

#: grad-input stage configs. tile_p must divide 64 (P64 is a multiple of 64).
GRAD_INPUT_CONFIG_SPECS: Dict[str, dict] = {
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
GRAD_WEIGHT_CONFIG_SPECS: Dict[str, dict] = {
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
CSR_KERNEL_SPECS: Dict[str, dict] = {
    "dx_f16": dict(target="dx", fp32_stage=False, block_dim=256),
    "dx_f32": dict(target="dx", fp32_stage=True, block_dim=256),
    "dw_f16": dict(target="dw", fp32_stage=False, block_dim=256),
    "dw_f32": dict(target="dw", fp32_stage=True, block_dim=256),
    "dx_taps": dict(target="dx_taps", fp32_stage=True, block_dim=256),     # the tap-expanded stage's (taps path)
}

# B > 64: the 3-D (n, p_tile, b_tile) grid with an fp32 stage had the fastest whole grad_input op on
# the H200 sweep (fovi_lab/records/h200/backward.jsonl.gz, 2026-11-29), ahead of the seed's gi2_p64b128
# (fp16 stage) on alexnet L1 at B=512, alexnet L0 and res18 layer1. The fp32
# stage skips one rounding and its stores are no slower; the budget halves the batch chunk instead.
DEFAULT_GI_CONFIG = "gi3_p64b128_f32"
DEFAULT_GI_CONFIG_SMALL_B = "gi2_p64b64"   # B <= 64: a 128-wide batch tile would be >= half padding
DEFAULT_GW_CONFIG = "gw3_p64n128"          # the seed's default
DEFAULT_GW_CONFIG_NARROW = "gw3_p64n64"    # Cout <= 64: a 128-wide o tile would be >= half padding

_F32_SUFFIX = "_f32"
_BF16_SUFFIX = "_bf16"      # bf16 operands (and fp32 staging: the bf16 kernels stage in fp32 only)
_MODULE_OPTIONS = {"fast_math": True}


def stage_fp32_default() -> bool:
    """The stage dtype of a staged adjoint called without ``stage_fp32``: fp16, like the seed (a config name's
    ``_f32`` suffix, or ``stage_fp32=True``, asks for fp32)."""
    return False


def _split_name(name: str) -> Tuple[str, bool]:
    """``'gi2_p64b128_f32'`` -> ``('gi2_p64b128', True)``: the base config and whether it stages in fp32
    (``'gi2_p64b128_bf16'``, the bf16 form, does too)."""
    for suffix in (_F32_SUFFIX, _BF16_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)], True
    return name, False


def is_bf16_name(name: str) -> bool:
    """Whether a staged kernel name is a bf16 form (``<base>_bf16``)."""
    return name.endswith(_BF16_SUFFIX)


def all_grad_kernel_names():
    """Every ``(kind, name)`` that :func:`get_grad_kernel` knows (for warm-up and sweeps)."""
    out = []
    for base in GRAD_INPUT_CONFIG_SPECS:
        out += [("gi", base), ("gi", base + _F32_SUFFIX), ("gi", base + _BF16_SUFFIX)]
    for base in GRAD_WEIGHT_CONFIG_SPECS:
        out += [("gw", base), ("gw", base + _F32_SUFFIX), ("gw", base + _BF16_SUFFIX)]
    out += [("csr", name) for name in CSR_KERNEL_SPECS]
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
# neighbour runs. Their GPU time is lower on every stem shape measured (H200, CUDA-graph replay,
# fovi_lab/records/h200/train_step.jsonl.gz, the stems' i2c train steps of 2026-11-29:
# alexnet L0 at B=64 and the res18 stem), but they add a row copy, a buffer and their
# host work to each eager step, so the threshold is 16M staged elements (B * Nout * P64), read from eager
# steps (fovi_lab/records/h200/train_step.jsonl.gz, the stem stage variants of 2026-11-29).
# Where the 96-wide Cout tiles apply (Cout = 96, alexnet's stem: the staged kernels also drop the 96 -> 128
# padding of the gathered ones), staging wins earlier: the H200 measured alexnet
# L0 at B = 16 (5.9M) faster staged in every measure (per call, pipelined and replayed;
# fovi_lab/records/h200/train_step.jsonl.gz, the staged stems at B = 16
# of 2026-11-30), hence 4M there; the res18 stem at B = 16 (3.0M) and the
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


def select_gi_config(batch: int, nout: Optional[int] = None, device=None, cin: Optional[int] = None,
                      p64: Optional[int] = None, cout: Optional[int] = None) -> str:
    """Default gi config (still a default: unlaunchable -> fallback).

    A 64-wide batch tile for B <= 64 (a 128-wide one would be >= half padding). gi2's ``(n, b_tile)``
    grid when it has at least 4 CTAs per SM, else the 3-D gi3 grid (small-Nout layers). Stems
    (``cin`` < 16) with at least ``_STAGED_OPERAND_MIN_WORK`` staged elements: the staged-operand
    variants (gi2i at B <= 64, gi3i above).
    """
    small = batch <= 64
    if _staged_operand(cin, batch, nout, p64, cout):
        # B > 64: gi2i with an fp32 stage (H200, alexnet L0 B=512: the whole grad_input faster than with
        # gi3i_..._f32, with 96- and with 64-wide Cout tiles; fovi_lab/records/h200/backward.jsonl.gz, 2026-11-30)
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


def select_gw_config(cout: int, cin: Optional[int] = None, batch: Optional[int] = None,
                      nout: Optional[int] = None, p64: Optional[int] = None) -> str:
    """Default gw config: gw3, 64-wide o tile when Cout <= 64; the
    staged-operand gw3i for stems with at least ``_STAGED_OPERAND_MIN_WORK`` staged elements."""
    name = DEFAULT_GW_CONFIG_NARROW if cout <= 64 else DEFAULT_GW_CONFIG
    if batch is not None and _staged_operand(cin, batch, nout, p64, cout):
        if _cout96(cout):
            name = "gw3i_p64n96k16" if batch <= 16 else "gw3i_p64n96"
        else:
            name = name.replace("gw3_", "gw3i_")
        if batch > 64:   # fp32 stage (H200, alexnet L0, fovi_lab/records/h200/backward.jsonl.gz: grad_weight
            name += "_f32"   # faster than with fp16 at B=512, a tie at B = 64, where fp16 keeps the peak lower)
    return name


def grad_stage_budget_bytes() -> int:
    """Stage budget of the Warp grads: ``min(FOVI_KNN_STAGE_MIB, FOVI_KNN_GRAD_STAGE_MIB)`` MiB.

    ``FOVI_KNN_GRAD_STAGE_MIB`` defaults to 64: a stage is freed after its call, but its bytes add to the step's
    peak (ResNet-18's stem in fovi's network at B = 256: its dW staged 206 MiB of x rows and products in one
    chunk), while chunking the batch or the nodes costs only launches (each chunk is still whole tiles: ``Nout *
    Bchunk/tile_b`` of them for dx). ``FOVI_KNN_STAGE_MIB`` (the torch reference's budget, default 512) stays a
    hard cap.
    """
    grad = int(settings.get("FOVI_KNN_GRAD_STAGE_MIB") * (1 << 20))
    return min(stage_budget_bytes(), grad)
