"""Kernel configs in words, for the figures' axes, legends and tables: what a learner reads in place of a config id.

* :func:`kernel_label`: a forward preset or id through the kernel families' readable names
  (:func:`fovi_lab.kernels.families.registry.describe`), a staged adjoint's stage config from its spec
  (:data:`fovi_lab.kernels.adjoint.GRAD_INPUT_CONFIG_SPECS` / ``GRAD_WEIGHT_CONFIG_SPECS``), a fused adjoint's
  config from its spec (:data:`fovi_lab.kernels.adjoint.fused.DX_NM_CONFIG_SPECS` / ``DW_NM_CONFIG_SPECS``); the
  id itself only where none of them knows the name.
* :func:`short_label`: the same, compact, for a table column (``tensor cores 64x32, x^T, staged store``).
* :func:`tick_label`: the same, one phrase a line, for a categorical axis.
* :func:`path_words`: a gradient's path (``"mma"``, ``"fused"``, ``"staged"``) in words.
* :func:`CONFIG_ID`: the pattern of a config id, which the notebook checks look for in figure labels and in
  printed text.
"""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["kernel_label", "short_label", "tick_label", "CONFIG_ID", "stage_label", "path_words", "PATH_WORDS"]

#: A config id as the presets, derived ids, stage configs and fused adjoint configs spell them (``mmato_o64b32b256``,
#: ``m64n128r2``, ``nm_m64n64k64``, ``gi2_p64b128_f32``, ``dxn_m64n16k64``, ``dwn_o64c64k16`` and its tiles
#: ``o64c64k16`` without the prefix...).
CONFIG_ID = re.compile(r"\b(?:mma[a-z]*_o\d+\w*|nm[ps]?_m\d+\w*|(?:c_|gp_)?m\d+n\d+(?!k16\b)\w*|i2cg?_m\d+\w*|"
                       r"s[a-z]*_b\d+o\d+\w*|simt[a-z]*_[a-z]*\d+\w*|g[iw]\d[a-z]?_p\d+\w*|dxn_m\d+\w*|"
                       r"dwn_o\d+\w*|o\d+c\d+k\d+)\b")

#: A gradient's path (:func:`fovi_lab.knn_warp.grad_paths`) in words.
PATH_WORDS = {"mma": "tensor cores", "taps": "tensor cores (tap-expanded layer)", "fused": "fused kernels",
              "staged": "staged kernels"}


def path_words(path: str) -> str:
    """A gradient's path in words: ``"mma"`` -> ``"tensor cores"``; a name it does not know, as it is."""
    return PATH_WORDS.get(path, path)


_GRID = {"2": "a block per node and batch tile", "3": "blocks over node, p tile and batch tile",
         "4": "blocks over node and p tile, two channel tiles each"}
_EXTRA = {"p": "operands prefetched into registers", "i": "operands staged by a row copy"}
_EXTRA_SHORT = {"p": "prefetch", "i": "row copy"}


def _stage_words(name: str, short: bool) -> Optional[str]:
    """A staged adjoint's stage config in words (``short``: compact, the grids by notebook 05's names); None for
    another name."""
    from fovi_lab.kernels.adjoint import GRAD_INPUT_CONFIG_SPECS, GRAD_WEIGHT_CONFIG_SPECS

    base, fp32 = (name[:-4], True) if name.endswith("_f32") else (name, False)
    spec = GRAD_INPUT_CONFIG_SPECS.get(base) or GRAD_WEIGHT_CONFIG_SPECS.get(base)
    if spec is None:
        return None
    version, gi = str(spec["version"]), base.startswith("gi")
    if short:
        words = [f"dx {spec['tile_p']} p x {spec['tile_b']} rows" if gi else f"dW {spec['tile_p']} p x {spec['tile_n']} ch"]
        if gi and spec["tile_o"] != 64:
            words.append(f"{spec['tile_o']} ch/step")
        if not gi and spec.get("tile_kb", 64) != 64:
            words.append(f"{spec['tile_kb']} rows/step")
        words.append(f"{base[:2]}{version[0]} grid")
    elif gi:
        words = [f"dx stage, {spec['tile_p']} p x {spec['tile_b']} batch tile, {spec['tile_o']} channels per step",
                 _GRID[version[0]]]
    else:
        words = [f"dW stage, {spec['tile_p']} p x {spec['tile_n']} channel tile, "
                 f"{spec.get('tile_kb', 64)} batch rows per step", _GRID[version[0]]]
    extra = _EXTRA_SHORT if short else _EXTRA
    words += [extra[c] for c in version[1:] if c in extra]
    words.append("fp32 stage" if fp32 else "fp16 stage")
    return ", ".join(words)


def stage_label(name: str) -> Optional[str]:
    """A staged adjoint's stage config (``gi2_p64b128``, ``gw3i_p64n96k16_f32``) in words; None for another name."""
    return _stage_words(name, short=False)


