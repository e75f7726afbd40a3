"""What a kernel family is: its typed parameters, the points of its parameter space, the problem a point is
asked to run, the device it runs on, and the questions every family answers about a point.

A *point* fixes every parameter of one family (the tile shape, the loop depth, the operand layouts, ...): it
is one kernel. Its readable name (:meth:`Family.describe`) and its compact id (:meth:`Family.point_id`) are
both derived from the parameters. :meth:`Family.check` answers whether the point can run a problem on a
device, as a list of reasons it cannot (empty: it can), and :meth:`Family.estimate` gives the roofline time
that the rules and the tuner start from: the larger of the point's padded FLOPs at the device's peak and the
bytes it must move at the device's bandwidth (a lower bound, never a prediction).
"""

from __future__ import annotations

import functools
import re
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

import torch

from fovi_lab.graph.meta import pad_to
from fovi_lab.ops.devices import DeviceSpec
from fovi_lab.kernels.tables import analyse_tables


@dataclass(frozen=True)
class Param:
    """One parameter of a family.

    Attributes:
        name: the keyword (``tile_o``).
        label: what it is, in words (``output channels per warp``).
        values: every value a point may take (a kernel is compiled per value: the space is finite).
        words: the value as a phrase in a readable name (default: ``f"{value} {label}"``); a phrase of None
            leaves the value out of the name.
        default: a value the readable name leaves out (the family's usual one), or None.
    """

    name: str
    label: str
    values: Tuple[Any, ...]
    words: Optional[Callable[[Any], Optional[str]]] = None
    default: Any = None

    def phrase(self, value) -> Optional[str]:
        if self.default is not None and value == self.default:
            return None
        return self.words(value) if self.words is not None else f"{value} {self.label}"


@dataclass(frozen=True)
class IdField:
    """One field of a family's derived ids: ``letter``, then the value of parameter ``param`` times ``scale``.

    With a ``default`` (in the id's units) the short form leaves the field out where the value is the default, and
    a parsed id without it takes the default. The default may depend on the other values: a function of the point's
    values (a dict: the variant's, and those of the fields before this one where an id is parsed) such as the usual
    block of a tile shape. A parsed value that is not a multiple of ``scale`` is rounded down, or with ``exact``
    names no point."""

    letter: str
    param: str
    default: Union[None, int, Callable[[Dict[str, Any]], int]] = None
    scale: int = 1
    exact: bool = False

    def default_of(self, values: Dict[str, Any]) -> Optional[int]:
        """The default of the field (in the id's units) for a point with these values."""
        return self.default(values) if callable(self.default) else self.default

    def text(self, point: "Point", explicit: bool) -> str:
        value = point[self.param] * self.scale
        default = self.default_of(point.as_dict())
        return f"{self.letter}{value}" if default is None or value != default or explicit else ""

    def pattern(self) -> str:
        return rf"{self.letter}(\d+)" if self.default is None else rf"(?:{self.letter}(\d+))?"


#: The block size in threads, ``b<threads>``: the last field of every family's ids, written where it is not 128.
BLOCK = IdField("b", "warps", default=128, scale=32)


def warps_param(values: Tuple[int, ...], default: Optional[int] = None) -> Param:
    """The ``warps`` parameter every family has: the warps of one block (its ids' :data:`BLOCK` field)."""
    return Param("warps", "warps per block", values, words=lambda v: f"{v} warp{'s' if v > 1 else ''} per block",
                 default=default)


def switch(name: str, label: str, phrase: Optional[str] = None) -> Param:
    """A parameter that is off or on (False, True); the readable name says ``phrase`` (default: the label) where it
    is on, and nothing where it is off."""
    return Param(name, label, (False, True), words=words_of({False: None, True: phrase or label}))


#: Filled by the registry (:mod:`fovi_lab.kernels.families.registry`) as it loads the presets: the preset name of
#: each named point, and every preset name (so that an id derived for another point never takes one).
PRESET_NAME_OF: Dict["Point", str] = {}
PRESET_NAMES: set = set()


@dataclass(frozen=True)
class Point:
    """One kernel: a family's key and a value for each of its parameters (in the family's order)."""

    family: str
    values: Tuple[Tuple[str, Any], ...]
    owner: Any = field(default=None, compare=False, hash=False, repr=False)     # the Family that made it

    def __getitem__(self, name: str):
        for k, v in self.values:
            if k == name:
                return v
        raise KeyError(f"{self.family} has no parameter {name!r}")

    def as_dict(self) -> Dict[str, Any]:
        return dict(self.values)

    def replace(self, **changes) -> "Point":
        return self.owner.point(**{**self.as_dict(), **changes})

    @property
    def id(self) -> str:
        return self.owner.point_id(self)

    @property
    def name(self) -> str:
        return self.owner.describe(self)

    def __str__(self) -> str:
        return f"{self.name} [{self.id}]"


