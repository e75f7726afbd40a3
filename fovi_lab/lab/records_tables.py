"""Tables of the recorded forward, one row per (layer, B): the heuristic's config against the fastest swept one and
the strongest PyTorch op (:func:`forward_table`), the taught tile kernels (:func:`tile_kernel_table`), the rule's pick
against the sweep (:func:`heuristic_table`), weight reuse against its r = 1 twins (:func:`reuse_summary`), the dense
4096³ GEMM ceilings (:func:`gemm_ceilings`), and the text lines that print them.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from fovi_lab.lab.labels import short_label
from fovi_lab.lab.records_load import forward_records
from fovi_lab.lab.records_select import (latest_run_where, layer_order, pick_run, record_runs, sweep_records,
                                         sweep_run, versions_title)


def forward_rows(records: List[dict]) -> Tuple[List[dict], List[dict]]:
    """(rows of :func:`forward_table`, the records they were read from)."""
    rows, used = [], []
    for (layer, b, mode), runs in record_runs(records).items():
        if layer == "gemm4096" or mode is not None:
            continue
        prim = pick_run(runs) or []
        sweep = sweep_run(runs) or prim
        used += prim + ([r for r in sweep if r not in prim] if sweep is not prim else [])
        prim = [r for r in prim if not r.get("graphed")]      # CUDA-graph replays: fv/bench --graphs tables
        unc = [r for r in prim if r.get("impl") == "warp_uncached"]
        pick = next((r for r in unc if r.get("chosen") and r.get("ms")), None)
        kern = [r for r in sweep if r.get("impl") == "warp_uncached" and r.get("ms_kernel")]
        best = min(kern, key=lambda r: r["ms_kernel"]) if kern else None
        torch_rows = [r for r in prim if str(r.get("impl")).startswith("torch") and r.get("ms")]
        strongest = min(torch_rows, key=lambda r: r["ms"]) if torch_rows else None
        cached = next((r for r in prim if r.get("impl") == "warp_cached" and r.get("ms")), None)
        ceiling = next((r for r in prim if r.get("impl") == "warp_dense_ceiling" and r.get("ms")), None)
        flops = next((r.get("flops") for r in prim + sweep if r.get("flops")), None)
        nbytes = next((r.get("bytes") for r in prim + sweep if r.get("bytes")), None)
        errs = [r.get("err") for r in prim + sweep
                if str(r.get("impl")).startswith("warp") and r.get("err") is not None]
        rows.append({
            "layer": layer, "B": b, "flops": flops, "bytes": nbytes,
            "pick_config": pick and pick.get("config"), "pick_ms": pick and pick.get("ms"),
            "pick_kernel_ms": pick and pick.get("ms_kernel"),
            "pick_dense_ms": (ceiling and ceiling.get("ms")) or (pick and pick.get("dense_ms")),
            "best_config": best and best.get("config"), "best_kernel_ms": best and best.get("ms_kernel"),
            "best_dense_ms": best and best.get("dense_ms"),
            "torch_impl": strongest and strongest["impl"], "torch_ms": strongest and strongest["ms"],
            "cached_ms": cached and cached["ms"], "cached_config": cached and cached.get("config"),
            "max_err": max(errs) if errs else None,
        })
    order = {n: i for i, n in enumerate(layer_order(r["layer"] for r in rows))}
    rows.sort(key=lambda r: (order[r["layer"]], r["B"]))
    return rows, used


def forward_table(records: List[dict]) -> List[dict]:
    """One row per recorded (layer, B). From the latest run that timed the chosen config as a whole op:
    the Warp pick (whole op and kernel alone), the dense tile-GEMM ceiling of its tiles, the strongest
    PyTorch baseline (whole op), the Warp cached kernel. From the latest sweep of every config (if any):
    the fastest Warp config (kernel alone) and its dense ceiling. Plus FLOPs, bytes, max recorded error."""
    return forward_rows(records)[0]


def tflops_of(flops, ms):
    """TFLOP/s of ``flops`` done in ``ms`` milliseconds; None without both."""
    return flops / (ms * 1e-3) / 1e12 if (flops and ms) else None


def gemm_ceilings(records: Optional[List[dict]] = None) -> dict:
    """The recorded dense 4096³ GEMM ceilings (TFLOP/s): ``warp_tflops`` (Warp's best tile GEMM config, named in
    ``warp_config``) and ``cublas_tflops`` (``torch.matmul``), from the run that timed the most tile configs on it;
    ``{}`` when none is recorded."""
    records = forward_records() if records is None else records
    runs = record_runs([r for r in records if r.get("layer") == "gemm4096" and r.get("tflops")])
    best_run: List[dict] = []
    for run_list in runs.values():
        for run in run_list:
            n = sum(r.get("impl") == "warp_dense_gemm" for r in run)
            if n >= sum(r.get("impl") == "warp_dense_gemm" for r in best_run):
                best_run = run
    warp = [r for r in best_run if r["impl"] == "warp_dense_gemm"]
    cub = [r for r in best_run if r["impl"] == "torch_matmul"]
    out = {}
    if warp:
        w = max(warp, key=lambda r: r["tflops"])
        out["warp_tflops"], out["warp_config"] = w["tflops"], w.get("config")
    if cub:
        out["cublas_tflops"] = max(r["tflops"] for r in cub)
    return out


#: The tile-kernel families notebook 02 teaches: the tile GEMM over gathered rows and the node-major kernels, each
#: without its prefetching variant (the gather kernel, node-major, and node-major with the neighbour loop split
#: across CTAs).
TILE_FAMILIES = ("tile_gemm", "node_major")


def _taught(variant: Optional[str], families: Sequence[str]) -> bool:
    """Whether a record's kernel variant is one of ``families`` (registry keys) without prefetch."""
    from fovi_lab.kernels.families.registry import family_or_none
    fam = family_or_none(variant) if variant else None
    return fam is not None and fam.key in families and not fam.variants.get(variant, {}).get("prefetch", False)


