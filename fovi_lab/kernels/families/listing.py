"""``python -m fovi_lab configs``: the forward kernel families, their parameters and their named presets, in
words, with the compact id of each (the id any ``config=`` argument takes)."""

from __future__ import annotations

from typing import List, Optional

from fovi_lab.kernels.families.registry import FAMILIES, aliases, family, presets


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


def main(argv=None) -> int:
    from fovi_lab.ops.arguments import CommandParser
    parser = CommandParser(prog="python -m fovi_lab configs", description=DESCRIPTION)
    add_arguments(parser)
    return run(parser.parse_args(argv))


__all__ = ["listing", "DESCRIPTION", "add_arguments", "run", "main"]