@dataclass(frozen=True)
class Problem:
    """The shape of one forward call: what a point is checked and estimated against.

    ``node_major``: the tables have the node-major form of docs/operator.md §2.1 (the node-major family needs
    it). ``p_used``: one past the last table column holding a real entry (defaults to P64)."""

    batch: int
    cin: int
    nin: int
    cout: int
    nout: int
    p64: int
    q: int
    k: int = 0
    node_major: bool = True
    dtype: torch.dtype = torch.float16
    layer: Optional[str] = None

    @classmethod
    def of(cls, meta, batch: int, dtype: torch.dtype = torch.float16, layer: Optional[str] = None) -> "Problem":
        """The problem of ``meta`` (a :class:`~fovi_lab.graph.meta.TrainingMeta`) at ``batch`` in ``dtype``."""
        info = analyse_tables(meta.input_linear, meta.weight_linear, meta.cin, meta.nin, meta.q)
        return cls(batch=int(batch), cin=int(meta.cin), nin=int(meta.nin), cout=int(meta.cout),
                   nout=int(meta.nout), p64=int(meta.p64), q=int(meta.q), k=int(meta.k),
                   node_major=info.nm is not None, dtype=dtype, layer=layer)

    @property
    def flops(self) -> float:
        """The useful FLOPs: ``2 B P64 Cout Nout`` (the compact GEMMs, pad entries included)."""
        return 2.0 * self.batch * self.p64 * self.cout * self.nout

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def fewest_bytes(self) -> float:
        """x, W, the bias, both int32 tables and y, each moved once."""
        s = self.itemsize
        return float(s * (self.batch * self.cin * self.nin + self.cout * self.q + self.cout
                          + self.batch * self.cout * self.nout) + 2 * 4 * self.nout * self.p64)

    def words(self) -> str:
        what = self.layer or "a layer"
        dtype = {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(self.dtype, str(self.dtype).replace("torch.", ""))
        return (f"{what} at B = {self.batch} in {dtype}: Cin {self.cin}, "
                f"Nin {self.nin}, Cout {self.cout}, Nout {self.nout}, P64 {self.p64}")


@dataclass(frozen=True)
class Estimate:
    """A point's roofline time on a problem and device: the larger of ``flops`` at ``peak_tflops`` and
    ``nbytes`` at the bandwidth. ``ms`` is None where the device has no peak figures (then ``why`` says so)."""

    ms: Optional[float]
    flops: float
    nbytes: float
    bound: str = ""
    peak: str = ""
    why: str = ""

    def words(self) -> str:
        if self.ms is None:
            return self.why
        return f"at least {self.ms * 1e3:.1f} us ({self.bound}-bound: {self.peak})"


@dataclass(frozen=True)
class Preset:
    """A named point: ``why`` says where it comes from (a rule picks it, a sweep or tune record shows it
    winning, a notebook teaches it, or it is kept runnable for comparison: ``experimental``)."""

    name: str
    point: Point
    why: str = "registered"


class Family:
    """A kernel family. Subclasses set :attr:`key`, :attr:`title`, :attr:`params`, :attr:`variants` and the
    methods below; one module per family (``fovi_lab.kernels.families.*``), one line in the registry.

    ``variants`` maps each variant of the configs table (``mmato``, ``sdp``, ...) to the values
    it fixes: those strings remain the prefix of the compact ids, so records and tune caches keep loading.

    The derived ids, their parsing and the configs-table fields are declared rather than written per family:
    :attr:`id_fields` and :attr:`id_prefixes` give :meth:`format_id` and :meth:`parse_id`, :attr:`config_params`
    gives :meth:`config_fields` and :meth:`from_config`, and :attr:`head_words` the first phrase of the readable
    name."""

    key: str = ""
    title: str = ""
    module: str = ""                    # where the kernel factory lives (the production source)
    params: Tuple[Param, ...] = ()
    variants: Dict[str, Dict[str, Any]] = {}
    tensor_cores: bool = False          # its products run on the tensor cores (the estimate's peak)
    mma_sync: bool = False              # its kernels issue mma.sync themselves (sm_80+; the rules prefer them)
    training: bool = False              # its kernels also serve the adjoints (as forwards of derived layers)
    inference_only: bool = False        # runs only from the cached effective weight (no training forward)
    dtypes: Tuple[torch.dtype, ...] = (torch.float16,)      # the operand dtypes it has kernels for
    #: what one unit of the grid is where x is read and y written in place: "thread" (a register block), "warp"
    #: (32 lanes) or "block" (``block_dim`` threads); None for the tile families, whose plans stage their operands
    unit: Optional[str] = None

    # -- the parameter space -------------------------------------------------------------------------------
    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"{self.key}: no parameter {name!r}; parameters: {', '.join(p.name for p in self.params)}")

    def point(self, **values) -> Point:
        """The point with these values (every parameter named once; a ValueError names a bad one)."""
        names = [p.name for p in self.params]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise ValueError(f"{self.key}: unknown parameter(s) {', '.join(unknown)}; parameters: {', '.join(names)}")
        missing = [n for n in names if n not in values]
        if missing:
            raise ValueError(f"{self.key}: missing value(s) for {', '.join(missing)}")
        for p in self.params:
            if values[p.name] not in p.values:
                raise ValueError(f"{self.key}: {p.name} ({p.label}) must be one of "
                                 f"{', '.join(map(str, p.values))}, got {values[p.name]!r}")
        return Point(self.key, tuple((n, values[n]) for n in names), self)

    def points(self) -> Iterator[Point]:
        """Every point of the space whose parameters combine (:meth:`combine_reasons` empty)."""
        import itertools
        for combo in itertools.product(*(p.values for p in self.params)):
            pt = Point(self.key, tuple(zip((p.name for p in self.params), combo)), self)
            if not self.combine_reasons(pt):
                yield pt

    def variant(self, point: Point) -> str:
        """The variant whose fixed values ``point`` has."""
        for name, fixed in self.variants.items():
            if all(point[k] == v for k, v in fixed.items()):
                return name
        raise ValueError(f"{self.key}: no kernel combines {self._fixed_words(point)}")

    def _fixed_words(self, point: Point) -> str:
        keys = sorted({k for fixed in self.variants.values() for k in fixed})
        return ", ".join(f"{k} = {point[k]}" for k in keys)

    # -- what each family says about its points -------------------------------------------------------------
    def combine_reasons(self, point: Point) -> List[str]:
        """Why these parameter values do not make one kernel, whatever the problem (empty: they do)."""
        try:
            self.variant(point)
        except ValueError as exc:
            return [str(exc).split(": ", 1)[1]]
        return []

    def check(self, point: Point, problem: Optional[Problem] = None, device: Optional[DeviceSpec] = None) -> List[str]:
        """The reasons ``point`` cannot run ``problem`` on ``device`` (either may be None: not checked). Empty:
        it can (the canary still validates each kernel once per device before its first use)."""
        reasons = self.combine_reasons(point)
        if reasons:
            return reasons
        reasons += self.resource_reasons(point, device)
        if problem is not None:
            reasons += self.problem_reasons(point, problem)
        return reasons

    def resource_reasons(self, point: Point, device: Optional[DeviceSpec]) -> List[str]:
        return []

    def problem_reasons(self, point: Point, problem: Problem) -> List[str]:
        reasons = []
        if problem.dtype not in self.dtypes:
            kinds = " or ".join(str(d).replace("torch.float16", "fp16").replace("torch.bfloat16", "bf16")
                                for d in self.dtypes)
            reasons.append(f"has kernels for {kinds} only, not {str(problem.dtype).replace('torch.', '')}")
        return reasons

    #: the phrase of the leading parameters in the readable name (the tile shape, said as one phrase): a format
    #: string of their names (``"{tile_o} channels x {tile_b} rows per warp"``); "" for none
    head_words: str = ""

    @property
    def head_params(self) -> int:
        """How many leading parameters :meth:`head` puts in words (those :attr:`head_words` names)."""
        return sum(1 for _, name, _, _ in string.Formatter().parse(self.head_words) if name)

    def head(self, point: Point) -> Optional[str]:
        """The phrase of the first :attr:`head_params` parameters (``"64 channels x 32 rows per warp"``)."""
        return self.head_words.format(**point.as_dict()) if self.head_words else None

    def describe(self, point: Point) -> str:
        """The readable name: the family's title, the :meth:`head` phrase and each other parameter's phrase."""
        head = self.head(point)
        words = [self.title] + ([head] if head else []) + [
            w for p in self.params[self.head_params:] if (w := p.phrase(point[p.name]))]
        return ", ".join(words)

    def point_id(self, point: Point) -> str:
        """The compact id: a preset's own name where one is registered at this point, else the id derived from the
        parameters (written out in full where the short form names another preset)."""
        named = PRESET_NAME_OF.get(point)
        if named is not None:
            return named
        short = self.format_id(point)
        return self.format_id(point, explicit=True) if short in PRESET_NAMES else short

    #: the fields of the derived ids, in order, after the variant's prefix (:data:`BLOCK` last)
    id_fields: Tuple[IdField, ...] = ()
    #: the prefix of each variant's ids where it is not the variant's name and ``_``
    id_prefixes: Dict[str, str] = {}

    def _id_prefix(self, variant: str) -> str:
        return self.id_prefixes.get(variant, variant + "_")

    def format_id(self, point: Point, explicit: bool = False) -> str:
        """The id derived from the parameters: the variant's prefix and each of :attr:`id_fields`; ``explicit``:
        every optional field written out (used where the short form is a preset's name for another point)."""
        return self._id_prefix(self.variant(point)) + "".join(f.text(point, explicit) for f in self.id_fields)

    @functools.cached_property
    def _id_pattern(self) -> Tuple["re.Pattern", Dict[str, str]]:
        """The pattern of the derived ids, and the variant of each prefix."""
        variant_of = {self._id_prefix(v): v for v in self.variants}
        prefixes = "|".join(re.escape(p) for p in sorted(variant_of, key=len, reverse=True))
        return re.compile(f"^({prefixes})" + "".join(f.pattern() for f in self.id_fields) + "$"), variant_of

    def parse_id(self, text: str, **values_beside) -> Optional[Point]:
        """The point a derived id names (None when ``text`` is not one of this family's ids; a ValueError where it
        reads as one but a value lies outside the space). ``values_beside``: those of the parameters the fields and
        the variant leave out (a family whose ids end in a suffix of its own reads them from it)."""
        pattern, variant_of = self._id_pattern
        m = pattern.match(text)
        if not m:
            return None
        fixed = self.variants[variant_of[m.group(1)]]
        values = {}
        for f, digits in zip(self.id_fields, m.groups()[1:]):
            value = f.default_of({**fixed, **values}) if digits is None else int(digits)
            if f.exact and value % f.scale:
                return None
            values[f.param] = value // f.scale
        return self.point(**values, **fixed, **values_beside)

    def to_config(self, point: Point, name: Optional[str] = None):
        """The :class:`~fovi_lab.kernels.families.table.FwdConfig` the builders and plans take."""
        from fovi_lab.kernels.families.table import FwdConfig
        return FwdConfig(name or self.point_id(point), self.variant(point), *self.config_fields(point))

    #: the parameter behind each of the configs-table fields ``tile_m``, ``tile_n``, ``tile_k`` and ``r`` (a
    #: number where the family fixes the field; a fixed field is not read back); ``block_dim`` is ``warps`` x 32
    config_params: Tuple[Any, Any, Any, Any] = ()

    def config_fields(self, point: Point) -> Tuple[int, int, int, int, int]:
        """``(tile_m, tile_n, tile_k, r, block_dim)`` of the point."""
        return (*(point[p] if isinstance(p, str) else p for p in self.config_params), point["warps"] * 32)

    def from_config(self, cfg) -> Point:
        """The point of a configs-table entry of one of this family's variants."""
        values = {p: getattr(cfg, f) for f, p in zip(("tile_m", "tile_n", "tile_k", "r"), self.config_params)
                  if isinstance(p, str)}
        return self.point(**values, warps=cfg.block_dim // 32, **self.variants[cfg.variant])

    def dataflow(self, cfg) -> str:
        """Which forward plan of :mod:`fovi_lab.kernels.forward.plans` runs the configs-table entry ``cfg``: the
        operand layouts it prepares and the launches it makes (``in_place``, ``gather``, ``node_major``,
        ``node_major_lists``, ``im2col``, ``vec4``)."""
        raise NotImplementedError

    def variant_values(self, cfg) -> Dict[str, Any]:
        """The parameter values the variant of ``cfg`` (``cfg.variant``) fixes."""
        return self.variants[cfg.variant]

    def dense_kind(self, cfg) -> str:
        """The loop of the entry's dense ceiling: entries with the same kind and tile fields share one ceiling
        kernel (the split loops and the staged stores share their plain loop's)."""
        return "tile"

    def canary_p64(self, cfg) -> int:
        """P64 of the canary's one-node problem for ``cfg``: a multiple of the entry's p step."""
        return 64

    def fp32_output(self, cfg) -> bool:
        """Whether the configs-table entry ``cfg`` can give an unrounded fp32 y (fp32 partials summed in a fixed
        order: the split tensor-core kernels, which the tensor-core adjoints run on)."""
        return False

    def make_kernel(self, source, cfg, mathdx: Optional[bool] = None, dense: bool = False, bf16: bool = False):
        """The Warp kernel of the configs-table entry ``cfg`` (a :class:`~fovi_lab.kernels.families.table.FwdConfig`
        of one of this family's variants; its fields are the factory's arguments), or with ``dense`` its dense
        ceiling (the same loop over dense operands of the same GEMM sizes), made by the factories of ``source``:
        the kernel module :attr:`module` names, which the caller,
        :func:`fovi_lab.kernels.forward.build.build_kernel`, imports (the families sit below the kernels they
        describe). Called once per kernel; the caller caches it."""
        raise NotImplementedError

    # -- the roofline estimate ------------------------------------------------------------------------------
    def block_shape(self, point: Point) -> Tuple[int, int]:
        """``(batch rows, output channels)`` one unit of the grid computes: what the padding of B and Cout
        is rounded to."""
        raise NotImplementedError

    def fewest_bytes(self, problem: Problem) -> float:
        """The fewest bytes a kernel of the family moves for ``problem`` (the forward's: :attr:`Problem.fewest_bytes`;
        an adjoint family's are its gradient's)."""
        return problem.fewest_bytes

    def extra_bytes(self, point: Point, problem: Problem) -> float:
        """Bytes the family moves beyond the fewest (its per-call layouts and stages)."""
        return 0.0

    def padded_flops(self, point: Point, problem: Problem) -> float:
        """The FLOPs the point's tiles compute: B and Cout rounded up to its block."""
        rows, chans = self.block_shape(point)
        return 2.0 * pad_to(problem.batch, rows) * problem.p64 * pad_to(problem.cout, chans) * problem.nout

    def estimate(self, point: Point, problem: Problem, device: DeviceSpec) -> Estimate:
        flops = self.padded_flops(point, problem)
        nbytes = self.fewest_bytes(problem) + self.extra_bytes(point, problem)
        peak = device.tensor_tflops if self.tensor_cores else device.fp32_tflops
        if device.is_cpu or peak is None or device.hbm_tbps is None:
            return Estimate(None, flops, nbytes, why=f"no roofline for {device.name}: no peak figures known")
        t_flops = flops / (peak * 1e12)
        t_bytes = nbytes / (device.hbm_tbps * 1e12)
        if t_flops >= t_bytes:
            bound, what = "compute", (f"{flops / 1e9:.2f} GFLOP at {peak:g} TFLOP/s "
                                      f"{'fp16 tensor-core' if self.tensor_cores else 'fp32 CUDA-core'} peak")
        else:
            bound, what = "memory", f"{nbytes / 1e6:.1f} MB at {device.hbm_tbps:g} TB/s"
        return Estimate(max(t_flops, t_bytes) * 1e3, flops, nbytes, bound, what)


def words_of(mapping: Dict[Any, Optional[str]]) -> Callable[[Any], Optional[str]]:
    """A :attr:`Param.words` from a value -> phrase table (None: the value is left out of the name)."""
    return lambda v: mapping[v]


def check_shared(bill: int, device: Optional[DeviceSpec], what: str) -> List[str]:
    """A reason when ``bill`` bytes of shared memory exceed what one block may hold on ``device``."""
    if device is None or not device.smem_per_block or bill <= device.smem_per_block:
        return []
    where = "Warp's CPU tile arena holds" if device.is_cpu else f"a block may hold on {device.name}"
    return [f"{what} need at least {bill / 1024:.0f} KiB of shared memory, over the "
            f"{device.smem_per_block / 1024:.0f} KiB {where}"]


def needs_arch(arch: int, device: Optional[DeviceSpec], what: str) -> List[str]:
    if device is None or device.is_cpu or device.arch is None or device.arch >= arch:
        return []
    return [f"{what} needs sm_{arch} or newer; {device.name} is sm_{device.arch}"]


__all__ = ["Param", "IdField", "BLOCK", "Point", "Problem", "DeviceSpec", "Estimate", "Preset", "Family", "words_of",
           "warps_param", "switch", "check_shared", "needs_arch"]
