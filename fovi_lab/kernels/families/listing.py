"""``python -m fovi_lab configs``: the forward kernel families, their parameters and their named presets, in
words, with the compact id of each (the id any ``config=`` argument takes)."""

from __future__ import annotations

from typing import List, Optional

from fovi_lab.kernels.families.registry import FAMILIES, aliases, family, presets
from fovi_lab.ops.arguments import command_main


def listing(family_key: Optional[str] = None, experimental: bool = False) -> str:
    """The text of the command: per family, its title, parameters (with their values) and presets."""
    lines: List[str] = []
    for fam in FAMILIES if family_key is None else (family(family_key),):
        lines.append(f"{fam.title}  ({fam.key}; kernel factory in {fam.module})")
        for p in fam.params:
            lines.append(f"  {p.name:13s} {p.label}: {', '.join(map(str, p.values))}")
        shown = presets(fam.key, experimental=experimental)
        lines.append(f"  presets ({len(shown)}{'' if experimental else ', registered'}):")
        for pr in shown:
            tag = "  (experimental)" if pr.why.startswith("experimental") else ""
            lines.append(f"    {pr.name:22s} {fam.describe(pr.point)}{tag}")
        lines.append("")
    lines.append(f"Any point of a family runs by its id (e.g. config=\"mma_o48b32k32\"); {len(aliases())} preset names "
                 f"differ from the id their parameters give, and both forms are accepted.")
    return "\n".join(lines)


def render_markdown() -> str:
    """``docs/kernels.md``: every family with its parameters, checks and presets (registered and experimental)."""
    from fovi_lab.kernels.families.registry import DEVICES
    lines = [
        "# The forward kernel families",
        "",
        "Generated from the registry `fovi_lab.kernels.families` by `fovi_lab.kernels.families.listing.write_docs()`; "
        "`tests/test_families.py` checks that this file is what the registry gives.",
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
        lines += [f"## {fam.title} (`{fam.key}`)", "", (fam.__class__.__module__ and
                  __import__(fam.__class__.__module__, fromlist=["_"]).__doc__ or "").strip().split("\n\n")[0]
                  .replace("\n", " "), "",
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
    return "\n".join(lines) + "\n"


def write_docs(path=None):
    """Write :func:`render_markdown` to ``path`` (default: ``docs/kernels.md`` of the source checkout)."""
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "docs" / "kernels.md" if path is None else Path(path)
    path.write_text(render_markdown())
    return path


DESCRIPTION = """\
List the forward kernel families: each one's parameters with the values a point may take, and its named presets
in words beside their ids (the names records, tune caches and config= arguments use).

  python -m fovi_lab configs
  python -m fovi_lab configs --family tensor_cores --experimental
"""


def add_arguments(parser) -> None:
    parser.add_argument("--family", choices=[f.key for f in FAMILIES], default=None,
                        help="list only this family (default: every family)")
    parser.add_argument("--experimental", action="store_true",
                        help="also list the experimental presets (runnable by name, never picked by a rule)")


def run(args) -> int:
    print(listing(args.family, args.experimental))
    return 0


main = command_main("python -m fovi_lab configs", DESCRIPTION, add_arguments, run)


__all__ = ["listing", "render_markdown", "write_docs", "DESCRIPTION", "add_arguments", "run", "main"]
