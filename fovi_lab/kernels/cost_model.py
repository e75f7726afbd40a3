"""A cost model of the forward's candidates on a GPU, calibrated from the records, and its honesty measured on a
GPU it was not fitted on.

The candidates of one forward call (a layer at a batch, fp16) are the Warp kernels (the points of the families in
:mod:`fovi_lab.kernels.families`) and the PyTorch forms ``torch_compact`` and ``torch_binned`` (the registered
backends' forwards). Each is priced from two roofline terms on the device's datasheet peaks (:class:`DeviceSpec`):

* ``flops_ms``: the FLOPs it computes at the peak of the units it runs on, and
* ``bytes_ms``: the bytes it moves at the HBM bandwidth,

both from the family's own :meth:`~fovi_lab.kernels.families.base.Family.estimate` for a Warp kernel (its padded
FLOPs, its layout copies and fp32 partials), and from :func:`form_terms` for a PyTorch form (its gathers, its binned
operand). The model's time is ``fixed + a * flops_ms + b * bytes_ms``: three non-negative numbers per *group*,
fitted by least squares on the relative error (the error of ``log t`` to first order) over every timed candidate of
the group. The groups are nested: a family's variant (``tensor_cores/mmato``), the family (``tensor_cores``), all of
Warp's kernels (``warp``), and one group per PyTorch form; a candidate is priced by the most specific group that
had at least :data:`MIN_POINTS` timings in the fit. ``fixed`` takes a call's launches and host work, ``a`` and
``b`` the fraction of the peaks a group reaches.

The records are the forward benchmarks' (:func:`timed_shapes`): one *timed shape* is one layer at one batch in one
benchmark run (the run's start date and tag), with every candidate that run timed there, eager and not graphed
(``auto`` calls eagerly). :func:`score` asks the model for the fastest candidate of each timed shape and counts the
shapes where the measured time of that pick is within ``within`` (10%) of the fastest measured.
``python -m fovi_lab cost-model`` fits on one GPU's records and scores on another's, both ways, and prints the
misses; docs/cost_model.md keeps its output (``--check`` compares it).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import torch

from fovi_lab.graph.meta import pad_to
from fovi_lab.kernels.families.base import Problem
from fovi_lab.kernels.families.registry import family, lookup
from fovi_lab.ops.devices import DEVICES, DeviceSpec

__all__ = ["FORMS", "MIN_POINTS", "WITHIN", "Timed", "TimedShape", "Group", "CostModel", "Score", "Miss",
           "form_terms", "candidate_terms", "timed_shapes", "fit", "score", "device_records", "DESCRIPTION",
           "add_arguments", "run", "main"]

#: The PyTorch forms priced beside Warp's kernels: the recorded impl of each registered backend's forward.
FORMS: Dict[str, str] = {"torch_compact": "torch_compact", "torch_binned_mm": "torch_binned"}
#: The fewest timings a group needs to be fitted (three numbers need more than three).
MIN_POINTS = 6
#: A pick counts when its measured time is within this fraction of the fastest measured.
WITHIN = 0.10
#: The datasheet peaks a record's device name reads (:data:`fovi_lab.ops.devices.DEVICES`).
_SPECS: Dict[str, DeviceSpec] = {s.name: s for s in DEVICES.values() if s.arch is not None}
_SHAPE_KEYS = ("cin", "cout", "nin", "nout", "k", "p64", "v")


# ------------------------------------------------------------------------------------------------ the terms

def form_terms(form: str, problem: Problem, device: DeviceSpec) -> Tuple[float, float]:
    """``(flops_ms, bytes_ms)`` of a PyTorch form's forward: ``torch_compact`` gathers x into ``B x P64`` rows per
    node and W into ``P64 x Cout`` per node (each written and read once more), then batched GEMMs whose rows, B,
    are padded to a 16-row tensor-core tile; ``torch_binned`` sums the gathered x into ``G [B, Q, Nout]`` (zeroed,
    summed into, read) and multiplies by the shared ``W [Cout, Q]`` (``Q = Cin V``)."""
    s, b = problem.itemsize, problem.batch
    rows = b * problem.nout * problem.p64
    if form == "torch_compact":
        flops = 2.0 * pad_to(b, 16) * problem.p64 * problem.cout * problem.nout
        nbytes = problem.fewest_bytes + 2.0 * s * (rows + problem.nout * problem.p64 * problem.cout)
    elif form == "torch_binned":
        flops = 2.0 * b * problem.cout * problem.q * problem.nout
        nbytes = problem.fewest_bytes + s * rows + 3.0 * s * b * problem.q * problem.nout
    else:
        raise ValueError(f"form: expected one of {', '.join(FORMS.values())}, got {form!r}")
    return flops / (device.tensor_tflops * 1e9), nbytes / (device.hbm_tbps * 1e9)


#: Units of the grid resident at once per SM, by what one unit is (:attr:`Family.unit`; None: a tile family's
#: block): 2048 threads, 16 warps of the ~128-register tensor-core kernels, 2 blocks of the tile kernels.
RESIDENT_PER_SM = {"thread": 2048, "warp": 16, "block": 2, None: 2}


def serial_ms(fam, point, problem: Problem, device: DeviceSpec, flops_ms: float) -> float:
    """The time of one unit of the grid's chain of products where too few units fill the device: ``flops_ms``
    times the resident units over the units launched, where that is over 1, else 0. A split of the p loop (the
    split variants) fills the device by design: 0."""
    try:
        if point["split"]:
            return 0.0
    except KeyError:
        pass
    rows, chans = fam.block_shape(point)
    units = -(-problem.batch // rows) * -(-problem.cout // chans) * problem.nout
    resident = device.sms * RESIDENT_PER_SM.get(fam.unit, 2)
    return flops_ms * resident / units if units < resident else 0.0


def candidate_terms(candidate: str, problem: Problem, device: DeviceSpec) -> Tuple[Tuple[str, ...], np.ndarray]:
    """``(groups, terms)`` of a candidate: a PyTorch form's name or a Warp kernel's config name (a preset or a
    derived id, :func:`fovi_lab.kernels.families.lookup`); ``groups`` from the most specific, ``terms`` the
    model's columns ``(1, flops_ms, bytes_ms, serial_ms)``. A ValueError names a candidate that is neither."""
    if candidate in FORMS.values():
        flops_ms, bytes_ms = form_terms(candidate, problem, device)
        return (candidate,), np.array([1.0, flops_ms, bytes_ms, 0.0])
    point = lookup(candidate)
    fam = family(point.family)
    est = fam.estimate(point, problem, device)
    peak = device.tensor_tflops if fam.tensor_cores else device.fp32_tflops
    flops_ms = est.flops / (peak * 1e9)
    return ((f"{fam.key}/{fam.variant(point)}", fam.key, "warp"),
            np.array([1.0, flops_ms, est.nbytes / (device.hbm_tbps * 1e9),
                      serial_ms(fam, point, problem, device, flops_ms)]))


