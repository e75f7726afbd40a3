"""Benchmarks: ``python -m fovi_lab.bench.forward`` (Warp forward kernels vs PyTorch baselines and
Warp's dense tile-GEMM ceiling). Shared timing, records and roofline helpers: :mod:`.common`."""
