"""Whole foveated networks: a train step of fovi's own KNNAlexNet and KNNResNet-18 with fovi_lab inside them, beside
each of fovi's own backends, in one run.

    python -m fovi_lab bench network [--net alexnet resnet18] [--batches 64 256] [--modes eager compiled graphed]
                                     [--backends fovi_lab auto cuda baseline torch_compact warp_train]
                                     [--lab-backend warp_train|auto|...] [--steps 20] [--precision amp|fp16|fp32]
                                     [--device cpu|cuda] [--out F.jsonl]

The networks are fovi's (:func:`fovi_lab.integrations.fovi.fovi_network`: the classes' default foveated
configuration at a 64 x 64 budget, a 1000-class head); their input is the retinal samples ``[B, 3, N]``. A step is
what a training loop runs: the forward, cross-entropy against labels, the backward and an SGD update (momentum
0.9), the gradients set to None first. Backends:

* ``fovi_lab``: fovi_lab's ``warp_train`` (``--lab-backend``: another of its backends) in every KNN conv layer
  through fovi's own registry (:func:`fovi_lab.integrations.fovi.fovi_lab_inside`: on a GPU as fovi's
  ``kernel_backend="warp_train"``); on a CPU ``--lab-backend auto`` runs per layer the fastest CPU form
  (:mod:`fovi_lab.ops.cpu_auto`), what a user there runs;
* fovi's own ``kernel_backend`` values: ``auto`` (fovi's choice per layer), ``cuda`` (its fused CuPy kernel),
  ``baseline`` (the dense one-hot einsum), ``torch_compact``, and ``warp_train`` (fovi's copy of the seed's Warp
  kernels; with fovi_lab registered this name is fovi_lab's, so it is measured before fovi_lab is registered);
* ``stubbed``: no backend: every KNN conv layer a place-holder (:func:`fovi_lab.integrations.fovi.knn_stubbed`:
  zeros out, zero gradients), so the step costs what the rest of the network costs (batch norm, activations,
  pooling, head, loss, optimizer). Not an alternative (no speedup is taken against it): where it ran, every timed
  record of the mode gets ``rest_ms`` (its time) and ``knn_ms`` (its own time less that: its KNN layers' share of
  the step), and fovi_lab's gets ``speedup_knn_<mode>``, the fastest other backend's ``knn_ms`` over ours.

Modes: ``eager`` (one call after another, as most researchers train), ``compiled`` (``torch.compile`` of the
model), ``reduce-overhead`` (``torch.compile(mode="reduce-overhead")``, Inductor's CUDA graphs, after
:func:`fovi_lab.ops.graphs.prepare`; a GPU only, and timed only where ``--modes`` names it: its compile takes minutes)
and ``graphed`` (:func:`fovi_lab.ops.graphs.graphed`: forward and backward replayed from CUDA graphs; a GPU only).
Precision ``amp`` (fp32 weights, float16 autocast; the default on a GPU, and a GPU only: fovi's dispatch has no
float16 autocast on a CPU), ``fp16`` (weights and inputs in float16; the default on a CPU) or ``fp32`` (weights and
inputs in fp32, no autocast: what a CPU trains in).

Per (net, B, mode, backend) a record: ``ms`` (per step, the mean of ``steps`` steps issued back to back, one sync
at the end), ``images_per_s``; CUDA memory, in MiB: ``peak_mib`` (the largest allocation total over the timed steps,
the peak statistics reset after the warm-ups), ``peak_run_mib`` (the same over the mode's whole run: wrapping, a
graph's capture, the warm-ups and the timed steps; what a researcher's training run needs), ``reserved_run_mib``
(what the caching allocator held from the device at most over that run, the graphs' private pools included, its
cache emptied at the start) and ``resident_mib`` (allocated after the timed steps: weights, gradients, optimizer
state, the graphs' static tensors, fovi_lab's tables); ``tables_mib`` (fovi_lab's rows: the index tables its layers
keep, their own and the adjoints' derived layers, :func:`fovi_lab.graph.meta.held_bytes`; part of the resident
memory, on the CPU too); ``replay_resident_mib`` and
``replay_stats`` (what fovi_lab's per-call CUDA graphs hold then and how many calls they replayed,
:mod:`fovi_lab.ops.replay`; part of the peak), ``loss`` and ``grad_err`` of the first step (per parameter, the largest
gradient difference from fp32 over the largest fp32 gradient, the largest over the parameters; fp32 is fovi's
``baseline`` backend on an fp32 copy of the same weights and data),
``grads_bitwise_repeatable`` (two first steps from the same state, every gradient compared bit for bit), and on
fovi_lab's rows ``speedup_<mode>``: the fastest other backend's time of the same run and mode over fovi_lab's. A
backend that refuses the device or dtype is recorded with its reason (``note``) and not timed.

Alternatives timed by an earlier call (``--alternatives F.jsonl``): where a GPU machine is lent a call at a time, fovi's
backends can be timed in one call and fovi_lab in the next. The records of ``F`` taken on this machine
(:func:`fovi_lab.bench.common.boot_id`: no restart between them) at this commit, on the same device, net, B, mode,
precision and grid, stand in for this run's other backends: fovi_lab's records get their speedups over them, name
that run in ``run`` (its date, as the report groups runs) and say so in ``alternatives``.

Graphed (``graphed``, :func:`fovi_lab.ops.graphs.graphed`, with autocast's casts captured under ``amp``) and
``reduce-overhead``: on a GPU each backend is captured in a process of its own (:func:`graphed_in_child`), since a
backend whose capture fails can leave the CUDA context unusable for the captures after it, and so each peak is its
own.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from fovi_lab.bench import memory
from fovi_lab.bench.common import _sync, emit_rows, env_info, say_appended, stamp_command
from fovi_lab.ops import replay
from fovi_lab.ops.arguments import command_main

__all__ = ["BACKENDS", "LAB_BACKEND", "LAB_BACKENDS", "PRECISIONS", "MODES", "CAPTURED", "DEFAULT_MODES", "STUB",
           "step_precision",
           "add_speedups", "earlier_alternatives",
           "graphed_in_child", "network_records",
           "main", "add_arguments", "run", "DESCRIPTION"]

PROG = "python -m fovi_lab bench network"
#: The place-holder backend: the KNN conv layers stubbed, the rest of the network timed (not an alternative).
STUB = "stubbed"
#: The backends, fovi_lab first, then fovi's own kernel_backend values, then the place-holder.
BACKENDS = ("fovi_lab", "auto", "cuda", "baseline", "torch_compact", "warp_train", STUB)
#: The step's precisions (the module doc says what each is).
PRECISIONS = ("amp", "fp16", "fp32")
#: fovi_lab's backend in the ``fovi_lab`` rows unless ``--lab-backend`` names another, and those it may name.
LAB_BACKEND = "warp_train"
LAB_BACKENDS = ("warp_train", "auto", "torch_dense", "torch_binned", "torch_compact")
MODES = ("eager", "compiled", "reduce-overhead", "graphed")
#: The modes that capture CUDA graphs: each backend runs them in a process of its own on a GPU (graphed_in_child).
CAPTURED = ("reduce-overhead", "graphed")
#: The modes a GPU run times when none are named (reduce-overhead only where asked: its compile takes minutes).
DEFAULT_MODES = ("eager", "compiled", "graphed")
#: ``note_run`` of a run under ``--memory-trace`` (the tables leave such runs out: recording every allocation's stack
#: slows the host).
TRACE_NOTE = "memory trace: the allocator recorded every allocation's stack, so its times are not the step's"


class _Run:
    """One network on one device: its initial state, data, and a fresh copy to train per backend and mode."""

    def __init__(self, net: str, batch: int, device, precision: str, seed: int = 0, in_res: int = 64):
        from fovi_lab.integrations.fovi import fovi_network

        self.device, self.precision, self.batch = device, precision, batch
        torch.manual_seed(seed)
        model = fovi_network(net, device, in_res=in_res)
        if precision == "fp16":
            model = model.half()
        self.model = model
        self.state = copy.deepcopy(model.state_dict())
        gen = torch.Generator().manual_seed(seed + 1)
        dtype = torch.float16 if precision == "fp16" else torch.float32
        self.x = torch.randn(batch, 3, model.fovi_lab_nin, generator=gen).to(device, dtype)
        self.labels = torch.randint(0, 1000, (batch,), generator=gen).to(device)

    def fresh(self):
        self.model.load_state_dict(self.state)
        self.model.train()
        for p in self.model.parameters():
            p.grad = None
        return self.model

    def step_fn(self, model, opt):
        amp = self.precision == "amp" and self.device.type == "cuda"

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast(self.device.type, dtype=torch.float16, enabled=amp):
                out = model(self.x)
            loss = F.cross_entropy(out.float(), self.labels)
            loss.backward()
            opt.step()
            return loss
        return step

    def first_grads(self, model):
        """The loss and the gradients of one step from the initial state (no update)."""
        self.fresh()
        amp = self.precision == "amp" and self.device.type == "cuda"
        with torch.autocast(self.device.type, dtype=torch.float16, enabled=amp):
            out = model(self.x)
        loss = F.cross_entropy(out.float(), self.labels)
        loss.backward()
        grads = [None if p.grad is None else p.grad.detach().clone() for p in self.model.parameters()]
        for p in self.model.parameters():
            p.grad = None
        return float(loss.detach()), grads

    def reference_grads(self):
        """The first step's gradients in fp32: fovi's ``baseline`` backend (the dense one-hot einsum) on an fp32
        copy of the model, the same weights and data, no autocast."""
        from fovi_lab.integrations.fovi import fovi_backend

        self.fresh()
        model = copy.deepcopy(self.model).float()
        with fovi_backend(model, "baseline"):
            loss = F.cross_entropy(model(self.x.float()).float(), self.labels)
            loss.backward()
        return [None if p.grad is None else p.grad.detach() for p in model.parameters()]


def _grad_err(grads, ref) -> Optional[float]:
    """The largest, over the parameters, of max |g - r| / max |r|."""
    errs = [float((g.float() - r).abs().max()) / float(r.abs().max()) for g, r in zip(grads, ref)
            if g is not None and r is not None and float(r.abs().max()) > 0]
    return max(errs) if errs else None


def _why(exc: BaseException) -> str:
    """An exception as one line: its type and its message's first line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _backend_context(run: _Run, backend: str, lab_backend: str = LAB_BACKEND):
    from fovi_lab.integrations.fovi import fovi_backend, fovi_lab_inside, knn_stubbed

    if backend == "fovi_lab":
        return fovi_lab_inside(run.model, lab_backend, run.device)
    if backend == STUB:
        return knn_stubbed(run.model)
    return fovi_backend(run.model, backend)


