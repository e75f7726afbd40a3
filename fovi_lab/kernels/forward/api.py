"""The forward entry points: :func:`run_uncached` (any tables) and :func:`run_cached` (inference from
the effective-weight cache), with the per-signature call cache that keeps their host time down.

On the eager path at small batch the host is the bottleneck (a compact layer is a fraction of a millisecond of
GPU work on an H200; the host side of a call is in fovi_lab/records/h200/logs/host_probe_*.json), so a call's
checks, table analysis and config choice are cached per call signature.
"""

from __future__ import annotations

import threading
import warnings
from typing import Dict, Optional, Tuple

import torch

import fovi_lab.settings as settings
from fovi_lab.graph.meta import on_derived_meta_released, pad_to
from fovi_lab.ops.graphs import keep_alive_while_captured
from fovi_lab.kernels.common import check_tensor, warp_device
from fovi_lab.kernels.families.base import Problem
from fovi_lab.kernels.families.registry import family
from fovi_lab.kernels.forward.configs import FwdConfig, _CACHED_CONFIG_SPECS, config_spec
from fovi_lab.kernels.forward.build import VALIDATED, build_kernel, get_uncached_config, require_config
from fovi_lab.kernels.forward.rules import _FALLBACK_CHAIN, pick
from fovi_lab.kernels.forward.plans import Plan, plan_cached, plan_dense, plan_uncached, store_mode
from fovi_lab.ops.checks import check_operand
from fovi_lab.kernels.forward.checks import _check_bias, _check_table, _check_x, device_str
from fovi_lab.kernels.tables import analyse_tables


def make_dense_ceiling(config: str, batch: int, cout: int, nout: int, kdim: int, device=None) -> Plan:
    """A prepared dense tile-GEMM launch with ``config``'s tiles over ``Nout`` GEMMs of
    ``[batch, kdim] @ [kdim, cout]`` (the compact GEMM sizes minus the gathers): for benchmarks."""
    cfg = config_spec(config)
    if family(cfg.variant).inference_only:       # the cached kernel's ceiling is the gather tiles' dense loop
        cfg = FwdConfig(cfg.name, "gather", cfg.tile_m, cfg.tile_n, cfg.tile_k, 1, cfg.block_dim)
    kernel = build_kernel(cfg, dense=True)
    return plan_dense(cfg, kernel, batch, cout, nout, kdim, device_str(device))

# What a forward call validated, selected and derived from its arguments' shapes and tables (not from
# their values), cached per call signature: on the eager path at small batch the host is the bottleneck
# (one compact layer is a fraction of a millisecond of GPU work on the H200), and the checks, table analysis
# and config lookup cost more host time than the launch itself (fovi_lab/records/h200/logs/host_probe_*.json, the
# forward's parts). The key holds every property those steps read
# (shapes, dtypes, devices, the tables' identity, version and storage, the config and store requests,
# the ``FOVI_*`` variables of :data:`_CALL_SWITCHES`, the validated-config generation); a hit re-checks the
# tables' weak references, so a new table at a recycled address is never mistaken for the old one.
_call_lock = threading.Lock()
_CALLS: Dict[Tuple, Tuple] = {}
_CALLS_MAX = 256
#: The variables read while a call is resolved or its runner built (both cached per signature). The i2c stage's
#: budget (``FOVI_WARP_I2C_MIB``) is read per call and keys its chunk plans.
_CALL_SWITCHES = ("FOVI_WARP_MATHDX", "FOVI_WARP_MMA")


def _forget_tables(meta) -> None:
    """Drop the call signatures on ``meta``'s tables (and any whose tables are gone): their plans hold
    the tables' derived copies, which would otherwise outlive a derived layer evicted from its cache."""
    with _call_lock:
        for key in [k for k, v in _CALLS.items() if v[0]() is None or v[0]() is meta.input_linear]:
            del _CALLS[key]


on_derived_meta_released(_forget_tables)
keep_alive_while_captured(lambda: tuple(_CALLS.values()))   # a graph replays the plans' tables after eviction


