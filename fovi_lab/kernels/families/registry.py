"""The one registry of forward kernel families, their named presets, and the devices the checks know.

* :data:`FAMILIES`: every family, one module each (adding one is its module, its test and one line here).
* :data:`PRESETS`: the named points of ``fovi_lab/kernels/forward/configs.toml`` (the names the rules,
  records, tune caches and notebooks use), each with where it comes from.
* :func:`lookup`: a preset name, or an id derived from parameters, to its point; :func:`describe`: the
  readable name of a preset, an id or a point.
* :data:`DEVICES` / :func:`device_spec` (from :mod:`fovi_lab.ops.devices`): the limits and datasheet peaks of
  the GPUs the estimates know, and the current device.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Optional, Tuple, Union


import fovi_lab.kernels.families.cached as cached
import fovi_lab.kernels.families.im2col as im2col
import fovi_lab.kernels.families.node_major as node_major
import fovi_lab.kernels.families.pipelined as pipelined
import fovi_lab.kernels.families.simt as simt
import fovi_lab.kernels.families.tensor_cores as tensor_cores
import fovi_lab.kernels.families.tile_gemm as tile_gemm
from fovi_lab.kernels.families.base import PRESET_NAME_OF, PRESET_NAMES, Family, Point, Preset
from fovi_lab.ops.devices import DEVICES, DeviceSpec, device_spec  # noqa: F401  (re-exported)

#: Every forward kernel family, in the order :func:`fovi_lab.explain` lists them.
FAMILIES: Tuple[Family, ...] = (
    tensor_cores.FAMILY,
    pipelined.FAMILY,
    simt.FAMILY,
    node_major.FAMILY,
    im2col.FAMILY,
    tile_gemm.FAMILY,
    cached.FAMILY,
)

_BY_KEY: Dict[str, Family] = {f.key: f for f in FAMILIES}
_BY_VARIANT: Dict[str, Family] = {v: f for f in FAMILIES for v in f.variants}


#: The kernel kinds of the dense ceilings (a family's tile loop on dense operands, :meth:`Family.dense_kind`): the
#: benchmarks' ceilings, not families; the canary runs them on a dense problem.
DENSE_KINDS = ("dense", "densep", "simt_dense", "simtv_dense", "mma_dense", "mmaw_dense", "mmat_dense", "mmap_dense")


def is_dense_kind(kind: str) -> bool:
    """Whether ``kind`` (a built kernel's family string) is a dense ceiling's (:data:`DENSE_KINDS`)."""
    return kind in DENSE_KINDS


def family(key: str) -> Family:
    """The family of ``key`` (``"tensor_cores"``) or of a legacy family string (``"mmato"``)."""
    fam = family_or_none(key)
    if fam is None:
        raise KeyError(f"family: unknown {key!r}; families: {', '.join(_BY_KEY)}")
    return fam


def family_or_none(key: str) -> Optional[Family]:
    """:func:`family`, or None for a string no family has (a dense ceiling's kernel kind such as ``mma_dense``)."""
    return _BY_KEY.get(key) or _BY_VARIANT.get(key)


def _load_presets() -> Dict[str, Preset]:
    from fovi_lab.kernels.families.table import _TABLES, FwdConfig
    why = {"registered": "registered: the rules may pick it; warmup builds it",
           "experimental": "experimental: runnable by name, kept for comparison in sweeps and notebooks",
           "cached": "cached: the inference path's configs",
           "canary": "canary: exists to exercise the canary (too large to launch)"}
    out: Dict[str, Preset] = {}
    for section, table in _TABLES.items():
        for name, spec in table.items():
            cfg = FwdConfig(name, *spec)
            fam = family(cfg.family)
            try:
                point = fam.from_config(cfg)
            except ValueError:                      # the canary's oversized config lies outside every space
                point = None
            out[name] = Preset(name, point, why[section])
    return out


#: name -> :class:`Preset` for every config of the configs table (the canary's own test config has no point).
PRESETS: Dict[str, Preset] = _load_presets()
PRESET_NAMES.update(PRESETS)
for _name, _preset in PRESETS.items():
    if _preset.point is not None:
        PRESET_NAME_OF.setdefault(_preset.point, _name)


def preset_name(point: Point) -> Optional[str]:
    """The preset registered at ``point``, or None."""
    return PRESET_NAME_OF.get(point)


def presets(family_key: Optional[str] = None, experimental: bool = True) -> List[Preset]:
    """The presets (of one family), registered first."""
    out = [p for p in PRESETS.values() if p.point is not None
           and (family_key is None or p.point.family == family(family_key).key)
           and (experimental or not p.why.startswith("experimental"))]
    return sorted(out, key=lambda p: p.why.startswith("experimental"))


def lookup(name: str) -> Point:
    """The point of a preset name or of a derived id (``mmato_o64b32b256``, ``mmat_o64b32k32b64``,
    ``sd_b8o8u4``). A ValueError says what the known forms are."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a config name (str), got {type(name).__name__}")
    preset = PRESETS.get(name)
    if preset is not None:
        if preset.point is None:
            raise ValueError(f"name: {name!r} is the canary's test config; it has no point in any family")
        return preset.point
    for fam in FAMILIES:
        try:
            pt = fam.parse_id(name)
        except ValueError as exc:
            raise ValueError(f"name: {name!r} reads as {fam.key}, but {exc}") from None
        if pt is not None:
            reasons = fam.combine_reasons(pt)
            if reasons:
                raise ValueError(f"name: {name!r} is no kernel: {'; '.join(reasons)}")
            return pt
    raise ValueError(f"name: unknown config {name!r}; a preset name (python -m fovi_lab configs lists them) or an "
                     f"id such as mma_o64b16k32, mmap_o128b64k32s3, sd_b8o8u4, nm_m64n64k64, i2c_m64n96k64, m64n64r2")


def describe(what: Union[str, Point]) -> str:
    """The readable name of a preset name, a derived id or a point."""
    pt = lookup(what) if isinstance(what, str) else what
    return family(pt.family).describe(pt)


def aliases() -> Dict[str, str]:
    """Derived id -> preset name, where a preset's name is not the id its parameters give (the seed's names
    such as ``m64n64r1``, and names that leave out a block size other than the default)."""
    out = {}
    for name, preset in PRESETS.items():
        if preset.point is None:
            continue
        fam = family(preset.point.family)
        derived = fam.format_id(preset.point)
        if derived != name and derived not in PRESETS:
            out[derived] = name
    return out


def config_of(what: Union[str, Point]):
    """The :class:`~fovi_lab.kernels.forward.configs.FwdConfig` of a name or point (what the builders take)."""
    pt = lookup(what) if isinstance(what, str) else what
    return family(pt.family).to_config(pt)
