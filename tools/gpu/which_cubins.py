import os, sys
from fovi_lab.kernels import forward as F
from fovi_lab.kernels import adjoint as N
from fovi_lab.kernels.adjoint import fused_build as adj_fused_build
from fovi_lab.kernels import adjoint as A
from fovi_lab.kernels.adjoint import staged as adj_staged
from fovi_lab.kernels.common import init_warp, wp
init_warp()
want_f = "i2c_m16n64k64 i2c_m16n96k64 i2c_m64n64k64 i2c_m64n96k128 i2c_m64n96k64 nm_m16n32k64 nm_m64n64k128 nm_m64n64k64 nms_m16n32k64 nms_m64n64k64".split()
def have(k):
    mid = k.module.get_module_identifier()
    return os.path.exists(os.path.join(wp.config.kernel_cache_dir, mid, mid + ".sm90.cubin")), mid
for n in want_f:
    for dense in (False, True):
        print("fwd", n, dense, have(F.build_kernel(F.config_spec(n), dense=dense)))
for kind, n in [("dxn","dxn_m16n16k64"),("dxn","dxn_m16n64k64"),("dxn","dxn_m64n64k64"),("dwn","dwn_o64c64k64")]:
    print(kind, n, have(adj_fused_build.build_fused_kernel(kind, n)))
for kind, n in [("gi","gi2_p64b64"),("gi","gi2i_p64b64"),("gi","gi3i_p64b128"),("gi","gi3_p64b128"),("gw","gw3_p64n64"),("gw","gw3_p64n128"),("gw","gw3i_p64n64"),("gw","gw3i_p64n128")] + [("csr", c) for c in A.CSR_KERNEL_SPECS]:
    print(kind, n, have(adj_staged._build_kernel(kind, n)[0]))
from fovi_lab.kernels.common import gather_rows_kernel
print("gather", have(gather_rows_kernel()))
for kind, n in [("gi","gi3_p64b64"),("gi","gi3_p64b128_f32"),("gi","gi3i_p64b128_f32"),("dxn","dxn_m64n16k64"),("dwn","dwn_o64c16k64")]:
    k = adj_fused_build.build_fused_kernel(kind, n) if kind in ("dxn","dwn") else adj_staged._build_kernel(kind, n)[0]
    print(kind, n, have(k))
from fovi_lab.kernels.common import gather_rows_pair_kernel
print("gather2", have(gather_rows_pair_kernel()))
for kind, n in [("gi","gi2i_p64b64_f32"),("gw","gw3i_p64n128_f32"),("gw","gw3i_p64n64_f32"),("gi","gi2_p64b64_f32"),("gi","gi3_p64b64_f32")]:
    print(kind, n, have(adj_staged._build_kernel(kind, n)[0]))