# ------------------------------------------------------------------------------------------------ the records

@dataclass(frozen=True)
class Timed:
    """One candidate's measured median in a timed shape."""

    candidate: str
    ms: float


@dataclass
class TimedShape:
    """One layer at one batch in one benchmark run, with every candidate that run timed there (``times``,
    candidate -> ms) and the Warp kernel the run's rules chose (``chosen``, None where none was marked)."""

    device: str
    layer: str
    batch: int
    run: str
    problem: Problem
    times: Dict[str, float] = field(default_factory=dict)
    chosen: Optional[str] = None

    def fastest(self) -> Tuple[str, float]:
        best = min(self.times, key=lambda c: (self.times[c], c))
        return best, self.times[best]


def _candidate_of(r: dict) -> Optional[str]:
    impl = r.get("impl")
    if impl in FORMS:
        return FORMS[impl]
    if impl == "warp_uncached" and r.get("config"):
        return str(r["config"])
    return None


def device_records(device: str) -> Iterable[dict]:
    """The records ``auto`` reads (:func:`fovi_lab.ops.records.iter_records`) of one GPU, by its key in
    :data:`~fovi_lab.ops.devices.DEVICES` (``h100``, ``h200``) or its recorded name. A ValueError names a device
    without datasheet peaks."""
    spec = _spec(device)
    from fovi_lab.ops.records import iter_records
    return (r for r in iter_records(auto=True) if r.get("device") == spec.name)


