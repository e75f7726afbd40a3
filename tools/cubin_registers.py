"""Registers and local (spill) memory of the sm_90 cubins of the mma kernels, read from the ELF of each cubin
(no CUDA toolkit needed), and what they allow: resident warps per SM at 128-thread blocks.

    WARP_CACHE_PATH=/tmp/wpc/wpcache python -m fovi_lab warmup --aot-arch 90 --no-grad --experimental --only ...
    python tools/cubin_registers.py /tmp/wpc/wpcache/1.19.0 > fovi_lab/records/h200/logs/mma_registers_sm90.txt

The register count is the ``EIATTR_REGCOUNT`` attribute of the cubin's ``.nv.info`` section; spills would show
as ``.nv.local.*`` sections. Resident warps: 64K registers per SM, allocated per warp in units of 256
(registers per thread rounded up to 8), 128-thread blocks, at most 64 warps per SM (H100/H200)."""

from __future__ import annotations

import glob
import os
import struct
import sys


def _sections(blob: bytes):
    shoff = struct.unpack_from("<Q", blob, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names_off = heads[shstrndx][4]
    out = {}
    for name, typ, _, _, off, size in heads:
        n = blob[names_off + name:blob.index(b"\0", names_off + name)].decode()
        out[n] = (blob[off:off + size] if typ != 8 else b"", size)      # 8: SHT_NOBITS
    return out


def _regcount(info: bytes):
    i = 0
    while i + 4 <= len(info):
        fmt, attr = info[i], info[i + 1]
        if fmt == 0x04:                                                   # EIFMT_SVAL: attr, size, payload
            size = struct.unpack_from("<H", info, i + 2)[0]
            if attr == 0x2F:                                              # EIATTR_REGCOUNT: (function, count)
                return struct.unpack_from("<II", info, i + 4)[1]
            i += 4 + size
        else:
            i += 4
    return None


def resident_warps(regs: int, block_warps: int = 4) -> int:
    per_warp = -(-regs // 8) * 8 * 32
    warps = min(64, 65536 // per_warp)
    return (warps // block_warps) * block_warps


def main(cache_dir: str) -> None:
    print("# module (kernel, block, depth)                 regs  local_bytes  warps/SM (128-thread blocks)")
    for path in sorted(glob.glob(os.path.join(cache_dir, "wp_fovi_fwd_mma*", "*.cubin"))):
        secs = _sections(open(path, "rb").read())
        regs = _regcount(secs.get(".nv.info", (b"", 0))[0])
        local = sum(size for n, (_, size) in secs.items() if n.startswith(".nv.local"))
        name = "_".join(os.path.basename(path).split("_")[1:-2])
        print(f"{name:46s} {regs:5d} {local:12d} {resident_warps(regs):9d}")


if __name__ == "__main__":
    main(sys.argv[1])
