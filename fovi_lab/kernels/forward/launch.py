"""How a forward plan launches: :class:`Plan`, the output's store, and the recorded launches behind ``plan.launch()``.

A plan's output goes straight into ``y`` (``store="direct"``, up to :data:`DIRECT_STORE_MAX_BYTES`) or through a
contiguous buffer and one permute-copy (``store="staged"``): :func:`store_mode`. Its kernel launch is recorded once
per (kernel, device, grid) and launched again with only the parameters that changed re-set (:func:`_launcher`), which
keeps the host time of a small call low.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Dict, Optional, Tuple

import torch

from fovi_lab.kernels.common import warp_stream, wp


# Outputs up to this size are stored straight into y (one fewer allocation and launch: faster at <= 2 MB on
# the H200); larger ones through the contiguous staging buffer (even or faster, e.g. the DINOv3 patch embed at
# B=512; the ``warp_uncached_direct`` / ``warp_uncached_staged`` rows of fovi_lab/records/h200/forward.jsonl.gz).
DIRECT_STORE_MAX_BYTES = 4 << 20


def store_mode(store: Optional[str], out_bytes: int = 0) -> str:
    """The output store of a forward call: ``store`` when given, else ``"direct"`` for outputs up to
    :data:`DIRECT_STORE_MAX_BYTES` and ``"staged"`` above."""
    mode = store or ("direct" if out_bytes <= DIRECT_STORE_MAX_BYTES else "staged")
    if mode not in ("staged", "direct"):
        raise ValueError(f"store: expected 'staged' or 'direct', got {mode!r}")
    return mode


class Plan:
    """Prepared operands of one forward call: ``launch()`` runs the kernel into ``out``,
    ``finish()`` returns ``y [B, Cout, Nout]``."""

    def __init__(self, launch, out, finish):
        self.launch = launch
        self.out = out
        self.finish = finish


def _output(b: int, cout: int, nout: int, device, store: str):
    """(kernel view [Nout, B, Cout], finish) for the two store modes."""
    if store == "direct":
        y = torch.empty(b, cout, nout, dtype=torch.float16, device=device)
        return y.permute(2, 0, 1), (lambda: y)
    ys = torch.empty(nout, b, cout, dtype=torch.float16, device=device)
    return ys, (lambda: ys.permute(1, 2, 0).contiguous())


_launch_lock = threading.Lock()
_LAUNCHES: Dict[Tuple, list] = {}


def _launcher(kernel, dims, inputs, block_dim: int, device: str, tiled: bool = True):
    """A closure launching ``kernel`` on torch's current stream of ``device`` (looked up per launch);
    ``tiled=False``: a plain SIMT launch of ``dims`` threads (the ``simt`` family).

    Launch overhead is host time, and at small batch the host is the bottleneck (one op is a fraction of a
    millisecond of GPU work, fovi_lab/records/h200/forward.jsonl.gz; the host side of a call is in
    fovi_lab/records/h200/logs/host_probe_*.json): so one recorded ``wp.Launch`` is kept per (kernel, device, grid)
    and only the parameters that changed since its last use (new x / y buffers, ints) are re-packed
    (:func:`_relaunch`).
    """
    key = (kernel, device, dims, block_dim, tiled)

    def launch():
        stream = warp_stream(device)
        with _launch_lock:
            ent = _LAUNCHES.get(key)
            if ent is None and len(_LAUNCHES) > 512:
                _LAUNCHES.clear()
            _LAUNCHES[key] = _relaunch(ent, kernel, dims, inputs, block_dim, device, tiled, stream)
    return launch


def _relaunch(ent, kernel, dims, inputs, block_dim: int, device: str, tiled: bool, stream) -> list:
    """Launch ``kernel`` with ``inputs`` through a recorded launch: ``ent = [wp.Launch, last inputs]`` or
    None (recorded now). Only the parameters that changed since the last launch are re-set: array
    descriptors (ctypes structures, :func:`~fovi_lab.kernels.common.warp_ct`) without re-packing. Returns
    ``ent``. The caller holds the lock that keeps set-and-launch of one recorded launch together."""
    if ent is None:
        launch_fn = wp.launch_tiled if tiled else wp.launch
        cmd = launch_fn(kernel, dim=dims, inputs=inputs, block_dim=block_dim, device=device, record_cmd=True)
        ent = [cmd, list(inputs)]
    else:
        cmd, last = ent
        for i, v in enumerate(inputs):
            u = last[i]
            if v is u:
                continue
            if isinstance(v, ctypes.Structure):         # a warp_ct descriptor: no re-packing
                cmd.set_param_at_index_from_ctype(i, v)
            elif isinstance(v, wp.array) or v != u:
                cmd.set_param_at_index(i, v)
            last[i] = v
    cmd.launch(stream=stream)
    return ent