def _variant(rec: dict) -> Optional[str]:
    """A record's kernel variant: its ``variant`` field (``family`` in the dtype benchmark's records), else the
    registered config's (None when unknown)."""
    named = rec.get("variant") or rec.get("family")
    if named:
        return named
    from fovi_lab.kernels import forward as F
    try:
        return F.config_spec(rec.get("config")).variant
    except Exception:  # noqa: BLE001 - a config no longer registered
        return None


def tile_kernel_table(records: Optional[List[dict]] = None, families: Sequence[str] = TILE_FAMILIES) -> List[dict]:
    """One row per recorded (layer, B) for the tile kernels of ``families``, each part read from one run.

    From the run that timed the most configs of ``families`` (the latest of equals): the fastest of them,
    kernel alone (``config``, ``kernel_ms``), the dense tile-GEMM ceiling of its tiles recorded beside it
    (``dense_ms``: the same tile loop on dense operands), its whole op (``op_ms``), ``tflops`` (kernel alone),
    the strongest eager PyTorch op of that run (``torch_impl``, ``torch_ms``) and the run's ``records``.
    From the latest run that timed the cached kernel (None where none did): ``cached_ms``, ``cached_config``,
    and that run's chosen uncached config as a whole op (``cached_vs_config``, ``cached_vs_ms``); its records
    are in ``cached_records``. Plus ``cin``."""
    records = forward_records() if records is None else records
    fams = set(families)
    rows = []
    for (layer, b, mode), runs in record_runs(records).items():
        if layer == "gemm4096" or mode is not None:
            continue

        def tiles(run):
            return [r for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")
                    and not r.get("graphed") and _taught(_variant(r), fams)]

        best_run = None
        for run in runs:                                           # oldest first: ">=" keeps the latest of equals
            if tiles(run) and (best_run is None or len(tiles(run)) >= len(tiles(best_run))):
                best_run = run
        if best_run is None:
            continue
        best = min(tiles(best_run), key=lambda r: r["ms_kernel"])
        torch_rows = [r for r in best_run if str(r.get("impl")).startswith("torch") and r.get("ms")
                      and not r.get("graphed")]
        strongest = min(torch_rows, key=lambda r: r["ms"]) if torch_rows else None
        cached_run = latest_run_where(runs, lambda run: any(r.get("impl") == "warp_cached" and r.get("ms")
                                                            for r in run))
        cached = vs = None
        if cached_run is not None:
            cached = next(r for r in cached_run if r.get("impl") == "warp_cached" and r.get("ms"))
            vs = next((r for r in cached_run if r.get("impl") == "warp_uncached" and r.get("chosen") and r.get("ms")
                       and not r.get("graphed")), None)
        rows.append({
            "layer": layer, "B": b, "cin": best.get("cin"), "config": best.get("config"),
            "kernel_ms": best["ms_kernel"], "dense_ms": best.get("dense_ms"), "op_ms": best.get("ms"),
            "tflops": tflops_of(best.get("flops"), best["ms_kernel"]),
            "torch_impl": strongest and strongest["impl"], "torch_ms": strongest and strongest["ms"],
            "records": best_run,
            "cached_ms": cached and cached["ms"], "cached_config": cached and cached.get("config"),
            "cached_vs_config": vs and vs.get("config"), "cached_vs_ms": vs and vs.get("ms"),
            "cached_records": cached_run or [],
        })
    order = {n: i for i, n in enumerate(layer_order(r["layer"] for r in rows))}
    rows.sort(key=lambda r: (order[r["layer"]], r["B"]))
    return rows


