"""Time every notebook on this machine's CPU, as a learner runs it, and record the times: the README's path quotes them.

Each notebook's code cells run in order in one fresh kernel started in ``notebooks/`` (``gpu`` cells skipped, as
nbval skips them without a GPU), nothing written back. A *cold* run starts with an empty Warp kernel cache (a
temporary ``WARP_CACHE_PATH``: every kernel the notebook needs is compiled, as on a learner's first run); the *warm*
run after it finds them compiled. The record (``data/notebooks_cpu.json``) carries the device (the CPU model), the core count,
the versions, the date, the commit and the command.

    python tools/time_notebooks.py [notebooks/NN_name.ipynb ...]     (default: every notebook)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from refresh_notebooks import _Client  # noqa: E402  (nbclient without its Output-widget capture)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "notebooks_cpu.json"


def run_seconds(path: Path, cache: str) -> float:
    """Seconds to run ``path``'s code cells (``gpu`` cells left out) in one kernel with ``WARP_CACHE_PATH=cache``."""
    nb = nbformat.read(path, as_version=4)
    env = dict(os.environ, WARP_CACHE_PATH=cache)
    client = _Client(nb, timeout=1800, kernel_name="python3", store_widget_state=False,
                     resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    with client.setup_kernel(env=env):
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and "gpu" not in (cell.metadata.get("tags") or []):
                client.execute_cell(cell, i)
    return time.perf_counter() - t0


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv) -> int:
    import torch
    import warp

    paths = [Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    times = {}
    for path in paths:
        with tempfile.TemporaryDirectory() as cache:
            cold = run_seconds(path, cache)
            warm = run_seconds(path, cache)
        times[path.stem] = {"cold_s": round(cold, 1), "warm_s": round(warm, 1)}
        print(f"{path.stem}: cold {cold:.0f} s, warm {warm:.0f} s", flush=True)
    doc = {"about": "Seconds to run each notebook's code cells top to bottom on a CPU (gpu cells left out): cold = an "
                    "empty Warp kernel cache (every kernel compiled), warm = the run after it.",
           "device": f"cpu ({_cpu_model()})", "cpu": _cpu_model(), "cores": os.cpu_count(), "python": sys.version.split()[0], "torch": torch.__version__,
           "warp": warp.config.version, "date": time.strftime("%Y-%m-%d"), "commit": commit,
           "command": "python tools/time_notebooks.py " + " ".join(argv), "notebooks": times}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
