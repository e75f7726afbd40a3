"""The lab: what the notebooks run. Problems, traffic models, widget callbacks, recorded results, figures.

    common           set-up, devices, error classes, source display, figure helpers
    labels           kernel configs in words, for figures and printed tables
    problems         a real layer (or a synthetic shape) at any batch, with its fp32 reference
    traffic          FLOPs, bytes and shared memory of the forward, one node's GEMM
    forward_explorer  the forward widget: rerun a production kernel, check it, time it
    family_explorer   the tile-size widget over every kernel family: any point, checked, run and timed live
    adjoint_explorer  the adjoint widgets: node GEMMs, determinism, grids and occupancy, a rerun
    records          the recorded GPU results under ``data/`` and their figures
    *_viz            one module of figures per notebook topic (graph, stems, split, mma, fused, host, ...)
    path             the learner's path: the notebooks in reading order, from which their links are written

The lab uses only public names of the layers below it, and nothing outside ``fovi_lab.lab`` imports it.
``from fovi_lab import lab`` gives the names of the first eight modules.
"""

from fovi_lab.lab.common import (batch_menu, busy, check_explore_args, clamp_shape, COLOURS, CPU_WORK_BUDGET,
                                 default_device, device_line, error_words, fail_result, format_result, FORWARD_CHOICES,
                                 hline, is_int, LAYER_CHOICES, layer_kernel_widget, live, log_range, message_figure,
                                 missing_marks, parity_line, rel_error, result_answer, round4, RunLog, setup,
                                 show_source, sync_device, text_table, time_ms, tolerance_class, widget_device)
from fovi_lab.lab.labels import kernel_label, short_label
from fovi_lab.lab.problems import make_meta, make_problem, ORACLE_MAX_ELEMS, Problem, reference_forward, reference_grads
from fovi_lab.lab.traffic import (forward_counts, node_gemm, node_gemm_figure, shape_of, tile_smem_estimate,
                                  tile_traffic, traffic_figure, traffic_table)
from fovi_lab.lab.forward_explorer import (benchmark_forward, explore_forward, forward_clamp, registered_forward_config,
                                           reuse_fill, reuse_live, reuse_live_figure, run_checked)
from fovi_lab.lab.family_explorer import explore_point, family_widget, start_point
from fovi_lab.lab.adjoint_explorer import (adjoint_by_node_gemms, adjoint_grid, determinism_demo, explore_adjoint,
                                           H200_SMS, occupancy_figure, occupancy_table)
from fovi_lab.lab.records import (backward_recorded_figure, backward_records, batch_panels_figure, DATA_DIR,
                                  forward_recorded_figure, forward_records, forward_table, gi_gw_sweep_figure,
                                  heuristic_figure, heuristic_table, latest_run_where, layer_order,
                                  layer_replays_figure, load_records, LOGS_DIR, recorded_message, record_runs,
                                  REUSE_PAIRS, reuse_recorded_figure, reuse_summary, roofline_figure, kind_records,
                                  selected, Selection, SELECTIONS, versions_title)