def _ratio(a, b) -> Optional[float]:
    return a / b if (a and b) else None


def _f(v, spec: str, width: int) -> str:
    """``v`` formatted with ``spec``, or a dash where there is no value (right-aligned to ``width``)."""
    return format(v, spec).rjust(width) if v is not None else "-".rjust(width)


def forward_lines(rows: List[dict], batches: Sequence[int] = (16, 512),
                  records: Optional[List[dict]] = None) -> List[str]:
    """Text lines of :func:`forward_table` rows at ``batches``, one per row, 3 decimals (ms): the heuristic's
    config as a whole op and kernel alone, the dense ceiling of its tiles, the kernel's TFLOP/s, the strongest
    PyTorch op and PyTorch's time over Warp's op (above 1: Warp faster). A ``cached`` column only when some
    row records the cached kernel. ``records`` (those ``rows`` were read from): a first line with the device,
    versions and dates of the runs behind the printed rows."""
    sel = [r for r in rows if r["B"] in batches and r.get("pick_ms") and r.get("torch_ms")]
    with_cached = any(r.get("cached_ms") for r in sel)
    out = []
    if records is not None:
        out.append("recorded on " + versions_title([r for r in forward_rows(records)[1] if r.get("B") in batches]))
    head = (f"{'B':>3s}  {'layer':15s} {'op':>6s} {'kernel':>6s} {'ceil':>6s} {'TFLOP/s':>7s}  "
            f"{'strongest PyTorch':17s} {'ms':>6s} {'torch/op':>8s}" + (f" {'cached':>6s}" if with_cached else "")
            + "  heuristic's kernel")
    out.append(head)
    for r in sel:
        out.append(f"{r['B']:3d}  {r['layer']:15s} {_f(r['pick_ms'], '.3f', 6)} "
                   f"{_f(r['pick_kernel_ms'], '.3f', 6)} {_f(r['pick_dense_ms'], '.3f', 6)} "
                   f"{_f(tflops_of(r['flops'], r['pick_kernel_ms']), '.1f', 7)}  {str(r['torch_impl']):17s} "
                   f"{_f(r['torch_ms'], '.3f', 6)} {_f(_ratio(r['torch_ms'], r['pick_ms']), '.2f', 8)}"
                   + (f" {_f(r.get('cached_ms'), '.3f', 6)}" if with_cached else "")
                   + f"  {short_label(str(r['pick_config']))}")
    return out


