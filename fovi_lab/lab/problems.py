"""Problems for the notebooks: a real layer (or a synthetic test shape) at any batch and Cout, with its
fp32 reference forward and gradients.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from fovi_lab.graph.layers import SYNTHETIC, layer_graph, resolve_layer
from fovi_lab.graph.meta import TrainingMeta, build_meta, synthetic_graph


#: The fp32 oracle materialises ``[B, Cin, Nout, max(K, V)]``; above this many elements the chunked
#: ``CompactTorchOps`` in fp32 is the reference instead (same math, bounded memory).
ORACLE_MAX_ELEMS = 4e7


@functools.lru_cache(maxsize=32)
def _meta_cached(layer: str, cout: Optional[int], rf: Optional[str], nodes: Optional[int], seed: int) -> TrainingMeta:
    if layer not in SYNTHETIC:
        spec, rf = resolve_layer(layer, rf)
        g = layer_graph(spec.name, rf)
        cin, nin, v = spec.cin, g.nin, g.v
        cout = spec.cout if cout is None else cout
        if nodes is None or nodes >= g.nout:
            return g.meta(cin, cout)
        idx, rf_index = g.idx, g.rf_index
    else:
        cin, c0, nin, nout, k, v, pads = SYNTHETIC[layer]
        cout = c0 if cout is None else cout
        idx, rf_index = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    if nodes is not None:
        idx, rf_index = idx[:nodes], rf_index[:nodes]
    return build_meta(idx, rf_index, cin=cin, cout=cout, v=v, nin=nin)


def make_meta(layer: str, cout: Optional[int] = None, rf: Optional[str] = None, nodes: Optional[int] = None,
              seed: int = 0, device=None) -> TrainingMeta:
    """Index tables of a real fovi layer (``LAYERS``, or a variant such as ``"res18_stem_rf2"``) or a
    synthetic test shape (``"MAIN"``, ``"ODD"``, ``"PAD_HEAVY"``), with ``cout`` output channels (default:
    the layer's) and only the first ``nodes`` output nodes when given (a sub-layer with the same Cin, Nin,
    K, V: how the CPU widget clamps). ``rf`` None: the layer's network frame (see :mod:`fovi_lab.graph.layers`)."""
    meta = _meta_cached(str(layer), None if cout is None else int(cout), None if rf is None else str(rf),
                        None if nodes is None else int(nodes), int(seed))
    return meta if device is None else meta.to(device)


@dataclass
class Problem:
    """One layer's operands in fp16 on ``device``: ``x [B, Cin, Nin]``, ``weight [Cout, Q]``,
    ``bias [Cout]`` (or None), ``grad_y [B, Cout, Nout]``, and the meta."""

    layer: str
    meta: TrainingMeta
    x: torch.Tensor
    weight: torch.Tensor
    bias: Optional[torch.Tensor]
    grad_y: torch.Tensor
    device: str

    @property
    def batch(self) -> int:
        return int(self.x.shape[0])


def make_problem(layer: str, batch: int, cout: Optional[int] = None, rf: Optional[str] = None, seed: int = 0,
                 device: str = "cpu", nodes: Optional[int] = None, bias: bool = True) -> Problem:
    """Random fp16 operands for ``layer`` (Kaiming-scaled weights so outputs are O(1)), reproducible."""
    meta = make_meta(layer, cout, rf, nodes, seed)
    g = torch.Generator().manual_seed(1000 + seed)
    b = int(batch)
    x = torch.randn(b, meta.cin, meta.nin, generator=g)
    w = torch.randn(meta.cout, meta.q, generator=g) * math.sqrt(2.0 / (meta.cin * meta.k))
    bb = 0.1 * torch.randn(meta.cout, generator=g) if bias else None
    gy = torch.randn(b, meta.cout, meta.nout, generator=g)
    dev = torch.device(device)
    h = lambda t: None if t is None else t.to(dev, torch.float16).contiguous()  # noqa: E731
    return Problem(str(layer), meta.to(dev), h(x), h(w), h(bb), h(gy), str(device))


def reference_forward(meta: TrainingMeta, x, weight, bias) -> Tuple[torch.Tensor, str]:
    """The fp32 reference output and its name: the oracle (gather + one-hot binning + einsum) when it
    fits in memory, else ``CompactTorchOps`` in fp32 (the same sum, chunked)."""
    from fovi_lab.ops.reference import CompactTorchOps, oracle_forward
    b = x.shape[0]
    xf, wf = x.float(), weight.float()
    bf = None if bias is None else bias.float()
    if b * meta.cin * meta.nout * max(meta.k, meta.v) <= ORACLE_MAX_ELEMS:
        return oracle_forward(xf, wf, bf, meta.idx, meta.rf_index, meta.v), "fp32 oracle"
    return CompactTorchOps.forward(meta, xf, wf, bf), "fp32 torch_compact"


def reference_grads(meta: TrainingMeta, x, weight, grad_y, dtype=torch.float32) -> Tuple[torch.Tensor, torch.Tensor, str]:
    """``(dx, dW, name)``: torch autograd through the oracle in ``dtype`` when it fits, else the explicit
    ``CompactTorchOps`` adjoints in ``dtype``."""
    from fovi_lab.ops.reference import CompactTorchOps, oracle_forward
    b = x.shape[0]
    if b * meta.cin * meta.nout * max(meta.k, meta.v) <= ORACLE_MAX_ELEMS:
        xr = x.detach().to(dtype).requires_grad_()
        wr = weight.detach().to(dtype).requires_grad_()
        y = oracle_forward(xr, wr, None, meta.idx, meta.rf_index, meta.v, dtype=dtype)
        dx, dw = torch.autograd.grad(y, (xr, wr), grad_y.to(dtype))
        names = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16"}
        return dx, dw, f"torch autograd of the {names.get(dtype, str(dtype))} oracle"
    gy = grad_y.to(dtype)
    return (CompactTorchOps.grad_input(meta, gy, weight.to(dtype)),
            CompactTorchOps.grad_weight(meta, gy, x.to(dtype)),
            f"{'fp32' if dtype == torch.float32 else str(dtype)} torch_compact adjoints")
