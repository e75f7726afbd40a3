"""The backward / train-step benchmark's printed lines and summary table (one row per layer, batch
and path, against the best PyTorch backend of the same run).
"""

from __future__ import annotations

import math
from typing import List

from fovi_lab.bench.common import print_graphed


def _fmt(v, spec="{:.3f}", none="-"):
    return none if v is None or (isinstance(v, float) and math.isnan(v)) else spec.format(v)


def _pct(frac, spec="{:.0f}"):
    """A fraction of a record as a percentage ("-" where it is missing)."""
    return _fmt(100 * (frac or math.nan), spec)


def _staged(r: dict, grad: str, stage: str) -> str:
    """A staged gradient's time, its stage's (and how dense that is) and its reduction's: ``grad`` ``dx`` or ``dw``,
    ``stage`` the stage kernel's key (``gi``, ``gw``)."""
    return (f"{_fmt(r.get(grad + '_ms'))} [stage {_fmt(r.get(stage + '_stage_ms'))} = "
            f"{_pct(r.get(stage + '_frac_dense'))}% dense, reduce {_fmt(r.get(grad + '_reduce_ms'))}")


def _warp_line(head: str, r: dict) -> str:
    line = (f"{head} {r['impl']} {r['ms']:.3f} ms ({_fmt(r.get('tflops'), '{:.1f}')} TFLOP/s, "
            f"{_pct(r.get('roofline_frac'), '{:.1f}')}% roofline, peak "
            f"{_fmt(r.get('peak_mib'), '{:.0f}')} MiB, det {r.get('deterministic')})")
    if r.get("path") == "fused":
        line += (f" dx kernel {_fmt(r.get('dxn_kernel_ms'))} ({r.get('dx_config')}, "
                 f"{r.get('dx_kind')} seg {r.get('dx_seg_steps')}, {_pct(r.get('dx_frac_dense'))}% dense) dW kernel "
                 f"{_fmt(r.get('dwn_kernel_ms'))} ({r.get('dw_config')} {r.get('dw_kind')} x{r.get('dw_nsplit')} "
                 f"seg {r.get('dw_seg_steps')}, finish {_fmt(r.get('dw_finish_ms'))}, "
                 f"{_pct(r.get('dw_frac_dense'))}% dense)")
    elif r.get("path") == "staged":
        line += (f" dx {_staged(r, 'dx', 'gi')} {_fmt(r.get('dx_reduce_gbps'), '{:.0f}')} GB/s] "
                 f"dW {_staged(r, 'dw', 'gw')}]")
    if r.get("strongest"):
        line += f" | best torch {r['strongest']} -> x{r['speedup_vs_strongest']:.2f}"
    if r.get("seed_ms"):
        line += f" | seed {r['seed_ms']} ms -> x{r['speedup_vs_seed']:.2f}"
    return line


