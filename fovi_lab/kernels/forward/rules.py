"""Which forward config a call runs: the selection rules, each threshold with where it was measured.

:func:`select_config` maps (batch, layer shape, device) to a config name. The thresholds were read off
the H200 sweeps recorded under ``data/`` (the comment beside each says which measurement).
"""

from __future__ import annotations

import math
from typing import Optional

import fovi_lab.settings as settings
from fovi_lab.graph.meta import pad_to
from fovi_lab.kernels.families.registry import lookup


# Minimum input channels for the node-major family: its channel runs are padded to tile_k (>= 64), so
# a stem (Cin = 3) would do >20x the work (measured on alexnet L0 at B=64, where node-major lost to the gather
# kernels by a wide margin: fovi_lab/records/h200/forward_sweep.jsonl.gz).
_NM_MIN_CIN = 32
# Below this many CTAs for 64x64 output tiles the GPU (132 SMs on the H200) is under-filled and the
# 16x32 tiles' 8x more CTAs win despite their lower per-CTA efficiency (the H200 forward sweep,
# fovi_lab/records/h200/forward_sweep.jsonl.gz: m16 won clearly at 64 CTAs, m64 narrowly at 120-128).
_NM_MIN_CTAS_M64 = 96


def select_config(batch: int, out_channels: int, out_nodes: int, p_padded: int,
                                  in_channels: Optional[int] = None, node_major: bool = False,
                                  mma: bool = True, q: Optional[int] = None, pipe: bool = True) -> str:
    """Pick an uncached config name for one call (refit on the H200 sweep, fovi_lab/records/h200/forward_sweep.jsonl.gz).

    Args:
        batch, out_channels, out_nodes, p_padded: B, Cout, Nout, P64 of the call (P64 / Cin estimates
            K, the neighbour-loop length, which decides the nms split).
        in_channels: Cin (needed to consider the node-major family).
        node_major: whether the tables have the docs/operator.md §2.1 structure (node-major kernels usable).
        q: W's column count Cin*V (the mma rule reads W in place when the nodes reuse W's columns little).
        pipe: consider the pipelined tensor-core kernels (:func:`select_pipe`; the register ones otherwise).
        mma: consider the tensor-core ``mma.sync`` kernels (:func:`select_mma`; sm_80+). They are the
            pick on every recorded shape; ``mma=False`` (or ``FOVI_WARP_MMA=off``, or a
            device where they cannot launch) gives the tile / SIMT rules below.

    The fit without the mma kernels, in words:

    * node-major (Cin >= 32, structured tables): 16x32 tiles when the batch is small (<= 32) or when
      64x64 tiles would give fewer than ~96 CTAs (few output nodes, e.g. res18 layer3/4), with the
      neighbour loop split across CTAs (``nms``) when even that grid is under one wave; otherwise
      64x64 tiles, with a 128-deep K step when that pads the channels no more than a 64-deep one
      (Cin = 96, 128, 256, 384: fewer syncs per FLOP) and 64-deep otherwise (Cin = 64).
    * simt (Cin < 32, at least 256 output nodes, B <= 64, or B <= 128 with Cout <= 64: the stems at small
      and medium batch, see :func:`_simt_fits` and :func:`select_simt`); otherwise i2c for Cin < 32
      (:func:`select_i2c`).
    * gather (unstructured tables; before the i2c family, also the stems): 256 threads per
      CTA (faster than 128: the gathers are scalar loads and more threads keep more in flight;
      512 was slower), 64x64 tiles, or 64x96 when Cout is a multiple of 96 but not of 64 (alexnet's
      stem, Cout = 96: no ragged output tile, so less padded work); at B <= 16, 16x64 tiles when the grid
      stays large (>= 900 CTAs: the resnet stem), else 64-row tiles even though 3/4 of their rows are
      padding (fewer, fuller CTAs win on small grids such as the DINOv3 patch embed's 64 nodes).
    """
    if mma and _mma_env() == "auto":
        return select_mma(batch, out_channels, out_nodes, p_padded, q, pipe=pipe)
    if _simts_fits(batch, out_channels, out_nodes, in_channels):
        return select_simts(batch, out_channels, out_nodes, p_padded)
    nm = node_major and in_channels is not None and in_channels >= _NM_MIN_CIN
    if nm:
        ctas_m64 = out_nodes * -(-batch // 64) * -(-out_channels // 64)
        if batch <= 32 or ctas_m64 < _NM_MIN_CTAS_M64:
            ctas_m16 = out_nodes * -(-batch // 16) * -(-out_channels // 32)
            # sequential tile GEMMs per CTA: K neighbours (~P64/Cin) x Cin/64 channel chunks
            steps = (p_padded // in_channels) * -(-in_channels // 64)
            if ctas_m16 <= _NMS_MAX_CTAS and steps >= _NMS_MIN_STEPS:
                return "nms_m64n64k64" if batch >= 64 else "nms_m16n32k64"
            return "nm_m16n32k64"
        if pad_to(in_channels, 128) == pad_to(in_channels, 64):
            return "nm_m64n64k128"
        return "nm_m64n64k64"
    if in_channels is not None and in_channels < _NM_MIN_CIN:
        if _simt_fits(batch, out_channels, out_nodes):
            return select_simt(batch, out_channels)
        return select_i2c(batch, out_channels, p_padded)
    if out_channels % 96 == 0 and out_channels % 64:
        return "m64n96b256"
    if batch <= 16 and out_nodes * -(-out_channels // 64) >= 900:
        return "m16n64"
    return "m64n64r1b256"


def pick(batch: int, out_channels: int, out_nodes: int, p_padded: int, in_channels: int, node_major: bool,
         q: Optional[int] = None, bf16: bool = False, pipe: bool = True, mma: bool = True) -> str:
    """The forward config the rules pick for a call: the one place a call's forward is decided (the plan of a
    call signature, :func:`fovi_lab.explain` and the benchmarks all ask here). bf16 calls take the register
    tensor-core kernels alone (no other family has a bf16 kernel)."""
    if bf16:
        return select_mma(batch, out_channels, out_nodes, p_padded, q, pipe=False)
    return select_config(batch, out_channels, out_nodes, p_padded, in_channels=in_channels, node_major=node_major,
                         q=q, pipe=pipe, mma=mma)


def pick_reason(batch: int, out_channels: int, out_nodes: int, p_padded: int, in_channels: int,
                node_major: bool, name: str, bf16: bool = False) -> str:
    """Which rule of this module picked ``name`` for the call, in words, with the thresholds it read (the rule is
    told by the point's family and parameters, :mod:`fovi_lab.kernels.families`)."""
    if bf16:
        return "bf16 runs on the register tensor-core kernels alone (select_mma without the pipelined kernels)"
    point = lookup(name)
    reason = _REASON_OF_FAMILY.get(point.family, _gather_reason)
    return reason(bool(point.as_dict().get("split", False)))


def _pipe_reason(split: bool) -> str:
    why = ("; the p range split, as there are fewer than %d nodes or the unsplit grid is under %d blocks" %
           (_PIPE_MIN_NODES, _PIPE_SPLIT_CTAS) if split else "")
    return (f"select_pipe: B >= {_PIPE_MIN_BATCH}, Cout >= {_PIPE_MIN_COUT} and P64 >= {_PIPE_MIN_P64}, where "
            f"each node's GEMM is large enough for the cp.async stages{why}")


def _mma_reason(split: bool) -> str:
    return ("select_mma: the tensor-core rule (FOVI_WARP_MMA=auto), read from the H200 sweeps of every "
            "tensor-core config on every layer; the call's shape is under the pipelined kernels' thresholds")


def _simt_reason(split: bool) -> str:
    if split:
        return (f"select_simts: B <= {_SIMTS_MAX_BATCH}, or at most {_SIMTS_FEW_NODES} output nodes at B <= "
                f"{_SIMTS_FEW_NODES_MAX_BATCH}: the split SIMT kernel")
    return (f"select_simt: a stem-like layer (Cin < {_NM_MIN_CIN}) with >= {_SIMT_MIN_NODES} output nodes at "
            f"this batch")


def _gather_reason(split: bool) -> str:
    return "the gather rule: tables of no special form"


#: The rule of this module that picks each family's kernels (a family's key -> its reason, given the point's p-loop
#: split); a family not here is the gather rule's.
_REASON_OF_FAMILY = {
    "pipelined": _pipe_reason,
    "tensor_cores": _mma_reason,
    "simt": _simt_reason,
    "node_major": lambda split: f"the node-major rule: tables of the node-major form and Cin >= {_NM_MIN_CIN}",
    "im2col": lambda split: f"select_i2c: a stem-like layer (Cin < {_NM_MIN_CIN}) outside the SIMT kernels' range",
}


def _mma_env() -> str:
    """``FOVI_WARP_MMA``: ``auto`` (the default: the mma rules of :func:`select_mma`) or ``off`` (the tile and
    SIMT rules only)."""
    return settings.get("FOVI_WARP_MMA")


# The tensor-core kernels (fovi_lab.kernels.forward.mma) and how their operand layouts, block, loop depth, store and split
# are chosen, read from the replayed whole ops of the H200 sweeps
# (fovi_lab/records/h200/mma_sweep.jsonl.gz: 90 mma configs on every layer at B = 1/4/16/32/64/128/512). Each
# warp walks its node's p loop waiting on gathered loads, so what decides is how many loads are in flight (batch
# tiles per warp, k-steps per loop iteration: tile_k = 16/32/64, warps per k-step) and what each load and store
# costs. In order:
# * The deep x^T loop (x^T's one vector load per lane and p entry, 4 k-steps in flight) on loops of >= 36 k-steps
#   whose 64 x 16 grid has _MMA_DEEP_WARPS[0 if >= 64 k-steps else 1] to _MMA_DEEP_WARPS[2] warps at B >= 16, or
#   >= 768 warps on >= 64 k-steps at B <= 8:
#   - with staged stores (mmato_o64b16k64) on loops shorter than _MMA_LONG_STEPS of layers with
#     >= _MMA_STAGE_MIN_NODES nodes (res18 layer1/2/2_0 at B = 16-128), and also on the shallow grids of
#     _MMA_DEEP_SHALLOW_PER_STEP 32 x 8 warps per k-step at B = 16-32 (res18 layer1 at B = 16, DINOv3 at B = 16-32);
#   - else in 1-warp blocks with direct stores (mmat_o64b16k64b32): alexnet L1 at B <= 16, L2-L4 at B = 16-32 (L4
#     to 64), res18
#     layer3/3_0 at B = 64-128, layer4_0 at B = 512. Long loops make the stores a small part; on few nodes 4-warp
#     blocks leave SMs idle (64 blocks on 132 SMs). Faster than the 1-deep loop on each of them.
# * Otherwise x^T (mmat) from B = 32 when the 32-row grid has >= 320 warps on long loops (>= 64 k-steps), or >= 512
#   warps on loops of >= 32 k-steps or with Cout <= 96 (the CNN stems); at B = 16 on long loops with >= 512 warps;
#   from B = 64 on layers with >= _MMA_STAGE_MIN_NODES nodes and >= 512 warps (DINOv3). 32-row blocks; 96
#   channels when Cout is a multiple of 96 or where 96 x 32 blocks give >= 1024 warps (alexnet L1 from B = 64).
#   - Staged stores (mmato) when Nout >= 16 and the loop is short or the staged grid has >= _MMA_STAGE_MIN_BLOCKS
#     4-warp blocks (not alexnet L2/L3 at B = 64: 120 blocks): faster than direct stores there. In 8-node blocks
#     (mmato_o64b32b256) on the stems (Nout >= 512) and at B >= 512.
#   - 96 x 32 blocks loop 2 k-steps deep (k32) unless that turns one wave into two: 210 registers leave 8
#     resident warps per SM against 12 at k16's 168, so a grid of 1056-1584 warps (alexnet L1 at B = 64) fills
#     the 132 SMs once at k16 and 1.3 times at k32, where the second, partial wave made k32 slower.
# * Shallow grids of 10-200 32 x 8 warps per k-step at B <= 32 (res18 layer1 and the stem at B <= 4, layer2_0 at
#   B = 16, DINOv3 at B <= 4): 32 x 8 blocks, unsplit, 2 k-steps deep, or 4 deep in 2-warp blocks on loops of
#   >= 20 k-steps at B <= 8 (faster than 2 deep there).
# * Otherwise x in place, 16 batch rows (8 at B <= 8); 32 rows at B >= 128 on long loops (>= 64 k-steps) with
#   >= 768 warps; 96 channels when Cout is a multiple of 96 (alexnet's stem), else 64; 2 k-steps deep for
#   alexnet's stem at B <= 8 and 64-channel blocks with Cout <= 64 at B <= 16; staged from B = 16 on layers with
#   >= _MMA_STAGE_MIN_NODES nodes (mmao_o96b16, mmao_o64b16k32 and its 8-node block on the stems).
# * Split the p loop (mmas, fp32 partials and the fixed-order nms reduction) when the warps times batch tiles
#   are fewer than _MMA_SPLIT_PER_STEP (24 at B <= 2, 16 at B <= 8, 8 above) per k-step: the few-node layers
#   and everything with a long loop at B <= 4. Before a split, grids with too few warps shrink to 32-channel
#   blocks (x 8 rows at B <= 16, x 16 above; x 16 from B = 9 with W in place). Unsplit at B = 3-8: 16 rows.
# * W read in place (mmasw) instead of the per-call W^T layout when the nodes reuse each W column little:
#   Nout*P64/Q <= _MMAW_MAX_REUSE and B*Nout*P64/Q < _MMAW_MAX_BATCH_REUSE (res18 layer3/3_0 at B <= 16,
#   layer4_0 to B = 128: faster replayed; the W^T copy of layer4_0, 9.4 MB, is twice what its two nodes
#   read); in 2-warp 32 x 16 blocks on layers of < 16 nodes from B = 4 (faster on layer4_0). Where W columns
#   are reused more (alexnet L1-L4), W^T's vector loads win.
_MMA_SPLIT_PER_STEP = (24, 16, 8)       # at B <= 2, B <= 8, above
_MMA_FEW_WARPS = (192, 384)             # at B <= 16, above: shrink to 32-channel blocks below this many warps
_MMA_DEEP_WARPS = (224, 384, 1024)      # 64 x 16 warps for the deep x^T loop: from (>= 64 k-steps), from, to
_MMA_SHALLOW_PER_STEP = (10, 200)       # 32 x 8 warps per k-step for the unsplit 32 x 8 k32 blocks at B <= 32
_MMAT_MIN_WARPS = (320, 512)            # 32-row warps for x^T: on loops of >= 64 k-steps, else
_MMAT_WIDE_WARPS = 1024                 # 96 x 32 blocks (Cout >= 256) from this many warps
_MMAT_K16_WAVE = (1056, 1584)           # 96 x 32 grids that fit one wave of 12 warps/SM (k16) but not of 8 (k32)
_MMA_LONG_STEPS = 144                   # loops this long (alexnet L1-L4, res18 layer3/4_0): the stores are a small part
_MMA_STAGE_MIN_NODES = 60               # staged stores where the layer has nodes to fill 4-8-node blocks
_MMA_STAGE_MIN_BLOCKS = 132             # ... or, on long loops, where the staged grid has a block per SM
_MMA_DEEP_SHALLOW_PER_STEP = (20, 200)  # 32 x 8 warps per k-step for the staged deep x^T loop at B = 16-32
_MMAW_MAX_REUSE = 4
_MMAW_MAX_BATCH_REUSE = 128


# The pipelined tensor-core kernels (fovi_lab.kernels.forward.mma_pipe), from the H200 run of data/h200/forward_pipe.jsonl.gz
# (kernel times, B = 64 and 512, against the register kernels' picks in the same run): where each node's GEMM is
# large (Cout >= 256, P64 >= 2048) and there are nodes to spread (>= 16), the cp.async stages win every layer:
# alexnet L1-L4 and resnet layer3, at B = 512 and at B = 64. Where Cout or P is smaller (resnet layer1/2, the
# DINOv3 patch embed) the 64 x 32 register blocks stay ahead (res18 layer1 at B = 512 among them). At B >= 256,
# 128-row x 64-channel CTAs (the best block on all five 512-row shapes); below, 64-row x 128-channel CTAs, split
# along p (fp32 partials, fixed-order sum) when the unsplit grid is under _PIPE_SPLIT_CTAS CTAs (alexnet L2-L4 and
# resnet layer3 at B = 64: 60 or 16 nodes).
# A second run (data/h200/forward_pipe_batches.jsonl.gz: the four pipelined configs beside the rule's pick on eight
# layers at B = 64, 128, 256, 512, kernel times) measured B = 128 / 256 (the boundaries above held: the pick was
# the fastest pipelined kernel or close behind it on alexnet L2-L4 and resnet layer3) and the few-node layers:
# * resnet layer3_0 (16 nodes, P64 = 1152): the pipelined kernels beat the register picks at every B (the split
#   below B = 256, as on layer3), so the P64 floor is 1024;
# * resnet layer4_0 (2 nodes): the split kernel won at every B against the register picks, and unsplit CTAs
#   lost (16-64 CTAs on 132 SMs): under _PIPE_MIN_NODES nodes the p loop is always split.
_PIPE_MIN_BATCH = 64
_PIPE_MIN_COUT = 256
_PIPE_MIN_P64 = 1024
_PIPE_MIN_NODES = 16
_PIPE_WIDE_BATCH = 256
_PIPE_SPLIT_CTAS = 264


def select_pipe(batch: int, out_channels: int, out_nodes: int, p_padded: int) -> Optional[str]:
    """The pipelined (``mmap`` / ``mmaps``) config of a call, or None where the register kernels are faster."""
    if batch < _PIPE_MIN_BATCH or out_channels < _PIPE_MIN_COUT or p_padded < _PIPE_MIN_P64:
        return None
    if out_nodes < _PIPE_MIN_NODES:
        return "mmaps_o128b64k32s3"
    if batch >= _PIPE_WIDE_BATCH:
        return "mmap_o64b128k32s3"
    ctas = out_nodes * -(-batch // 64) * -(-out_channels // 128)
    return "mmaps_o128b64k32s3" if ctas < _PIPE_SPLIT_CTAS else "mmap_o128b64k32s3"


def select_mma(batch: int, out_channels: int, out_nodes: int, p_padded: int, q: Optional[int] = None,
               pipe: bool = True) -> str:
    """The mma config of a call (see the rules above); ``q``: W's columns (Cin*V), for the W-in-place rule;
    ``pipe``: consider the pipelined kernels first (:func:`select_pipe`)."""
    picked = select_pipe(batch, out_channels, out_nodes, p_padded) if pipe else None
    if picked is not None:
        return picked
    steps = max(1, p_padded // 16)
    cdiv = lambda a, b: -(-a // b)  # noqa: E731
    cout, nout = out_channels, out_nodes
    w16 = nout * cdiv(batch, 16) * cdiv(cout, 64)
    w32 = nout * cdiv(batch, 8) * cdiv(cout, 32)
    # the deep x^T loop: staged stores on the shorter loops of layers with nodes to fill the blocks, else
    # 1-warp blocks (long loops: the stores are a small part; few nodes: 4-warp blocks leave SMs idle)
    deep = steps >= 36 and (batch >= 16 and _MMA_DEEP_WARPS[0 if steps >= 64 else 1] <= w16 <= _MMA_DEEP_WARPS[2]
                            or batch <= 8 and steps >= 64 and w16 >= 768)
    staged_deep = (steps < _MMA_LONG_STEPS and nout >= _MMA_STAGE_MIN_NODES and batch >= 16
                   and (deep or steps >= 20 and batch <= 32
                        and _MMA_DEEP_SHALLOW_PER_STEP[0] * steps <= w32 <= _MMA_DEEP_SHALLOW_PER_STEP[1] * steps))
    if staged_deep:
        return "mmato_o64b16k64"
    if deep:
        return "mmat_o64b16k64b32"
    # x^T: 96-channel blocks when Cout is a multiple of 96 and where 96 x 32 blocks still give a full grid
    t_rows = 32
    t_oc = 96 if (cout % 96 == 0 or
                  (cout >= 256 and nout * cdiv(batch, 32) * cdiv(cout, 96) >= _MMAT_WIDE_WARPS)) else 64
    t_warps = nout * cdiv(batch, t_rows) * cdiv(cout, t_oc)
    if batch >= 32 and (steps >= 64 and t_warps >= _MMAT_MIN_WARPS[0]
                        or (steps >= 32 or cout <= 96) and t_warps >= _MMAT_MIN_WARPS[1]) \
            or batch >= 16 and steps >= 64 and t_warps >= _MMAT_MIN_WARPS[1] \
            or batch >= 64 and nout >= _MMA_STAGE_MIN_NODES and t_warps >= _MMAT_MIN_WARPS[1]:
        stage = nout >= 16 and (steps < _MMA_LONG_STEPS or t_warps >= 4 * _MMA_STAGE_MIN_BLOCKS)
        if stage and cout % 64 == 0 and (batch >= 512 or nout >= 512):
            return "mmato_o64b32b256"                 # 8-node blocks: runs of 8 outputs per store
        k32 = t_oc == 96 and not _MMAT_K16_WAVE[0] < t_warps <= _MMAT_K16_WAVE[1]
        return f"mmat{'o' if stage else ''}_o{t_oc}b{t_rows}" + ("k32" if k32 else "")
    # x in place
    rows = 8 if batch <= 8 else 16
    oc = 96 if cout % 96 == 0 and (cout % 64 or batch > 16) else 64
    if oc == 96 and cout % 64:
        rows = 16                                     # alexnet's stem: 96 x 16 at every batch
    if oc != 96 and batch <= 32 and _MMA_SHALLOW_PER_STEP[0] * steps <= w32 <= _MMA_SHALLOW_PER_STEP[1] * steps:
        if steps >= 20 and (batch <= 8 or batch <= 16 and w32 >= 40 * steps):
            return "mma_o32b8k64b64"                  # 2-warp blocks: these grids are a few hundred warps
        return "mma_o32b8k32"
    if batch >= 128 and steps >= 64 and nout * cdiv(batch, 32) * cdiv(cout, 64) >= 768:
        rows, oc = 32, 64
    warps = nout * cdiv(batch, rows) * cdiv(cout, oc)
    per_step = _MMA_SPLIT_PER_STEP[0 if batch <= 2 else 1 if batch <= 8 else 2]
    if warps * (rows // 8) < per_step * steps:
        reuse = nout * p_padded / q if q else math.inf
        w_native = reuse <= _MMAW_MAX_REUSE and batch * reuse < _MMAW_MAX_BATCH_REUSE
        if w_native and nout < 16 and batch >= 4:
            return "mmasw_o32b16b64"                  # res18 layer4_0: 2 nodes, 2-warp blocks
        if warps < _MMA_FEW_WARPS[0 if batch <= 16 else 1]:
            oc, rows = 32, (8 if batch <= (8 if w_native else 16) else 16)
        elif oc == 96 or rows == 32:                  # the registered split blocks
            oc, rows = 64, min(rows, 16)
        return f"mmas{'w' if w_native else ''}_o{oc}b{rows}"
    if 2 < batch <= 8:
        rows = 16                                     # unsplit at B = 3-8: 16-row blocks (two n-tiles in flight)
    k32 = oc == 96 and batch <= 8 or oc == 64 and rows == 16 and cout <= 64 and batch <= 16
    name = f"mma_o{oc}b{rows}" + ("k32" if k32 else "")
    if batch >= 16 and nout >= _MMA_STAGE_MIN_NODES and name in ("mma_o96b16", "mma_o64b16k32"):
        name = name.replace("mma_", "mmao_") + ("b256" if oc == 64 and nout >= 512 else "")
    return name


# The SIMT kernels for stem-like calls (Cin < 32), and where they win, from the H200 sweep
# (fovi_lab/records/h200/forward_sweep.jsonl.gz). The metric that decides is the whole op replayed from a CUDA
# graph (GPU time with every layout copy, no host gaps): the vec4 family's kernel time includes its prep
# launch and the host gap before the main launch, the fp16 family's does not.
# * B <= 16: the fp16 kernels (x read and y written in place, W^T cached between calls; one launch):
#   ``sd_b8o8u4``, the best replayed op or close behind it on both CNN stems at B = 16. Reading x in place
#   instead of a padded x^T copy left the replayed op within noise and saved the copy's launch
#   on the eager path. (At B <= 4 the split kernel below takes over from ``sdp_b4o4u4``, 4x4 blocks with the
#   indices prefetched.)
# * B = 32-128: the vec4 kernels (fp32 operands, 16-byte loads): faster than the fp16 one;
#   ``sv_b8o8u8`` on alexnet's stem (Cout = 96), ``sv_b16o8u2`` on resnet's (Cout = 64: only 8 channel
#   groups, so 16 batch rows per thread keep the FMAs per load high).
# Against the i2c tiles (replayed): faster on the stems' 964-node grids up to B = 64 (alexnet's stem at
# B = 16 and 64) and on resnet's up to B = 128; slower at alexnet's B = 128, where 64-row tensor-core tiles
# are full, and on the DINOv3 patch embed at every batch (64 nodes: too few threads to hide the loads; a small
# i2c weight stage of 16 MB).
_SIMT_MIN_NODES = 256
SIMT_CONFIG = "sd_b8o8u4"           # the B <= 16 pick (notebooks, explore_stem)


#: ``"auto"``: the SIMT rules here pick SIMT kernels where they won; ``"off"`` (the tests set it) keeps every pick
#: off them: the stems on the i2c tiles, the other layers on the node-major ones.
SIMT_RULES = "auto"


def _simt_env() -> str:
    """:data:`SIMT_RULES`."""
    return SIMT_RULES


def _simt_fits(batch: int, out_channels: int, out_nodes: int) -> bool:
    """Whether a stem-like call (Cin < 32) takes a SIMT kernel (see :func:`select_simt`) at B > 4 (smaller
    batches take the split kernel, :func:`_simts_fits`). :data:`SIMT_RULES` ``"off"``: never."""
    if _simt_env() == "off" or out_nodes < _SIMT_MIN_NODES:
        return False
    return batch <= 64 or (batch <= 128 and out_channels <= 64)


# The split SIMT kernel (simts) and where it wins, from the H200 sweeps (fovi_lab/records/h200/forward_sweep.jsonl.gz, replayed
# whole ops; their medians are in notebook 13, section 3):
# * B <= 4, every layer: it beat the 16x32 node-major tiles (res18 layer1-4 and alexnet L1-L4 at B = 1 and 4),
#   the DINOv3 patch embed's i2c tiles, and on both stems the unsplit SIMT kernels (``sdp_b4o4u4``), by the
#   widest margin on alexnet's. A 16-row tensor-core tile is 1/16 or 1/4 full there, and a stem's unsplit grid at
#   B = 1 has only 964 x Cout/4 threads. Which register block: 4x8 blocks (with a 131072-thread split) on the
#   layers with much work per image (alexnet's stem and L1-L4: Nout*Cout*P64 = 35-143 M, clearly faster
#   than 8x8 there), 8x8 blocks on the small ones (resnet's stem and layer1-4, DINOv3: 2-12 M, a little faster).
# * B <= 32 on layers with at most 16 output nodes (res18 layer3/3_0/4_0): ``ss_b8o8u4``, ahead of the
#   nms/nm tiles replayed except res18 layer3_0 at B = 32 (behind, measured once), and the fastest eager op at
#   B = 16. On every larger grid the 16x32 tiles were faster at B = 16, and they keep it.
# * Not taken: the DINOv3 patch embed at B = 16. Its eager call is faster with ``ss_b8o8u4`` (one kernel and a
#   small reduction instead of the i2c stage, its weight gather and the GEMM), but its replayed op is slower,
#   and the rules here are read from replays, where the host noise between machines does not enter.
_SIMTS_CONFIG = "ss_b8o8u4"
_SIMTS_WIDE_CONFIG = "ss_b4o8u4"   # B <= 4 on layers with much work per image
_SIMTS_WIDE_WORK = 1 << 25         # Nout*Cout*P64 from which 4x8 blocks win at B <= 4
_SIMTS_MAX_BATCH = 4
_SIMTS_FEW_NODES = 16
_SIMTS_FEW_NODES_MAX_BATCH = 32


def _simts_fits(batch: int, out_channels: int, out_nodes: int, in_channels: Optional[int]) -> bool:
    """Whether a call takes the split SIMT kernel (see above): every call at B <= 4, and the few-node layers
    up to B = 32 (the stems above B = 4 keep their own SIMT rule, :func:`_simt_fits`).
    :data:`SIMT_RULES` ``"off"`` turns it off with the other SIMT rules."""
    if _simt_env() == "off":
        return False
    if batch <= _SIMTS_MAX_BATCH:
        return True
    if in_channels is not None and in_channels < _NM_MIN_CIN and _simt_fits(batch, out_channels, out_nodes):
        return False
    return out_nodes <= _SIMTS_FEW_NODES and batch <= _SIMTS_FEW_NODES_MAX_BATCH


def select_simts(batch: int, out_channels: int, out_nodes: int, p_padded: int) -> str:
    """The split SIMT config for a call that :func:`_simts_fits` (see above)."""
    if batch <= _SIMTS_MAX_BATCH and out_nodes * out_channels * p_padded >= _SIMTS_WIDE_WORK:
        return _SIMTS_WIDE_CONFIG
    return _SIMTS_CONFIG


def select_simt(batch: int, out_channels: int) -> str:
    """The SIMT kernel for a stem-like call that :func:`_simt_fits` (see above)."""
    if batch <= 16:          # (B <= 4 takes the split kernel first, :func:`_simts_fits`)
        return SIMT_CONFIG
    return "sv_b16o8u2" if out_channels <= 64 else "sv_b8o8u8"


def select_i2c(batch: int, out_channels: int, p_padded: int) -> str:
    """The i2c config for a stem-like call (Cin < 32), fit on the H200 sweep
    (fovi_lab/records/h200/forward_sweep.jsonl.gz): at B <= 16, 16 batch rows and 64-wide output tiles (96-wide only
    when 64 would leave a ragged tile: alexnet's Cout = 96); above, 64x96 tiles whenever 96 divides
    Cout (alexnet 96, DINOv3 384: faster than 64- or 128-wide ones), else 64x64, with a
    128-deep K step when P64 allows it (fewer syncs per FLOP)."""
    if batch <= 16:
        return "i2c_m16n96k64" if out_channels % 96 == 0 and out_channels % 64 else "i2c_m16n64k64"
    tn = 96 if out_channels % 96 == 0 else 64
    return f"i2c_m64n{tn}k128" if p_padded % 128 == 0 else f"i2c_m64n{tn}k64"


# The node-major neighbour loop is split across CTAs (nms family) when the 16x32 grid has at most this
# many CTAs *and* each CTA would run at least _NMS_MIN_STEPS sequential tile GEMMs (the H200 sweep:
# res18 layer4_0 at B <= 128 and layer3 at B = 16 gain, res18 layer3_0 with 18 steps loses:
# fovi_lab/records/h200/forward_sweep.jsonl.gz).
_NMS_MAX_CTAS = 256
_NMS_MIN_STEPS = 32

# Tried in order when the selected config is unlaunchable on a device.
_FALLBACK_CHAIN = ("m64n64r1b256", "m32n64", "m16n32")
