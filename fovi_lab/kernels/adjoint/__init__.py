"""The adjoint kernels: dx (grad_input) and dW (grad_weight) of the compact KNN convolution, deterministic.

Two dataflows, each in three modules (kernels, build, plans; the fused one also its rules of work division). Their
configs are the presets of the adjoint kernel families (``configs.toml``; :mod:`fovi_lab.kernels.families`:
``staged_dx``, ``staged_dw``, ``reductions``, ``fused_dx``, ``fused_dw``), which the build and plan modules reach
through the registry (:func:`fovi_lab.kernels.families.registry.adjoint_point`):

    configs        the staged adjoints' configs (the families' records) and selection rules
    staged         staged kernels: a per-node GEMM into a stage, then a reverse-CSR reduction in fixed order
    staged_build   their build and per-device NaN-canary validation
    staged_plans   their operands, plans and entry points (``grad_input``, ``grad_weight``)
    fused          fused node-major kernels (no stage; the reduction in the GEMM's K loop), configs (the families'
                   tiles), rules
    fused_build    their build, and the reverse / tap lists they walk
    fused_plans    their validation, plans and entry points (``grad_input_nm``, ``grad_weight_nm``)
    fused_rules    their default segments and splits of the lists, within the partial budget

Neither uses atomics: dx and dW are bitwise repeatable.
"""

from fovi_lab.kernels.adjoint.configs import (all_grad_kernel_names, CSR_KERNEL_SPECS, DEFAULT_GI_CONFIG,
                                              DEFAULT_GI_CONFIG_SMALL_B, DEFAULT_GW_CONFIG, DEFAULT_GW_CONFIG_NARROW,
                                              GRAD_INPUT_CONFIG_SPECS, grad_stage_budget_bytes,
                                              GRAD_WEIGHT_CONFIG_SPECS, select_gi_config, select_gw_config,
                                              stage_fp32_default)
from fovi_lab.kernels.adjoint.staged import (make_dw_csr_kernel, make_dx_csr_kernel, make_grad_input_stage2_kernel,
                                             make_grad_input_stage2p_kernel, make_grad_input_stage3_kernel,
                                             make_grad_input_stage3p_kernel, make_grad_staged_operand_kernel,
                                             make_grad_weight_stage2_kernel, make_grad_weight_stage3_kernel,
                                             make_grad_weight_stage3p_kernel, make_grad_weight_stage4_kernel)
from fovi_lab.kernels.adjoint.staged_build import (aot_compile_grad_kernels, canary_csr_ok, canary_grad_stage_ok,
                                                   get_grad_kernel, GRAD_KERNELS, GradKernel, normalize_device,
                                                   spec_of, warm_grad_kernel)
from fovi_lab.kernels.adjoint.staged_plans import (grad_input, grad_weight, pad_flat_input_fp16, plan_grad_input,
                                                   plan_grad_weight, weight_row_csr)
from fovi_lab.kernels.adjoint.fused import (WAVE_CTAS, DW_NM_CONFIG_SPECS, DX_NM_CONFIG_SPECS, FUSED_KINDS,
                                            config_tiles, make_dw_nm_kernel, make_dw_seg_kernel, make_dx_nm_kernel,
                                            make_dx_seg_kernel, nm_grad_kernel_names, seg_finish_kernel,
                                            seg_finish_tiled_kernel, segment_table, select_dw_nm_config,
                                            select_dx_nm_config)
from fovi_lab.kernels.adjoint.fused_build import NmGradKernel, reverse_lists, tap_lists
from fovi_lab.kernels.adjoint.fused_plans import (default_dw_seg_steps, default_dx_seg_steps, dw_seg_steps_for,
                                                  get_nm_grad_kernel, grad_input_nm, grad_weight_nm, list_stats,
                                                  node_major, plan_grad_input_nm, plan_grad_weight_nm,
                                                  warm_nm_grad_kernel)