def _call_key(x, weight, bias, il, wl, config, store, out_dtype=None) -> Optional[Tuple]:
    """The signature of a forward call, or None when an argument is not a tensor (the slow path then
    raises the argument's clear error)."""
    T = torch.Tensor
    if not (isinstance(x, T) and isinstance(weight, T) and isinstance(il, T) and isinstance(wl, T)
            and (bias is None or isinstance(bias, T)) and (config is None or isinstance(config, str))
            and (store is None or isinstance(store, str))):
        return None
    return (x.shape, x.dtype, x.device, weight.shape, weight.dtype, weight.device,
            None if bias is None else (bias.shape, bias.dtype, bias.device),
            id(il), il._version, il.data_ptr(), il.shape, il.dtype, il.device, il.is_contiguous(),
            id(wl), wl._version, wl.data_ptr(), wl.shape, wl.dtype, wl.device, wl.is_contiguous(),
            config, store, out_dtype, settings.snapshot(_CALL_SWITCHES), VALIDATED.generation)


def prepare_uncached(x, weight, bias, input_linear, weight_linear, config=None, store=None, out_dtype=None) -> Plan:
    key = _call_key(x, weight, bias, input_linear, weight_linear, config, store, out_dtype)
    hit = _CALLS.get(key) if key is not None else None
    if hit is not None and hit[0]() is input_linear and hit[1]() is weight_linear:
        built, info, mode, dev, memo = hit[2:]
        runner = memo.get("runner")
        if runner is not None:
            plan = runner(x, weight, bias, out_dtype)
            plan.config = built.config.name
            return plan
    else:
        built, info, mode, dev = resolve_uncached(x, weight, bias, input_linear, weight_linear, config, store,
                                                  out_dtype)
        memo = {}
        if key is not None:
            import weakref
            with _call_lock:
                if len(_CALLS) >= _CALLS_MAX:
                    _CALLS.pop(next(iter(_CALLS)))
                _CALLS[key] = (weakref.ref(input_linear), weakref.ref(weight_linear), built, info, mode, dev, memo)
    plan = plan_uncached(built.config, built.kernel, x, weight, bias, input_linear, weight_linear, mode,
                          info=info, dev=dev, memo=memo, out_dtype=out_dtype)
    plan.config = built.config.name          # which kernel this call runs (tests, benchmarks)
    return plan


