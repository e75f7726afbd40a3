"""Ship benchmark records with the package: append a run's records to ``fovi_lab/records/<device>/<kind>.jsonl.gz``
under a source name, and count them in that directory's ``manifest.json``.

    python tools/ship_records.py data/h200/train_step_b512.jsonl.gz --kind train_step --source train_step_h200_b512.jsonl

Every record keeps its own fields (device, versions, date, commit, command); ``source`` is set to the name given.
A source already in the file is replaced, so shipping a run again does not duplicate it. Then regenerate the
results table: ``python -m fovi_lab report``.

Records written before the benchmarks stamped ``commit`` and ``command`` get them from ``--commit`` / ``--command``
(only where a record has none). ``--roofline`` recomputes ``roofline_frac`` from each record's ``flops``, ``bytes``
and ``ms`` with the datasheet peaks of its own device (:func:`fovi_lab.bench.common.roofline_of`), for records
whose benchmark quoted another device's peaks; the peaks used are kept in ``roofline_peaks``.
"""

import argparse
import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fovi_lab.ops.records import RECORDS_DIR, read_file  # noqa: E402


def _reroof(r: dict) -> None:
    from fovi_lab.bench.common import Roofline
    from fovi_lab.ops.devices import DEVICES

    if r.get("roofline_frac") is None or not r.get("ms") or r.get("flops") is None or r.get("bytes") is None:
        return
    spec = next((d for d in DEVICES.values() if d.name == r.get("device")), None)
    roof = Roofline.of(spec) if spec is not None else None
    if roof is None:
        raise SystemExit(f"--roofline: no datasheet peaks for device {r.get('device')!r}")
    r["roofline_frac"] = roof.fraction(r["ms"], r["flops"], r["bytes"])
    r["roofline_peaks"] = roof.words()


def ship(path: Path, kind: str, source: str, device_dir: str = "h200", commit: str = None, command: str = None,
         roofline: bool = False) -> int:
    """Append ``path``'s records to ``<kind>.jsonl.gz`` as ``source``; returns how many were shipped."""
    ddir = RECORDS_DIR / device_dir
    ddir.mkdir(parents=True, exist_ok=True)
    target = ddir / f"{kind}.jsonl.gz"
    kept = [r for r in read_file(target) if r.get("source") != source] if target.exists() else []
    new = []
    for r in read_file(path):
        r["source"] = source
        if commit and not r.get("commit"):
            r["commit"] = commit
        if command and not r.get("command"):
            r["command"] = command
        if roofline:
            _reroof(r)
        new.append(r)
    if not new:
        raise SystemExit(f"{path}: no records")
    with gzip.open(target, "wt") as f:
        for r in kept + new:
            f.write(json.dumps(r, sort_keys=True) + "\n")
    mpath = ddir / "manifest.json"
    man = json.loads(mpath.read_text()) if mpath.exists() else {
        "about": f"Benchmark records of an {new[0].get('device', device_dir)} machine, one JSON object per line "
                 "(gzip). Each record carries its provenance in fields: device, warp, torch, cuda, python, date (the "
                 "run's start), commit, command, source (the record file the run wrote); the bench commands are in "
                 "fovi_lab/bench and tools/gpu/run.sh.",
        "files": {}}
    entry = man["files"].setdefault(target.name, {"devices": [], "kind": kind, "records": 0, "sources": []})
    entry["sources"] = [s for s in entry["sources"] if s["source"] != source]
    entry["sources"].append({"dates": sorted({str(r.get("date", ""))[:10] for r in new}), "read_by_auto": True,
                             "records": len(new), "source": source})
    entry["sources"].sort(key=lambda s: s["source"])
    entry["records"] = len(kept) + len(new)
    entry["devices"] = sorted(set(entry["devices"]) | {r["device"] for r in new if r.get("device")})
    mpath.write_text(json.dumps(man, indent=1, sort_keys=True) + "\n")
    return len(new)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("path", type=Path)
    ap.add_argument("--kind", required=True, help="the shipped file: forward, train_step, backward, ...")
    ap.add_argument("--source", required=True, help="the run's source name in the shipped file")
    ap.add_argument("--device-dir", default="h200")
    ap.add_argument("--commit", help="the commit the run measured, for records without one")
    ap.add_argument("--command", help="the command the run was, for records without one")
    ap.add_argument("--roofline", action="store_true",
                    help="recompute roofline_frac with the datasheet peaks of each record's device")
    args = ap.parse_args()
    n = ship(args.path, args.kind, args.source, args.device_dir, args.commit, args.command, args.roofline)
    print(f"shipped {n} records of {args.path} as {args.source} into {args.device_dir}/{args.kind}.jsonl.gz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
