"""Launch chosen forward configs once each inside an NVTX range named ``profile``, for Nsight Compute
(``bash tools/gpu/run.sh ncu TARGETS``): everything else (compiles, canaries, warm-up calls, the oracle) runs
outside it.

    ncu --nvtx --nvtx-include "profile/" -k regex:fovi_fwd ... python3 tools/gpu/ncu_targets.py \\
        res18_stem:512:mmat_o64b32 res18_layer3:64:mmat_o64b16k64 ...

Each target is ``layer:B:config``; ``config`` ``dense`` suffix (``mmat_o64b32:dense``) launches that config's
dense ceiling instead (the same loop over dense operands)."""

from __future__ import annotations

import math
import sys

import torch


def main(targets) -> None:
    from fovi_lab.kernels import forward as F
    from fovi_lab.graph.layers import layer_meta
    g = torch.Generator().manual_seed(3)
    plans = []
    for t in targets:
        layer, b, config = t.split(":", 2)
        b = int(b)
        dense = config.endswith(":dense")
        config = config.split(":")[0]
        meta = layer_meta(layer, "rf2", device="cuda")
        if dense:
            cfg = F.config_spec(config)
            kernel = F.build_kernel(cfg, dense=True)
            plan = F.plan_dense(cfg, kernel, b, meta.cout, meta.nout, meta.p64, "cuda", seed=7)
            fn = plan.launch
        else:
            x = torch.randn(b, meta.cin, meta.nin, generator=g).half().cuda()
            w = (torch.randn(meta.cout, meta.q, generator=g) / math.sqrt(meta.p)).half().cuda()
            bias = torch.randn(meta.cout, generator=g).half().cuda()
            fn = (lambda x=x, w=w, bias=bias, meta=meta, config=config:
                  F.run_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=config))
        for _ in range(3):
            fn()
        plans.append((t, fn))
    torch.cuda.synchronize()
    for t, fn in plans:
        torch.cuda.nvtx.range_push("profile")
        fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        print("profiled", t, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
