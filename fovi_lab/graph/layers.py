"""The real fovi layer shapes as data (docs/operator.md §5).

Every KNN-conv layer of fovi's foveated AlexNet, ResNet-18 and DINOv3 patch embed is, for the
kernels, a handful of integers (Cin, Cout, Nin, Nout, K, V) plus two index tables. This module
lists those layers (:data:`LAYERS`, name -> :class:`LayerSpec`) and regenerates their graphs with
:func:`fovi_lab.graph.geometry.foveated_knn_graph`, so benchmarks and notebooks run on the true
geometry (locality, reuse, padding) rather than on random tables.

All layers: fov = 16 degrees, resource matching to a 64x64 Cartesian budget (res = 64), style
isotropic, ``sample_cortex=True``. A stride-``s`` grid is matched to ``(64/s)²`` points, so the
grids of a=0.5 are 4085 (stride 1), 964 (2), 230 (4), 60 (8), 16 (16) and 2 (32) nodes; a max-pool
"964 -> 230" between layers therefore shows up here as a layer whose input grid has stride 4.

``rf`` is the reference frame: ``"rf2"`` (``ref_frame_mult=2``, ``V = ceil(2 sqrt K)²`` ~ 4K,
almost no tap collisions; the compact operator's home ground) or ``"rf1"`` (``V = ceil(sqrt K)²``,
``V = K`` for square K, ~22-26 % collisions). Each layer has the frame its network builds it with
(:attr:`LayerSpec.rf`): rf2 everywhere except the ResNet-18 stem, which the network builds on rf1
(its stem is not given the doubled frame), so ``res18_stem`` has ``V = 49``.

**Variants.** The other frame of a layer is a *variant*, named ``<layer>_<rf>``: ``res18_stem_rf2``
is the ResNet-18 stem on the doubled frame (``V = 196``), ``alex_L1_rf1`` AlexNet's conv1 with
``V = K``. :func:`layer_graph`, :func:`layer_meta` and :func:`layer_shape` accept those names, and
:func:`layer_name` gives the name of a (layer, frame) pair; :data:`LAYERS` lists the real layers only.

**DINOv3 patch embed (approximation).** fovi's ``KNNPartitioningPatchEmbedding`` (S+, a = 2.79,
Cout 384, bias) takes K from a partition of the input nodes (the largest cell) with a geodesic
neighbour ranking; docs/operator.md §5 lists K = 101 and 64 output nodes. Here it is modelled as a plain
cortical-Euclidean KNN layer with K = 101, an output grid matched to 8x8 = 64 points (stride 8,
which gives exactly 64 nodes for a = 2.79; the input grid has 3976) and an explicit reference
side 16 (V = 256, the 16x16 patch kernel) whatever ``rf`` says. Shapes (Cin, Cout, Nin, Nout, K,
V, P, P64, Q) match the spec; the pad share does **not**: this KNN gives 13.2 % pad entries (the
8x8 grid's outer ring sits on the FoV edge, half of a 101-neighbourhood there is outside) where
the spec quotes 1.6 % for the partitioning embed. Use it for kernel shapes, not for pad statistics.
"""

from __future__ import annotations

import os
import tomllib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional, Tuple

from fovi_lab.graph.geometry import KNNGraph, foveated_knn_graph
from fovi_lab.graph.meta import SYNTHETIC_SHAPES, TrainingMeta, build_meta, pad_to, synthetic_graph

__all__ = [
    "LayerSpec", "LAYERS", "RF_MULT", "layer_graph", "layer_meta", "layer_shape", "layer_name", "resolve_layer",
    "base_layer", "RECORDED_LAYERS", "graph_digests",
    "SYNTHETIC", "synthetic_meta", "FOV", "RES",
]

FOV = 16.0
RES = 64

#: ``rf`` name -> ``ref_frame_mult``.
RF_MULT = {"rf1": 1.0, "rf2": 2.0}

