"""Side by side: the records of tools/gpu/ab_kernels.sh's two sides, per (layer, B, implementation, config).

    python tools/gpu/ab_compare.py ab_base.jsonl ab_new.jsonl [--fields ms gi_stage_ms gw_stage_ms ms_kernel]

Each cell lists the field over the rounds (a run stopped by its time budget has fewer), then the ratio of the
medians, new over base: below 1 is faster.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict


def load(path):
    out = defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        out[(r.get("layer"), r.get("B"), r.get("impl"), r.get("config"))].append(r)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--fields", nargs="*", default=["ms", "ms_kernel", "gi_stage_ms", "gw_stage_ms"])
    args = ap.parse_args(argv)
    base, new = load(args.base), load(args.new)
    for key in sorted(set(base) & set(new), key=str):
        cells = []
        for f in args.fields:
            a = [r[f] for r in base[key] if isinstance(r.get(f), (int, float))]
            b = [r[f] for r in new[key] if isinstance(r.get(f), (int, float))]
            if a and b:
                ratio = statistics.median(b) / statistics.median(a)
                cells.append(f"{f} {'/'.join(f'{v:.3f}' for v in a)} -> {'/'.join(f'{v:.3f}' for v in b)} "
                             f"(x{ratio:.2f})")
        if cells:
            print(f"{key[0]} B={key[1]} {key[2]}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
