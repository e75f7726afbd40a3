"""The adjoints on tensor cores: each gradient is the compact forward of a layer derived from the tables.

dx is the forward of the transposed layer; dW the forward of the tap layer.

Every term of ``dx[b, c, m]`` pairs an entry ``(n, k)`` of input node ``m``'s reverse list with an output
channel ``o``::

    dx[b, c, m] = sum_{(n, k): idx[n, k] = m} sum_o g[b, o, n] W[o, c*V + rf[n, k]]

which is the compact forward of a layer whose output nodes are the input nodes, whose neighbour lists are
the reverse lists and whose channels swap (:func:`fovi_lab.graph.meta.transposed_meta`), on ``grad_y`` with
the weight ``W'[c, o*V + t] = W[o, c*V + t]``. So the hand-written ``mma.sync`` forward kernels compute dx as
they compute y: fp16 (or bf16) products, fp32 accumulation, no atomics. The split configs (``mmas`` /
``mmasw`` / ``mmaps``, fp16 only) write fp32 partials and sum them in a fixed order, and here that sum is the output, never rounded
to fp16: dx is fp32 and bitwise repeatable. The cost is the reverse lists' padding to the largest
in-degree (:func:`padding`).

dW is a GEMM per tap over the pairs (batch row, entry of that tap), the forward of the tap layer
(:func:`fovi_lab.graph.meta.tap_meta`): output nodes the taps, batch rows the input channels, input channels
the batch, inputs ``x'[c, b, m] = x[b, c, m]`` and weight ``W'[o, b*Nout + n] = g[b, o, n]``; its fp32 output
``[Cin, Cout, V]`` is dW's. Its lists are the taps' entry lists, padded to the longest.

The rule (:func:`select_grad_mma`): both gradients run on the pipelined split config (:data:`MMA_GRAD_CONFIG`)
where the call's useful work, ``2 B P64 Cout Nout`` FLOPs, is at least :data:`MMA_GRAD_MIN_GFLOP`, the batch at
least :data:`MMA_GRAD_MIN_BATCH`, the layer has at least :data:`MMA_GRAD_MIN_CIN` input channels and neither
derived layer pads its lists more than :data:`MMA_GRAD_MAX_PADDING`-fold; everywhere else the fused (or, on the
stems, staged) kernels. On the stems (Cin < :data:`MMA_GRAD_MIN_CIN`) dW alone goes to the tensor cores
(:func:`select_stem_dw_mma`): the tap layer's batch rows are their three input channels, which an 8-row block holds,
while the transposed layer of dx would put 3 output channels in a 64-wide tile, so dx stays staged. The staged dW
writes a stage of ``Nout x P64 x Cout`` whatever the batch and reduces it one (q, o) per thread; the tap layer is
a GEMM over the batch and the tap's entries. Its tables grow with the batch, so the stems' dW runs in batch chunks
whose tap tables fit :data:`STEM_DW_TABLE_MIB`, the chunks' fp32 results summed in order, up to
:data:`STEM_DW_MAX_CHUNKS` chunks. That rule is chosen from
the kernels' work, with no GPU record of it: ``python -m fovi_lab bench train-step --graphs --layers res18_stem
alex_L0 dinov3_patch`` times it, and the same command under ``FOVI_KNN_DW_PATH=off`` the staged dW on the same
path otherwise (tools/gpu/run.sh ``steps`` runs both). The shared rule
above is read from train steps replayed from CUDA graphs on the H200, the fused and staged
dispatch beside both gradients forced onto the config, each pair from one build on one machine
(data/h200/grad_mma_rule.jsonl.gz, field ``variant``): from 1.09 to 4.8 GFLOP the tensor cores ran every step faster
(AlexNet L1-L4 at B = 16, ResNet-18 layers 1, 2 and 3 at B = 64, layers 2.0 and 3.0 at B = 512); from 0.14 to
0.6 GFLOP they gained little or lost (ResNet-18 layers 1, 2, 2.0, 3 and 3.0 at B = 16, 2.0 and 3.0 at B = 64); on
layer 4.0 (two output nodes, its tap layer padded 5.5-fold) they lost at both measured batches (B = 64 and 512).
The sweep of ``python -m fovi_lab bench adjoints`` (data/h200/adjoint_paths.jsonl) had the config faster than the
fused kernels on both gradients from 6.8 GFLOP up.
``FOVI_KNN_DX_PATH`` / ``FOVI_KNN_DW_PATH``
(``mma``, ``off``, ``auto``) override the rule per gradient.

``FOVI_KNN_DX_PATH=taps`` (opt-in, fp16 calls; no GPU record times it) puts the stems' dx on the tensor cores another
way (:func:`grad_input_taps`): the forward of the *tap-expanded* layer (:func:`fovi_lab.graph.meta.expanded_meta`,
output channels ``c*V + t``, Q of them, where the transposed layer has Cin) stages
``S[b, c*V + t, n] = sum_o g[b, o, n] W[o, c*V + t]`` in fp32, and a reverse-list reduction sums
``S[b, c*V + rf[n, k], n]`` for each input node in a fixed order: ``V / K`` times the stage's work, in full tiles.
"""

