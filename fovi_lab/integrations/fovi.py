"""fovi_lab's backends inside fovi: :func:`register_with_fovi` and its reverse, :func:`unregister_from_fovi`.

fovi runs the compact backends of its ``KNNConvLayer`` through one registry,
``fovi.arch.knn_autograd.OPS_REGISTRY`` (name -> ops object), from its own autograd Function
(``fovi.arch.knn_autograd.KNNConvFunction``). The contract is the one :mod:`fovi_lab.ops.registry` states,
called with fovi's ``TrainingMeta`` instead of fovi_lab's::

    forward(meta, x, weight, bias)        -> y  [B, Cout, Nout]   (compute dtype; inputs contiguous)
    grad_input(meta, grad_y, weight)      -> dx [B, Cin, Nin]     fp32
    grad_weight(meta, grad_y, x)          -> dW [Cout, Cin*V]     fp32
    backward_combined(meta, g, x, weight) -> (dx, dW)             optional; fovi uses it when both are needed

:func:`register_with_fovi` puts an adapter there that hands a fovi_lab backend fovi_lab's meta of the same layer.
That meta is rebuilt from fovi's tables (the neighbour ids and taps are channel 0's columns of fovi's
``input_linear`` / ``weight_linear``) with :func:`fovi_lab.graph.meta.build_meta`, and every table it derives
(``input_linear``, ``weight_linear``, ``rev_rowptr``, ``rev_col``) must equal fovi's, else the call raises
``ValueError`` naming the table and no kernel runs. It is built once per fovi meta and kept on it
(``_fovi_lab_meta``), so it lives as long as fovi's own cache of the layer's tables.

fovi's dispatch stays fovi's: ``fovi.arch.knn_optimization.select_backend`` sends a layer with
``kernel_backend="warp_train"`` to the registry only for CUDA tensors in float16 (or under float16 autocast),
and refuses it elsewhere; the adapter changes which code runs under the name, not when fovi picks it. An entry
under a name fovi's layers do not know is reached through ``fovi.arch.knn_autograd.compact_forward(layer, x,
ops_name=name)``, fovi's layer-level entry point to the registry (the same Function, without the dispatch).

fovi imports the module that registers ``warp_train`` (``fovi.arch.knn_warp``; likewise ``cuda``,
``gather_gemm``) lazily, at the first forward that selects it, and that import writes fovi's own entry. So
:func:`register_with_fovi` imports it first (when it can be imported), and the entry it then writes stays.

fovi is an optional dependency: ``pip install "fovi-lab[fovi]"`` brings the pure-Python modules ``fovi.arch``
imports, and ``pip install --no-deps fovi==2.4.0`` fovi itself, without its CUDA-only (cupy-cuda12x) and
training-only (torchvision) dependencies.

**fovi's networks.** :func:`fovi_network` builds fovi's own ``KNNAlexNet`` and ``KNNResNet`` (ResNet-18) from
``fovi.models``; :func:`fovi_backend` sets the kernel backend of every KNN conv layer of a network by fovi's name,
and :func:`fovi_lab_inside` runs them on a fovi_lab backend through fovi's registry: on CUDA in float16 (or under
float16 autocast) as fovi's own ``kernel_backend="warp_train"`` (what :func:`register_with_fovi` is for), elsewhere
(where fovi's dispatch refuses ``warp_train``) through ``compact_forward`` under a name of its own.

This module gives the names of three: :mod:`fovi_lab.integrations.fovi_registry` (the registry adapter),
:mod:`fovi_lab.integrations.fovi_networks` (fovi's networks and the contexts that change their layers) and
:mod:`fovi_lab.integrations.fovi_layers` (fovi's layers for the benchmarks, and the ``fovi:`` layer names).
"""

from __future__ import annotations

from fovi_lab.integrations.fovi_registry import (_fovi, _lab_meta, INSTALL, register_with_fovi,  # noqa: F401
                                                 TESTED_RELEASE, unregister_from_fovi)
from fovi_lab.integrations.fovi_networks import (conv_layers, fovi_backend, fovi_lab_inside, fovi_network,
                                                 knn_stubbed, lab_metas, NETWORKS)
from fovi_lab.integrations.fovi_layers import (_expand_with_fovi, BASELINE_BACKENDS,  # noqa: F401
                                               expand_network_layers, fovi_forwards, fovi_layer, fovi_steps,
                                               FoviSteps, NETWORK_LAYER_PREFIX, NETWORK_RES, network_layer_meta,
                                               network_layers)

__all__ = ["register_with_fovi", "unregister_from_fovi", "TESTED_RELEASE", "INSTALL", "NETWORKS", "fovi_network",
           "conv_layers", "fovi_backend", "fovi_lab_inside", "knn_stubbed", "fovi_layer", "BASELINE_BACKENDS",
           "fovi_steps", "fovi_forwards", "FoviSteps", "lab_metas", "NETWORK_LAYER_PREFIX", "NETWORK_RES",
           "network_layers", "network_layer_meta", "expand_network_layers"]