def _spec(device: str) -> DeviceSpec:
    spec = DEVICES.get(str(device).lower()) or _SPECS.get(str(device))
    if spec is None or spec.is_cpu:
        known = ", ".join(k for k, s in DEVICES.items() if not s.is_cpu)
        raise ValueError(f"device: expected a GPU with datasheet peaks ({known}), got {device!r}")
    return spec


def _date(ts: "TimedShape") -> str:
    return ts.run.split(" ")[1] if " " in ts.run else ""


def latest(shapes: Sequence[TimedShape], scope: str = "kernels") -> List[TimedShape]:
    """One timed shape per device, layer and batch: the latest run's (by its start date), and with ``scope``
    ``"kernels"`` the latest run that timed more than one Warp kernel there, where one did (a sweep)."""
    by_pair: Dict[Tuple, List[TimedShape]] = {}
    for ts in shapes:
        by_pair.setdefault((ts.device, ts.problem, ts.batch), []).append(ts)
    out = []
    for group in by_pair.values():
        sweeps = [ts for ts in group if sum(c not in FORMS.values() for c in ts.times) > 1]
        pool = sweeps if scope == "kernels" and sweeps else group
        out.append(max(pool, key=lambda ts: (_date(ts), ts.run)))
    return sorted(out, key=lambda ts: (ts.device, ts.layer, ts.batch, ts.run))


def timed_shapes(records: Iterable[dict], scope: str = "kernels") -> List[TimedShape]:
    """The timed shapes of forward records (one GPU's or several): fp16 forward calls, eager (no CUDA graph), in a
    run's default variants (no ``note_run``), whose Warp configs the families know; the last time of a candidate
    where a run timed it twice. ``scope``: ``"kernels"`` keeps every Warp kernel a run timed (the sweeps' others
    too), ``"backends"`` only the one its rules chose (what ``warp_compact`` runs) beside the PyTorch forms. Shapes
    with fewer than two candidates are left out."""
    if scope not in ("kernels", "backends"):
        raise ValueError(f"scope: expected kernels or backends, got {scope!r}")
    known: Dict[str, bool] = {}
    shapes: Dict[Tuple, TimedShape] = {}
    for r in records:
        cand = _candidate_of(r)
        if (cand is None or r.get("graphed") or r.get("note_run") or (r.get("mode") or "forward") != "forward"
                or r.get("dtype", "float16") not in ("float16", "fp16") or not r.get("ms")
                or any(k not in r for k in _SHAPE_KEYS) or r.get("device") not in _SPECS):
            continue
        warp = cand not in FORMS.values()
        if warp and cand not in known:
            try:
                lookup(cand)
                known[cand] = True
            except ValueError:
                known[cand] = False
        if warp and (not known[cand] or (scope == "backends" and r.get("chosen") is False)):
            continue
        b = int(r["B"])
        run = f"{r.get('source', '')} {r.get('date', '')} {r.get('tag', '')} {r.get('run', '')}".rstrip()
        dims = tuple(int(r[k]) for k in _SHAPE_KEYS)
        key = (r["device"], run, dims, b)
        ts = shapes.get(key)
        if ts is None:
            cin, cout, nin, nout, k, p64, v = dims
            problem = Problem(batch=b, cin=cin, nin=nin, cout=cout, nout=nout, p64=p64, q=cin * v, k=k,
                              dtype=torch.float16, layer=r.get("layer"))
            ts = shapes[key] = TimedShape(r["device"], str(r.get("layer", "")), b, run, problem)
        ts.times[cand] = float(r["ms"])
        if warp and r.get("chosen") is True:
            ts.chosen = cand
    return [ts for ts in shapes.values() if len(ts.times) >= 2]


# ------------------------------------------------------------------------------------------------ the model

@dataclass(frozen=True)
class Group:
    """One group's fitted numbers: ``ms = fixed + a * flops_ms + b * bytes_ms + c * serial_ms``, from ``points``
    timings whose relative error has root mean square ``rms``."""

    fixed: float
    a: float
    b: float
    c: float
    points: int
    rms: float

    def ms(self, terms: np.ndarray) -> float:
        return float(np.dot([self.fixed, self.a, self.b, self.c], terms))


