"""``python -m fovi_lab configs``: the kernel families (forward and adjoint), their parameters and their named
presets, in words, with the compact id of each (the id any ``config=`` argument takes)."""

from __future__ import annotations

from typing import List, Optional

from fovi_lab.kernels.families.registry import ADJOINT_FAMILIES, FAMILIES, aliases, family, presets
from fovi_lab.ops.arguments import command_main

#: What the adjoint part of the listing says first: how the adjoint build and plan modules name a kernel.
ADJOINT_INTRO = ("The adjoint families. The adjoint modules name a kernel by a kind and a name (kind gi with "
                 "gi3_p64b128_f32, kind dxs with dxn_m64n64k64); the name is an id of the kind's family, and any "
                 "point of a family runs by its id, as the forward ones do.")


def _family_lines(fam, experimental: bool) -> List[str]:
    """One family in the listing: its title, key (and kinds), parameters with their values, and presets."""
    kinds = f"; kinds {', '.join(fam.kinds)}" if fam in ADJOINT_FAMILIES else ""
    lines = [f"{fam.title}  ({fam.key}{kinds}; kernel factory in {fam.module})"]
    for p in fam.params:
        lines.append(f"  {p.name:13s} {p.label}: {', '.join(map(str, p.values))}")
    shown = presets(fam.key, experimental=experimental)
    lines.append(f"  presets ({len(shown)}{'' if experimental else ', registered'}):")
    for pr in shown:
        tag = "  (experimental)" if pr.why.startswith("experimental") else ""
        lines.append(f"    {pr.name:22s} {fam.describe(pr.point)}{tag}")
    if getattr(fam, "forms_words", ""):
        lines.append(f"  {fam.forms_words}")
    return lines + [""]


def listing(family_key: Optional[str] = None, experimental: bool = False) -> str:
    """The text of the command: per family, its title, parameters (with their values) and presets; the forward
    families first, the adjoint ones after them (or the one family ``family_key``)."""
    chosen = None if family_key is None else family(family_key)
    forward = [f for f in FAMILIES if chosen in (None, f)]
    adjoint = [f for f in ADJOINT_FAMILIES if chosen in (None, f)]
    lines: List[str] = []
    for fam in forward:
        lines += _family_lines(fam, experimental)
    if forward:
        lines.append(f"Any point of a family runs by its id (e.g. config=\"mma_o48b32k32\"); {len(aliases())} preset "
                     f"names differ from the id their parameters give, and both forms are accepted.")
    if adjoint:
        lines += ([""] if forward else []) + [ADJOINT_INTRO, ""]
    for fam in adjoint:
        lines += _family_lines(fam, experimental)
    return "\n".join(lines).rstrip("\n")


