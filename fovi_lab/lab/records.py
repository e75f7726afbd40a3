"""The recorded GPU results: load the benchmark records (the shipped ones in ``fovi_lab/records/``, and a checkout's
``data/``) and plot them (device, Warp and torch versions in each figure's title), or say that there are none.

Every name is importable from here; each lives in the module of its job:

* :mod:`fovi_lab.lab.records_load`: reading the records (:func:`load_records`, :func:`forward_records`,
  :func:`backward_records`, :func:`kind_records`);
* :mod:`fovi_lab.lab.records_select`: choosing rows (:data:`SELECTIONS`, :func:`record_runs`, :func:`layer_order`)
  and the words that name the records shown (:func:`versions_title`, :func:`recorded_message`);
* :mod:`fovi_lab.lab.records_tables`: the forward's tables and their text lines (:func:`forward_table`,
  :func:`tile_kernel_table`, :func:`heuristic_table`, :func:`reuse_summary`, :func:`gemm_ceilings`);
* :mod:`fovi_lab.lab.records_forward_viz`: the forward's figures (time, roofline, weight reuse, the heuristic);
* :mod:`fovi_lab.lab.records_backward_viz`: the backward's and train step's figures;
* :mod:`fovi_lab.lab.records_panels_viz`: replayed whole ops over the batch (per layer, per batch panel, your batch).
"""

from __future__ import annotations

from fovi_lab.lab.records_load import (DATA_DIR, LOGS_DIR, RECORDED_DEVICE, backward_records, forward_records,
                                       kind_records, load_records)
from fovi_lab.lab.records_select import (SELECTIONS, Selection, latest_run_where, layer_order, recorded_message,
                                         record_runs, selected, versions_title)
from fovi_lab.lab.records_tables import (REUSE_PAIRS, TILE_FAMILIES, forward_lines, forward_table, gemm_ceilings,
                                         heuristic_table, reuse_summary, tile_kernel_lines, tile_kernel_table)
from fovi_lab.lab.records_forward_viz import (forward_recorded_figure, heuristic_figure, reuse_recorded_figure,
                                              roofline_figure)
from fovi_lab.lab.records_backward_viz import backward_recorded_figure, gi_gw_sweep_figure
from fovi_lab.lab.records_panels_viz import batch_panels_figure, layer_replays_figure, mark_batch

__all__ = ["DATA_DIR", "LOGS_DIR", "RECORDED_DEVICE", "backward_records", "forward_records", "kind_records",
           "load_records", "SELECTIONS", "Selection", "recorded_message", "latest_run_where", "layer_order",
           "record_runs", "selected", "versions_title", "REUSE_PAIRS", "TILE_FAMILIES", "forward_lines",
           "forward_table", "gemm_ceilings", "heuristic_table", "reuse_summary", "tile_kernel_lines",
           "tile_kernel_table", "forward_recorded_figure", "heuristic_figure", "reuse_recorded_figure",
           "roofline_figure", "backward_recorded_figure", "gi_gw_sweep_figure", "batch_panels_figure",
           "layer_replays_figure", "mark_batch"]
