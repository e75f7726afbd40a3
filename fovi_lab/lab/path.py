"""The learner's path through the notebooks: one list, in reading order, and what is written from it.

Each :class:`Step` names a notebook by its file stem (``notebooks/<stem>.ipynb``; the stem's number is the step's
place on the path), its title (the words after ``NN · `` in the notebook's heading and in every link to it), its idea
in one line, and what to read first (earlier steps' stems, or a word for what the lab assumes, ``PyTorch``).

From :data:`STEPS` ``python tools/learner_path.py --write`` writes the README's notebooks table, the line under each
notebook's heading (its step and what to read first) and the line that ends each notebook (previous and next step);
:func:`problems` lists every place where the README, the file names, a heading or a link disagrees with the list
(``tests/lab/test_learner_path.py``).
"""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Step", "STEPS", "README_BEGIN", "HEAD_BEGIN", "FOOT_BEGIN", "END", "step_of", "number", "link",
           "readme_table", "head_block", "foot_block", "with_readme_table", "with_path_lines", "without_path_lines",
           "notebook_sources", "problems"]


@dataclass(frozen=True)
class Step:
    stem: str                    # the notebook's file name without .ipynb, its step number first
    title: str                   # the heading after "NN · ", the text of every link to it
    idea: str                    # one line: what the notebook teaches
    read_first: tuple            # earlier steps' stems, or words for what is assumed ("PyTorch")


STEPS: tuple = (
    Step("01_foveated_knn_graph", "The foveated KNN graph",
         "a foveated layer as two index tables: the grid, a node's neighbours and taps, the reverse lists",
         ("PyTorch",)),
    Step("02_compact_forward", "The compact forward",
         "one output node is one GEMM over gathered rows; the tiled Warp kernel, its FLOPs, bytes and roofline",
         ("01_foveated_knn_graph",)),
    Step("03_silent_launch_canary", "The silent-launch canary",
         "a tile's shared-memory bill, what a launch past the limit does, and the NaN canary that catches it",
         ("02_compact_forward",)),
    Step("04_weight_reuse", "Weight reuse",
         "one gathered weight tile for several batch tiles: the traffic model, measured, and the rule",
         ("02_compact_forward",)),
    Step("05_adjoint_staging", "Adjoint staging",
         "both gradients as per-node GEMMs, staged and summed through reverse lists: a deterministic backward",
         ("01_foveated_knn_graph", "02_compact_forward")),
    Step("06_fused_adjoints", "Fused adjoints",
         "the reduction fused into the GEMM loop, and uneven lists balanced in segments, still bitwise",
         ("05_adjoint_staging",)),
    Step("07_training", "Training",
         "a foveated network trained on digits through `warp_train`, beside `torch_compact`",
         ("01_foveated_knn_graph",)),
    Step("08_eager_host_path", "The eager call",
         "where an eager step's time goes: launches and host microseconds counted, and CUDA-graph replay",
         ("02_compact_forward", "07_training")),
    Step("09_tensor_cores_by_hand", "Tensor cores by hand",
         "`mma.sync` from a Warp native snippet: a warp's fragments, the node GEMM transposed, three operand layouts",
         ("02_compact_forward", "04_weight_reuse")),
    Step("10_tuning_tensor_cores", "Tuning the tensor-core kernel",
         "bytes in flight decide the pick: the split p loop, deeper loops, the staged store, the rule, the H200 record",
         ("09_tensor_cores_by_hand",)),
    Step("11_pipelined_tensor_cores", "The pipelined tensor-core forward",
         "the large-batch forward through shared memory: `cp.async` stages, `ldmatrix`, a swizzled tile",
         ("10_tuning_tensor_cores",)),
    Step("12_adjoints_on_tensor_cores", "The adjoints on tensor cores",
         "dx and dW as forwards of derived layers, so the tensor-core kernels compute them too; the stems' dW in "
         "batch chunks, their dx on a tap-expanded layer",
         ("06_fused_adjoints", "10_tuning_tensor_cores")),
    Step("13_small_shapes", "Small shapes",
         "shapes too small for tiles: the stems' im2col, SIMT register blocks, the split p loop, binning",
         ("02_compact_forward", "09_tensor_cores_by_hand")),
)

