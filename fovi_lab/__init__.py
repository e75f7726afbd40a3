"""fovi_lab: compact KNN convolution for foveated vision, in NVIDIA Warp, taught and measured.

Architecture (one concern per module):
    geometry      foveated grids, cortical manifold, KNN, taps            (spec §1, §6)
    layers        the real fovi layer table                                (spec §5)
    meta          index tables, reverse CSR                                (spec §2.1, §3.1)
    reference     fp32 oracle, torch_compact, effective-weight cache       (spec §2.3, §2.4, §3.2)
    warp_common   Warp plumbing, NaN canary, validated-config cache
    warp_forward  forward kernels (uncached r1/r2/r4, node-major, im2col-stage for stems, cached), configs,
                  heuristic (spec §2.5)
    warp_adjoint  grad_input / grad_weight staging kernels (gathered or staged operands) and reverse-CSR
                  reductions (spec §3.3)
    warp_adjoint_nm  fused node-major dx / dW (no stage; what warp_train runs when Cin >= 16)
    knn_warp      the seed's public API surface and the warp_compact / warp_train ops
    registry      the ops registry (backend name -> ops); optional backends found by module name
    knn_autograd  KNNConvFunction, KNNConv, the backend choice            (spec §4)
    graphs        CUDA-graph capture of a step (removes per-call host work)
    bench, widgets (kernel_lab, fused_viz, stem_viz, ...), demo: measurement, notebook callbacks, the
                  headless main job
"""

from .meta import TrainingMeta, build_meta

__version__ = "0.1.0"
__all__ = ["TrainingMeta", "build_meta", "__version__"]