from __future__ import annotations

from typing import Optional

import torch

from fovi_lab.graph.meta import (TrainingMeta, derived_table_limit, expanded_meta, meta_aux, pad_to, reverse_taps,
                                 tap_meta, tap_table_bytes, transposed_meta, validate_meta)
from fovi_lab.kernels.common import check_tensor, warp_ct
from fovi_lab.kernels.forward.api import run_uncached, select_mma_split
from fovi_lab.ops.reference import check_grad_args

__all__ = ["grad_input_mma", "grad_input_taps", "select_taps_config", "taps_batch_chunk", "grad_weight_mma",
           "dw_batch_chunk",
           "transposed_weight", "padding", "tap_padding", "list_paddings",
           "select_grad_mma", "select_stem_dw_mma", "stem_dw_batch_chunk", "stem_dw_config",
           "MMA_GRAD_CONFIG", "MMA_GRAD_MIN_GFLOP", "MMA_GRAD_MIN_BATCH", "MMA_GRAD_MIN_CIN", "MMA_GRAD_MAX_PADDING",
           "STEM_DW_TABLE_MIB", "STEM_DW_MAX_CHUNKS"]

#: The config both tensor-core gradients run under the rule: the pipelined loop with the p range split
#: (``cp.async`` stages, fp32 partials summed in a fixed order), 128 channels x 64 batch rows per CTA.
MMA_GRAD_CONFIG = "mmaps_o128b64k32s3"
#: Useful work (``2 B P64 Cout Nout``, 10^9 FLOPs) from which the rule runs the gradients on tensor cores: the
#: smallest measured winner was ResNet-18 layer 1 at B = 64 (1.09 GFLOP); the largest measured non-winner below it
#: ResNet-18 layer 3.0 at B = 64 (0.60 GFLOP), whose step ran slower on the tensor cores
#: (data/h200/grad_mma_rule.jsonl.gz).
MMA_GRAD_MIN_GFLOP = 1.0
#: The smallest batch the rule sends to the tensor cores: the config's CTAs take 64 batch rows, and no step below
#: B = 16 was measured with them.
MMA_GRAD_MIN_BATCH = 16
#: The shared rule's smallest Cin: below it (the stems, Cin = 3) the transposed layer of dx has 3 output channels in a
#: 128-wide tile, and dW has a rule of its own (:func:`select_stem_dw_mma`).
MMA_GRAD_MIN_CIN = 16
#: The most list padding (slots over real entries) of either derived layer the rule accepts: the measured
#: winners padded up to 2.84-fold (ResNet-18 layer 3.0's tap layer); layer 4.0's tap layer, 5.54-fold, lost.
MMA_GRAD_MAX_PADDING = 3.0
#: The most index-table memory (MiB) of the tap layer a dW on the tensor cores runs on: the batch is cut into chunks
#: whose tap tables fit (ResNet-18's stem: up to 17 rows per chunk; AlexNet's L0, 484 taps: 7; every layer:
#: :func:`dw_batch_chunk`).
STEM_DW_TABLE_MIB = 32
#: The most chunks the stems' rule takes: the tap layer's work grows with the batch while the staged kernels' stage
#: does not, and their replayed steps gain on PyTorch's as B grows (ResNet-18's stem from B = 16 to 512 in
#: fovi_lab/records/h200/train_step.jsonl.gz), so past this many chunks the staged kernels keep dW.
STEM_DW_MAX_CHUNKS = 4