def render_markdown() -> str:
    """``docs/kernels.md``: every family with its parameters, checks and presets (registered and experimental)."""
    from fovi_lab.kernels.families.registry import DEVICES
    lines = [
        "# The kernel families",
        "",
        "The forward families first, the adjoint ones after them (`python -m fovi_lab configs` lists both).",
        "",
        "# The forward kernel families",
        "",
        "Generated from the registry `fovi_lab.kernels.families` by `fovi_lab.kernels.families.listing.write_docs()`; "
        "`tests/kernels/families/test_families.py` checks that this file is what the registry gives.",
        "",
        "A family is one kernel with parameters; a *point* fixes them all and is one compiled kernel. Its readable "
        "name and its compact id are derived from the parameters; any point whose parameters combine runs by its "
        "id (`config=\"mmat_o48b32k32\"`), after the canary validates it once per device. The presets are the "
        "named points of `fovi_lab/kernels/forward/configs.toml`: *registered* ones the rules may pick and "
        "`warmup` builds, *experimental* ones kept runnable for sweeps and notebooks. To see which a call runs and "
        "why the other families are not it: `python -m fovi_lab explain --layer res18_layer1 --batch 16` "
        "(`fovi_lab.explain`).",
        "",
        "Each family's `check(point, problem, device)` gives the reasons a point cannot run a call: parameters that "
        "make no kernel, shared memory over what a block may hold (or Warp's CPU tile arena), the architecture, the "
        "dtype, the tables' form, divisibility. Its `estimate(point, problem, device)` is the roofline time: the "
        "larger of the padded FLOPs at the device's datasheet peak (fp16 tensor cores, or fp32 CUDA cores for the "
        "SIMT kernels) and the bytes moved (the fewest, plus the family's per-call layouts) at its bandwidth. The "
        "devices with known figures: " + ", ".join(f"{d.name} ({k})" for k, d in DEVICES.items() if k != "cpu") + ".",
        "",
    ]
    for fam in FAMILIES:
        lines += [f"## {fam.title} (`{fam.key}`)", "", _module_summary(fam), "",
                  f"Kernel factory: `{fam.module}`. Variants (the prefixes of the ids): "
                  + ", ".join(f"`{v}`" for v in fam.variants) + ".", "",
                  "| parameter | what it is | values |", "|---|---|---|"]
        for p in fam.params:
            lines.append(f"| `{p.name}` | {p.label} | {', '.join(map(str, p.values))} |")
        lines += ["", "| preset | in words | kind |", "|---|---|---|"]
        for pr in presets(fam.key):
            lines.append(f"| `{pr.name}` | {fam.describe(pr.point)} | {pr.why.split(':')[0]} |")
        lines.append("")
    al = aliases()
    lines += ["## Aliases", "", "Preset names that differ from the id their parameters give (both are accepted):", "",
              "| derived id | preset |", "|---|---|"]
    lines += [f"| `{d}` | `{n}` |" for d, n in sorted(al.items())]
    lines += ["", "# The adjoint kernel families", "",
              "The presets are the named points of `fovi_lab/kernels/adjoint/configs.toml`; each preset's name is the "
              "id its parameters give. " + ADJOINT_INTRO.split(". ", 1)[1] + " The checks and the roofline take the "
              "forward call's problem (its gradients have the same shapes): the bytes are the gradient's, and a "
              "staged kernel's stage is among the bytes it moves.", ""]
    for fam in ADJOINT_FAMILIES:
        lines += [f"## {fam.title} (`{fam.key}`)", "", _module_summary(fam), "",
                  f"Kernel factory: `{fam.module}`. Kinds: " + ", ".join(f"`{k}`" for k in fam.kinds)
                  + ". Variants (the prefixes of the ids): " + ", ".join(f"`{v}`" for v in fam.variants) + ".", "",
                  "| parameter | what it is | values |", "|---|---|---|"]
        lines += [f"| `{p.name}` | {p.label} | {', '.join(map(str, p.values))} |" for p in fam.params]
        lines += ["", "| preset | in words |", "|---|---|"]
        lines += [f"| `{pr.name}` | {fam.describe(pr.point)} |" for pr in presets(fam.key)]
        lines += ["", fam.forms_words, ""] if fam.forms_words else [""]
    return "\n".join(lines).rstrip("\n") + "\n"


def _module_summary(fam) -> str:
    """The first paragraph of the family's module docstring, on one line."""
    doc = __import__(fam.__class__.__module__, fromlist=["_"]).__doc__ or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ")


def write_docs(path=None):
    """Write :func:`render_markdown` to ``path`` (default: ``docs/kernels.md`` of the source checkout)."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "docs" / "kernels.md" if path is None else Path(path)
    path.write_text(render_markdown())
    return path


DESCRIPTION = """\
List the kernel families, forward and adjoint: each one's parameters with the values a point may take, and its
named presets in words beside their ids (the names records, tune caches and config= arguments use).

  python -m fovi_lab configs
  python -m fovi_lab configs --family tensor_cores --experimental
  python -m fovi_lab configs --family fused_dx
"""


def add_arguments(parser) -> None:
    parser.add_argument("--family", choices=[f.key for f in FAMILIES + ADJOINT_FAMILIES], default=None,
                        help="list only this family (default: every family)")
    parser.add_argument("--experimental", action="store_true",
                        help="also list the experimental presets (runnable by name, never picked by a rule)")


def run(args) -> int:
    print(listing(args.family, args.experimental))
    return 0


main = command_main("python -m fovi_lab configs", DESCRIPTION, add_arguments, run)


__all__ = ["listing", "render_markdown", "ADJOINT_INTRO", "write_docs", "DESCRIPTION", "add_arguments", "run", "main"]