#: The README line above its notebooks table; the table runs to the first line that does not start with ``|``.
README_BEGIN = "<!-- notebooks table: written by python tools/learner_path.py --write from fovi_lab/lab/path.py -->"
#: The notebooks' own lines: under the heading (the step, what to read first) and at the end (previous, next).
HEAD_BEGIN = "<!-- path, step and read first: written by tools/learner_path.py from fovi_lab/lab/path.py -->"
FOOT_BEGIN = "<!-- path, previous and next: written by tools/learner_path.py from fovi_lab/lab/path.py -->"
END = "<!-- end of the path lines -->"
README_LINK = "../README.md#notebooks"
WIDTH = 120

_BY_STEM = {s.stem: s for s in STEPS}


def step_of(stem: str) -> Step:
    """The step of notebook ``stem`` (KeyError for a stem not on the path)."""
    return _BY_STEM[stem]


def number(stem: str) -> str:
    """The step number of ``stem`` as its file name writes it: ``"03"``."""
    return stem.split("_", 1)[0]


def link(stem: str) -> str:
    """A markdown link to notebook ``stem`` from another notebook: ``[03 · The silent-launch canary](03_...ipynb)``."""
    return f"[{number(stem)} · {step_of(stem).title}]({stem}.ipynb)"


def _wrap(text: str) -> list:
    """``text`` in lines of at most :data:`WIDTH` columns, never breaking a link's words."""
    kept = re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(" ", "\0"), text)
    return [line.replace("\0", " ") for line in
            textwrap.wrap(kept, WIDTH, break_long_words=False, break_on_hyphens=False)]


def readme_table(cpu_seconds: dict | None = None) -> list:
    """The README's notebooks table, one string a line: step, notebook (a link), idea, read first (step numbers),
    CPU seconds first run / later runs from ``cpu_seconds`` (``data/notebooks_cpu.json``'s ``notebooks``)."""
    cpu_seconds = cpu_seconds or {}
    lines = ["| step | notebook | the idea | read first | CPU s |", "|---|---|---|---|---|"]
    for s in STEPS:
        first = ", ".join(number(r) if r in _BY_STEM else r for r in s.read_first)
        t = cpu_seconds.get(s.stem) or {}
        secs = (f"{t['cold_s']:.0f} / {t['warm_s']:.0f}" if t.get("cold_s") is not None
                and t.get("warm_s") is not None else "–")
        lines.append(f"| {int(number(s.stem))} | [`{s.stem}`](notebooks/{s.stem}.ipynb) | {s.idea} | {first} "
                     f"| {secs} |")
    return lines


def head_block(stem: str) -> str:
    """The lines under notebook ``stem``'s heading: its step on the path and what to read first."""
    s = step_of(stem)
    first = ", ".join(link(r) if r in _BY_STEM else r for r in s.read_first)
    words = f"*Step {int(number(stem))} of {len(STEPS)} on [the path]({README_LINK}). Read first: {first}.*"
    return "\n".join([HEAD_BEGIN] + _wrap(words) + [END])


def foot_block(stem: str) -> str:
    """The lines that end notebook ``stem``: the previous step and the next one with its idea."""
    i = [s.stem for s in STEPS].index(stem)
    words = [f"**Step {i + 1} of {len(STEPS)}** on [the path]({README_LINK})."]
    if i > 0:
        words.append(f"Previous: {link(STEPS[i - 1].stem)}.")
    if i + 1 < len(STEPS):
        nxt = STEPS[i + 1]
        words.append(f"Next: {link(nxt.stem)}: {nxt.idea}.")
    else:
        words.append("This is the last step.")
    return "\n".join([FOOT_BEGIN] + _wrap(" ".join(words)) + [END])


def with_readme_table(text: str, cpu_seconds: dict | None = None) -> str:
    """``text`` (the README) with the table under :data:`README_BEGIN` written from the list."""
    lines = text.split("\n")
    try:
        start = lines.index(README_BEGIN) + 1
    except ValueError:
        raise ValueError(f"the README has no line {README_BEGIN!r}") from None
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return "\n".join(lines[:start] + readme_table(cpu_seconds) + lines[end:])


_BLOCK = re.compile(r"(<!-- path, [^>]*-->)\n.*?\n" + re.escape(END), re.S)


def with_path_lines(stem: str, sources: list) -> list:
    """The markdown sources of notebook ``stem``'s cells (``sources[0]`` its first cell, ``sources[-1]`` its last)
    with the path lines written: under the heading of the first, at the end of the last (replacing what they held)."""
    out = list(sources)
    head, foot = head_block(stem), foot_block(stem)
    title, _, rest = _BLOCK.sub("", out[0]).partition("\n")
    out[0] = f"{title}\n\n{head}\n\n{rest.lstrip(chr(10))}".rstrip("\n")
    last = _BLOCK.sub("", out[-1]).rstrip("\n")
    out[-1] = f"{last}\n\n{foot}"
    return out


