"""Build a forward config's kernel once, and validate it once per device with the NaN canary.

:func:`get_config` is the one cache: a config name -> :class:`Built` (the config and the kernel that
passed the canary on that device), or None with the reason remembered. The canary launches the
production plan of the config on a one-CTA problem with the output NaN-prefilled: a launch that
raises, leaves a NaN or differs from the fp32 oracle marks the config unlaunchable on that device.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from fovi_lab.ops.devices import DEVICES
from fovi_lab.kernels.families.registry import family, family_or_none, is_dense_kind
from fovi_lab.kernels.common import ValidatedCache, init_warp, nan_canary, wp
from fovi_lab.kernels.forward.configs import (FwdConfig, _EXPERIMENTAL_CONFIG_SPECS,
                                              _TEST_CONFIG_SPECS, _UNCACHED_BATCH_CONFIG_SPECS, mathdx_default,
                                              config_spec, dense_kind)
from fovi_lab.kernels.forward.plans import plan_cached, plan_dense, plan_uncached
from fovi_lab.kernels.forward.checks import device_str
import fovi_lab.kernels.forward.mma as mma
import fovi_lab.kernels.forward.mma_pipe as mma_pipe
import fovi_lab.kernels.forward.simt as simt
import fovi_lab.kernels.forward.tile as tile


_build_lock = threading.Lock()
_KERNELS: Dict[Tuple, object] = {}
VALIDATED = ValidatedCache("Warp forward config")

# Warp's CPU tile arena (WP_MAX_CPU_SHARED in warp/native/tile.h): a CPU launch whose tiles need
# more aborts the whole process (an assert, not an exception), so the CPU canary refuses it first.
_CPU_TILE_ARENA_BYTES = DEVICES["cpu"].smem_per_block

#: The forward kernel modules by name: a family's :attr:`~fovi_lab.kernels.families.base.Family.module` says which
#: one holds the factories of its kernels.
KERNEL_MODULES = {m.__name__: m for m in (simt, tile, mma, mma_pipe)}


def build_kernel(cfg: FwdConfig, mathdx: Optional[bool] = None, dense: bool = False, bf16: bool = False):
    """The Warp kernel of ``cfg`` (or of its dense ceiling), built once per (config, mathdx, element type) by its
    family (:meth:`fovi_lab.kernels.families.base.Family.make_kernel`) from the factories of its kernel module.

    ``bf16``: the kernel for bf16 operands; only the families with a bf16 kernel have one (a ValueError says so
    for any other config)."""
    fam = family_or_none(cfg.variant)
    if fam is None:
        raise ValueError(f"config: {cfg.name!r} has an unknown kernel family {cfg.variant!r}")
    if mathdx is None:
        mathdx = mathdx_default()
    if bf16 and (torch.bfloat16 not in fam.dtypes or dense):
        raise ValueError(f"config: {cfg.name!r} ({cfg.variant}{' dense ceiling' if dense else ''}) has no bf16 "
                         f"kernel; bf16 runs on the tensor-core (mma) configs")
    key = (cfg.variant, cfg.tile_m, cfg.tile_n, cfg.tile_k, cfg.r, cfg.block_dim, mathdx, dense, bool(bf16))
    if dense:     # configs of one dense kind share their ceiling kernel
        key = ("dense",) + dense_kind(cfg) + (mathdx,)
    with _build_lock:
        k = _KERNELS.get(key)
        if k is None:
            k = _KERNELS[key] = fam.make_kernel(KERNEL_MODULES[fam.module], cfg, mathdx=mathdx, dense=dense,
                                                   bf16=bf16)
        return k


def _kernel_tile_bytes(kernel, block_dim: int, device: str) -> Optional[int]:
    """Tile (shared) memory Warp computed for ``kernel`` at codegen (module meta), or None."""
    try:
        mexec = kernel.module.load(wp.get_device(device), block_dim)
        vals = [int(v) for k, v in (getattr(mexec, "meta", None) or {}).items() if k.endswith("_smem_bytes")]
        return max(vals) if vals else None
    except Exception:  # pragma: no cover - private API moved; the launch itself is still checked
        return None


def _canary_problem(family: str, tile_m: int, tile_n: int, tile_k: int, r: int, device: str,
                    dtype: torch.dtype = torch.float16):
    """A single-output-node problem that fills exactly one CTA: ``B = tile_m*r``, ``Cout = tile_n``."""
    from fovi_lab.graph.meta import build_meta
    g = torch.Generator().manual_seed(1234)
    cin, nin, k, v = 3, 7, 5, 6
    fam = family_or_none(family)
    if fam is not None and fam.canary_p64(FwdConfig("canary", family, tile_m, tile_n, tile_k, r, 128)) > 64:
        k = 22                                                    # P64 = 128: one 128-deep step
    idx = torch.randint(0, nin + 1, (1, k), generator=g)          # includes the pad token nin
    rf = torch.randint(0, v, (1, k), generator=g)
    meta = build_meta(idx, rf, cin=cin, cout=tile_n, v=v, nin=nin, device=device)
    b = FwdConfig("canary", family, tile_m, tile_n, tile_k, r, 128).rows_per_cta   # (mmap: r counts stages)
    x = torch.randn(b, cin, nin, generator=g).to(device=device, dtype=dtype)
    w = (0.5 * torch.randn(tile_n, cin * v, generator=g)).to(device=device, dtype=dtype)
    bias = torch.randn(tile_n, generator=g).to(device=device, dtype=dtype)
    return meta, x, w, bias


def canary(kernel, tile_m: int, tile_n: int, r: int, block_dim: int, device: str) -> Tuple[bool, str]:
    """(ok, why) of one NaN-prefilled launch of ``kernel`` on a single-node problem (see
    :func:`canary_launch_ok`); also checks the values against the fp32 oracle."""
    from fovi_lab.ops.reference import oracle_forward
    init_warp()
    family, _, _, tile_k, _, _ = getattr(kernel, "fovi_tiles", ("gather", tile_m, tile_n, 64, r, block_dim))
    if device == "cpu":
        need = _kernel_tile_bytes(kernel, block_dim, device)
        if need is not None and need > _CPU_TILE_ARENA_BYTES:
            return False, (f"its tiles need {need} bytes, over Warp's {_CPU_TILE_ARENA_BYTES}-byte CPU tile "
                           f"arena (such a launch aborts the process, so it is not attempted)")
    dtype = getattr(torch, getattr(kernel, "fovi_dtype", "float16"))
    meta, x, w, bias = _canary_problem(family, tile_m, tile_n, tile_k, r, device, dtype)
    b = x.shape[0]
    cfg = FwdConfig("canary", family, tile_m, tile_n, tile_k, r, block_dim)
    fam = family_or_none(family)
    if fam is not None and fam.inference_only:
        from fovi_lab.ops.reference import build_effective_weight
        weff = build_effective_weight(meta, w, cout_multiple=tile_n)
        plan = plan_cached(cfg, kernel, x, weff, bias, meta.input_linear, tile_n, store="staged")
    elif is_dense_kind(family):
        base = family[:-len("_dense")] if family.endswith("_dense") else ""
        if family_or_none(base) is not None:       # a family's own dense kernel runs on that family's plan
            cfg = FwdConfig("canary", base, tile_m, tile_n, tile_k, r, block_dim)
        plan = plan_dense(cfg, kernel, b, tile_n, 1, 64, device, seed=7)
    else:
        plan = plan_uncached(cfg, kernel, x, w, bias, meta.input_linear, meta.weight_linear, store="staged")
    ok, why = nan_canary(plan.launch, plan.out)
    if not ok or is_dense_kind(family):
        return ok, why
    y = plan.finish()
    ref = oracle_forward(x.float().cpu(), w.float().cpu(), bias.float().cpu(), meta.idx, meta.rf_index, meta.v)
    err = float((y.float().cpu() - ref).abs().max())
    tol = 2e-2 if dtype == torch.float16 else 4e-2          # one rounding of y: 2^-11 (fp16) or 2^-8 (bf16) relative
    if not err <= tol * max(1.0, float(ref.abs().max())):
        return False, f"launch ran but the canary output is wrong (max abs error {err:.3g})"
    return True, "ok"


def canary_launch_ok(kernel, tile_m: int, tile_n: int, r: int, block_dim: int, device) -> bool:
    """Return True when ``kernel`` actually launches on ``device`` and writes correct values.

    A launch over the per-CTA resource budget raises since Warp 1.15 but printed "invalid argument"
    and returned normally before that, leaving the output untouched: so the single-node canary
    output is NaN-prefilled and both a raise and a surviving NaN count as failure (docs/operator.md §2.5). On the
    CPU a kernel whose tile memory exceeds Warp's 256 KiB arena would abort the process, so it is
    refused from the module's own shared-memory figure instead of launched.
    """
    return canary(kernel, tile_m, tile_n, r, block_dim, device_str(device))[0]


@dataclass(frozen=True)
class Built:
    """A validated config: its spec and the kernel that passed the canary on a device."""
    config: FwdConfig
    kernel: object


def get_config(name, device=None, mathdx: Optional[bool] = None, bf16: bool = False) -> Optional[Built]:
    """The :class:`Built` of a config on ``device`` (built once, canary-validated once per device), or None
    when it cannot launch there (:data:`VALIDATED` remembers why).

    ``name``: a registered config name, or a :class:`FwdConfig` of tiles nobody registered (the lab's
    widgets build those through this same cache, keyed by the config itself). ``bf16``: the config's bf16
    kernel (mma families only), validated separately.
    """
    cfg = name if isinstance(name, FwdConfig) else config_spec(name)
    dev = device_str(device)
    if mathdx is None:
        mathdx = mathdx_default()

    def build():
        try:
            kernel = build_kernel(cfg, mathdx, bf16=bf16)
        except ValueError:
            raise                      # a config with no such kernel: the caller's error, not the device's
        except Exception as exc:  # codegen / compile failure
            return None, f"build failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        ok, why = canary(kernel, cfg.tile_m, cfg.tile_n, cfg.r, cfg.block_dim, dev)
        return (Built(cfg, kernel) if ok else None), why

    return VALIDATED.get(cache_key(name, mathdx, bf16), dev, build)


def cache_key(name, mathdx: Optional[bool], bf16: bool = False):
    """The :data:`VALIDATED` key of a config name (or unregistered :class:`FwdConfig`) at a MathDx setting
    (and ``" (bf16)"`` on the name of a bf16 kernel)."""
    if isinstance(name, FwdConfig):      # keyed by what the kernel is, and readable in the cache's warnings
        c = name
        name = f"{c.name} (unregistered {c.variant} m{c.tile_m} n{c.tile_n} k{c.tile_k} r{c.r} b{c.block_dim})"
    if bf16:
        name = f"{name} (bf16)"
    return name if mathdx is None else (name, mathdx)


def get_uncached_config(name: str, device=None, bf16: bool = False) -> Optional[Built]:
    """Build (once) and canary-validate (once per device) an uncached config; None when unlaunchable.

    A config that fails is remembered as None and reported once with a ``RuntimeWarning`` saying why.
    """
    if family(config_spec(name).variant).inference_only:      # (an unknown name raises here)
        raise ValueError(f"config: {name!r} is a cached-path config; run_uncached takes one of "
                         f"{', '.join(_UNCACHED_BATCH_CONFIG_SPECS)}, or an id of any point of the uncached "
                         f"families (fovi_lab.kernels.families)")
    return get_config(name, device, bf16=bf16)


def require_config(name: str, device: str, bf16: bool = False) -> Built:
    if family(config_spec(name).variant).inference_only:      # a cached-path config (its family says so)
        built = get_config(name, device)
    else:
        built = get_uncached_config(name, device, bf16)
    if built is None:
        why = VALIDATED.why(cache_key(name, mathdx_default(), bf16), device)
        raise RuntimeError(f"config: forward config {name!r} cannot be launched on {device} ({why}); "
                           f"pick another config or leave config=None")
    return built
