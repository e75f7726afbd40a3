"""Execute every notebook on the GPU machine (gpu-tagged cells included), time each, record errors."""
import glob, json, os, sys, time
import nbformat
from nbclient import NotebookClient
out = os.environ["OUT"]
budget = float(os.environ.get("NB_BUDGET", "480"))
t_start = time.perf_counter()
results = []
for path in sorted(glob.glob("notebooks/*.ipynb")):
    left = budget - (time.perf_counter() - t_start)
    if left < 30:
        results.append({"notebook": path, "status": "not run (budget)"}); continue
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=int(min(300, left)), kernel_name="python3", resources={"metadata": {"path": "notebooks"}})
    t0 = time.perf_counter()
    try:
        client.execute()
        status = "ok"
    except Exception as exc:
        status = f"{type(exc).__name__}: {str(exc)[-600:]}"
    dt = time.perf_counter() - t0
    gpu_cells = sum(1 for c in nb.cells if c.cell_type == "code" and "gpu" in c.metadata.get("tags", []))
    errors = [o.get("ename") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    gpu_text = []
    for c in nb.cells:
        if c.cell_type == "code" and "gpu" in c.metadata.get("tags", []):
            for o in c.get("outputs", []):
                if o.get("output_type") == "stream" and o.get("name") == "stdout":
                    gpu_text.append(o["text"][-1500:])
    results.append({"notebook": path, "status": status, "seconds": round(dt, 1), "gpu_cells": gpu_cells,
                    "errors": errors, "gpu_stdout": gpu_text})
    print(f"{path}: {status[:200]} in {dt:.1f} s ({gpu_cells} gpu cells)", flush=True)
json.dump(results, open(os.path.join(out, "notebooks_h200.json"), "w"), indent=1)
