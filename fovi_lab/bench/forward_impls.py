"""What the forward benchmark times beside the Warp forward's configs: the PyTorch baselines (the gather + bmm
forms, the compact and binned references, the cached weight, ``torch.compile``), the binned Warp forward
(``--binned``), cuBLAS on dense operands of the same GEMMs, and the 4096^3 dense GEMMs (``--gemm4096``).
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

import torch

from fovi_lab.bench.common import tflops, time_fn


def _xpad(x: torch.Tensor) -> torch.Tensor:
    b = x.shape[0]
    xp = x.new_empty(b, x.shape[1] * x.shape[2] + 1)
    xp[:, :-1] = x.reshape(b, -1)
    xp[:, -1] = 0
    return xp


def _finish(y_nbo: torch.Tensor, bias) -> torch.Tensor:
    y = y_nbo.permute(1, 2, 0)
    if bias is not None:
        y = y + bias.view(1, -1, 1)
    return y.contiguous()


def torch_baselines(meta, weight: torch.Tensor, weff: Optional[torch.Tensor]) -> Dict[str, Callable]:
    """name -> fn(x, bias) for the PyTorch baselines of one layer (weights fixed, x varies)."""
    from fovi_lab.ops.reference import CompactTorchOps, binned_forward
    il = meta.input_linear_flat
    wl = meta.weight_linear_flat
    nout, p64, cout = meta.nout, meta.p64, meta.cout
    wt = weight.t().contiguous()

    def gather_bmm(x, bias):
        b = x.shape[0]
        a = _xpad(x).index_select(1, il).view(b, nout, p64).transpose(0, 1)      # [Nout, B, P64]
        wn = wt.index_select(0, wl).view(nout, p64, cout)
        return _finish(torch.bmm(a, wn), bias)

    def tgather_bmm(x, bias):
        b = x.shape[0]
        xt = _xpad(x).t().contiguous()                                            # [Cin*Nin+1, B]
        at = xt.index_select(0, il).view(nout, p64, b)                            # rows contiguous
        wn = wt.index_select(0, wl).view(nout, p64, cout)
        return _finish(torch.bmm(at.transpose(1, 2), wn), bias)

    fns = {"torch_gather_bmm": gather_bmm, "torch_tgather_bmm": tgather_bmm,
           "torch_compact": lambda x, bias: CompactTorchOps.forward(meta, x, weight, bias),
           "torch_binned_mm": lambda x, bias: binned_forward(meta, x, weight, bias)}
    if weff is not None:
        def cached_bmm(x, bias):
            b = x.shape[0]
            xt = _xpad(x).t().contiguous()
            at = xt.index_select(0, il).view(nout, p64, b)
            return _finish(torch.bmm(at.transpose(1, 2), weff)[:, :, :cout], bias)
        fns["torch_cached_bmm"] = cached_bmm
    return fns


class _Compiled:
    """torch.compile of the transposed-gather baseline, one per process, under a time budget."""

    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self.spent = 0.0
        self.note = ""
        self.fn = None

    def get(self, meta, weight):
        if self.note:
            return None
        if self.spent > self.budget_s:
            self.note = f"torch.compile skipped: its {self.budget_s:.0f}s compile budget is spent"
            return None
        il, wl = meta.input_linear_flat, meta.weight_linear_flat
        nout, p64, cout = meta.nout, meta.p64, meta.cout

        if self.fn is None:
            def f(x, wt, il, wl, nout: int, p64: int, cout: int):
                b = x.shape[0]
                xp = torch.cat([x.reshape(b, -1), x.new_zeros(b, 1)], 1)
                at = xp.t().index_select(0, il).view(nout, p64, b)
                wn = wt.index_select(0, wl).view(nout, p64, cout)
                return torch.bmm(at.transpose(1, 2), wn).permute(1, 2, 0).contiguous()
            try:
                self.fn = torch.compile(f, dynamic=True)
            except Exception as exc:  # pragma: no cover - depends on the installed toolchain
                self.note = f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                return None
        wt = weight.t().contiguous()
        fn = self.fn

        def run(x, bias):
            y = fn(x, wt, il, wl, nout, p64, cout)
            return y + bias.view(1, -1, 1) if bias is not None else y
        return run

    def first_call(self, run, x, bias):
        t0 = time.perf_counter()
        try:
            out = run(x, bias)
            if x.is_cuda:
                torch.cuda.synchronize()
            return out
        except Exception as exc:  # pragma: no cover
            self.note = f"torch.compile failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            return None
        finally:
            self.spent += time.perf_counter() - t0


#: The one-node GEMM configs ``--binned`` measures besides the rule's pick: split register blocks (one node
#: gives a grid of B*Nout / rows x Cout / channels warps, too few without a split at small B), W in place, x^T,
#: and the pipelined split.
BINNED_CANDIDATES = ("mmas_o64b16", "mmas_o32b16", "mmas_o64b8", "mmasw_o32b16", "mmat_o64b32", "mmato_o64b32",
                     "mmaps_o128b64k32s3")


def _binned_records(meta, x, w, bias, rec, tm, err_of, graphed, graphs, torch_ms, strongest, configs) -> None:
    """``warp_binned``: :func:`fovi_lab.kernels.forward.binned.run_binned` (bin, one-node GEMM, transpose) as
    the whole op, per GEMM config (``None``: the forward rule's pick for the one-node layer), with the bin pass
    (``bin_ms``) and the GEMM (``gemm_ms``, ``gemm_tflops`` of the binned FLOPs) timed alone; with ``graphs`` every config's op also
    replayed (``warp_binned_graphed``)."""
    from fovi_lab.kernels.forward.api import run_uncached
    from fovi_lab.kernels.forward.binned import bin_inputs, binned_flops, one_node_tables, run_binned
    b = x.shape[0]
    best, ran = None, []
    bin_ms = tm(lambda: bin_inputs(meta, x)).ms                    # the bin pass alone
    g1 = bin_inputs(meta, x).view(b * meta.nout, 1, meta.q)
    il1, wl1 = one_node_tables(meta)
    for name in [None] + list(configs or BINNED_CANDIDATES):
        try:
            y = run_binned(meta, x, w, bias, config=name)
            t = tm(lambda name=name: run_binned(meta, x, w, bias, config=name))
        except (RuntimeError, ValueError) as exc:
            rec("warp_binned", None, config=name or "rule", note=str(exc)[:300])
            continue
        gemm_ms = tm(lambda name=name: run_uncached(g1, w, bias, il1, wl1, config=name)).ms   # the GEMM alone
        r = rec("warp_binned", t.ms, config=name or "rule", err=err_of(y), reps=t.reps, bin_ms=bin_ms,
                gemm_ms=gemm_ms, binned_flops=binned_flops(meta, b),
                gemm_tflops=tflops(binned_flops(meta, b), gemm_ms))
        if strongest:
            r.update(speedup_vs_strongest=torch_ms[strongest] / t.ms, strongest=strongest)
        ran.append(name)
        if best is None or t.ms < best[1]:
            best = (name, t.ms)
    if best is not None:
        print(f"  warp_binned {b=}: best {best[0] or 'rule'} {best[1]:.3f} ms"
              + (f" (strongest torch {strongest} {torch_ms[strongest]:.3f} ms)" if strongest else ""), flush=True)
    for name in ran if graphs else ():      # every config replayed: eager times at small B are mostly host time
        graphed("warp_binned", lambda name=name: run_binned(meta, x, w, bias, config=name), config=name or "rule")


def _cublas_dense(meta, b: int, device: torch.device, tm) -> Optional[float]:
    """cuBLAS on the operator's GEMMs without the gathers: ``torch.bmm`` of ``[Nout, B, P64] @ [Nout, P64, Cout]``
    on dense fp16 operands (the same FLOPs as the op), ms; None when the operands do not fit."""
    try:
        a = torch.randn(meta.nout, b, meta.p64, device=device, dtype=torch.float16)
        wd = torch.randn(meta.nout, meta.p64, meta.cout, device=device, dtype=torch.float16)
        ms = tm(lambda: torch.bmm(a, wd)).ms
        return ms
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


def _gemm4096(device, configs, env, args) -> List[dict]:
    """Warp's dense tile GEMM at 4096^3 per tile config, and cuBLAS (torch.matmul), for the ceiling."""
    from fovi_lab.kernels import forward as F
    recs = []
    n = 4096
    a = torch.randn(n, n, device=device, dtype=torch.float16)
    bm = torch.randn(n, n, device=device, dtype=torch.float16)
    t = time_fn(lambda: a @ bm, device, warmup=3, reps=10)
    flops = 2.0 * n ** 3
    recs.append(dict(env, layer="gemm4096", B=n, impl="torch_matmul", ms=t.ms, tflops=tflops(flops, t.ms)))
    print(f"gemm 4096^3 torch.matmul {t.ms:.3f} ms {tflops(flops, t.ms):.0f} TFLOP/s", flush=True)
    seen = set()
    for name in configs:
        cfg = F.config_spec(name)
        key = F.dense_kind(cfg)
        if key in seen:
            continue
        seen.add(key)
        try:
            plan = F.make_dense_ceiling(name, n, n, 1, n, device)
            t = time_fn(plan.launch, device, warmup=2, reps=5)
            recs.append(dict(env, layer="gemm4096", B=n, impl="warp_dense_gemm", config=name, ms=t.ms,
                             tflops=tflops(flops, t.ms)))
            print(f"gemm 4096^3 warp dense [{name}] {t.ms:.3f} ms {tflops(flops, t.ms):.1f} TFLOP/s", flush=True)
        except Exception as exc:  # noqa: BLE001
            print(f"gemm 4096^3 warp dense [{name}] failed: {exc}", flush=True)
    return recs
