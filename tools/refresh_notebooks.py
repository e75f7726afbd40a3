"""Re-execute notebooks in place, as ``pytest --nbval`` runs them on a machine without a GPU.

Every code cell runs in order in one kernel started in ``notebooks/``, except the cells tagged ``gpu``:
those keep the outputs they have (nbval skips them without a GPU, and they feed no later cell). stderr
streams and execution time stamps are dropped, stdout chunks merged (nbval does not compare them; on a CPU machine they hold Warp's driver warning), and
so is stored widget state.

    python tools/refresh_notebooks.py notebooks/00_foveated_knn_graph.ipynb [...]
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


def refresh(path: Path, timeout: int = 1200) -> None:
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    with client.setup_kernel():
        for i, cell in enumerate(nb.cells):
            if cell.cell_type != "code" or "gpu" in (cell.metadata.get("tags") or []):
                continue
            client.execute_cell(cell, i)
            cell.outputs = _coalesce([o for o in cell.outputs
                                      if not (o.get("output_type") == "stream" and o.get("name") == "stderr")])
            cell.metadata.pop("execution", None)   # wall-clock stamps: noise in every diff
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    print(f"{path}: {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        refresh(Path(arg))