def _wrapped(run: _Run, mode: str):
    model = run.fresh()
    if mode == "compiled":
        return torch.compile(model)
    if mode == "reduce-overhead":                  # Inductor's CUDA graphs, after the tables are built outside them
        from fovi_lab.ops.graphs import prepare
        amp = run.precision == "amp" and run.device.type == "cuda"
        with torch.autocast(run.device.type, dtype=torch.float16, enabled=amp):
            prepare(model, run.x)
        return torch.compile(model, mode="reduce-overhead")
    if mode == "graphed":
        from fovi_lab.ops.graphs import graphed
        amp = run.precision == "amp" and run.device.type == "cuda"
        return graphed(model, run.x, autocast=torch.float16 if amp else None)
    return model


def _tables_mib(run: _Run, backend: str) -> Optional[float]:
    """fovi_lab's rows: the index tables its layers keep on the run's device, in MiB (their own and what the
    adjoints derived from them: :func:`fovi_lab.graph.meta.held_bytes`); None for fovi's backends."""
    if backend != "fovi_lab":
        return None
    from fovi_lab.graph.meta import held_bytes
    from fovi_lab.integrations.fovi import lab_metas
    return held_bytes(lab_metas(run.model), run.device) / 2**20


class _Memory:
    """CUDA memory over a span of a backend's run (None on the CPU): the allocator's peak statistics reset at its
    start (its free cached blocks handed back first where ``empty_cache``, so the reserved peak is the span's own)."""

    def __init__(self, device, empty_cache: bool = True):
        self.device = device
        if device.type == "cuda":
            if empty_cache:
                torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)

    def peaks(self) -> tuple:
        """(peak allocated, peak reserved) since the start, MiB; (None, None) on the CPU."""
        if self.device.type != "cuda":
            return None, None
        return (torch.cuda.max_memory_allocated(self.device) / 2**20,
                torch.cuda.max_memory_reserved(self.device) / 2**20)

    def record(self, run_peaks: tuple) -> dict:
        """The record's memory fields (see the module docstring), this span being the timed steps and ``run_peaks``
        the :meth:`peaks` of the run before them."""
        peak, reserved = self.peaks()
        cuda = self.device.type == "cuda"
        return dict(peak_mib=peak,
                    peak_run_mib=None if not cuda else max(run_peaks[0], peak),
                    reserved_run_mib=None if not cuda else max(run_peaks[1], reserved),
                    resident_mib=torch.cuda.memory_allocated(self.device) / 2**20 if cuda else None)