def tile_kernel_lines(rows: List[dict], batches: Sequence[int] = (16, 512)) -> List[str]:
    """Text lines of :func:`tile_kernel_table` rows at ``batches``: per row the fastest tile config (kernel
    alone), its dense ceiling and their ratio (kernel / ceiling), TFLOP/s, its whole op, the strongest PyTorch op
    of the same run and Warp's op over it (above 1: PyTorch faster); then, where a run timed it, the cached kernel
    against that run's chosen uncached op (cached / uncached: below 1, caching paid)."""
    sel = [r for r in rows if r["B"] in batches]
    out = ["tile kernels, the run that timed the most of them: "
           + versions_title([x for r in sel for x in r["records"]]),
           f"{'B':>3s}  {'layer':15s} {'Cin':>3s} {'kernel':>6s} {'ceil':>6s} {'k/ceil':>6s} "
           f"{'TFLOP/s':>7s} {'op':>6s}  {'strongest PyTorch':17s} {'ms':>6s} {'op/torch':>8s}  fastest tile kernel"]
    for r in sel:
        out.append(f"{r['B']:3d}  {r['layer']:15s} {_f(r['cin'], 'd', 3)} "
                   f"{_f(r['kernel_ms'], '.3f', 6)} {_f(r['dense_ms'], '.3f', 6)} "
                   f"{_f(_ratio(r['kernel_ms'], r['dense_ms']), '.2f', 6)} {_f(r['tflops'], '.1f', 7)} "
                   f"{_f(r['op_ms'], '.3f', 6)}  {str(r['torch_impl']):17s} {_f(r['torch_ms'], '.3f', 6)} "
                   f"{_f(_ratio(r['op_ms'], r['torch_ms']), '.2f', 8)}  {short_label(str(r['config']))}")
    cached = [r for r in sel if r.get("cached_ms")]
    if cached:
        out.append("")
        out.append("cached kernel, the latest run that timed it: "
                   + versions_title([x for r in cached for x in r["cached_records"]]))
        out.append(f"{'B':>3s}  {'layer':15s} {'Cin':>3s} {'cached ms':>9s} {'uncached ms':>11s} "
                   f"{'cached/uncached':>15s}  {'cached tiles':15s} uncached pick")
        for r in cached:
            out.append(f"{r['B']:3d}  {r['layer']:15s} {_f(r['cin'], 'd', 3)} {_f(r['cached_ms'], '.3f', 9)} "
                       f"{_f(r['cached_vs_ms'], '.3f', 11)} "
                       f"{_f(_ratio(r['cached_ms'], r['cached_vs_ms']), '.2f', 15)}  "
                       f"{short_label(str(r['cached_config']), title=False):15s} "
                       f"{short_label(str(r['cached_vs_config']))}")
    return out


#: (r=1, r=2[, r=4]) config triples that differ only in r, for the weight-reuse plot.
REUSE_PAIRS = (("m32n64", "m32n64r2", "m32n64r4"), ("m64n64r1", "m64n64r2", None),
               ("m64n64r1b256", "m64n64r2b256", None), ("m64n128r1", "m64n128r2", None),
               ("nm_m64n64k64b256", "nm_m64n64k64r2", None), ("nm_m64n128k64", "nm_m64n128k64r2", None))