def resolve_uncached(x, weight, bias, input_linear, weight_linear, config=None, store=None, out_dtype=None):
    """Validate a forward call and pick its kernel: ``(built, table info, store mode, Warp device)``.
    ``out_dtype`` torch.float32: an fp32 y, which only the split tensor-core configs give (``mmas`` / ``mmasw`` /
    ``mmaps``: their fp32 partials summed in a fixed order, never rounded); with no config, :func:`select_mma_split`."""
    _check_x(x, (torch.float16, torch.bfloat16))
    check_operand("weight", weight)
    bf16 = x.dtype == torch.bfloat16
    b, cin, nin = x.shape
    check_tensor("weight", weight, dtype=x.dtype, dim=2, device=x.device)
    cout, q = weight.shape
    if q % cin:
        raise ValueError(f"weight: expected shape [Cout, Q = Cin*V] with Q a multiple of Cin={cin}, "
                         f"got {tuple(weight.shape)}")
    _check_bias(bias, cout, x)
    _check_table("input_linear", input_linear, x)
    _check_table("weight_linear", weight_linear, x, nout=input_linear.shape[0])
    if weight_linear.shape != input_linear.shape:
        raise ValueError(f"weight_linear: expected shape {tuple(input_linear.shape)} (same as input_linear), "
                         f"got {tuple(weight_linear.shape)}")
    info = analyse_tables(input_linear, weight_linear, cin, nin, q)
    dev = warp_device(x)
    nout, p64 = input_linear.shape
    if out_dtype not in (None, x.dtype, torch.float32):
        raise ValueError(f"out_dtype: expected None (x's dtype) or torch.float32, got {out_dtype}")
    f32_out = out_dtype == torch.float32 and x.dtype != torch.float32
    if config is None and f32_out:
        config = select_mma_split(b, cout)
    if f32_out and not _gives_fp32(config):
        raise ValueError(f"config: an fp32 output needs a tensor-core config whose p loop is split (its fp32 partial "
                         f"sums are the output; for this call {select_mma_split(b, cout)!r}), got {config!r}")
    if config is None and bf16:             # bf16: the register tensor-core kernels alone (no other family has a bf16 kernel)
        name = pick(b, cout, nout, p64, cin, info.nm is not None, q, bf16=True)
        built = get_uncached_config(name, dev, bf16=True)
        if built is None:
            raise RuntimeError(f"x: bf16 runs on the tensor-core (mma) kernels, and {name!r} cannot launch on {dev} "
                               f"(they need sm_80 or newer); use fp16 or a PyTorch backend")
    elif config is None:
        # the rule's pick; where it cannot launch, the register tensor-core kernels' pick, then the pick without
        # tensor cores (e.g. a GPU before sm_80), then a fixed chain (a pick that repeats is a cached miss)
        args = (b, cout, nout, p64, cin, info.nm is not None, q)
        built = None
        for name in (pick(*args), pick(*args, pipe=False), pick(*args, mma=False)) + _FALLBACK_CHAIN:
            built = get_uncached_config(name, dev)
            if built is not None:
                break
        if built is None:
            raise RuntimeError(f"no Warp forward config is launchable on {dev}")
    else:
        if not isinstance(config, str):
            raise TypeError(f"config: expected a config name or None, got {type(config).__name__}")
        cfg = config_spec(config)
        fam = family(cfg.variant)
        if fam.inference_only:
            raise ValueError(f"config: {config!r} is a cached-path config (use run_cached)")
        if bf16 and torch.bfloat16 not in fam.dtypes:
            raise ValueError(f"config: {config!r} has no bf16 kernel; bf16 runs on the tensor-core (mma) configs")
        try:
            point = fam.from_config(cfg)
        except ValueError:                  # a test config outside every family's space: the canary judges it
            point = None
        if point is not None:
            problem = Problem(batch=b, cin=cin, nin=nin, cout=cout, nout=nout, p64=p64, q=q,
                              node_major=info.nm is not None, dtype=x.dtype)
            reasons = fam.problem_reasons(point, problem)
            if reasons:
                raise ValueError(f"config: {config!r} cannot run this call: {'; '.join(reasons)}")
        built = require_config(config, dev, bf16=bf16)
    return built, info, store_mode(store, 2 * b * cout * nout), dev


def _gives_fp32(config: str) -> bool:
    """Whether ``config`` can give an unrounded fp32 y (its family says)."""
    cfg = config_spec(config)
    return family(cfg.variant).fp32_output(cfg)


def select_mma_split(batch: int, cout: int) -> str:
    """A split tensor-core config for an fp32 output: 64-channel blocks from Cout = 64, 16-row batch blocks from
    B = 16 (not yet fit to sweeps: a starting rule)."""
    return f"mmas_o{64 if cout >= 64 else 32}b{16 if batch >= 16 else 8}"


def run_uncached(x, weight, bias, input_linear, weight_linear, config=None, store=None,
                 out_dtype=None) -> torch.Tensor:
    """Uncached fp16 forward: per-call weight gather (docs/operator.md §2.5 ``warp_compact``/``warp_train``).

    Args:
        x: ``[B, Cin, Nin]`` fp16, or bf16 (the tensor-core configs only), CPU or CUDA, any strides.
        weight: ``[Cout, Q = Cin*V]``, x's dtype. bias: ``[Cout]`` float or None.
        input_linear, weight_linear: ``[Nout, P64]`` int32 contiguous (docs/operator.md §2.1).
        config: a name from ``_UNCACHED_BATCH_CONFIG_SPECS`` to force a kernel (raises if it cannot
            launch on this device), or None for :func:`select_config`.
        store: ``"staged"`` / ``"direct"`` output path (default: direct for outputs up to 4 MiB and staged
            above).
        out_dtype: None (x's dtype), or torch.float32 from fp16 / bf16 operands: y unrounded, on a split
            tensor-core config (:func:`resolve_uncached`).

    Returns:
        ``y [B, Cout, Nout]`` in x's dtype, ``y[b,o,n] = bias[o] + sum_p xpad[b, il[n,p]] * W[o, wl[n,p]]``
        (fp32 accumulation, bias added in fp32, one rounding to x's dtype).
    """
    plan = prepare_uncached(x, weight, bias, input_linear, weight_linear, config, store, out_dtype)
    plan.launch()
    return plan.finish()