def _nnls_relative(rows: np.ndarray, t: np.ndarray) -> Tuple[np.ndarray, float]:
    """The non-negative ``c`` minimising ``sum(((rows @ c) / t - 1) ** 2)`` (every subset of the columns
    solved exactly, the best non-negative one kept), and the root mean square of the relative error."""
    a = rows / t[:, None]
    y = np.ones(len(t))
    best, best_err = np.zeros(rows.shape[1]), float(len(t))
    for n in range(1, rows.shape[1] + 1):
        for cols in itertools.combinations(range(rows.shape[1]), n):
            sol, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
            if np.any(sol < 0):
                continue
            c = np.zeros(rows.shape[1])
            c[list(cols)] = sol
            err = float(np.sum((a @ c - y) ** 2))
            if err < best_err:
                best, best_err = c, err
    return best, math.sqrt(best_err / max(1, len(t)))


@dataclass
class CostModel:
    """The fitted groups of one or more GPUs' records (:func:`fit`); :meth:`ms` prices a candidate on a device."""

    groups: Dict[str, Group]
    fitted_on: Tuple[str, ...] = ()

    def priced(self, candidate: str, problem: Problem, device) -> Tuple[Optional[str], Optional[float]]:
        """``(group, ms)``: the model's milliseconds of ``candidate`` on ``problem`` on ``device`` (a
        :class:`DeviceSpec` or its key or name) and the group that priced it; ``(None, None)`` where no group of
        the candidate was fitted."""
        spec = device if isinstance(device, DeviceSpec) else _spec(device)
        names, terms = candidate_terms(candidate, problem, spec)
        for name in names:
            if name in self.groups:
                return name, self.groups[name].ms(terms)
        return None, None

    def ms(self, candidate: str, problem: Problem, device) -> Optional[float]:
        """The model's milliseconds of ``candidate`` (see :meth:`priced`), or None."""
        return self.priced(candidate, problem, device)[1]

    def pick(self, candidates: Sequence[str], problem: Problem, device) -> Optional[str]:
        """The candidate the model prices lowest among those a group of their own prices (a variant, a family, a
        PyTorch form); the pooled group of all Warp kernels prices the others, which are picked only where no
        candidate has a group of its own (the model knows nothing of them but what all kernels share). None where
        it prices none."""
        priced = {c: self.priced(c, problem, device) for c in candidates}
        own = {c: ms for c, (g, ms) in priced.items() if g is not None and g != "warp"}
        pool = own or {c: ms for c, (g, ms) in priced.items() if g is not None}
        return min(pool, key=lambda c: (pool[c], c)) if pool else None


def fit(shapes: Sequence[TimedShape], min_points: int = MIN_POINTS) -> CostModel:
    """The model fitted on the timings of ``shapes`` (each on its own device's peaks). A ValueError where no group
    has ``min_points`` timings."""
    rows: Dict[str, List[np.ndarray]] = {}
    times: Dict[str, List[float]] = {}
    for ts in shapes:
        spec = _SPECS[ts.device]
        for cand, ms in ts.times.items():
            names, terms = candidate_terms(cand, ts.problem, spec)
            for name in names:
                rows.setdefault(name, []).append(terms)
                times.setdefault(name, []).append(ms)
    groups = {}
    for name in sorted(rows):
        if len(rows[name]) < min_points:
            continue
        c, rms = _nnls_relative(np.array(rows[name]), np.array(times[name]))
        groups[name] = Group(*(float(v) for v in c), len(rows[name]), rms)
    if not groups:
        raise ValueError(f"records: no group of candidates has {min_points} timings to fit")
    return CostModel(groups, tuple(sorted({ts.device for ts in shapes})))


# ------------------------------------------------------------------------------------------------ the score

@dataclass(frozen=True)
class Miss:
    """A timed shape where the model's pick was more than ``within`` slower than the fastest measured."""

    layer: str
    batch: int
    pick: str
    pick_ms: float
    best: str
    best_ms: float

    @property
    def ratio(self) -> float:
        return self.pick_ms / self.best_ms