def _time_mode(run: _Run, mode: str, warmup: int, steps: int) -> tuple:
    """(ms per step, the last loss, the memory fields) of ``run``'s model in ``mode``: wrapped (compiled, graphed),
    ``warmup`` steps, then ``steps`` timed back to back."""
    device = run.device
    run_mem = _Memory(device)                    # the mode's whole run: wrapping, capture, warm-ups, steps
    model = _wrapped(run, mode)
    opt = torch.optim.SGD(run.model.parameters(), lr=0.01, momentum=0.9)
    step = run.step_fn(model, opt)
    for _ in range(warmup):
        step()
    _sync(device)
    run_peaks = run_mem.peaks()
    steady = _Memory(device, empty_cache=False)  # the timed steps alone
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    _sync(device)
    ms = (time.perf_counter() - t0) * 1e3 / steps
    return ms, loss, steady.record(run_peaks)


def step_precision(precision: Optional[str], device: torch.device) -> str:
    """``precision`` (None: the device's default, amp on a GPU, fp16 on a CPU), or a ValueError naming one that is
    not in :data:`PRECISIONS` or cannot run on ``device``."""
    precision = precision or ("amp" if device.type == "cuda" else "fp16")
    if precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "amp" and device.type != "cuda":
        raise ValueError("precision: amp is float16 autocast, which fovi's dispatch has on a GPU only; on a CPU "
                         "fp32 or fp16")
    return precision


