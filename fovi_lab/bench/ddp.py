"""Data-parallel training on the devices of one host: the foveated digits network of ``python -m fovi_lab train``,
on one process and on several, per backend.

    python -m fovi_lab bench ddp [--backends warp_train torch_compact] [--nproc 2] [--per-device-batch 64]
                                 [--steps 60] [--norm batch|group] [--device cuda|cpu] [--out F.jsonl]

Per backend, four runs, each a process tree of its own (``python -m fovi_lab train``; several processes under
``python -m torch.distributed.run``, one device each on CUDA through NCCL, gloo on a CPU), all from the same seed:

* ``one``: one process at the per-device batch: what one device trains per second;
* ``one_global``: one process at the global batch (``nproc`` x the per-device batch): the loss curve the
  data-parallel run should follow;
* ``ddp`` and ``ddp_again``: ``nproc`` processes at the global batch, twice.

Records (JSON lines): one per run (``kind: "ddp_run"``: world size, global batch, images/s over the steps after the
first few, the loss curve, the test accuracy, the parameters' sha256 after training) and one per backend
(``kind: "ddp"``): ``images_per_s_one`` and ``images_per_s_ddp`` at the same per-device batch,
``scaling_efficiency`` (the second over ``nproc`` times the first), ``loss_max_abs_diff`` (the data-parallel run's
loss curve against the one-process run of the same global batch, at the logged steps) and
``bitwise_repeatable`` (the two data-parallel runs end with bitwise equal parameters, so every gradient they
applied was equal). Batch norm is synchronised over the processes on CUDA (``SyncBatchNorm``); ``--norm group``
makes a data-parallel step equal the one-process step up to the order of the sums. On a CPU the processes share
its cores, so the throughput says nothing of a GPU; the loss and bitwise checks hold there too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

from fovi_lab.bench.common import append_jsonl, say_appended, started
from fovi_lab.ops.arguments import command_main

__all__ = ["RUNS", "train_command", "run_training", "summary", "ddp_records", "main", "add_arguments", "run",
           "DESCRIPTION"]

PROG = "python -m fovi_lab bench ddp"
#: The runs per backend: (name, processes: 1 or nproc, batch: per-device or global).
RUNS = (("one", "single", "per-device"), ("one_global", "single", "global"), ("ddp", "nproc", "global"),
        ("ddp_again", "nproc", "global"))


def train_command(backend: str, nproc: int, batch: int, steps: int, norm: str, device: str, out: str) -> List[str]:
    """The command line of one run: ``python -m fovi_lab train``, under ``torch.distributed.run`` for several
    processes."""
    train = ["-m", "fovi_lab", "train", "--backend", backend, "--steps", str(steps), "--batch", str(batch),
             "--norm", norm, "--device", device, "--seed", "0", "--out", out]
    if nproc == 1:
        return [sys.executable] + train
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)] + train


def _why(text: str, code: int) -> str:
    """The line of a failed run's output that says why: the last naming an error (torch.distributed.run ends its
    report with a rule of ``=``), else the last one with words."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and ln.strip().strip("=-") != ""]
    named = [ln for ln in lines if re.search(r"\w+(Error|Exception)\b", ln)]
    return (named or lines or [f"exit {code}"])[-1][:240]


def run_training(cmd: List[str], out: str, timeout_s: float) -> Dict:
    """Run one training command; its result (``TrainResult.as_dict``, the torch device it ran on as
    ``torch_device``), or ``{"note": why}`` where it failed. A run past ``timeout_s`` is asked to stop (SIGTERM:
    torch.distributed.run then stops its workers), and killed 30 s later."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")           # gloo processes on a CPU share its cores
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return {"note": f"the run took longer than {timeout_s:.0f} s"}
    if proc.returncode or not os.path.exists(out):
        return {"note": f"the run failed (exit {proc.returncode}): {_why(stderr or stdout, proc.returncode)}"}
    with open(out) as f:
        res = json.load(f)
    res["torch_device"] = res.pop("device", None)        # (a record's device is the GPU's name, env_info's)
    return res


def summary(backend: str, nproc: int, per_device: int, runs: Dict[str, Dict]) -> Dict:
    """The backend's record from its runs (see the module doc); a figure whose runs failed is None."""
    one, glob, ddp, again = (runs.get(n, {}) for n, _, _ in RUNS)
    ips_one, ips_ddp = one.get("images_per_s"), ddp.get("images_per_s")
    diffs = None
    if glob.get("loss") and ddp.get("loss") and glob.get("steps") == ddp.get("steps"):
        diffs = max(abs(a - b) for a, b in zip(glob["loss"], ddp["loss"]))
    digests = (ddp.get("param_digest"), again.get("param_digest"))
    return dict(kind="ddp", backend=backend, nproc=nproc, per_device_batch=per_device, global_batch=nproc * per_device,
                images_per_s_one=ips_one, images_per_s_ddp=ips_ddp,
                scaling_efficiency=ips_ddp / (nproc * ips_one) if ips_one and ips_ddp else None,
                loss_max_abs_diff=diffs,
                bitwise_repeatable=(digests[0] == digests[1]) if all(digests) else None,
                notes={n: r["note"] for n, r in runs.items() if "note" in r} or None)


