"""Forward benchmark: Warp compact kernels vs PyTorch baselines vs Warp's dense tile-GEMM ceiling.

``python -m fovi_lab.bench.forward [--layers alex_L1 res18_layer1] [--batches 16 64 128 512]
[--all-configs] [--out data/forward_xxx.jsonl]`` (also ``python -m fovi_lab bench forward``).
``--no-torch`` skips the PyTorch baselines (a Warp-only sweep, e.g. of an env setting) and ``--tag``
stamps a label into every record.

Per (layer, B), all in one process and on identical inputs:

* ``warp_uncached``: :func:`fovi_lab.kernels.forward.api.run_uncached` with the heuristic's config (every
  uncached config with ``--all-configs``), timed as the whole op (operand layout, launch, output
  permute: what a caller pays) and as the kernel alone (``ms_kernel``, operands prepared once).
  Every config's output is checked against the fp32 reference (``err``). ``--store-compare`` also
  times the chosen config with the other output path (``warp_uncached_direct`` / ``_staged``).
* ``warp_dense_ceiling``: the same tile config with plain loads of dense operands of the same GEMM
  sizes (``Nout`` GEMMs ``[B, P64] @ [P64, Cout]``, no gathers): Warp's tile-GEMM ceiling for it.
* ``warp_cached``: :func:`run_cached` on a padded effective-weight cache (inference only).
* ``warp_binned`` (``--binned``): :func:`fovi_lab.kernels.forward.binned.run_binned`, the binned form on the
  tensor cores (bin the inputs by weight column, one shared-weight GEMM), per GEMM config.
* PyTorch: ``torch_gather_bmm`` (gather A = xpad[:, input_linear] and W_n = W^T[weight_linear], bmm),
  ``torch_tgather_bmm`` (gather rows of x^T, so each gathered row is a contiguous batch run, then bmm),
  ``torch_cached_bmm`` (effective-weight cache, gather + bmm), ``torch_compile`` (torch.compile of
  the transposed-gather version; skipped with a note if compile fails or its time budget is spent),
  ``torch_compact`` (:class:`fovi_lab.ops.reference.CompactTorchOps`), ``torch_binned_mm``
  (:func:`fovi_lab.ops.reference.binned_forward`: bin the gathered inputs into the Q taps, then one
  shared-weight cuBLAS matmul per image; the strongest form for the stems at small batch).
  The strongest baseline of a shape is the fastest of these.
* fovi's own backends (where fovi is installed; ``--no-fovi`` leaves them out): ``fovi_<backend>`` for its
  ``auto``, ``cuda``, ``baseline``, ``torch_compact`` and its copy of the seed's ``warp_train``, each the inference
  forward of fovi's own layer of the same table layer (:func:`fovi_lab.integrations.fovi.fovi_forwards`, on the
  same fp16 operands as ours), judged, eager and replayed, against that layer's fp32 forward; a backend fovi
  refuses on the device is recorded with its reason.
* ``cublas_dense_bmm`` (CUDA): ``torch.bmm`` of the same GEMMs on dense operands, ``[Nout, B, P64] @ [Nout, P64,
  Cout]``: what cuBLAS reaches on these sizes without any gather (not a baseline: it computes something else).
  Each Warp kernel's ``frac_cublas_dense`` is its time over this one.

FLOPs are ``2*B*P64*Cout*Nout``; bytes the fewest the op must move (x, W, tables, bias, y once).
Each row prints ms, TFLOP/s, GB/s, the fraction of the device's roofline (its datasheet HBM bandwidth and dense
fp16 tensor-core peak, :class:`fovi_lab.bench.common.Roofline`; none on the CPU) and, for Warp, the fraction of the dense tile-GEMM ceiling measured
in the same run, plus the speedup over the strongest PyTorch baseline. Memory (CUDA): ``peak_mib``, what one eager
call adds at its peak (its output included, its inputs not) for the PyTorch forms, fovi's and the Warp configs timed
as an op; ``tables_mib`` on those Warp rows, the index tables the layer keeps on the device. Records go to a
JSON-lines file (``layer, B, impl, config, ms, device, warp, torch, date`` and more).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from fovi_lab.bench.common import (Progress, Roofline, roofline_of, append_jsonl, compact_bytes, compact_flops,
                                   default_record_path, records_note, env_info, gbps, tflops, time_fn)
from fovi_lab.bench.backward_impls import _peak_mib
from fovi_lab.bench.forward_impls import (_Compiled, _binned_records, _cublas_dense, _gemm4096,  # noqa: F401
                                          BINNED_CANDIDATES, torch_baselines)
from fovi_lab.bench.forward_report import _print_shape, _summary
from fovi_lab.graph.meta import held_bytes
from fovi_lab.ops.arguments import command_main

__all__ = ["main", "add_arguments", "run", "DESCRIPTION", "torch_baselines", "run_shape"]


def _frame(layer: str, rf):
    """The reference frame a record of ``layer`` was measured on (None for synthetic shapes)."""
    from fovi_lab.graph.layers import resolve_layer
    try:
        return resolve_layer(layer, rf)[1]
    except KeyError:
        return rf


# ------------------------------------------------------------------------------------------- shape

def run_shape(layer: str, meta, b: int, configs: List[str], chosen: str, device: torch.device,
              env: dict, args, compiled: Optional[_Compiled], roof: Roofline, dense_cache: dict) -> List[dict]:
    """Measure every implementation on one (layer, B); returns the records."""
    from fovi_lab.kernels import forward as F
    from fovi_lab.ops.reference import CompactTorchOps, build_effective_weight

    g = torch.Generator(device="cpu").manual_seed(b * 7919 + meta.nout)
    x = torch.randn(b, meta.cin, meta.nin, generator=g).to(device, torch.float16)
    w = (torch.randn(meta.cout, meta.q, generator=g) * (2.0 / (meta.cin * meta.k)) ** 0.5).to(device, torch.float16)
    bias = torch.randn(meta.cout, generator=g).to(device, torch.float16) if args.bias else None
    ref = CompactTorchOps.forward(meta, x.float(), w.float(), None if bias is None else bias.float())
    scale = float(ref.abs().max())
    flops = compact_flops(b, meta.p64, meta.cout, meta.nout)
    nbytes = compact_bytes(b, meta.cin, meta.nin, meta.cout, meta.q, meta.nout, meta.p64)
    shape = {"layer": layer, "B": b, "rf": _frame(layer, args.rf), "cin": meta.cin, "cout": meta.cout, "nin": meta.nin,
             "nout": meta.nout, "k": meta.k, "v": meta.v, "p64": meta.p64, "flops": flops, "bytes": nbytes}
    recs: List[dict] = []

    def rec(impl, ms, **kw):
        r = dict(env)
        r.update(shape)
        if getattr(args, "tag", None):
            r["tag"] = args.tag
        r.update(impl=impl, ms=ms, tflops=tflops(flops, ms) if ms else None,
                 gbps=gbps(nbytes, ms) if ms else None,
                 roofline_frac=roof.fraction(ms, flops, nbytes) if ms else None)
        r.update(kw)
        recs.append(r)
        return r

    def err_of(y):
        return float((y.float() - ref).abs().max()) / max(1.0, scale)

    tm = lambda fn: time_fn(fn, device, warmup=args.warmup, reps=args.reps)  # noqa: E731

    graphs = bool(getattr(args, "graphs", False)) and device.type == "cuda"

    def graphed(impl, fn, err=None, **kw):
        """The same op replayed from a CUDA graph (no per-call host work): ``<impl>_graphed``, its output judged by
        ``err`` (default: against our layer's fp32 forward)."""
        from fovi_lab.ops.graphs import capture
        try:
            cap = capture(fn)
            y = cap.replay()
            t = tm(cap.replay)
            rec(impl + "_graphed", t.ms, err=(err or err_of)(y), reps=t.reps, graphed=True, **kw)
            del cap
        except Exception as exc:  # noqa: BLE001 - report, keep measuring
            rec(impl + "_graphed", None, graphed=True, note=f"{type(exc).__name__}: {str(exc)[:200]}", **kw)

    # ---- PyTorch baselines
    weff = build_effective_weight(meta, w, cout_multiple=8)
    for name, fn in ({} if getattr(args, "no_torch", False) else torch_baselines(meta, w, weff)).items():
        try:
            y = fn(x, bias)
            t = tm(lambda: fn(x, bias))
            rec(name, t.ms, err=err_of(y), reps=t.reps, peak_mib=_peak_mib(lambda: fn(x, bias), device))
            if graphs:
                graphed(name, lambda fn=fn: fn(x, bias))
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            rec(name, None, note="out of memory")
    if compiled is not None and not getattr(args, "no_torch", False):
        run = compiled.get(meta, w)
        if run is not None:
            y = compiled.first_call(run, x, bias)
            if y is not None:
                t = tm(lambda: run(x, bias))
                rec("torch_compile", t.ms, err=err_of(y), reps=t.reps, note="compile of torch_tgather_bmm")
        if compiled.note:
            rec("torch_compile", None, note=compiled.note)
    # ---- fovi's own backends (what a fovi user has), each through fovi's own layer of the same table layer,
    #      judged against that layer's fp32 forward (fovi's tables are its own)
    from fovi_lab.bench.backward import _fovi_wanted
    if _fovi_wanted(layer, args) and not getattr(args, "no_torch", False):
        from fovi_lab.integrations.fovi import fovi_forwards
        against = "fovi's baseline in fp32 on its own layer"
        try:
            fwds = fovi_forwards(layer, device, bias=bias is not None)
            fref = fwds.reference(x, w, bias)
        except Exception as exc:  # noqa: BLE001  (fovi's layer or its fp32 reference does not run here)
            fwds = {}
            rec("fovi_baseline", None, note=f"fovi's layer did not run: {type(exc).__name__}: {str(exc)[:240]}")

        def fovi_err(y):
            return float((y.float() - fref).abs().max()) / max(1.0, float(fref.abs().max()))
        for impl, fn in fwds.items():
            try:
                y = fn(x, w, bias)
                t = tm(lambda fn=fn: fn(x, w, bias))
                rec(impl, t.ms, err=fovi_err(y), reps=t.reps, err_against=against, fovi_weight="set once",
                    peak_mib=_peak_mib(lambda fn=fn: fn(x, w, bias), device))
                if graphs:
                    graphed(impl, lambda fn=fn: fn(x, w, bias), err=fovi_err, err_against=against,
                            fovi_weight="set once")
            except Exception as exc:  # noqa: BLE001  (fovi refuses a backend on this device or dtype)
                rec(impl, None, note=f"{type(exc).__name__}: {str(exc).strip()[:300]}")
    cublas_ms = _cublas_dense(meta, b, device, tm) if device.type == "cuda" else None
    if cublas_ms:
        rec("cublas_dense_bmm", cublas_ms, note="torch.bmm of the same GEMMs on dense operands (no gathers): "
            "[Nout, B, P64] @ [Nout, P64, Cout], not a baseline")
    torch_ms = {r["impl"]: r["ms"] for r in recs if r["ms"] and not r.get("graphed") and r["impl"].startswith("torch")}
    uncached_torch = {k: v for k, v in torch_ms.items() if k != "torch_cached_bmm"}
    strongest = min(torch_ms, key=torch_ms.get) if torch_ms else None
    strongest_unc = min(uncached_torch, key=uncached_torch.get) if uncached_torch else None

    # ---- Warp uncached configs (+ their dense ceilings). Every config's kernel is timed alone; the
    # whole op (layouts + launch + output permute) is timed for the chosen config, for the fastest
    # kernel of each family (the op overhead depends on the family's operand layout, not on tiles)
    # and for every config when --op-all is given.
    kern: Dict[str, float] = {}
    plans = {}
    for name in configs:
        try:
            plan = F.prepare_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=name)
        except (RuntimeError, ValueError) as exc:
            rec("warp_uncached", None, config=name, chosen=name == chosen, note=str(exc)[:300])
            continue
        plan.launch()
        y = plan.finish()
        t_k = tm(plan.launch)
        kern[name] = t_k.ms
        cfg = F.config_spec(name)
        dkey = F.dense_kind(cfg) + (b, meta.cout, meta.nout, meta.p64)
        if dkey not in dense_cache:
            try:
                dplan = F.make_dense_ceiling(name, b, meta.cout, meta.nout, meta.p64, device)
                dense_cache[dkey] = tm(dplan.launch).ms
                del dplan
            except Exception as exc:  # noqa: BLE001 - report, keep measuring
                dense_cache[dkey] = None
                print(f"  dense ceiling for {name} failed: {exc}", file=sys.stderr)
        d_ms = dense_cache[dkey]
        plans[name] = dict(config=name, variant=cfg.variant, chosen=name == chosen, ms_kernel=t_k.ms,
                           tflops_kernel=tflops(flops, t_k.ms), err=err_of(y), dense_ms=d_ms,
                           dense_tflops=tflops(flops, d_ms) if d_ms else None,
                           frac_dense=(d_ms / t_k.ms) if d_ms else None,
                           frac_cublas_dense=(cublas_ms / t_k.ms) if cublas_ms else None)
        del plan
    best_of_family: Dict[str, str] = {}
    for name, info in plans.items():
        fam = info["variant"]
        if fam not in best_of_family or kern[name] < kern[best_of_family[fam]]:
            best_of_family[fam] = name
    op_names = set(best_of_family.values()) | ({chosen} & set(plans))
    if args.op_all:
        op_names = set(plans)
    for name, info in plans.items():
        op = None
        if name in op_names:
            call = lambda name=name: F.run_uncached(x, w, bias, meta.input_linear, meta.weight_linear,  # noqa: E731
                                                    config=name)
            op = tm(call).ms
            info = dict(info, peak_mib=_peak_mib(call, device), tables_mib=held_bytes(meta, device) / 2**20)
        r = rec("warp_uncached", op, **info)
        if op and strongest and strongest_unc:
            r.update(speedup_vs_strongest=torch_ms[strongest] / op, strongest=strongest,
                     speedup_vs_strongest_uncached=torch_ms[strongest_unc] / op, strongest_uncached=strongest_unc)
        r["op_overhead_ms"] = (op - kern[name]) if op else None
        if name == chosen and info["dense_ms"]:
            rec("warp_dense_ceiling", info["dense_ms"], config=name)
        if graphs and (name == chosen or args.op_all):
            graphed("warp_uncached", lambda name=name: F.run_uncached(x, w, bias, meta.input_linear,
                                                                      meta.weight_linear, config=name),
                    config=name, chosen=name == chosen)
            tg = {k[:-len("_graphed")]: r["ms"] for r in recs for k in [r["impl"]]
                  if r.get("graphed") and r.get("ms") and k.startswith("torch")}
            wg = [r for r in recs[-1:] if r["impl"] == "warp_uncached_graphed" and r.get("ms")]
            if tg and wg:
                best = min(tg, key=tg.get)
                wg[0].update(strongest_graphed=best + "_graphed", speedup_vs_strongest_graphed=tg[best] / wg[0]["ms"])
        if name == chosen and args.store_compare:
            used = F.store_mode(None, 2 * b * meta.cout * meta.nout)
            alt = "staged" if used == "direct" else "direct"
            t_alt = tm(lambda: F.run_uncached(x, w, bias, meta.input_linear, meta.weight_linear, config=name,
                                              store=alt))
            r["store"] = used
            rec(f"warp_uncached_{alt}", t_alt.ms, config=name,
                note=f"the other output path ({alt}); the op above used {used}")
    # ---- Warp cached
    if args.cached:
        weff64 = build_effective_weight(meta, w, cout_multiple=64)
        try:
            y = F.run_cached(x, weff64, bias, meta.input_linear, cout=meta.cout)
            t = tm(lambda: F.run_cached(x, weff64, bias, meta.input_linear, cout=meta.cout))
            rec("warp_cached", t.ms, config=F.select_cached_config(b), err=err_of(y), reps=t.reps)
        except (RuntimeError, ValueError) as exc:
            rec("warp_cached", None, note=str(exc)[:300])
        del weff64
    if getattr(args, "binned", False):
        _binned_records(meta, x, w, bias, rec, tm, err_of, graphed, graphs, torch_ms, strongest,
                        getattr(args, "binned_configs", None))
    del weff
    return recs


