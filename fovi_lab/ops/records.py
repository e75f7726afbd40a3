"""The benchmark records this package ships, and the ones a checkout adds: where they are and how to read them.

Shipped records (package data, so a wheel install has them): ``fovi_lab/records/<device>/<kind>.jsonl.gz``, one JSON
object per line, kinds ``forward``, ``forward_sweep``, ``mma_sweep``, ``train_step``, ``backward``, ``fused_sweep``,
``compile_latency``, listed with their sources in ``manifest.json`` beside them. Every record carries its provenance in
fields: ``device``, ``warp``, ``torch``, ``cuda``, ``python``, ``date`` (the start of the benchmark run that wrote it)
and ``source`` (the record file that run wrote). New runs of ``python -m fovi_lab bench ...`` append to
``data/<kind>_<device>.jsonl`` under the current folder (or to their ``--out``). Run from a source checkout (the
package folder beside the checkout's ``pyproject.toml``), :func:`iter_records` reads the checkout's own ``data/``
too; an installed package reads only the records it ships (nothing beside it in ``site-packages`` is a data folder).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Dict, Iterator, List, Optional

__all__ = ["RECORDS_DIR", "CHECKOUT_ROOT", "LOCAL_DIR", "record_files", "read_file", "iter_records", "manifest"]

#: The shipped records.
RECORDS_DIR = Path(__file__).resolve().parents[1] / "records"


def _checkout_root() -> Optional[Path]:
    """The source checkout this package runs from: the folder above the package when it holds the
    ``pyproject.toml`` of fovi-lab; None for an installed package (a wheel in ``site-packages``)."""
    root = Path(__file__).resolve().parents[2]
    try:
        import tomllib
        project = tomllib.loads((root / "pyproject.toml").read_text()).get("project", {})
    except (OSError, ValueError):
        return None
    return root if project.get("name") == "fovi-lab" else None


#: The source checkout the package runs from, or None for an installed package.
CHECKOUT_ROOT: Optional[Path] = _checkout_root()
#: A checkout's own records, ``<checkout>/data`` (read by :func:`iter_records` beside the shipped ones). An installed
#: package has no such folder: there this is ``data`` under the current folder at import, where the benchmarks write
#: by default, and :func:`iter_records` does not read it.
LOCAL_DIR: Path = CHECKOUT_ROOT / "data" if CHECKOUT_ROOT is not None else Path.cwd() / "data"


def manifest(device_dir: Path) -> Dict:
    """The ``manifest.json`` of one device's records (``{}`` when there is none)."""
    try:
        return json.loads((device_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def record_files() -> List[Path]:
    """The shipped record files (every device), then, run from a checkout, its own ``data/*.jsonl`` /
    ``*.jsonl.gz``."""
    shipped = sorted(RECORDS_DIR.glob("*/*.jsonl.gz"))
    if CHECKOUT_ROOT is None or not LOCAL_DIR.is_dir():
        return shipped
    return shipped + sorted(list(LOCAL_DIR.glob("*.jsonl")) + list(LOCAL_DIR.glob("*.jsonl.gz")))


def read_file(path: Path) -> Iterator[dict]:
    """The records of one file (gzip when it ends in ``.gz``); a record without ``source`` gets the file's name.
    Lines that are not JSON objects are skipped."""
    path = Path(path)
    try:
        fh = gzip.open(path, "rt") if path.name.endswith(".gz") else open(path)
    except OSError:
        return
    with fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict):
                r.setdefault("source", path.name)
                yield r


def _not_read_by_auto(device_dir: Path) -> set:
    """The sources a device's manifest marks as not read by ``auto`` (sweeps of kernels that changed since)."""
    return {s["source"] for f in manifest(device_dir).get("files", {}).values() for s in f.get("sources", [])
            if not s.get("read_by_auto", True)}


def iter_records(auto: bool = False) -> Iterator[dict]:
    """Every record of :func:`record_files`. ``auto``: only the sources the ``auto`` backend reads (the manifest's
    ``read_by_auto``; a checkout's plain ``.jsonl`` files)."""
    skip: Dict[Path, set] = {}
    for path in record_files():
        local = path.parent == LOCAL_DIR
        if auto and local and path.name.endswith(".gz"):
            continue
        if auto and not local and path.parent not in skip:
            skip[path.parent] = _not_read_by_auto(path.parent)
        for r in read_file(path):
            if auto and r["source"] in skip.get(path.parent, ()):
                continue
            yield r
