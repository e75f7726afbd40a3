"""The configs tables and the record each forward entry reads as: what the family registry
(:mod:`fovi_lab.kernels.families.registry`) and the builders share.

* ``fovi_lab/kernels/forward/configs.toml``: the forward presets, one :class:`FwdConfig` each;
* ``fovi_lab/kernels/adjoint/configs.toml``: the adjoint presets, one section per adjoint family, each row the
  variant and the family's row fields (:attr:`fovi_lab.kernels.families.adjoint_base.AdjointFamily.row_params`).
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from typing import Dict, Tuple


#: p-tile width of the gather family: the index tables are padded to P64, a multiple of 64.
GATHER_TILE_K = 64


@dataclass(frozen=True)
class FwdConfig:
    """One compile-time forward configuration.

    Attributes:
        name: registry name (``m64n64r2b256``, ``nm_m64n128k64``, ...).
        variant: the variant of a kernel family (:mod:`fovi_lab.kernels.families`) the entry is a point of:
            ``"gather"`` (any tables), ``"nm"`` / ``"nms"`` (node-major, docs/operator.md §2.1 tables), ``"i2c"`` /
            ``"i2cg"`` (im2col stage), ``"simt"`` / ``"simtp"`` / ``"simtv"`` / ``"simts"`` (SIMT register
            blocks; ``simts`` splits the p loop), ``"mma..."`` / ``"mmap"`` (tensor cores) or ``"cached"`` (and the
            experimental ``"nmp"`` / ``"gp"``); :func:`~fovi_lab.kernels.families.registry.family` gives the family.
        tile_m, tile_n, tile_k: batch rows, output channels, contraction depth of one tile GEMM (``simt``:
            a thread's batch rows and output channels, and the p entries per loop step).
        r: batch tiles per CTA sharing each weight tile (1, 2 or 4); ``mmap``: the pipeline's shared stages.
        block_dim: threads per CTA.
    """

    name: str
    variant: str
    tile_m: int
    tile_n: int
    tile_k: int
    r: int
    block_dim: int

    @property
    def rows_per_cta(self) -> int:
        return self.tile_m if self.variant in ("mmap", "mmaps") else self.tile_m * self.r


def _load_tables() -> Dict[str, Dict[str, Tuple[str, int, int, int, int, int]]]:
    """The tables of ``kernels/forward/configs.toml`` (package data): section -> name -> spec tuple."""
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "forward", "configs.toml"), "rb") as f:
        raw = tomllib.load(f)
    return {section: {name: (str(spec[0]), *(int(v) for v in spec[1:])) for name, spec in table.items()}
            for section, table in raw.items()}


_TABLES = _load_tables()


def _load_adjoint_tables() -> Dict[str, Dict[str, Tuple]]:
    """The tables of ``kernels/adjoint/configs.toml`` (package data): family key -> name -> row tuple."""
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "adjoint", "configs.toml"), "rb") as f:
        raw = tomllib.load(f)
    return {key: {name: tuple(row) for name, row in table.items()} for key, table in raw.items()}


_ADJOINT_TABLES = _load_adjoint_tables()


__all__ = ["FwdConfig", "GATHER_TILE_K"]
