"""The fused adjoints' division of work: into how many segments or splits their lists are cut, by default.

The fused dx walks each input node's reverse list, the fused dW each tap's list. A list is cut into segments of at
most ``L`` steps (kernels ``dxs`` / ``dws``: :func:`default_dx_seg_steps`, :func:`default_dw_seg_steps`,
:func:`dw_seg_steps_for`) or, for dW, into ``S`` interleaved splits (kernel ``dwn``: :func:`default_dw_nsplit`), each
part writing an fp32 partial within the partial budget (``FOVI_KNN_FUSED_PARTIAL_MIB``). :func:`list_stats` gives the
lists' lengths the rules read, computed once per meta on the host.
"""

from typing import Optional, Tuple

import torch

from fovi_lab.graph.meta import TrainingMeta, pad_to
from fovi_lab.kernels.adjoint.fused import (WAVE_CTAS, config_tiles, _budget_bytes, segment_table,
                                            select_dx_nm_config)
from fovi_lab.kernels.adjoint.fused_build import _aux, reverse_lists, tap_lists


def _segments(meta: TrainingMeta, which: str, rowptr: torch.Tensor, steps_per_entry: int, seg_steps: int,
              partial_bytes: int = 0):
    """:func:`segment_table` of one meta's lists, cached with the meta. ``partial_bytes``: the fp32 partial
    of one segment; a table whose partials would exceed 4x the partial budget
    (``FOVI_KNN_FUSED_PARTIAL_MIB``, 64 MiB by default) is refused with a clear error (the default rules
    never ask for one; an explicit short ``seg_steps`` on a big layer could)."""
    aux = _aux(meta)
    key = ("nm_seg", which, int(steps_per_entry), int(seg_steps))
    got = aux.get(key)
    if got is None:
        got = aux[key] = segment_table(rowptr, steps_per_entry, seg_steps)
    nseg = got[0].numel() - 1
    if partial_bytes and nseg * partial_bytes > 4 * _budget_bytes():
        raise ValueError(
            f"seg_steps: {seg_steps} steps per segment cut this layer's {which} lists into {nseg} segments, "
            f"{nseg * partial_bytes / 2**20:.0f} MiB of fp32 partials, over 4x the partial budget "
            f"({_budget_bytes() / 2**20:.0f} MiB, FOVI_KNN_FUSED_PARTIAL_MIB); use longer segments or "
            f"seg_steps=None for the rule")
    return got