#: The help text of ``python -m fovi_lab bench forward``.
DESCRIPTION = """\
Forward benchmark: the Warp compact kernels against the PyTorch baselines and Warp's dense tile-GEMM ceiling,
on the real fovi layers.

Per layer and batch, in one process on identical fp16 inputs, it times the Warp forward with the config the rule
picks (as the whole op and as the kernel alone, each output checked against the fp32 reference), the same tiles on
dense operands (the ceiling), the cached-weight Warp forward, and every PyTorch baseline (gather + bmm forms, the
compact and binned references, the cached weight, torch.compile on a GPU). Each shape prints one line; records
(JSON lines: layer, B, impl, config, ms, device, versions, date and more) are appended to --out, by default to
data/forward_<device>.jsonl under the current folder.

  python -m fovi_lab bench forward --layers alex_L1 res18_layer1 --batches 16 64
  python -m fovi_lab bench forward --all-configs --graphs
"""


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab bench forward``, each checked as it is parsed."""
    import fovi_lab.integrations.fovi  # noqa: F401  (its layer source: --layers fovi:resnet18@64, ...)
    from fovi_lab.ops.arguments import (COUNT, LayersAction, add_device_option, int_at_least, layer_names,
                                        non_negative_float, out_file, positive_float)

    parser.add_argument("--layers", nargs="+", type=layer_names(), action=LayersAction, default=None,
                        metavar="LAYER", help="layer names, all, or the layers of fovi's own networks "
                                              "(fovi:resnet18@64, fovi:alexnet@128:1, fovi:all) (default: every "
                                              "layer of the table)")
    parser.add_argument("--batches", nargs="+", type=COUNT, default=[16, 64, 128, 512], metavar="B",
                        help="batch sizes to time on each layer")
    parser.add_argument("--rf", default=None, choices=["rf1", "rf2"],
                        help="reference frame (default: each layer's network frame; the record's rf says which)")
    parser.add_argument("--all-configs", action="store_true", help="time every uncached config (a sweep)")
    parser.add_argument("--configs", nargs="+", default=None, metavar="CONFIG",
                        help="also time these uncached configs beside the chosen one")
    parser.add_argument("--experimental", action="store_true",
                        help="with --all-configs, also the experimental (never selected) configs")
    parser.add_argument("--op-all", action="store_true", help="time the whole op for every config, not only for "
                        "the chosen one and each family's fastest kernel")
    parser.add_argument("--reps", type=COUNT, default=15, help="timed calls per implementation, whose median is kept")
    parser.add_argument("--warmup", type=int_at_least(0), default=3, help="untimed calls before the timed ones")
    parser.add_argument("--bias", action="store_true", help="give every layer a bias (the CNNs' layers have none)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip every PyTorch baseline and fovi's backends (a Warp-only sweep)")
    parser.add_argument("--no-fovi", action="store_true",
                        help="skip fovi's own backends (timed through fovi's layer where fovi is installed)")
    parser.add_argument("--tag", default=None, help="a label stamped into every record (e.g. an env setting)")
    parser.add_argument("--compile-budget-s", type=non_negative_float, default=90.0, metavar="S",
                        help="seconds torch.compile may spend compiling before its baseline is skipped")
    parser.add_argument("--no-cached", dest="cached", action="store_false",
                        help="skip the cached-weight Warp forward (warp_cached)")
    parser.add_argument("--binned", action="store_true", help="also time the binned tensor-core forward "
                        "(warp_binned: bin by weight column, one shared-weight GEMM) per one-node GEMM config")
    parser.add_argument("--binned-configs", nargs="+", default=None, metavar="CONFIG",
                        help="the one-node GEMM configs --binned times (default: the candidates listed in "
                             "fovi_lab.bench.forward.BINNED_CANDIDATES)")
    parser.add_argument("--store-compare", action="store_true", help="also time the direct (strided) output store")
    parser.add_argument("--graphs", action="store_true",
                        help="also time the chosen Warp op and every PyTorch baseline replayed from a CUDA graph")
    parser.add_argument("--gemm4096", action="store_true", help="also time 4096^3 dense GEMMs (Warp tiles, cuBLAS)")
    parser.add_argument("--out", type=out_file, default=None,
                        help="JSON-lines file to append the records to (default: data/forward_<device>.jsonl "
                             "under the current folder)")
    add_device_option(parser)
    parser.add_argument("--time-budget-s", type=positive_float, default=None, metavar="S",
                        help="start no new shape after this many seconds (the records so far are kept; default: "
                             "no limit)")


def run(args) -> int:
    """Run the forward benchmark as ``args`` say (the options of :func:`add_arguments`); returns 0."""
    from fovi_lab.kernels import forward as F
    from fovi_lab.graph.layers import LAYERS, layer_meta

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    env = env_info(device)
    known = set(F.uncached_config_names(experimental=True))
    for opt, names in (("--configs", args.configs), ("--binned-configs", getattr(args, "binned_configs", None))):
        unknown = [n for n in names or () if n not in known]
        if unknown:
            from fovi_lab.ops.arguments import usage_error
            usage_error("python -m fovi_lab bench forward", f"{opt}: no forward config is named "
                        f"{', '.join(map(repr, unknown))} (python -m fovi_lab configs lists them)")
    out = args.out or default_record_path("forward", env["device"])
    if args.out is None:                               # the default file: refused here, not after the timings
        from fovi_lab.ops.arguments import unwritable, usage_error
        why = unwritable(out)
        if why is not None:
            usage_error("python -m fovi_lab bench forward",
                        f"--out: the default {out} cannot be written ({why}); name a file with --out")
    layers = args.layers or list(LAYERS)
    roof = roofline_of(device)
    compiled = None if (args.no_compile or device.type != "cuda") else _Compiled(args.compile_budget_s)
    print(f"# forward benchmark on {env['device']} (warp {env['warp']}, torch {env['torch']}), "
          f"records -> {out}", flush=True)
    print(f"# ceilings: {roof.words()}; "
          f"Warp's dense tile GEMM is measured per config below", flush=True)
    all_recs: List[dict] = []
    if args.gemm4096 and device.type == "cuda":
        cfgs = (F.uncached_config_names(experimental=args.experimental) if args.all_configs
                else ["m64n64r1", "nm_m64n64k128"])
        r = _gemm4096(device, cfgs, env, args)
        append_jsonl(out, r)
        all_recs += r
    def meta_of(name):                     # fovi's own network layers (fovi:...) are built from fovi's tables
        if name.startswith("fovi:"):
            from fovi_lab.integrations.fovi import network_layer_meta
            return network_layer_meta(name, device)
        return layer_meta(name, args.rf, device=device)
    metas = {name: meta_of(name) for name in layers}
    prog = Progress(len(layers) * len(args.batches), "shapes")
    dense_cache: dict = {}
    t_start = time.perf_counter()
    for name in layers:
        if args.time_budget_s and time.perf_counter() - t_start > args.time_budget_s:
            print(f"# time budget of {args.time_budget_s:.0f}s spent: stopping before {name}", flush=True)
            break
        meta = metas[name]
        nm_ok = F.analyse_tables(meta.input_linear, meta.weight_linear, meta.cin, meta.nin, meta.q).nm is not None
        for b in args.batches:
            if args.time_budget_s and time.perf_counter() - t_start > args.time_budget_s:
                break
            chosen = F.select_config(b, meta.cout, meta.nout, meta.p64, in_channels=meta.cin,
                                                     node_major=nm_ok, q=meta.q)   # what run_uncached picks
            if args.all_configs:
                configs = F.uncached_config_names(experimental=args.experimental)
            else:
                configs = [chosen] + [c for c in (args.configs or []) if c != chosen]
            recs = run_shape(name, meta, b, configs, chosen, device, env, args, compiled, roof, dense_cache)
            append_jsonl(out, recs)
            all_recs += recs
            _print_shape(recs, chosen)
            prog.step(f"{name} B={b}")
    _summary(all_recs)
    if all_recs:
        print(f"# {len(all_recs)} records appended to {Path(out).resolve()}", flush=True)
        print(records_note(out), flush=True)
    return 0


main = command_main("python -m fovi_lab bench forward", DESCRIPTION, add_arguments, run)


if __name__ == "__main__":
    sys.exit(main())
