"""The one registry of the kernel families (forward and adjoint), their named presets, and the devices the checks
know.

* :data:`FAMILIES`: every forward family, one module each. Adding one is its module here (parameters, limits,
  estimate, ``make_kernel`` over the factories of the kernel module it names), its rows in ``configs.toml``, and
  its import and entry in :data:`FAMILIES` below (``tests/kernels/families/test_adding_a_family.py`` adds one so);
  a kernel module of its own is one more entry of :data:`fovi_lab.kernels.forward.build.KERNEL_MODULES`, and a new
  operand layout (``dataflow``) one more plan in :func:`fovi_lab.kernels.forward.plans.plan_uncached`.
* :data:`PRESETS`: the named points of ``fovi_lab/kernels/forward/configs.toml`` (the names the rules,
  records, tune caches and notebooks use), each with where it comes from.
* :func:`lookup`: a preset name, or an id derived from parameters, to its point; :func:`describe`: the
  readable name of a preset, an id or a point (forward or adjoint).
* :data:`ADJOINT_FAMILIES` and :data:`ADJOINT_PRESETS` (``fovi_lab/kernels/adjoint/configs.toml``): the adjoints
  the same way; :func:`adjoint_point` is the point of a kernel as the adjoint build and plan modules name it, a kind
  and a name (``("gi", "gi3_p64b128_f32")``, ``("dxs", "dxn_m64n64k64")``), and :func:`adjoint_kernels` those pairs.
* :data:`DEVICES` / :func:`device_spec` (from :mod:`fovi_lab.ops.devices`): the limits and datasheet peaks of
  the GPUs the estimates know, and the current device.
"""

from __future__ import annotations

import functools
from typing import Dict, Iterable, List, Optional, Tuple, Union


import fovi_lab.kernels.families.cached as cached
import fovi_lab.kernels.families.fused_adjoints as fused_adjoints
import fovi_lab.kernels.families.im2col as im2col
import fovi_lab.kernels.families.node_major as node_major
import fovi_lab.kernels.families.pipelined as pipelined
import fovi_lab.kernels.families.reductions as reductions
import fovi_lab.kernels.families.simt as simt
import fovi_lab.kernels.families.staged_adjoints as staged_adjoints
import fovi_lab.kernels.families.tensor_cores as tensor_cores
import fovi_lab.kernels.families.tile_gemm as tile_gemm
from fovi_lab.kernels.families.adjoint_base import AdjointFamily
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

#: Every adjoint kernel family, in the order the listing gives them: the staged adjoints (a stage GEMM and a
#: reverse-list sum), the sums, and the fused node-major adjoints.
ADJOINT_FAMILIES: Tuple[AdjointFamily, ...] = (
    staged_adjoints.STAGED_DX,
    staged_adjoints.STAGED_DW,
    reductions.FAMILY,
    fused_adjoints.FUSED_DX,
    fused_adjoints.FUSED_DW,
)

_BY_KEY: Dict[str, Family] = {f.key: f for f in FAMILIES + ADJOINT_FAMILIES}
_BY_VARIANT: Dict[str, Family] = {v: f for f in FAMILIES + ADJOINT_FAMILIES for v in f.variants}
#: The kinds of the adjoint build and plan modules (``gi``, ``gw``, ``csr``, ``dxn``, ``dxs``, ``dwn``, ``dws``).
_BY_KIND: Dict[str, AdjointFamily] = {k: f for f in ADJOINT_FAMILIES for k in f.kinds}


#: The kernel kinds of the dense ceilings (a family's tile loop on dense operands, :meth:`Family.dense_kind`): the
#: benchmarks' ceilings, not families; the canary runs them on a dense problem.
DENSE_KINDS = ("dense", "densep", "simt_dense", "simtv_dense", "mma_dense", "mmaw_dense", "mmat_dense", "mmap_dense")


def is_dense_kind(kind: str) -> bool:
    """Whether ``kind`` (a built kernel's variant or kind) is a dense ceiling's (:data:`DENSE_KINDS`)."""
    return kind in DENSE_KINDS


def family(key: str) -> Family:
    """The family of ``key`` (``"tensor_cores"``, ``"fused_dx"``) or of one of its variants (``"mmato"``,
    ``"gi3p"``)."""
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
            fam = family(cfg.variant)
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


def _load_adjoint_presets() -> Dict[str, Preset]:
    from fovi_lab.kernels.families.table import _ADJOINT_TABLES
    why = "registered: the adjoint rules may pick it, sweeps and warmup build it"
    out: Dict[str, Preset] = {}
    for key, table in _ADJOINT_TABLES.items():
        fam = _BY_KEY.get(key)
        if not isinstance(fam, AdjointFamily):
            raise ValueError(f"kernels/adjoint/configs.toml: [{key}] is no adjoint family; families: "
                             f"{', '.join(f.key for f in ADJOINT_FAMILIES)}")
        for name, row in table.items():
            out[name] = Preset(name, fam.from_row(row), why)
    return out