def _default_nsplit(meta: TrainingMeta, n_tiles: int, maxlen: int, device: str, part_bytes: int,
                    batch: int = 0) -> int:
    """How many ways to split each tap's list (H200 sweep: splitting 8-16 ways was fastest on every layer
    with few taps x tiles, res18 layer1's dW at B=64 among them, and close to the best elsewhere: the fused
    sweep of 2026-11-29 in fovi_lab/records/h200/train_step.jsonl.gz and fovi_lab/records/h200/fused_sweep.jsonl.gz),
    bounded by the partial-sum budget (one ``[V, Cout, Cin]`` fp32 partial per split) and by the longest list.
    Unsplit when the lists are short (under 4 entries per tap on average: res18 layer3/3_0/4_0) at B <= 128, where
    splitting bought nothing in the sweep and each split costs a dW-sized partial. 1 on the CPU."""
    if not device.startswith("cuda"):
        return 1
    if meta.nnz < 4 * meta.v and batch <= 128:
        return 1
    want = 16 if meta.v * n_tiles < WAVE_CTAS else 8
    cap = max(1, _budget_bytes() // max(1, part_bytes))
    s = max(1, min(want, cap, max(1, maxlen)))
    return 1 << (s.bit_length() - 1)                  # a power of two


def default_dw_nsplit(meta: TrainingMeta, batch: int, tiles, device: str) -> int:
    """The interleaved splits per tap of the fused dW with ``tiles`` (``(to, tc, tkb, block)``) by default
    (:func:`_default_nsplit` on the layer's tap lists and its padded tile counts)."""
    to, tc = tiles[:2]
    op, cp = pad_to(meta.cout, to), pad_to(meta.cin, tc)
    n_tiles = (op // to) * (cp // tc)
    return _default_nsplit(meta, n_tiles, tap_lists(meta)[3], device, 4 * meta.v * op * cp, batch=batch)


def list_stats(meta: TrainingMeta, which: str) -> Tuple[float, int, int, int]:
    """``(mean, longest, total, non-empty)`` entry counts of the meta's reverse lists (``which="dx"``) or
    tap lists (``"dw"``), computed once per meta on the host: the default rules run on every call,
    also inside CUDA-graph capture, where reading a device tensor back would break the capture."""
    aux = _aux(meta)
    key = ("nm_list_stats", which)
    got = aux.get(key)
    if got is None:
        rowptr = (reverse_lists(meta)[0] if which == "dx" else tap_lists(meta)[0]).to("cpu", torch.int64)
        lens = rowptr[1:] - rowptr[:-1]
        busy = lens[lens > 0]
        got = aux[key] = ((float(busy.float().mean()), int(busy.max()), int(busy.sum()), int(busy.numel()))
                          if busy.numel() else (0.0, 0, 0, 0))
    return got


#: The shortest longest-list (entries) for which uneven reverse lists call for dx segments.
_DX_UNEVEN_MIN_ENTRIES = 3


def default_dx_seg_steps(meta: TrainingMeta, batch: int, device: str) -> int:
    """Segment length (steps) of the fused dx by default; 0: whole reverse lists.

    The H200 sweep (``fovi_lab/records/h200/fused_sweep.jsonl.gz``) found segments faster where the reverse lists
    are uneven (longest >= 1.5x the mean: the stride-2 layers res18 layer2_0/3_0, 1-4
    readers per input node) or long while the whole-list grid is small (mean >= 12 steps and under 256
    CTAs of 64x64 tiles, 1024 of 16x16: res18 layer2/3, alexnet L2). Elsewhere whole
    lists tied or won (alexnet L1/L3/L4, res18 layer1, every layer at B = 512, where the grid is big
    and the partials are pure cost). A segment takes about a quarter of the mean list, in whole entries
    (a multiple of the Cout chunks) and at least 4 steps: the best or close to it in the sweep. 0 on the
    CPU, for B > 128 and for the stems.

    "Uneven" also needs a longest list of at least ``_DX_UNEVEN_MIN_ENTRIES`` = 3 entries: the sweep saw
    segments pay on lists of 1-4 entries, never on a longest list of 2, where they save at most one entry
    per CTA. That is res18 layer4_0 (11 reverse lists of one entry, one of two); the sweep measured whole
    lists there ahead of the best segments at B = 64 (on tables whose reverse lists all had one entry)."""
    if not str(device).startswith("cuda") or batch > 128 or meta.cin <= 16:
        return 0
    tm, tn, tk, _ = config_tiles("dxs", select_dx_nm_config(batch, meta.cin, meta.nin, segments=True))
    n_oc = pad_to(meta.cout, tk) // tk
    mean, longest, _, _ = list_stats(meta, "dx")
    if longest == 0:
        return 0
    mean_steps = mean * n_oc
    grid = meta.nin * -(-batch // tm) * -(-meta.cin // tn)
    small = 1024 if tm == 16 and tn == 16 else 256
    uneven = longest >= 1.5 * mean and longest >= _DX_UNEVEN_MIN_ENTRIES
    if not uneven and not (mean_steps >= 12 and grid < small):
        return 0
    return max(4, n_oc * max(1, int(round(mean_steps / (4 * n_oc)))))


def _dw_seg_target_ctas(batch: int) -> int:
    """CTAs the dW segments aim for: 512 at B <= 64, 1024 above (the H200 sweep: the fastest dW op, kernel and
    finish, or close to it on every res18 layer: fovi_lab/records/h200/fused_sweep.jsonl.gz)."""
    return 512 if batch <= 64 else 1024


def default_dw_seg_steps(meta: TrainingMeta, batch: int, tiles, device: str, target: Optional[int] = None) -> int:
    """Segment length (steps) of the fused dW by default; 0: the interleaved splits (:func:`_default_nsplit`).

    Interleaved splits give each tap ``S`` CTAs whatever its list's length, so the longest tap sets the
    time when there are few tap x tile CTAs (res18: 36 taps, 1-32 tiles; lists of 23-95 pairs in layer1)
    or the lists are short (res18 layer3/3_0/4_0: under 4 pairs per tap on average, 24 of layer4_0's 36
    taps empty; an interleaved CTA with no pair still stores a partial). Segments of ``L`` equal steps there ran
    faster on the H200 (res18 layer1 at B=512 and layer4_0 among them: fovi_lab/records/h200/fused_sweep.jsonl.gz).
    With many tap x tile CTAs (alexnet L1-L4: 800-1300) the interleaved splits tied or won narrowly with their
    cheaper finish, so they stay. ``L`` aims at ``target`` CTAs (:func:`_dw_seg_target_ctas`), bounded by the
    partial-sum budget (one ``[Op, Cp]`` fp32 partial per segment). 0 on the CPU and for the stems."""
    if not str(device).startswith("cuda") or meta.cin <= 16:
        return 0
    to, tc = tiles[:2]
    n_tiles = (pad_to(meta.cout, to) // to) * (pad_to(meta.cin, tc) // tc)
    if meta.v * n_tiles >= 512 and meta.nnz >= 4 * meta.v:
        return 0
    return dw_seg_steps_for(meta, batch, tiles, target or _dw_seg_target_ctas(batch))


def dw_seg_steps_for(meta: TrainingMeta, batch: int, tiles, target: int) -> int:
    """The dW segment length that gives about ``target`` CTAs (all tiles), within the partial budget."""
    to, tc, tkb, _ = tiles
    op, cp = pad_to(meta.cout, to), pad_to(meta.cin, tc)
    n_tiles = (op // to) * (cp // tc)
    _, _, entries, busy = list_stats(meta, "dw")
    n_bc = -(-pad_to(batch, 8) // tkb)
    total = entries * n_bc
    if total == 0:
        return 1
    want = max(1, int(target) // n_tiles)
    cap = max(1, _budget_bytes() // (4 * op * cp) - busy)
    return max(1, -(-total // min(want, cap)))