def transposed_weight(weight: torch.Tensor, meta: TrainingMeta) -> torch.Tensor:
    """``W' [Cin, Cout*V]`` with ``W'[c, o*V + t] = W[o, c*V + t]`` (contiguous, weight's dtype)."""
    return weight.view(meta.cout, meta.cin, meta.v).transpose(0, 1).reshape(meta.cin, meta.cout * meta.v)


def padding(meta: TrainingMeta) -> float:
    """The transposed layer's reverse-list padding: slots (Nin * largest in-degree) over real entries."""
    t = transposed_meta(meta)
    real = int(meta.rev_rowptr[-1])
    return t.nout * t.k / max(1, real)


def tap_padding(meta: TrainingMeta) -> float:
    """The tap layer's padding: slots (V * longest tap list) over real entries."""
    t = tap_meta(meta, 1)
    return t.nout * t.k / max(1, int((meta.idx < meta.nin).sum()))


def select_grad_mma(meta: TrainingMeta, batch: int, dtype: torch.dtype = torch.float16) -> Optional[str]:
    """The tensor-core config both gradients of ``meta`` at ``batch`` run under the rule, or None where the
    fused / staged kernels are its pick (see the module docstring; the split configs are fp16 only)."""
    if dtype != torch.float16 or meta.cin < MMA_GRAD_MIN_CIN or batch < MMA_GRAD_MIN_BATCH:
        return None
    if 2.0 * batch * meta.p64 * meta.cout * meta.nout < MMA_GRAD_MIN_GFLOP * 1e9:
        return None
    return MMA_GRAD_CONFIG if max(_cached_paddings(meta)) <= MMA_GRAD_MAX_PADDING else None


def _cached_paddings(meta: TrainingMeta) -> tuple:
    """:func:`list_paddings` once per meta (it reads the tables back to the host)."""
    aux = meta_aux(meta)
    pads = aux.get("list_paddings")
    if pads is None:
        pads = aux["list_paddings"] = list_paddings(meta)
    return pads


