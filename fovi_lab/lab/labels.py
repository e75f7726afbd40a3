"""Kernel configs in words, for the figures' axes, legends and tables: what a learner reads in place of a config id.

* :func:`kernel_label`: a forward preset or id through the kernel families' readable names
  (:func:`fovi_lab.kernels.families.registry.describe`), a staged adjoint's stage config from its spec
  (:data:`fovi_lab.kernels.adjoint.GRAD_INPUT_CONFIG_SPECS` / ``GRAD_WEIGHT_CONFIG_SPECS``); the id itself only where
  neither knows the name.
* :func:`tick_label`: the same, one phrase a line, for a categorical axis.
* :func:`CONFIG_ID`: the pattern of a config id, which the notebook checks look for in figure labels.
"""

from __future__ import annotations

import re
from typing import Optional

__all__ = ["kernel_label", "tick_label", "CONFIG_ID", "stage_label"]

#: A config id as the presets, derived ids and stage configs spell them (``mmato_o64b32b256``, ``m64n128r2``,
#: ``nm_m64n64k64``, ``gi2_p64b128_f32``...).
CONFIG_ID = re.compile(r"\b(?:mma[a-z]*_o\d+\w*|nm[ps]?_m\d+\w*|(?:c_|gp_)?m\d+n\d+(?!k16\b)\w*|i2cg?_m\d+\w*|"
                       r"s[a-z]*_b\d+o\d+\w*|simt[a-z]*_[a-z]*\d+\w*|g[iw]\d[a-z]?_p\d+\w*|dxn_m\d+\w*|"
                       r"dwn_o\d+\w*)\b")

_GRID = {"2": "a block per node and batch tile", "3": "blocks over node, p tile and batch tile",
         "4": "blocks over node and p tile, two channel tiles each"}
_EXTRA = {"p": "operands prefetched into registers", "i": "operands staged by a row copy"}


def stage_label(name: str) -> Optional[str]:
    """A staged adjoint's stage config (``gi2_p64b128``, ``gw3i_p64n96k16_f32``) in words; None for another name."""
    from fovi_lab.kernels.adjoint import GRAD_INPUT_CONFIG_SPECS, GRAD_WEIGHT_CONFIG_SPECS

    base, fp32 = (name[:-4], True) if name.endswith("_f32") else (name, False)
    spec = GRAD_INPUT_CONFIG_SPECS.get(base) or GRAD_WEIGHT_CONFIG_SPECS.get(base)
    if spec is None:
        return None
    version = str(spec["version"])
    if base.startswith("gi"):
        words = [f"dx stage, {spec['tile_p']} p x {spec['tile_b']} batch tile, {spec['tile_o']} channels per step"]
    else:
        words = [f"dW stage, {spec['tile_p']} p x {spec['tile_n']} channel tile, "
                 f"{spec.get('tile_kb', 64)} batch rows per step"]
    words.append(_GRID[version[0]])
    words += [_EXTRA[c] for c in version[1:] if c in _EXTRA]
    words.append("fp32 stage" if fp32 else "fp16 stage")
    return ", ".join(words)


def kernel_label(name: str, sep: str = ", ", title: bool = True) -> str:
    """``name`` (a forward preset or id, or a staged adjoint's stage config) in words, its phrases joined by
    ``sep``; ``title=False`` leaves out the family's title (where the figure names the family). A name neither
    the families nor the stage configs know is returned as it is."""
    words = stage_label(name)
    if words is None:
        from fovi_lab.kernels.families import registry

        try:
            pt = registry.lookup(name)
        except ValueError:
            return name
        fam = registry.family(pt.family)
        words = fam.describe(pt)
        if not title and words.startswith(fam.title + ", "):
            words = words[len(fam.title) + 2:]
    return words.replace(", ", sep)


def tick_label(name: str, title: bool = True) -> str:
    """:func:`kernel_label` one phrase a line (``<br>`` between them), for a categorical axis of a figure."""
    return kernel_label(name, sep="<br>", title=title)
