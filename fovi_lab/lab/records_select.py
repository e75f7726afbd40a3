"""Choose which recorded rows a figure or table shows: the named selections of runs the notebooks read
(:data:`SELECTIONS`), the records grouped into runs (one benchmark invocation per shape), the latest run or the latest
sweep of each shape, the layers in the lab's order, and a title naming the device, Warp and torch versions and dates of
the rows shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional

from fovi_lab.lab.common import LAYER_CHOICES


@dataclass(frozen=True)
class Selection:
    """Recorded runs a notebook reads, named for what they measured and chosen by the records' fields: the shipped
    records file (``kind``), the device and the window of the runs' ``date`` stamps (ISO text, from ``start``
    inclusive to ``end`` exclusive). ``what``: one line for figure titles."""

    what: str
    kind: str
    start: str
    end: str
    device: str = "NVIDIA H200"

    @property
    def mode(self) -> str:
        """The records' mode: ``train-step`` for the train-step files, else ``forward``."""
        return "train-step" if self.kind == "train_step" else "forward"

    def pick(self, records: Iterable[dict]) -> List[dict]:
        """The records of ``records`` this selection names."""
        return [r for r in records if r.get("device", self.device) == self.device
                and (r.get("mode") or "forward") == self.mode and self.start <= str(r.get("date", "")) < self.end]


#: Every recorded selection the lab reads, in one place (the records keep the runs' own tags for their history).
SELECTIONS: Dict[str, Selection] = {
    "tensor-core sweep": Selection(
        "every tensor-core config replayed beside the rule's pick and PyTorch, every layer, B = 1 to 512, H200",
        "mma_sweep", "2026-12-01T08:38", "2026-12-01T09:12"),
    "staged-store sweep": Selection(
        "the staged stores replayed beside the direct ones, every layer, B = 1 to 512, H200",
        "mma_sweep", "2026-12-01T09:11", "2026-12-01T09:12"),
    "tile and SIMT rules": Selection(
        "the sweeps whose chosen config was the tile / SIMT rules' pick (before the tensor-core rule), H200",
        "forward_sweep", "2026-12-01T05:45", "2026-12-01T05:47"),
    "tensor-core layouts": Selection(
        "the x^T and W-in-place layouts replayed beside x in place and W^T, H200",
        "forward_sweep", "2026-12-01T05:57", "2026-12-01T06:06"),
    "split-loop sweep": Selection(
        "the split SIMT kernel at three thread counts beside the tile kernels, replayed, H200",
        "forward_sweep", "2026-11-30T04:53", "2026-11-30T05:09"),
    "SIMT sweep": Selection(
        "the SIMT register blocks beside the i2c tiles and PyTorch on the stems, replayed, H200",
        "forward_sweep", "2026-11-30T02:51", "2026-11-30T03:27"),
    "stems against binning, rf2": Selection(
        "the stems' compact forward beside torch_binned_mm and PyTorch, rf2 tables, eager and replayed, H200",
        "forward", "2026-11-29T23:32", "2026-11-29T23:33"),
    "stems against binning, rf1": Selection(
        "the stems' compact forward beside torch_binned_mm and PyTorch, rf1 tables, eager and replayed, H200",
        "forward", "2026-11-29T23:36", "2026-11-29T23:37"),
    "Warp binned stems": Selection(
        "the Warp binned forward (bin pass + dense GEMM) beside the compact i2c kernels on the rf2 stems, H200",
        "forward", "2026-11-29T23:24", "2026-11-29T23:25"),
    "stem train step, gathered operands": Selection(
        "the stems' train step with the adjoints gathering their operand tiles in the GEMM loop, H200",
        "train_step", "2026-11-29T19:27", "2026-11-29T19:28"),
    "stem train step, staged operands": Selection(
        "the stems' train step with staged operands (the 'i' adjoint configs), H200",
        "train_step", "2026-11-29T20:50", "2026-11-29T20:51"),
}