def _fused_tiles(name: str):
    """``(dx?, tile, tile, step)`` of a fused adjoint config (``dxn_m64n16k64``, ``dwn_o64c64k16``), else None."""
    from fovi_lab.kernels.adjoint.fused import DW_NM_CONFIG_SPECS, DX_NM_CONFIG_SPECS

    if name in DX_NM_CONFIG_SPECS:
        return (True,) + DX_NM_CONFIG_SPECS[name][:3]
    if name in DW_NM_CONFIG_SPECS:
        return (False,) + DW_NM_CONFIG_SPECS[name][:3]
    return None


def _fused_label(name: str) -> Optional[str]:
    from fovi_lab.kernels.adjoint.fused import nm_config_words

    words = nm_config_words(name)
    return None if words is None else f"fused {'dx' if name.startswith('dx') else 'dW'}, {words}"


def _point(name: str):
    from fovi_lab.kernels.families import registry

    try:
        return registry.lookup(name)
    except ValueError:
        return None


def kernel_label(name: str, sep: str = ", ", title: bool = True) -> str:
    """``name`` (a forward preset or id, a staged adjoint's stage config or a fused adjoint's config) in words, its
    phrases joined by ``sep``; ``title=False`` leaves out the family's title (where the figure names the family). A
    name none of them knows is returned as it is."""
    words = stage_label(name) or _fused_label(name)
    if words is None:
        from fovi_lab.kernels.families import registry

        pt = _point(name)
        if pt is None:
            return name
        fam = registry.family(pt.family)
        words = fam.describe(pt)
        if not title and words.startswith(fam.title + ", "):
            words = words[len(fam.title) + 2:]
    return words.replace(", ", sep)


def tick_label(name: str, title: bool = True) -> str:
    """:func:`kernel_label` one phrase a line (``<br>`` between them), for a categorical axis of a figure."""
    return kernel_label(name, sep="<br>", title=title)


#: A family's title in a table column (:func:`short_label`).
_SHORT_TITLE = {"tensor_cores": "tensor cores", "pipelined": "pipelined tensor cores", "simt": "SIMT",
                "node_major": "node-major", "im2col": "im2col", "tile_gemm": "gather tiles", "cached": "cached Weff"}


def _warps(m: "re.Match") -> str:
    return f"{m[1]} warp{'' if m[1] == '1' else 's'}"


#: A phrase of a family's readable name (:meth:`~fovi_lab.kernels.families.base.Family.describe`) -> its form in
#: a table column; a phrase none of these match stays as it is.
_SHORT_PHRASES = (
    (re.compile(r"(\d+) \w+ x (\d+) \w+ per (?:warp|block|tile|thread)"), r"\1x\2"),
    (re.compile(r"(\d+) p entr(?:y|ies) per (step|stage)"), r"\1 p/\2"),
    (re.compile(r"(\d+) channels per step"), r"\1 ch/step"),
    (re.compile(r"(\d+) warps? per block"), _warps),
    (re.compile(r"(\d+) batch tiles share each weight tile"), r"r = \1"),
    (re.compile(r"x\^T layout"), "x^T"),
    (re.compile(r"W read in place"), "W in place"),
    (re.compile(r"(?:p loop|p range|neighbour loop) split"), "split"),
    (re.compile(r"stores through a shared tile"), "staged store"),
    (re.compile(r"next (?:tiles|indices) prefetched"), "prefetch"),
    (re.compile(r"W read as 4-vectors"), "W as vec4"),
    (re.compile(r"fp32 operands as 4-vectors"), "fp32 vec4"),
    (re.compile(r"W gathered in the kernel"), "W gathered"),
)


def _short_phrase(phrase: str) -> str:
    for pattern, repl in _SHORT_PHRASES:
        if pattern.fullmatch(phrase):
            return pattern.sub(repl, phrase)
    return phrase


def short_label(name: str, title: bool = True) -> str:
    """:func:`kernel_label` compact, for a table column: the family in a word or two, the tile as ``AxB`` in the
    family's own order (tensor cores: channels x rows; the tile GEMMs and SIMT: rows x channels) and the other
    phrases shortened (``tensor cores 64x32, 8 warps, x^T, staged store``; ``dx 64 p x 128 rows, gi3 grid, fp32 stage``;
    ``fused dW 64x64, 16-deep``). ``title=False`` leaves out the family (where the table names it). A name none of
    them knows is returned as it is."""
    words = _stage_words(name, short=True)
    if words is not None:
        return words
    tiles = _fused_tiles(name)
    if tiles is not None:
        dx, a, b, k = tiles
        shape = f"{a}x{b}, {k}-deep"
        return f"fused {'dx' if dx else 'dW'} {shape}" if title else shape
    pt = _point(name)
    if pt is None:
        return name
    phrases = [_short_phrase(p) for p in kernel_label(name, title=False).split(", ")]
    head = " ".join(([_SHORT_TITLE.get(pt.family, pt.family)] if title else []) + phrases[:1])
    return ", ".join([head] + phrases[1:])