@dataclass(frozen=True)
class Score:
    """How many of ``shapes`` timed shapes the model's pick was within ``within`` of the fastest measured
    (``hits``); ``unpriced``: shapes where the model priced none of the candidates (counted as misses, left out of
    ``misses``); ``candidates``: the timings the picks chose among."""

    hits: int
    shapes: int
    within: float
    candidates: int
    unpriced: int
    misses: Tuple[Miss, ...]

    @property
    def share(self) -> float:
        return self.hits / self.shapes if self.shapes else 0.0


def score(model: CostModel, shapes: Sequence[TimedShape], within: float = WITHIN) -> Score:
    """Score the model's picks on ``shapes`` (see :class:`Score`)."""
    if not within >= 0:
        raise ValueError(f"within: expected a fraction >= 0, got {within!r}")
    hits, unpriced, misses, n_cands = 0, 0, [], 0
    for ts in shapes:
        n_cands += len(ts.times)
        pick = model.pick(sorted(ts.times), ts.problem, _SPECS[ts.device])
        best, best_ms = ts.fastest()
        if pick is None:
            unpriced += 1
        elif ts.times[pick] <= (1.0 + within) * best_ms:
            hits += 1
        else:
            misses.append(Miss(ts.layer, ts.batch, pick, ts.times[pick], best, best_ms))
    misses.sort(key=lambda m: (-m.ratio, m.layer, m.batch))
    return Score(hits, len(shapes), within, n_cands, unpriced, tuple(misses))


# ------------------------------------------------------------------------------------------------ the text

def _coverage(shapes: Sequence[TimedShape]) -> str:
    pairs = {(ts.layer, ts.batch) for ts in shapes}
    runs = {ts.run for ts in shapes}
    counts = sorted(len(ts.times) for ts in shapes)
    warp = sorted(sum(1 for c in ts.times if c not in FORMS.values()) for ts in shapes)
    batches = sorted({ts.batch for ts in shapes})
    return (f"\n    {len(shapes)} timed shapes, {len(pairs)} layer-batch pairs, {len(runs)} runs, B in "
            f"{', '.join(map(str, batches))};\n    candidates per shape {counts[0]} to {counts[-1]} "
            f"(median {counts[len(counts) // 2]}), Warp kernels per shape {warp[0]} to {warp[-1]}")


def _score_line(s: Score) -> str:
    return (f"{s.hits} of {s.shapes} timed shapes ({100 * s.share:.1f}%) within {100 * s.within:g}% of the "
            f"fastest" + (f"; {s.unpriced} with no candidate priced" if s.unpriced else ""))


def report(fit_device: str, score_device: str, scope: str = "kernels", within: float = WITHIN,
           misses: int = 10, records: Optional[Iterable[dict]] = None) -> Tuple[str, Score, Score]:
    """The text of one direction (fit on every run of ``fit_device``, score on ``score_device``), its
    :class:`Score` on the latest run of each layer-batch pair (:func:`latest`) and on every run. ``records``: the
    records to read (default: those ``auto`` reads, :func:`device_records`)."""
    fit_spec, score_spec = _spec(fit_device), _spec(score_device)
    rec = list(records) if records is not None else None

    def of(spec):
        return [r for r in rec if r.get("device") == spec.name] if rec is not None else list(device_records(spec.name))
    train = timed_shapes(of(fit_spec), scope)
    if not train:
        raise ValueError(f"fit: no timed forward shapes of {fit_spec.name} in the records")
    every = timed_shapes(of(score_spec), scope)
    if not every:
        raise ValueError(f"score: no timed forward shapes of {score_spec.name} in the records")
    test = latest(every, scope)
    model = fit(train)
    s, s_all = score(model, test, within), score(model, every, within)
    lines = [f"fit on {fit_spec.name}, every run:{_coverage(train)}",
             f"score on {score_spec.name}, the latest run of each layer-batch pair:{_coverage(test)}",
             f"score on {score_spec.name}, every run:{_coverage(every)}",
             "groups fitted (ms = fixed + a * flops_ms + b * bytes_ms + c * serial_ms; rms: relative error):"]
    for name, g in model.groups.items():
        lines.append(f"  {name:22s} fixed {g.fixed * 1e3:6.1f} us  a {g.a:6.2f}  b {g.b:6.2f}  c {g.c:6.2f}  "
                     f"({g.points} timings, rms {100 * g.rms:.0f}%)")
    lines += [f"score, latest runs: {_score_line(s)}", f"score, every run: {_score_line(s_all)}"]
    if s.misses and misses:
        lines.append(f"misses of the latest runs (the {min(misses, len(s.misses))} slowest picks of "
                     f"{len(s.misses)}):")
        for m in s.misses[:misses]:
            lines.append(f"  {m.layer} B = {m.batch}: picked {m.pick} {m.pick_ms:.4f} ms, fastest {m.best} "
                         f"{m.best_ms:.4f} ms ({m.ratio:.2f}x)")
    return "\n".join(lines), s, s_all


