"""Notebook 04, the adjoints as forwards: a check of both tensor-core adjoints against the oracle, and what the
derived layers pay in padding on the real layers (:mod:`fovi_lab.kernels.adjoint.as_forward`)."""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from fovi_lab import lab as kl
from fovi_lab.graph.layers import LAYERS, layer_meta
from fovi_lab.graph.meta import SYNTHETIC_SHAPES, build_meta, synthetic_graph, tap_meta, transposed_meta
from fovi_lab.ops.reference import oracle_forward

__all__ = ["check", "padding_rows", "padding_table"]


def check(shape: str = "ODD", batch: int = 17, dtype=torch.float16, device=None, seed: int = 3) -> List[str]:
    """Pass/fail lines of the tensor-core dx and dW on a synthetic shape against autograd through the fp32
    oracle on the same rounded operands (tolerance ``1e-4 * (1 + max |oracle|)``: fp32 accumulation of exact
    products), and whether a second run is bitwise identical."""
    from fovi_lab.kernels.adjoint.as_forward import grad_input_mma, grad_weight_mma
    device = torch.device(device or "cpu")
    cin, cout, nin, nout, k, v, pads = SYNTHETIC_SHAPES[shape]
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin, device=device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, cin, nin, generator=gen).to(device, dtype)
    w = (torch.randn(cout, cin * v, generator=gen) / (cin * k) ** 0.5).to(device, dtype)
    g = torch.randn(batch, cout, nout, generator=gen).to(device, dtype)
    xf, wf = x.float().requires_grad_(), w.float().requires_grad_()
    dx_o, dw_o = torch.autograd.grad(oracle_forward(xf, wf, None, meta.idx, meta.rf_index, v), (xf, wf), g.float())
    dx, dw = grad_input_mma(meta, g, w), grad_weight_mma(meta, g, x)
    lines = []
    for name, got, want in (("dx, forward of the transposed layer", dx, dx_o), ("dW, forward of the tap layer", dw, dw_o)):
        tol = 1e-4 * (1.0 + float(want.abs().max()))
        lines.append(kl.parity_line(f"{name} ({shape}, B={batch}, {str(dtype)[6:]}) vs the fp32 oracle",
                                    float((got - want).abs().max()), tol, coarse=True))
    same = torch.equal(dx, grad_input_mma(meta, g, w)) and torch.equal(dw, grad_weight_mma(meta, g, x))
    lines.append(f"fp32 outputs: {dx.dtype == dw.dtype == torch.float32}; bitwise identical on a second run: {same}")
    return lines


def padding_rows(layers: Optional[Sequence[str]] = None) -> List[dict]:
    """Per real layer: the transposed layer's lists (input nodes, largest in-degree, slots over real entries) and
    the tap layer's (taps, longest list, slots over real entries)."""
    rows = []
    for name in layers or LAYERS:
        meta = layer_meta(name)
        real = int((meta.idx < meta.nin).sum())
        t, taps = transposed_meta(meta), tap_meta(meta, 1)
        rows.append(dict(layer=name, nin=meta.nin, in_degree_max=t.k, dx_padding=t.nout * t.k / real,
                         v=meta.v, tap_max=taps.k, dw_padding=taps.nout * taps.k / real))
    return rows


def padding_table(layers: Optional[Sequence[str]] = None) -> str:
    """:func:`padding_rows` as text (two decimals)."""
    head = f"{'layer':15s} {'Nin':>5s} {'max in':>6s} {'dx slots/real':>13s}   {'V':>4s} {'max tap':>7s} {'dW slots/real':>13s}"
    return "\n".join([head] + [f"{r['layer']:15s} {r['nin']:5d} {r['in_degree_max']:6d} {r['dx_padding']:13.2f}   "
                               f"{r['v']:4d} {r['tap_max']:7d} {r['dw_padding']:13.2f}" for r in padding_rows(layers)])
