"""Fingerprints of every forward preset's output on Warp's CPU device, to show that a refactor left the kernels
bit for bit unchanged.

Each preset (registered and experimental; fp16, and bf16 where the family has a bf16 kernel; the cached configs
through ``run_cached``; every dense ceiling kind once) runs one fixed small problem, NaN-prefilled, and its output's
sha256 is kept. Run it before a change and after, and compare:

    python tools/kernel_fingerprints.py --out /tmp/before.json
    ... change ...
    python tools/kernel_fingerprints.py --compare /tmp/before.json      # exit 1 and the names where any differ
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import torch

from fovi_lab.graph.meta import build_meta, synthetic_graph
from fovi_lab.kernels import forward as F
from fovi_lab.kernels.families import PRESETS, family

# (cin, cout, nin, nout, k, v, pads): P64 = 128 (the 128-deep steps divide it), Cout below a 64-wide tile
SHAPE = (5, 37, 60, 21, 25, 30, 17)
BATCH = 19


def _problem(dtype=torch.float16):
    cin, cout, nin, nout, k, v, pads = SHAPE
    idx, rf = synthetic_graph(nin, nout, k, v, pads, seed=4)
    meta = build_meta(idx, rf, cin=cin, cout=cout, v=v, nin=nin)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH, cin, nin, generator=g).to(dtype)
    w = (torch.randn(cout, cin * v, generator=g) / 8).to(dtype)
    bias = torch.randn(cout, generator=g).to(dtype)
    return meta, x, w, bias


def _digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()[:16]


def fingerprints(log=print) -> dict:
    out = {}
    probs = {torch.float16: _problem(torch.float16), torch.bfloat16: _problem(torch.bfloat16)}
    dense_done = set()
    for name, preset in sorted(PRESETS.items()):
        if preset.point is None:
            continue
        fam = family(preset.point.family)
        cfg = F.config_spec(name)
        if fam.inference_only:
            meta, x, w, bias = probs[torch.float16]
            from fovi_lab.ops.reference import build_effective_weight
            weff = build_effective_weight(meta, w, cout_multiple=64)
            plan = F.prepare_cached(x, weff, bias, meta.input_linear, cout=meta.cout, config=name)
            plan.out.fill_(float("nan"))
            plan.launch()
            out[name] = _digest(plan.finish())
            continue
        for dtype in fam.dtypes:
            meta, x, w, bias = probs[dtype]
            plan = F.prepare_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=name)
            plan.out.fill_(float("nan"))
            plan.launch()
            out[f"{name}{'' if dtype == torch.float16 else ' bf16'}"] = _digest(plan.finish())
        kind = F.dense_kind(cfg)
        if kind not in dense_done:
            dense_done.add(kind)
            meta, *_ = probs[torch.float16]
            plan = F.make_dense_ceiling(name, BATCH, meta.cout, meta.nout, 128, device="cpu")
            plan.launch()
            out[f"{name} dense"] = _digest(plan.finish())
        log(f"{name}: {out.get(name) or out.get(name + ' bf16')}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write the fingerprints (JSON) here")
    ap.add_argument("--compare", help="compare with the fingerprints in this file")
    args = ap.parse_args(argv)
    fp = fingerprints(log=lambda line: None)
    print(f"{len(fp)} outputs fingerprinted")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(fp, f, indent=1, sort_keys=True)
    if args.compare:
        with open(args.compare) as f:
            old = json.load(f)
        diff = sorted(k for k in set(old) | set(fp) if old.get(k) != fp.get(k))
        print(f"{len(old)} before, {len(fp)} now; {len(diff)} differ" + (f": {', '.join(diff)}" if diff else ""))
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
