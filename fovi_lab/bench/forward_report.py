"""The forward benchmark's printed lines: one per shape (the chosen config against its dense ceiling and the strongest
PyTorch baseline) and the summary table at the end (one row per layer and batch).
"""

from __future__ import annotations

import math
from typing import List

from fovi_lab.bench.common import print_graphed


def _print_shape(recs: List[dict], chosen: str) -> None:
    by = {(r["impl"], r.get("config")): r for r in recs}
    torch_rows = [r for r in recs if r["impl"].startswith("torch") and r["ms"] and not r.get("graphed")]
    best_t = min(torch_rows, key=lambda r: r["ms"]) if torch_rows else None
    c = by.get(("warp_uncached", chosen))
    head = f"{recs[0]['layer']:>15s} B={recs[0]['B']:<4d}"
    if c is None or not c.get("ms"):
        print(f"{head} chosen {chosen}: not measured", flush=True)
        return
    dense = c.get("dense_ms")
    print(f"{head} warp[{chosen}] {c['ms']:.3f} ms (kernel {c['ms_kernel']:.3f}, {c['tflops_kernel']:.1f} TFLOP/s, "
          + (f"{100 * c['roofline_frac']:.1f}% roofline, " if c.get("roofline_frac") is not None else "")
          + f"{('%.0f%% of dense %.3f ms' % (100 * c['frac_dense'], dense)) if dense else 'no dense'}"
          f"{(', %.0f%% of cuBLAS dense' % (100 * c['frac_cublas_dense'])) if c.get('frac_cublas_dense') else ''}) | "
          + (f"best torch {best_t['impl']} {best_t['ms']:.3f} ms -> x{c['speedup_vs_strongest']:.2f}"
             if best_t and c.get("speedup_vs_strongest") else "no torch baseline")
          + f" | err {c['err']:.1e}", flush=True)
    ks = [r for r in recs if r["impl"] == "warp_uncached" and r.get("ms_kernel")]
    if len(ks) > 1:
        top = sorted(ks, key=lambda r: r["ms_kernel"])[:3]
        print(" " * 22 + "fastest kernels: " + ", ".join(f"{r['config']} {r['ms_kernel']:.3f}" for r in top), flush=True)
    cb = by.get(("cublas_dense_bmm", None))
    if cb and cb.get("ms"):
        print(" " * 22 + f"cuBLAS dense bmm of the same GEMMs {cb['ms']:.3f} ms ({cb['tflops']:.0f} TFLOP/s)", flush=True)


def _summary(recs: List[dict]) -> None:
    rows = [r for r in recs if r["impl"] == "warp_uncached" and r.get("chosen") and r.get("ms")
            and r.get("speedup_vs_strongest")]
    if not rows:
        return
    print("\n layer            B     warp ms  kernel  TFLOP/s  %dense  best torch (ms)          speedup")
    for r in rows:
        fd = r.get("frac_dense")
        print(f" {r['layer']:<15s} {r['B']:>4d} {r['ms']:>9.3f} {r['ms_kernel']:>7.3f} {r['tflops_kernel']:>8.1f} "
              f"{(100 * fd if fd else math.nan):>7.0f}  {r['strongest']:<18s}{r['ms'] * r['speedup_vs_strongest']:>7.3f}"
              f"  x{r['speedup_vs_strongest']:.2f}")
    print_graphed(recs, "warp_uncached_graphed")