def network_records(net: str, batch: int, backends=BACKENDS, modes=("eager",), steps: int = 10, warmup: int = 3,
                    device="cpu", precision: Optional[str] = None, in_res: int = 64,
                    memory_trace: bool = False, lab_backend: str = LAB_BACKEND) -> List[dict]:
    """The records of one network and batch (see the module doc): every backend in every mode (``lab_backend``:
    fovi_lab's backend in the ``fovi_lab`` rows, recorded as theirs). ``in_res``: the
    side of the Cartesian grid fovi matches the retinal samples to (64, the networks' budget; smaller makes every
    layer smaller, for a quick run on a CPU). ``memory_trace``: record every allocation of each mode's run and give
    the records ``memory_at_peak`` (:func:`fovi_lab.bench.memory.at_peak`; CUDA) and :data:`TRACE_NOTE`."""
    device = torch.device(device)
    precision = step_precision(precision, device)
    run = _Run(net, batch, device, precision, in_res=in_res)
    base = dict(kind="network", net=net, B=batch, precision=precision, steps=steps, in_res=in_res)
    ref = run.reference_grads()
    # fovi's own warp_train before fovi_lab registers under that name, fovi_lab last
    rank = {"warp_train": 0, "fovi_lab": 2}
    order = sorted(dict.fromkeys(backends), key=lambda b: rank.get(b, 1))
    recs: List[dict] = []
    for backend in order:
        try:
            ctx = _backend_context(run, backend, lab_backend)
            route = ctx.__enter__()
        except Exception as exc:  # noqa: BLE001
            recs += [dict(base, mode=m, backend=backend, note=_why(exc)) for m in modes]
            continue
        try:
            route = route if isinstance(route, str) else f"fovi's kernel_backend={backend!r}"
            try:
                loss0, grads = run.first_grads(run.model)
                _, grads1 = run.first_grads(run.model)
            except Exception as exc:  # noqa: BLE001  (fovi refuses a backend on this device or dtype)
                recs += [dict(base, mode=m, backend=backend, route=route, note=_why(exc)) for m in modes]
                continue
            bitwise = all((a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))
                          for a, b in zip(grads, grads1))
            for mode in modes:
                rec = dict(base, mode=mode, backend=backend, route=route, loss=loss0,
                           **({"lab_backend": lab_backend} if backend == "fovi_lab" else {}),
                           grad_err=None if backend == STUB else _grad_err(grads, ref),
                           grads_bitwise_repeatable=None if backend == STUB else bitwise)
                if mode in CAPTURED and device.type != "cuda":
                    recs.append(dict(rec, note="CUDA graphs need a GPU"))
                    continue
                try:
                    with memory.recorded(device) if memory_trace else contextlib.nullcontext({}) as traced:
                        ms, loss, mem = _time_mode(run, mode, warmup, steps)
                except Exception as exc:  # noqa: BLE001
                    recs.append(dict(rec, note=_why(exc)))
                    continue
                if memory_trace:
                    rec.update(note_run=TRACE_NOTE, memory_at_peak=memory.at_peak(
                        traced["snapshot"], device.index or 0, traced["before"]) if traced else None)
                recs.append(dict(rec, ms=ms, images_per_s=batch / (ms * 1e-3), loss_after=float(loss.detach()),
                                 **mem, replay_resident_mib=replay.resident_bytes(device) / 2**20,
                                 tables_mib=_tables_mib(run, backend), replay_stats=replay.stats()))
        finally:
            ctx.__exit__(None, None, None)
    add_speedups(recs, modes)
    return recs


