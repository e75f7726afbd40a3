"""Execute notebooks on the GPU machine (gpu-tagged cells included), time each, record errors and gpu output.

    python3 tools/gpu/run_notebooks.py [notebooks/XX.ipynb ...]       (default: every notebook; writes $OUT)
    python tools/gpu/run_notebooks.py --merge OUT1.json OUT2.json ... > data/notebooks_h200.json

Each call writes ``$OUT/notebooks_h200.json``: ``meta`` (device, driver, Warp and torch versions, date, the
commit from ``FOVI_COMMIT``, how) and one row per notebook. ``--merge`` joins the files of several calls (one
call cannot hold every notebook inside the device's 10-minute limit) in notebook order.
"""
import glob, json, os, subprocess, sys, time
from datetime import date

HOW = ("nbclient execution of each notebook top to bottom on the GPU machine, gpu-tagged cells included, in "
       "one kernel per notebook started in notebooks/; Warp compiled every kernel there, into a cache shared by "
       "the notebooks of one call")


def _meta():
    import torch, warp
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip().split(", ")
    return {"device": smi[0], "driver": smi[1] if len(smi) > 1 else None, "warp": warp.config.version,
            "torch": torch.__version__, "date": date.today().isoformat(),
            "commit": os.environ.get("FOVI_COMMIT"), "how": HOW}


def run(paths):
    import nbformat
    from nbclient import NotebookClient
    budget = float(os.environ.get("NB_BUDGET", "540"))
    t_start = time.perf_counter()
    results = []
    for path in paths:
        left = budget - (time.perf_counter() - t_start)
        if left < 30:
            results.append({"notebook": path, "status": "not run (budget)"}); continue
        nb = nbformat.read(path, as_version=4)
        client = NotebookClient(nb, timeout=int(min(400, left)), kernel_name="python3",
                                resources={"metadata": {"path": "notebooks"}})
        t0 = time.perf_counter()
        try:
            client.execute()
            status = "ok"
        except Exception as exc:
            status = f"{type(exc).__name__}: {str(exc)[-600:]}"
        dt = time.perf_counter() - t0
        code = [c for c in nb.cells if c.cell_type == "code"]
        gpu = [c for c in code if "gpu" in c.metadata.get("tags", [])]
        errors = [o.get("ename") for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
        gpu_text = [o["text"][-1500:] for c in gpu for o in c.get("outputs", [])
                    if o.get("output_type") == "stream" and o.get("name") == "stdout"]
        results.append({"notebook": path, "status": status, "seconds": round(dt, 1), "code_cells": len(code),
                        "gpu_cells": len(gpu), "errors": errors, "gpu_stdout": gpu_text})
        print(f"{path}: {status[:200]} in {dt:.1f} s ({len(gpu)} gpu cells)", flush=True)
    return {"meta": _meta(), "notebooks": results}


def merge(files):
    parts = [json.load(open(f)) for f in files]
    metas = [{k: v for k, v in p["meta"].items() if k != "date"} for p in parts]
    if any(m != metas[0] for m in metas):
        sys.exit(f"the calls ran on different set-ups: {metas}")
    rows = sorted((r for p in parts for r in p["notebooks"]), key=lambda r: r["notebook"])
    meta = dict(parts[0]["meta"], date=max(p["meta"]["date"] for p in parts))
    return {"meta": meta, "notebooks": rows}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--merge"]:
        print(json.dumps(merge(sys.argv[2:]), indent=1))
    else:
        out = run(sys.argv[1:] or sorted(glob.glob("notebooks/*.ipynb")))
        json.dump(out, open(os.path.join(os.environ["OUT"], "notebooks_h200.json"), "w"), indent=1)