#: name -> :class:`Preset` for every config of the adjoint configs table.
ADJOINT_PRESETS: Dict[str, Preset] = _load_adjoint_presets()
PRESET_NAMES.update(ADJOINT_PRESETS)
for _name, _preset in ADJOINT_PRESETS.items():
    PRESET_NAME_OF.setdefault(_preset.point, _name)


def adjoint_family(kind: str) -> AdjointFamily:
    """The adjoint family of a kind of the adjoint build and plan modules (``"gi"``, ``"csr"``, ``"dxs"``)."""
    fam = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if fam is None:
        raise ValueError(f"kind: expected one of {', '.join(map(repr, _BY_KIND))}, got {kind!r}")
    return fam


@functools.lru_cache(maxsize=None)
def adjoint_point(kind: str, name: str) -> Point:
    """The point of the adjoint kernel ``(kind, name)``: a preset's name or an id of the kind's family; for the fused
    kinds the name gives the tiles and the kind the walk. A ValueError names a bad kind, a KeyError a name that
    is no kernel of it (cached: the plans resolve their kernels with it on every call)."""
    fam = adjoint_family(kind)
    if not isinstance(name, str):
        raise TypeError(f"config: expected a config name (str), got {type(name).__name__}")
    preset = ADJOINT_PRESETS.get(name)
    try:
        point = preset.point if preset is not None and preset.point.family == fam.key else fam.parse_id(name)
    except ValueError as exc:
        raise KeyError(f"config: unknown {kind} config {name!r}: it reads as {fam.key}, but {exc}") from None
    if point is None:
        known = [p.name for p in presets(fam.key)]
        raise KeyError(f"config: unknown {kind} config {name!r}; known: {known}{fam.name_hint} (or any id of the "
                       f"{fam.title} family: python -m fovi_lab configs --family {fam.key})")
    if fam.kind_is_variant:
        point = point.replace(**fam.variants[kind])
    reasons = fam.combine_reasons(point)
    if reasons:
        raise KeyError(f"config: {kind} config {name!r} is no kernel: {'; '.join(reasons)}")
    return point


def adjoint_kernels(family_key: str) -> List[Tuple[str, str]]:
    """Every ``(kind, name)`` of an adjoint family's presets, in the table's order, each in the forms the family
    builds (:meth:`~fovi_lab.kernels.families.adjoint_base.AdjointFamily.forms`)."""
    fam = family(family_key)
    return [fam.kernel_key(form) for form in fam.forms([p.point for p in presets(fam.key)])]


def lookup_adjoint(name: str) -> Point:
    """The point of an adjoint preset name or of an id of an adjoint family (``gw3i_p64n96k16_f32``, ``dxs_m64n64k64``).
    A ValueError says what the known forms are."""
    if not isinstance(name, str):
        raise TypeError(f"name: expected a config name (str), got {type(name).__name__}")
    if name in ADJOINT_PRESETS:
        return ADJOINT_PRESETS[name].point
    point = _parsed(name, ADJOINT_FAMILIES)
    if point is not None:
        return point
    raise ValueError(f"name: unknown adjoint config {name!r}; a preset name (python -m fovi_lab configs lists them) "
                     f"or an id such as gi3_p64b128_f32, gw3i_p64n96k16, dx_f32, dxn_m64n64k64, dws_o64c64k16")


def _parsed(name: str, families) -> Optional[Point]:
    """The point of the derived id ``name`` in the first of ``families`` that reads it, or None where none does; a
    ValueError where a family reads it and finds a value out of its range, or the values make no kernel."""
    for fam in families:
        try:
            point = fam.parse_id(name)
        except ValueError as exc:
            raise ValueError(f"name: {name!r} reads as {fam.key}, but {exc}") from None
        if point is not None:
            reasons = fam.combine_reasons(point)
            if reasons:
                raise ValueError(f"name: {name!r} is no kernel: {'; '.join(reasons)}")
            return point
    return None


def preset_name(point: Point) -> Optional[str]:
    """The preset registered at ``point``, or None."""
    return PRESET_NAME_OF.get(point)


def presets(family_key: Optional[str] = None, experimental: bool = True) -> List[Preset]:
    """The presets (of one family), registered first."""
    table = PRESETS if family_key is None or not isinstance(family(family_key), AdjointFamily) else ADJOINT_PRESETS
    out = [p for p in table.values() if p.point is not None
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
    point = _parsed(name, FAMILIES)
    if point is not None:
        return point
    raise ValueError(f"name: unknown config {name!r}; a preset name (python -m fovi_lab configs lists them) or an "
                     f"id such as mma_o64b16k32, mmap_o128b64k32s3, sd_b8o8u4, nm_m64n64k64, i2c_m64n96k64, m64n64r2")


def describe(what: Union[str, Point]) -> str:
    """The readable name of a preset name, a derived id or a point (forward or adjoint)."""
    if isinstance(what, str):
        try:
            what = lookup(what)
        except ValueError as forward_error:
            try:
                what = lookup_adjoint(what)
            except ValueError:
                raise forward_error from None
    return family(what.family).describe(what)


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
