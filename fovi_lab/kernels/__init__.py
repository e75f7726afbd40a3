"""The Warp kernels (no plotting, no records): forward, adjoints, their configs and selection rules.

    common     Warp plumbing, the NaN canary and the per-device validated-kernel cache
    layout     the operand layout copies (x^T, W^T, node-major g) through shared memory
    forward/   the forward kernels (tile, SIMT, tensor-core ``mma``), their configs, rules and plans
    adjoint/   grad_input / grad_weight: staged (gather + tile GEMM + reverse-CSR reduction) and fused
    warmup     compile every config for a device ahead of time, in parallel
"""
