"""The forward configs: one frozen :class:`FwdConfig` per named tile configuration, and their variants.

A config name fixes a kernel at compile time (tile sizes are template constants: one Warp module per
config, built lazily and validated once per device, see :mod:`fovi_lab.kernels.forward.build`).

The operator, per output node ``n`` (one small GEMM per node)::

    y[b, o, n] = bias[o] + sum_{p < P64} xpad[b, input_linear[n, p]] * W[o, weight_linear[n, p]]

with ``xpad = [x.reshape(B, Cin*Nin) | 0]`` (the pad column ``Cin*Nin`` reads an exact zero). fp16 operands,
fp32 accumulation, the bias added in fp32 before the one rounding to fp16; ``y [B, Cout, Nout]``.

The variants (``FwdConfig.variant``, the prefix of a config's name; :mod:`fovi_lab.kernels.families` groups
them into families):

* ``gather`` (``m64n64r1b256``): any tables. ``xt = x_flat^T [Cin*Nin, B]`` and ``wt = W^T [Q, Cout]``, so
  each p tile is two indexed row gathers (``tile_load_indexed``); the pad index is one row past the end of
  ``xt`` and reads 0 through the bounds check. ``r2``/``r4``: that many batch tiles share each W tile.
* ``nm`` / ``nms`` (node-major, ``nm_m64n64k128``): tables of the fovi form (``input_linear[n, c*K+k] =
  c*Nin + idx[n, k]``), so with x node-major and W tap-major each neighbour's channel run is a plain
  contiguous tile load, and pad neighbours are skipped. ``nms`` splits the neighbour loop across CTAs into
  fp32 partials summed in a fixed order.
* ``i2c`` / ``i2cg`` (``i2c_m64n96k128``): for Cin < 32 (stems): the rows are staged per call by a SIMT row
  copy and the kernel is a dense tile loop (``i2cg`` keeps W gathered).
* ``simt`` / ``simtp`` / ``simtw`` / ``simts`` / ``simtsw`` / ``simtv`` (``sd_b8o8u4``): no tile GEMM. Each
  thread keeps a ``tile_b x tile_o`` block of y in fp32 registers; ``s`` splits the p loop, ``v`` reads fp32
  operands as vec4, ``p`` prefetches the next step's indices, ``w`` reads W as vectors.
* ``mma`` / ``mmas`` / ``mmaw`` / ``mmasw`` / ``mmat`` / ``mmao`` / ``mmato`` (``mma_o96b16``,
  :mod:`fovi_lab.kernels.forward.mma`): hand-issued ``mma.sync.m16n8k16`` tensor-core MMAs on fragments each
  lane gathers itself. ``s``: p loop split; ``w``: W read in place; ``t``: x^T per call; ``o``: y stored
  through a shared tile; ``k32``/``k64``: 2 or 4 k-steps per iteration.
* ``mmap`` (``mmap_o128b128k16s4``, :mod:`fovi_lab.kernels.forward.mma_pipe`): a CTA per (node, batch block,
  channel block), both operands' gathered rows copied into shared stages by ``cp.async`` (``r`` stages in
  flight), ``ldmatrix`` fragments, ``mma.sync``: for large batches. ``mmaps``: the p range split into fp32
  partials (few-node layers), summed in a fixed order.
* ``cached`` (``c_m32n64``): inference from the effective-weight cache ``Weff[n] [P64, Cout_pad]``.
* dense ceilings (benchmarks only): the same loop over dense operands of the same GEMM sizes.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import fovi_lab.settings as settings
from fovi_lab.kernels.families.registry import family as family_of, lookup
from fovi_lab.kernels.families.table import FwdConfig, _TABLES   # the table and the record each entry reads as


from fovi_lab.kernels.families.table import GATHER_TILE_K as _GATHER_TILE_K   # noqa: E402,F401 (re-exported)


#: name -> (family, tile_m, tile_n, tile_k, r, block_dim): the configs the rules select and warmup builds.
_UNCACHED_BATCH_CONFIG_SPECS: Dict[str, Tuple[str, int, int, int, int, int]] = _TABLES["registered"]
#: Runnable by name for benchmarks and notebooks, never selected (measured, never the fastest on the H200).
_EXPERIMENTAL_CONFIG_SPECS: Dict[str, Tuple[str, int, int, int, int, int]] = _TABLES["experimental"]
#: Inference from the effective-weight cache.
_CACHED_CONFIG_SPECS: Dict[str, Tuple[str, int, int, int, int, int]] = _TABLES["cached"]
#: Configs that exist only to exercise the canary (never selected, never in warmup).
_TEST_CONFIG_SPECS: Dict[str, Tuple[str, int, int, int, int, int]] = _TABLES["canary"]


def config_spec(name: str) -> FwdConfig:
    """The :class:`FwdConfig` registered under ``name`` (uncached, experimental, cached or test)."""
    for table in (_UNCACHED_BATCH_CONFIG_SPECS, _EXPERIMENTAL_CONFIG_SPECS, _CACHED_CONFIG_SPECS,
                  _TEST_CONFIG_SPECS):
        if name in table:
            return FwdConfig(name, *table[name])
    try:                                  # an id derived from a family's parameters (any point of its space)
        point = lookup(name)
    except (TypeError, ValueError) as exc:
        detail = str(exc).split(": ", 1)[1].replace(f"unknown config {name!r}; ", "")
        raise ValueError(f"config: unknown forward config {name!r}: {detail}") from None
    return family_of(point.family).to_config(point, name)


# Every registered config by name (uncached, experimental, cached; not the canary's test configs).
FORWARD: Dict[str, FwdConfig] = {name: FwdConfig(name, *spec) for table in (
    _UNCACHED_BATCH_CONFIG_SPECS, _EXPERIMENTAL_CONFIG_SPECS, _CACHED_CONFIG_SPECS) for name, spec in table.items()}


def uncached_config_names(family: Optional[str] = None, experimental: bool = False):
    """Registered uncached config names (of one family), plus the experimental ones if asked."""
    table = dict(_UNCACHED_BATCH_CONFIG_SPECS)
    if experimental:
        table.update(_EXPERIMENTAL_CONFIG_SPECS)
    return [n for n, s in table.items() if family is None or s[0] == family]


def cached_config_names():
    return list(_CACHED_CONFIG_SPECS)


def mathdx_default() -> Optional[bool]:
    """``FOVI_WARP_MATHDX=0`` builds the scalar-GEMM variant (fast compile, slow kernel), ``1`` the MathDx one;
    None (unset): Warp's own setting (MathDx/cuBLASDx on CUDA)."""
    return settings.get("FOVI_WARP_MATHDX")


# The variants of the register tensor-core kernels (fovi_lab.kernels.forward.mma) and of the pipelined ones
# (fovi_lab.kernels.forward.mma_pipe), as the registry lists them for those two families.
MMA_VARIANTS = tuple(family_of("tensor_cores").variants)

PIPE_VARIANTS = tuple(family_of("pipelined").variants)


def mma_flags(family: str) -> Tuple[bool, bool, bool]:
    """(split, W in place, x^T) of a tensor-core variant (``mmasw``: split, W in place)."""
    v = family_of(family).variants[family]
    return bool(v.get("split")), v.get("w_layout") == "in place", v.get("x_layout") == "transposed"


def mma_staged(family: str) -> bool:
    """Whether a variant's kernels write y through a shared tile (``mmao`` / ``mmato``: the staged store)."""
    return family_of(family).variants[family].get("store") == "shared tile"


def dense_kind(cfg: FwdConfig) -> Tuple:
    """What identifies a config's dense-ceiling kernel: configs with equal kinds share one ceiling (the tile
    shape, and the loop and operand layouts where a family has its own: SIMT, vec4, each mma layout)."""
    return (family_of(cfg.variant).dense_kind(cfg), cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim)
