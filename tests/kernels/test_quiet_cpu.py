"""On a machine without an NVIDIA driver the kernels run on Warp's CPU device, as intended: Warp's native
"Could not find or load the NVIDIA CUDA driver" line must not reach the terminal as if something were broken, while
anything else native code prints still does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fovi_lab.kernels import common
from fovi_lab.kernels.common import NO_DRIVER_LINE, cuda_driver_present


def test_only_the_missing_driver_line_is_held_back(capfd):
    with common._without_the_no_driver_line():
        os.write(2, f"Warp CUDA warning: {NO_DRIVER_LINE}. GPU execution will not be available.\n".encode())
        os.write(2, b"a native error that must be seen\n")
    err = capfd.readouterr().err
    assert NO_DRIVER_LINE not in err
    assert "a native error that must be seen" in err


@pytest.mark.skipif(cuda_driver_present(), reason="this machine has an NVIDIA driver: Warp prints no such line")
@pytest.mark.parametrize("code", [
    "from fovi_lab.kernels.common import init_warp; init_warp()",
    "import fovi_lab.lab; print(fovi_lab.lab.default_device())",
    "import torch; from fovi_lab import KNNConv, layer_graph; "
    "conv = KNNConv.from_graph(layer_graph('res18_layer4_0'), 256, 512, backend='warp_compact'); "
    "print(conv(torch.randn(1, 256, conv.nin).half()).shape)",
])
def test_entry_points_print_no_missing_driver_line(code):
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert NO_DRIVER_LINE not in done.stderr + done.stdout
