"""Re-execute notebooks in place, as ``pytest --nbval`` runs them on a machine without a GPU.

Every code cell runs in order in one kernel started in ``notebooks/``, except the cells tagged ``gpu``:
those keep the outputs they have (nbval skips them without a GPU, and they feed no later cell), and so do
cells that display a widget (they run, but their stored rendering stays: the widget is live in JupyterLab,
and nbval ignores their output). stderr
streams and execution time stamps are dropped, stdout chunks merged (nbval does not compare them; on a CPU machine they hold Warp's driver warning), and
so is stored widget state.

    python tools/refresh_notebooks.py [-v] notebooks/01_foveated_knn_graph.ipynb [...]   (-v: time each cell)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient


def _coalesce(outputs):
    """Merge consecutive stdout chunks: how a print loop's text is split depends on timing."""
    out = []
    for o in outputs:
        if out and o.get("output_type") == "stream" and out[-1].get("output_type") == "stream" \
                and out[-1].get("name") == o.get("name"):
            out[-1]["text"] = out[-1]["text"] + o["text"]
        else:
            out.append(o)
    return out


_WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


class _Client(NotebookClient):
    """nbclient without its Output-widget capture: it hangs or fails on ``clear_output(wait=True)`` inside
    an Output widget (notebook 03's explorer). Widget output then lands in the cell, as nbval sees it."""

    def handle_comm_msg(self, outs, msg, cell_index):
        return None


def refresh(path: Path, timeout: int = 600, verbose: bool = False) -> None:
    nb = nbformat.read(path, as_version=4)
    client = _Client(nb, timeout=timeout, kernel_name="python3", store_widget_state=False,
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or "gpu" in (cell.metadata.get("tags") or []):
                continue
            t_cell = time.perf_counter()
            before = cell.outputs
            client.execute_cell(cell, i)
            if any(_WIDGET_VIEW in o.get("data", {}) for o in before):
                cell.outputs = before     # a widget cell keeps its rendering (the widget is live in JupyterLab)
            if verbose:
                print(f"  cell {i}: {time.perf_counter() - t_cell:.1f} s", flush=True)
            cell.outputs = _coalesce([o for o in cell.outputs
                                      if not (o.get("output_type") == "stream" and o.get("name") == "stderr")])
            cell.metadata.pop("execution", None)   # wall-clock stamps: noise in every diff
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    print(f"{path}: {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "-v"]
    for arg in args:
        refresh(Path(arg), verbose="-v" in sys.argv[1:])