def select_stem_dw_mma(meta: TrainingMeta, batch: int, dtype: torch.dtype = torch.float16) -> Optional[str]:
    """The split tensor-core config a stem's dW (Cin < :data:`MMA_GRAD_MIN_CIN`) runs on, or None where it stays
    on the staged kernels: fp16 calls from :data:`MMA_GRAD_MIN_BATCH` rows whose tap layer pads its lists at most
    :data:`MMA_GRAD_MAX_PADDING`-fold, in at most :data:`STEM_DW_MAX_CHUNKS` batch chunks. The config:
    ``select_mma_split(Cin, Cout)``, the tap layer's batch rows being the input channels."""
    if dtype != torch.float16 or meta.cin >= MMA_GRAD_MIN_CIN or batch < MMA_GRAD_MIN_BATCH:
        return None
    if -(-int(batch) // stem_dw_batch_chunk(meta, batch)) > STEM_DW_MAX_CHUNKS:
        return None
    return stem_dw_config(meta) if _cached_paddings(meta)[1] <= MMA_GRAD_MAX_PADDING else None


def stem_dw_config(meta: TrainingMeta) -> str:
    """The split config of a stem's tap layer: ``select_mma_split(Cin, Cout)`` (its batch rows are the input
    channels). ``FOVI_KNN_DW_PATH=mma`` on a stem runs it too, in the same batch chunks, whatever the batch."""
    return select_mma_split(meta.cin, meta.cout)


def stem_dw_batch_chunk(meta: TrainingMeta, batch: int) -> int:
    """The rows per chunk of a stem's dW on the tensor cores: the chunks are as even as the batch allows, each
    with tap tables within :data:`STEM_DW_TABLE_MIB` and ``FOVI_KNN_TAP_TABLE_MIB``, the derived layers' budget
    (at least one row per chunk)."""
    budget = min(STEM_DW_TABLE_MIB << 20, derived_table_limit())
    per_row = max(1, tap_table_bytes(meta, 64) // 64)        # (64 rows: the slots' 64-padding is whole there)
    fit = max(1, budget // per_row)
    while fit > 1 and tap_table_bytes(meta, fit) > budget:
        fit -= 1
    chunks = -(-int(batch) // min(fit, int(batch)))
    return -(-int(batch) // chunks)


def list_paddings(meta: TrainingMeta) -> tuple:
    """``(padding(meta), tap_padding(meta))`` from ``meta``'s own tables, without building the derived layers
    (which may be over their table budget): Nin x the largest in-degree, and V x the longest tap list, over the
    real entries."""
    real = meta.idx < meta.nin
    n_real = max(1, int(real.sum()))
    in_degree = torch.bincount(meta.idx[real].flatten().long(), minlength=meta.nin)
    tap_count = torch.bincount(meta.rf_index[real].flatten().long(), minlength=meta.v)
    return (meta.nin * int(in_degree.max()) / n_real, meta.v * int(tap_count.max()) / n_real)


def grad_input_mma(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor,
                   config: Optional[str] = None) -> torch.Tensor:
    """``dx [B, Cin, Nin]`` fp32 on the tensor-core forward of the transposed layer.

    Args:
        meta: the layer's :class:`TrainingMeta`.
        grad_y: ``[B, Cout, Nout]`` fp16 or bf16, contiguous.
        weight: ``[Cout, Q]`` in grad_y's dtype.
        config: a split tensor-core forward config (``mmas_*`` / ``mmasw_*`` / ``mmaps_*``) for the transposed layer; None:
            :func:`select_grad_mma`'s, else :func:`fovi_lab.kernels.forward.api.select_mma_split` for (B, Cin).
    """
    validate_meta(meta)
    check_tensor("grad_y", grad_y, dtype=(torch.float16, torch.bfloat16))
    check_grad_args(meta, grad_y, weight=weight)
    meta = meta.to(grad_y.device)
    config = config or select_grad_mma(meta, grad_y.shape[0], grad_y.dtype)
    mt = transposed_meta(meta)
    wt = transposed_weight(weight, meta)            # one copy of W per call (Cout*Q elements: small beside g)
    g = grad_y if grad_y.is_contiguous() else grad_y.contiguous()
    return run_uncached(g, wt, None, mt.input_linear, mt.weight_linear, config=config, out_dtype=torch.float32)


def dw_batch_chunk(meta: TrainingMeta, batch: int) -> int:
    """The rows per chunk of a layer's dW on the tensor cores (:func:`grad_weight_mma`'s ``batch_chunk``): 0 (the
    whole batch at once) where the tap layer of the whole batch keeps its tables within :data:`STEM_DW_TABLE_MIB`
    (and ``FOVI_KNN_TAP_TABLE_MIB``), else :func:`stem_dw_batch_chunk`'s rows, chunks as even as the batch allows and
    each within that budget: the tap tables grow with the batch (AlexNet L1 of fovi's network at in_res 64: 31 MiB
    at B = 64, four times that at 256), and a chunk's fp32 result is summed in chunk order (bitwise repeatable)."""
    budget = min(STEM_DW_TABLE_MIB << 20, derived_table_limit())
    return 0 if tap_table_bytes(meta, int(batch)) <= budget else stem_dw_batch_chunk(meta, batch)


def taps_batch_chunk(meta: TrainingMeta, batch: int) -> int:
    """The batch rows per chunk of :func:`grad_input_taps`: what a chunk allocates, its fp32 stage (``Q x Nout``
    values a row) and the split config's fp32 partials (S stages, S at most ``pad64(Cout) / 64``: the split families
    take at least 4 k-steps of 16 p entries per split), within the staged adjoints' budget
    (``FOVI_KNN_GRAD_STAGE_MIB``, capped by ``FOVI_KNN_STAGE_MIB``); ``ceil(B / chunks)`` rows a chunk, the last
    one the rest, at least one row each."""
    from fovi_lab.kernels.adjoint.configs import grad_stage_budget_bytes
    splits = max(1, pad_to(meta.cout, 64) // 64)
    fit = max(1, grad_stage_budget_bytes() // (4 * meta.q * meta.nout * (1 + splits)))
    chunks = -(-int(batch) // min(fit, int(batch)))
    return -(-int(batch) // chunks)


def select_taps_config(meta: TrainingMeta, batch: int) -> str:
    """The split tensor-core config of the tap-expanded layer (:func:`grad_input_taps`) for a call of ``batch``
    rows, from the rows of its chunks (:func:`taps_batch_chunk`): the rule's pipelined config
    (:data:`MMA_GRAD_CONFIG`, 64 batch rows per CTA) where a chunk's GEMM, ``2 rows pad64(Cout) Q Nout`` FLOPs, is
    at least :data:`MMA_GRAD_MIN_GFLOP` with at least 64 rows, else ``select_mma_split(rows, Q)``: the threshold
    of the tensor-core adjoints' rule (:func:`select_grad_mma`) carried over, which no GPU run of this layer
    has checked."""
    rows = taps_batch_chunk(meta, batch)
    work = 2.0 * rows * pad_to(meta.cout, 64) * meta.q * meta.nout
    if rows >= 64 and work >= MMA_GRAD_MIN_GFLOP * 1e9:
        return MMA_GRAD_CONFIG
    return select_mma_split(rows, meta.q)


def grad_input_taps(meta: TrainingMeta, grad_y: torch.Tensor, weight: torch.Tensor,
                    config: Optional[str] = None) -> torch.Tensor:
    """``dx [B, Cin, Nin]`` fp32 on the tensor-core forward of the tap-expanded layer, then a reverse-list sum.

    The stage ``S[b, c*V + t, n] = sum_o g[b, o, n] W[o, c*V + t]`` is one dense GEMM per batch row and node
    (:func:`fovi_lab.graph.meta.expanded_meta`; fp32 output of a split config), and ``dx[b, c, m]`` sums, in the
    reverse list's order, ``S[b, c*V + rf[n, k], n]`` over the entries ``(n, k)`` that read node ``m``
    (:func:`fovi_lab.kernels.adjoint.staged.make_dx_taps_kernel`). For the stems (Cin = 3), whose transposed layer
    would fill 3 channels of a 64-wide tile: Q = Cin*V output channels fill them, at V / K times the stage's work.
    The batch runs in chunks whose stage and partials fit the staged adjoints' budget (:func:`taps_batch_chunk`);
    each row's dx is its chunk's alone. fp16 operands (the split configs' dtype); bitwise repeatable.

    Args:
        meta: the layer's :class:`TrainingMeta`.
        grad_y: ``[B, Cout, Nout]`` fp16.
        weight: ``[Cout, Q]`` fp16.
        config: a split tensor-core forward config for the tap-expanded layer; None: :func:`select_taps_config`.

    Raises:
        RuntimeError: where the kernels cannot launch on this device (the caller falls back).
    """
    from fovi_lab.kernels.adjoint.staged_build import get_grad_kernel
    from fovi_lab.kernels.adjoint.staged_plans import _launch
    validate_meta(meta)
    check_tensor("grad_y", grad_y, dtype=torch.float16)
    check_grad_args(meta, grad_y, weight=weight)
    meta = meta.to(grad_y.device)
    b, dev = grad_y.shape[0], str(grad_y.device)
    red = get_grad_kernel("csr", "dx_taps", grad_y.device)
    if red is None:
        raise RuntimeError("the tap-expanded reduction (dx_taps) cannot launch on this device")
    me = expanded_meta(meta)
    config = config or select_taps_config(meta, b)
    g = grad_y if grad_y.is_contiguous() else grad_y.contiguous()
    wt = weight.t().contiguous()                                                 # W' [Q, Cout]
    rowptr, taps = warp_ct(meta.rev_rowptr), warp_ct(reverse_taps(meta))
    dx = torch.empty(b, meta.cin, meta.nin, dtype=torch.float32, device=grad_y.device)
    rows = taps_batch_chunk(meta, b)
    for b0 in range(0, b, rows):
        b1 = min(b, b0 + rows)
        s = run_uncached(g[b0:b1], wt, None, me.input_linear, me.weight_linear, config=config,
                         out_dtype=torch.float32)                                # S [rows, Q, Nout]
        _launch(red.kernel, (b1 - b0, meta.cin, meta.nin),
                [rowptr, taps, warp_ct(s.view(b1 - b0, meta.q * meta.nout)), int(meta.v * meta.nout),
                 warp_ct(dx[b0:b1])], dev)
        del s                      # (freed on the stream's order) before the next chunk allocates its own
    return dx


def grad_weight_mma(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor,
                    config: Optional[str] = None, batch_chunk: int = 0) -> torch.Tensor:
    """``dW [Cout, Q]`` fp32 on the tensor-core forward of the tap layer.

    Args:
        meta: the layer's :class:`TrainingMeta`.
        grad_y: ``[B, Cout, Nout]`` fp16 or bf16. x: ``[B, Cin, Nin]`` in grad_y's dtype.
        config: a split tensor-core forward config for the tap layer; None: :func:`select_grad_mma`'s, else
            ``select_mma_split(Cin, Cout)`` (the tap layer's batch rows are the input channels).
        batch_chunk: 0 (one tap layer for the whole batch), or the rows of each chunk: the tap layer of that many
            rows runs once per chunk (the last one padded with zero rows) and the chunks' fp32 outputs are summed
            in chunk order, so dW stays bitwise repeatable.
    """
    validate_meta(meta)
    check_tensor("grad_y", grad_y, dtype=(torch.float16, torch.bfloat16))
    check_grad_args(meta, grad_y, x=x)
    meta = meta.to(grad_y.device)
    b = grad_y.shape[0]
    config = config or select_grad_mma(meta, b, grad_y.dtype)
    if 0 < batch_chunk < b:
        y = _tap_forward_in_chunks(meta, grad_y, x, config, int(batch_chunk))
    else:
        mt = tap_meta(meta, b)
        xt = x.permute(1, 0, 2).contiguous()                              # x' [Cin, B, Nin]
        gt = grad_y.permute(1, 0, 2).reshape(meta.cout, b * meta.nout)   # W' [Cout, B*Nout]
        y = run_uncached(xt, gt, None, mt.input_linear, mt.weight_linear, config=config, out_dtype=torch.float32)
    return y.permute(1, 0, 2).reshape(meta.cout, meta.q)                 # [Cin, Cout, V] -> [Cout, Cin*V]


def _tap_forward_in_chunks(meta: TrainingMeta, grad_y: torch.Tensor, x: torch.Tensor, config: Optional[str],
                           rows: int) -> torch.Tensor:
    """The tap layer's forward ``[Cin, Cout, V]`` fp32 over the batch in chunks of ``rows`` (zero rows pad the
    last), summed in chunk order."""
    b, chunks = grad_y.shape[0], -(-grad_y.shape[0] // rows)
    mt = tap_meta(meta, rows)

    def per_chunk(t: torch.Tensor) -> torch.Tensor:      # [B, C, N] -> [chunks, C, rows, N], zero rows past B
        c, n = t.shape[1], t.shape[2]
        if chunks * rows == b:
            return t.reshape(chunks, rows, c, n).permute(0, 2, 1, 3).contiguous()
        out = t.new_zeros((chunks, c, rows, n))
        whole = b // rows
        if whole:
            out[:whole] = t[:whole * rows].reshape(whole, rows, c, n).permute(0, 2, 1, 3)
        out[whole, :, :b - whole * rows] = t[whole * rows:].permute(1, 0, 2)
        return out

    xt = per_chunk(x)                                                     # x' chunks [Cin, rows, Nin]
    gt = per_chunk(grad_y).reshape(chunks, meta.cout, rows * meta.nout)  # W' chunks [Cout, rows*Nout]
    y = None
    for i in range(chunks):
        part = run_uncached(xt[i], gt[i], None, mt.input_linear, mt.weight_linear, config=config,
                            out_dtype=torch.float32)
        y = part if y is None else y.add_(part)
    return y
