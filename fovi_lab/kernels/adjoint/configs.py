"""The staged adjoints' configs and the rules that pick them.

The configs are the presets of the staged adjoint families (:mod:`fovi_lab.kernels.families.staged_adjoints`,
:mod:`fovi_lab.kernels.families.reductions`) in ``fovi_lab/kernels/adjoint/configs.toml``, reached through the
family registry (:func:`fovi_lab.kernels.families.registry.adjoint_point`); the dicts below are their records as the
sweeps and notebooks read them. A config name is the id its parameters give: ``gi2_p64b128`` is grad-input version
2 with a 64-wide p tile and a 128-wide batch tile; ``gw3_p64n128`` is grad-weight version 3 with a 64-wide p tile and
a 128-wide output-channel tile. A ``_f32`` suffix on a kernel name selects an fp32 stage, ``_bf16`` bf16 operands
(the staged entry points take a config name and ``stage_fp32`` for sweeps); ``FOVI_KNN_GRAD_STAGE_MIB`` bounds the
stage (default 64 MiB, capped by ``FOVI_KNN_STAGE_MIB``).
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

import functools
from typing import Dict, List, Optional, Tuple

import torch

import fovi_lab.settings as settings
from fovi_lab.kernels.families.registry import adjoint_kernels, adjoint_point, family, presets
from fovi_lab.ops.reference import stage_budget_bytes


# Contraction tile of the gi GEMM (Cout) and of the gw GEMM (batch): the stage factories' defaults. 64 fp16 = one
# 128-byte row.
_GI_TILE_O = 64
_GW_TILE_B = 64

#: The staged adjoints' families (the stage GEMMs of dx and dW, and the sums after them), in the order they list.
STAGED_FAMILIES = ("staged_dx", "staged_dw", "reductions")


def _records(family_key: str) -> Dict[str, dict]:
    fam = family(family_key)
    return {p.name: fam.spec(p.point) for p in presets(family_key)}


#: grad-input stage configs: name -> ``dict(version, tile_p, tile_b, tile_o, block_dim)`` (the staged dx presets).
GRAD_INPUT_CONFIG_SPECS: Dict[str, dict] = _records("staged_dx")
#: grad-weight stage configs: name -> ``dict(version, tile_p, tile_n, tile_kb, block_dim)`` (the staged dW presets).
GRAD_WEIGHT_CONFIG_SPECS: Dict[str, dict] = _records("staged_dw")
#: scalar reverse-index reductions (one thread per output element; block 256): name -> ``dict(target, fp32_stage,
#: block_dim)``.
CSR_KERNEL_SPECS: Dict[str, dict] = _records("reductions")

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


def is_bf16_name(name: str) -> bool:
    """Whether a staged kernel name is a bf16 form (``<base>_bf16``)."""
    return name.endswith(_BF16_SUFFIX)


def _split_name(name: str) -> Tuple[str, bool]:
    """``'gi2_p64b128_f32'`` -> ``('gi2_p64b128', True)``: the base config and whether it stages in fp32
    (``'gi2_p64b128_bf16'``, the bf16 form, does too)."""
    for suffix in (_F32_SUFFIX, _BF16_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)], True
    return name, False


def all_grad_kernel_names() -> List[Tuple[str, str]]:
    """Every ``(kind, name)`` of the staged presets that :func:`get_grad_kernel` builds (for warm-up and sweeps): each
    stage config with an fp16 stage, an fp32 stage and bf16 operands, and the sums."""
    return [key for f in STAGED_FAMILIES for key in adjoint_kernels(f)]


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
        changes = dict(staged_rows=True)        # gw3i: each node chunk's x rows staged by a row copy
        if _cout96(cout):
            changes.update(tile_n=96, **(dict(tile_kb=16) if batch <= 16 else {}))
        if batch > 64:   # fp32 stage (H200, alexnet L0, fovi_lab/records/h200/backward.jsonl.gz: grad_weight
            changes.update(stage="fp32")   # faster than with fp16 at B=512, a tie at B = 64, where fp16 keeps the
        return _with("gw", name, **changes)    # peak lower)
    return name


@functools.lru_cache(maxsize=None)
def _point_with(kind: str, name: str, changes: Tuple[Tuple[str, object], ...]) -> str:
    point = adjoint_point(kind, name).replace(**dict(changes))
    return point.owner.usual_block(point).id


def _with(kind: str, name: str, **changes) -> str:
    """The name of the config ``name`` of ``kind`` with these parameter values changed, in the usual block of its
    tiles (the family derives the name)."""
    return _point_with(kind, name, tuple(sorted(changes.items())))


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