def add_speedups(recs: List[dict], modes) -> None:
    """fovi_lab's record of each mode gets ``speedup_<mode>`` over the fastest other backend of that mode, and
    ``fastest_other``; where the place-holder (:data:`STUB`) ran in that mode, every timed record gets ``rest_ms``
    and ``knn_ms``, and fovi_lab's ``speedup_knn_<mode>`` (the fastest other backend's KNN layers over ours)."""
    for mode in modes:
        timed = [r for r in recs if r["mode"] == mode and r.get("ms")]
        ours = next((r for r in timed if r["backend"] == "fovi_lab"), None)
        others = [r for r in timed if r["backend"] not in ("fovi_lab", STUB)]
        rest = next((r["ms"] for r in timed if r["backend"] == STUB), None)
        if rest is not None:
            for r in timed:
                if r["backend"] != STUB:
                    r["rest_ms"], r["knn_ms"] = rest, r["ms"] - rest
        if ours and others:
            best = min(others, key=lambda r: r["ms"])
            ours[f"speedup_{mode}"] = best["ms"] / ours["ms"]
            ours["fastest_other"] = best["backend"]
            if rest is not None and ours["knn_ms"] > 0 and best["knn_ms"] > 0:     # (noise can put a step under it)
                ours[f"speedup_knn_{mode}"] = best["knn_ms"] / ours["knn_ms"]


