"""Build the staged adjoint kernels once, and validate each once per device with the NaN canary.

:func:`get_grad_kernel` is the cache: (kind, config name, device) -> :class:`GradKernel`, or None with the
reason remembered. An unlaunchable default config makes the public gradients fall back to the PyTorch op
with a warning; an unlaunchable explicit config raises.
"""

# No `from __future__ import annotations`: Warp resolves kernel annotations (closure dtypes) at decoration.

import time
import uuid
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

from fovi_lab.kernels.common import ValidatedCache, init_warp, nan_canary, to_warp, torch_stream, wp
from fovi_lab.kernels.adjoint.configs import _GI_TILE_O, _GW_TILE_B, _MODULE_OPTIONS
from fovi_lab.kernels.adjoint.staged import STAGED_KINDS, _build_kernel
from fovi_lab.kernels.families.base import Point
from fovi_lab.kernels.families.registry import adjoint_family, adjoint_point


def _torch_device(device: str) -> torch.device:
    return torch.device("cpu") if str(device) == "cpu" else torch.device(str(device))


def _launch_stage(kernel, spec: dict, kind: str, idx_table, operand, g, out, device: str):
    """Launch a gi/gw stage kernel with the uniform argument list (see the factories)."""
    p64 = idx_table.shape[1]
    wide = out.shape[2]
    n_inner = g.shape[1] // spec[adjoint_family(kind).spec_inner]
    with torch_stream(device):      # checked wp.array views and a plain launch: this is the canary's path
        wp.launch_tiled(kernel, dim=_stage_dims(spec, kind, out.shape[0], p64, wide),
                        inputs=[to_warp(idx_table), to_warp(operand), to_warp(g), int(p64 // spec["tile_p"]),
                                int(n_inner), to_warp(out)], block_dim=spec["block_dim"], device=device)


def _kernel_stage_is_fp32(kernel) -> bool:
    """Whether a factory-built kernel stages in fp32 (the factories tag their kernels)."""
    tag = getattr(kernel, "fovi_fp32_stage", None)
    if tag is None:
        raise ValueError("kernel: expected a kernel built by a fovi_lab.kernels.adjoint.staged factory")
    return bool(tag)


def _canary_grad_stage(kernel, tile_p, tile_wide, block_dim, version, weight_operand, device,
                       tile_o: int = _GI_TILE_O, tile_kb: int = _GW_TILE_B) -> Tuple[bool, str]:
    """Run a stage kernel once on a tiny single-node problem into a NaN-prefilled output.

    ``weight_operand=True`` means a gi kernel (gathers rows of W^T; ``tile_wide`` = batch tile);
    False a gw kernel (gathers rows of xt; ``tile_wide`` = o tile); ``tile_o``: a gi kernel's Cout chunk,
    ``tile_kb``: a gw kernel's batch chunk.
    Checks that every output entry is
    written and finite and matches a torch product (catches garbage as well as silent no-ops).
    """
    try:
        init_warp()
        dev = _torch_device(device)
        gen = torch.Generator().manual_seed(1234)
        p64 = 2 * tile_p                       # two p tiles: exercises the p loop / p grid axis
        if weight_operand:
            cpad, bpad, q = 2 * tile_o, tile_wide, 3 * tile_p   # two Cout chunks: exercises the o loop
            table = torch.randint(0, q, (1, p64), generator=gen, dtype=torch.int32)
            operand = (torch.randn(q, cpad, generator=gen) * 0.25).half()
            g = (torch.randn(1, cpad, bpad, generator=gen) * 0.25).half()
            want = operand.float()[table[0].long()] @ g[0].float()                       # [P64, Bpad]
            out_shape = (1, p64, bpad)
            spec = dict(version=version, tile_p=tile_p, tile_b=tile_wide, tile_o=tile_o, block_dim=block_dim)
            kind = "gi"
        else:
            cpad, bpad, rows = 2 * tile_wide, 2 * tile_kb, 3 * tile_p   # two batch chunks: the K loop
            table = torch.randint(0, rows, (1, p64), generator=gen, dtype=torch.int32)
            table[0, ::7] = rows - 1             # some pad entries (the zero row)
            operand = (torch.randn(rows, bpad, generator=gen) * 0.25).half()
            operand[-1] = 0
            g = (torch.randn(1, bpad, cpad, generator=gen) * 0.25).half()
            want = operand.float()[table[0].long()] @ g[0].float()                       # [P64, Cout_pad]
            out_shape = (1, p64, cpad)
            spec = dict(version=version, tile_p=tile_p, tile_n=tile_wide, tile_kb=tile_kb, block_dim=block_dim)
            kind = "gw"
        et = torch.bfloat16 if getattr(kernel, "fovi_bf16", False) else torch.float16
        operand, g = operand.to(et), g.to(et)           # the kernel's operand dtype (want is of the fp16 values:
        want = operand.float()[table[0].long()] @ g[0].float()      # recomputed from the rounded ones)
        if str(version).endswith("i"):            # staged-operand kernels read the rows pre-gathered
            operand = operand[table[0].long()].contiguous()
        fp32 = _kernel_stage_is_fp32(kernel)
        out = torch.empty(out_shape, dtype=torch.float32 if fp32 else torch.float16, device=dev)
        table, operand, g = table.to(dev), operand.to(dev), g.to(dev)
        ok, why = nan_canary(lambda: _launch_stage(kernel, spec, kind, table, operand, g, out, device), out)
        if not ok:
            return False, why
        err = (out[0].float().cpu() - want).abs().max().item()
        if err > 2e-2:
            return False, f"canary result wrong (max abs err {err:.3g})"
        return True, "ok"
    except Exception as exc:  # a compile error is "unlaunchable" too
        return False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"


def canary_grad_stage_ok(kernel, tile_p, tile_wide, block_dim, version, weight_operand, device) -> bool:
    """NaN-canary a grad staging kernel (same silent-launch trap as the forward). True when it works."""
    return _canary_grad_stage(kernel, tile_p, tile_wide, block_dim, version, weight_operand, device)[0]


def _csr_problem_dx(gen, sdt, dev):
    """dx's sum: ``out[c, m, b]`` over input node m's reverse entries ``n*P64 + k`` of the stage ``da``."""
    nin, cin, k, p64, nout, bc = 3, 2, 2, 64, 2, 5
    rowptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    rev_row = torch.tensor([0, 64 + 1, 1, 64, 65], dtype=torch.int32)   # n*P64 + k
    da = (torch.randn(nout * p64, bc, generator=gen)).to(sdt)
    out = torch.empty(cin, nin, bc, dtype=torch.float32, device=dev)
    want = torch.zeros(cin, nin, bc)
    for m in range(nin):
        for i in range(int(rowptr[m]), int(rowptr[m + 1])):
            for c in range(cin):
                want[c, m] += da[int(rev_row[i]) + c * k].float()
    return [rowptr.to(dev), rev_row.to(dev), da.to(dev), k], (nin, cin, bc), out, want, None


def _csr_problem_taps(gen, sdt, dev):
    """The tap-expanded sum: ``s [B, Cin*vn]``, entries at column ``c*vn + rev_taps[i]``."""
    nin, cin, vn, b = 3, 2, 6, 5
    rowptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    rev_taps = torch.tensor([4, 1, 0, 5, 3], dtype=torch.int32)
    s = torch.randn(b, cin * vn, generator=gen)
    out = torch.empty(b, cin, nin, dtype=torch.float32, device=dev)
    want = torch.zeros(b, cin, nin)
    for m in range(nin):
        for i in range(int(rowptr[m]), int(rowptr[m + 1])):
            for c in range(cin):
                want[:, c, m] += s[:, c * vn + int(rev_taps[i])]
    return [rowptr.to(dev), rev_taps.to(dev), s.to(dev), vn], (b, cin, nin), out, want, None


def _csr_problem_dw(gen, sdt, dev):
    """dW's sum: ``out[q, o]`` over weight column q's stage rows; columns ``>= cout`` are never written."""
    q, cpad, cout = 3, 8, 5
    rowptr = torch.tensor([0, 2, 2, 5], dtype=torch.int32)
    w_col = torch.tensor([0, 3, 1, 2, 4], dtype=torch.int32)
    dweff = torch.randn(5, cpad, generator=gen).to(sdt)
    out = torch.empty(q, cpad, dtype=torch.float32, device=dev)
    want = torch.zeros(q, cpad)
    for r in range(q):
        for i in range(int(rowptr[r]), int(rowptr[r + 1])):
            want[r] += dweff[int(w_col[i])].float()
    return [rowptr.to(dev), w_col.to(dev), dweff.to(dev), 0, 2147483647, 0], (q, cout), out, want, cout


#: The canary problem of each sum's target (the ``target`` parameter of the reductions family): ``(args, dim, out,
#: want, columns)``, ``columns`` the leading columns of ``out`` the kernel writes (None: all of them).
_CSR_PROBLEMS = {"dx": _csr_problem_dx, "dx_taps": _csr_problem_taps, "dw": _csr_problem_dw}


def _canary_csr(kernel, target: str, device) -> Tuple[bool, str]:
    """Run a reduction kernel on a tiny hand-made index into a NaN-prefilled output and check it."""
    try:
        init_warp()
        dev = _torch_device(device)
        gen = torch.Generator().manual_seed(99)
        sdt = torch.float32 if _kernel_stage_is_fp32(kernel) else torch.float16
        args, dim, out, want, cols = _CSR_PROBLEMS[target](gen, sdt, dev)

        def launch():
            with torch_stream(device):
                wp.launch(kernel, dim=dim, inputs=[to_warp(a) if isinstance(a, torch.Tensor) else a for a in args],
                          outputs=[to_warp(out)], device=device)

        view, want = (out, want) if cols is None else (out[:, :cols], want[:, :cols])
        out.fill_(float("nan"))                # columns >= cols are never written: they stay NaN
        ok, why = nan_canary(launch, view)
        if not ok:
            return False, why
        err = (view.float().cpu() - want).abs().max().item()
        if err > 1e-5:
            return False, f"canary result wrong (max abs err {err:.3g})"
        return True, "ok"
    except Exception as exc:
        return False, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"


def canary_csr_ok(kernel, target: str, device) -> bool:
    """True when a reduction kernel (``target`` 'dx' or 'dw') launches and computes correctly."""
    return _canary_csr(kernel, target, device)[0]


@dataclass(frozen=True)
class GradKernel:
    """A built and canary-validated kernel: ``kind`` in {gi, gw, csr}, its name, spec, stage dtype and point of its
    family (:func:`fovi_lab.kernels.families.registry.adjoint_point`)."""

    kind: str
    name: str
    kernel: object
    spec: dict
    fp32_stage: bool
    point: Optional[Point] = None

    def grid(self, nodes: int, p64: int, wide: int) -> Tuple[int, ...]:
        """The launch grid of a stage kernel (:func:`_stage_dims`)."""
        return self.point.owner.grid(self.spec, nodes, p64, wide)


GRAD_KERNELS = ValidatedCache("Warp grad kernel config")


def normalize_device(device) -> str:
    if device is None:
        init_warp()
        return str(wp.get_device())
    if isinstance(device, torch.device):
        if device.type == "cpu":
            return "cpu"
        return f"cuda:{device.index if device.index is not None else torch.cuda.current_device()}"
    s = str(device)
    if s == "cuda":
        return f"cuda:{torch.cuda.current_device()}"
    return s


def _canary(kernel, point: Point, device) -> Tuple[bool, str]:
    """The canary of a staged kernel of ``point``: a sum's (:func:`_canary_csr`) or a stage GEMM's
    (:func:`_canary_grad_stage`) as its family is."""
    fam = point.owner
    if fam.sums:
        return _canary_csr(kernel, point["target"], device)
    spec = fam.spec(point)
    return _canary_grad_stage(kernel, spec["tile_p"], spec[fam.spec_wide], spec["block_dim"], spec["version"],
                              fam.gradient == "dx", device, **{fam.spec_inner: spec[fam.spec_inner]})


def get_grad_kernel(kind: str, name: str, device) -> Optional[GradKernel]:
    """``kind`` in {'gi', 'gw', 'csr'}; the per-device validated :class:`GradKernel`, or None when unlaunchable.

    Built and canary-checked once per (kind, name, device); a name that is no kernel of the kind raises ``KeyError``
    (any point of its family runs by its id, :func:`fovi_lab.kernels.families.registry.adjoint_point`).
    """
    device = normalize_device(device)
    if kind not in STAGED_KINDS:
        raise ValueError(f"kind: expected one of {', '.join(map(repr, STAGED_KINDS))}, got {kind!r}")
    point = adjoint_point(kind, name)

    def build():
        try:
            kernel, spec, fp32 = _build_kernel(kind, name)
        except Exception as exc:
            return None, f"build failed: {type(exc).__name__}: {exc}"
        ok, why = _canary(kernel, point, device)
        return (GradKernel(kind, name, kernel, spec, fp32, point) if ok else None), why

    return GRAD_KERNELS.get((kind, name), device, build)


def warm_grad_kernel(kind: str, name: str, device: str) -> Tuple[bool, str, float]:
    """Build, compile and canary one kernel on ``device``; ``(ok, why, seconds)``.

    A top-level function so that a spawned process pool can fill Warp's on-disk kernel cache in
    parallel (MathDx compiles take ~50 s per module on the H200 box and in-process workers do not
    overlap them); the main process then loads every module from the cache.
    """
    t0 = time.perf_counter()
    init_warp()
    k = get_grad_kernel(kind, name, device)
    return k is not None, (GRAD_KERNELS.why((kind, name), normalize_device(device)) or "ok"), \
        time.perf_counter() - t0


def spec_of(kind: str, name: str) -> dict:
    """The spec record of the kernel ``(kind, name)`` (a stage kernel's is its tiles', whatever its dtypes)."""
    point = adjoint_point(kind, name)
    return point.owner.spec(point)


def aot_compile_grad_kernels(names, arch, module_dir, *, mathdx: Optional[bool] = False,
                             use_ptx: bool = False, shared_module: bool = True) -> Dict[str, dict]:
    """Compile ``(kind, name)`` kernels ahead of time for CUDA ``arch`` (int or list) with no GPU.

    Uses ``wp.compile_aot_module`` (Warp's bundled NVRTC). ``mathdx=False`` compiles the scalar
    ``tile_matmul`` fallback, ``True`` the cuBLASDx GEMM (~60 s per kernel and arch on a 2-core box),
    None defers to ``wp.config``. With ``shared_module`` (default) the kernels are built into one
    fresh Warp module per block_dim (a tile kernel's code depends on its module's block_dim) and
    compiled in one NVRTC call per module and arch: ~3x cheaper than one module per kernel. Otherwise
    each kernel's own runtime module is compiled (what a warm-up into the kernel cache would do).

    Returns ``{"kind:name": {"seconds": s, "files": [artifact paths]}}`` (with a shared module the
    seconds and files are those of the kernel's module). This proves the generated CUDA compiles;
    whether a config fits a device's shared memory is only known at launch (the canary's job).
    """
    init_warp()
    opts = {} if mathdx is None else {"enable_mathdx_gemm": bool(mathdx)}
    out: Dict[str, dict] = {}
    if not shared_module:
        for kind, name in names:
            kernel, _spec, _fp32 = _build_kernel(kind, name, module_options=opts or None)
            t0 = time.perf_counter()
            files = wp.compile_aot_module(kernel.module, arch=arch, module_dir=module_dir, use_ptx=use_ptx)
            out[f"{kind}:{name}"] = {"seconds": time.perf_counter() - t0, "files": [str(f) for f in files or []]}
        return out
    groups: Dict[int, list] = {}
    for kind, name in names:
        groups.setdefault(int(spec_of(kind, name)["block_dim"]), []).append((kind, name))
    for block_dim, items in sorted(groups.items()):
        mname = f"fovi_lab_aot_adjoint_b{block_dim}_{uuid.uuid4().hex[:8]}"
        wp.set_module_options(dict(_MODULE_OPTIONS, block_dim=block_dim, enable_backward=False, **opts),
                              module=mname)
        for kind, name in items:
            _build_kernel(kind, name, module=mname)
        t0 = time.perf_counter()
        files = wp.compile_aot_module(wp.get_module(mname), arch=arch, module_dir=module_dir, use_ptx=use_ptx)
        rec = {"seconds": time.perf_counter() - t0, "files": [str(f) for f in files or []]}
        for kind, name in items:
            out[f"{kind}:{name}"] = rec
    return out


def _stage_dims(spec: dict, kind: str, nrows: int, p64: int, wide: int) -> Tuple[int, ...]:
    """Launch grid of a stage kernel; ``wide`` = Bpad (gi) or Cout_pad (gw)."""
    return adjoint_family(kind).grid(spec, nrows, p64, wide)
