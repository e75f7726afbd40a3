"""The graph layer: everything the operator's index tables are built from, and the tables themselves.

    grid       the foveated sampling grid: isotropic rings, resource matching, cortical coordinates, the pad
               band, and the tolerance rules every discrete decision follows
    knn        the K nearest neighbours under a fixed tie rule, and each (node, neighbour) pair's tap
    geometry   KNNGraph and foveated_knn_graph: the steps above assembled into one layer's graph
    layers     the real layer table (the foveated networks' KNN-conv layers) and synthetic shapes
    meta       TrainingMeta: the padded index tables, the reverse CSR lists, their validation

It uses numpy, scipy and torch only (no Warp); the ops, the kernels and the lab sit above it.
"""