def without_path_lines(source: str) -> str:
    """A markdown cell's ``source`` without the path lines written from the list (navigation, not prose)."""
    return _BLOCK.sub("", source)


def notebook_sources(path: Path) -> list:
    """``(cell_type, source)`` of each cell of the notebook at ``path``."""
    nb = json.loads(Path(path).read_text())
    return [(c["cell_type"], "".join(c["source"]) if isinstance(c["source"], list) else c["source"])
            for c in nb["cells"]]


_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*?)(\.ipynb)(#[^)]*)?\)")
_NAV = re.compile(r"^\s*(Next|Previous|Back to( the start)?)\s*:", re.M | re.I)


def _link_problems(name: str, text: str, stems: set) -> list:
    out = []
    for m in _LINK.finditer(text):
        words, target = " ".join(m.group(1).split()), m.group(2)
        if target not in stems:
            out.append(f"{name}: a link to {target}.ipynb, not a notebook on the path")
            continue
        n, title = number(target), step_of(target).title
        said = re.match(r"(?:[Nn]otebook )?(\d\d)\b(?: · (.*))?$", words)
        if said and (said.group(1) != n or (said.group(2) is not None and said.group(2) != title)):
            out.append(f"{name}: the link [{words}] to {target}.ipynb should say {n} · {title}")
    return out


def problems(root: Path, cpu_seconds: dict | None = None) -> list:
    """Every disagreement with :data:`STEPS` under ``root`` (the repository), one sentence each; [] when none:
    the notebooks in ``notebooks/`` against the list's stems, the README's table, each notebook's heading, its path
    lines (under the heading, at the end) and every link from a notebook to a notebook."""
    root = Path(root)
    out = []
    stems = {s.stem for s in STEPS}
    files = {p.stem for p in (root / "notebooks").glob("*.ipynb")}
    out += [f"notebooks/{s}.ipynb is not on the path" for s in sorted(files - stems)]
    out += [f"the path's step {s} has no notebooks/{s}.ipynb" for s in sorted(stems - files)]
    for i, s in enumerate(STEPS):
        if number(s.stem) != f"{i + 1:02d}":
            out.append(f"{s.stem} is step {i + 1} of the list: its file name should start {i + 1:02d}_")
        earlier = {t.stem for t in STEPS[:i]}
        for r in s.read_first:
            if r in stems and r not in earlier:
                out.append(f"{s.stem} reads {r} first, which is not an earlier step")
            elif r not in stems and re.match(r"\d\d_", r):
                out.append(f"{s.stem} reads {r} first, which is not a notebook on the path")
    readme = (root / "README.md").read_text()
    if cpu_seconds is None:
        cpu_file = root / "data" / "notebooks_cpu.json"
        cpu_seconds = json.loads(cpu_file.read_text()).get("notebooks", {}) if cpu_file.exists() else {}
    try:
        if with_readme_table(readme, cpu_seconds) != readme:
            out.append("README.md: the notebooks table differs from the list (python tools/learner_path.py --write)")
    except ValueError as e:
        out.append(f"README.md: {e}")
    for s in STEPS:
        path = root / "notebooks" / f"{s.stem}.ipynb"
        if not path.exists():
            continue
        name = f"notebooks/{s.stem}.ipynb"
        cells = notebook_sources(path)
        md = [src for kind, src in cells if kind == "markdown"]
        if not md or cells[0][0] != "markdown" or cells[-1][0] != "markdown":
            out.append(f"{name}: its first and last cells should be markdown")
            continue
        heading = f"# {number(s.stem)} · {s.title}"
        if not md[0].startswith(heading):
            out.append(f"{name}: its heading should start {heading!r}")
        if [cells[0][1], cells[-1][1]] != with_path_lines(s.stem, [cells[0][1], cells[-1][1]]):
            out.append(f"{name}: its path lines differ from the list (python tools/learner_path.py --write)")
        for src in md:
            out += _link_problems(name, src, stems)
            outside = without_path_lines(src)
            for m in _NAV.finditer(outside):
                out.append(f"{name}: a {m.group(1)!r} line outside the path lines: only the list says what is next")
    return out
