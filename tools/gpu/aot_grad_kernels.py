"""Compile the staged adjoint kernels' sm_90 cubins into WARP_CACHE_PATH here (no GPU), like
``python -m fovi_lab warmup --aot-arch 90`` does for the forward and fused-adjoint modules.

``WARP_CACHE_PATH=/tmp/wpc/wpcache python tools/gpu/aot_grad_kernels.py [kind:name ...]``
(default: the default gi/gw configs and every csr reduction kernel).
"""
import os
import sys
import time

from fovi_lab.kernels import adjoint as wa
from fovi_lab.kernels.adjoint import staged as adj_staged
from fovi_lab.kernels.common import init_warp, wp


def main(argv):
    init_warp()
    if argv:
        names = [tuple(a.split(":", 1)) for a in argv]
    else:
        names = [("gi", wa.DEFAULT_GI_CONFIG), ("gi", wa.DEFAULT_GI_CONFIG_SMALL_B), ("gi", "gi3_p64b64"),
                 ("gw", wa.DEFAULT_GW_CONFIG), ("gw", wa.DEFAULT_GW_CONFIG_NARROW)]
        names += [("csr", n) for n in wa.CSR_KERNEL_SPECS]
    for kind, name in names:
        t0 = time.perf_counter()
        kernel, _spec, _fp32 = adj_staged._build_kernel(kind, name)
        mod = kernel.module
        wp.compile_aot_module(mod, arch=90, module_dir=os.path.join(wp.config.kernel_cache_dir,
                                                                     mod.get_module_identifier()))
        print(f"{kind}:{name} sm_90 in {time.perf_counter() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
