"""The forward kernels of the compact KNN convolution, and their public API.

    configs  FwdConfig, the registered configs (``FORWARD``) and the kernel families
    mma_pipe the tensor-core kernels through a cp.async shared-memory pipeline (``mmap`` / ``mmaps``)
    tile     tile-GEMM kernel factories (gather, node-major, i2c, cached, dense ceilings)
    simt     SIMT kernel factories (register blocks, no tile GEMM)
    mma      the hand-written ``mma.sync`` tensor-core kernels
    build    build a config's kernel once, validate it once per device (the NaN canary)
    rules    which config a call runs (selection thresholds, each with its measurement)
    checks   argument checks and the index tables' analysis
    plans    operand layouts, one launch, the output's finish
    launch   the plan object, the output's store, the recorded launches
    splits   the split families' partial counts, the i2c family's node chunks
    api      the entry points (``run_uncached``, ``run_cached``) and their call cache

The usual path: ``cfg = config_spec(name)`` (or ``FORWARD[name]``), ``built = get_config(name, device)``
(the kernel that passed the canary there), ``plan = prepare_uncached(x, weight, bias, input_linear,
weight_linear, config=name)``, then ``plan.launch()`` and ``y = plan.finish()``.
"""

from fovi_lab.kernels.forward.configs import (cached_config_names, config_spec, dense_kind, FORWARD,
                                              FwdConfig, mathdx_default, MMA_VARIANTS, mma_flags, mma_staged,
                                              PIPE_VARIANTS, uncached_config_names)
from fovi_lab.kernels.forward.tile import (make_cached_kernel, make_dense_kernel, make_densep_kernel,
                                           make_gather_kernel, make_gp_kernel, make_i2c_kernel, make_nm_kernel,
                                           make_nmp_kernel, make_nms_kernel, make_uncached_kernel,
                                           make_uncached_r2_kernel, make_uncached_r4_kernel)
from fovi_lab.kernels.forward.simt import (make_simt_kernel, make_simts_kernel, make_simtv_kernel, simt_dense_step,
                                           simt_step, simt_store, simtv_prep_kernel, simtv_step)
from fovi_lab.kernels.forward.build import (build_kernel, Built, cache_key, canary, canary_launch_ok, get_config,
                                            get_uncached_config, require_config, VALIDATED)
from fovi_lab.kernels.forward.rules import select_config, select_i2c, select_mma, select_simt, select_simts, SIMT_CONFIG
from fovi_lab.kernels.forward.checks import device_str
from fovi_lab.kernels.tables import analyse_tables
from fovi_lab.kernels.forward.plans import (bias_operand, DIRECT_STORE_MAX_BYTES, mmas_split, nms_reduce_kernel,
                                            pad_bias_to_tiles, pipe_split, Plan, plan_cached, plan_dense, plan_uncached,
                                            simts_split, store_mode, weight_layout)
from fovi_lab.kernels.forward.api import (make_dense_ceiling, prepare_cached, prepare_uncached, resolve_uncached,
                                          run_cached, run_uncached, select_cached_config)