def selected(records: Iterable[dict], name: str) -> List[dict]:
    """The records of the selection ``name`` of :data:`SELECTIONS`."""
    return SELECTIONS[name].pick(records)


def recorded_message(records: List[dict], note: Optional[str] = None) -> str:
    """What a figure of recorded runs says under its title (:func:`fovi_lab.lab.figure_layout.headed`): the
    recording's device, Warp and torch versions and dates (:func:`versions_title`) and ``note``."""
    return f"recorded on {versions_title(records)}" + (f" · {note}" if note else "")


def versions_title(records: List[dict]) -> str:
    """``"NVIDIA H200 · Warp 1.19.0 · torch 2.11.0+cu130 · 2026-11-29"`` (every distinct value)."""
    if not records:
        return "no recorded data"

    def uniq(key, fmt=lambda v: v):
        vals = sorted({fmt(r[key]) for r in records if r.get(key)})
        return ", ".join(vals) if vals else "?"

    dates = sorted({str(r["date"])[:10] for r in records if r.get("date")})
    when = dates[0] if len(dates) == 1 else (f"{dates[0]} .. {dates[-1]}" if dates else "?")
    return f"{uniq('device')} · Warp {uniq('warp')} · torch {uniq('torch')} · {when}"


def record_runs(records: List[dict]) -> Dict[tuple, List[List[dict]]]:
    """(layer, B, mode) -> that shape's runs, oldest first. A run is the records of one benchmark
    invocation: same file and same ``date`` stamp. Figures never mix two runs of one shape (the config
    chosen, the configs swept and the baselines of a row always come from one invocation)."""
    groups: Dict[tuple, Dict[tuple, List[dict]]] = {}
    for r in records:
        key = (r.get("layer"), r.get("B"), r.get("mode"))
        groups.setdefault(key, {}).setdefault((str(r.get("date", "")), r.get("_file", "")), []).append(r)
    return {k: [v[rk] for rk in sorted(v)] for k, v in groups.items()}


def latest_run_where(runs: List[List[dict]], pred: Callable[[List[dict]], bool]) -> Optional[List[dict]]:
    """The most recent run that satisfies ``pred`` (None if none does)."""
    for run in reversed(runs):
        if pred(run):
            return run
    return None


def _n_swept(run: List[dict]) -> int:
    return len({r.get("config") for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")})


def sweep_run(runs: List[List[dict]]) -> Optional[List[dict]]:
    """The latest run of a shape that timed several uncached configs (a ``--all-configs`` sweep)."""
    return latest_run_where(runs, lambda run: _n_swept(run) >= 3)


def pick_run(runs: List[List[dict]]) -> Optional[List[dict]]:
    """The latest run of a shape that timed the chosen config as a whole op (falls back to the latest run)."""
    return (latest_run_where(runs, lambda run: any(r.get("impl") == "warp_uncached" and r.get("chosen") and r.get("ms")
                                                for r in run)) or (runs[-1] if runs else None))


def sweep_records(records: List[dict]) -> List[dict]:
    """The uncached-kernel records of every shape's latest sweep run."""
    out: List[dict] = []
    for key, runs in record_runs(records).items():
        run = sweep_run(runs)
        if run is not None:
            out += [r for r in run if r.get("impl") == "warp_uncached" and r.get("ms_kernel")]
    return out


def latest_runs(records: List[dict]) -> List[dict]:
    """Per (layer, B, mode), the records of the most recent run only."""
    return [r for runs in record_runs(records).values() for r in runs[-1]]


def latest_by_config(records: List[dict]) -> Dict[tuple, dict]:
    """(layer, B, impl, config) -> one record of the most recent run of that shape (last one wins)."""
    out: Dict[tuple, dict] = {}
    for r in latest_runs(records):
        out[(r.get("layer"), r.get("B"), r.get("impl"), r.get("config"))] = r
    return out


def layer_order(names: Iterable[str]) -> List[str]:
    order = {n: i for i, n in enumerate(LAYER_CHOICES)}
    return sorted(set(names), key=lambda n: (order.get(n, len(order)), n))