# ------------------------------------------------------------------------------------------------ command line

PROG = "python -m fovi_lab cost-model"

#: The help text of ``python -m fovi_lab cost-model``.
DESCRIPTION = """\
Fit the forward's cost model on one GPU's records and score its picks on another's: for each timed shape (a layer
at a batch in one benchmark run), the candidate the model prices lowest, counted where its measured time is within
--within of the fastest measured. Both ways by default (fit on the H200, score on the H100, and the reverse), for
both scopes: kernels (every Warp kernel a run timed, beside the PyTorch forms) and backends (the rules' kernel
beside the PyTorch forms: the choice auto makes). Nothing runs on a GPU.

  python -m fovi_lab cost-model
  python -m fovi_lab cost-model --fit h100 --score h200 --scope kernels --misses 20
  python -m fovi_lab cost-model --out docs/cost_model.md
"""


def add_arguments(parser) -> None:
    from fovi_lab.ops.arguments import int_at_least, non_negative_float
    gpus = [k for k, s in DEVICES.items() if not s.is_cpu]
    parser.add_argument("--fit", choices=gpus, default=None,
                        help="the GPU whose records the model is fitted on (default: h200 and h100 in turn)")
    parser.add_argument("--score", choices=gpus, default=None,
                        help="the GPU whose records score the picks (default: the other of h200 and h100)")
    parser.add_argument("--scope", choices=["kernels", "backends", "both"], default="both",
                        help="which candidates a timed shape holds")
    parser.add_argument("--within", type=non_negative_float, default=WITHIN,
                        help="a pick counts within this fraction of the fastest measured")
    parser.add_argument("--misses", type=int_at_least(0), default=10, help="misses listed per direction")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="also write the output as a markdown page to PATH (docs/cost_model.md)")
    parser.add_argument("--check", default=None, metavar="PATH",
                        help="exit 1 when the page at PATH differs from what the records give")


def directions(fit_device: Optional[str], score_device: Optional[str]) -> List[Tuple[str, str]]:
    """The (fit, score) pairs the options ask for. A ValueError names a pair that is no held-out test."""
    if fit_device is None and score_device is None:
        return [("h200", "h100"), ("h100", "h200")]
    if fit_device is None or score_device is None:
        fit_device = fit_device or ("h200" if score_device == "h100" else "h100")
        score_device = score_device or ("h100" if fit_device == "h200" else "h200")
    if fit_device == score_device:
        raise ValueError(f"score: must name another GPU than --fit (both {fit_device}): the score holds a GPU out")
    return [(fit_device, score_device)]


def text(pairs: Sequence[Tuple[str, str]], scopes: Sequence[str], within: float = WITHIN, misses: int = 10,
         records: Optional[Iterable[dict]] = None) -> Tuple[str, List[Tuple[str, str, str, Score]]]:
    """The command's output for these directions and scopes, and each one's score on the latest runs."""
    rec = list(records) if records is not None else None
    parts, scores, summary = [], [], ["== summary"]
    for scope in scopes:
        for f, s in pairs:
            body, sc, sc_all = report(f, s, scope, within, misses, rec)
            parts.append(f"== scope {scope}: fit on {f}, score on {s}\n{body}")
            scores.append((scope, f, s, sc))
            summary += [f"{scope:8s} fit {f}, score {s}, latest runs: {_score_line(sc)}",
                        f"{scope:8s} fit {f}, score {s}, every run:   {_score_line(sc_all)}"]
    return "\n\n".join(parts + ["\n".join(summary)]), scores


