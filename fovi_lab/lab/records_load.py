"""Read the benchmark records the lab's figures and tables show: the shipped ones (``fovi_lab/records/``) and a
checkout's ``data/``, or the files of any folder, keeping one device's records (the H200's by default) and naming
a record measured on another reference frame as that variant of its layer.
"""

from __future__ import annotations

import fnmatch
import glob
from pathlib import Path
from typing import List, Optional, Sequence

from fovi_lab.graph.layers import LAYERS, RF_MULT, layer_name
from fovi_lab.ops.records import LOCAL_DIR, RECORDS_DIR, iter_records, read_file


#: A checkout's own records (``data/``); the shipped ones are under :data:`RECORDS_DIR`.
DATA_DIR = LOCAL_DIR
#: The shipped logs the figures read (host probes, Nsight Compute summary, cubin registers).
LOGS_DIR = RECORDS_DIR / "h200" / "logs"


#: The device whose recorded runs the notebooks' figures and tables show by default (the records of other devices,
#: e.g. ``fovi_lab/records/h100``, are read with ``device=None`` or their own name).
RECORDED_DEVICE = "NVIDIA H200"


def load_records(data_dir=None, patterns: Sequence[str] = ("*.jsonl", "*.jsonl.gz"),
                 device: Optional[str] = RECORDED_DEVICE) -> List[dict]:
    """Every benchmark record of ``device`` (None: every device) whose source file matches one of ``patterns``: the
    shipped records and a checkout's ``data/`` (:func:`fovi_lab.ops.records.iter_records`), or the files of
    ``data_dir`` matching ``patterns``. Each is tagged ``_file`` with its source file (one benchmark run writes one
    source). ``.gz`` files are read through gzip. Unreadable lines are skipped; no folder means ``[]``.

    A record measured on another reference frame than its layer's network frame is named as that variant
    (``layer`` becomes e.g. ``"res18_stem_rf2"``, :func:`fovi_lab.graph.layers.layer_name`), so a name always means
    one table."""
    if data_dir is None:
        recs = (r for r in iter_records() if any(fnmatch.fnmatch(r["source"], pat) for pat in patterns))
    else:
        d = Path(data_dir)
        paths = sorted({p for pat in patterns for p in glob.glob(str(d / pat))})
        recs = (r for p in paths for r in read_file(Path(p)))
    out: List[dict] = []
    for r in recs:
        if device is not None and r.get("device") != device:
            continue
        if "impl" in r and "layer" in r:
            r["_file"] = r["source"]
            if r["layer"] in LAYERS and r.get("rf") in RF_MULT:
                r["layer"] = layer_name(r["layer"], r["rf"])
            out.append(r)
    return out


def kind_records(kind: str, device: Optional[str] = RECORDED_DEVICE) -> List[dict]:
    """Every shipped record of one kind (``fovi_lab/records/<device>/<kind>.jsonl.gz``) of ``device`` (None: every
    device), as recorded."""
    return [r for path in sorted(RECORDS_DIR.glob(f"*/{kind}.jsonl.gz")) for r in read_file(path)
            if device is None or r.get("device") == device]


def forward_records(data_dir=None, variants: bool = False) -> List[dict]:
    """Forward records (:mod:`fovi_lab.bench.forward`): the ones without a backward ``mode``. Records
    flagged ``note_run`` (development runs, non-default variants) only with ``variants=True``."""
    return [r for r in load_records(data_dir) if "mode" not in r and (variants or not r.get("note_run"))]


def backward_records(data_dir=None, mode: Optional[str] = None, variants: bool = False) -> List[dict]:
    """Backward / train-step records (:mod:`fovi_lab.bench.backward`: they carry ``mode``); ``note_run``
    records only with ``variants=True``."""
    recs = [r for r in load_records(data_dir) if "mode" in r and (variants or not r.get("note_run"))]
    return [r for r in recs if mode is None or r.get("mode") == mode]