#: What a record's provenance must share with an earlier call's for that call's backends to stand in as alternatives.
SAME_RUN_KEYS = ("device", "boot_id", "commit", "net", "B", "mode", "precision", "in_res")


def earlier_alternatives(recs: List[dict], earlier: List[dict]) -> None:
    """Join ``earlier`` (records of an earlier call, ``--alternatives``) to fovi_lab's records in ``recs`` as their other
    backends (see the module doc): per mode, fovi_lab's record gets the speedups over the earlier call's backends
    (:func:`add_speedups`), ``run`` (that call's date) and ``alternatives``. fovi_lab's records of the earlier call
    are not alternatives; a record with no match, or from another machine, commit or device, gets none of it."""
    for ours in (r for r in recs if r.get("backend") == "fovi_lab" and r.get("ms")):
        if ours.get("boot_id") is None:
            continue
        match = [dict(e) for e in earlier if e.get("kind") == "network" and e.get("backend") != "fovi_lab"
                 and all(e.get(k) == ours.get(k) for k in SAME_RUN_KEYS)]
        newest = max((e.get("date", "") for e in match), default=None)
        match = [e for e in match if e.get("date", "") == newest]          # one earlier call: the newest
        if not any(e.get("ms") and e["backend"] != STUB for e in match):
            continue
        add_speedups([ours] + match, [ours["mode"]])
        ours["run"] = match[0]["date"]
        ours["alternatives"] = (f"fovi's backends timed on this machine by an earlier call ({match[0]['date']}, the "
                                f"same boot, commit and device)")


def graphed_in_child(net: str, batch: int, backend: str, steps: int, device, precision: Optional[str],
                     timeout_s: float = 600.0, in_res: int = 64, memory_trace: bool = False,
                     mode: str = "graphed", lab_backend: str = LAB_BACKEND) -> List[dict]:
    """The records of one backend in a capturing ``mode`` (:data:`CAPTURED`), from a child process: a capture that
    fails (a backend that syncs or allocates while captured) can leave the CUDA context unusable for every capture
    after it in that process, so each backend captures in its own, and its memory peaks are its own. A child that
    fails gives one record saying why."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "graphed.jsonl")
        cmd = [sys.executable, "-m", "fovi_lab.bench.network", "--net", net, "--batches", str(batch), "--backends",
               backend, "--modes", mode, "--steps", str(steps), "--device", str(device), "--out", out,
               "--in-res", str(in_res), "--lab-backend", lab_backend, "--in-process"] \
            + (["--precision", precision] if precision else []) \
            + (["--memory-trace"] if memory_trace else [])
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1] if proc.returncode else ""
        except subprocess.TimeoutExpired:
            why = f"the child process ran past {timeout_s:.0f} s"
        if why or not os.path.exists(out):
            return [dict(kind="network", net=net, B=batch, in_res=in_res, mode=mode, backend=backend,
                         note=f"the {mode} run's process failed: {why or 'no records'}"[:300])]
        with open(out) as f:
            return [json.loads(line) for line in f if line.strip()]


#: The help text of ``python -m fovi_lab bench network``.
DESCRIPTION = """\
Whole foveated networks: a train step (forward, cross-entropy, backward, SGD) of fovi's own KNNAlexNet and
KNNResNet-18 with fovi_lab's warp_train inside them (through fovi's registry), beside each of fovi's own backends
(auto, cuda, baseline, torch_compact and its copy of the seed's warp_train), eager, torch.compile'd and replayed
from CUDA graphs, in images/s. Each backend's first step is checked against fp32 (fovi's baseline on an fp32 copy)
and repeated bit for bit; fovi_lab's rows carry the speedup over the fastest other backend of the same run and mode.

  python -m fovi_lab bench network --net resnet18 --batches 64 --modes eager graphed --out network.jsonl
  python -m fovi_lab bench network --device cpu --precision fp32 --lab-backend auto --batches 2 8 \
      --backends fovi_lab baseline torch_compact        # on a CPU in fp32: fovi_lab's auto against fovi's routes