def select_cached_config(batch: int) -> str:
    return "c_m16n32" if batch <= 16 else "c_m32n64"


def prepare_cached(x, effective_weight, bias, input_linear, cout=None, config=None, store=None) -> Plan:
    _check_x(x)
    check_operand("effective_weight", effective_weight)
    b, cin, nin = x.shape
    check_tensor("effective_weight", effective_weight, dtype=torch.float16, dim=3, device=x.device,
                 contiguous=True)
    _check_table("input_linear", input_linear, x)
    nout, p64 = input_linear.shape
    if tuple(effective_weight.shape[:2]) != (nout, p64):
        raise ValueError(f"effective_weight: expected shape [Nout={nout}, P64={p64}, Cout_pad], "
                         f"got {tuple(effective_weight.shape)}")
    cw = effective_weight.shape[2]
    cout = cw if cout is None else int(cout)
    if not 1 <= cout <= cw:
        raise ValueError(f"cout: expected 1 <= cout <= effective_weight.shape[2]={cw}, got {cout}")
    _check_bias(bias, cout, x)
    analyse_tables(input_linear, None, cin, nin, None)
    dev = warp_device(x)
    name = config or select_cached_config(b)
    built = require_config(name, dev)
    if not family(built.config.variant).inference_only:
        raise ValueError(f"config: {name!r} is not a cached-path config ({', '.join(_CACHED_CONFIG_SPECS)})")
    tn = built.config.tile_n
    if cw % tn:
        # Padded-cache rule (seed): tile loads of Weff[n] must not run past the buffer, so an unpadded
        # cache is padded here -- a full copy of the cache on every call.
        warnings.warn(f"effective_weight has Cout={cw} columns, not a multiple of the {tn}-wide output tile: "
                      f"padding the cache on every call (a full copy). Pad the cache instead "
                      f"(build_effective_weight(..., cout_multiple=64)) and pass cout={cout}.",
                      RuntimeWarning, stacklevel=3)
        padded = torch.zeros(nout, p64, pad_to(cw, tn), dtype=torch.float16, device=x.device)
        padded[:, :, :cw] = effective_weight
        effective_weight = padded
    return plan_cached(built.config, built.kernel, x, effective_weight, bias, input_linear, cout,
                        store_mode(store, 2 * b * cout * nout))


def run_cached(x, effective_weight, bias, input_linear, cout=None, config=None, store=None) -> torch.Tensor:
    """Cached-effective-weight fp16 forward (docs/operator.md §2.4 ``warp_cached``): inference only.

    Args:
        x: ``[B, Cin, Nin]`` fp16. effective_weight: ``Weff [Nout, P64, Cout_pad]`` fp16 contiguous
            (zero rows for p >= P, zero columns for o >= Cout).
        bias: ``[cout]`` or None. input_linear: ``[Nout, P64]`` int32.
        cout: the true output-channel count (default ``Weff.shape[2]``). Pass it when the cache is
            padded to a tile multiple (recommended: 64). An unpadded cache whose width is not a tile
            multiple is padded per call with a warning (a full copy each time: pad the cache).

    Returns:
        ``y [B, cout, Nout]`` fp16, ``y[b,o,n] = bias[o] + sum_p xpad[b, il[n,p]] * Weff[n,p,o]``.
    """
    plan = prepare_cached(x, effective_weight, bias, input_linear, cout, config, store)
    plan.launch()
    return plan.finish()