def ddp_records(backends, nproc: int, per_device: int, steps: int, norm: str, device: str,
                timeout_s: float = 600.0, log=print, done=None) -> List[dict]:
    """Every run's record and each backend's summary (see the module doc); ``done(records)`` is called with each
    backend's records as soon as they are complete (a caller that writes them loses none to a later timeout)."""
    recs: List[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            runs: Dict[str, Dict] = {}
            for name, procs, size in RUNS:
                n = nproc if procs == "nproc" else 1
                batch = per_device * (nproc if size == "global" else 1)
                out = os.path.join(tmp, f"{backend}_{name}.json")
                cmd = train_command(backend, n, batch, steps, norm, device, out)
                res = runs[name] = run_training(cmd, out, timeout_s)
                rec = dict(kind="ddp_run", backend=backend, run=name, steps=steps, norm=norm,
                           **{k: v for k, v in res.items() if k not in ("backend", "steps")})
                rec.update(world_size=n, batch=batch, logged_steps=res.get("steps"),
                           train_command=" ".join(cmd[1:]))
                recs.append(rec)
                if log:
                    log(_run_line(recs[-1]))
            recs.append(summary(backend, nproc, per_device, runs))
            if done is not None:
                done(recs[-len(RUNS) - 1:])
    return recs


def _run_line(r: dict) -> str:
    if r.get("note"):
        return f"{r['backend']:>13s} {r['run']:>10s} {r['world_size']:>3d} {r['batch']:>6d}   not run: {r['note'][:80]}"
    return (f"{r['backend']:>13s} {r['run']:>10s} {r['world_size']:>3d} {r['batch']:>6d} "
            f"{r['images_per_s']:12.1f} {r['loss'][-1]:8.4f} {r['test_accuracy']:7.1%} {r['param_digest'][:12]}")


def _f(v: Optional[float], fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def table_line(r: dict) -> str:
    """A backend's summary record in words."""
    return (f"{r['backend']:>13s}: {r['nproc']} processes x {r['per_device_batch']} images: "
            f"{_f(r['images_per_s_ddp'], '.1f')} images/s against {_f(r['images_per_s_one'], '.1f')} on one, "
            f"scaling efficiency {_f(r['scaling_efficiency'], '.2f')}; loss within "
            f"{_f(r['loss_max_abs_diff'], '.2e')} of one process at the global batch; two runs bitwise equal: "
            f"{r['bitwise_repeatable']}")


#: The help text of ``python -m fovi_lab bench ddp``.
DESCRIPTION = """\
Data-parallel training of the foveated digits network on the devices of one host: per backend, one process at the
per-device batch and at the global batch, and the data-parallel run twice (torch.distributed.run: NCCL on GPUs, one
each; gloo on a CPU). Records each run (images/s, loss curve, the parameters' sha256) and per backend the scaling
efficiency, the loss against the one-process run of the same global batch and whether two data-parallel runs end
bitwise equal.

  python -m fovi_lab bench ddp --nproc 2 --per-device-batch 64 --steps 60 --out ddp.jsonl
"""


def add_arguments(parser) -> None:
    """The options of ``python -m fovi_lab bench ddp``, each checked as it is parsed."""
    from fovi_lab.ops.arguments import COUNT, add_out_option, backend_name, device_kind, int_at_least

    parser.add_argument("--backends", nargs="+", type=backend_name(trains=True),
                        default=["warp_train", "torch_compact"], metavar="BACKEND",
                        help="backends that train (default: warp_train torch_compact)")
    parser.add_argument("--nproc", type=int_at_least(2), default=2,
                        help="processes of the data-parallel runs (on CUDA one GPU each)")
    parser.add_argument("--per-device-batch", type=COUNT, default=64, metavar="B",
                        help="images per process and step (the global batch is nproc times it)")
    parser.add_argument("--steps", type=int_at_least(8), default=60, help="Adam steps per run")
    parser.add_argument("--norm", choices=("batch", "group"), default="batch",
                        help="normalisation of the network (group: the data-parallel step equals the one-process "
                             "step up to the order of the sums)")
    parser.add_argument("--device", type=device_kind, default=None,
                        help="cuda or cpu (default: cuda when torch sees a GPU, else cpu)")
    parser.add_argument("--timeout-s", type=COUNT, default=600, help="seconds a run may take")
    add_out_option(parser, "the table is printed")


def run(args) -> int:
    """Run the data-parallel benchmark as ``args`` say (the options of :func:`add_arguments`); returns 0, or 2
    where CUDA has fewer devices than ``--nproc``."""
    import torch

    from fovi_lab.ops.arguments import usage_error

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and torch.cuda.device_count() < args.nproc:
        usage_error(PROG, f"--nproc: expected at most the {torch.cuda.device_count()} GPUs torch sees, got "
                          f"{args.nproc}")
    env = started(device, PROG, args, f"data-parallel training of the digits network on {args.nproc} x")
    print(f"{'backend':>13s} {'run':>10s} {'procs':>3s} {'batch':>6s} {'images/s':>12s} {'loss':>8s} {'test':>7s} "
          f"{'params sha256':>12s}", flush=True)

    def done(recs):                                     # one backend's runs and summary, kept as they end
        rows = [dict(env, **r) for r in recs]
        print(table_line(rows[-1]), flush=True)          # (each run's line was printed as it ended)
        if args.out:
            append_jsonl(args.out, rows)

    recs = ddp_records(args.backends, args.nproc, args.per_device_batch, args.steps, args.norm, device,
                       args.timeout_s, log=lambda line: print(line, flush=True), done=done)
    say_appended(args.out, len(recs))
    return 0


#: ``python -m fovi_lab bench ddp``: see :data:`DESCRIPTION`.
main = command_main(PROG, DESCRIPTION, add_arguments, run)

if __name__ == "__main__":
    raise SystemExit(main())