PAGE_HEAD = """\
# The forward's cost model, scored on a GPU it was not fitted on

Generated by `python -m fovi_lab cost-model --out docs/cost_model.md` from the records `auto` reads
(`fovi_lab/records/`); `python -m fovi_lab cost-model --check docs/cost_model.md` (run by the tests) fails when
this page differs from what the records give. The model is `fovi_lab.kernels.cost_model`: each candidate (a Warp
kernel, `torch_compact`, `torch_binned`) is priced as `fixed + a * flops_ms + b * bytes_ms`, its roofline terms
on the device's datasheet peaks, the three numbers fitted per group (a family's variant, a family, all Warp
kernels, each PyTorch form) by least squares on the relative error.

What the score can and cannot say:

- The H100's forward records (one benchmark run) time, per layer and batch, one Warp kernel (the one the rules
  chose) beside the PyTorch forms. On the H100 both scopes are therefore the same choice: the rules' Warp kernel,
  `torch_compact` or `torch_binned`. It measures how well the model ranks the backends, not how well it ranks
  Warp's kernels against each other: no H100 record times two Warp kernels on one shape.
- The H200's records hold sweeps (many kernels per shape). Scored on them (scope `kernels`) the model ranks Warp's
  kernels among themselves, fitted on the H100's few: a family or variant the H100 never ran is priced by the
  pooled group of all Warp kernels.
- Both GPUs are sm_90 with the same datasheet compute peaks and different HBM bandwidths; the score says nothing
  of another architecture (A100, L40S, B200), whose records there are none of.
- A timed shape is one layer at one batch in one run. The score's first line per direction takes the latest run
  of each layer-batch pair (the kernels `auto` and the rules run; for scope `kernels` the latest sweep), the
  second every run (a pair timed in several H200 runs counts once per run, kernels since changed included).
  Graphed calls, bf16 and the runs' non-default variants (`note_run`) are left out.

What decides by it: `auto`'s backend on a GPU where neither the tune cache nor a record covers an fp16 call (a
layer or batch the benchmarks never ran, another GPU with datasheet peaks such as the A100): fitted on every GPU's
records in the `backends` scope, the scope whose picks land within 10% of the fastest on 95-97% of the other GPU's
shapes (`fovi_lab.kernels.cost_pick`; `python -m fovi_lab explain --device a100 ...` shows its estimates). It does
not choose among Warp's kernels: fitted on the H100's records, its ranking of them on the H200 falls short of 80%
within 10% (the summary's `kernels fit h100` lines), so the forward rules keep that choice.

```
"""


def page(body: str) -> str:
    return PAGE_HEAD + body.rstrip("\n") + "\n```\n"


def run(args) -> int:
    from pathlib import Path

    from fovi_lab.ops.arguments import usage_error
    try:
        pairs = directions(args.fit, args.score)
        scopes = ["kernels", "backends"] if args.scope == "both" else [args.scope]
        body, _ = text(pairs, scopes, args.within, args.misses)
    except ValueError as exc:
        what, _, why = str(exc).partition(": ")
        usage_error(PROG, f"--{what}: {why}")
    print(body)
    if args.out:
        out = Path(args.out)
        if not out.parent.is_dir():
            usage_error(PROG, f"--out: no folder {str(out.parent)!r} to write {out.name} in")
        out.write_text(page(body))
    if args.check:
        path = Path(args.check)
        if not path.is_file():
            usage_error(PROG, f"--check: no file {args.check!r}")
        if path.read_text() != page(body):
            print(f"{PROG}: {args.check} differs from what the records give "
                  f"(python -m fovi_lab cost-model --out {args.check} writes it)")
            return 1
    return 0


def main(argv=None) -> int:
    from fovi_lab.ops.arguments import command_main
    return command_main(PROG, DESCRIPTION, add_arguments, run)(argv)
