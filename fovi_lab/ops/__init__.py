"""The ops layer: the operator's reference implementations and the machinery every backend plugs into.

    reference  the fp32 oracle and the PyTorch ops (compact, binned, the effective-weight cache)
    registry   backend name -> ops object; the Warp backends register themselves when imported
    dispatch   ``backend="auto"``: a backend per shape, read from the recorded benchmarks
    library    the operator as torch.library custom ops (what torch.compile sees), layer handles
    autograd   KNNConvFunction and the KNNConv module
    graphs     CUDA-graph capture of a step (removes the per-call host work)
    replay     the Warp backends' own replay of their calls from CUDA graphs, per call signature
"""