def pair_kernel_ms(records: List[dict], pairs) -> Tuple[Dict[tuple, float], List[dict]]:
    """``(layer, B, config) -> ms_kernel`` for the configs of ``pairs`` (``(r1, r2, r4)`` twins) and the records
    read: per shape and twin, the latest run that timed the r = 1 config and that twin side by side (a later sweep of
    other configs does not hide an earlier one of these). The ``(layer, B, r1)`` entry is the r = 1 time of the run
    the twin's came from; a twin whose run differs from another twin's keeps its own base under
    ``(layer, B, (r1, twin))``."""
    ms: Dict[tuple, float] = {}
    read: List[dict] = []
    for (layer, b, _), runs in record_runs(records).items():
        for base, *twins in pairs:
            for cfg in (c for c in twins if c):
                def timed(rs, cfgs=(base, cfg)):
                    have = {r.get("config") for r in rs if r.get("impl") == "warp_uncached" and r.get("ms_kernel")}
                    return set(cfgs) <= have
                run = latest_run_where(runs, timed)
                if run is None:
                    continue
                got = {r["config"]: r for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")
                       and r.get("config") in (base, cfg)}
                ms[(layer, b, cfg)] = got[cfg]["ms_kernel"]
                ms[(layer, b, (base, cfg))] = got[base]["ms_kernel"]
                ms.setdefault((layer, b, base), got[base]["ms_kernel"])
                read += [got[base], got[cfg]]
    return ms, read


def reuse_summary(records: Optional[List[dict]] = None, pairs=REUSE_PAIRS, faster_below: float = 0.97) -> List[dict]:
    """Per reuse config (r = 2 / 4) over its r = 1 twin, across every swept shape: ``config``, ``base``,
    ``shapes``, ``median``, ``best`` (lowest ratio) and ``faster`` (shapes with a ratio below
    ``faster_below``)."""
    records = forward_records() if records is None else records
    ms, _ = pair_kernel_ms(records, pairs)
    out = []
    for base, r2, r4 in pairs:
        for cfg in (c for c in (r2, r4) if c):
            ratios = [t / ms[(l, b, (base, cfg))] for (l, b, c), t in ms.items() if c == cfg]
            if ratios:
                out.append({"config": cfg, "base": base, "shapes": len(ratios), "median": float(np.median(ratios)),
                            "best": min(ratios), "faster": sum(x < faster_below for x in ratios)})
    return out


def heuristic_table(records: Optional[List[dict]] = None) -> List[dict]:
    """For every recorded (layer, B): the config the installed :func:`fovi_lab.kernels.forward.rules.select_config`
    picks among the kernels the sweep timed (``pipe=False``: the pipelined tensor-core kernels, which the rule
    takes on the large-GEMM layers from B = 64, were timed in their own side-by-side run,
    ``data/h200/forward_pipe.jsonl.gz``), its recorded kernel time, the fastest recorded config and the ratio
    pick / fastest (None where the pick was not part of the recorded sweep)."""
    from fovi_lab.kernels import forward as F
    records = forward_records() if records is None else records
    shapes: Dict[tuple, dict] = {}
    for r in sweep_records(records):
        shapes.setdefault((r["layer"], r["B"]), {})[r.get("config")] = r
    rows = []
    for (l, b), cfgs in shapes.items():
        any_r = next(iter(cfgs.values()))
        cin, cout, nout, p64 = (any_r.get(k) for k in ("cin", "cout", "nout", "p64"))
        q = cin * any_r["v"] if cin and any_r.get("v") else None
        try:
            pick = F.select_config(b, cout, nout, p64, in_channels=cin, node_major=True, q=q, pipe=False)
        except Exception as exc:  # noqa: BLE001
            pick = f"error: {type(exc).__name__}"
        best = min(cfgs.values(), key=lambda r: r["ms_kernel"])
        pick_ms = cfgs[pick]["ms_kernel"] if pick in cfgs else None
        rows.append({"layer": l, "B": b, "pick": pick, "pick_ms": pick_ms, "best": best["config"],
                     "best_ms": best["ms_kernel"], "ratio": (pick_ms / best["ms_kernel"]) if pick_ms else None,
                     "configs_recorded": len(cfgs)})
    order = {n: i for i, n in enumerate(layer_order(r["layer"] for r in rows))}
    rows.sort(key=lambda r: (order[r["layer"]], r["B"]))
    return rows