"""


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab bench network``, each checked as it is parsed."""
    from fovi_lab.ops.arguments import COUNT, add_device_option, out_file

    parser.add_argument("--net", nargs="+", choices=("alexnet", "resnet18"), default=["resnet18", "alexnet"],
                        help="fovi's networks (default: resnet18 alexnet)")
    parser.add_argument("--batches", nargs="+", type=COUNT, default=[64, 256], metavar="B", help="batch sizes")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS),
                        help=f"fovi_lab, fovi's own backends and {STUB} (the KNN layers stubbed: what the rest of "
                             f"the step costs) (default: all)")
    parser.add_argument("--lab-backend", choices=LAB_BACKENDS, default=LAB_BACKEND,
                        help="fovi_lab's backend in the fovi_lab rows (default warp_train; on a CPU auto picks per "
                             "layer the fastest CPU form)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=None,
                        help="eager, compiled (torch.compile), reduce-overhead (torch.compile's CUDA graphs), "
                             "graphed (default: eager, compiled and graphed on a GPU, eager on a CPU)")
    parser.add_argument("--steps", type=COUNT, default=20, help="timed steps per backend and mode")
    parser.add_argument("--in-res", type=COUNT, default=64, metavar="SIDE",
                        help="the Cartesian grid's side fovi matches the retinal samples to (default 64, the "
                             "networks' budget; smaller, smaller layers: a quick run on a CPU)")
    parser.add_argument("--precision", choices=PRECISIONS, default=None,
                        help="amp: fp32 weights under float16 autocast (GPU default, a GPU only); fp16: weights and "
                             "inputs in float16 (CPU default); fp32: weights and inputs in fp32, no autocast")
    add_device_option(parser)
    parser.add_argument("--out", type=out_file, default=None,
                        help="JSON-lines file to append the records to (default: none, the table is printed)")
    parser.add_argument("--alternatives", type=_records_file, default=None, metavar="F.jsonl",
                        help="records of fovi's backends from an earlier call on this machine (same boot, commit "
                             "and device): fovi_lab's speedups are taken over them (for --backends fovi_lab)")
    parser.add_argument("--memory-trace", action="store_true",
                        help="record every CUDA allocation of each run with its Python stack and give each record "
                             "memory_at_peak: what was alive at the peak, by the code that allocated it (the "
                             "records are marked note_run: the recording slows the host, so the tables leave "
                             "their times out)")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)   # graphed runs here


def _records_file(text: str) -> List[dict]:
    """``--alternatives``: a JSON-lines file of network records, read at the door."""
    try:
        with open(text) as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}: {exc.strerror}") from None
    recs = []
    for n, line in enumerate(lines, 1):
        try:
            recs.append(json.loads(line)) if line.strip() else None
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{text!r}, line {n}: not a JSON record ({exc.msg})") from None
    return recs


