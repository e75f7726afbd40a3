"""The graph layer: everything the operator's index tables are built from, and the tables themselves.

    geometry   foveated sampling grids, the cortical manifold, the KNN graph and the kernel taps
    layers     the real layer table (the foveated networks' KNN-conv layers) and synthetic shapes
    meta       TrainingMeta: the padded index tables, the reverse CSR lists, their validation

Nothing here imports torch kernels or Warp; the ops, the kernels and the lab sit above it.
"""