#: fovi's synthetic test shapes ``name -> (cin, cout, nin, nout, k, v, pads)`` (re-export).
SYNTHETIC = SYNTHETIC_SHAPES


@dataclass(frozen=True)
class LayerSpec:
    """One fovi KNN-conv layer.

    Attributes:
        name: key in :data:`LAYERS`.
        cin, cout: channels.
        a: magnification parameter of the model's grids.
        in_stride, out_stride: grid strides relative to the 64x64 budget (input grid matched to
            ``(64/in_stride)²`` points, output to ``(64/out_stride)²``).
        k: neighbours per output node (before clipping to Nin).
        bias: whether the layer has a bias.
        description: where the layer sits in its model.
        ref_side: explicit reference-grid side (overrides ``rf``), or None.
        spec_pad_pct: the reference model's pad share (percent, docs/operator.md §5), for comparison.
        rf: the reference frame the network builds the layer with (``"rf1"`` or ``"rf2"``).
    """

    name: str
    cin: int
    cout: int
    a: float
    in_stride: int
    out_stride: int
    k: int
    bias: bool
    description: str
    ref_side: Optional[int] = None
    spec_pad_pct: Optional[float] = None
    rf: str = "rf2"


def _load_layers() -> "OrderedDict[str, LayerSpec]":
    """The layer table ``layers.toml`` (package data beside this module), in its order."""
    with open(os.path.join(os.path.dirname(__file__), "layers.toml"), "rb") as f:
        return OrderedDict((name, LayerSpec(name=name, **fields)) for name, fields in tomllib.load(f).items())


#: name -> :class:`LayerSpec` of every real layer (the variants ``<layer>_<rf>`` are not listed).
LAYERS: "OrderedDict[str, LayerSpec]" = _load_layers()


def _mult(rf: str) -> float:
    try:
        return RF_MULT[rf]
    except KeyError:
        raise ValueError(f"rf: expected one of {sorted(RF_MULT)} or None (the network's frame), got {rf!r}") from None


def resolve_layer(name: str, rf: Optional[str] = None) -> Tuple[LayerSpec, str]:
    """``(spec, rf)`` of a layer or variant name and an optional frame.

    ``name`` is a key of :data:`LAYERS` (its network's frame unless ``rf`` says otherwise) or a
    variant ``<layer>_<rf>`` (that frame; an ``rf`` argument must then agree).

    Raises:
        KeyError: unknown name. ValueError: unknown ``rf``, or one that contradicts the variant name.
    """
    if not isinstance(name, str):
        raise KeyError(f"layer: expected a layer name (str), got {type(name).__name__}")
    if rf is not None:
        _mult(rf)
    spec = LAYERS.get(name)
    if spec is not None:
        return spec, spec.rf if rf is None else rf
    base, _, frame = name.rpartition("_")
    if base in LAYERS and frame in RF_MULT and LAYERS[base].ref_side is None:
        if rf is not None and rf != frame:
            raise ValueError(f"rf: layer {name!r} is the {frame} variant, got rf={rf!r}")
        return LAYERS[base], frame
    raise KeyError(f"layer: unknown name {name!r}; known: {list(LAYERS)} and their variants "
                   f"'<layer>_rf1' / '<layer>_rf2'")


def layer_name(name: str, rf: Optional[str] = None) -> str:
    """The name of layer ``name`` on frame ``rf``: the layer's own name on its network's frame (and for
    layers with an explicit reference side, where the frame changes nothing), else the variant name
    ``<layer>_<rf>``. ``layer_name("res18_stem", "rf2") == "res18_stem_rf2"``."""
    spec, frame = resolve_layer(name, rf)
    return spec.name if frame == spec.rf or spec.ref_side is not None else f"{spec.name}_{frame}"


def base_layer(name: str) -> str:
    """The key of :data:`LAYERS` that layer or variant ``name`` is built from (``"res18_stem_rf2"`` -> ``"res18_stem"``)."""
    return resolve_layer(name)[0].name