def table_line(r: dict) -> str:
    if not r.get("ms"):
        return f"{r['net']:>9s} {r['B']:>4d} {r['mode']:>8s} {r['backend']:>13s}   not run: {r.get('note', '')[:90]}"
    sp, knn = r.get(f"speedup_{r['mode']}"), r.get(f"speedup_knn_{r['mode']}")
    name = r["backend"] if r.get("lab_backend", LAB_BACKEND) == LAB_BACKEND else f"fovi_lab:{r['lab_backend']}"
    return (f"{r['net']:>9s} {r['B']:>4d} {r['mode']:>8s} {name:>13s} {r['ms']:10.2f} "
            f"{r['images_per_s']:9.1f} {(r['grad_err'] if r.get('grad_err') is not None else float('nan')):9.1e} "
            f"{str(r['grads_bitwise_repeatable']):>7s} {_f(r.get('knn_ms')):>8s} {_f(r.get('peak_run_mib'), 0):>8s}"
            + (f"  x{sp:.2f} over {r['fastest_other']}" if sp else "")
            + (f", its KNN layers x{knn:.2f}" if knn else "")
            + "".join(f"\n{'':>14s}at the peak: {mib:8.1f} MiB in {n:5d} blocks from {who}"
                      for who, mib, n in (r.get("memory_at_peak") or {}).get("owners", ())))


def _f(v: Optional[float], digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def run(args) -> int:
    """Run the network benchmark as ``args`` say (the options of :func:`add_arguments`); returns 0."""
    if args.alternatives is not None and list(args.backends) != ["fovi_lab"]:
        from fovi_lab.ops.arguments import usage_error
        usage_error(PROG, "--alternatives: the earlier call's backends are the alternatives, so time fovi_lab alone "
                          "(--backends fovi_lab)")
    from fovi_lab.integrations.fovi import _fovi, fovi_network
    from fovi_lab.ops.arguments import usage_error
    try:                                 # fovi's networks are the benchmark: without fovi, one line at the door
        _fovi()
    except ImportError as exc:
        usage_error(PROG, f"fovi: {exc}")
    if args.in_res != 64:                # fovi's refusal of a small grid, at the door (64 builds both networks)
        for net in args.net:
            try:
                fovi_network(net, "cpu", n_classes=10, in_res=args.in_res)
            except ValueError as exc:
                usage_error(PROG, f"--in-res: {str(exc).split(': ', 1)[1]}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        step_precision(args.precision, device)
    except ValueError as exc:
        usage_error(PROG, f"--{exc}")
    modes = args.modes or (list(DEFAULT_MODES) if device.type == "cuda" else ["eager"])
    env = env_info(device)
    stamp_command(env, PROG, args)
    print(f"# train steps of fovi's networks on {env['device']} (torch {env['torch']}, warp {env['warp']})", flush=True)
    print(f"{'net':>9s} {'B':>4s} {'mode':>8s} {'backend':>13s} {'ms/step':>10s} {'images/s':>9s} {'grad err':>9s} "
          f"{'bitwise':>7s} {'KNN ms':>8s} {'peak MiB':>8s}", flush=True)
    # a capturing mode runs each backend in a process of its own on a GPU (see graphed_in_child), unless this is that
    # process
    apart = [m for m in modes if m in CAPTURED] if device.type == "cuda" and not args.in_process else []
    here = [m for m in modes if m not in apart]
    total = 0
    for net in args.net:
        for b in args.batches:
            recs = network_records(net, b, args.backends, here, args.steps, device=device,
                                   precision=args.precision, in_res=args.in_res,
                                   memory_trace=args.memory_trace, lab_backend=args.lab_backend) if here else []
            for mode in apart:
                for backend in args.backends:
                    recs += [{k: v for k, v in r.items() if k not in env}
                             for r in graphed_in_child(net, b, backend, args.steps, device, args.precision,
                                                       in_res=args.in_res, memory_trace=args.memory_trace,
                                                       mode=mode, lab_backend=args.lab_backend)]
                add_speedups(recs, [mode])
            recs = [dict(env, **r) for r in recs]
            if args.alternatives is not None:
                earlier_alternatives(recs, args.alternatives)
            total += emit_rows(recs, args.out, table_line)
    say_appended(args.out, total)
    return 0


#: ``python -m fovi_lab bench network``: see :data:`DESCRIPTION`.
main = command_main(PROG, DESCRIPTION, add_arguments, run)

if __name__ == "__main__":
    raise SystemExit(main())