def _print_shape(recs: List[dict], mode: str) -> None:
    if not recs:
        return
    head = f"{recs[0]['layer']:>15s} B={recs[0]['B']:<4d}"
    base = "warp" if mode == "backward" else "warp_train"
    warp_impls = (base, base + "_fused", base + "_staged")
    torch_rows = sorted([r for r in recs if r["impl"].startswith(("torch", "fovi_")) and r.get("ms")],
                        key=lambda r: r["ms"])
    for impl in warp_impls:
        wr = [r for r in recs if r["impl"] == impl]
        if wr and wr[0].get("ms"):
            print(_warp_line(head, wr[0]), flush=True)
        elif wr:
            print(f"{head} {impl}: {wr[0].get('note')}", flush=True)
    for r in recs:
        if r["impl"] in (base + "_graphed",) and r.get("ms"):
            best = (f"best torch graphed {r['strongest_graphed']} -> "
                    f"x{_fmt(r.get('speedup_vs_strongest_graphed'), '{:.2f}')}" if r.get("strongest_graphed")
                    else "no PyTorch form timed")
            print(f"{head} {r['impl']} {r['ms']:.3f} ms (CUDA-graph replay) | {best}", flush=True)
    for r in recs:
        if r["impl"] in (base, base + "_graphed") and r.get("speedup_vs_fovi"):
            print(f"{head} {r['impl']} | fovi's fastest {r['fastest_fovi']} -> x{r['speedup_vs_fovi']:.2f}", flush=True)
    for r in recs:
        if r["impl"] == base and r.get("speedup_vs_strongest_pipelined"):
            print(f"{head} {base} pipelined {r['pipelined_ms']:.3f} ms/call (back to back) | best torch pipelined "
                  f"{r.get('strongest_pipelined')} -> x{r['speedup_vs_strongest_pipelined']:.2f}", flush=True)
    for r in torch_rows:
        print(f"{'':>22s}{r['impl']:<30s} {r['ms']:.3f} ms (pipelined {_fmt(r.get('pipelined_ms'))})  "
              f"peak {_fmt(r.get('peak_mib'), '{:.0f}')} MiB", flush=True)
    for r in recs:
        if r["impl"] not in warp_impls and not r.get("ms") and r["impl"] not in ("warp_gi", "warp_gw"):
            print(f"{'':>22s}{r['impl']:<30s} failed: {r.get('note')}", flush=True)
    sweep = [r for r in recs if r["impl"] in ("warp_gi", "warp_gw")]
    if sweep:
        for which, key in (("warp_gi", "gi_stage_ms"), ("warp_gw", "gw_stage_ms")):
            rows = sorted([r for r in sweep if r["impl"] == which and r.get(key)], key=lambda r: r[key])
            if rows:
                print(f"{'':>22s}{which} fastest stages: " + ", ".join(
                    f"{r['config']}{'/' + r['gw_finish'] if r.get('gw_finish') else ''} {r[key]:.3f}"
                    f" (op {_fmt(r.get('ms'))})" for r in rows[:4]), flush=True)
        bad = [r for r in sweep if not r.get(key if r['impl'] == 'warp_gw' else 'gi_stage_ms') and r.get("note")]
        for r in bad[:6]:
            print(f"{'':>22s}{r['impl']} {r.get('config')}: {r.get('note')}", flush=True)


def _summary(recs: List[dict], mode: str) -> None:
    warp_impl = "warp" if mode == "backward" else "warp_train"
    print_graphed(recs, warp_impl + "_graphed")
    rows = [r for r in recs if r["impl"] in (warp_impl, warp_impl + "_fused", warp_impl + "_staged") and r.get("ms")]
    if not rows:
        return
    print(f"\n (* = the warp_train backend's own path for that layer)")
    print(f" {'layer':<19s} {'B':>4s}    path            ms  TFLOP/s  peak MiB  best torch (ms, MiB)              "
          f"speedup  mem frac  vs seed")
    for r in rows:
        tr = [t for t in recs if t["layer"] == r["layer"] and t["B"] == r["B"] and t["impl"] == r.get("strongest")]
        tpk = tr[0].get("peak_mib") if tr else None
        tms = tr[0]["ms"] if tr else None
        tag = r.get("path", "-") + ("*" if r["impl"] == warp_impl else "")
        print(f" {r['layer']:<19s} {r['B']:>4d} {tag:<8s} {r['ms']:>9.3f} {r['tflops']:>8.1f} "
              f"{_fmt(r.get('peak_mib'), '{:>9.0f}')}"
              f"  {r.get('strongest') or 'not timed':<26s} {_fmt(tms, '{:>7.3f}')} {_fmt(tpk, '{:>6.0f}')}"
              f"  {_fmt(r.get('speedup_vs_strongest'), 'x{:.2f}'):>5s}"
              f"   {_fmt(r.get('peak_frac_of_strongest'), '{:.2f}')}"
              f"     {('x%.2f' % r['speedup_vs_seed']) if r.get('speedup_vs_seed') else '-'}")
