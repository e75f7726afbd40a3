"""Every ``FOVI_*`` environment variable the package reads: one table, read on each access, validated.

:data:`SETTINGS` lists each variable with its kind, its default (what the code does when it is unset), what it
does, who should touch it, and whether it changes the work a kernel does. The code reads a variable only through
:func:`get`, which looks at ``os.environ`` on every call (a process may set a variable at any time before the
call it is meant for) and raises ``ValueError`` naming the variable, the value and what was expected.

The variables that change a kernel's work (:data:`KERNEL_AFFECTING`) are part of the replay signature of the
Warp backends (:mod:`fovi_lab.ops.replay`) and of the tune cache's setup key (:mod:`fovi_lab.ops.tune_cache`):
both take them from :func:`snapshot`. ``docs/settings.md`` is :func:`render_markdown` of the table
(:func:`write_docs` writes it; a test checks it).

This module is the package's bottom layer: it imports nothing of ``fovi_lab``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

__all__ = ["Setting", "SETTINGS", "KERNEL_AFFECTING", "get", "raw", "snapshot", "kernel_values", "ab_switches_set",
           "unknown_set", "override", "render_markdown", "write_docs"]

#: The kinds of value a variable takes.
KINDS = ("choice", "count", "number", "flag", "path", "text")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _or(words) -> str:
    words = list(words)
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


@dataclass(frozen=True)
class Setting:
    """One ``FOVI_*`` variable.

    ``kind``: ``"choice"`` (one of ``choices``), ``"count"`` (a whole number >= 0, or one of the words in
    ``choices``), ``"number"`` (a finite number > 0; >= 0 with ``zero_ok``), ``"flag"`` (1/true/yes/on or
    0/false/no/off, any case), ``"path"`` (a file path) or ``"text"`` (any text). ``default``: the value
    :func:`get` returns when the variable is unset (None: the code's own rule, which ``unset`` describes).
    ``kernel``: whether the value changes the work a kernel does. ``ab_only``: a switch for comparing kernels,
    not for users.
    """

    name: str
    kind: str
    default: object
    what: str
    who: str
    kernel: bool
    ab_only: bool = False
    choices: Tuple[str, ...] = ()
    fold_case: bool = False         # choice: compared (and returned) lower-cased
    zero_ok: bool = False           # number: 0 is accepted
    unit: str = ""                  # count / number: the unit of the value ("MiB")
    empty_is_unset: bool = True     # False: an empty value is an error rather than the default
    unset: str = ""                 # the default in words, where the value alone does not say it

    def __post_init__(self):
        if not self.name.startswith("FOVI_"):
            raise ValueError(f"{self.name}: a setting's name starts with FOVI_")
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "choice" and not self.choices:
            raise ValueError(f"{self.name}: a choice needs its choices")

    def expected(self) -> str:
        """What a value of this variable may be, in words."""
        unit = f" of {self.unit}" if self.unit else ""
        if self.kind == "choice":
            return _or(repr(c) for c in self.choices) + (" (any case)" if self.fold_case else "")
        if self.kind == "count":
            return _or([repr(c) for c in self.choices] + [f"a whole number{unit} >= 0"])
        if self.kind == "number":
            return f"a number{unit} {'>=' if self.zero_ok else '>'} 0"
        if self.kind == "flag":
            return _or(repr(w) for w in _TRUE + _FALSE) + " (any case)"
        if self.kind == "path":
            return "a file path"
        return "any text"

    def parse(self, value: Optional[str]):
        """The value :func:`get` returns for the raw string ``value`` (None: unset)."""
        if value is None:
            return self.default
        empty = (value.strip() if self.kind == "flag" else value) == ""
        if empty and self.empty_is_unset:
            return self.default
        if self.kind == "choice":
            v = value.lower() if self.fold_case else value
            if v in self.choices:
                return v
        elif self.kind == "count":
            if value in self.choices:
                return value
            try:
                n = int(value)
            except ValueError:
                n = -1
            if n >= 0:
                return n
        elif self.kind == "number":
            try:
                x = float(value)
            except ValueError:
                x = math.nan
            if math.isfinite(x) and (x > 0 or (self.zero_ok and x == 0)):
                return x
        elif self.kind == "flag":
            v = value.strip().lower()
            if v in _TRUE:
                return True
            if v in _FALSE:
                return False
        elif self.kind == "path":
            return Path(value)
        else:
            return value
        raise ValueError(f"{self.name}: expected {self.expected()}, got {value!r}")

    def default_text(self) -> str:
        """The default in words (for the docs)."""
        if self.unset:
            return self.unset
        if self.kind == "flag":
            return "off" if self.default is False else "on"
        if self.kind == "number":
            return f"{self.default:g}" + (f" {self.unit}" if self.unit else "")
        if self.kind == "count" and self.unit and isinstance(self.default, int):
            return f"{self.default} {self.unit}"
        return str(self.default)


_A_B = "kernel A/B runs"
_SWEEPS = "kernel sweeps"
_USERS_MEMORY = "users (memory)"


def _switch(name: str, kind: str, default, what: str, who: str = _A_B, **more) -> Setting:
    """A switch for comparing kernels (A/B only): it changes the work a kernel does."""
    return Setting(name, kind, default, what, who, kernel=True, ab_only=True, **more)


def _budget(name: str, default: float, what: str) -> Setting:
    """A memory budget in MiB (0 accepted; an empty value is an error) that the kernels' work is fitted to."""
    return Setting(name, "number", default, what, _USERS_MEMORY, kernel=True, zero_ok=True, unit="MiB",
                   empty_is_unset=False)


#: The table. The kernel-affecting entries keep their relative order: it is the order of the switches in the tune
#: cache's setup key, so a new one goes after them (the keys of an existing cache stay the same).
SETTINGS: Tuple[Setting, ...] = (
    Setting("FOVI_WARP_MATHDX", "flag", None,
            "Builds the tile GEMMs of the forward and staged adjoint kernels with cuBLASDx (on) or as scalar loops "
            "(off: much faster to compile, much slower to run).",
            "users (compile time), tests", kernel=True,
            unset="Warp's own setting (cuBLASDx on CUDA)"),
    _switch("FOVI_WARP_MMA", "choice", "auto",
            "`off` keeps the forward's rules off the tensor-core kernels (the tile and SIMT rules only); `auto` "
            "lets them pick those kernels.", choices=("auto", "off")),
    _switch("FOVI_KNN_GRAD_PATH", "choice", "auto",
            "The adjoint kernels of `warp_train`: the fused node-major ones (`fused`), the staged ones (`staged`), "
            "or the rule (`auto`: fused where Cin >= 16).", choices=("fused", "staged", "auto")),
    _switch("FOVI_KNN_DX_PATH", "choice", "auto",
            "dx of `warp_train` on the tensor-core forward of the transposed layer (`mma`), on the tensor-core "
            "forward of the tap-expanded layer and a reverse-list sum (`taps`, fp16 calls: the stems' dx on "
            "tensor cores), never on the tensor cores (`off`), or where the rule picks it (`auto`).",
            f"{_A_B}, benchmarks", choices=("mma", "taps", "off", "auto")),
    _switch("FOVI_KNN_DW_PATH", "choice", "auto",
            "dW of `warp_train` on the tensor-core forward of the tap layer (`mma`), never there (`off`), or where "
            "the rule picks it (`auto`).", f"{_A_B}, benchmarks", choices=("mma", "off", "auto")),
    _switch("FOVI_KNN_FWD_PATH", "choice", "auto",
            "The forward of the Warp backends: the compact kernels (`compact`, and `auto`) or the binned form "
            "(`binned`).", choices=("binned", "compact", "auto")),
    Setting("FOVI_WARP_I2C_MIB", "number", 32.0,
            "Budget of the i2c forward's im2col stage: nodes are gathered and multiplied in chunks that fit it.",
            f"{_USERS_MEMORY}, tests", kernel=True, unit="MiB"),
    _budget("FOVI_KNN_GRAD_STAGE_MIB", 64.0,
            "Stage budget of the staged Warp adjoints, capped by `FOVI_KNN_STAGE_MIB`: batches and nodes are "
            "chunked to fit it."),
    _budget("FOVI_KNN_FUSED_PARTIAL_MIB", 64.0,
            "Budget of the fused adjoints' partial sums: segment tables over it are refused, splits are capped "
            "to fit it."),
    _budget("FOVI_KNN_STAGE_MIB", 512.0,
            "Budget of the temporaries of the PyTorch ops and the staged adjoints: their work is chunked to "
            "fit it."),
    Setting("FOVI_KNN_TAP_TABLE_MIB", "count", 512,
            "Largest index tables of a derived (transposed or tap) layer: a layer over it is refused, and "
            "`warp_train` keeps the layer's own adjoint kernels.",
            _USERS_MEMORY, kernel=True, unit="MiB", empty_is_unset=False),
    Setting("FOVI_KNN_REPLAY", "choice", "auto",
            "Which CUDA calls of the Warp backends are replayed from CUDA graphs: those up to 64 MiB of tensors "
            "(`auto`), all (`on`) or none (`off`); `in-place`: those of `auto`, each from a graph captured on "
            "its tensors' addresses where their memory comes back call after call, with no copy in or out.",
            "users", kernel=False, choices=("auto", "on", "off", "in-place"), fold_case=True),
    Setting("FOVI_TUNE_CACHE", "path", None,
            "The autotune cache that `python -m fovi_lab tune` writes and `backend=\"auto\"` reads.",
            "users", kernel=False, unset="`$XDG_CACHE_HOME/fovi_lab/tune.json` (`~/.cache/fovi_lab/tune.json`)"),
    Setting("FOVI_KNN_AUTO_MEASURE", "flag", True,
            "On the CPU, `backend=\"auto\"` times each of its forms once per call shape (layer, batch, dtype, "
            "forward or train step) at that shape's first call and keeps the fastest in the tune cache, keyed by "
            "this machine (CPU model, cores, versions); `off`: it runs the estimate's pick and measures nothing.",
            "users, tests", kernel=False),
    Setting("FOVI_COMMIT", "text", None,
            "The commit that benchmark records name as their source (where the package runs from a copy without git).",
            "benchmarks", kernel=False, unset="the checkout's `git rev-parse --short HEAD` (none for an installed package)"),
    Setting("FOVI_BENCH_VERBOSE", "flag", False,
            "Progress lines on stderr from the adjoints benchmark (it sets this for its child process).",
            "benchmarks", kernel=False),
)

_TABLE: Dict[str, Setting] = {s.name: s for s in SETTINGS}
#: The names whose values change a kernel's work, in :data:`SETTINGS` order.
KERNEL_AFFECTING: Tuple[str, ...] = tuple(s.name for s in SETTINGS if s.kernel)


def _entry(name: str) -> Setting:
    try:
        return _TABLE[name]
    except KeyError:
        raise KeyError(f"{name!r} is not a setting of fovi_lab (fovi_lab.settings.SETTINGS lists them)") from None


def get(name: str):
    """The value of the variable ``name``, read from ``os.environ`` on this call and validated: its
    :data:`SETTINGS` default when unset; ``ValueError`` naming the variable for a bad value; ``KeyError`` for a
    name that is not in the table."""
    return _entry(name).parse(os.environ.get(name))


def raw(name: str) -> Optional[str]:
    """The variable's string as the environment holds it (None when unset), unvalidated."""
    _entry(name)
    return os.environ.get(name)


# os.environ's own mapping (CPython; on POSIX its keys and values are bytes): one lookup per variable, with no
# decoding. A scan of the whole environment took 14 us per call on the H200 machine
# (data/h200/replay_host_profile.jsonl), more than a small replayed call's other host work.
_RAW_ENV = getattr(os.environ, "_data", None)
_ENCODE_KEY = getattr(os.environ, "encodekey", None)
if _RAW_ENV is None or _ENCODE_KEY is None:   # pragma: no cover - not CPython's os.environ
    _RAW_ENV = None


@functools.lru_cache(maxsize=None)
def _keys(names: Tuple[str, ...]) -> tuple:
    for n in names:
        _entry(n)
    return tuple(_ENCODE_KEY(n) for n in names) if _RAW_ENV is not None else tuple(names)


_KERNEL_KEYS = _keys(KERNEL_AFFECTING)


def snapshot(names: Optional[Tuple[str, ...]] = None) -> tuple:
    """The raw values of the kernel-affecting variables at this call (or of ``names``, a tuple of table names), None
    where unset: a cheap, hashable signature part (one dictionary lookup per variable, nothing validated or
    decoded; two snapshots are equal when the variables are)."""
    keys = _KERNEL_KEYS if names is None else _keys(names)
    if _RAW_ENV is not None:
        return tuple(map(_RAW_ENV.get, keys))
    return tuple(map(os.environ.get, keys))     # pragma: no cover - not CPython's os.environ


def kernel_values() -> Dict[str, str]:
    """``{name: value}`` of the kernel-affecting variables that are set, in :data:`SETTINGS` order."""
    env = os.environ
    return {n: env[n] for n in KERNEL_AFFECTING if n in env}


def ab_switches_set(values: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """Of ``values`` (raw strings by name, as :func:`kernel_values` gives them and records keep them; default: the
    environment's), the A/B switches (``ab_only``) whose value is not their default, and any name the table does not
    know: ``{name: value}``. A run under one measured a variant of the kernels, not what the package's rules run;
    the build and memory settings are no A/B switches. An empty value is unset; a value the variable refuses counts."""
    values = kernel_values() if values is None else values
    out = {}
    for name, value in values.items():
        entry = _TABLE.get(name)
        if entry is None:
            out[name] = value
            continue
        if not entry.ab_only:
            continue
        try:
            parsed = entry.parse(None if value is None else str(value))
        except ValueError:
            out[name] = value
            continue
        if parsed != entry.default:
            out[name] = value
    return out


#: The prefixes of the package's own variables: one set under them that the table does not know is a misspelt
#: setting (the tools' and tests' variables, ``FOVI_GPU_SCRATCH`` or ``FOVI_TEST_*``, lie outside them).
OWN_PREFIXES = ("FOVI_KNN_", "FOVI_WARP_")


def unknown_set(environ=None) -> Dict[str, Optional[str]]:
    """The variables of ``environ`` (default: the process's) under :data:`OWN_PREFIXES` that no setting has:
    ``{name: the setting it most likely meant, or None}``. Nothing reads them, so a misspelt switch would change
    nothing without a word; importing the package warns once about each (:func:`warn_unknown`)."""
    import difflib

    environ = os.environ if environ is None else environ
    names = sorted(n for n in environ if n.startswith(OWN_PREFIXES) and n not in _TABLE)
    return {n: next(iter(difflib.get_close_matches(n, list(_TABLE), n=1, cutoff=0.8)), None) for n in names}


def warn_unknown(environ=None) -> None:
    """Warn once per variable of :func:`unknown_set`, naming the setting it most likely meant."""
    import warnings

    for name, meant in unknown_set(environ).items():
        hint = f" (did you mean {meant}?)" if meant else ""
        warnings.warn(f"{name} is set, but no fovi_lab setting has that name{hint}: it changes nothing "
                      f"(fovi_lab.settings.SETTINGS and docs/settings.md list the settings)", UserWarning,
                      stacklevel=2)


@contextlib.contextmanager
def override(**values) -> Iterator[None]:
    """Set variables for the duration of a ``with`` block (``override(FOVI_KNN_REPLAY="off")``; None unsets one),
    and afterwards put back what the environment held. Each value is validated before anything is set."""
    for name, value in values.items():
        if value is not None:
            _entry(name).parse(str(value))
        else:
            _entry(name)
    old = {name: os.environ.get(name) for name in values}

    def put(name, value):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)

    try:
        for name, value in values.items():
            put(name, value)
        yield
    finally:
        for name, value in old.items():
            put(name, value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown() -> str:
    """``docs/settings.md``: the table, one row per variable, sorted by name."""
    lines = [
        "# Settings: the `FOVI_*` environment variables",
        "",
        "Generated from the table `fovi_lab.settings.SETTINGS` by `fovi_lab.settings.write_docs()`; "
        "`tests/test_settings.py` checks that this file is what the table gives.",
        "",
        "Each variable is read when the code needs it (a process may set it any time before that call), and a "
        "bad value raises `ValueError` naming the variable and what it expects. An empty value is the same as "
        "unset, except where the kind says otherwise. *Kernel work*: whether the value changes the work a kernel "
        "does; those variables are part of the Warp backends' replay signature (`fovi_lab.ops.replay`) and of "
        "the tune cache's setup key (`fovi_lab.ops.tune_cache`), so a change captures new graphs and misses "
        "the tuned entries. *A/B only*: a switch for comparing kernels, not for everyday use. A variable set "
        "under `FOVI_KNN_` or `FOVI_WARP_` that is not in this table (a misspelt name) gets a warning when the "
        "package is imported, naming the setting it most likely meant.",
        "",
        "| Variable | Kind | Default | Kernel work | A/B only | Who | What it does |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in sorted(SETTINGS, key=lambda s: s.name):
        kind = s.kind + ": " + s.expected().replace("'", "`")
        if not s.empty_is_unset:
            kind += " (empty: an error)"
        lines.append("| " + " | ".join(_cell(c) for c in (
            f"`{s.name}`", kind, s.default_text(), "yes" if s.kernel else "no", "yes" if s.ab_only else "",
            s.who, s.what)) + " |")
    return "\n".join(lines) + "\n"


def write_docs(path: Optional[Path] = None) -> Path:
    """Write :func:`render_markdown` to ``path`` (default: ``docs/settings.md`` of the source checkout this module
    lies in); returns the path."""
    path = Path(__file__).resolve().parents[1] / "docs" / "settings.md" if path is None else Path(path)
    path.write_text(render_markdown())
    return path


warn_unknown()