def layer_graph(name: str, rf: Optional[str] = None) -> KNNGraph:
    """The (cached) :class:`~fovi_lab.graph.geometry.KNNGraph` of layer ``name``.

    Args:
        name: a key of :data:`LAYERS` or a variant name (see :func:`resolve_layer`).
        rf: None (the network's frame, :attr:`LayerSpec.rf`), ``"rf2"`` (``ref_frame_mult=2``,
            V ~ 4K) or ``"rf1"`` (V = K for square K). Layers with an explicit ``ref_side`` (the
            DINOv3 patch embed: V = 256) have the same graph on both.
    """
    spec, rf = resolve_layer(name, rf)
    return foveated_knn_graph(fov=FOV, a=spec.a, res=RES, in_stride=spec.in_stride,
                              out_stride=spec.out_stride, k=spec.k, ref_frame_mult=_mult(rf),
                              sample_cortex=True, ref_side=spec.ref_side)


def layer_meta(name: str, rf: Optional[str] = None, device=None) -> TrainingMeta:
    """The compact-operator :class:`~fovi_lab.graph.meta.TrainingMeta` of layer ``name`` (cached); ``rf`` as
    :func:`layer_graph`."""
    spec, rf = resolve_layer(name, rf)
    return layer_graph(spec.name, rf).meta(spec.cin, spec.cout, device=device)


def layer_shape(name: str, rf: Optional[str] = None) -> dict:
    """Sizes of layer ``name``: cin, cout, nin, nout, k, v, p, p64, q, pad_fraction (+ more).

    ``p = cin*k``, ``p64`` = p rounded up to 64, ``q = cin*v``; ``pad_fraction`` is the share of
    (n, k) entries that are the pad token, ``collision_rate`` the share whose tap an earlier
    neighbour of the same node already took. ``rf`` as :func:`layer_graph`; the result's ``rf`` is
    the frame used.
    """
    spec, rf = resolve_layer(name, rf)
    g = layer_graph(spec.name, rf)
    p = spec.cin * g.k
    return {
        "name": layer_name(spec.name, rf), "rf": rf, "cin": spec.cin, "cout": spec.cout, "nin": g.nin,
        "nout": g.nout, "k": g.k, "v": g.v, "p": p, "p64": pad_to(p, 64), "q": spec.cin * g.v,
        "pad_fraction": g.pad_fraction, "collision_rate": g.collision_rate, "bias": spec.bias,
    }


def graph_digests(names=None, rfs=("rf1", "rf2")) -> "OrderedDict[str, str]":
    """``{"<layer>:<rf>": KNNGraph.digest()}`` for every layer of ``names`` (default: all of :data:`LAYERS`)
    on each frame of ``rfs``: the fingerprint of the tables, equal on every machine."""
    return OrderedDict((f"{n}:{rf}", layer_graph(n, rf).digest()) for n in (names or LAYERS) for rf in rfs)


#: The names of the tables every recorded H200 benchmark under ``data/`` ran on: each layer on the rf2
#: frame, so the ResNet-18 stem's records are of the variant ``res18_stem_rf2``.
RECORDED_LAYERS = tuple(layer_name(n, "rf2") for n in LAYERS)


def synthetic_meta(name: str, seed: int = 0, device=None) -> TrainingMeta:
    """Meta of one of fovi's synthetic test shapes (``"MAIN"``, ``"ODD"``, ``"PAD_HEAVY"``).

    Random ``idx`` with ``pads`` entries set to the pad token and random taps
    (:func:`fovi_lab.graph.meta.synthetic_graph`), reproducible from ``seed``.
    """
    try:
        cin, cout, nin, nout, k, v, pads = SYNTHETIC[name]
    except KeyError:
        raise KeyError(f"synthetic: unknown name {name!r}; known: {list(SYNTHETIC)}") from None
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=seed)
    return build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin, device=device)
